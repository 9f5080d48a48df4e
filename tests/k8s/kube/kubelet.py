"""The kubelet (and scheduler) the real control plane of tests/k8s/kube/apiserver.py lacks, for
one FjordCluster's pods: the real StatefulSet and ReplicaSet controllers create and delete the
pods; this harness binds each new pod to a node, runs the Fjord process the pod stands for (the
broker whose id is the pod's ordinal, in a private :class:`~fjord.local.cluster.LocalCluster`, on
loopback), and writes the pod's status: Running, and Ready once the readiness probe passes.
A pod being deleted (``deletionTimestamp``) has its process stopped with SIGTERM, then the pod is
removed (grace period 0), as a kubelet confirms a finished pod.

Controllers and coordinators already run in the LocalCluster: their pods are bound and reported
Running and Ready without a process of their own. The pod's container command is not executed
(it names in-cluster DNS names and paths); the broker it would start is started instead.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
import urllib.error
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fjord.local.cluster import LocalCluster
from tests.k8s.harness import KubeletEvent
from tests.k8s.kube.apiserver import RealKube

POLL_INTERVAL_S = 0.25
NODE = "fjord-harness-node"
JOIN_TIMEOUT_S = 30.0


class RealKubelet:
    """Plays the scheduler and kubelet for the pods of FjordCluster ``name`` in ``namespace``.

    Invariants: broker ``i`` runs while pod ``<name>-broker-i`` exists and is not being
    deleted; it is stopped only once the StatefulSet controller deleted that pod, and just
    before each stop the harness records every partition's replicas as the real cluster
    describes them (:attr:`events`), so tests can check the operator drained the broker first.
    """

    def __init__(
        self,
        kube: RealKube,
        cluster: LocalCluster,
        namespace: str,
        name: str,
        describe_replicas: Callable[[], dict[tuple[str, int], tuple[int, ...]]],
    ) -> None:
        self.kube = kube
        self.cluster = cluster
        self.namespace = namespace
        self.name = name
        self.describe_replicas = describe_replicas
        self.events: list[KubeletEvent] = []
        self.errors: list[BaseException] = []
        self._ready: set[str] = set()  # pods reported Ready
        self._starting: dict[int, threading.Thread] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="real-kubelet", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(JOIN_TIMEOUT_S)
        for starting in self._starting.values():
            starting.join(JOIN_TIMEOUT_S)

    def running(self) -> set[int]:
        """Broker ids whose process is alive."""
        while True:
            with contextlib.suppress(KeyError, RuntimeError):
                return {
                    i
                    for i in list(self.cluster.broker_addresses)
                    if self.cluster.process("broker", i).poll() is None
                }

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except urllib.error.HTTPError as exc:
                if exc.code not in (404, 409):  # the pod went or changed meanwhile: next round
                    self.errors.append(exc)
            except BaseException as exc:  # surfaced by the tests through .errors
                self.errors.append(exc)
            self._stop.wait(POLL_INTERVAL_S)

    def _pods_path(self, name: str = "") -> str:
        base = f"/api/v1/namespaces/{self.namespace}/pods"
        return f"{base}/{name}" if name else base

    def sync_once(self) -> None:
        selector = f"app.kubernetes.io/instance={self.name}"
        pods = self.kube.request("GET", f"{self._pods_path()}?labelSelector={selector}")["items"]
        for pod in pods:
            self._sync_pod(pod)

    def _sync_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        name = meta["name"]
        component = meta["labels"].get("app.kubernetes.io/component")
        ordinal = int(name.rsplit("-", 1)[1]) if component == "broker" else None
        if meta.get("deletionTimestamp"):
            if ordinal is not None and ordinal in self.running():
                self.events.append(
                    KubeletEvent(time.monotonic(), "stop", ordinal, self.describe_replicas())
                )
                try:
                    self.cluster.kill("broker", ordinal, signal.SIGTERM)
                except subprocess.TimeoutExpired:  # past the grace period, as a kubelet does
                    self.cluster.kill("broker", ordinal, signal.SIGKILL)
            self.kube.request(
                "DELETE",
                self._pods_path(name),
                {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
                "application/json",
            )
            self._ready.discard(name)
            return
        if not pod["spec"].get("nodeName"):
            self.kube.request(
                "POST",
                f"{self._pods_path(name)}/binding",
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": name},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
                },
                "application/json",
            )
        running = True
        if ordinal is not None and ordinal not in self.running():
            running = False
            starting = self._starting.get(ordinal)
            if not (starting and starting.is_alive()):
                self.events.append(KubeletEvent(time.monotonic(), "start", ordinal))
                starting = threading.Thread(target=self._start_broker, args=(ordinal,))
                starting.daemon = True
                self._starting[ordinal] = starting
                starting.start()
        ready = running and (name in self._ready or ordinal is None or self._probe(ordinal))
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Running" and (name in self._ready) == ready:
            return
        self.kube.request("PATCH", f"{self._pods_path(name)}/status", _pod_status(pod, ready))
        if ready:
            self._ready.add(name)
        else:
            self._ready.discard(name)

    def _start_broker(self, ordinal: int) -> None:
        try:
            self.cluster.start_broker(ordinal, wait=True)
        except BaseException as exc:  # surfaced by the tests through .errors
            self.errors.append(exc)

    def _probe(self, ordinal: int) -> bool:
        """The readiness probe: the broker answers Metadata and lists itself (registered)."""
        response = self.cluster.broker_metadata(ordinal)
        return response is not None and any(b.id == ordinal for b in response.brokers)


def _pod_status(pod: dict[str, Any], ready: bool) -> dict[str, Any]:
    """The status a kubelet reports for a running pod (merge patch of ``status``)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    flag = "True" if ready else "False"
    containers = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": ready,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": now}},
        }
        for c in pod["spec"]["containers"]
    ]
    return {
        "status": {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "startTime": (pod.get("status") or {}).get("startTime") or now,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": flag, "lastTransitionTime": now},
                {"type": "Ready", "status": flag, "lastTransitionTime": now},
            ],
            "containerStatuses": containers,
        }
    }
