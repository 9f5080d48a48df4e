"""The CRDs in charts/fjord/crds are structural and validate what they should: every sample in
charts/fjord/samples (and the Spark jobs' FjordUsers in spark/k8s) passes, every sample in
samples/invalid fails with exactly the error its ``samples.fjord.io/expected-error`` annotation
names (helpers: tests/k8s/crd_validation.py)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.k8s.crd_validation import (
    SAMPLES_DIR,
    defaults_in,
    load_crds,
    load_yaml,
    schema_at,
    served_version,
    structural_problems,
    unknown_fields,
    validate_custom_resource,
)

EXPECTED_ERROR = "samples.fjord.io/expected-error"
#: The Spark jobs' FjordUsers (spark/k8s/fjorduser-<job>.yaml) are samples too.
SPARK_USERS = sorted((SAMPLES_DIR.parents[2] / "spark" / "k8s").glob("fjorduser-*.yaml"))
VALID_SAMPLES = sorted(SAMPLES_DIR.glob("*.yaml")) + SPARK_USERS
INVALID_SAMPLES = sorted((SAMPLES_DIR / "invalid").glob("*.yaml"))
CRDS = load_crds()


def schema_of(kind: str) -> dict[str, Any]:
    return served_version(CRDS[kind])["schema"]["openAPIV3Schema"]


def test_the_chart_defines_exactly_the_crds_of_the_design() -> None:
    assert sorted(CRDS) == ["FjordCluster", "FjordTopic", "FjordUser"]
    for kind, short in (("FjordCluster", "fjc"), ("FjordTopic", "fjt"), ("FjordUser", "fju")):
        crd = CRDS[kind]
        assert crd["metadata"]["name"] == f"{kind.lower()}s.fjord.io"
        assert crd["spec"]["group"] == "fjord.io"
        assert crd["spec"]["scope"] == "Namespaced"
        assert crd["spec"]["names"]["shortNames"] == [short]
        assert crd["spec"]["names"]["categories"] == ["fjord"]
        version = served_version(crd)
        assert version["name"] == "v1alpha1"
        assert version["subresources"] == {"status": {}}


@pytest.mark.parametrize("kind", ["FjordCluster", "FjordTopic", "FjordUser"])
def test_crd_schema_is_structural(kind: str) -> None:
    assert list(structural_problems(schema_of(kind))) == []


def test_structural_check_catches_what_the_api_server_refuses() -> None:
    bad = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "untyped": {"description": "no type"},
                    "bag": {"type": "object"},
                    "anything": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "both": {"type": "object", "properties": {}, "additionalProperties": {}},
                    "typed_branch": {
                        "type": "object",
                        "properties": {},
                        "oneOf": [{"type": "object", "required": ["a"]}],
                    },
                },
            }
        },
    }
    assert sorted(structural_problems(bad)) == sorted(
        [
            "spec.anything: x-kubernetes-preserve-unknown-fields outside ['status.kopf']",
            "spec.bag: object without properties",
            "spec.both: properties and additionalProperties are mutually exclusive",
            "spec.both.*: no type",
            "spec.typed_branch: 'type' inside oneOf",
            "spec.untyped: no type",
        ]
    )


@pytest.mark.parametrize("kind", ["FjordCluster", "FjordTopic", "FjordUser"])
def test_every_default_is_valid_for_its_own_schema(kind: str) -> None:
    checked = 0
    for path, default, schema in defaults_in(schema_of(kind)):
        without_default = {k: v for k, v in schema.items() if k != "default"}
        assert not list(jsonschema.Draft4Validator(without_default).iter_errors(default)), path
        checked += 1
    assert checked >= {"FjordCluster": 8, "FjordTopic": 2, "FjordUser": 4}[kind]


@pytest.mark.parametrize("kind", ["FjordCluster", "FjordTopic", "FjordUser"])
def test_printer_columns_point_at_declared_fields(kind: str) -> None:
    version = served_version(CRDS[kind])
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    expected = {
        "FjordCluster": ["Brokers", "Ready", "Reason", "Age"],
        "FjordTopic": ["Cluster", "Partitions", "Replication", "Ready", "Age"],
        "FjordUser": ["Cluster", "Authentication", "Ready", "Age"],
    }[kind]
    assert list(columns) == expected
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    for name, path in columns.items():
        if path.startswith(".metadata."):
            continue
        assert schema_at(schema_of(kind), path) is not None, f"{name}: {path}"


def test_conditions_carry_the_designed_types_and_statuses() -> None:
    for kind in CRDS:
        item = schema_at(schema_of(kind), ".status.conditions[]")
        assert item is not None
        assert item["properties"]["type"]["enum"] == ["Ready", "Reconciling", "Error"]
        assert item["properties"]["status"]["enum"] == ["True", "False", "Unknown"]
        assert item["properties"]["lastTransitionTime"]["format"] == "date-time"


def test_there_are_valid_and_invalid_samples_of_both_kinds() -> None:
    for samples in (VALID_SAMPLES, INVALID_SAMPLES):
        kinds = {load_yaml(path)["kind"] for path in samples}
        assert kinds == {"FjordCluster", "FjordTopic", "FjordUser"}


@pytest.mark.parametrize("path", VALID_SAMPLES, ids=lambda p: p.name)
def test_valid_sample_passes(path: Path) -> None:
    assert validate_custom_resource(load_yaml(path)) == []


@pytest.mark.parametrize("path", VALID_SAMPLES, ids=lambda p: p.name)
def test_valid_sample_passes_the_operators_own_validation(path: Path) -> None:
    """What the CRD accepts the operator reconciles: a cluster sample is planned without
    problems into the objects that run it, a topic sample is created as it says."""
    from fjord_operator.decisions import autoscaling_policy, decide_topic, topic_spec_problems
    from fjord_operator.handlers import plan_cluster

    resource = load_yaml(path)
    resource["metadata"].setdefault("uid", "sample-uid")  # the API server's, on create
    spec = resource["spec"]
    if resource["kind"] == "FjordCluster":
        plan = plan_cluster(resource, None, None, None, {}, frozenset(), datetime.now(UTC))
        error = next(c for c in plan.status["conditions"] if c["type"] == "Error")
        assert error["status"] == "False", error["message"]
        kinds = {obj["kind"] for obj in plan.objects}
        assert {"ConfigMap", "StatefulSet", "Deployment", "Service"} <= kinds
        (sts,) = [
            o
            for o in plan.objects
            if o["metadata"]["name"].endswith("-broker") and o["kind"] == "StatefulSet"
        ]
        assert sts["spec"]["replicas"] == spec["brokers"]["replicas"]
    elif resource["kind"] == "FjordUser":
        from fjord_operator.security import user_acls, user_authentication

        assert user_authentication(spec) in ("tls", "scram-sha-512")
        assert user_acls(resource["metadata"]["name"], spec)
    else:
        assert topic_spec_problems(spec) == []
        decision = decide_topic(
            spec["partitions"],
            spec["replicationFactor"],
            spec.get("config") or {},
            None,
            autoscaling_policy(spec),
        )
        assert decision.create and decision.partitions == spec["partitions"]
        assert decision.error is None


@pytest.mark.parametrize("path", INVALID_SAMPLES, ids=lambda p: p.name)
def test_invalid_sample_fails_for_the_intended_reason(path: Path) -> None:
    resource = load_yaml(path)
    expected_path, _, expected_reason = resource["metadata"]["annotations"][
        EXPECTED_ERROR
    ].rpartition(": ")
    assert validate_custom_resource(resource) == [(expected_path, expected_reason)]


def test_the_spark_cluster_sample_matches_spark_k8s_bootstrap() -> None:
    """spark/k8s bootstraps from fjord-broker.fjord.svc:9092: a FjordCluster `fjord` in `fjord`."""
    sample = load_yaml(SAMPLES_DIR / "fjordcluster-fjord.yaml")
    assert (sample["metadata"]["name"], sample["metadata"]["namespace"]) == ("fjord", "fjord")
    spark_job = SAMPLES_DIR.parents[2] / "spark" / "k8s" / "sparkapplication-orders-shipments.yaml"
    assert "fjord-broker.fjord.svc:9092" in spark_job.read_text()
    # The chart's default: TLS and ACLs on; the jobs' FjordUsers are users of this cluster.
    assert sample["spec"]["security"] == {"tls": True, "authorization": True}
    assert len(SPARK_USERS) == 3
    for path in SPARK_USERS:
        user = load_yaml(path)
        assert user["spec"]["cluster"] == "fjord", path.name
        assert user["metadata"]["namespace"] == "fjord", path.name


def test_unknown_fields_are_found_at_any_depth_but_not_in_maps_or_kopf_status() -> None:
    topic = load_yaml(SAMPLES_DIR / "fjordtopic-autoscaling.yaml")
    topic = copy.deepcopy(topic)
    topic["spec"]["autoscaling"]["maxPartition"] = 3
    topic["spec"]["config"] = {"any.kafka.name": "1"}
    topic["status"] = {"partitions": 12, "kopf": {"progress": {"x": {"retries": 1}}}, "phase": "?"}
    assert sorted(unknown_fields(schema_of("FjordTopic"), topic)) == [
        "spec.autoscaling.maxPartition",
        "status.phase",
    ]


def test_a_resource_of_another_group_version_is_refused() -> None:
    topic = load_yaml(SAMPLES_DIR / "fjordtopic-orders.yaml")
    topic["apiVersion"] = "fjord.io/v1"
    assert validate_custom_resource(topic) == [("apiVersion", "not fjord.io/v1alpha1")]


def test_status_the_operator_writes_fits_the_schema() -> None:
    """Every status field fjord_operator writes is declared (a real API server would prune it)."""
    from datetime import UTC, datetime

    from fjord_operator.decisions import ScalingPhase
    from fjord_operator.status import Outcome, Verdict, status_patch

    phases = schema_at(schema_of("FjordCluster"), ".status.scaling.phase")
    assert phases is not None and phases["enum"] == [phase.value for phase in ScalingPhase]
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    cluster = load_yaml(SAMPLES_DIR / "fjordcluster-fjord.yaml")
    scaling = {"phase": "Draining", "from": 5, "to": 3, "message": "moving 12 replicas"}
    verdict = Verdict(Outcome.RECONCILING, "Draining", "draining brokers 3, 4")
    cluster["status"] = status_patch(
        verdict, 4, None, now, brokers=5, readyBrokers=5, scaling=scaling
    )
    topic = load_yaml(SAMPLES_DIR / "fjordtopic-orders.yaml")
    verdict = Verdict(Outcome.ERROR, "PartitionDecreaseRefused", "6 -> 3 refused")
    topic["status"] = status_patch(
        verdict, 2, None, now, partitions=6, topicId="AAAAAAAAAAAAAAAAAAAAAA"
    )
    for resource in (cluster, topic):
        # The API server serialises lastTransitionTime as an RFC 3339 string.
        for condition in resource["status"]["conditions"]:
            value = condition["lastTransitionTime"]
            if isinstance(value, datetime):
                condition["lastTransitionTime"] = value.isoformat().replace("+00:00", "Z")
        assert validate_custom_resource(resource) == []
        assert {c["type"] for c in resource["status"]["conditions"]} == {
            "Ready",
            "Reconciling",
            "Error",
        }
