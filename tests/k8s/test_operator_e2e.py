"""End to end: the kopf operator against kmock (an in-memory Kubernetes API) with its admin calls
going to a REAL local Fjord cluster (etcd, controllers, brokers on loopback).

One module-scoped world (the tests build on each other's objects, in file order): a private
LocalCluster whose brokers 0-2 run from the start, the emulated API server with the chart's
CRDs, the :class:`~tests.k8s.harness.Kubelet` that turns the StatefulSet ``fjord-broker`` into
broker processes, and the operator (``fjord_operator``'s kopf handlers, intervals shortened).
The first tests check the emulator's own API-server behaviour (no Fjord needed).
See docs/kubernetes.md, "How the operator is tested".
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import kopf
import pytest

from fjord.client import AdminClient, Consumer, Producer, TopicPartition
from fjord.local.cluster import LocalCluster
from fjord.testing.waiting import WaitTimeout, seconds_until
from fjord_operator.handlers import register
from fjord_operator.settings import (
    API_VERSION,
    BOOTSTRAP_ANNOTATION,
    MANAGED_BY,
    RECORD_BYTES_ANNOTATION,
    OperatorSettings,
)
from tests.k8s.harness import (
    ApiError,
    ApiServer,
    Kubelet,
    OperatorRunner,
    condition_of,
    wait_for,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
]

NAMESPACE = "fjord-e2e"
CLUSTER = "fjord"
# Bounds of the waits (the machine is shared; the operator's timers are shortened below).
RECONCILE_TIMEOUT_S = 60.0
SCALE_TIMEOUT_S = 120.0
RECORDS = 600
PARTITIONS = 6
OPERATOR_INTERVAL_S = 1.0
ADMIN_TIMEOUT_S = 15.0


# -- the world ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fjord_local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        tmp_path_factory.mktemp("k8s-e2e"),
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
    # Brokers 0-2 stay for the whole module; 3 and 4 come and go with the scaling test.
    return ",".join(fjord_local.broker_addresses[i] for i in range(3))


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> Iterator[AdminClient]:
    with AdminClient({"bootstrap.servers": bootstrap}) as client:
        yield client


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    server = ApiServer(log_path=tmp_path_factory.mktemp("kmock") / "kmock.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _replicas_by_partition(client: AdminClient) -> dict[tuple[str, int], tuple[int, ...]]:
    return {
        (t.name, p.partition): tuple(p.replicas)
        for t in client.describe_topics()
        for p in t.partitions
    }


@pytest.fixture(scope="module")
def kubelet(api: ApiServer, fjord_local: LocalCluster, bootstrap: str) -> Iterator[Kubelet]:
    client = AdminClient({"bootstrap.servers": bootstrap})
    node = Kubelet(api, fjord_local, NAMESPACE, CLUSTER, lambda: _replicas_by_partition(client))
    node.start()
    try:
        yield node
    finally:
        node.stop()
        client.close()
    assert not node.errors, f"the kubelet failed: {node.errors!r}"


class Operator:
    """The operator under test: ``fjord_operator``'s handlers in kopf, timers shortened,
    pointed at the emulator (kopf logs in and the operator's lightkube client connects through
    ``kube_server``). :meth:`restart` replaces it by a fresh one (new clients, no memory), as
    a rescheduled operator pod would be."""

    def __init__(self, api: ApiServer) -> None:
        self.api = api
        self.runner: OperatorRunner | None = None

    def start(self) -> None:
        settings = OperatorSettings(
            namespaces=(NAMESPACE,),
            cluster_interval_s=OPERATOR_INTERVAL_S,
            topic_interval_s=OPERATOR_INTERVAL_S,
            retry_delay_s=OPERATOR_INTERVAL_S,
            admin_timeout_s=ADMIN_TIMEOUT_S,
            kube_server=self.api.url,
        )
        kopf_settings = kopf.OperatorSettings()
        # kmock cannot list namespaces (/api/v1/namespaces); we watch one namespace anyway.
        kopf_settings.scanning.disabled = True
        self.runner = OperatorRunner(register(settings), kopf_settings, NAMESPACE)
        self.runner.start()

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()
            error, self.runner = self.runner.error, None
            assert error is None, f"kopf failed: {error!r}"


@pytest.fixture(scope="module")
def operator(api: ApiServer, kubelet: Kubelet) -> Iterator[Operator]:
    handle = Operator(api)
    handle.start()
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="module")
def fjord_cluster(
    api: ApiServer, operator: Operator, fjord_local: LocalCluster, bootstrap: str
) -> dict[str, Any]:
    """The FjordCluster ``fjord``, created and Ready."""
    api.create(
        "fjordclusters",
        NAMESPACE,
        {
            "apiVersion": API_VERSION,
            "kind": "FjordCluster",
            "metadata": {"name": CLUSTER, "annotations": {BOOTSTRAP_ANNOTATION: bootstrap}},
            "spec": {
                "brokers": {"replicas": 3, "storage": {"size": "1Gi"}},
                "controllers": {"replicas": 2},
                "coordinators": {"replicas": 1},
                "etcd": {"endpoints": [fjord_local.etcd_url]},
            },
        },
    )
    return _wait_ready(api, "fjordclusters", CLUSTER, RECONCILE_TIMEOUT_S)


def _get(api: ApiServer, plural: str, name: str) -> dict[str, Any] | None:
    return api.get(plural, NAMESPACE, name)


def _ready(api: ApiServer, plural: str, name: str) -> dict[str, Any] | None:
    """The object once its status is Ready for its current generation, else None."""
    obj = _get(api, plural, name)
    cond = condition_of(obj, "Ready")
    if obj is None or cond is None or cond.get("status") != "True":
        return None
    if obj.get("status", {}).get("observedGeneration") != obj["metadata"].get("generation"):
        return None
    return obj


def _wait_ready(api: ApiServer, plural: str, name: str, timeout: float) -> dict[str, Any]:
    """Wait until ``_ready``; on a timeout the error shows the object's last status."""
    try:
        return dict(wait_for(lambda: _ready(api, plural, name), f"{plural}/{name} Ready", timeout))
    except WaitTimeout as exc:
        obj = _get(api, plural, name) or {}
        raise WaitTimeout(
            f"{exc}; generation {obj.get('metadata', {}).get('generation')}, "
            f"status {obj.get('status')}"
        ) from None


