"""A broker's direct door (fjord.broker.direct_door) spoken with a raw socket: Produce and Fetch
as protobuf frames on plain TCP (fjord.direct_frames), its refusals and closes, its place in
Metadata, and a stopping broker closing its connections.

One small cluster per module (etcd, a controller, one broker whose LocalCluster opens its
direct door); the stop test runs last: it stops the broker and starts it again.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.client import AdminClient, NewTopic
from fjord.direct_client import DirectConnection
from fjord.direct_frames import (
    ACCEPTED,
    HELLO_FETCH,
    HELLO_PRODUCE,
    MAGIC,
    REFUSED,
    STATUS_ERROR,
    STATUS_OK,
    frame_prefix,
)
from fjord.local.cluster import LocalCluster
from fjord.local.etcd import free_port, stop_process
from fjord.records import BatchBuilder, read_batches
from fjord.testing.waiting import is_value, wait_for
from tests.helpers.metrics import metric_value

pytestmark = pytest.mark.integration

WAIT_S = 30.0
BROKER = 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("direct-door"), brokers=1, controllers=1, coordinators=0,
        cluster_id=f"direct-{uuid.uuid4().hex[:8]}", unsafe_etcd_no_fsync=True,
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def topic(cluster: LocalCluster) -> str:
    """A one-partition topic whose leader serves it."""
    name = f"d-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers,
                         "default.api.timeout.ms": 20000})
    try:
        admin.create_topics([NewTopic(name, 1, 1)])
    finally:
        admin.close()
    wait_serving(cluster, name)
    return name


def wait_serving(cluster: LocalCluster, topic: str) -> None:
    """Until the broker serves the partition (a leader just named answers
    NOT_LEADER_OR_FOLLOWER until it has opened its replica)."""
    request = broker_pb2.ListOffsetsRequest(replica_id=-1)
    request.topics.add(name=topic).partitions.add(partition=0, timestamp=-1,
                                                  current_leader_epoch=-1)

    def serves() -> bool:
        with grpc.insecure_channel(cluster.address("broker", BROKER)) as channel:
            try:
                answer = broker_pb2_grpc.BrokerStub(channel).ListOffsets(request, timeout=5)
            except grpc.RpcError:
                return False
        return answer.topics[0].partitions[0].error.code == 0

    wait_for(serves, f"broker {BROKER} serving {topic}", WAIT_S)


# --- a raw direct-door client -----------------------------------------------------------------


def open_door(cluster: LocalCluster, hello: bytes | None) -> socket.socket:
    """A connection to the broker's direct door, its hello sent and ACCEPTED (``hello`` None:
    nothing sent)."""
    host, _, port = cluster.direct_address(BROKER).rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
    if hello is not None:
        sock.sendall(hello)
        assert read_exactly(sock, len(ACCEPTED)) == ACCEPTED
    return sock


def read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def send(sock: socket.socket, *messages: bytes) -> None:
    sock.sendall(b"".join(frame_prefix(len(m)) + m for m in messages))


def answer(sock: socket.socket) -> tuple[int, bytes]:
    (length,) = struct.unpack(">I", read_exactly(sock, 4))
    frame = read_exactly(sock, length)
    return frame[0], frame[1:]


def closed(sock: socket.socket) -> bool:
    """The broker closed the connection (EOF, or a reset) before sending more bytes."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def batch(values: list[bytes]) -> bytes:
    builder = BatchBuilder(batch_size=1 << 30)
    now = int(time.time() * 1000)
    for value in values:
        builder.append(now, None, value)
    return builder.build()


def produce_request(topic: str, values: list[bytes]) -> broker_pb2.ProduceRequest:
    request = broker_pb2.ProduceRequest(acks=-1, timeout_ms=10_000)
    request.topics.add(name=topic).partitions.add(partition=0, records=batch(values))
    return request


def fetch_request(topic: str, offset: int, max_wait_ms: int = 0) -> broker_pb2.FetchRequest:
    request = broker_pb2.FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1,
                                      max_bytes=1 << 20)
    request.topics.add(name=topic).partitions.add(
        partition=0, fetch_offset=offset, partition_max_bytes=1 << 20, current_leader_epoch=-1)
    return request


