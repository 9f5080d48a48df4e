"""Boot the images `make image` built, without a Docker engine (`make image-test`; slow, needs
root for buildah and chroot; not collected by `make test`: the file name is not test_*.py).

What runs, from the images' own root filesystems (``buildah mount`` plus ``chroot`` as the
image's user, with the image's environment and working directory, /dev and /proc bound in):

- fjord/fjord:0.1.0: its ENTRYPOINT and CMD (``fjord --help``) through ``buildah run``; then a
  controller, three brokers (each in its own container, as each pod has its own volume) and a
  coordinator, each started with the exact container command the operator builds for a
  FjordCluster (fjord_operator.builders), plus the overrides a shared host network needs (free
  loopback ports and advertised addresses instead of the pod's own). etcd is the host's (the
  image holds none; the operator runs etcd's own image).
- Outside the image: a Fjord client and Kafka clients (confluent-kafka, a consumer group
  included) produce and consume through those brokers; the chart's probes (the builders'
  readiness and liveness probes) answer; everything the brokers wrote belongs to the image's
  non-root user.
- fjord/spark:0.1.0: the orders -> shipments job in ``local[2]`` through the image's entrypoint,
  as its non-root user, against that cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.errors import FjordError
from fjord.local.etcd import EtcdProcess, free_port, log_size, log_tail, stop_process
from fjord.testing.waiting import wait_for
from fjord_operator import builders
from fjord_operator import settings as s

FJORD_IMAGE = "fjord/fjord:0.1.0"
SPARK_IMAGE = "fjord/spark:0.1.0"
START_WAIT_S = 90.0
SPARK_TIMEOUT_S = 900
CLUSTER = "boot"
NAMESPACE = "images"
#: The FjordCluster whose pods are booted: cluster defaults that must reach the controller.
BROKERS = 3
CLUSTER_CONFIG = {
    "num.partitions": "3",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "retention.ms": "3600000",
}


def buildah(*args: str, timeout: float = 300) -> str:
    done = subprocess.run(
        ["buildah", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"buildah {' '.join(args)}: {done.stderr.strip()}"
    return done.stdout.strip()


@dataclass
class RootFs:
    """An image's root filesystem, mounted (``buildah mount``) with /dev and /proc bound in,
    and the image's config (user, environment, working directory, entrypoint)."""

    image: str
    container: str
    path: Path
    config: dict[str, Any]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def user(self) -> str:
        return str(self.config["User"])

    def environment(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.config.get("Env") or [])

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], log: Path
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside the image as its user, with its environment plus ``env``, in
        its working directory (what a container runtime does, minus the namespaces)."""
        environment = {**self.environment(), **env}
        command = [
            "chroot", f"--userspec={self.user}", str(self.path), "/usr/bin/env", "-i",
            "-C", self.config.get("WorkingDir") or "/",
            *(f"{k}={v}" for k, v in environment.items()), *argv,
        ]
        with log.open("ab") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        self.processes.append(proc)
        return proc


@contextlib.contextmanager
def mounted(image: str) -> Iterator[RootFs]:
    inspected = json.loads(buildah("inspect", "--type", "image", image))
    config = inspected["OCIv1"]["config"]
    container = buildah("from", "--pull=never", "--quiet", image)
    root = RootFs(image, container, Path(buildah("mount", container)), config)
    binds = []
    try:
        for source, target, how in (("/dev", "dev", "--rbind"), ("/proc", "proc", "--bind")):
            (root.path / target).mkdir(exist_ok=True)
            subprocess.run(["mount", how, source, str(root.path / target)], check=True, timeout=30)
            binds.append(root.path / target)
        # Like a container runtime, give the container its own /etc/hosts (the image's is empty).
        hosts = Path(tempfile.mkdtemp(prefix="image-boot-")) / "hosts"
        hosts.write_text("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n")
        hosts.chmod(0o644)
        (root.path / "etc" / "hosts").touch()
        subprocess.run(["mount", "--bind", str(hosts), str(root.path / "etc" / "hosts")],
                       check=True, timeout=30)
        binds.append(root.path / "etc" / "hosts")
        yield root
    finally:
        for proc in reversed(root.processes):
            stop_process(proc)
        for bound in reversed(binds):
            subprocess.run(["umount", "--recursive", "--lazy", str(bound)], check=False, timeout=30)
        buildah("umount", container)
        buildah("rm", container)


@pytest.fixture(scope="module")
def fjord_root() -> Iterator[RootFs]:
    with mounted(FJORD_IMAGE) as root:
        yield root


@dataclass
class Booted:
    """The cluster booted from the image: per process (``controller``, ``broker-0``, ...,
    ``coordinator``) its ports by the pod's port names, its container spec and its log; each
    broker's root filesystem (its own container, as each pod has its own volume)."""

    bootstrap: str
    kafka_bootstrap: str
    ports: dict[str, dict[str, int]]
    containers: dict[str, dict[str, Any]]
    logs: dict[str, Path]
    broker_roots: list[RootFs]


