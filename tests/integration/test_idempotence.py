"""The idempotent producer against real processes (etcd, a controller, a broker on loopback).

A private cluster: one test restarts (and kills) the broker. By hand through the gRPC stub: a
duplicate batch gets its original offset, a gap is rejected, a stale epoch is fenced, and all of
it survives clean and unclean broker restarts. With the Producer: a broker killed mid-stream
leaves no duplicate and no reordering once the producer's retries have gone through.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.broker.producer_state import list_snapshots
from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.errors import ErrorCode
from fjord.local.cluster import LocalCluster
from fjord.records.builder import BatchBuilder
from fjord.testing.waiting import seconds_until

pytestmark = pytest.mark.integration

WAIT_S = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base = tmp_path_factory.mktemp("idempotence")
    with LocalCluster(
        base, brokers=1, controllers=1, broker_lease_ttl_s=2, coordinators=0,
        unsafe_etcd_no_fsync=True,
    ) as c:
        with AdminClient({"bootstrap.servers": c.bootstrap_servers}) as admin:
            admin.create_topics([NewTopic("by-hand", 1, 1), NewTopic("stream", 1, 1)])
        yield c


def stub(cluster: LocalCluster) -> broker_pb2_grpc.BrokerStub:
    channel = grpc.insecure_channel(cluster.address("broker", 0))
    return broker_pb2_grpc.BrokerStub(channel)


def batch(pid: int, epoch: int, seq: int, count: int, tag: str) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    for i in range(count):
        builder.append(int(time.time() * 1000), None, f"{tag}-{i}".encode())
    return builder.build()


def produce(cluster: LocalCluster, records: bytes, topic: str = "by-hand") -> tuple[str, int]:
    """(error name, base offset) of one Produce call, retried while the broker starts up."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            response = stub(cluster).Produce(
                broker_pb2.ProduceRequest(
                    acks=-1,
                    timeout_ms=10000,
                    topics=[
                        broker_pb2.ProduceTopic(
                            name=topic,
                            partitions=[broker_pb2.ProducePartition(partition=0, records=records)],
                        )
                    ],
                ),
                timeout=WAIT_S,
            )
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
            continue
        p = response.topics[0].partitions[0]
        name = ErrorCode.NONE.name if p.error.code == 0 else _code_name(p.error.code)
        if name in ("NOT_LEADER_OR_FOLLOWER", "UNKNOWN_TOPIC_OR_PARTITION", "LEADER_NOT_AVAILABLE"):
            if time.monotonic() > deadline:
                return name, p.base_offset
            time.sleep(0.1)
            continue
        return name, p.base_offset


def _code_name(number: int) -> str:
    return next(c.name for c in ErrorCode if c.code == number)


def log_end(cluster: LocalCluster, topic: str) -> int:
    """The partition's latest offset (high watermark), waiting out a leadership hand-over."""
    request = broker_pb2.ListOffsetsRequest(
        replica_id=-1,
        topics=[
            broker_pb2.ListOffsetsTopic(
                name=topic,
                partitions=[
                    broker_pb2.ListOffsetsPartition(
                        partition=0, timestamp=-1, current_leader_epoch=-1
                    )
                ],
            )
        ],
    )
    deadline = time.monotonic() + WAIT_S
    while True:
        p = stub(cluster).ListOffsets(request, timeout=WAIT_S).topics[0].partitions[0]
        if p.error.code == 0 or time.monotonic() > deadline:
            assert p.error.code == 0, p.error.message
            return p.offset
        time.sleep(0.1)


def init_producer_id(cluster: LocalCluster) -> tuple[int, int]:
    response = stub(cluster).InitProducerId(
        broker_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1), timeout=WAIT_S
    )
    assert response.error.code == 0, response.error.message
    return response.producer_id, response.producer_epoch


def restart_broker(cluster: LocalCluster, sig: int) -> None:
    cluster.kill("broker", 0, sig)
    cluster.start_broker(0)