def produced_offset(sock: socket.socket) -> int:
    status, payload = answer(sock)
    assert status == STATUS_OK, payload
    partition = broker_pb2.ProduceResponse.FromString(payload).topics[0].partitions[0]
    assert partition.error.code == 0, partition.error.message
    return int(partition.base_offset)


# --- tests ------------------------------------------------------------------------------------


def test_produce_then_fetch_returns_the_records(cluster: LocalCluster, topic: str) -> None:
    with open_door(cluster, HELLO_PRODUCE) as producer:
        send(producer, produce_request(topic, [b"a", b"b", b"c"]).SerializeToString())
        base = produced_offset(producer)
    with open_door(cluster, HELLO_FETCH) as consumer:
        send(consumer, fetch_request(topic, base).SerializeToString())
        status, payload = answer(consumer)
        assert status == STATUS_OK, payload
        partition = broker_pb2.FetchResponse.FromString(payload).topics[0].partitions[0]
        assert partition.error.code == 0, partition.error.message
        values = [bytes(r.value or b"") for b in read_batches(partition.records)
                  for r in b.records() if r.offset >= base]
        assert values[:3] == [b"a", b"b", b"c"]
        assert partition.high_watermark >= base + 3


def test_pipelined_produce_requests_are_answered_in_order(
    cluster: LocalCluster, topic: str
) -> None:
    """24 requests written at once (more than the 16 a connection runs together): each
    answer belongs to its request, in order, so the base offsets grow by each request's
    record count. Each request counts as a Produce in the broker's RPC metrics, and the open
    connection shows in fjord_broker_open_streams."""
    metrics = cluster.metrics_address("broker", BROKER)
    produced_before = metric_value(metrics, "fjord_rpc_server_requests_total",
                                   method="fjord.v1.Broker/Produce")
    sizes = [1 + i % 4 for i in range(24)]
    with open_door(cluster, HELLO_PRODUCE) as producer:
        send(producer, *(produce_request(topic, [b"x"] * n).SerializeToString() for n in sizes))
        bases = [produced_offset(producer) for _ in sizes]
        assert metric_value(metrics, "fjord_broker_open_streams",
                            method="fjord.direct/Produce") >= 1
    assert [b - bases[0] for b in bases] == [sum(sizes[:i]) for i in range(len(sizes))]
    assert metric_value(metrics, "fjord_rpc_server_requests_total",
                        method="fjord.v1.Broker/Produce") >= produced_before + len(sizes)


def test_the_direct_client_produces_and_fetches_through_the_door(
    cluster: LocalCluster, topic: str
) -> None:
    """fjord.direct_client against the real door: twenty Produce calls at once, answered
    each to its caller, then fetched back in order."""
    host, _, port = cluster.direct_address(BROKER).rpartition(":")

    async def round_trip() -> list[bytes]:
        producer: DirectConnection[broker_pb2.ProduceRequest, broker_pb2.ProduceResponse] = \
            DirectConnection(host, int(port), HELLO_PRODUCE,
                             broker_pb2.ProduceResponse.FromString, name="test producer")
        consumer: DirectConnection[broker_pb2.FetchRequest, broker_pb2.FetchResponse] = \
            DirectConnection(host, int(port), HELLO_FETCH, broker_pb2.FetchResponse.FromString,
                             name="test consumer")
        try:
            answers = await asyncio.gather(*(
                producer.call(produce_request(topic, [b"c%d" % i]), WAIT_S) for i in range(20)))
            offsets = [a.topics[0].partitions[0].base_offset for a in answers]
            assert all(a.topics[0].partitions[0].error.code == 0 for a in answers)
            fetched = await consumer.call(fetch_request(topic, min(offsets)), WAIT_S)
            partition = fetched.topics[0].partitions[0]
            by_offset = {r.offset: bytes(r.value or b"") for b in read_batches(partition.records)
                         for r in b.records()}
            return [by_offset[o] for o in offsets]
        finally:
            producer.close()
            consumer.close()

    assert asyncio.run(round_trip()) == [b"c%d" % i for i in range(20)]