def pod_body(etcd_url: str) -> dict[str, Any]:
    return {
        "apiVersion": s.API_VERSION,
        "kind": s.CLUSTER_KIND,
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE, "uid": str(uuid.uuid4())},
        "spec": {
            "brokers": {"replicas": BROKERS, "config": dict(CLUSTER_CONFIG)},
            "etcd": {"endpoints": [etcd_url.removeprefix("http://")]},  # bare HOST:PORT
        },
    }


def answers(component: str, probe: Mapping[str, Any], ports: Mapping[str, int]) -> bool:
    """Whether one of the chart's probes (tcpSocket or httpGet on a named port) succeeds."""
    if "tcpSocket" in probe:
        port = ports[probe["tcpSocket"]["port"]]
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 2):
            return True
        return False
    get = probe["httpGet"]
    url = f"http://127.0.0.1:{ports[get['port']]}{get['path']}"
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
        return bool(response.status == 200)
    return False


@pytest.fixture(scope="module")
def booted(fjord_root: RootFs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Booted]:
    base = tmp_path_factory.mktemp("image-boot")
    etcd = EtcdProcess(base / "etcd", base / "etcd.log", unsafe_no_fsync=True)
    etcd.start()
    stack = contextlib.ExitStack()
    try:
        body = pod_body(etcd.url)
        objects = {
            (o["kind"], o["metadata"]["name"]): o
            for o in builders.cluster_objects(body, BROKERS)
        }
        config_map = objects[("ConfigMap", builders.config_map_name(CLUSTER))]["data"]
        ports: dict[str, dict[str, int]] = {}
        containers: dict[str, dict[str, Any]] = {}
        logs: dict[str, Path] = {}
        broker_roots = [fjord_root] + [
            stack.enter_context(mounted(FJORD_IMAGE)) for _ in range(BROKERS - 1)
        ]
        pods = [
            ("Deployment", builders.controller_name(CLUSTER), "controller", fjord_root),
            *(
                ("StatefulSet", builders.broker_name(CLUSTER), f"broker-{i}", root)
                for i, root in enumerate(broker_roots)
            ),
            ("Deployment", builders.coordinator_name(CLUSTER), "coordinator", fjord_root),
        ]
        runs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}  # its process, log start

        def start(kind: str, name: str, component: str, root: RootFs) -> None:
            """Start ``component`` on free loopback ports picked now."""
            (container,) = objects[(kind, name)]["spec"]["template"]["spec"]["containers"]
            named = {p["name"]: free_port() for p in container["ports"]}
            # The pod's identity and the overrides a shared host network needs (last flag wins).
            ordinal = component.rpartition("-")[2] if component.startswith("broker") else "0"
            env = {
                "HOSTNAME": f"{name}-{ordinal}",
                "POD_UID": str(uuid.uuid4()),
                "POD_IP": "127.0.0.1",
            }
            overrides = [
                "--listen", f"127.0.0.1:{named['grpc']}",
                "--metrics-port", str(named["metrics"]),
                "--advertised-host", "127.0.0.1",
            ]
            if "kafka" in named:
                overrides += [
                    "--listeners", f"KAFKA://127.0.0.1:{named['kafka']}",
                    "--advertised-listeners", f"KAFKA://127.0.0.1:{named['kafka']}",
                ]
            logs[component] = base / f"{component}.log"
            since = log_size(logs[component])
            process = root.spawn(
                [*container["command"], *overrides], {**config_map, **env}, logs[component]
            )
            runs[component] = process, since
            ports[component], containers[component] = named, container

        def port_taken(component: str) -> bool:
            """Whether ``component`` exited because a port picked for it was bound by another
            process first (free_port() only says it was free a moment ago)."""
            process, since = runs[component]
            if process.poll() is None:
                return False
            run = log_tail(logs[component], lines=40, since=since).lower()
            return "address already in use" in run or "failed to bind" in run

        for pod in pods:
            start(*pod)
        for pod in pods:
            component = pod[2]
            for probe in ("readinessProbe", "livenessProbe"):

                def probed(pod: tuple[str, str, str, RootFs] = pod, probe: str = probe) -> bool:
                    component = pod[2]
                    if port_taken(component):  # started again on new ports (it registers them)
                        start(*pod)
                    # Alive too: whoever took a port first may answer a tcpSocket probe.
                    return runs[component][0].poll() is None and answers(
                        component, containers[component][probe], ports[component]
                    )

                wait_for(probed, f"{component}'s {probe} from the image (log {logs[component]})",
                         START_WAIT_S, interval=0.5)
        yield Booted(
            f"127.0.0.1:{ports['broker-0']['grpc']}",
            f"127.0.0.1:{ports['broker-0']['kafka']}",
            ports,
            containers,
            logs,
            broker_roots,
        )
    finally:
        for root in (fjord_root, *reversed(broker_roots)):
            for proc in reversed(root.processes):
                stop_process(proc)
            root.processes.clear()
        stack.close()
        etcd.stop()


