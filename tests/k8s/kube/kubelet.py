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

:class:`SparkKubelet` does the same for the pods Spark creates (spark-submit's driver pod, the
driver's executor pods): those it does run as Spark's image entrypoint would, from this machine's
pyspark, with their volumes, environment and service-account token (see the class).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyspark

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
            confirm_deleted(self.kube, self.namespace, meta)
            self._ready.discard(name)
            return
        if not pod["spec"].get("nodeName"):
            bind_pod(self.kube, self.namespace, name)
        running = True
        if ordinal is not None and ordinal not in self.running():
            running = False
            starting = self._starting.get(ordinal)
            rack = _rack_to_start_with(pod)
            if rack is _WAIT_FOR_RACK:
                pass  # the broker's start script waits for its fjord.io/rack annotation
            elif not (starting and starting.is_alive()):
                # As the container's script does: --rack from the annotation (or none).
                if isinstance(rack, str):
                    self.cluster.racks[ordinal] = rack
                else:
                    self.cluster.racks.pop(ordinal, None)
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


_WAIT_FOR_RACK = object()


def _rack_to_start_with(pod: dict[str, Any]) -> object:
    """What a broker pod's start script does about its rack: a pod with the downward API
    volume of rack awareness starts with ``--rack`` = its ``fjord.io/rack`` annotation and
    waits while that is missing (:data:`_WAIT_FOR_RACK`); other pods start without (None)."""
    volumes = (pod.get("spec") or {}).get("volumes") or []
    if not any(v.get("name") == "pod-info" and v.get("downwardAPI") for v in volumes):
        return None
    rack = (pod["metadata"].get("annotations") or {}).get("fjord.io/rack")
    return rack if rack else _WAIT_FOR_RACK


def bind_pod(kube: RealKube, namespace: str, name: str) -> None:
    """Bind pod ``name`` to the harness's node, as the scheduler would."""
    kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
        },
        "application/json",
    )


