"""Spark-on-Kubernetes against the REAL API server (the session's ``real_kube``):
``spark/k8s/submit.sh orders-shipments`` in cluster mode, as a user runs it.

spark-submit (pyspark's, with the admin's kubeconfig) creates the driver pod from the project's
pod template, with the chart's ``fjord-spark`` service account, its ConfigMap and Service; the
harness of tests/k8s/kube/kubelet.py (:class:`SparkKubelet`) binds the pod and runs it as
Spark's image entrypoint would; the driver, logged in with the pod's own service-account token
(so with exactly the chart's Spark Role), asks the API server for two executor pods, which the
harness runs too; the job reads orders from and writes shipments and dead letters to a Fjord
cluster on loopback (the session's), ends (``--available-now``), deletes its executors, and the
harness reports the driver pod ``Succeeded``, which spark-submit waits for. The job's FjordUser
Secret (``fjord-orders-shipments``, created here with a client.properties for the session's
plaintext cluster: the paths inside a TLS user's file point at /etc/fjord-user, which only a
container's mount provides, and this harness runs no containers) is mounted by submit.sh in the
driver and in every executor, and the job reads ``--command-config`` from that mount.

Also: the chart's Spark RBAC with ``kubectl auth can-i --as`` the service account: everything
Spark's driver does, nothing else (no secrets, no exec, no other namespace, no RBAC).

Rendered with ``helm template`` and applied with kubectl: the chart's ``kubeVersion`` (>= 1.27)
refuses a ``helm install`` into 1.20 (tests/k8s/test_operator_real_api.py shows it).

Not collected by `make test` (the file name has no ``test_`` prefix, as tests/images/image_boot.py):
the submission alone takes about 100 s on a shared 2-core machine (spark-submit, the driver and
two executors are four JVMs), over the suite's budget. Run it with `make spark-k8s-test`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fjord.client import AdminClient, NewTopic
from fjord.local.etcd import log_tail
from fjord.testing.waiting import WaitTimeout, wait_for
from tests.helpers.spark import order, read_all, send_orders
from tests.k8s.helm import render_in
from tests.k8s.kube.apiserver import ROOT, RealKube
from tests.k8s.kube.apply_shim import ApplyProtocolShim
from tests.k8s.kube.kubelet import SPARK_HOME, SparkKubelet

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

NAMESPACE = "fjord"  # submit.sh's and the claim's default namespace
SERVICE_ACCOUNT = "fjord-spark"  # the chart's default, the pod templates' and submit.sh's
SPARK_K8S = ROOT / "spark" / "k8s"
CLAIM = "fjord-spark-data"
#: Bound of the whole submission (spark-submit until the driver pod ended): four JVMs start on
#: a shared 2-core machine.
SUBMIT_TIMEOUT_S = 480.0


def _apply(kube: RealKube, *objects: dict[str, Any]) -> None:
    kube.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))


@pytest.fixture(scope="module")
def spark_rbac(real_kube: RealKube) -> list[dict[str, Any]]:
    """The chart's Spark ServiceAccount, Role and RoleBinding (spark.serviceAccount.create)."""
    _apply(real_kube, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    docs = [
        doc
        for doc in render_in(NAMESPACE, None, "--set", "spark.serviceAccount.create=true")
        if doc["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "spark"
    ]
    assert sorted(d["kind"] for d in docs) == ["Role", "RoleBinding", "ServiceAccount"]
    _apply(real_kube, *docs)
    return docs


# -- the chart's Spark RBAC ----------------------------------------------------------------------

#: (verb, resource, namespace) Spark's driver needs (its executor pods, their Services and
#: ConfigMaps, and the claims Spark 4 may create or reuse for them).
SPARK_NEEDS = [
    (verb, resource, NAMESPACE)
    for resource in ("pods", "services", "configmaps", "persistentvolumeclaims")
    for verb in ("create", "get", "list", "watch", "delete", "deletecollection")
] + [("patch", "pods", NAMESPACE)]
SPARK_MUST_NOT = [
    ("get", "secrets", NAMESPACE),
    ("list", "secrets", NAMESPACE),
    ("create", "pods/exec", NAMESPACE),
    ("create", "pods", "default"),  # only its own namespace
    ("list", "pods", "kube-system"),
    ("update", "services", NAMESPACE),
    ("patch", "configmaps", NAMESPACE),
    ("create", "deployments.apps", NAMESPACE),
    ("create", "roles.rbac.authorization.k8s.io", NAMESPACE),
    ("create", "rolebindings.rbac.authorization.k8s.io", NAMESPACE),
    ("create", "serviceaccounts/token", NAMESPACE),
    ("create", "persistentvolumes", ""),
    ("list", "nodes", ""),
    ("get", "fjordclusters.fjord.io", NAMESPACE),
]


def test_the_charts_spark_rbac_gives_the_driver_what_it_needs_and_no_more(
    real_kube: RealKube, spark_rbac: list[dict[str, Any]]
) -> None:
    user = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
    answers = {
        (verb, resource, ns): real_kube.can_i(user, verb, resource, ns)
        for verb, resource, ns in SPARK_NEEDS + SPARK_MUST_NOT
    }
    assert {k: a for k, a in answers.items() if k in SPARK_NEEDS and a != "yes"} == {}
    assert {k: a for k, a in answers.items() if k in SPARK_MUST_NOT and a != "no"} == {}


# -- the submission --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spark_kubelet(
    real_kube: RealKube,
    spark_rbac: list[dict[str, Any]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SparkKubelet]:
    """The harness for Spark's pods, with the shared claim of spark/k8s/checkpoints-pvc.yaml
    (applied as is; no volume provisioner here, so it stays Pending and the harness backs it
    with one host directory every pod shares, as ReadWriteMany)."""
    real_kube.kubectl("apply", "-f", str(SPARK_K8S / "checkpoints-pvc.yaml"))
    base = tmp_path_factory.mktemp("spark-k8s")
    (base / "claim").mkdir()
    kubelet = SparkKubelet(real_kube, NAMESPACE, base / "pods", {CLAIM: base / "claim"})
    kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.stop()


@pytest.fixture(scope="module")
def apply_shim(real_kube: RealKube) -> Iterator[ApplyProtocolShim]:
    shim = ApplyProtocolShim(real_kube)
    shim.start()
    try:
        yield shim
    finally:
        shim.stop()


def _diagnose(kubelet: SparkKubelet, submit_log: str) -> str:
    # From the first exception on (a Java stack trace's head says what failed), bounded.
    first = min(
        (i for i in (submit_log.find("Exception"), submit_log.find("ERROR")) if i >= 0),
        default=max(0, len(submit_log) - 3000),
    )
    head = submit_log[max(0, first - 500) : first + 2500]
    parts = [f"spark-submit:\n{head}", f"harness errors: {kubelet.errors!r}"]
    for run in kubelet.pods.values():
        parts.append(f"--- {run.role} pod {run.pod} ({run.command[:3]}...):\n")
        parts.append(log_tail(run.log, lines=40))
    return "\n".join(parts)


def test_submit_sh_runs_orders_to_shipments_in_cluster_mode(
    real_kube: RealKube,
    spark_kubelet: SparkKubelet,
    apply_shim: ApplyProtocolShim,
    bootstrap: str,
    tmp_path: Path,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    orders, shipments, dead = (f"k8s-{n}-{suffix}" for n in ("orders", "shipments", "dlq"))
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics(
            [NewTopic(orders, 2, 1), NewTopic(shipments, 2, 1), NewTopic(dead, 1, 1)]
        )
    sent = [
        order("o-1", "SKU-BOOK", 2),
        order("o-2", "SKU-PHONE"),
        order("o-3", "SKU-CHAIR", 4),
        order("o-4", "SKU-NOT-STOCKED"),
        ("o-5", "{broken json"),
    ]
    send_orders(bootstrap, orders, sent)
    # The job's FjordUser Secret as the operator names it (its content fits this plaintext
    # cluster; tests/spark/test_spark_secure.py runs the job with a TLS user's real one).
    user_secret = "fjord-orders-shipments"
    user_properties = "security.protocol=PLAINTEXT\nclient.id=orders-k8s\n"
    real_kube.kubectl("delete", "secret", user_secret, "-n", NAMESPACE, "--ignore-not-found")
    real_kube.kubectl(
        "create", "secret", "generic", user_secret, "-n", NAMESPACE,
        f"--from-literal=client.properties={user_properties}",
    )

    env = {
        **os.environ,
        "KUBECONFIG": str(real_kube.admin_kubeconfig),  # the user's login, for spark-submit
        # spark-submit's server-side apply of the driver's Service needs the 1.21 fix the
        # shim stands in for (tests/k8s/kube/apply_shim.py); the driver talks to the server.
        "K8S_API_SERVER": apply_shim.url,
        "SPARK_SUBMIT": str(SPARK_HOME / "bin" / "spark-submit"),
        "BOOTSTRAP_SERVERS": bootstrap,
        "HOME": str(tmp_path),
    }
    started = time.monotonic()
    log = tmp_path / "spark-submit.log"
    with log.open("wb") as out:
        submit = subprocess.Popen(
            [
                str(SPARK_K8S / "submit.sh"),
                "orders-shipments",
                "--available-now",
                "--orders-topic",
                orders,
                "--shipments-topic",
                shipments,
                "--dead-letter-topic",
                dead,
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        # spark-submit waits for the driver pod to end; a harness error ends the wait early.
        wait_for(
            lambda: submit.poll() is not None or bool(spark_kubelet.errors),
            "spark-submit to see its driver pod end",
            SUBMIT_TIMEOUT_S,
            interval=0.5,
        )
    except WaitTimeout:
        pass  # reported below with the logs
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.wait(30)
    output = log.read_text(errors="replace")
    elapsed = time.monotonic() - started
    assert submit.returncode == 0, _diagnose(spark_kubelet, output)
    assert spark_kubelet.errors == [], _diagnose(spark_kubelet, output)
    print(f"submit.sh in cluster mode took {elapsed:.1f} s")
    assert apply_shim.rewritten >= 1  # the driver's Service: the 1.20 bug was met and bridged

    drivers = real_kube.get_json("pods", "-n", NAMESPACE, "-l", "spark-role=driver")["items"]
    (driver,) = [p for p in drivers if p["metadata"]["name"].startswith("fjord-orders-shipments")]
    assert driver["status"]["phase"] == "Succeeded", _diagnose(spark_kubelet, output)
    # The project's pod template and service account made it into the pod spark-submit created.
    assert driver["spec"]["serviceAccountName"] == SERVICE_ACCOUNT
    assert driver["metadata"]["labels"]["app.kubernetes.io/component"] == "spark-driver"
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in driver["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == [CLAIM]

    def mounts_user_secret(pod: dict[str, Any]) -> bool:
        secrets = {v["name"] for v in pod["spec"]["volumes"]
                   if v.get("secret", {}).get("secretName") == user_secret}
        return any(m["name"] in secrets and m["mountPath"] == "/etc/fjord-user"
                   for c in pod["spec"]["containers"] for m in c.get("volumeMounts", []))

    assert mounts_user_secret(driver)
    # The driver asked for two executors; the harness ran them and they registered.
    executors = [r for r in spark_kubelet.pods.values() if r.role == "executor"]
    assert len(executors) >= 2, _diagnose(spark_kubelet, output)
    # Each executor had the user Secret mounted (the harness wrote the volume the pod named,
    # read from the API server, under the pod's directory; the pods are deleted by now).
    for run in executors:
        mounted = list((spark_kubelet.workdir / run.pod / "volumes").glob("*/client.properties"))
        assert [f.read_text() for f in mounted] == [user_properties], run.pod
    # Its checkpoint is on the shared claim.
    assert (spark_kubelet.claims[CLAIM] / "checkpoints" / "orders-shipments").is_dir()

    shipped = {
        (r.key or b"").decode(): json.loads(r.value or b"") for r in read_all(bootstrap, shipments)
    }
    assert sorted(shipped) == ["o-1", "o-2", "o-3"]
    assert {k: s["warehouse"] for k, s in shipped.items()} == {
        "o-1": "WH-NORTH",
        "o-2": "WH-SOUTH",
        "o-3": "WH-WEST",
    }
    assert sorted((r.key or b"").decode() for r in read_all(bootstrap, dead)) == ["o-4", "o-5"]
