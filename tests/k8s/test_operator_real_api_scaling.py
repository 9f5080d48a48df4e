"""Scaling 3 -> 5 -> 3 against the REAL API server (the session's ``real_kube``): the operator
(`fjord operator`, a process) changes the StatefulSet, the real StatefulSet controller creates
and deletes the pods, and the harness of tests/k8s/kube/kubelet.py plays the scheduler and the
kubelet (binds each pod, runs the broker it stands for in a private LocalCluster, reports the
pod Running and Ready from the readiness probe, stops the broker when its pod is deleted).

Checked: the new brokers' pods become Ready and the StatefulSet controller counts them; the
operator moves partitions onto them; on the way back the StatefulSet controller deletes pods 3
and 4 only after the operator drained them (the harness snapshots every partition's replicas
when it stops each broker); no record is lost or duplicated.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fjord.client import AdminClient, Consumer, Producer, TopicPartition
from fjord.local.cluster import LocalCluster
from fjord.local.etcd import log_tail
from fjord.testing.waiting import WaitTimeout, seconds_until, wait_for
from fjord_operator.settings import API_VERSION, BOOTSTRAP_ANNOTATION
from tests.k8s.kube.apiserver import RealKube
from tests.k8s.kube.kubelet import RealKubelet
from tests.k8s.kube.operator_process import running_operator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NAMESPACE = "fjord-scaling"
CLUSTER = "fjord"
RECORDS = 600
PARTITIONS = 6
RECONCILE_TIMEOUT_S = 90.0
SCALE_TIMEOUT_S = 150.0


@pytest.fixture(scope="module")
def fjord_local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Private: this module starts and stops brokers.
    cluster = LocalCluster(
        tmp_path_factory.mktemp("real-api-scaling"),
        brokers=3,
        cluster_id=f"{NAMESPACE}.{CLUSTER}",
        unsafe_etcd_no_fsync=True,
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def bootstrap(fjord_local: LocalCluster) -> str:
    # Brokers 0-2 stay for the whole module; 3 and 4 come and go with their pods.
    return ",".join(fjord_local.broker_addresses[i] for i in range(3))


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> Iterator[AdminClient]:
    with AdminClient({"bootstrap.servers": bootstrap}) as client:
        yield client


def _replicas(client: AdminClient) -> dict[tuple[str, int], tuple[int, ...]]:
    return {
        (t.name, p.partition): tuple(p.replicas)
        for t in client.describe_topics()
        for p in t.partitions
    }


@pytest.fixture(scope="module")
def kubelet(
    real_kube: RealKube, fjord_local: LocalCluster, bootstrap: str
) -> Iterator[RealKubelet]:
    real_kube.kubectl("create", "namespace", NAMESPACE)
    client = AdminClient({"bootstrap.servers": bootstrap})
    node = RealKubelet(real_kube, fjord_local, NAMESPACE, CLUSTER, lambda: _replicas(client))
    node.start()
    try:
        yield node
    finally:
        node.stop()
        client.close()
    assert not node.errors, f"the kubelet harness failed: {node.errors!r}"


@pytest.fixture(scope="module")
def operator_log(
    real_kube: RealKube, kubelet: RealKubelet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    with running_operator(
        real_kube,
        NAMESPACE,
        tmp_path_factory.mktemp("scaling-operator"),
        kubeconfig=real_kube.admin_kubeconfig,
    ) as log:
        yield log


def _apply(kube: RealKube, obj: dict[str, Any]) -> None:
    kube.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(obj))


def _wait(condition: Any, what: str, log: Path, timeout: float) -> Any:
    try:
        return wait_for(condition, what, timeout, interval=0.5)
    except WaitTimeout as exc:
        raise WaitTimeout(f"{exc}\noperator log:\n{log_tail(log, lines=40)}") from None


def _ready(kube: RealKube, kind: str, name: str) -> dict[str, Any] | None:
    obj = kube.get_json(kind, name, "-n", NAMESPACE)
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c["type"] == "Ready"), None)
    if obj is None or ready is None or ready["status"] != "True":
        return None
    if obj["status"].get("observedGeneration") != obj["metadata"]["generation"]:
        return None
    return dict(obj)


def _ready_broker_pods(kube: RealKube) -> set[int]:
    pods = kube.get_json("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=broker")[
        "items"
    ]
    return {
        int(p["metadata"]["name"].rsplit("-", 1)[1])
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        )
    }


def _sts_ready(kube: RealKube) -> int:
    sts = kube.get_json("statefulset", f"{CLUSTER}-broker", "-n", NAMESPACE) or {}
    return int((sts.get("status") or {}).get("readyReplicas") or 0)


def _hosting(admin: AdminClient, topic: str) -> set[int]:
    return {b for (t, _), replicas in _replicas(admin).items() if t == topic for b in replicas}


def test_scaling_3_to_5_to_3_with_real_controllers(
    real_kube: RealKube,
    kubelet: RealKubelet,
    operator_log: Path,
    fjord_local: LocalCluster,
    bootstrap: str,
    admin: AdminClient,
) -> None:
    _apply(
        real_kube,
        {
            "apiVersion": API_VERSION,
            "kind": "FjordCluster",
            "metadata": {
                "name": CLUSTER,
                "namespace": NAMESPACE,
                "annotations": {BOOTSTRAP_ANNOTATION: bootstrap},
            },
            "spec": {
                "brokers": {"replicas": 3, "storage": {"size": "1Gi"}},
                "controllers": {"replicas": 2},
                "coordinators": {"replicas": 1},
                "etcd": {"endpoints": [fjord_local.etcd_url]},
            },
        },
    )
    _wait(
        lambda: _ready(real_kube, "fjordcluster", CLUSTER),
        "cluster Ready",
        operator_log,
        RECONCILE_TIMEOUT_S,
    )
    _wait(
        lambda: _sts_ready(real_kube) == 3, "3 broker pods Ready", operator_log, RECONCILE_TIMEOUT_S
    )
    _apply(
        real_kube,
        {
            "apiVersion": API_VERSION,
            "kind": "FjordTopic",
            "metadata": {"name": "events", "namespace": NAMESPACE},
            "spec": {"cluster": CLUSTER, "partitions": PARTITIONS, "replicationFactor": 2},
        },
    )
    _wait(
        lambda: _ready(real_kube, "fjordtopic", "events"),
        "topic Ready",
        operator_log,
        RECONCILE_TIMEOUT_S,
    )
    sent = {f"record-{i:05d}".encode() for i in range(RECORDS)}
    with Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True}
    ) as producer:
        futures = [producer.send("events", value=v, key=v) for v in sorted(sent)]
        producer.flush(timeout=60)
        for future in futures:
            future.result(timeout=60)

    # 3 -> 5: the StatefulSet controller creates pods 3 and 4, the harness runs them.
    real_kube.kubectl(
        "patch",
        "fjordcluster",
        CLUSTER,
        "-n",
        NAMESPACE,
        "--type=merge",
        "-p",
        '{"spec": {"brokers": {"replicas": 5}}}',
    )
    _wait(
        lambda: _ready_broker_pods(real_kube) == {0, 1, 2, 3, 4},
        "5 broker pods Ready",
        operator_log,
        SCALE_TIMEOUT_S,
    )
    _wait(
        lambda: {3, 4} <= _hosting(admin, "events"),
        "partitions moved onto brokers 3 and 4",
        operator_log,
        SCALE_TIMEOUT_S,
    )
    scaled = _wait(
        lambda: (
            (o := _ready(real_kube, "fjordcluster", CLUSTER)) and o["status"]["brokers"] == 5 and o
        ),
        "cluster Ready with 5 brokers",
        operator_log,
        SCALE_TIMEOUT_S,
    )
    assert scaled["status"]["brokers"] == 5
    _wait(
        lambda: _sts_ready(real_kube) == 5,
        "the StatefulSet counting 5 ready pods",
        operator_log,
        RECONCILE_TIMEOUT_S,
    )
    assert not admin.list_partition_reassignments()

    # 5 -> 3: drained first, then the StatefulSet controller deletes pods 4 and 3.
    stops_before = len([e for e in kubelet.events if e.action == "stop"])
    real_kube.kubectl(
        "patch",
        "fjordcluster",
        CLUSTER,
        "-n",
        NAMESPACE,
        "--type=merge",
        "-p",
        '{"spec": {"brokers": {"replicas": 3}}}',
    )
    _wait(
        lambda: not (kubelet.running() & {3, 4}),
        "brokers 3 and 4 stopped",
        operator_log,
        SCALE_TIMEOUT_S,
    )
    stops = [e for e in kubelet.events if e.action == "stop"][stops_before:]
    assert sorted(e.ordinal for e in stops) == [3, 4]
    for stop in stops:
        assert any(topic == "events" for topic, _ in stop.replicas_seen), "no snapshot taken"
        hosting = {tp: r for tp, r in stop.replicas_seen.items() if stop.ordinal in r}
        assert not hosting, f"broker {stop.ordinal} stopped while hosting {hosting}"
    _wait(
        lambda: (
            not real_kube.get_json(
                "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=broker"
            )["items"][3:]
        ),
        "pods 3 and 4 gone",
        operator_log,
        SCALE_TIMEOUT_S,
    )
    _wait(
        lambda: (
            (o := _ready(real_kube, "fjordcluster", CLUSTER)) and o["status"]["brokers"] == 3 and o
        ),
        "cluster Ready with 3 brokers",
        operator_log,
        SCALE_TIMEOUT_S,
    )
    assert _hosting(admin, "events") <= {0, 1, 2}

    received: list[bytes] = []
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([TopicPartition("events", p) for p in range(PARTITIONS)])
        seconds_until(
            lambda: (
                received.extend(r.value or b"" for r in consumer.poll(0.5))
                or len(received) >= len(sent)
            ),
            RECONCILE_TIMEOUT_S,
        )
    assert len(received) == len(sent), "records were lost or duplicated"
    assert set(received) == sent


ROLLED_TOPIC = "rolled"
ROLLED_PARTITIONS = 6
ZONE_KEY = "topology.kubernetes.io/zone"


def _broker_pods(kube: RealKube) -> dict[int, dict[str, Any]]:
    pods = kube.get_json("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=broker")
    return {int(p["metadata"]["name"].rsplit("-", 1)[1]): p for p in pods["items"]}


def _cluster(bootstrap: str, etcd_url: str, *, rack: bool, restart: str | None) -> dict[str, Any]:
    annotations = {BOOTSTRAP_ANNOTATION: bootstrap}
    if restart is not None:
        annotations["fjord.io/restart"] = restart
    brokers: dict[str, Any] = {"replicas": 3, "storage": {"size": "1Gi"}}
    if rack:
        brokers["rack"] = {"topologyKey": ZONE_KEY}
    return {
        "apiVersion": API_VERSION,
        "kind": "FjordCluster",
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE, "annotations": annotations},
        "spec": {
            "brokers": brokers,
            "controllers": {"replicas": 2},
            "coordinators": {"replicas": 1},
            "etcd": {"endpoints": [etcd_url]},
        },
    }


def test_a_template_change_rolls_the_brokers_one_at_a_time_and_racks_come_from_nodes(
    real_kube: RealKube,
    kubelet: RealKubelet,
    operator_log: Path,
    fjord_local: LocalCluster,
    bootstrap: str,
    admin: AdminClient,
) -> None:
    """One change of the broker pod template, as a user makes it: rack awareness turned on
    (``spec.brokers.rack.topologyKey``) and ``fjord.io/restart`` set. The StatefulSet
    (OnDelete) restarts nothing itself; the operator deletes one old pod at a time through
    the rolling-restart planner, the StatefulSet controller recreates it from the new
    template, and the harness runs the broker again. Under acks=all load on an RF-3,
    min.insync-2 topic (no client retries) no produce is refused with NOT_ENOUGH_REPLICAS and
    every acknowledged record is read back.

    Racks: the harness binds the pods to ``fjord-harness-node``, here a real Node labelled
    zone-a; the operator reads it and annotates each pod ``fjord.io/rack=zone-a``
    (``status.racks``); the harness starts each new pod's broker as its start script does
    (waiting for the annotation, then ``--rack``; the script itself runs in a real shell in
    test_operator_builders), so the cluster then reports every broker in zone-a."""
    from fjord.client import NewTopic
    from tests.helpers.acks_all_load import REFUSALS, AcksAllLoad, read_values
    from tests.k8s.kube.kubelet import NODE

    if real_kube.get_json("node", NODE) is None:
        _apply(real_kube, {"apiVersion": "v1", "kind": "Node",
                           "metadata": {"name": NODE, "labels": {ZONE_KEY: "zone-a"}}})
    _apply(real_kube, _cluster(bootstrap, fjord_local.etcd_url, rack=False, restart=None))
    _wait(
        lambda: _ready_broker_pods(real_kube) == {0, 1, 2}
        and _ready(real_kube, "fjordcluster", CLUSTER),
        "3 broker pods Ready and the cluster Ready",
        operator_log,
        SCALE_TIMEOUT_S,
    )
    sts = real_kube.get_json("statefulset", f"{CLUSTER}-broker", "-n", NAMESPACE)
    assert sts["spec"]["updateStrategy"]["type"] == "OnDelete"
    admin.create_topics(
        [NewTopic(ROLLED_TOPIC, ROLLED_PARTITIONS, 3, {"min.insync.replicas": "2"})]
    )
    before = {i: p["metadata"]["uid"] for i, p in _broker_pods(real_kube).items()}
    stops_before = len([e for e in kubelet.events if e.action == "stop"])
    load = AcksAllLoad(bootstrap, topic=ROLLED_TOPIC)
    load.start()
    try:
        load.wait_acked(200)
        load.errors.clear()
        _apply(real_kube, _cluster(bootstrap, fjord_local.etcd_url, rack=True, restart="1"))

        def rolled() -> bool:
            pods = _broker_pods(real_kube)
            cluster = _ready(real_kube, "fjordcluster", CLUSTER)
            return (
                all(pods.get(i, {}).get("metadata", {}).get("uid") not in (None, before[i])
                    for i in before)
                and _ready_broker_pods(real_kube) == {0, 1, 2}
                and bool(cluster)
                and (cluster or {}).get("status", {}).get("rolling", {}).get("phase") == "Idle"
            )

        _wait(rolled, "every broker pod replaced and the roll Idle", operator_log, SCALE_TIMEOUT_S)
        load.wait_acked(100)
    finally:
        load.stop()
    stops = [e for e in kubelet.events if e.action == "stop"][stops_before:]
    summary = f"errors {dict(load.errors)}, kubelet stops {[e.ordinal for e in stops]}"
    assert sorted(e.ordinal for e in stops) == [0, 1, 2], summary
    for refusal in REFUSALS:
        assert load.errors[refusal] == 0, summary
    missing = load.acked - read_values(bootstrap, topic=ROLLED_TOPIC, partitions=ROLLED_PARTITIONS)
    assert not missing, f"{len(missing)} acknowledged records not read back; {summary}"

    template = real_kube.get_json("statefulset", f"{CLUSTER}-broker", "-n", NAMESPACE)
    assert template["spec"]["template"]["metadata"]["annotations"] == {"fjord.io/restart": "1"}
    pod_spec = template["spec"]["template"]["spec"]
    assert any(v.get("downwardAPI") for v in pod_spec.get("volumes") or []), pod_spec
    assert pod_spec["affinity"]["podAntiAffinity"], pod_spec
    pods = _broker_pods(real_kube)
    assert {i: (p["metadata"].get("annotations") or {}).get("fjord.io/rack")
            for i, p in pods.items()} == {0: "zone-a", 1: "zone-a", 2: "zone-a"}
    status = real_kube.get_json("fjordcluster", CLUSTER, "-n", NAMESPACE)["status"]
    assert status["racks"] == {"0": "zone-a", "1": "zone-a", "2": "zone-a"}
    racks = {b.id: b.rack for b in admin.describe_cluster().brokers if b.id < 3}
    assert racks == {0: "zone-a", 1: "zone-a", 2: "zone-a"}, racks
