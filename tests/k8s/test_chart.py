"""The Helm chart charts/fjord: ``helm lint --strict``; ``helm template`` with the default values
and with each charts/fjord/ci/*-values.yaml, every rendered object validated by
kubernetes-validate against the oldest and the newest Kubernetes version that Chart.yaml's
kubeVersion claims; the custom resources it renders validated against the chart's own CRDs; bad
values refused by values.schema.json; RBAC least privilege; alert rules on real metric names.

helm comes from `make helm` (into .venv/bin); without it these tests fail, they never skip.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from fjord.observability import metrics as fjord_metrics
from tests.k8s.crd_validation import CHART_DIR, load_yaml, validate_custom_resource
from tests.k8s.helm import NAMESPACE, RELEASE, helm, render

CI_VALUES = sorted((CHART_DIR / "ci").glob("*-values.yaml"))
RENDERINGS = [None, *CI_VALUES]
#: Kinds no Kubernetes schema covers: the chart's own (checked against its CRDs) and the
#: Prometheus operator's (monitoring.coreos.com).
OWN_KINDS = {"FjordCluster"}
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}


def objects(values: Path | None, kind: str) -> list[dict[str, Any]]:
    return [doc for doc in render(values) if doc["kind"] == kind]


def one(values: Path | None, kind: str) -> dict[str, Any]:
    found = objects(values, kind)
    assert len(found) == 1, [doc["metadata"]["name"] for doc in found]
    return found[0]


def claimed_kube_versions() -> tuple[str, str]:
    """(oldest, newest) Kubernetes versions of Chart.yaml's ``>=A.B.0-0 <C.D.0-0`` range."""
    claim = load_yaml(CHART_DIR / "Chart.yaml")["kubeVersion"]
    match = re.fullmatch(r">=(\d+)\.(\d+)\.0-0 <(\d+)\.(\d+)\.0-0", claim)
    assert match, f"kubeVersion {claim!r} is not a closed range of minor versions"
    low_major, low_minor, high_major, high_minor = map(int, match.groups())
    assert low_major == high_major == 1
    return f"1.{low_minor}.0", f"1.{high_minor - 1}.0"


def rendering_id(values: Path | None) -> str:
    return "defaults" if values is None else values.name


# --- lint and the claimed Kubernetes range ------------------------------------------------


@pytest.mark.parametrize("values", RENDERINGS, ids=rendering_id)
def test_helm_lint_strict_passes(values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART_DIR), "--namespace", NAMESPACE]
    args += [] if values is None else ["--values", str(values)]
    result = helm(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_claimed_versions_are_ones_kubernetes_validate_knows() -> None:
    oldest, newest = claimed_kube_versions()
    supported = set(kubernetes_validate.utils.all_versions())
    assert {oldest, newest} <= supported, sorted(supported)


def test_helm_refuses_a_kubernetes_version_outside_the_claim() -> None:
    oldest, newest = claimed_kube_versions()
    minor = lambda version, delta: f"1.{int(version.split('.')[1]) + delta}.0"  # noqa: E731
    for outside in (minor(oldest, -1), minor(newest, 1)):
        result = helm("template", RELEASE, str(CHART_DIR), "--kube-version", outside)
        assert result.returncode != 0 and "kubeVersion" in result.stderr, (outside, result.stderr)
    for inside in (oldest, newest):
        assert helm("template", RELEASE, str(CHART_DIR), "--kube-version", inside).returncode == 0


# --- every rendered object is valid Kubernetes ----------------------------------------------


@pytest.mark.parametrize("version", claimed_kube_versions())
@pytest.mark.parametrize("values", RENDERINGS, ids=rendering_id)
def test_rendered_manifests_are_valid_kubernetes(values: Path | None, version: str) -> None:
    validated = []
    for doc in render(values):
        if doc["kind"] in OWN_KINDS:
            assert validate_custom_resource(doc) == [], doc["metadata"]["name"]
        elif doc["kind"] in PROMETHEUS_OPERATOR_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        else:
            kubernetes_validate.validate(doc, version, strict=True)
        validated.append(doc["kind"])
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount"} <= set(validated)


def test_the_validator_is_not_vacuous() -> None:
    """kubernetes-validate in strict mode refuses a misspelt field of a rendered Deployment."""
    deployment = dict(one(None, "Deployment"))
    deployment["spec"] = {**deployment["spec"], "replica": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, claimed_kube_versions()[1], strict=True)


def test_default_install_is_the_operator_and_its_rbac_only() -> None:
    kinds = sorted(doc["kind"] for doc in render(None))
    assert kinds == sorted(
        [
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Deployment",
        ]
    )
    crds = {doc["metadata"]["name"]: doc for doc in objects(None, "CustomResourceDefinition")}
    for name in crds:
        assert crds[name] == load_yaml(CHART_DIR / "crds" / f"{name.split('.')[0]}.yaml")


# --- values.schema.json refuses bad values ------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("cluster.brokers.replicas=0", "replicas"),
        ("operator.image.pullPolicy=Sometimes", "pullPolicy"),
        ("etcd.replicas=2", "replicas"),
        ("cluster.brokers.storage.size=ten gigabytes", "size"),
        ("operator.watchNamespaces={Bad_Namespace}", "watchNamespaces"),
        ("monitoring.prometheusRule.consumerLagFor=ten minutes", "consumerLagFor"),
        ("operater.image.tag=1", "operater"),
        ("etcd.managed=false", "endpoints"),
        ("cluster.security.kafkaAuthentication=plain", "kafkaAuthentication"),
        ("cluster.security.superUsers={alice}", "superUsers"),
        ("cluster.security.certificates.validityDays=0", "validityDays"),
        ("cluster.listeners[0].name=TLS,cluster.listeners[0].port=9095", "listeners"),
        ("cluster.listeners[0].name=tls,cluster.listeners[0].port=9095,"
         "cluster.listeners[0].authentication=plain", "authentication"),
        ("cluster.security.saslGrpcDoor.port=0", "saslGrpcDoor"),
    ],
)
def test_bad_value_fails_helm_template(setting: str, complaint: str) -> None:
    result = helm("template", RELEASE, str(CHART_DIR), "--set", setting)
    assert result.returncode != 0, f"{setting} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert complaint in result.stderr, result.stderr