def test_entrypoint_is_fjord_and_runs_as_the_non_root_user(fjord_root: RootFs) -> None:
    """``buildah run`` applies the image's user; ENTRYPOINT + CMD print fjord's help."""
    config = fjord_root.config
    assert config["Entrypoint"] == ["fjord"] and config["Cmd"] == ["--help"]
    container = buildah("from", "--pull=never", "--quiet", FJORD_IMAGE)
    try:
        run = ("run", "--isolation", "chroot", container, "--")
        assert buildah(*run, "id", "-u") == fjord_root.user.split(":")[0] == "10001"
        usage = buildah(*run, *config["Entrypoint"], *config["Cmd"], timeout=120)
        assert "Usage: fjord" in usage
        for command in ("broker", "controller", "coordinator", "operator", "topics"):
            assert command in usage
    finally:
        buildah("rm", container)


def test_the_charts_probes_answer(booted: Booted) -> None:
    for component, container in booted.containers.items():
        for probe in ("readinessProbe", "livenessProbe"):
            assert answers(component, container[probe], booted.ports[component]), component
    # The Kafka ports (the Services' `kafka` port) accept connections too.
    for component in [*(f"broker-{i}" for i in range(BROKERS)), "coordinator"]:
        assert answers(component, {"tcpSocket": {"port": "kafka"}}, booted.ports[component])


