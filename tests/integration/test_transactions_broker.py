"""The broker side of transactions against real processes (etcd, a controller, three brokers on
loopback). Transactional batches are produced by hand through the gRPC API and transactions are
ended with WriteTxnMarkers, as the transaction coordinator does: under read_committed aborted
records are never seen (raw Fetch and fjord.client's Consumer), read_uncommitted sees them, the
last stable offset holds reads back while a transaction is open, a SIGKILLed and restarted
broker keeps its LSO and aborted index, and a follower elected leader has the same state.
Through the Kafka-protocol door: WriteTxnMarkers (API 27), Fetch v12 and ListOffsets with
isolation_level=1, and confluent-kafka's and kafka-python's read_committed consumers.

A private cluster (tests kill brokers); every test leaves all brokers running.
"""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import TopicPartition as CKTopicPartition

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KPTopicPartition
    from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
    from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse
    from kafka.protocol.producer.transaction import WriteTxnMarkersRequest as KafkaWriteTxnMarkers
    from kafka.protocol.producer.transaction import (
        WriteTxnMarkersResponse as KafkaWriteTxnMarkersResponse,
    )

from fjord._proto import broker_pb2, broker_pb2_grpc, common_pb2
from fjord.broker.replica_manager import DEBUGGING_REPLICA_ID
from fjord.cli.main import cli
from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.errors import error_code_from_number
from fjord.local.cluster import LocalCluster
from fjord.records import BatchBuilder, read_batches
from fjord.testing.waiting import is_value, wait_for
from tests.helpers.kafka_wire import connect, roundtrip

pytestmark = pytest.mark.integration

BROKERS = (0, 1, 2)
WAIT_S = 30.0
FAILOVER_WAIT_S = 90.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("txn-broker"), brokers=3, controllers=1, coordinators=0,
        cluster_id=f"txn-{uuid.uuid4().hex[:8]}", broker_lease_ttl_s=2,
        unsafe_etcd_no_fsync=True,
        # A dead broker leaves the ISRs within seconds (the failover test waits for that).
        config={"replica.lag.time.max.ms": "5000"},
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster) -> Iterator[AdminClient]:
    client = AdminClient(
        {"bootstrap.servers": cluster.bootstrap_servers, "default.api.timeout.ms": 20000}
    )
    yield client
    client.close()


@pytest.fixture(autouse=True)
def all_brokers_running(cluster: LocalCluster) -> Iterator[None]:
    yield
    for b in BROKERS:
        if cluster.process("broker", b).poll() is not None:
            cluster.start_broker(b)


# --- helpers ------------------------------------------------------------------------------


def stub(cluster: LocalCluster, broker: int) -> broker_pb2_grpc.BrokerStub:
    return broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.address("broker", broker)))


def new_topic(admin: AdminClient, replicas: int) -> str:
    name = f"txn-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(name, 1, replicas, {"min.insync.replicas": "1"})])
    return name


def leader_of(
    cluster: LocalCluster, topic: str, not_: int | None = None, timeout: float = WAIT_S
) -> int:
    """The partition's leader once it serves (ListOffsets answers without error)."""

    def serving() -> int | None:
        for b in BROKERS:
            if b == not_ or cluster.process("broker", b).poll() is not None:
                continue
            request = broker_pb2.ListOffsetsRequest(replica_id=-1)
            request.topics.add(name=topic).partitions.add(partition=0, timestamp=-1,
                                                          current_leader_epoch=-1)
            try:
                out = stub(cluster, b).ListOffsets(request, timeout=5).topics[0].partitions[0]
            except grpc.RpcError:
                continue
            if out.error.code == 0:
                return b
        return None

    return wait_for(serving, f"a serving leader of {topic}", timeout, accept=is_value)


def txn_batch(pid: int, seq: int, values: list[str], epoch: int = 0) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                           is_transactional=True)
    for v in values:
        builder.append(int(time.time() * 1000), None, v.encode())
    return builder.build()


def plain(values: list[str]) -> bytes:
    builder = BatchBuilder()
    for v in values:
        builder.append(int(time.time() * 1000), None, v.encode())
    return builder.build()