def confirm_deleted(kube: RealKube, namespace: str, meta: dict[str, Any]) -> None:
    """Remove a pod being deleted whose process is gone (grace period 0, this very pod only),
    as a kubelet confirms the deletion once its containers stopped."""
    kube.request(
        "DELETE",
        f"/api/v1/namespaces/{namespace}/pods/{meta['name']}",
        {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
        "application/json",
    )


def _pod_status(pod: dict[str, Any], ready: bool, exit_code: int | None = None) -> dict[str, Any]:
    """The status a kubelet reports for a pod (merge patch of ``status``): running, or, with
    ``exit_code``, finished (``Succeeded`` for 0, else ``Failed``; restartPolicy Never)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    flag = "True" if ready and exit_code is None else "False"
    if exit_code is None:
        phase, state = "Running", {"running": {"startedAt": now}}
    else:
        phase = "Succeeded" if exit_code == 0 else "Failed"
        reason = "Completed" if exit_code == 0 else "Error"
        state = {"terminated": {"exitCode": exit_code, "reason": reason, "finishedAt": now}}
    containers = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": flag == "True",
            "started": exit_code is None,
            "restartCount": 0,
            "state": state,
        }
        for c in pod["spec"]["containers"]
    ]
    return {
        "status": {
            "phase": phase,
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


# -- Spark's driver and executor pods -----------------------------------------------------------

#: The label Spark puts on the pods it creates (``driver`` or ``executor``).
SPARK_ROLE_LABEL = "spark-role"
#: Where spark/Dockerfile puts what the pods run, and where that is on this machine: Spark
#: (pyspark's install, the image's SPARK_HOME) and the jobs' files.
SPARK_HOME = Path(pyspark.__file__).parent
#: The line Spark's driver logs once its RPC server listens (Utils.startServiceOnPort).
DRIVER_LISTENING = re.compile(r"Successfully started service 'sparkDriver' on port (\d+)")
IMAGE_PATHS = {
    "/opt/spark": SPARK_HOME,
    "/opt/fjord/spark": Path(__file__).resolve().parents[3] / "spark",
}
#: Where Kubernetes mounts a pod's service-account token, CA and namespace.
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
#: How long a stopped pod's processes get after SIGTERM before SIGKILL.
SPARK_STOP_GRACE_S = 15.0
#: Pod fields a ``fieldRef`` may name, as the harness answers them.
FIELD_REFS = {"status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1", "spec.nodeName": NODE}


class UnsupportedPod(RuntimeError):
    """A Spark pod the harness cannot run as the image would (names what is missing)."""


@dataclass
class SparkPodProcess:
    """One pod's process as the harness started it."""

    pod: str
    role: str
    command: list[str]
    process: subprocess.Popen[bytes]
    log: Path
    reported: str = "pending"  # the phase last written to the pod's status


class SparkKubelet:
    """Plays the scheduler and kubelet for the pods Spark creates in ``namespace`` (label
    ``spark-role``): the driver pod spark-submit creates in cluster mode and the executor pods
    the driver then asks for. Each pod is bound, and its container run as Spark's image
    entrypoint (``/opt/entrypoint.sh``) would run it, from this machine's pyspark:

    - ``driver ARGS``: ``spark-submit --conf spark.driver.bindAddress=<pod IP> --deploy-mode
      client ARGS`` (ARGS name ``--properties-file /opt/spark/conf/spark.properties``, the
      ConfigMap Spark mounts, and the application);
    - ``executor``: ``java -Xms/-Xmx$SPARK_EXECUTOR_MEMORY $SPARK_JAVA_OPT_* -cp
      $SPARK_HOME/jars/* org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend
      --driver-url $SPARK_DRIVER_URL --executor-id ... --podName ...`` from the pod's env.

    Volumes are what the pod names: ConfigMaps and Secrets (the service account's token, which
    the 1.20 admission adds) are read from the API server into files, claims map to the host
    directories in ``claims`` (the claim must exist), emptyDirs are fresh directories; every
    path a command, its env or the properties file names under a mount point or an image
    path is translated to where that lives here (no container, so no bind mounts).

    What the harness has to stand in for, passed to the driver as ``--conf`` (they win over
    the properties file): cluster DNS and the driver's Service (``spark.driver.host`` becomes
    127.0.0.1; the driver and its block manager bind port 0, so the kernel picks free loopback
    ports and no other process can take them between picking and binding; Spark hands the
    executors the driver's bound port, and an executor ``SPARK_DRIVER_URL`` naming the
    Service's driver port goes to the port the driver logged), ``kubernetes.default.svc``
    (``spark.kubernetes.driver.master``), and the service-account mount's fixed path
    (``spark.kubernetes.authenticate.driver.mounted.*File``, still the pod's own token).

    Invariants: a pod's process runs while its pod exists and is not being deleted; a process
    that ends makes its pod ``Succeeded`` (exit 0) or ``Failed``; a pod being deleted has its
    process group stopped (SIGTERM, SIGKILL after SPARK_STOP_GRACE_S) before the harness
    confirms the deletion; :meth:`stop` ends every process it started.
    """

    def __init__(
        self, kube: RealKube, namespace: str, workdir: Path, claims: dict[str, Path]
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.workdir = workdir
        self.claims = claims
        self.pods: dict[str, SparkPodProcess] = {}  # by pod uid
        self.errors: list[BaseException] = []
        #: "<service>.<namespace>.svc" -> (its driver port, the driver's log naming the loopback
        #: port behind it)
        self.services: dict[str, tuple[int, Path]] = {}
        self._unrunnable: set[str] = set()  # pods whose start failed (in .errors), by uid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spark-kubelet", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(JOIN_TIMEOUT_S)
        for run in self.pods.values():
            _stop_process_group(run.process)

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

    #: The pods this harness runs (a label selector).
    selector = SPARK_ROLE_LABEL

    def sync_once(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={self.selector}"
        for pod in self.kube.request("GET", path)["items"]:
            uid = pod["metadata"]["uid"]
            if uid in self._unrunnable and not pod["metadata"].get("deletionTimestamp"):
                continue
            try:
                self._sync_pod(pod)
            except (UnsupportedPod, KeyError) as exc:  # this pod only; the others go on
                self._unrunnable.add(uid)
                self.errors.append(exc)

    def _sync_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        run = self.pods.get(meta["uid"])
        if meta.get("deletionTimestamp"):
            if run is not None:
                _stop_process_group(run.process)
            confirm_deleted(self.kube, self.namespace, meta)
            return
        if not pod["spec"].get("nodeName"):
            bind_pod(self.kube, self.namespace, meta["name"])
        if run is None:
            run = self.pods[meta["uid"]] = self._start(pod)
        exit_code = run.process.poll()
        phase = "Running" if exit_code is None else ("Succeeded" if exit_code == 0 else "Failed")
        if run.reported != phase:
            path = f"/api/v1/namespaces/{self.namespace}/pods/{meta['name']}/status"
            self.kube.request("PATCH", path, _pod_status(pod, True, exit_code))
            run.reported = phase

    # -- running a pod as the image would

    def _start(self, pod: dict[str, Any]) -> SparkPodProcess:
        meta, spec = pod["metadata"], pod["spec"]
        (container,) = spec["containers"]  # Spark's pods have one container (no sidecars here)
        root = self.workdir / meta["name"]
        root.mkdir(parents=True, exist_ok=True)
        paths = {**IMAGE_PATHS, **self._mounts(pod, container, root)}
        env = self._env(pod, container, paths, root)
        args = [_translate(a, paths) for a in container.get("args") or []]
        role = args[0] if args else ""
        command = self._command(meta["name"], args, env, paths, root)
        log = root / "container.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                env=env,
                cwd=root,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group, stopped as one
            )
        return SparkPodProcess(meta["name"], role, command, process, log)

    def _mounts(
        self, pod: dict[str, Any], container: dict[str, Any], root: Path
    ) -> dict[str, Path]:
        """mountPath -> the host directory holding that volume's content."""
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        mounts: dict[str, Path] = {}
        for mount in container.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            target = root / "volumes" / mount["name"]
            if "configMap" in volume:
                name = volume["configMap"]["name"]
                data = self._get(f"configmaps/{name}")["data"]
                self._write_files(target, data, volume["configMap"].get("items"))
            elif "secret" in volume:
                name = volume["secret"]["secretName"]
                data = {
                    k: base64.b64decode(v) for k, v in self._get(f"secrets/{name}")["data"].items()
                }
                self._write_files(target, data, volume["secret"].get("items"))
            elif "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                self._get(f"persistentvolumeclaims/{claim}")  # a kubelet waits for the claim
                if claim not in self.claims:
                    raise UnsupportedPod(f"claim {claim} has no host directory in this harness")
                target = self.claims[claim]
            elif "emptyDir" in volume:
                target.mkdir(parents=True, exist_ok=True)
            else:
                raise UnsupportedPod(f"volume {mount['name']}: {sorted(volume)} not supported")
            mounts[mount["mountPath"].rstrip("/")] = target
        return mounts

    def _get(self, path: str) -> Any:
        return self.kube.request("GET", f"/api/v1/namespaces/{self.namespace}/{path}")

    @staticmethod
    def _write_files(
        target: Path, data: dict[str, Any], items: list[dict[str, str]] | None
    ) -> None:
        target.mkdir(parents=True, exist_ok=True)
        chosen = {i["key"]: i["path"] for i in items} if items else {k: k for k in data}
        for key, relative in chosen.items():
            value = data[key]
            file = target / relative
            file.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(value, bytes):
                file.write_bytes(value)
            else:
                file.write_text(value)

    def _env(
        self, pod: dict[str, Any], container: dict[str, Any], paths: dict[str, Path], root: Path
    ) -> dict[str, str]:
        """The container's environment: the image's (SPARK_HOME, PYSPARK_PYTHON, JAVA_HOME,
        the Python path the image installs into), what a kubelet adds (the API server's
        service), then the pod's own variables, paths translated."""
        # Nothing of the test process's own logins or Spark settings leaks into a pod.
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("KUBE", "FJORD_OPERATOR_", "SPARK_CONF_DIR"))
        }
        env.update(
            HOME=str(root),
            SPARK_HOME=str(SPARK_HOME),
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            **self.kube.in_cluster_env(),
        )
        fields = {
            **FIELD_REFS,
            "metadata.name": pod["metadata"]["name"],
            "metadata.namespace": self.namespace,
            "metadata.uid": pod["metadata"]["uid"],
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        }
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = _translate(var["value"], paths)
            elif "fieldRef" in (var.get("valueFrom") or {}):
                env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
            else:
                raise UnsupportedPod(f"env {var['name']}: {var.get('valueFrom')} not supported")
        return env

    def _command(
        self, pod: str, args: list[str], env: dict[str, str], paths: dict[str, Path], root: Path
    ) -> list[str]:
        """The command Spark's entrypoint runs for ``args`` (its first one names the role)."""
        role = args[0] if args else ""
        if role == "driver":
            return self._driver_command(args[1:], env, paths, root)
        if role == "executor":
            return self._executor_command(env)
        raise UnsupportedPod(f"pod {pod}: entrypoint role {role!r} is not run here")

    def _driver_command(
        self, args: list[str], env: dict[str, str], paths: dict[str, Path], root: Path
    ) -> list[str]:
        properties_file = Path(args[args.index("--properties-file") + 1])
        properties = _read_properties(properties_file)
        # The properties name mounted paths (the executors' pod template, ...): translated.
        _write_properties(properties_file, {k: _translate(v, paths) for k, v in properties.items()})
        service = properties["spark.driver.host"]  # "<service>.<namespace>.svc"
        # Port 0: the driver binds what the kernel gives (a port picked here first could be
        # taken by another process before the JVM binds it).
        self.services[service] = (int(properties["spark.driver.port"]), root / "container.log")
        account = paths.get(SERVICE_ACCOUNT_MOUNT)
        if account is None:
            raise UnsupportedPod("the driver pod has no service-account mount")
        bind = env["SPARK_DRIVER_BIND_ADDRESS"]
        stand_ins = {
            "spark.driver.host": bind,
            "spark.driver.port": "0",
            "spark.driver.blockManager.port": "0",
            "spark.kubernetes.driver.master": self.kube.url,
            "spark.kubernetes.authenticate.driver.mounted.oauthTokenFile": str(account / "token"),
            "spark.kubernetes.authenticate.driver.mounted.caCertFile": str(account / "ca.crt"),
        }
        return [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--conf",
            f"spark.driver.bindAddress={bind}",
            "--conf",
            f"spark.executorEnv.SPARK_DRIVER_POD_IP={bind}",
            "--deploy-mode",
            "client",
            *(part for key, value in stand_ins.items() for part in ("--conf", f"{key}={value}")),
            *args,
        ]

    def _executor_command(self, env: dict[str, str]) -> list[str]:
        java_opts = [
            value
            for _, value in sorted(
                (int(k.rsplit("_", 1)[1]), v)
                for k, v in env.items()
                if k.startswith("SPARK_JAVA_OPT_")
            )
        ]
        memory = env["SPARK_EXECUTOR_MEMORY"]
        java = Path(env["JAVA_HOME"]) / "bin" / "java" if "JAVA_HOME" in env else Path("java")
        return [
            str(java),
            *java_opts,
            f"-Xms{memory}",
            f"-Xmx{memory}",
            "-cp",
            f"{SPARK_HOME / 'jars'}/*",
            "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
            "--driver-url",
            self._resolve_driver_url(env["SPARK_DRIVER_URL"]),
            "--executor-id",
            env["SPARK_EXECUTOR_ID"],
            "--cores",
            env["SPARK_EXECUTOR_CORES"],
            "--app-id",
            env["SPARK_APPLICATION_ID"],
            "--hostname",
            env["SPARK_EXECUTOR_POD_IP"],
            "--resourceProfileId",
            env["SPARK_RESOURCE_PROFILE_ID"],
            "--podName",
            env["SPARK_EXECUTOR_POD_NAME"],
        ]

    def _resolve_driver_url(self, url: str) -> str:
        """spark://NAME@HOST:PORT as the pod network routes it: the driver pod's IP (Spark 4's
        default, ``spark.kubernetes.executor.useDriverPodIP``; loopback here) as is, the
        driver's Service (<service>.<ns>.svc) as cluster DNS and the Service would: to the port
        the driver bound (it binds port 0; the executors are asked for after it listens)."""
        head, _, address = url.rpartition("@")
        host, _, port = address.rpartition(":")
        if host == FIELD_REFS["status.podIP"]:
            return url
        service = self.services.get(host)
        if service is None or int(port) != service[0]:
            raise UnsupportedPod(f"{url}: no driver Service {host}:{port} known to the harness")
        log = service[1].read_text(errors="replace") if service[1].exists() else ""
        bound = DRIVER_LISTENING.findall(log)
        if not bound:
            raise UnsupportedPod(f"{url}: the driver has not logged its port in {service[1]}")
        return f"{head}@127.0.0.1:{bound[-1]}"