def test_the_charts_cluster_has_tls_and_acls_on_by_default_and_passes_the_operator() -> None:
    """Issue 16: the chart's FjordCluster is secure unless the values say otherwise, and what
    it renders is a spec the operator reconciles (no problems, pods started with TLS)."""
    from fjord_operator import builders

    (cluster,) = [d for d in render(None, "--set", "cluster.enabled=true")
                  if d["kind"] == "FjordCluster"]
    assert cluster["spec"]["security"] == {
        "tls": True, "authorization": True, "kafkaAuthentication": "tls",
        "certificates": {"validityDays": 365, "renewalDays": 30},
        "clusterCa": {"validityDays": 1825, "renewalDays": 30},
    }
    assert builders.cluster_spec_problems(cluster["spec"]) == []
    (plain,) = [d for d in render(None, "--set", "cluster.enabled=true",
                                  "--set", "cluster.security.tls=false",
                                  "--set", "cluster.security.authorization=false")
                if d["kind"] == "FjordCluster"]
    assert plain["spec"]["security"] == {"tls": False, "authorization": False,
                                         "kafkaAuthentication": "tls",
                                         "certificates": {"validityDays": 365,
                                                          "renewalDays": 30},
                                         "clusterCa": {"validityDays": 1825,
                                                       "renewalDays": 30}}
    assert builders.cluster_spec_problems(plain["spec"]) == []


LISTENER_VALUES = (
    "--set", "cluster.enabled=true",
    "--set", "cluster.listeners[0].name=tls", "--set", "cluster.listeners[0].port=9095",
    "--set", "cluster.listeners[0].authentication=tls",
    "--set", "cluster.listeners[1].name=scram", "--set", "cluster.listeners[1].port=9096",
    "--set", "cluster.listeners[1].authentication=scram-sha-512",
    "--set", "cluster.security.saslGrpcDoor.enabled=true",
)  # fmt: skip


