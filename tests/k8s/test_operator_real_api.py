"""The chart and the operator against a REAL Kubernetes API server: kube-apiserver and
kube-controller-manager 1.20 (`make kube`, the session fixture ``real_kube`` of
tests/k8s/conftest.py), with the Fjord admin calls going to the session's local Fjord cluster.

What is checked here (docs/kubernetes.md, "A real API server"):
- server-side validation: every sample in charts/fjord/samples passes a server-side dry run,
  every invalid one is refused by the server (the one exception is named and explained); the
  CRD's CEL rule, which 1.20 drops, enforced by the operator instead;
- the operator as a process (`fjord operator`) logging in the three ways a real deployment
  does (kubeconfig with a token, kubeconfig with a client certificate, the in-cluster service
  account), each with exactly the RBAC the chart renders, reconciling FjordTopics to Ready,
  deleting through its finalizer;
- a FjordCluster applied with kubectl becoming StatefulSets, Deployments, Services, a ConfigMap
  and PodDisruptionBudgets (policy/v1beta1: 1.20 has no policy/v1), the controller manager
  creating their pods for real (Pending: no scheduler or kubelet here), garbage collection of
  everything it owns when the FjordCluster goes;
- status conditions and printer columns as `kubectl get` shows them;
- the chart's RBAC with `kubectl auth can-i --as` the operator's ServiceAccount.

The chart declares kubeVersion >= 1.27, so `helm install` refuses 1.20: the chart's manifests
are rendered with `helm template` and applied with kubectl (tested below, too).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fjord.client import AdminClient
from fjord.local.cluster import LocalCluster
from fjord.local.etcd import log_tail
from fjord.testing.waiting import WaitTimeout, wait_for
from fjord_operator.settings import API_VERSION, BOOTSTRAP_ANNOTATION, MANAGED_BY
from tests.k8s.crd_validation import SAMPLES_DIR
from tests.k8s.helm import NAMESPACE as RELEASE_NAMESPACE
from tests.k8s.helm import helm, render_in
from tests.k8s.kube.apiserver import OPERATOR_TOKEN_USER, RealKube
from tests.k8s.kube.operator_process import running_operator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EXPECTED_ERROR = "samples.fjord.io/expected-error"
VALID_SAMPLES = sorted(SAMPLES_DIR.glob("*.yaml"))
INVALID_SAMPLES = sorted((SAMPLES_DIR / "invalid").glob("*.yaml"))
#: Invalid samples a 1.20 server accepts, and why. An unknown field is pruned silently: the
#: server's strict field validation (`fieldValidation=Strict`) arrived in 1.25 (GA 1.27). The
#: FjordTopic CRD's one CEL rule (1.25) is dropped by 1.20, but no invalid sample relies on it
#: (test_a_1_20_server_drops_the_crd_validation_rule_and_the_operator_refuses_instead).
PRUNED_BY_A_1_20_SERVER = {"topic-typo-field.yaml": ("spec", "replicationfactor")}

# Namespaces: the chart's release namespace, where the operator logs in with the chart's
# ServiceAccount (in-cluster), and one per kubeconfig login.
IN_CLUSTER_NS = RELEASE_NAMESPACE
TOKEN_NS, CERT_NS = "fjord-token", "fjord-cert"
WATCHED = (IN_CLUSTER_NS, TOKEN_NS, CERT_NS)
SAMPLE_NAMESPACES = ("fjord", "streaming", "default")
SCRATCH_NS = "samples"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
TOKEN_USER, CERT_USER = OPERATOR_TOKEN_USER, "fjord-operator-cert"
CLUSTER = "fjord"

RECONCILE_TIMEOUT_S = 90.0
GC_TIMEOUT_S = 90.0


# -- the world ----------------------------------------------------------------------------------


def _apply(kube: RealKube, *objects: dict[str, Any]) -> None:
    kube.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))


def _namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


@pytest.fixture(scope="module")
def rendered_rbac(real_kube: RealKube) -> dict[str, dict[str, Any]]:
    """The chart's RBAC objects for an operator watching WATCHED, applied with kubectl
    (rendered: helm refuses to install into 1.20, see the module docstring); by kind/name."""
    _apply(real_kube, *(_namespace(n) for n in {*WATCHED, *SAMPLE_NAMESPACES, SCRATCH_NS}))
    watch = "operator.watchNamespaces={" + ",".join(WATCHED) + "}"
    rbac = [
        doc
        for doc in render_in(RELEASE_NAMESPACE, None, "--set", watch)
        if doc["kind"] in RBAC_KINDS
    ]
    _apply(real_kube, *rbac)
    return {
        f"{o['kind']}/{o['metadata'].get('namespace', '')}/{o['metadata']['name']}": o for o in rbac
    }


def _one(rbac: dict[str, dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for key, o in rbac.items() if key.startswith(kind + "/") and "spark" not in key]
    return found


def _operator_service_account(rbac: dict[str, dict[str, Any]]) -> str:
    return str(_one(rbac, "ServiceAccount")["metadata"]["name"])


def _operator_role(rbac: dict[str, dict[str, Any]]) -> str:
    roles = {o["metadata"]["name"] for k, o in rbac.items() if k.startswith("Role/")}
    (role,) = roles
    return str(role)


@pytest.fixture(scope="module")
def user_logins(real_kube: RealKube, rendered_rbac: dict[str, dict[str, Any]]) -> None:
    """The token and certificate users get exactly the chart's operator rules: its Role in
    their namespace and its cluster-wide (CRD-reading) ClusterRole."""
    role = _operator_role(rendered_rbac)
    (kopf_role,) = [
        o["metadata"]["name"] for k, o in rendered_rbac.items() if k.startswith("ClusterRole/")
    ]
    bindings: list[dict[str, Any]] = []
    for user, namespace in ((TOKEN_USER, TOKEN_NS), (CERT_USER, CERT_NS)):
        subject = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
        bindings.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": user, "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                "subjects": subject,
            }
        )
        bindings.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": user},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": kopf_role,
                },
                "subjects": subject,
            }
        )
    _apply(real_kube, *bindings)


@pytest.fixture(scope="module")
def admin(local_cluster: LocalCluster) -> Iterator[AdminClient]:
    with AdminClient({"bootstrap.servers": local_cluster.bootstrap_servers}) as client:
        yield client


def _cluster(namespace: str, local: LocalCluster) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "FjordCluster",
        "metadata": {
            "name": CLUSTER,
            "namespace": namespace,
            "annotations": {BOOTSTRAP_ANNOTATION: local.bootstrap_servers},
        },
        "spec": {
            "brokers": {"replicas": 3, "storage": {"size": "1Gi"}},
            "controllers": {"replicas": 1},
            "coordinators": {"replicas": 1},
            "etcd": {"endpoints": [local.etcd_url]},
        },
    }


def _topic(namespace: str, name: str, topic_name: str, partitions: int = 3) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "FjordTopic",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "cluster": CLUSTER,
            "topicName": topic_name,
            "partitions": partitions,
            "replicationFactor": 2,
            "config": {"retention.ms": "3600000"},
        },
    }


def _condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


def _wait(condition: Any, what: str, operator_log: Path | None, timeout: float) -> Any:
    """wait_for; on a timeout the operator's last log lines are in the failure."""
    try:
        return wait_for(condition, what, timeout, interval=0.5)
    except WaitTimeout as exc:
        tail = log_tail(operator_log, lines=40) if operator_log is not None else ""
        raise WaitTimeout(f"{exc}\noperator log:\n{tail}") from None


