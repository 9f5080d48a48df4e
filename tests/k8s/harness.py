"""Harness for the operator's end-to-end tests: an in-memory Kubernetes API (kmock), the kopf
operator running in-process against it, and a "kubelet" that turns the operator's broker
StatefulSet into real Fjord brokers of a :class:`fjord.local.LocalCluster`.

Nothing here fakes Fjord: the operator's admin calls reach real controllers and brokers on
loopback. What is emulated is only what cannot run on these machines: the Kubernetes API server
(kmock, extended below to stamp metadata the way a real API server does) and the kubelet /
StatefulSet controller (:class:`Kubelet`, which starts and stops broker processes and writes
the workload status that the real controllers would write).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import datetime
import functools
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.web
import jsonpatch
import kmock
import yaml
from kmock._internal import enums, k8s, rendering

from fjord.local.cluster import LocalCluster
from fjord.testing import waiting

REPO_ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = REPO_ROOT / "charts" / "fjord" / "crds"

# Every wait in these tests is bounded by one of these (the machine is shared and loaded).
HTTP_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.25
OPERATOR_START_TIMEOUT_S = 30.0
SERVER_START_TIMEOUT_S = 30.0
# Requests the emulator remembers (see ApiServerEmulator.__call__); more than are ever in flight.
REQUEST_HISTORY = 64
KUBELET_POLL_INTERVAL_S = 0.25

JSON = dict[str, Any]

# API path prefix of each resource the tests read or write, by plural.
_RESOURCE_PATHS = {
    "statefulsets": "/apis/apps/v1",
    "deployments": "/apis/apps/v1",
    "services": "/api/v1",
    "configmaps": "/api/v1",
    "pods": "/api/v1",
    "events": "/api/v1",
    "persistentvolumeclaims": "/api/v1",
    "poddisruptionbudgets": "/apis/policy/v1",
    "fjordclusters": "/apis/fjord.io/v1alpha1",
    "fjordtopics": "/apis/fjord.io/v1alpha1",
}


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiServerEmulator(kmock.KubernetesEmulator):
    """kmock's Kubernetes emulator plus the metadata a real API server maintains.

    Invariants: every stored object has ``metadata.uid`` (fixed at creation),
    ``metadata.creationTimestamp``, ``metadata.resourceVersion`` (a decimal string, strictly
    increasing over all writes of this server) and ``metadata.generation`` (1 at creation, +1
    on every write that touches ``spec`` outside the ``status`` subresource). Beyond kmock it
    serves ``PUT`` on a named object (replace; on ``/status`` only the status is replaced) and
    a server-side-apply ``PATCH`` of an absent object (creates it), because Kubernetes clients
    use both; a JSON patch whose ``test`` op fails (kopf's optimistic concurrency on
    ``resourceVersion``) is answered 422 as Kubernetes does, not 500; JSON answers carry the
    content type ``application/json`` without a charset. Patches stay kmock's: dicts merge
    recursively, lists are replaced. Only the last REQUEST_HISTORY requests are remembered.
    Built on kmock 0.8 internals (``kmock._internal``), hence the exact pin.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._resource_version = 0

    def _next_resource_version(self) -> str:
        self._resource_version += 1
        return str(self._resource_version)

    def _stamp_new(self, body: JSON, namespace: str | None) -> None:
        meta = body.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        meta["generation"] = 1
        meta["resourceVersion"] = self._next_resource_version()
        if namespace is not None:
            meta.setdefault("namespace", namespace)

    def _current(self, request: rendering.Request) -> kmock.Object | None:
        assert request.resource is not None and request.name is not None  # named requests only
        key = (request.resource, request.namespace, request.name)
        if key in self.objects and not self.objects[key].deleted:
            return self.objects[key]
        return None

    def _is_apply(self, request: rendering.Request) -> bool:
        content_type = request.headers.get("Content-Type", request.headers.get("content-type", ""))
        return "apply-patch" in content_type

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # kmock keeps every request for assertions and matches each new one by scanning that
        # history (quadratic over a test: GETs took 0.2 s after a few hundred requests); the
        # tests assert on objects, not requests, so only the in-flight window is kept.
        for log in (self._requests, *(payload._requests for payload in self._payloads)):
            del log[:-REQUEST_HISTORY]
        response = await super().__call__(raw_request)
        # Kubernetes answers "application/json" without a charset; lightkube only turns an
        # error answer into its ApiError when the content type is exactly that.
        if not response.prepared and response.content_type == "application/json":
            response.charset = None
        return response

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is None or request.name is None:
            if request.action == enums.action.CREATE and isinstance(request.data, dict):
                async with self._lock:
                    self._stamp_new(request.data, request.namespace)
            return await super()._handle(request)
        if request.method == enums.method.PUT:
            return await self._replace(request)
        if request.action == enums.action.UPDATE:
            async with self._lock:
                current = self._current(request)
                if current is None and self._is_apply(request) and isinstance(request.data, dict):
                    # Server-side apply of an absent object creates it.
                    body = copy.deepcopy(request.data)
                    self._stamp_new(body, request.namespace)
                    assert request.resource is not None
                    key = (request.resource, request.namespace, request.name)
                    self.objects[key] = body
                    raw = self.objects[key].raw
                    await self._buses[request.resource].put({"type": "ADDED", "object": raw})
                    return aiohttp.web.json_response(raw, status=201)
                if current is not None:
                    self._stamp_patch(request, current)
            try:
                return await super()._handle(request)
            except jsonpatch.JsonPatchTestFailed as exc:
                # Optimistic concurrency (kopf tests metadata.resourceVersion): 422 as in k8s.
                error = k8s.KubernetesError(status=422, reason="Invalid", message=str(exc))
                return await self._render_error(error)
        return await super()._handle(request)

    def _stamp_patch(self, request: rendering.Request, current: kmock.Object) -> None:
        version = self._next_resource_version()
        touches_spec = request.subresource is None and (
            (isinstance(request.data, dict) and "spec" in request.data)
            or (
                isinstance(request.data, list)
                and any(str(op.get("path", "")).startswith("/spec") for op in request.data)
            )
        )
        generation = int(current.get("metadata", {}).get("generation", 1))
        if touches_spec:
            generation += 1
        if isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if not isinstance(meta, dict):
                return
            meta["resourceVersion"] = version
            meta["generation"] = generation
        elif isinstance(request.data, list):
            request.data.extend(
                [
                    {"op": "add", "path": "/metadata/resourceVersion", "value": version},
                    {"op": "add", "path": "/metadata/generation", "value": generation},
                ]
            )

    async def _replace(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if not isinstance(request.data, dict):
            return await self._render_error(k8s.KubernetesError(status=400, reason="BadRequest"))
        async with self._lock:
            current = self._current(request)
            if current is None:
                return await self._render_error(kmock.KubernetesObjectNotFoundError())
            old = copy.deepcopy(current.raw)
            if request.subresource == "status":
                new = dict(old, status=request.data.get("status", {}))
            else:
                new = copy.deepcopy(request.data)
                new["status"] = old.get("status", {})
            meta = new.setdefault("metadata", {})
            for kept in ("uid", "creationTimestamp", "namespace", "name"):
                if kept in old.get("metadata", {}):
                    meta[kept] = old["metadata"][kept]
            generation = int(old.get("metadata", {}).get("generation", 1))
            if new.get("spec") != old.get("spec"):
                generation += 1
            meta["generation"] = generation
            meta["resourceVersion"] = self._next_resource_version()
            current.create(new)
            raw = current.raw
            assert request.resource is not None  # named requests only
            await self._buses[request.resource].put({"type": "MODIFIED", "object": raw})
            return aiohttp.web.json_response(raw)


def load_crds(crd_dir: Path = CRD_DIR) -> list[JSON]:
    """The CustomResourceDefinitions of the chart (the same files Helm installs)."""
    docs: list[JSON] = []
    for path in sorted(crd_dir.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def register_crds(server: kmock.KubernetesEmulator, crds: list[JSON]) -> None:
    """Make the CRDs discoverable (group/version lists, names, status subresource)."""
    for crd in crds:
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            server.resources[f"{spec['group']}/{version['name']}/{names['plural']}"] = (
                kmock.ResourceInfo(
                    kind=names["kind"],
                    singular=names.get("singular", names["kind"].lower()),
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    shortnames=names.get("shortNames", []),
                    categories=names.get("categories", []),
                    verbs=["create", "delete", "get", "list", "patch", "update", "watch"],
                    subresources=["status"] if "status" in version.get("subresources", {}) else [],
                )
            )


class ApiServer:
    """The emulated API server in a child process of its own (``python -m tests.k8s.harness``:
    its CPU stays out of the test process, which already runs kopf, the kubelet and Fjord
    clients), with a small synchronous client for the tests (the role ``kubectl`` plays).

    Invariants: :attr:`url` is valid between :meth:`start` and :meth:`stop`; every client call
    is bounded by HTTP_TIMEOUT_S and raises :class:`ApiError` on a non-2xx answer; the child
    serves the CRDs of ``crd_dir`` and dies with its stdin (so never outlives the tests).
    """

    def __init__(self, crd_dir: Path = CRD_DIR, log_path: Path | None = None) -> None:
        self.crd_dir = crd_dir
        self.log_path = log_path
        self.url = ""
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.k8s.harness", str(self.crd_dir)],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        assert self._process.stdout is not None
        ready = concurrent.futures.ThreadPoolExecutor(1)
        try:
            line = ready.submit(self._process.stdout.readline).result(
                timeout=SERVER_START_TIMEOUT_S
            )
        except concurrent.futures.TimeoutError:
            self.stop()
            raise
        finally:
            ready.shutdown(wait=False)
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"the kmock server did not start (printed {line!r})")
        self.url = line.strip()

    def stop(self) -> None:
        if self._process is None:
            return
        assert self._process.stdin is not None
        with contextlib.suppress(OSError):
            self._process.stdin.close()
        try:
            self._process.wait(HTTP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(HTTP_TIMEOUT_S)
        self._process = None

    # -- a kubectl-like client -----------------------------------------------------------------

    def path(self, plural: str, namespace: str | None, name: str | None = None) -> str:
        prefix = _RESOURCE_PATHS[plural]
        ns = f"/namespaces/{namespace}" if namespace else ""
        tail = f"/{name}" if name else ""
        return f"{prefix}{ns}/{plural}{tail}"

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> JSON:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as response:
                return dict(json.loads(response.read() or b"{}"))
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, exc.read().decode(errors="replace")) from None

    def create(self, plural: str, namespace: str, body: JSON) -> JSON:
        return self.request("POST", self.path(plural, namespace), body)

    def get(self, plural: str, namespace: str, name: str) -> JSON | None:
        try:
            return self.request("GET", self.path(plural, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, plural: str, namespace: str) -> list[JSON]:
        return list(self.request("GET", self.path(plural, namespace)).get("items", []))

    def patch(
        self, plural: str, namespace: str, name: str, body: JSON, subresource: str | None = None
    ) -> JSON:
        path = self.path(plural, namespace, name) + (f"/{subresource}" if subresource else "")
        return self.request("PATCH", path, body, "application/merge-patch+json")

    def delete(self, plural: str, namespace: str, name: str) -> JSON:
        return self.request("DELETE", self.path(plural, namespace, name))


class ApiError(RuntimeError):
    """A non-2xx answer of the emulated API server."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status


async def serve(crd_dir: Path) -> None:
    """Serve the emulator on a free loopback port, print its URL, stop when stdin closes."""
    async with ApiServerEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.resources.load_bundled()
        register_crds(emulator, load_crds(crd_dir))
        print(str(server.url).rstrip("/"), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


wait_for = functools.partial(
    waiting.wait_for, interval=POLL_INTERVAL_S, retry_on=(ApiError, OSError)
)
"""fjord.testing.waiting.wait_for polling at this harness's pace; an API or connection error
counts as "not yet"."""


def condition_of(obj: Mapping[str, Any] | None, kind: str) -> JSON | None:
    if not obj:
        return None
    for cond in obj.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


@dataclass
class KubeletEvent:
    """What the kubelet did and what it saw at that moment."""

    at: float
    action: str  # "start" | "stop"
    ordinal: int
    # For "stop": every partition's replicas (topic, partition) -> replicas, read from the
    # real cluster just before the pod was stopped.
    replicas_seen: dict[tuple[str, int], tuple[int, ...]] = field(default_factory=dict)


class Kubelet:
    """Plays the StatefulSet controller and the kubelet for one FjordCluster.

    Invariants: broker ``i`` runs iff the StatefulSet ``<cluster>-broker`` asks for more than
    ``i`` replicas (ordinals are broker ids, as in the real chart); a broker is stopped
    (SIGTERM, like a pod deletion) only after the StatefulSet was shrunk, highest ordinal
    first; before each stop it records every partition's replicas as the real cluster
    describes them, so tests can check the operator drained the broker first. The workload
    status written back (StatefulSet replicas/readyReplicas/..., Deployment readyReplicas) is
    what Kubernetes would report once the processes answer.
    """

    def __init__(
        self,
        api: ApiServer,
        cluster: LocalCluster,
        namespace: str,
        name: str,
        describe_replicas: Callable[[], dict[tuple[str, int], tuple[int, ...]]],
    ) -> None:
        self.api = api
        self.cluster = cluster
        self.namespace = namespace
        self.name = name
        self.describe_replicas = describe_replicas
        self.events: list[KubeletEvent] = []
        self._ready_pods: set[int] = set()
        self._starting: dict[int, threading.Thread] = {}
        # While set, no pod starts (like a node without capacity); tests use it to stop the
        # operator at a known step.
        self.hold_starts = threading.Event()
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet", daemon=True)

    def running(self) -> set[int]:
        """Ordinals whose broker process is alive."""
        while True:
            # A start thread may replace a process entry (port retry) while we look: look again.
            with contextlib.suppress(KeyError, RuntimeError):
                return {
                    i
                    for i in list(self.cluster.broker_addresses)
                    if self.cluster.process("broker", i).poll() is None
                }

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(HTTP_TIMEOUT_S * 3)
        for starting in self._starting.values():
            starting.join(HTTP_TIMEOUT_S * 3)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except BaseException as exc:  # surfaced by the tests through .errors
                self.errors.append(exc)
            self._stop.wait(KUBELET_POLL_INTERVAL_S)

    def sync_once(self) -> None:
        sts_name = f"{self.name}-broker"
        sts = self.api.get("statefulsets", self.namespace, sts_name)
        if sts is not None:
            self._sync_brokers(sts)
        for deployment in self.api.list("deployments", self.namespace):
            self._report_deployment(deployment)

    def _sync_brokers(self, sts: JSON) -> None:
        desired = int(sts.get("spec", {}).get("replicas", 1))
        running = self.running()
        for ordinal in sorted(running, reverse=True):
            if ordinal >= desired:
                self.events.append(
                    KubeletEvent(time.monotonic(), "stop", ordinal, self.describe_replicas())
                )
                try:
                    self.cluster.kill("broker", ordinal, signal.SIGTERM)
                except subprocess.TimeoutExpired:  # past the grace period, as Kubernetes does
                    self.cluster.kill("broker", ordinal, signal.SIGKILL)
        for ordinal in range(desired):
            starting = self._starting.get(ordinal)
            if self.hold_starts.is_set():
                break
            if ordinal not in running and not (starting and starting.is_alive()):
                # Pods start in parallel, each in a thread of its own (start_broker also
                # retries on a new port if another test took the one it picked).
                self.events.append(KubeletEvent(time.monotonic(), "start", ordinal))
                starting = threading.Thread(target=self._start_pod, args=(ordinal,), daemon=True)
                self._starting[ordinal] = starting
                starting.start()
        pods = [i for i in self.running() if i < desired]
        # Once ready, a pod stays ready while its process runs (probing costs a gRPC call).
        self._ready_pods = {i for i in pods if i in self._ready_pods or self._probe(i)}
        ready = len(self._ready_pods)
        status = {
            "observedGeneration": sts.get("metadata", {}).get("generation", 1),
            "replicas": len(pods),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "currentReplicas": ready,
            "updatedReplicas": ready,
        }
        if sts.get("status", {}) != {**sts.get("status", {}), **status}:
            self.api.patch(
                "statefulsets",
                self.namespace,
                sts["metadata"]["name"],
                {"status": status},
                subresource="status",
            )

    def _start_pod(self, ordinal: int) -> None:
        try:
            self.cluster.start_broker(ordinal, wait=True)
        except BaseException as exc:  # surfaced by the tests through .errors
            self.errors.append(exc)

    def _probe(self, ordinal: int) -> bool:
        """The readiness probe: the broker answers Metadata and lists itself (registered)."""
        response = self.cluster.broker_metadata(ordinal)
        return response is not None and any(b.id == ordinal for b in response.brokers)

    def _report_deployment(self, deployment: JSON) -> None:
        # Controllers and coordinators run in the LocalCluster already; report them ready.
        replicas = int(deployment.get("spec", {}).get("replicas", 1))
        status = {
            "observedGeneration": deployment.get("metadata", {}).get("generation", 1),
            "replicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
            "updatedReplicas": replicas,
        }
        if deployment.get("status", {}) != {**deployment.get("status", {}), **status}:
            self.api.patch(
                "deployments",
                self.namespace,
                deployment["metadata"]["name"],
                {"status": status},
                subresource="status",
            )


class OperatorRunner:
    """Runs ``kopf.operator`` with a given registry and settings in a thread with its own event
    loop (as ``fjord operator`` would run it in a pod), scoped to one namespace, standalone
    (no peering objects).

    Invariants: :meth:`start` returns once kopf reports ready (bounded); :meth:`stop` sets
    kopf's stop flag and joins the thread (bounded); :attr:`error` holds whatever ended kopf
    other than the stop flag.
    """

    def __init__(self, registry: Any, settings: Any, namespace: str) -> None:
        self.registry = registry
        self.settings = settings
        self.namespace = namespace
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="kopf", daemon=True)

    def _main(self) -> None:
        import kopf

        try:
            asyncio.run(
                kopf.operator(
                    registry=self.registry,
                    settings=self.settings,
                    standalone=True,
                    namespaces=[self.namespace],
                    ready_flag=self._ready,
                    stop_flag=self._stop,
                )
            )
        except BaseException as exc:  # raised by start(); checked by the caller after stop()
            self.error = exc

    def start(self) -> None:
        self._thread.start()
        wait_for(
            lambda: self._ready.is_set() or not self._thread.is_alive(),
            "kopf to be ready",
            OPERATOR_START_TIMEOUT_S,
        )
        if self.error is not None:
            raise RuntimeError("kopf failed to start") from self.error

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(OPERATOR_START_TIMEOUT_S)


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore", DeprecationWarning)  # kmock's bundled-resources loader
    asyncio.run(serve(Path(sys.argv[1])))