def test_listeners_and_sasl_doors_from_values_reach_the_pods_and_services() -> None:
    """Strimzi-style listeners and the SASL gRPC doors as chart values: the FjordCluster
    carries them, the operator plans them without problems into both doors on every broker
    Service and the doors' port everywhere, and the NOTES name each listener's address."""
    from fjord_operator import builders

    (cluster,) = [d for d in render(None, *LISTENER_VALUES) if d["kind"] == "FjordCluster"]
    assert cluster["spec"]["listeners"] == [
        {"name": "tls", "port": 9095, "authentication": "tls"},
        {"name": "scram", "port": 9096, "authentication": "scram-sha-512"},
    ]
    assert cluster["spec"]["security"]["saslGrpcDoor"] == {"enabled": True, "port": 9097}
    assert builders.cluster_spec_problems(cluster["spec"]) == []
    cluster["metadata"]["uid"] = "u"
    services = {o["metadata"]["name"]: o for o in builders.cluster_objects(cluster, 3)
                if o["kind"] == "Service"}
    ports = {p["name"]: p["port"] for p in services["fjord-broker"]["spec"]["ports"]}
    assert ports == {"grpc": 9092, "tls": 9095, "scram": 9096, "sasl-grpc": 9097,
                     "metrics": 9404}
    notes = install_notes(*LISTENER_VALUES)
    service = f"fjord-broker.{NAMESPACE}.svc"
    assert f"tls (tls):  bootstrap.servers={service}:9095" in notes
    assert f"scram (scram-sha-512):  bootstrap.servers={service}:9096" in notes
    assert f"--bootstrap-server {service}:9097 --command-config" in notes
    (default,) = [d for d in render(None, "--set", "cluster.enabled=true")
                  if d["kind"] == "FjordCluster"]
    assert "listeners" not in default["spec"] and "saslGrpcDoor" not in default["spec"]["security"]


def test_managed_false_with_endpoints_renders_them() -> None:
    extra = ("--set", "cluster.enabled=true", "--set", "etcd.managed=false",
             "--set", "etcd.endpoints={http://etcd.infra.svc:2379}")  # fmt: skip
    cluster = [doc for doc in render(None, *extra) if doc["kind"] == "FjordCluster"]
    assert [c["spec"]["etcd"] for c in cluster] == [{"endpoints": ["http://etcd.infra.svc:2379"]}]


# --- the operator and its RBAC --------------------------------------------------------------


FULL = CHART_DIR / "ci" / "full-values.yaml"
ALL_NAMESPACES = CHART_DIR / "ci" / "external-etcd-values.yaml"


def operator_container(values: Path | None) -> dict[str, Any]:
    deployment = one(values, "Deployment")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_operator_runs_one_standalone_non_root_replica() -> None:
    import inspect

    from fjord_operator import main as operator_main

    # The RBAC grants no kopf peering objects: that holds only while kopf runs standalone.
    assert "standalone=True" in inspect.getsource(operator_main.run_async)
    deployment = one(None, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["serviceAccountName"] == one(None, "ServiceAccount")["metadata"]["name"]
    container = operator_container(None)
    assert container["image"] == "fjord/fjord:0.1.0"
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize(
    ("values", "args"),
    [
        (None, ["operator", f"--namespace={NAMESPACE}"]),
        (FULL, ["operator", "--namespace=fjord", "--namespace=analytics"]),
        (ALL_NAMESPACES, ["operator"]),
    ],
    ids=["release-namespace", "listed", "all"],
)
def test_operator_watches_the_namespaces_it_has_rights_in(
    values: Path | None, args: list[str]
) -> None:
    assert operator_container(values)["args"] == args
    from fjord.cli.operator_cmd import operator as operator_command

    # The arguments are ones `fjord operator` accepts (parsed, not run).
    context = operator_command.make_context("operator", list(args[1:]))
    assert context.params["namespaces"] == tuple(a.split("=", 1)[1] for a in args[1:])
    roles = objects(values, "Role")
    operator_role_namespaces = sorted(
        r["metadata"]["namespace"] for r in roles if r["metadata"]["name"].endswith("-operator")
    )
    assert operator_role_namespaces == sorted(a.split("=", 1)[1] for a in args[1:])


def all_rules(values: Path | None) -> list[dict[str, Any]]:
    return [
        rule
        for kind in ("Role", "ClusterRole")
        for role in objects(values, kind)
        for rule in role["rules"]
    ]


@pytest.mark.parametrize("values", RENDERINGS, ids=rendering_id)
def test_rbac_is_least_privilege(values: Path | None) -> None:
    operator_secrets = operator_rules(values).get(("", "secrets"))
    # Secrets: only the operator's own Role (the cluster CA, the services' and users'
    # credentials it keeps, issue 16), never the Spark jobs' or kopf's.
    assert operator_secrets == {"get", "list", "watch", "create", "update", "patch", "delete"}
    for rule in all_rules(values):
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), rule
    kopf_role = next(
        r for r in objects(values, "ClusterRole") if r["metadata"]["name"].endswith("-kopf")
    )
    assert kopf_role["rules"] == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["get", "list", "watch"],
        },
        # rack awareness: one node's labels, by name (never list, never write)
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    ]