def _condition_reason(api: ApiServer, plural: str, name: str, kind: str) -> str | None:
    cond = condition_of(_get(api, plural, name), kind)
    return None if cond is None or cond.get("status") != "True" else cond.get("reason")


def _topic(
    name: str,
    partitions: int,
    replication: int,
    config: dict[str, str] | None = None,
    topic_name: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "cluster": CLUSTER,
        "partitions": partitions,
        "replicationFactor": replication,
        "config": config or {},
    }
    if topic_name is not None:
        spec["topicName"] = topic_name
    return {
        "apiVersion": API_VERSION,
        "kind": "FjordTopic",
        "metadata": {"name": name},
        "spec": spec,
    }


def _fjord_topic(admin: AdminClient, name: str) -> Any:
    return next((t for t in admin.describe_topics() if t.name == name), None)


def _topic_config(admin: AdminClient, name: str, key: str) -> str | None:
    entries = admin.describe_configs([name])[name]
    return next((e.value for e in entries if e.name == key), None)


# -- the emulator itself (no Fjord needed) ---------------------------------------------------

SCRATCH = "emulator-checks"


def _config_map(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def test_emulator_stamps_metadata_like_an_api_server(api: ApiServer) -> None:
    created = api.create(
        "fjordclusters",
        SCRATCH,
        {
            "apiVersion": API_VERSION,
            "kind": "FjordCluster",
            "metadata": {"name": "stamped"},
            "spec": {"brokers": {"replicas": 1}},
        },
    )
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["namespace"] == SCRATCH
    assert meta["generation"] == 1
    spec_changed = api.patch(
        "fjordclusters", SCRATCH, "stamped", {"spec": {"brokers": {"replicas": 2}}}
    )
    assert spec_changed["metadata"]["generation"] == 2
    assert int(spec_changed["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    status_changed = api.patch(
        "fjordclusters", SCRATCH, "stamped", {"status": {"brokers": 2}}, subresource="status"
    )
    assert status_changed["metadata"]["generation"] == 2
    assert status_changed["metadata"]["uid"] == meta["uid"]
    assert int(status_changed["metadata"]["resourceVersion"]) > int(
        spec_changed["metadata"]["resourceVersion"]
    )


def test_emulator_refuses_a_stale_json_patch_with_422(api: ApiServer) -> None:
    created = api.create("configmaps", SCRATCH, _config_map("stale", a="1"))
    api.patch("configmaps", SCRATCH, "stale", {"data": {"a": "2"}})
    stale = [
        {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": created["metadata"]["resourceVersion"],
        },
        {"op": "replace", "path": "/data/a", "value": "3"},
    ]
    with pytest.raises(ApiError) as refused:
        api.request(
            "PATCH", api.path("configmaps", SCRATCH, "stale"), stale, "application/json-patch+json"
        )
    assert refused.value.status == 422
    assert (api.get("configmaps", SCRATCH, "stale") or {})["data"] == {"a": "2"}


def test_emulator_serves_put_and_server_side_apply(api: ApiServer) -> None:
    applied = api.request(
        "PATCH",
        api.path("configmaps", SCRATCH, "applied"),
        {**_config_map("applied", a="1"), "metadata": {"name": "applied"}},
        "application/apply-patch+yaml",
    )
    assert applied["metadata"]["generation"] == 1 and applied["data"] == {"a": "1"}
    replaced = api.request(
        "PUT", api.path("configmaps", SCRATCH, "applied"), _config_map("applied", b="2")
    )
    assert replaced["data"] == {"b": "2"}  # a replace, not a merge
    assert replaced["metadata"]["uid"] == applied["metadata"]["uid"]
    with pytest.raises(ApiError) as missing:
        api.request("PUT", api.path("configmaps", SCRATCH, "absent"), _config_map("absent"))
    assert missing.value.status == 404


def test_emulator_answers_plain_application_json(api: ApiServer) -> None:
    # lightkube only raises its ApiError (status code inside) for exactly this content type.
    request = urllib.request.Request(api.url + api.path("configmaps", SCRATCH, "nothing"))
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(request, timeout=10)
    assert answer.value.code == 404
    assert answer.value.headers["Content-Type"] == "application/json"


# -- tests ---------------------------------------------------------------------------------------

OWNED = [
    ("statefulsets", f"{CLUSTER}-broker"),
    ("services", f"{CLUSTER}-broker"),
    ("services", f"{CLUSTER}-broker-headless"),
    ("deployments", f"{CLUSTER}-controller"),
    ("services", f"{CLUSTER}-controller"),
    ("deployments", f"{CLUSTER}-coordinator"),
    ("configmaps", f"{CLUSTER}-config"),
    ("poddisruptionbudgets", f"{CLUSTER}-broker"),
    ("poddisruptionbudgets", f"{CLUSTER}-controller"),
]


def test_cluster_objects_are_created_with_owner_references(
    api: ApiServer, fjord_cluster: dict[str, Any]
) -> None:
    uid = fjord_cluster["metadata"]["uid"]
    for plural, name in OWNED:
        obj = _get(api, plural, name)
        assert obj is not None, f"{plural}/{name} was not created"
        owners = obj["metadata"].get("ownerReferences", [])
        assert [(o["kind"], o["name"], o["uid"], o.get("controller")) for o in owners] == [
            ("FjordCluster", CLUSTER, uid, True)
        ], f"{plural}/{name} owners: {owners}"
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == CLUSTER
        assert labels["app.kubernetes.io/managed-by"] == MANAGED_BY
    sts = _get(api, "statefulsets", f"{CLUSTER}-broker")
    assert sts is not None
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["serviceName"] == f"{CLUSTER}-broker-headless"
    pdb = _get(api, "poddisruptionbudgets", f"{CLUSTER}-broker")
    assert pdb is not None and pdb["spec"]["maxUnavailable"] == 1
    assert fjord_cluster["status"]["brokers"] == 3


def test_topic_is_created_grown_refused_and_deleted(
    api: ApiServer, admin: AdminClient, fjord_cluster: dict[str, Any]
) -> None:
    api.create(
        "fjordtopics",
        NAMESPACE,
        _topic("orders-crd", 3, 2, {"retention.ms": "3600000"}, topic_name="orders"),
    )
    ready = _wait_ready(api, "fjordtopics", "orders-crd", RECONCILE_TIMEOUT_S)
    topic = _fjord_topic(admin, "orders")
    assert topic is not None
    assert len(topic.partitions) == 3
    assert all(len(p.replicas) == 2 for p in topic.partitions)
    assert _topic_config(admin, "orders", "retention.ms") == "3600000"
    assert ready["status"]["partitions"] == 3
    assert ready["status"]["topicId"] == topic.topic_id

    # Grow: 3 -> 5 partitions, and a config change.
    api.patch(
        "fjordtopics",
        NAMESPACE,
        "orders-crd",
        {"spec": {"partitions": 5, "config": {"retention.ms": "7200000"}}},
    )
    wait_for(
        lambda: (t := _fjord_topic(admin, "orders")) is not None and len(t.partitions) == 5,
        "orders to grow to 5 partitions",
        RECONCILE_TIMEOUT_S,
    )
    wait_for(
        lambda: _topic_config(admin, "orders", "retention.ms") == "7200000",
        "orders' retention.ms to change",
        RECONCILE_TIMEOUT_S,
    )
    _wait_ready(api, "fjordtopics", "orders-crd", RECONCILE_TIMEOUT_S)

    # A decrease is refused in status; Fjord keeps its 5 partitions.
    api.patch("fjordtopics", NAMESPACE, "orders-crd", {"spec": {"partitions": 2}})
    wait_for(
        lambda: (
            _condition_reason(api, "fjordtopics", "orders-crd", "Error")
            == "PartitionDecreaseRefused"
        ),
        "the decrease to be refused",
        RECONCILE_TIMEOUT_S,
    )
    refused = _get(api, "fjordtopics", "orders-crd")
    assert refused is not None
    assert condition_of(refused, "Ready")["status"] == "False"  # type: ignore[index]
    assert refused["status"]["partitions"] == 5
    topic = _fjord_topic(admin, "orders")
    assert topic is not None and len(topic.partitions) == 5

    # Delete: the finalizer deletes the Fjord topic, then releases the object.
    api.delete("fjordtopics", NAMESPACE, "orders-crd")
    wait_for(
        lambda: _get(api, "fjordtopics", "orders-crd") is None,
        "FjordTopic orders-crd to be released",
        RECONCILE_TIMEOUT_S,
    )
    wait_for(
        lambda: "orders" not in admin.list_topics(),
        "Fjord topic orders to be deleted",
        RECONCILE_TIMEOUT_S,
    )


def test_invalid_topic_config_is_refused_in_status(
    api: ApiServer, admin: AdminClient, fjord_cluster: dict[str, Any]
) -> None:
    # A codec Fjord does not know: the broker's typed error shows in status, nothing is created.
    api.create("fjordtopics", NAMESPACE, _topic("brotli", 1, 1, {"compression.type": "brotli"}))
    wait_for(
        lambda: _condition_reason(api, "fjordtopics", "brotli", "Error") == "InvalidConfig",
        "the invalid config to be refused",
        RECONCILE_TIMEOUT_S,
    )
    refused = _get(api, "fjordtopics", "brotli")
    assert refused is not None
    assert "compression.type" in condition_of(refused, "Error")["message"]  # type: ignore[index]
    assert "brotli" not in admin.list_topics()
    api.delete("fjordtopics", NAMESPACE, "brotli")
    wait_for(
        lambda: _get(api, "fjordtopics", "brotli") is None,
        "FjordTopic brotli to be released",
        RECONCILE_TIMEOUT_S,
    )


def test_topic_drift_is_corrected_on_the_timer(
    api: ApiServer, admin: AdminClient, fjord_cluster: dict[str, Any]
) -> None:
    api.create("fjordtopics", NAMESPACE, _topic("drift", 2, 2, {"retention.ms": "3600000"}))
    _wait_ready(api, "fjordtopics", "drift", RECONCILE_TIMEOUT_S)
    # Someone changes the config and then deletes the topic behind the operator's back.
    admin.alter_configs({"drift": {"retention.ms": "60000"}})
    wait_for(
        lambda: _topic_config(admin, "drift", "retention.ms") == "3600000",
        "the operator to restore retention.ms",
        RECONCILE_TIMEOUT_S,
    )
    old_id = _fjord_topic(admin, "drift").topic_id
    admin.delete_topics(["drift"])
    recreated = wait_for(
        lambda: (t := _fjord_topic(admin, "drift")) is not None and t.topic_id != old_id and t,
        "the operator to re-create topic drift",
        RECONCILE_TIMEOUT_S,
    )
    assert len(recreated.partitions) == 2
    assert all(len(p.replicas) == 2 for p in recreated.partitions)
    api.delete("fjordtopics", NAMESPACE, "drift")
    wait_for(lambda: "drift" not in admin.list_topics(), "topic drift deleted", RECONCILE_TIMEOUT_S)


def test_autoscaling_grows_partitions_under_ingress_up_to_the_maximum(
    api: ApiServer, admin: AdminClient, bootstrap: str, fjord_cluster: dict[str, Any]
) -> None:
    body = _topic("busy", 1, 2)
    # Any record between two samples exceeds 1 byte/s per partition (1000 bytes per record).
    body["spec"]["autoscaling"] = {
        "enabled": True,
        "minPartitions": 1,
        "maxPartitions": 3,
        "targetBytesPerSecondPerPartition": 1,
        "stabilizationWindowSeconds": 0,
    }
    body["metadata"]["annotations"] = {RECORD_BYTES_ANNOTATION: "1000"}
    api.create("fjordtopics", NAMESPACE, body)
    _wait_ready(api, "fjordtopics", "busy", RECONCILE_TIMEOUT_S)
    assert len(_fjord_topic(admin, "busy").partitions) == 1
    with Producer({"bootstrap.servers": bootstrap, "acks": "all"}) as producer:

        def produce_and_check() -> bool:
            producer.send("busy", value=b"x" * 1000).result(timeout=30)
            return len(_fjord_topic(admin, "busy").partitions) == 3

        wait_for(produce_and_check, "busy to grow to 3 partitions", RECONCILE_TIMEOUT_S)
    ready = wait_for(
        lambda: (o := _ready(api, "fjordtopics", "busy")) and o["status"]["partitions"] == 3 and o,
        "FjordTopic busy Ready with 3 partitions",
        RECONCILE_TIMEOUT_S,
    )
    assert ready["spec"]["partitions"] == 1  # the autoscaler's growth is not a decrease


AUTOSCALE_WINDOW_S = 20


def _window(api: ApiServer, name: str) -> list[dict[str, Any]]:
    """``status.autoscaling.samples`` of a FjordTopic (empty when it has none)."""
    status = (_get(api, "fjordtopics", name) or {}).get("status") or {}
    return list((status.get("autoscaling") or {}).get("samples") or [])


def test_a_restarted_operator_continues_the_autoscaling_window(
    api: ApiServer,
    admin: AdminClient,
    bootstrap: str,
    fjord_cluster: dict[str, Any],
    operator: Operator,
) -> None:
    """The operator is restarted when the ingress has been sampled for half the stabilization
    window: the new one continues that window from the FjordTopic's status (a fresh window
    would need the whole window again after the restart before it could grow the topic)."""
    body = _topic("steady", 1, 2)
    body["spec"]["autoscaling"] = {
        "enabled": True,
        "minPartitions": 1,
        "maxPartitions": 2,
        "targetBytesPerSecondPerPartition": 1,
        "stabilizationWindowSeconds": AUTOSCALE_WINDOW_S,
    }
    body["metadata"]["annotations"] = {RECORD_BYTES_ANNOTATION: "1000"}
    api.create("fjordtopics", NAMESPACE, body)
    _wait_ready(api, "fjordtopics", "steady", RECONCILE_TIMEOUT_S)
    stop = threading.Event()

    def produce() -> None:  # well above 1 byte/s all along
        with Producer({"bootstrap.servers": bootstrap, "acks": "all"}) as producer:
            while not stop.is_set():
                producer.send("steady", value=b"x" * 1000).result(timeout=30)
                stop.wait(0.1)

    producing = threading.Thread(target=produce, name="steady-producer", daemon=True)
    producing.start()
    try:
        half = wait_for(
            lambda: (w := _window(api, "steady")) and w[-1]["time"] - w[0]["time"] >= 10 and w,
            "half the stabilization window sampled",
            RECONCILE_TIMEOUT_S,
        )
        operator.stop()
        assert len(_fjord_topic(admin, "steady").partitions) == 1
        restarted_at = time.time()
        operator.start()
        wait_for(
            lambda: len(_fjord_topic(admin, "steady").partitions) == 2,
            "the restarted operator to grow steady",
            RECONCILE_TIMEOUT_S,
            interval=0.1,
        )
        grown_after_s = time.time() - restarted_at
    finally:
        stop.set()
        producing.join(RECONCILE_TIMEOUT_S)
    # The window the first operator began (its oldest sample before the restart) was
    # continued: growing this early needed the samples taken before the restart.
    assert half[0]["time"] < restarted_at - AUTOSCALE_WINDOW_S / 2
    assert grown_after_s < AUTOSCALE_WINDOW_S, f"grown {grown_after_s:.1f} s after the restart"
    # A growth starts a new window: the finished one leaves the status.
    wait_for(lambda: not _window(api, "steady"), "the finished window cleared", RECONCILE_TIMEOUT_S)


def _produce(bootstrap: str, topic: str, count: int) -> set[bytes]:
    values = {f"record-{i:05d}".encode() for i in range(count)}
    with Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True}
    ) as producer:
        futures = [producer.send(topic, value=v, key=v) for v in sorted(values)]
        producer.flush(timeout=60)
        for future in futures:
            future.result(timeout=60)
    return values