def test_a_malformed_request_is_answered_with_an_error_and_closes(
    cluster: LocalCluster, topic: str
) -> None:
    """The request before it is answered; the frame that is not a ProduceRequest gets an
    error frame naming why, then the connection closes."""
    with open_door(cluster, HELLO_PRODUCE) as producer:
        send(producer, produce_request(topic, [b"ok"]).SerializeToString(), b"\xff\xff\xff\xff")
        produced_offset(producer)
        status, why = answer(producer)
        assert status == STATUS_ERROR
        assert b"malformed ProduceRequest" in why
        assert closed(producer)


def test_a_bad_hello_closes_unanswered(cluster: LocalCluster) -> None:
    with open_door(cluster, None) as sock:
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        assert closed(sock)


def test_an_unknown_kind_is_refused(cluster: LocalCluster) -> None:
    with open_door(cluster, None) as sock:
        sock.sendall(MAGIC + b"X")
        assert read_exactly(sock, len(REFUSED)) == REFUSED
        assert closed(sock)


def test_an_over_long_frame_closes_and_the_broker_serves_on(
    cluster: LocalCluster, topic: str
) -> None:
    with open_door(cluster, HELLO_PRODUCE) as sock:
        sock.sendall(struct.pack(">I", 0xFFFF_FFFF) + b"\x00" * 16)
        assert closed(sock)
    with open_door(cluster, HELLO_PRODUCE) as producer:
        send(producer, produce_request(topic, [b"after"]).SerializeToString())
        produced_offset(producer)


def test_metadata_names_the_direct_door_of_brokers_that_open_one(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Broker 0 (LocalCluster opens its door) is named with it; a broker started without
    ``--direct-listen`` is named without one."""
    grpc_port = free_port()
    log_path = tmp_path / "broker-1.log"
    plain = subprocess.Popen(
        [sys.executable, "-c", "from fjord.cli.broker_cmd import broker; broker()",
         "--id=1", f"--listen=127.0.0.1:{grpc_port}", f"--data-dir={tmp_path / 'data'}",
         f"--etcd={cluster.etcd_url}", f"--cluster-id={cluster.cluster_id}", "--lease-ttl=3"],
        stdout=log_path.open("ab"), stderr=subprocess.STDOUT,
    )
    try:
        def both() -> dict[int, tuple[str, int]] | None:
            metadata = cluster.broker_metadata(BROKER)
            if metadata is None or len(metadata.brokers) < 2:
                return None
            return {b.id: (b.direct_host, b.direct_port) for b in metadata.brokers}

        doors = wait_for(both, "both brokers in Metadata", WAIT_S, accept=is_value)
        host, _, port = cluster.direct_address(BROKER).rpartition(":")
        assert doors == {BROKER: (host, int(port)), 1: ("", 0)}
    finally:
        stop_process(plain, 10)


def test_a_stopping_broker_closes_its_direct_connections(
    cluster: LocalCluster, topic: str
) -> None:
    """A Fetch parked for a minute (at the log end) does not hold a stopping broker: the
    connection closes within seconds. The broker starts again on the same door port."""
    address = cluster.direct_address(BROKER)
    with open_door(cluster, HELLO_PRODUCE) as producer:
        send(producer, produce_request(topic, [b"end"]).SerializeToString())
        end = produced_offset(producer) + 1
    with open_door(cluster, HELLO_FETCH) as consumer:
        send(consumer, fetch_request(topic, end, max_wait_ms=60_000).SerializeToString())
        metrics = cluster.metrics_address("broker", BROKER)
        wait_for(lambda: metric_value(metrics, "fjord_broker_purgatory_size",
                                      operation="fetch") >= 1, "the fetch parked", WAIT_S)
        started = time.monotonic()
        cluster.process("broker", BROKER).send_signal(signal.SIGTERM)
        consumer.settimeout(15)
        assert closed(consumer)
        assert time.monotonic() - started < 15
    cluster.process("broker", BROKER).wait(WAIT_S)
    cluster.start_broker(BROKER)
    assert cluster.direct_address(BROKER) == address
    wait_serving(cluster, topic)
    with open_door(cluster, HELLO_PRODUCE) as producer:
        send(producer, produce_request(topic, [b"again"]).SerializeToString())
        assert produced_offset(producer) >= end