def operator_rules(values: Path | None) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs granted to the operator in the namespaces it watches."""
    kind = "ClusterRole" if values == ALL_NAMESPACES else "Role"
    role = next(r for r in objects(values, kind) if r["metadata"]["name"].endswith("-operator"))
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


@pytest.mark.parametrize("values", [None, ALL_NAMESPACES], ids=["namespaced", "cluster-wide"])
def test_operator_gets_exactly_what_it_reconciles(values: Path | None) -> None:
    write = {"get", "list", "watch", "create", "update", "patch", "delete"}
    assert operator_rules(values) == {
        ("fjord.io", "fjordclusters"): {"get", "list", "watch", "patch", "update"},
        ("fjord.io", "fjordtopics"): {"get", "list", "watch", "patch", "update"},
        ("fjord.io", "fjordusers"): {"get", "list", "watch", "patch", "update"},
        ("fjord.io", "fjordclusters/status"): {"get", "patch", "update"},
        ("fjord.io", "fjordtopics/status"): {"get", "patch", "update"},
        ("fjord.io", "fjordusers/status"): {"get", "patch", "update"},
        ("fjord.io", "fjordclusters/finalizers"): {"update"},
        ("fjord.io", "fjordtopics/finalizers"): {"update"},
        ("fjord.io", "fjordusers/finalizers"): {"update"},
        ("apps", "statefulsets"): write,
        ("apps", "deployments"): write,
        ("", "services"): write,
        ("", "configmaps"): write,
        ("policy", "poddisruptionbudgets"): write,
        ("", "secrets"): write,
        # delete: rolling restarts of brokers (template change, certificate renewal), one at a time
        ("", "pods"): {"get", "list", "watch", "delete", "patch"},
        ("", "events"): {"create"},
    }


def test_operator_rbac_covers_every_kind_the_operator_builds() -> None:
    from fjord_operator import builders

    sample = load_yaml(CHART_DIR / "samples" / "fjordcluster-fjord.yaml")
    sample["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
    built = builders.cluster_objects(sample, broker_replicas=3)
    plural = {
        "StatefulSet": ("apps", "statefulsets"),
        "Deployment": ("apps", "deployments"),
        "Service": ("", "services"),
        "ConfigMap": ("", "configmaps"),
        "PodDisruptionBudget": ("policy", "poddisruptionbudgets"),
    }
    granted = operator_rules(None)
    kinds = {obj["kind"] for obj in built}
    assert kinds == set(plural), kinds
    for kind in kinds:
        assert {"get", "create", "patch"} <= granted[plural[kind]], kind


# --- the optional FjordCluster --------------------------------------------------------------


def test_cluster_from_values_is_a_valid_fjordcluster() -> None:
    cluster = one(FULL, "FjordCluster")
    values = load_yaml(FULL)
    assert validate_custom_resource(cluster) == []
    assert cluster["metadata"] == {
        **cluster["metadata"],
        "name": "fjord",
        "namespace": NAMESPACE,
    }
    spec = cluster["spec"]
    assert spec["image"] == {
        "repository": "fjord/fjord",
        "tag": "0.1.0",
        "pullPolicy": "IfNotPresent",
    }
    assert spec["brokers"] == values["cluster"]["brokers"]
    assert spec["controllers"] == {"replicas": 3}
    assert spec["coordinators"] == values["cluster"]["coordinators"]
    assert spec["etcd"] == {"managed": {"replicas": 3, "storage": values["etcd"]["storage"]}}


def test_cluster_with_existing_etcd() -> None:
    cluster = one(ALL_NAMESPACES, "FjordCluster")
    assert validate_custom_resource(cluster) == []
    assert cluster["metadata"]["name"] == "events"
    assert cluster["spec"]["etcd"] == {"endpoints": load_yaml(ALL_NAMESPACES)["etcd"]["endpoints"]}
    # An empty storage class is left out (the cluster's default class), not sent as "".
    assert cluster["spec"]["brokers"]["storage"] == {"size": "20Gi"}


def install_notes(*extra: str) -> str:
    """The NOTES a user sees after `helm install` (client-side dry run: no cluster needed)."""
    result = helm(
        "install", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE, "--dry-run=client", *extra
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.partition("NOTES:")[2]


def test_notes_tell_how_to_reach_the_kafka_and_grpc_listeners() -> None:
    """The addresses in NOTES are the ones the operator builds: the client Service, each
    broker's advertised pod name, the Kafka and gRPC ports of the broker Services."""
    from fjord_operator import builders
    from fjord_operator import settings as s

    notes = install_notes("--set", "cluster.enabled=true", "--set", "cluster.brokers.replicas=2")
    body = {
        "metadata": {"name": "fjord", "namespace": NAMESPACE, "uid": "u"},
        "spec": {"brokers": {"replicas": 2}, "etcd": {"managed": {}}},
    }
    services = {
        o["metadata"]["name"]: o
        for o in builders.cluster_objects(body, 2)
        if o["kind"] == "Service"
    }
    ports = {p["name"]: p["port"] for p in services["fjord-broker"]["spec"]["ports"]}
    assert (ports["kafka"], ports["grpc"]) == (s.KAFKA_PORT, s.BROKER_PORT)
    service = f"fjord-broker.{NAMESPACE}.svc"
    assert f"bootstrap.servers={service}:{s.KAFKA_PORT}" in notes
    assert f"--bootstrap-server {service}:{s.BROKER_PORT}" in notes
    sts = builders.broker_statefulset(body, 2)
    script = sts["spec"]["template"]["spec"]["containers"][0]["command"][2]
    advertised = f"$HOSTNAME.fjord-broker-headless.{NAMESPACE}.svc"
    assert f'"KAFKA://{advertised}:{s.KAFKA_PORT}"' in script
    forwards = re.findall(r"port-forward --address (127\.0\.0\.\d+) pod/(\S+) (\d+) (\d+)", notes)
    assert forwards == [
        (f"127.0.0.{i + 2}", f"fjord-broker-{i}", str(s.KAFKA_PORT), str(s.BROKER_PORT))
        for i in range(2)
    ]
    for i in range(2):
        host = advertised.replace("$HOSTNAME", f"fjord-broker-{i}")
        assert f'"127.0.0.{i + 2} {host}"' in notes
    assert "Create a topic" in notes
    without_cluster = install_notes()
    assert f"port {s.KAFKA_PORT} for\nKafka clients and {s.BROKER_PORT}" in without_cluster