def _ready_topic(kube: RealKube, namespace: str, name: str) -> dict[str, Any] | None:
    obj = kube.get_json("fjordtopic", name, "-n", namespace)
    ready = _condition(obj, "Ready")
    if obj is None or ready is None or ready["status"] != "True":
        return None
    if obj["status"].get("observedGeneration") != obj["metadata"]["generation"]:
        return None
    return dict(obj)


def _fjord_partitions(admin: AdminClient, topic: str) -> int | None:
    described = next((t for t in admin.describe_topics() if t.name == topic), None)
    return None if described is None else len(described.partitions)


def _reconcile_and_delete_a_topic(
    kube: RealKube, admin: AdminClient, namespace: str, operator_log: Path
) -> None:
    """A FjordTopic applied with kubectl becomes a Fjord topic and turns Ready; deleted, the
    operator's finalizer deletes the Fjord topic before the object goes."""
    topic_name = f"real-api.{namespace}.{uuid.uuid4().hex[:8]}"
    _apply(kube, _topic(namespace, "orders", topic_name))
    ready = _wait(
        lambda: _ready_topic(kube, namespace, "orders"),
        f"FjordTopic {namespace}/orders Ready",
        operator_log,
        RECONCILE_TIMEOUT_S,
    )
    assert _fjord_partitions(admin, topic_name) == 3
    assert ready["status"]["partitions"] == 3
    assert "fjord.io/finalizer" in ready["metadata"]["finalizers"]
    kube.kubectl("delete", "fjordtopic", "orders", "-n", namespace, "--wait=false")
    _wait(
        lambda: kube.get_json("fjordtopic", "orders", "-n", namespace) is None,
        f"FjordTopic {namespace}/orders released by the finalizer",
        operator_log,
        RECONCILE_TIMEOUT_S,
    )
    assert _fjord_partitions(admin, topic_name) is None
    # The chart's rules were enough: nothing the operator asked for was refused.
    assert "Forbidden" not in operator_log.read_text()