def produce(cluster: LocalCluster, broker: int, topic: str, records: bytes) -> int:
    request = broker_pb2.ProduceRequest(acks=-1, timeout_ms=15000)
    request.topics.add(name=topic).partitions.add(partition=0, records=records)
    out = stub(cluster, broker).Produce(request, timeout=25).topics[0].partitions[0]
    assert out.error.code == 0, out.error.message
    return int(out.base_offset)


def end_txns(
    cluster: LocalCluster, broker: int, topic: str, *ends: tuple[int, int, bool]
) -> list[str]:
    """WriteTxnMarkers for (producer id, epoch, committed) on the topic's partition 0; the
    error name of each."""
    request = broker_pb2.WriteTxnMarkersRequest()
    for pid, epoch, committed in ends:
        request.markers.add(
            producer_id=pid, producer_epoch=epoch, committed=committed, coordinator_epoch=1,
            partitions=[common_pb2.TopicPartition(topic=topic, partition=0)],
        )
    response = stub(cluster, broker).WriteTxnMarkers(request, timeout=25)
    return [error_code_from_number(m.partitions[0].error.code).name for m in response.markers]


def fetch(
    cluster: LocalCluster, broker: int, topic: str, offset: int, isolation: int
) -> broker_pb2.FetchPartitionResponse:
    request = broker_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, max_bytes=1 << 22,
                                      isolation_level=isolation)
    request.topics.add(name=topic).partitions.add(
        partition=0, fetch_offset=offset, partition_max_bytes=1 << 22, current_leader_epoch=-1
    )
    out = stub(cluster, broker).Fetch(request, timeout=10).topics[0].partitions[0]
    assert out.error.code == 0, out.error.message
    return out


def data_offsets(out: broker_pb2.FetchPartitionResponse) -> list[int]:
    return [b.base_offset for b in read_batches(out.records) if not b.header.is_control]


def consume_values(cluster: LocalCluster, topic: str, isolation: str, end: int) -> list[str]:
    """Every value a fjord.client Consumer with ``isolation.level`` returns until its
    position reaches ``end``."""
    tp = TopicPartition(topic, 0)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                         "isolation.level": isolation, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([tp])
        values: list[str] = []
        deadline = time.monotonic() + WAIT_S
        while consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"stuck at {consumer.position(tp)} < {end}"
            values.extend((r.value or b"").decode() for r in consumer.poll(0.5))
        return values
    finally:
        consumer.close()


def replicated_end(cluster: LocalCluster, topic: str, broker: int) -> int:
    request = broker_pb2.ListOffsetsRequest(replica_id=DEBUGGING_REPLICA_ID)
    request.topics.add(name=topic).partitions.add(partition=0, timestamp=-1,
                                                  current_leader_epoch=-1)
    out = stub(cluster, broker).ListOffsets(request, timeout=5).topics[0].partitions[0]
    return int(out.offset) if out.error.code == 0 else -1


# --- tests --------------------------------------------------------------------------------