# --- monitoring -----------------------------------------------------------------------------


def exported_metrics() -> dict[str, tuple[str, ...]]:
    """Name -> label names of every metric Fjord exports (fjord.observability.metrics)."""
    found = {}
    for value in vars(fjord_metrics).values():
        if isinstance(value, MetricWrapperBase):
            # prometheus_client keeps these only as private attributes.
            found[value._name] = tuple(value._labelnames)
    return found


def test_alerts_use_metrics_fjord_exports_with_their_labels() -> None:
    rule = one(FULL, "PrometheusRule")
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert set(alerts) == {
        "FjordConsumerGroupLagHigh",
        "FjordConsumerGroupLagRecordsHigh",
        "FjordUnderReplicatedPartitions",
        "FjordOfflinePartitions",
        "FjordNoActiveController",
    }
    known = exported_metrics()
    for name, alert in alerts.items():
        # Label lists of by (...) / on (...) name labels, not metrics (fjord_cluster).
        metrics_part = re.sub(r"\b(by|on|without|ignoring)\s*\([^)]*\)", "", alert["expr"])
        used = set(re.findall(r"\bfjord_[a-z_]+", metrics_part))
        assert used, name
        assert used <= set(known), (name, used - set(known))
    lag = alerts["FjordConsumerGroupLagHigh"]  # fires on seconds (issue 19)
    assert "(fjord_group_lag_seconds) > 900" in lag["expr"] and lag["for"] == "15m"
    records = alerts["FjordConsumerGroupLagRecordsHigh"]
    assert "(fjord_group_lag) > 50000" in records["expr"] and records["for"] == "15m"
    for alert in (lag, records):
        lag_metric = re.search(r"\bfjord_group_lag(_seconds)?\b", alert["expr"])
        assert lag_metric is not None
        assert {"group", "topic"} <= set(known[lag_metric.group(0)])
    assert alerts["FjordOfflinePartitions"]["labels"]["severity"] == "critical"
    assert rule["metadata"]["labels"]["release"] == "prometheus"


