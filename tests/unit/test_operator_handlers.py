"""The operator's handler layer as plain functions: the plan of a FjordCluster
reconciliation, status conditions, object comparison, settings, kopf registration and the
``fjord operator`` command. (Kubernetes end to end: tests/e2e with kmock; the Fjord shell
against a real cluster: tests/integration/test_operator_admin.py.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest
from click.testing import CliRunner

from fjord.cli.main import cli
from fjord.errors import ConfigError, InvalidReplicationFactorError
from fjord_operator import settings as s
from fjord_operator.handlers import contains, error_reason, plan_cluster, register, topic_name
from fjord_operator.settings import OperatorSettings
from fjord_operator.status import Outcome, Verdict, condition_of, conditions, status_patch

NOW = datetime(2026, 11, 22, 4, 0, 0, tzinfo=UTC)


def body(replicas: int = 3, status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "fjord.io/v1alpha1",
        "kind": "FjordCluster",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u-1", "generation": 7},
        "spec": {
            "brokers": {"replicas": replicas},
            "etcd": {"endpoints": ["http://etcd:2379"]},
            **spec,
        },
        "status": status or {},
    }


def sts_replicas(plan: Any) -> int:
    (sts,) = [o for o in plan.objects if o["kind"] == "StatefulSet"]
    return int(sts["spec"]["replicas"])


def test_new_cluster_creates_objects_and_reconciles() -> None:
    plan = plan_cluster(body(), None, None, None, {}, frozenset(), NOW)
    assert sts_replicas(plan) == 3 and plan.retry and not plan.reassign
    assert plan.status["observedGeneration"] == 7
    assert condition_of(plan.status, "Reconciling")["status"] == "True"  # type: ignore[index]
    assert plan.status["scaling"] == {
        "phase": "WaitingForBrokers",
        "from": 0,
        "to": 3,
        "message": "creating the StatefulSet with 3 brokers",
    }


def test_registered_cluster_is_ready() -> None:
    assignment = {("t", p): [p % 3, (p + 1) % 3] for p in range(6)}
    plan = plan_cluster(body(), 3, 3, frozenset({0, 1, 2}), assignment, frozenset(), NOW)
    assert not plan.retry and not plan.reassign
    ready = condition_of(plan.status, "Ready")
    assert ready is not None and ready["status"] == "True" and ready["reason"] == "Ready"
    assert plan.status["brokers"] == 3 and plan.status["readyBrokers"] == 3
    assert plan.status["scaling"]["phase"] == "Stable"


def test_scale_out_after_registration_submits_the_plan() -> None:
    assignment = {("t", p): [p % 3, (p + 1) % 3] for p in range(6)}
    previous = {"scaling": {"phase": "WaitingForBrokers"}}
    plan = plan_cluster(
        body(5, status=previous), 5, 5, frozenset(range(5)), assignment, frozenset(), NOW
    )
    assert plan.reassign and plan.retry
    assert {b for r in plan.reassign.values() for b in r} & {3, 4}
    assert plan.status["scaling"]["phase"] == "Rebalancing"


def test_refused_scale_in_changes_no_object() -> None:
    assignment = {("t", p): [0, 1, 2] for p in range(3)}
    plan = plan_cluster(body(2), 3, 3, frozenset(range(3)), assignment, frozenset(), NOW)
    assert plan.objects == [] and not plan.reassign and not plan.retry
    error = condition_of(plan.status, "Error")
    assert error is not None and error["status"] == "True"
    assert error["reason"] == "ScaleInWouldBreakReplication"
    assert plan.status["scaling"]["phase"] == "Refused"


def test_invalid_spec_is_an_error_condition_not_an_exception() -> None:
    plan = plan_cluster(
        body(etcd={"endpoints": ["http://e:1"], "managed": {"replicas": 1}}),
        None,
        None,
        None,
        {},
        frozenset(),
        NOW,
    )
    assert plan.objects == [] and not plan.retry
    error = condition_of(plan.status, "Error")
    assert error is not None and error["reason"] == "InvalidSpec"
    assert "exactly one of endpoints or managed" in error["message"]


def test_unknown_previous_phase_is_treated_as_stable() -> None:
    plan = plan_cluster(
        body(status={"scaling": {"phase": "Bogus"}}),
        3,
        3,
        frozenset(range(3)),
        {},
        frozenset(),
        NOW,
    )
    assert plan.status["scaling"]["phase"] == "Stable"


def test_conditions_keep_transition_time_while_status_holds() -> None:
    first = conditions(Verdict(Outcome.RECONCILING, "ScalingOut", "m"), None, NOW)
    assert [c["type"] for c in first] == ["Ready", "Reconciling", "Error"]
    assert {c["lastTransitionTime"] for c in first} == {"2026-11-22T04:00:00Z"}
    later = NOW + timedelta(minutes=5)
    second = conditions(Verdict(Outcome.RECONCILING, "Rebalancing", "n"), first, later)
    assert all(c["lastTransitionTime"] == "2026-11-22T04:00:00Z" for c in second)
    assert all(c["reason"] == "Rebalancing" for c in second)
    third = conditions(Verdict(Outcome.READY, "Ready", "ok"), second, later)
    times = {c["type"]: c["lastTransitionTime"] for c in third}
    assert times == {
        "Ready": "2026-11-22T04:05:00Z",
        "Reconciling": "2026-11-22T04:05:00Z",
        "Error": "2026-11-22T04:00:00Z",  # was False, still False
    }
    patch = status_patch(Verdict(Outcome.ERROR, "X", "y"), None, None, NOW, partitions=3)
    assert "observedGeneration" not in patch and patch["partitions"] == 3


def test_contains_ignores_server_defaults_but_sees_changes() -> None:
    desired = {"spec": {"replicas": 3, "ports": [{"name": "grpc", "port": 9092}]}}
    live = {
        "metadata": {"resourceVersion": "5"},
        "spec": {
            "replicas": 3,
            "ports": [{"name": "grpc", "port": 9092, "protocol": "TCP"}],
            "sessionAffinity": "None",
        },
    }
    assert contains(live, desired)
    assert not contains({**live, "spec": {**live["spec"], "replicas": 5}}, desired)
    assert not contains({"spec": {"replicas": 3, "ports": []}}, desired)
    assert not contains({"spec": None}, desired)


def test_error_reason_and_topic_name() -> None:
    assert error_reason(InvalidReplicationFactorError("x")) == "InvalidReplicationFactor"
    assert topic_name({"metadata": {"name": "orders-crd"}, "spec": {}}) == "orders-crd"
    assert (
        topic_name({"metadata": {"name": "a"}, "spec": {"topicName": "orders.v1"}}) == "orders.v1"
    )


def test_settings_from_env_and_validation() -> None:
    settings = OperatorSettings.from_env(
        {
            "FJORD_OPERATOR_NAMESPACES": "a, b",
            "FJORD_OPERATOR_CLUSTER_INTERVAL_S": "0.5",
            "FJORD_OPERATOR_KUBE_SERVER": "http://127.0.0.1:1",
            "FJORD_OPERATOR_AVERAGE_RECORD_BYTES": "200",
        }
    )
    assert settings.namespaces == ("a", "b")
    assert settings.cluster_interval_s == 0.5
    assert settings.kube_server == "http://127.0.0.1:1"
    assert settings.average_record_bytes == 200
    assert settings.topic_interval_s == OperatorSettings().topic_interval_s
    with pytest.raises(ConfigError, match="FJORD_OPERATOR_RETRY_DELAY_S"):
        OperatorSettings.from_env({"FJORD_OPERATOR_RETRY_DELAY_S": "soon"})
    with pytest.raises(ConfigError, match="cluster_interval_s must be > 0"):
        OperatorSettings(cluster_interval_s=0)


def test_register_binds_every_handler_with_the_settings() -> None:
    registry = register(OperatorSettings(cluster_interval_s=1.5, topic_interval_s=2.5))
    assert isinstance(registry, kopf.OperatorRegistry)
    handlers = [*registry._spawning.get_all_handlers(), *registry._changing.get_all_handlers()]
    selectors = {(h.selector.group, h.selector.version, h.selector.plural) for h in handlers}
    assert selectors == {
        (s.GROUP, s.VERSION, s.CLUSTER_PLURAL),
        (s.GROUP, s.VERSION, s.TOPIC_PLURAL),
        (s.GROUP, s.VERSION, s.USER_PLURAL),
    }
    timers = {h.id: h.interval for h in registry._spawning.get_all_handlers()}
    # FjordUsers' drift (ACLs changed behind the operator's back) on the topic interval
    assert timers == {"cluster-timer": 1.5, "topic-timer": 2.5, "user-timer": 2.5}
    change_ids = {str(h.id) for h in registry._changing.get_all_handlers()}
    assert {"reconcile", "delete-topic"} <= change_ids
    # A second registration is independent (tests may run several operators).
    assert register(OperatorSettings()) is not registry


def test_fjord_operator_command_rejects_bad_settings() -> None:
    result = CliRunner().invoke(cli, ["operator", "--cluster-interval", "0"])
    assert result.exit_code == 2
    assert "cluster_interval_s must be > 0" in result.output
    help_text = CliRunner().invoke(cli, ["operator", "--help"]).output
    assert "--namespace" in help_text and "--kube-server" in help_text


def test_fjord_operator_command_flags_and_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    both = CliRunner().invoke(cli, ["operator", "--all-namespaces", "--namespace", "a"])
    assert both.exit_code == 2 and "exclude each other" in both.output
    # Without the operator extra, the command says so in one line instead of a traceback.
    monkeypatch.setitem(__import__("sys").modules, "fjord_operator.main", None)
    missing = CliRunner().invoke(cli, ["operator"])
    assert missing.exit_code == 1
    assert "needs the 'operator' extra" in missing.output
    assert "Traceback" not in missing.output