def test_read_committed_hides_open_and_aborted_transactions(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    topic = new_topic(admin, replicas=3)
    leader = leader_of(cluster, topic)
    a, b = 910_001, 910_002
    produce(cluster, leader, topic, plain(["p0"]))  # 0
    produce(cluster, leader, topic, txn_batch(a, 0, ["a1", "a2"]))  # 1-2
    # The open transaction holds read_committed back at its first offset.
    committed = fetch(cluster, leader, topic, 0, 1)
    assert (committed.high_watermark, committed.last_stable_offset) == (3, 1)
    assert data_offsets(committed) == [0]
    assert data_offsets(fetch(cluster, leader, topic, 0, 0)) == [0, 1]
    assert consume_values(cluster, topic, "read_committed", 1) == ["p0"]
    tp = TopicPartition(topic, 0)
    lags = {}
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                             "isolation.level": isolation, "max.poll.records": 1})
        try:
            consumer.assign([tp])
            consumer.seek(tp, 1)
            assert consumer.current_lag(tp) is None  # no fetch answer yet

            moved_to = 1 if isolation == "read_committed" else 2

            def lag(c: Consumer = consumer, moved_to: int = moved_to) -> int | None:
                c.poll(0.2)  # at most one record: read_uncommitted moves to 2
                return c.current_lag(tp) if c.position(tp) == moved_to else None

            lags[isolation] = wait_for(lag, f"a fetch answer ({isolation})",
                                       accept=lambda found: found is not None)
            if isolation == "read_committed":
                assert consumer.end_offsets([tp]) == {tp: 1}  # the LSO
        finally:
            consumer.close()
    # read_committed: position 1, measured to the LSO (1); read_uncommitted: position 2 after
    # one record, measured to the high watermark (3).
    assert lags == {"read_committed": 0, "read_uncommitted": 1}

    produce(cluster, leader, topic, txn_batch(b, 0, ["b3"]))  # 3
    produce(cluster, leader, topic, txn_batch(a, 2, ["a4"]))  # 4
    assert end_txns(cluster, leader, topic, (a, 0, False), (b, 0, True)) == ["NONE", "NONE"]
    produce(cluster, leader, topic, plain(["p7"]))  # 5: ABORT a, 6: COMMIT b, 7
    out = fetch(cluster, leader, topic, 0, 1)
    assert out.last_stable_offset == out.high_watermark == 8
    assert [(t.producer_id, t.first_offset) for t in out.aborted_transactions] == [(a, 1)]
    assert not fetch(cluster, leader, topic, 0, 0).aborted_transactions  # only read_committed
    assert fetch(cluster, leader, topic, 5, 1).aborted_transactions[0].first_offset == 1
    assert not fetch(cluster, leader, topic, 6, 1).aborted_transactions

    assert consume_values(cluster, topic, "read_committed", 8) == ["p0", "b3", "p7"]
    printed = CliRunner().invoke(cli, [
        "consume", "--bootstrap-server", cluster.bootstrap_servers, "--topic", topic,
        "--from-beginning", "--isolation-level", "read_committed", "--max-messages", "3",
    ])
    assert printed.exit_code == 0, printed.output
    assert printed.output.splitlines()[:3] == ["p0", "b3", "p7"]  # then "Processed ..."
    assert consume_values(cluster, topic, "read_uncommitted", 8) == [
        "p0", "a1", "a2", "b3", "a4", "p7"
    ]

    # Zombie fencing: once the producer wrote with epoch 1, a marker of epoch 0 is refused.
    produce(cluster, leader, topic, txn_batch(a, 0, ["a8"], epoch=1))  # 8
    assert end_txns(cluster, leader, topic, (a, 0, True)) == ["INVALID_PRODUCER_EPOCH"]
    assert fetch(cluster, leader, topic, 0, 1).last_stable_offset == 8
    assert end_txns(cluster, leader, topic, (a, 1, True)) == ["NONE"]
    assert consume_values(cluster, topic, "read_committed", 10)[-1] == "a8"
    # Only a topic's leader writes markers; a follower answers NOT_LEADER_OR_FOLLOWER.
    follower = next(x for x in BROKERS if x != leader)
    assert end_txns(cluster, follower, topic, (a, 1, False)) == ["NOT_LEADER_OR_FOLLOWER"]