def test_service_monitor_selects_the_operators_services_once() -> None:
    from fjord_operator import builders

    monitor = one(FULL, "ServiceMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["fjord", "analytics"]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == (
        "metrics",
        "/metrics",
        "15s",
    )
    selector = monitor["spec"]["selector"]
    drop = next(r for r in endpoint["relabelings"] if r.get("action") == "drop")
    # A TLS cluster (the chart's default; headless Services for the certificates' pod names)
    # and a plaintext one.
    for name in ("fjordcluster-fjord.yaml", "fjordcluster-minimal.yaml"):
        sample = load_yaml(CHART_DIR / "samples" / name)
        sample["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"
        built = builders.cluster_objects(sample, broker_replicas=3)
        services = [o for o in built if o["kind"] == "Service"]
        scraped = []
        for service in services:
            labels = service["metadata"]["labels"]
            selected = all(labels.get(k) == v for k, v in selector["matchLabels"].items()) and all(
                labels.get(e["key"]) in e["values"] for e in selector["matchExpressions"]
            )
            has_metrics = any(p["name"] == "metrics" for p in service["spec"]["ports"])
            if (
                selected
                and has_metrics
                and not re.fullmatch(drop["regex"], service["metadata"]["name"])
            ):
                scraped.append(labels["app.kubernetes.io/component"])
        # Every component scraped exactly once (the etcd Service is not Fjord's).
        assert sorted(scraped) == ["broker", "controller", "coordinator"], name
    assert one(ALL_NAMESPACES, "ServiceMonitor")["spec"]["namespaceSelector"] == {"any": True}


# --- Spark-on-Kubernetes ----------------------------------------------------------------------


def test_spark_service_account_matches_spark_k8s() -> None:
    spark_k8s = CHART_DIR.parents[1] / "spark" / "k8s"
    template = load_yaml(spark_k8s / "driver-pod-template.yaml")
    job = load_yaml(spark_k8s / "sparkapplication-orders-shipments.yaml")
    account = [a for a in objects(FULL, "ServiceAccount") if a["metadata"]["name"] == "fjord-spark"]
    assert [(a["metadata"]["namespace"]) for a in account] == [job["metadata"]["namespace"]]
    assert template["spec"]["serviceAccountName"] == "fjord-spark"
    assert job["spec"]["driver"]["serviceAccount"] == "fjord-spark"
    role = next(r for r in objects(FULL, "Role") if r["metadata"]["name"] == "fjord-spark")
    binding = next(
        b for b in objects(FULL, "RoleBinding") if b["metadata"]["name"] == "fjord-spark"
    )
    assert binding["roleRef"]["name"] == "fjord-spark"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "fjord-spark", "namespace": "fjord"}
    ]
    pods = next(r for r in role["rules"] if "pods" in r["resources"])
    # The driver creates, watches and deletes its executors.
    assert {"create", "watch", "delete", "deletecollection"} <= set(pods["verbs"])
    assert not any(a["metadata"]["name"] == "fjord-spark" for a in objects(None, "ServiceAccount"))


# --- NOTES.txt --------------------------------------------------------------------------------


def test_notes_tell_the_bootstrap_address_and_a_topic_to_apply() -> None:
    result = helm(
        "install", RELEASE, str(CHART_DIR), "--dry-run=client", "--namespace", NAMESPACE,
        "--values", str(FULL),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert f"fjord-broker.{NAMESPACE}.svc:9092" in notes
    heredoc = re.search(r"<<YAML[^\n]*\n(.*?\n)  YAML\n", notes, re.DOTALL)
    assert heredoc is not None, notes
    topic = yaml.safe_load(textwrap.dedent(heredoc.group(1)))
    assert validate_custom_resource(topic) == []
    assert topic["spec"] == {"cluster": "fjord", "partitions": 6, "replicationFactor": 3}


def test_a_cluster_in_a_namespace_the_operator_ignores_is_refused() -> None:
    result = helm(
        "template", RELEASE, str(CHART_DIR), "--namespace", "elsewhere",
        "--set", "cluster.enabled=true", "--set", "operator.watchNamespaces={fjord}",
    )  # fmt: skip
    assert result.returncode != 0
    assert "add elsewhere to operator.watchNamespaces" in result.stderr