def test_init_producer_id_hands_out_distinct_ids(cluster: LocalCluster) -> None:
    ids = {init_producer_id(cluster) for _ in range(5)}
    assert len(ids) == 5
    assert all(pid >= 0 and epoch == 0 for pid, epoch in ids)
    # A transactional id belongs to its transaction coordinator, not to a broker.
    response = stub(cluster).InitProducerId(
        broker_pb2.InitProducerIdRequest(transactional_id="tx", producer_id=-1), timeout=WAIT_S
    )
    assert response.error.code == ErrorCode.NOT_COORDINATOR.code


def test_duplicates_gaps_epochs_by_hand_and_across_restarts(cluster: LocalCluster) -> None:
    pid, epoch = init_producer_id(cluster)
    first = batch(pid, epoch, 0, 3, "a")
    second = batch(pid, epoch, 3, 2, "b")
    assert produce(cluster, first) == ("NONE", 0)
    assert produce(cluster, second) == ("NONE", 3)
    assert produce(cluster, first) == ("NONE", 0)  # the retry gets the original offset
    assert log_end(cluster, "by-hand") == 5  # and nothing was appended
    assert produce(cluster, batch(pid, epoch, 7, 1, "gap"))[0] == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    assert produce(cluster, batch(pid + 1000, 0, 4, 1, "u"))[0] == "UNKNOWN_PRODUCER_ID"
    assert log_end(cluster, "by-hand") == 5

    # A clean stop writes a snapshot; the restarted broker still knows the batches.
    restart_broker(cluster, signal.SIGTERM)
    data_dir = Path(cluster.data_dir) / "brokers" / "0" / "by-hand-0"
    assert list_snapshots(data_dir), "no producer snapshot after a clean shutdown"
    assert produce(cluster, second) == ("NONE", 3)
    assert log_end(cluster, "by-hand") == 5
    # An unclean stop (SIGKILL): the state is rebuilt from the snapshot plus the log's tail.
    third = batch(pid, epoch, 5, 4, "c")
    assert produce(cluster, third) == ("NONE", 5)
    restart_broker(cluster, signal.SIGKILL)
    assert produce(cluster, third) == ("NONE", 5)
    assert produce(cluster, first) == ("NONE", 0)
    assert log_end(cluster, "by-hand") == 9
    # A bumped epoch restarts at sequence 0 and fences the old one.
    assert produce(cluster, batch(pid, epoch + 1, 0, 1, "new")) == ("NONE", 9)
    assert produce(cluster, batch(pid, epoch, 9, 1, "zombie"))[0] == "INVALID_PRODUCER_EPOCH"
    assert log_end(cluster, "by-hand") == 10


def test_producer_retries_across_a_broker_kill_without_duplicates(cluster: LocalCluster) -> None:
    config = {
        "bootstrap.servers": cluster.bootstrap_servers,
        "linger.ms": 0,
        "batch.size": 2048,
        "request.timeout.ms": 3000,
        "delivery.timeout.ms": 60000,
        "retry.backoff.ms": 50,
    }
    total = 3000
    futures = []
    with Producer(config) as producer:
        for i in range(total):
            futures.append(producer.send("stream", f"{i:06d}".encode() * 8))
            if i == total // 3:
                producer.flush(WAIT_S)  # some batches are acknowledged before the kill
            if i == total // 2:
                # Requests are in flight: the broker dies with some appended but unanswered.
                cluster.kill("broker", 0, signal.SIGKILL)
                cluster.start_broker(0, wait=False)
        producer.flush(WAIT_S * 2)
    offsets = [f.result(0).offset for f in futures]
    assert offsets == sorted(offsets) and len(set(offsets)) == total
    values: list[bytes | None] = []
    with Consumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "auto.offset.reset": "earliest"}
    ) as consumer:
        consumer.assign([TopicPartition("stream", 0)])
        seconds_until(  # the assertions below name what is missing
            lambda: values.extend(r.value for r in consumer.poll(0.5)) or len(values) >= total,
            WAIT_S,
        )
    assert log_end(cluster, "stream") == total  # not one duplicate in the log
    assert values == [f"{i:06d}".encode() * 8 for i in range(total)]  # every record, in order