def _consume_all(bootstrap: str, topic: str, partitions: int, expected: int) -> list[bytes]:
    out: list[bytes] = []
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        seconds_until(  # the caller's assertion names what is missing
            lambda: out.extend(r.value or b"" for r in consumer.poll(0.5)) or len(out) >= expected,
            RECONCILE_TIMEOUT_S,
        )
    return out


def _brokers_hosting(admin: AdminClient, topic: str) -> set[int]:
    described = _fjord_topic(admin, topic)
    return {b for p in described.partitions for b in p.replicas} if described else set()


def test_scale_out_moves_partitions_and_scale_in_drains_first(
    api: ApiServer,
    admin: AdminClient,
    kubelet: Kubelet,
    bootstrap: str,
    fjord_cluster: dict[str, Any],
) -> None:
    api.create("fjordtopics", NAMESPACE, _topic("events", PARTITIONS, 2))
    _wait_ready(api, "fjordtopics", "events", RECONCILE_TIMEOUT_S)
    sent = _produce(bootstrap, "events", RECORDS)

    # 3 -> 5: the StatefulSet grows, brokers 3 and 4 register, partitions move onto them.
    api.patch("fjordclusters", NAMESPACE, CLUSTER, {"spec": {"brokers": {"replicas": 5}}})
    wait_for(lambda: kubelet.running() >= {3, 4}, "brokers 3 and 4 to start", SCALE_TIMEOUT_S)
    wait_for(
        lambda: {3, 4} <= _brokers_hosting(admin, "events"),
        "partitions of events to move onto brokers 3 and 4",
        SCALE_TIMEOUT_S,
    )
    _wait_ready(api, "fjordclusters", CLUSTER, SCALE_TIMEOUT_S)
    assert not admin.list_partition_reassignments()
    scaled = _get(api, "fjordclusters", CLUSTER)
    assert scaled is not None and scaled["status"]["brokers"] == 5

    # 5 -> 3: brokers 4 and 3 are drained before the StatefulSet shrinks.
    stops_before = len([e for e in kubelet.events if e.action == "stop"])
    api.patch("fjordclusters", NAMESPACE, CLUSTER, {"spec": {"brokers": {"replicas": 3}}})
    wait_for(
        lambda: not (kubelet.running() & {3, 4}), "brokers 3 and 4 to be stopped", SCALE_TIMEOUT_S
    )
    stops = [e for e in kubelet.events if e.action == "stop"][stops_before:]
    assert sorted(e.ordinal for e in stops) == [3, 4]
    for stop in stops:
        assert any(topic == "events" for topic, _ in stop.replicas_seen), "no snapshot taken"
        hosting = {tp: r for tp, r in stop.replicas_seen.items() if {3, 4} & set(r)}
        assert not hosting, f"broker {stop.ordinal} stopped while still hosting {hosting}"
    _wait_ready(api, "fjordclusters", CLUSTER, SCALE_TIMEOUT_S)
    assert _brokers_hosting(admin, "events") <= {0, 1, 2}

    received = _consume_all(bootstrap, "events", PARTITIONS, len(sent))
    assert len(received) == len(sent), "records were lost or duplicated"
    assert set(received) == sent