# -- server-side validation ---------------------------------------------------------------------


def _dry_run(kube: RealKube, path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    namespace = yaml.safe_load(path.read_text())["metadata"].get("namespace", SCRATCH_NS)
    return kube.kubectl(
        "apply",
        "--dry-run=server",
        *flags,
        "-n",
        namespace,
        "-f",
        str(path),
        "-o",
        "json",
        check=False,
    )


@pytest.mark.parametrize("path", VALID_SAMPLES, ids=lambda p: p.name)
def test_valid_samples_pass_server_side_validation(
    real_kube: RealKube, rendered_rbac: dict[str, Any], path: Path
) -> None:
    # --validate=false: the server's verdict alone, not kubectl's client-side check.
    result = _dry_run(real_kube, path, "--validate=false")
    assert result.returncode == 0, result.stderr
    sample = yaml.safe_load(path.read_text())
    accepted = json.loads(result.stdout)
    assert accepted["kind"] == sample["kind"]
    # Nothing was pruned: every field of the sample is in the schema.
    assert _contains(accepted["spec"], sample["spec"]), (accepted["spec"], sample["spec"])


def _contains(live: Any, desired: Any) -> bool:
    """Every field of ``desired`` is in ``live`` (the server's defaults, also inside list
    items such as a FjordUser's ACLs, are not a pruning)."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(
            k in live and _contains(live[k], v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(live) == len(desired)
            and all(_contains(a, b) for a, b in zip(live, desired, strict=True))
        )
    return bool(live == desired)


@pytest.mark.parametrize("path", INVALID_SAMPLES, ids=lambda p: p.name)
def test_invalid_samples_are_refused_by_the_server(
    real_kube: RealKube, rendered_rbac: dict[str, Any], path: Path
) -> None:
    sample = yaml.safe_load(path.read_text())
    expected_path = sample["metadata"]["annotations"][EXPECTED_ERROR].rpartition(": ")[0]
    # The server names an array item's error by the array's path (1.20: no index at all).
    expected_path = ".".join(part for part in expected_path.split(".") if not part.isdigit())
    result = _dry_run(real_kube, path, "--validate=false")
    if path.name in PRUNED_BY_A_1_20_SERVER:
        # 1.20 accepts and prunes the unknown field; kubectl's strict validation (its own
        # check against the schema the server publishes, as the server is too old) refuses.
        assert result.returncode == 0, result.stderr
        parent, field = PRUNED_BY_A_1_20_SERVER[path.name]
        assert field not in json.loads(result.stdout)[parent]
        strict = _dry_run(real_kube, path, "--validate=strict")
        assert strict.returncode != 0
        assert field in strict.stderr, strict.stderr
        return
    assert result.returncode != 0, f"the server accepted {path.name}: {result.stdout[:500]}"
    assert "is invalid" in result.stderr, result.stderr
    assert expected_path in result.stderr, result.stderr


def test_a_1_20_server_drops_the_crd_validation_rule_and_the_operator_refuses_instead(
    real_kube: RealKube, in_cluster_operator: Path
) -> None:
    """The FjordTopic CRD's one CEL rule (minPartitions <= maxPartitions) needs 1.25; a 1.20
    server drops it on install and accepts such a topic. The operator's own check of the spec
    refuses it in status, creating nothing."""
    crd = real_kube.get_json("crd", "fjordtopics.fjord.io")
    assert "x-kubernetes-validations" not in json.dumps(crd["spec"])
    ns = IN_CLUSTER_NS
    topic = _topic(ns, "min-above-max", f"real-api.cel.{uuid.uuid4().hex[:8]}")
    topic["spec"]["autoscaling"] = {
        "enabled": True,
        "minPartitions": 8,
        "maxPartitions": 4,
        "targetBytesPerSecondPerPartition": 1000,
    }
    _apply(real_kube, topic)

    def refused() -> dict[str, Any] | None:
        error = _condition(real_kube.get_json("fjordtopic", "min-above-max", "-n", ns), "Error")
        return error if error is not None and error["status"] == "True" else None

    error = _wait(refused, "the spec refused in status", in_cluster_operator, RECONCILE_TIMEOUT_S)
    assert error["reason"] == "InvalidSpec"
    assert "minPartitions 8 exceeds maxPartitions 4" in error["message"]
    real_kube.kubectl("delete", "fjordtopic", "min-above-max", "-n", ns, "--wait=false")
    _wait(
        lambda: real_kube.get_json("fjordtopic", "min-above-max", "-n", ns) is None,
        "FjordTopic min-above-max released",
        in_cluster_operator,
        RECONCILE_TIMEOUT_S,
    )


def test_helm_refuses_to_install_into_1_20_so_the_rendered_manifests_are_applied(
    real_kube: RealKube,
) -> None:
    version = json.loads(real_kube.get_raw("/version"))
    assert (version["major"], version["minor"]) == ("1", "20")
    from tests.k8s.crd_validation import CHART_DIR

    refused = helm("template", "fjord", str(CHART_DIR), "--kube-version", "1.20.2")
    assert refused.returncode != 0
    assert "kubeVersion" in refused.stderr, refused.stderr


# -- the chart's RBAC ----------------------------------------------------------------------------

#: (verb, resource, namespace) the operator needs ("yes") and must not have ("no").
OPERATOR_NEEDS = [
    ("watch", "fjordclusters.fjord.io", IN_CLUSTER_NS),
    ("patch", "fjordclusters.fjord.io/status", IN_CLUSTER_NS),
    ("patch", "fjordtopics.fjord.io", TOKEN_NS),
    ("update", "fjordtopics.fjord.io/finalizers", CERT_NS),
    ("create", "statefulsets.apps", IN_CLUSTER_NS),
    ("patch", "deployments.apps", IN_CLUSTER_NS),
    ("create", "services", IN_CLUSTER_NS),
    ("patch", "configmaps", IN_CLUSTER_NS),
    ("create", "poddisruptionbudgets.policy", IN_CLUSTER_NS),
    ("list", "pods", IN_CLUSTER_NS),
    ("patch", "pods", IN_CLUSTER_NS),  # rack awareness: the fjord.io/rack annotation
    ("get", "nodes", ""),  # rack awareness: the node's zone label
    ("delete", "pods", IN_CLUSTER_NS),  # rolling restarts of brokers, one pod at a time
    ("create", "secrets", IN_CLUSTER_NS),  # the cluster CA, services' and users' credentials
    ("delete", "secrets", IN_CLUSTER_NS),
    ("patch", "fjordusers.fjord.io/status", IN_CLUSTER_NS),
    ("update", "fjordusers.fjord.io/finalizers", IN_CLUSTER_NS),
    ("create", "events", IN_CLUSTER_NS),
    ("list", "customresourcedefinitions.apiextensions.k8s.io", ""),
]
OPERATOR_MUST_NOT = [
    ("get", "secrets", "default"),  # not a watched namespace
    ("create", "pods", IN_CLUSTER_NS),
    ("create", "pods/exec", IN_CLUSTER_NS),
    ("delete", "fjordclusters.fjord.io", IN_CLUSTER_NS),
    ("watch", "fjordclusters.fjord.io", "default"),  # not a watched namespace
    ("create", "statefulsets.apps", "default"),
    ("create", "roles.rbac.authorization.k8s.io", IN_CLUSTER_NS),
    ("create", "customresourcedefinitions.apiextensions.k8s.io", ""),
    ("list", "nodes", ""),
    ("patch", "nodes", ""),
    ("create", "serviceaccounts/token", IN_CLUSTER_NS),
]


def test_the_charts_rbac_gives_the_operator_what_it_needs_and_no_more(
    real_kube: RealKube, rendered_rbac: dict[str, dict[str, Any]]
) -> None:
    account = _operator_service_account(rendered_rbac)
    user = f"system:serviceaccount:{RELEASE_NAMESPACE}:{account}"
    answers = {
        (verb, resource, ns): real_kube.can_i(user, verb, resource, ns)
        for verb, resource, ns in OPERATOR_NEEDS + OPERATOR_MUST_NOT
    }
    assert {k: a for k, a in answers.items() if k in OPERATOR_NEEDS and a != "yes"} == {}
    assert {k: a for k, a in answers.items() if k in OPERATOR_MUST_NOT and a != "no"} == {}


# -- the operator logging in -------------------------------------------------------------------


def test_operator_logs_in_with_a_kubeconfig_token(
    real_kube: RealKube,
    user_logins: None,
    local_cluster: LocalCluster,
    admin: AdminClient,
    tmp_path: Path,
) -> None:
    token = real_kube.tokens[TOKEN_USER]
    kubeconfig = real_kube.write_kubeconfig(tmp_path / "token.kubeconfig", token=token)
    _apply(real_kube, _cluster(TOKEN_NS, local_cluster))
    with running_operator(real_kube, TOKEN_NS, tmp_path, kubeconfig=kubeconfig) as log:
        _reconcile_and_delete_a_topic(real_kube, admin, TOKEN_NS, log)


def test_operator_logs_in_with_a_kubeconfig_client_certificate(
    real_kube: RealKube,
    user_logins: None,
    local_cluster: LocalCluster,
    admin: AdminClient,
    tmp_path: Path,
) -> None:
    client = real_kube.client_certificate(CERT_USER)
    kubeconfig = real_kube.write_kubeconfig(tmp_path / "cert.kubeconfig", client=client)
    _apply(real_kube, _cluster(CERT_NS, local_cluster))
    with running_operator(real_kube, CERT_NS, tmp_path, kubeconfig=kubeconfig) as log:
        _reconcile_and_delete_a_topic(real_kube, admin, CERT_NS, log)
        # Garbage collection: everything the FjordCluster owns goes with it.
        broker_sts = real_kube.get_json("statefulset", f"{CLUSTER}-broker", "-n", CERT_NS)
        assert broker_sts is not None
        real_kube.kubectl("delete", "fjordcluster", CLUSTER, "-n", CERT_NS, "--wait=false")
        _wait(
            lambda: all(
                not real_kube.get_json(
                    kind, "-n", CERT_NS, "-l", f"app.kubernetes.io/instance={CLUSTER}"
                )["items"]
                for kind in ("statefulsets", "deployments", "services", "configmaps", "pods")
            ),
            "the FjordCluster's objects garbage-collected",
            log,
            GC_TIMEOUT_S,
        )


# -- in-cluster: the chart's ServiceAccount -----------------------------------------------------


@pytest.fixture(scope="module")
def in_cluster_operator(
    real_kube: RealKube,
    rendered_rbac: dict[str, dict[str, Any]],
    local_cluster: LocalCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Path]:
    """The operator logged in as the chart's ServiceAccount from a service-account mount
    (token, ca.crt, namespace) and KUBERNETES_SERVICE_HOST/PORT, reconciling the FjordCluster
    ``fjord`` applied with kubectl; yields the operator's log."""
    workdir = tmp_path_factory.mktemp("in-cluster-operator")
    mount = real_kube.service_account_mount(
        workdir / "serviceaccount", RELEASE_NAMESPACE, _operator_service_account(rendered_rbac)
    )
    _apply(real_kube, _cluster(IN_CLUSTER_NS, local_cluster))
    with running_operator(real_kube, IN_CLUSTER_NS, workdir, service_account_dir=mount) as log:
        yield log


def test_operator_logs_in_in_cluster_with_the_charts_service_account(
    real_kube: RealKube, in_cluster_operator: Path, admin: AdminClient
) -> None:
    _reconcile_and_delete_a_topic(real_kube, admin, IN_CLUSTER_NS, in_cluster_operator)


def test_a_topic_grows_and_a_decrease_is_refused_in_status(
    real_kube: RealKube, in_cluster_operator: Path, admin: AdminClient
) -> None:
    ns, name = IN_CLUSTER_NS, "growing"
    topic_name = f"real-api.grow.{uuid.uuid4().hex[:8]}"
    _apply(real_kube, _topic(ns, name, topic_name, partitions=2))
    _wait(
        lambda: _ready_topic(real_kube, ns, name), "Ready", in_cluster_operator, RECONCILE_TIMEOUT_S
    )
    patch = '{"spec": {"partitions": %d}}'
    real_kube.kubectl("patch", "fjordtopic", name, "-n", ns, "--type=merge", "-p", patch % 4)
    grown = _wait(
        lambda: (o := _ready_topic(real_kube, ns, name)) and o["status"]["partitions"] == 4 and o,
        "grown to 4 partitions",
        in_cluster_operator,
        RECONCILE_TIMEOUT_S,
    )
    assert grown["status"]["observedGeneration"] == 2
    assert _fjord_partitions(admin, topic_name) == 4
    real_kube.kubectl("patch", "fjordtopic", name, "-n", ns, "--type=merge", "-p", patch % 1)

    def refused() -> dict[str, Any] | None:
        obj = real_kube.get_json("fjordtopic", name, "-n", ns)
        error = _condition(obj, "Error")
        return obj if error is not None and error["status"] == "True" else None

    obj = _wait(refused, "the decrease refused", in_cluster_operator, RECONCILE_TIMEOUT_S)
    assert _condition(obj, "Error")["reason"] == "PartitionDecreaseRefused"  # type: ignore[index]
    assert _condition(obj, "Ready")["status"] == "False"  # type: ignore[index]
    assert obj["status"]["partitions"] == 4
    assert _fjord_partitions(admin, topic_name) == 4
    # kubectl shows the refusal in the READY column.
    row = real_kube.kubectl("get", "fjt", name, "-n", ns, "--no-headers").stdout.split()
    assert row[:5] == [name, CLUSTER, "1", "2", "False"]
    real_kube.kubectl("delete", "fjordtopic", name, "-n", ns, "--wait=false")
    _wait(
        lambda: real_kube.get_json("fjordtopic", name, "-n", ns) is None,
        "released",
        in_cluster_operator,
        RECONCILE_TIMEOUT_S,
    )
    assert _fjord_partitions(admin, topic_name) is None


OWNED = [
    ("statefulset", f"{CLUSTER}-broker"),
    ("service", f"{CLUSTER}-broker"),
    ("service", f"{CLUSTER}-broker-headless"),
    ("deployment", f"{CLUSTER}-controller"),
    ("service", f"{CLUSTER}-controller"),
    ("deployment", f"{CLUSTER}-coordinator"),
    ("configmap", f"{CLUSTER}-config"),
    ("poddisruptionbudget", f"{CLUSTER}-broker"),
    ("poddisruptionbudget", f"{CLUSTER}-controller"),
]


def test_a_fjord_cluster_becomes_workloads_whose_pods_are_created(
    real_kube: RealKube, in_cluster_operator: Path
) -> None:
    ns = IN_CLUSTER_NS

    def owned() -> dict[tuple[str, str], Any] | None:
        objects = {(k, n): real_kube.get_json(k, n, "-n", ns) for k, n in OWNED}
        return objects if all(objects.values()) else None

    objects = _wait(owned, "the FjordCluster's objects", in_cluster_operator, RECONCILE_TIMEOUT_S)
    cluster = real_kube.get_json("fjordcluster", CLUSTER, "-n", ns)
    for (kind, name), obj in objects.items():
        owners = obj["metadata"].get("ownerReferences", [])
        assert [(o["kind"], o["uid"], o.get("controller")) for o in owners] == [
            ("FjordCluster", cluster["metadata"]["uid"], True)
        ], f"{kind}/{name}: {owners}"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == MANAGED_BY
    # 1.20 serves PodDisruptionBudgets as policy/v1beta1 only: the operator wrote that, and the
    # disruption controller works on them.
    pdb = objects[("poddisruptionbudget", f"{CLUSTER}-broker")]
    assert pdb["apiVersion"] == "policy/v1beta1"
    assert pdb["spec"]["maxUnavailable"] == 1
    _wait(
        lambda: (
            (real_kube.get_json("pdb", f"{CLUSTER}-broker", "-n", ns).get("status") or {}).get(
                "expectedPods"
            )
            == 3
        ),
        "the disruption controller to count the brokers' pods",
        in_cluster_operator,
        RECONCILE_TIMEOUT_S,
    )

    # The workload controllers create the pods: 3 brokers (Parallel), 1 controller, 1 coordinator.
    def pods() -> dict[str, list[str]] | None:
        listed = real_kube.get_json("pods", "-n", ns, "-l", f"app.kubernetes.io/instance={CLUSTER}")
        by_component: dict[str, list[str]] = {}
        for pod in listed["items"]:
            component = pod["metadata"]["labels"]["app.kubernetes.io/component"]
            by_component.setdefault(component, []).append(pod["metadata"]["name"])
        counts = {c: len(p) for c, p in by_component.items()}
        return by_component if counts == {"broker": 3, "controller": 1, "coordinator": 1} else None

    created = _wait(
        pods, "the workload controllers' pods", in_cluster_operator, RECONCILE_TIMEOUT_S
    )
    assert sorted(created["broker"]) == [f"{CLUSTER}-broker-{i}" for i in range(3)]
    broker = real_kube.get_json("pod", f"{CLUSTER}-broker-0", "-n", ns)
    assert broker["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"
    assert broker["status"]["phase"] == "Pending"  # no scheduler, no kubelet here
    # The StatefulSet controller made the broker's volume claim from the claim template.
    claims = real_kube.get_json("pvc", "-n", ns)["items"]
    assert any(c["metadata"]["name"].endswith(f"{CLUSTER}-broker-0") for c in claims)


def test_status_conditions_and_printer_columns_as_kubectl_shows_them(
    real_kube: RealKube, in_cluster_operator: Path, admin: AdminClient
) -> None:
    ns = IN_CLUSTER_NS
    topic_name = f"real-api.columns.{uuid.uuid4().hex[:8]}"
    _apply(real_kube, _topic(ns, "columns", topic_name, partitions=4))
    _wait(
        lambda: _ready_topic(real_kube, ns, "columns"),
        "FjordTopic columns Ready",
        in_cluster_operator,
        RECONCILE_TIMEOUT_S,
    )
    table = real_kube.kubectl("get", "fjordtopics", "columns", "-n", ns).stdout.splitlines()
    assert table[0].split() == ["NAME", "CLUSTER", "PARTITIONS", "REPLICATION", "READY", "AGE"]
    assert table[1].split()[:5] == ["columns", CLUSTER, "4", "2", "True"]
    # The short name and category the CRD declares.
    assert "columns" in real_kube.kubectl("get", "fjt", "-n", ns).stdout
    assert "columns" in real_kube.kubectl("get", "fjord", "-n", ns).stdout

    # The FjordCluster: no kubelet runs its pods, so it is not Ready; the columns show why.
    def cluster_status() -> dict[str, Any] | None:
        obj = real_kube.get_json("fjordcluster", CLUSTER, "-n", ns)
        return obj if _condition(obj, "Ready") is not None else None

    cluster = _wait(cluster_status, "FjordCluster status", in_cluster_operator, RECONCILE_TIMEOUT_S)
    ready = _condition(cluster, "Ready")
    assert ready is not None
    table = real_kube.kubectl("get", "fjc", CLUSTER, "-n", ns).stdout.splitlines()
    assert table[0].split() == ["NAME", "BROKERS", "READY", "REASON", "AGE"]
    row = table[1].split()
    assert row[:2] == [CLUSTER, "3"]
    assert row[2] in ("True", "False")
    # The columns follow the status the operator keeps writing (it may move on between reads).
    latest = _condition(real_kube.get_json("fjordcluster", CLUSTER, "-n", ns), "Ready")
    assert latest is not None
    assert (row[2], row[3]) in {
        (ready["status"], ready["reason"]),
        (latest["status"], latest["reason"]),
    }
    # The PodDisruptionBudget's missing policy/v1 never shows as a refusal.
    assert ready["reason"] != "KubernetesApiRejected", ready
    real_kube.kubectl("delete", "fjordtopic", "columns", "-n", ns, "--wait=false")
    _wait(
        lambda: real_kube.get_json("fjordtopic", "columns", "-n", ns) is None,
        "FjordTopic columns released",
        in_cluster_operator,
        RECONCILE_TIMEOUT_S,
    )
    assert _fjord_partitions(admin, topic_name) is None