def test_restarted_broker_keeps_lso_and_aborted_index(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    topic = new_topic(admin, replicas=1)
    broker = leader_of(cluster, topic)
    c, d = 920_001, 920_002
    produce(cluster, broker, topic, txn_batch(d, 0, ["d0"]))  # 0
    assert end_txns(cluster, broker, topic, (d, 0, False)) == ["NONE"]  # 1
    produce(cluster, broker, topic, txn_batch(c, 0, ["c2"]))  # 2: open
    cluster.kill("broker", broker)  # SIGKILL: an unclean stop
    cluster.start_broker(broker)
    assert leader_of(cluster, topic, timeout=FAILOVER_WAIT_S) == broker
    out = fetch(cluster, broker, topic, 0, 1)
    assert (out.high_watermark, out.last_stable_offset) == (3, 2)
    assert [(t.producer_id, t.first_offset) for t in out.aborted_transactions] == [(d, 0)]
    assert end_txns(cluster, broker, topic, (c, 0, True)) == ["NONE"]  # 3
    assert consume_values(cluster, topic, "read_committed", 4) == ["c2"]


def test_follower_elected_leader_has_the_same_transactions(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    topic = new_topic(admin, replicas=3)
    old = leader_of(cluster, topic)
    e, f = 930_001, 930_002
    produce(cluster, old, topic, txn_batch(e, 0, ["e0", "e1"]))  # 0-1
    produce(cluster, old, topic, txn_batch(f, 0, ["f2"]))  # 2: stays open
    assert end_txns(cluster, old, topic, (e, 0, False)) == ["NONE"]  # 3
    wait_for(lambda: all(replicated_end(cluster, topic, b) == 4 for b in BROKERS),
             "every replica at 4")
    cluster.kill("broker", old)
    # Lease expiry, election, the new leader opening the partition: slow on a loaded machine.
    new = leader_of(cluster, topic, not_=old, timeout=FAILOVER_WAIT_S)
    # A new leader starts from the high watermark it last heard as a follower, which may lag;
    # it moves to 4 once the ISR without the dead broker proves it (Kafka's rule).
    out = wait_for(lambda: fetch(cluster, new, topic, 0, 1), "the new leader's high watermark",
                   FAILOVER_WAIT_S, accept=lambda answer: answer.high_watermark == 4)
    assert (out.high_watermark, out.last_stable_offset) == (4, 2)
    assert [(t.producer_id, t.first_offset) for t in out.aborted_transactions] == [(e, 0)]
    assert end_txns(cluster, new, topic, (f, 0, True)) == ["NONE"]  # 4
    assert consume_values(cluster, topic, "read_committed", 5) == ["f2"]


# --- the Kafka-protocol door ---------------------------------------------------------------


def _kafka_roundtrip(address: str, request: Any, response_class: Any, version: int) -> Any:
    with connect(address) as sock:
        return roundtrip(sock, request, response_class, version, client_id="txn-test")


def ck_values(cluster: LocalCluster, topic: str, isolation: str, expected: int) -> list[str]:
    return ck_values_at(cluster.kafka_bootstrap_servers, topic, isolation, expected)


def ck_values_at(servers: str, topic: str, isolation: str, expected: int) -> list[str]:
    """The values confluent-kafka's consumer with ``isolation.level`` reads from ``topic``-0
    (``expected`` of them, then nothing more within a second)."""
    consumer = CKConsumer({
        "bootstrap.servers": servers, "group.id": "unused",
        "isolation.level": isolation, "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    try:
        consumer.assign([CKTopicPartition(topic, 0, 0)])
        values: list[str] = []
        deadline = time.monotonic() + WAIT_S
        while len(values) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value().decode())
        # Nothing more arrives (an aborted record would come after the last committed one).
        extra = consumer.poll(1.0)
        assert extra is None or extra.error() is not None, extra.value()
        return values
    finally:
        consumer.close()


def kp_committed_values(servers: str, topic: str, expected: int) -> list[str]:
    """The values kafka-python's read_committed consumer reads from ``topic``-0: ``expected`` of
    them (a bounded wait), then nothing more within a second. Not ``consumer_timeout_ms``: its
    idle time counts from the first iteration, connecting and the first fetches included, so a
    loaded machine's slow start ended the iteration with nothing read."""
    consumer = KafkaConsumer(bootstrap_servers=servers, isolation_level="read_committed",
                             enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        consumer.assign([KPTopicPartition(topic, 0)])
        values: list[str] = []

        def read() -> list[Any]:
            return [r.value.decode() for records in consumer.poll(timeout_ms=500).values()
                    for r in records]

        wait_for(lambda: values.extend(read()) or len(values) >= expected,
                 f"{expected} committed values read by kafka-python", WAIT_S)
        # Nothing more arrives (an aborted record would come after the last committed one).
        extra = read() + read()
        assert not extra, extra
        return values
    finally:
        consumer.close()


def test_kafka_clients_read_committed_and_write_txn_markers_api(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    topic = new_topic(admin, replicas=3)
    leader = leader_of(cluster, topic)
    g, h = 940_001, 940_002
    produce(cluster, leader, topic, txn_batch(g, 0, ["g0", "g1"]))  # 0-1: aborted
    produce(cluster, leader, topic, txn_batch(h, 0, ["h2"]))  # 2: committed
    address = cluster.kafka_broker_addresses[leader]
    # ListOffsets latest, read_committed: the LSO (0, the open transaction of g).
    cls = ListOffsetsRequest[5]
    listed = _kafka_roundtrip(address, cls(replica_id=-1, isolation_level=1, topics=[
        cls.ListOffsetsTopic(name=topic, partitions=[
            cls.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=0, current_leader_epoch=-1, timestamp=-1)])]),
        ListOffsetsResponse, 5)
    assert listed.topics[0].partitions[0].offset == 0
    # WriteTxnMarkers (API 27) over Kafka's protocol: ABORT g, COMMIT h.
    cls = KafkaWriteTxnMarkers[1]
    markers = [
        cls.WritableTxnMarker(producer_id=pid, producer_epoch=0, transaction_result=commit,
                              coordinator_epoch=3, topics=[cls.WritableTxnMarker.
                              WritableTxnMarkerTopic(name=topic, partition_indexes=[0])])
        for pid, commit in ((g, False), (h, True))
    ]
    written = _kafka_roundtrip(address, cls(markers=markers), KafkaWriteTxnMarkersResponse, 1)
    assert [m.topics[0].partitions[0].error_code for m in written.markers] == [0, 0]
    produce(cluster, leader, topic, plain(["p5"]))  # 3: ABORT g, 4: COMMIT h, 5
    # Fetch v12 read_committed: the aborted transaction and the LSO, as Kafka answers.
    cls = FetchRequest[12]
    fetched = _kafka_roundtrip(address, cls(
        replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=1,
        session_id=0, session_epoch=-1, topics=[cls.FetchTopic(topic=topic, partitions=[
            cls.FetchTopic.FetchPartition(partition=0, fetch_offset=0,
                                          partition_max_bytes=1 << 20, current_leader_epoch=-1,
                                          last_fetched_epoch=-1, log_start_offset=-1)])],
        forgotten_topics_data=[], rack_id=""), FetchResponse, 12)
    data = fetched.responses[0].partitions[0]
    assert (data.error_code, data.last_stable_offset, data.high_watermark) == (0, 6, 6)
    assert [(a.producer_id, a.first_offset) for a in data.aborted_transactions] == [(g, 0)]

    assert ck_values(cluster, topic, "read_committed", 2) == ["h2", "p5"]
    assert ck_values(cluster, topic, "read_uncommitted", 4) == ["g0", "g1", "h2", "p5"]
    assert kp_committed_values(cluster.kafka_bootstrap_servers, topic, 2) == ["h2", "p5"]


def test_kafka_consumers_read_committed_from_the_transactional_producer(
    bootstrap: str, kafka_bootstrap: str
) -> None:
    """fjord.client's transactional producer (through the coordinator) on the shared cluster;
    confluent-kafka and kafka-python read_committed consumers see only the committed
    transactions, read_uncommitted sees the aborted one too."""
    topic = f"txn-kc-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as shared_admin:
        shared_admin.create_topics([NewTopic(topic, 1, 3)])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1,
                         "transactional.id": f"txn-kc-{uuid.uuid4().hex[:8]}"})
    try:
        producer.init_transactions(60)
        for outcome in ("commit", "abort", "commit"):
            producer.begin_transaction()
            for i in range(3):
                producer.send(topic, f"{outcome}-{i}".encode())
            producer.flush(60)
            if outcome == "commit":
                producer.commit_transaction(60)
            else:
                producer.abort_transaction(60)
    finally:
        producer.close(10)
    committed = [f"commit-{i}" for i in range(3)] * 2
    everything = committed[:3] + [f"abort-{i}" for i in range(3)] + committed[3:]
    assert ck_values_at(kafka_bootstrap, topic, "read_committed", 6) == committed
    assert ck_values_at(kafka_bootstrap, topic, "read_uncommitted", 9) == everything
    assert kp_committed_values(kafka_bootstrap, topic, 6) == committed