def test_clients_outside_produce_and_consume_through_the_image(booted: Booted) -> None:
    with AdminClient({"bootstrap.servers": booted.bootstrap}) as admin:
        admin.create_topics([NewTopic("boot.events")])  # -1, -1: the cluster's defaults
        described = wait_for(  # the broker learns of the topic from etcd a moment later
            lambda: admin.describe_topics(["boot.events"])[0],
            "boot.events described",
            retry_on=(FjordError,),
        )
    # num.partitions / default.replication.factor of the FjordCluster's spec reached the
    # controller; every partition has its replicas in sync on the three image-booted brokers.
    assert len(described.partitions) == int(CLUSTER_CONFIG["num.partitions"])
    for partition in described.partitions:
        assert sorted(partition.replicas) == list(range(BROKERS))
    values = [f"event-{i}".encode() for i in range(100)]
    with Producer({"bootstrap.servers": booted.bootstrap, "acks": "all"}) as producer:
        for future in [producer.send("boot.events", value=v, key=v) for v in values]:
            future.result(30)
    got = [value for _, value in read(booted, ["boot.events"], len(values))]
    assert sorted(got) == sorted(values)

    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import Producer as KafkaProducer

    kafka = KafkaProducer({"bootstrap.servers": booted.kafka_bootstrap, "acks": "all"})
    for i in range(10):
        kafka.produce("boot.events", value=f"kafka-{i}".encode(), key=b"k")
    assert kafka.flush(30) == 0
    # A consumer group: FindCoordinator names the coordinator's Kafka listener (from the image).
    consumer = KafkaConsumer({"bootstrap.servers": booted.kafka_bootstrap, "group.id": "boot",
                              "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe(["boot.events"])
        seen: list[bytes] = []

        def poll() -> bool:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                seen.append(message.value() or b"")
            return len(seen) >= 110

        wait_for(poll, "110 records through the Kafka listener", interval=0)
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    assert sorted(seen) == sorted([*values, *(f"kafka-{i}".encode() for i in range(10))])


def test_the_non_root_user_owns_what_the_brokers_wrote(booted: Booted) -> None:
    """Each broker's /var/lib/fjord (its own root filesystem) holds replicas of the topic, all
    owned by the image's user; the directory keeps the image's mode."""
    for root in booted.broker_roots:
        uid, gid = (int(x) for x in root.user.split(":"))
        data = root.path / s.BROKER_DATA_DIR.lstrip("/")
        written = list(data.rglob("*"))
        segments = [p for p in written if p.name.endswith(".log") and p.stat().st_size > 0]
        assert any("boot.events" in str(p) for p in segments), written  # replicated data
        wrong = [(str(p), p.stat().st_uid, p.stat().st_gid) for p in written
                 if (p.stat().st_uid, p.stat().st_gid) != (uid, gid)]
        assert wrong == []
        assert (data.stat().st_uid, oct(data.stat().st_mode & 0o777)) == (uid, "0o750")


@pytest.mark.timeout(SPARK_TIMEOUT_S + 120)
def test_spark_image_runs_a_job_in_local_mode_against_the_cluster(booted: Booted) -> None:
    orders, shipments, dead = "boot.orders", "boot.shipments", "boot.orders.dlq"
    with AdminClient({"bootstrap.servers": booted.bootstrap}) as admin:
        admin.create_topics(
            [NewTopic(orders, 2, 3), NewTopic(shipments, 2, 3), NewTopic(dead, 1, 3)]
        )
    sent = {"o-1": ("SKU-BOOK", 2), "o-2": ("SKU-PHONE", 1), "o-3": ("SKU-NOT-STOCKED", 1)}
    with Producer({"bootstrap.servers": booted.bootstrap}) as producer:
        for order_id, (sku, qty) in sent.items():
            body = {"order_id": order_id, "user_id": "u-1", "sku": sku, "qty": qty}
            producer.send(orders, key=order_id.encode(), value=json.dumps(body).encode())
        producer.flush()
    with mounted(SPARK_IMAGE) as spark:
        config = spark.config
        job = [
            *config["Entrypoint"], "/opt/spark/bin/spark-submit", "--master", "local[2]",
            "/opt/fjord/spark/fjord_jobs/orders_shipments.py",
            "--bootstrap-servers", booted.bootstrap, "--checkpoint", "checkpoints/orders",
            "--available-now", "--orders-topic", orders, "--shipments-topic", shipments,
            "--dead-letter-topic", dead,
        ]
        log = Path(os.environ.get("TMPDIR", "/tmp")) / f"image-boot-spark-{uuid.uuid4().hex}.log"
        proc = spark.spawn(job, {"SPARK_LOCAL_IP": "127.0.0.1",
                                 "SPARK_LOCAL_HOSTNAME": "localhost"}, log)
        try:
            code = proc.wait(SPARK_TIMEOUT_S)
        finally:
            stop_process(proc)
        assert code == 0, log_tail(log, 60)
        work = spark.path / config["WorkingDir"].lstrip("/") / "checkpoints"
        assert work.exists() and work.stat().st_uid == int(spark.user.split(":")[0])
    got = read(booted, [shipments, dead], 3)
    assert sorted(key for topic, key in got if topic == shipments) == [b"o-1", b"o-2"]
    assert [key for topic, key in got if topic == dead] == [b"o-3"]


def read(booted: Booted, topics: Sequence[str], count: int) -> list[tuple[str, bytes]]:
    """(topic, value) of the first ``count`` records of ``topics`` (keys for the Spark topics,
    whose values are JSON), read from the start with the Fjord consumer outside the image."""
    records: list[tuple[str, bytes]] = []
    with Consumer({"bootstrap.servers": booted.bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition(t, p) for t in topics for p in c.partitions_for_topic(t)])

        def more() -> bool:
            for r in c.poll(timeout=1.0):
                keyed = r.topic != "boot.events"
                records.append((r.topic, (r.key if keyed else r.value) or b""))
            return len(records) >= count

        wait_for(more, f"{count} records of {', '.join(topics)}", interval=0)
    return records