def test_scale_in_below_replication_factor_is_refused(
    api: ApiServer, admin: AdminClient, kubelet: Kubelet, fjord_cluster: dict[str, Any]
) -> None:
    api.create("fjordtopics", NAMESPACE, _topic("wide", 2, 3))
    _wait_ready(api, "fjordtopics", "wide", RECONCILE_TIMEOUT_S)
    api.patch("fjordclusters", NAMESPACE, CLUSTER, {"spec": {"brokers": {"replicas": 2}}})
    wait_for(
        lambda: (
            _condition_reason(api, "fjordclusters", CLUSTER, "Error")
            == "ScaleInWouldBreakReplication"
        ),
        "the scale-in refused",
        RECONCILE_TIMEOUT_S,
    )
    sts = _get(api, "statefulsets", f"{CLUSTER}-broker")
    assert sts is not None and sts["spec"]["replicas"] == 3
    assert kubelet.running() >= {0, 1, 2}
    topic = _fjord_topic(admin, "wide")
    assert topic is not None and all(len(p.replicas) == 3 for p in topic.partitions)
    # Asking for 3 again clears the refusal.
    api.patch("fjordclusters", NAMESPACE, CLUSTER, {"spec": {"brokers": {"replicas": 3}}})
    _wait_ready(api, "fjordclusters", CLUSTER, RECONCILE_TIMEOUT_S)


