"""What the secure real-API operator tests share: a secure local cluster of 3 brokers playing
the FjordCluster's pods, the kubelet harness with the pods' TLS Secret volumes (started in a
namespace whose cluster CA Secret holds the local cluster's CA), the operator process, and
reads of the FjordCluster's pods, status and Secrets through kubectl."""

from __future__ import annotations

import base64
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from fjord.local.cluster import LocalCluster
from fjord.local.etcd import log_tail
from fjord.testing.waiting import WaitTimeout, wait_for
from fjord.tls import write_private
from fjord_operator import settings as s
from tests.k8s.kube.apiserver import RealKube
from tests.k8s.kube.kubelet import RealKubelet
from tests.k8s.kube.operator_process import running_operator

BROKERS = 3


@contextmanager
def secure_local_cluster(
    directory: Path, namespace: str, name: str, **options: Any
) -> Iterator[LocalCluster]:
    """A started secure (mutual TLS) local cluster of :data:`BROKERS` brokers whose processes
    play the pods of FjordCluster ``namespace/name``; ``options`` go to LocalCluster (e.g.
    ``controllers``, ``etcd_tls``). Stopped on exit."""
    cluster = LocalCluster(directory, brokers=BROKERS, coordinators=0,
                           cluster_id=f"{namespace}.{name}", unsafe_etcd_no_fsync=True,
                           secure=True, **options)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def broker_bootstrap(local: LocalCluster) -> str:
    """Every broker's address, for the FjordCluster's bootstrap annotation and the clients."""
    return ",".join(local.broker_addresses[i] for i in range(BROKERS))


@contextmanager
def kubelet_on_the_local_ca(
    kube: RealKube, local: LocalCluster, namespace: str, name: str,
    replicas: Callable[[], dict[tuple[str, int], tuple[int, ...]]],
) -> Iterator[SecretMountingKubelet]:
    """Creates ``namespace`` with the FjordCluster's CA Secret ``<name>-cluster-ca`` holding the
    local cluster's CA (the operator takes it over and issues from it, so what the brokers
    serve chains to what the clients trust), and runs a :class:`SecretMountingKubelet` on
    ``local`` (``replicas``: the cluster's replica assignment, for the safe roller's view).
    On exit it is stopped, and an error of its loop fails the test."""
    tls = local.data_dir / "tls"
    kube.kubectl("create", "namespace", namespace)
    kube.kubectl("apply", "-f", "-", stdin=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": f"{name}-cluster-ca", "namespace": namespace},
        "data": {s.CA_CERT_KEY: base64.b64encode((tls / "ca.pem").read_bytes()).decode(),
                 s.CA_KEY_KEY: base64.b64encode((tls / "ca.key").read_bytes()).decode()},
    }))
    node = SecretMountingKubelet(kube, local, namespace, name, replicas)
    node.start()
    try:
        yield node
    finally:
        node.stop()
    assert not node.errors, f"the kubelet harness failed: {node.errors!r}"


@contextmanager
def admin_operator(kube: RealKube, namespace: str, workdir: Path) -> Iterator[Path]:
    """``fjord operator`` watching ``namespace`` with the API server's admin kubeconfig;
    yields its log file."""
    with running_operator(kube, namespace, workdir, kubeconfig=kube.admin_kubeconfig) as log:
        yield log


class SecretMountingKubelet(RealKubelet):
    """The harness kubelet, plus the pods' TLS Secret volumes: a broker starts on its pod's
    ``<cluster>-broker-tls`` Secret (``service.pem`` and ``ca.crt`` written to a directory of
    their own, :attr:`LocalCluster.mounted_tls`), and a controller pod of a new TLS revision (a
    Deployment roll) restarts the local controller 0 on the controller Secret the same way
    (the first controller pod is taken as what the local controller already runs)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mounts = 0
        self.controller_revision: str | None = None
        self.controller_restarts = 0

    def _mount(self, role: str, node: int) -> None:
        secret = self.kube.get_json("secret", f"{self.name}-{role}-tls", "-n", self.namespace)
        self.mounts += 1
        directory = self.cluster.data_dir / "mounts" / f"{role}-{node}-{self.mounts}"
        directory.mkdir(parents=True)
        for key in (s.SERVICE_KEYSTORE_KEY, s.CA_CERT_KEY):
            write_private(directory / key, base64.b64decode(secret["data"][key]))
        self.cluster.mounted_tls[(role, node)] = directory

    def _start_broker(self, ordinal: int) -> None:
        try:
            self._mount("broker", ordinal)
        except BaseException as exc:  # surfaced by the tests through .errors
            self.errors.append(exc)
            return
        super()._start_broker(ordinal)

    def _sync_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        revision = (meta.get("annotations") or {}).get(s.TLS_REVISION_ANNOTATION)
        if (meta["labels"].get("app.kubernetes.io/component") == "controller"
                and not meta.get("deletionTimestamp") and meta["name"] not in self._ready):
            if self.controller_revision is None:
                self.controller_revision = revision
            elif revision != self.controller_revision:
                self._mount("controller", 0)
                self.cluster.kill("controller", 0, signal.SIGTERM)
                self.cluster.start_controller(0, wait=True)
                self.controller_revision = revision
                self.controller_restarts += 1
        super()._sync_pod(pod)


def wait_logged(condition: Any, what: str, log: Path, timeout: float,
                interval: float = 0.5) -> Any:
    """wait_for, the operator log's tail in the timeout's message."""
    try:
        return wait_for(condition, what, timeout, interval=interval)
    except WaitTimeout as exc:
        raise WaitTimeout(f"{exc}\noperator log:\n{log_tail(log, lines=40)}") from None


def broker_pods(kube: RealKube, namespace: str) -> dict[int, dict[str, Any]]:
    pods = kube.get_json("pods", "-n", namespace, "-l", "app.kubernetes.io/component=broker")
    return {int(p["metadata"]["name"].rsplit("-", 1)[1]): p for p in pods["items"]}


def ready_brokers(kube: RealKube, namespace: str) -> set[int]:
    """Broker ordinals whose pod is Ready and not being deleted."""
    return {
        i for i, p in broker_pods(kube, namespace).items()
        if not p["metadata"].get("deletionTimestamp")
        and any(c["type"] == "Ready" and c["status"] == "True"
                for c in (p.get("status") or {}).get("conditions") or [])
    }


def ready_cluster(kube: RealKube, namespace: str, name: str) -> dict[str, Any] | None:
    """The FjordCluster when its status is Ready for its current generation, else None."""
    obj = kube.get_json("fjordcluster", name, "-n", namespace) or {}
    status = obj.get("status") or {}
    ready = any(c["type"] == "Ready" and c["status"] == "True"
                for c in status.get("conditions") or [])
    current = status.get("observedGeneration") == (obj.get("metadata") or {}).get("generation")
    return obj if ready and current else None


def secret_data(kube: RealKube, namespace: str, name: str) -> dict[str, bytes]:
    """A Secret's data, decoded (empty when it does not exist)."""
    secret = kube.get_json("secret", name, "-n", namespace)
    return {k: base64.b64decode(v) for k, v in (secret or {}).get("data", {}).items()}