class OperatorKubelet(SparkKubelet):
    """Plays the kubelet for the chart's operator pod (the Deployment's, label
    ``app.kubernetes.io/component=operator``), as the project's image (ENTRYPOINT ``fjord``)
    runs it: ``fjord ARGS`` with the container's arguments and env, and a kubelet's in-cluster
    variables; the service account's token is the pod's own (its Secret volume), found through
    FJORD_OPERATOR_SERVICE_ACCOUNT_DIR (the mount's fixed path cannot be made here). Everything
    else as :class:`SparkKubelet` (volumes, status, deletion)."""

    selector = "app.kubernetes.io/component=operator"

    def _command(
        self, pod: str, args: list[str], env: dict[str, str], paths: dict[str, Path], root: Path
    ) -> list[str]:
        account = paths.get(SERVICE_ACCOUNT_MOUNT)
        if account is None:
            raise UnsupportedPod(f"pod {pod} has no service-account mount")
        env["FJORD_OPERATOR_SERVICE_ACCOUNT_DIR"] = str(account)
        return [str(Path(sys.executable).parent / "fjord"), *args]


def _translate(value: str, paths: dict[str, Path]) -> str:
    """``value`` with a leading image or mount path (also inside ``local://``/``file://``
    URIs) replaced by where it is on this machine; the longest matching path wins."""
    for scheme in ("local://", "file://", ""):
        if not value.startswith(scheme):
            continue
        rest = value[len(scheme) :]
        for image_path in sorted(paths, key=len, reverse=True):
            if rest == image_path or rest.startswith(image_path + "/"):
                return scheme + str(paths[image_path]) + rest[len(image_path) :]
    return value


def _read_properties(path: Path) -> dict[str, str]:
    """A Java properties file as Spark writes its ConfigMap (``key=value`` lines, ``#``
    comments; Spark escapes ``:``/``=`` in values, undone here)."""
    properties: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith(("#", "!")):
            continue
        key, _, value = line.partition("=")
        properties[key.strip()] = value.strip().replace("\\:", ":").replace("\\=", "=")
    return properties


def _write_properties(path: Path, properties: dict[str, str]) -> None:
    path.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))


def _stop_process_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process's group, SIGKILL after SPARK_STOP_GRACE_S (as a kubelet's grace)."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(SPARK_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(SPARK_STOP_GRACE_S)