def test_operator_restarted_mid_scale_out_resumes_from_the_cluster_state(
    api: ApiServer,
    admin: AdminClient,
    kubelet: Kubelet,
    operator: Operator,
    fjord_cluster: dict[str, Any],
) -> None:
    # The first operator raises the StatefulSet, then goes away before broker 3 can register.
    kubelet.hold_starts.set()
    try:
        api.patch("fjordclusters", NAMESPACE, CLUSTER, {"spec": {"brokers": {"replicas": 4}}})
        wait_for(
            lambda: (_get(api, "statefulsets", f"{CLUSTER}-broker") or {})["spec"]["replicas"] == 4,
            "the StatefulSet raised to 4",
            RECONCILE_TIMEOUT_S,
        )
        operator.stop()
    finally:
        kubelet.hold_starts.clear()
    assert 3 not in _brokers_hosting(admin, "events")
    # A new operator (no memory of the first) finishes the scale-out from what it observes.
    operator.start()
    wait_for(
        lambda: 3 in _brokers_hosting(admin, "events"),
        "partitions moved onto broker 3",
        SCALE_TIMEOUT_S,
    )
    scaled = _wait_ready(api, "fjordclusters", CLUSTER, SCALE_TIMEOUT_S)
    assert scaled["status"]["brokers"] == 4
    # And back to 3, drained first.
    stops_before = len([e for e in kubelet.events if e.action == "stop"])
    api.patch("fjordclusters", NAMESPACE, CLUSTER, {"spec": {"brokers": {"replicas": 3}}})
    wait_for(lambda: 3 not in kubelet.running(), "broker 3 stopped", SCALE_TIMEOUT_S)
    (stop,) = [e for e in kubelet.events if e.action == "stop"][stops_before:]
    assert not {tp: r for tp, r in stop.replicas_seen.items() if 3 in r}
    _wait_ready(api, "fjordclusters", CLUSTER, SCALE_TIMEOUT_S)
