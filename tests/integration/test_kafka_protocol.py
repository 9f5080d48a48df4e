"""The Kafka-protocol listener against the shared local cluster, with clients nobody here wrote:
confluent-kafka (librdkafka), kafka-python and Debian's kcat; records cross between Kafka
clients and fjord.client byte for byte; every advertised version of the data-path APIs answers
a raw request; bad input closes only the offending connection."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KPTopicPartition
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.records.builder import BatchBuilder

pytestmark = pytest.mark.integration

WAIT_S = 30.0
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def kafka_bootstrap(local_cluster: Any) -> str:
    return str(local_cluster.kafka_bootstrap_servers)


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> Iterator[AdminClient]:
    client = AdminClient({"bootstrap.servers": bootstrap, "default.api.timeout.ms": 20000})
    yield client
    client.close()


def make_topic(admin: AdminClient, partitions: int = 1, rf: int = 1) -> str:
    name = new_name("k")
    admin.create_topics([NewTopic(name, partitions, rf, {})])
    return name


def ck_consume(bootstrap: str, topic: str, partitions: int, n: int) -> list[Any]:
    consumer = CKConsumer({"bootstrap.servers": bootstrap, "group.id": new_name("unused"),
                           "enable.auto.commit": False})
    try:
        consumer.assign([CKTopicPartition(topic, p, 0) for p in range(partitions)])
        out: list[Any] = []
        deadline = time.monotonic() + WAIT_S
        while len(out) < n and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            out.append(message)
        return out
    finally:
        consumer.close()


def fjord_consume(bootstrap: str, topic: str, partitions: int, n: int) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        out: list[Any] = []
        deadline = time.monotonic() + WAIT_S
        while len(out) < n and time.monotonic() < deadline:
            out.extend(consumer.poll(0.5))
        return out
    finally:
        consumer.close()


# --- real clients ---------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_idempotent_producer_every_codec_read_by_both(
    kafka_bootstrap: str, bootstrap: str, admin: AdminClient, codec: str
) -> None:
    topic = make_topic(admin, partitions=2)
    producer = CKProducer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True,
                           "acks": "all", "compression.type": codec, "linger.ms": 5})
    errors: list[Any] = []
    sent = []
    for i in range(200):
        key, value = f"k{i}".encode(), bytes([i % 256]) * (50 + i)
        headers = [("h", f"x{i}".encode()), ("empty", b"")]
        ts = 1_700_000_000_000 + i
        sent.append((key, value, headers, ts))
        producer.produce(topic, key=key, value=value, headers=headers, timestamp=ts,
                         on_delivery=lambda err, _m: errors.append(err) if err else None)
    assert producer.flush(WAIT_S) == 0
    assert errors == []
    got = ck_consume(kafka_bootstrap, topic, 2, 200)
    assert sorted((m.key(), m.value(), m.headers(), m.timestamp()[1]) for m in got) == sorted(
        (k, v, h, ts) for k, v, h, ts in sent
    )
    native = fjord_consume(bootstrap, topic, 2, 200)
    assert sorted((r.key, r.value, [(k, v) for k, v in r.headers], r.timestamp)
                  for r in native) == sorted(sent)


def test_fjord_client_records_read_by_confluent_and_kafka_python(
    kafka_bootstrap: str, bootstrap: str, admin: AdminClient
) -> None:
    topic = make_topic(admin)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    sent = [(f"k{i}".encode(), f"value {i}".encode() * 3, (("a", b"1"), ("b", None)),
             1_700_000_000_000 + i) for i in range(50)]
    for key, value, headers, ts in sent:
        producer.send(topic, value=value, key=key, headers=list(headers), timestamp_ms=ts)
    producer.flush()
    producer.close()
    got = ck_consume(kafka_bootstrap, topic, 1, 50)
    assert [(m.key(), m.value(), m.headers(), m.timestamp()[1]) for m in got] == [
        (k, v, list(h), ts) for k, v, h, ts in sent
    ]
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=int(WAIT_S * 1000))
    try:
        consumer.assign([KPTopicPartition(topic, 0)])
        records = []
        for record in consumer:
            records.append(record)
            if len(records) == 50:
                break
    finally:
        consumer.close()
    assert [(r.key, r.value, r.headers, r.timestamp) for r in records] == [
        (k, v, list(h), ts) for k, v, h, ts in sent
    ]


def test_kafka_python_producer_read_by_fjord_client(
    kafka_bootstrap: str, bootstrap: str, admin: AdminClient
) -> None:
    topic = make_topic(admin, partitions=3)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all",
                             enable_idempotence=True, compression_type="gzip")
    sent = []
    for i in range(90):
        key, value = f"key-{i}".encode(), f"v{i}".encode()
        ts = 1_700_000_100_000 + i
        producer.send(topic, key=key, value=value, headers=[("n", str(i).encode())],
                      timestamp_ms=ts)
        sent.append((key, value, [("n", str(i).encode())], ts))
    producer.flush(timeout=WAIT_S)
    producer.close()
    native = fjord_consume(bootstrap, topic, 3, 90)
    assert sorted((r.key, r.value, list(r.headers), r.timestamp) for r in native) == sorted(sent)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed (make deps)")
def test_kcat_metadata_produce_consume(kafka_bootstrap: str, admin: AdminClient) -> None:
    topic = make_topic(admin)
    listing = subprocess.run(["kcat", "-b", kafka_bootstrap, "-L", "-t", topic],
                             capture_output=True, text=True, timeout=WAIT_S, check=True)
    assert f'topic "{topic}" with 1 partitions' in listing.stdout
    subprocess.run(["kcat", "-b", kafka_bootstrap, "-P", "-t", topic, "-p", "0", "-K", ":"],
                   input="k1:one\nk2:two\n", text=True, timeout=WAIT_S, check=True)
    read = subprocess.run(
        ["kcat", "-b", kafka_bootstrap, "-C", "-t", topic, "-p", "0", "-e", "-f", "%o %k %s\n"],
        capture_output=True, text=True, timeout=WAIT_S, check=True,
    )
    assert read.stdout.splitlines() == ["0 k1 one", "1 k2 two"]


def test_non_leader_answers_not_leader_or_follower(
    local_cluster: Any, admin: AdminClient
) -> None:
    topic = make_topic(admin)
    leader = admin.describe_topics([topic])[0].partitions[0].leader
    others = [i for i in local_cluster.kafka_broker_addresses if i != leader]
    assert others, "needs at least two brokers"
    request = ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=5000, topic_data=[
        ProduceRequest[9].TopicProduceData(name=topic, partition_data=[
            ProduceRequest[9].TopicProduceData.PartitionProduceData(index=0, records=_batch())
        ])
    ])
    with _connect(local_cluster.kafka_broker_addresses[others[0]]) as sock:
        response = _roundtrip(sock, request, ProduceResponse, 9)
    assert response.responses[0].partition_responses[0].error_code == 6  # NOT_LEADER_OR_FOLLOWER


# --- every advertised version of the data-path APIs ------------------------------------------


def _batch() -> bytes:
    builder = BatchBuilder()
    builder.append(1_700_000_000_000, b"key", b"value")
    return builder.build()


def _connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
    return sock


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _roundtrip(sock: socket.socket, request: Any, response_class: Any, version: int,
               correlation_id: int = 1) -> Any:
    request.with_header(correlation_id=correlation_id, client_id="raw-test")
    sock.sendall(request.encode(version=version, header=True, framed=True))
    size = struct.unpack(">i", _recv_exactly(sock, 4))[0]
    body = _recv_exactly(sock, size)
    response = response_class.decode(body, version=version, header=True)
    assert response.header.correlation_id == correlation_id
    return response


def _advertised(sock: socket.socket) -> dict[int, tuple[int, int]]:
    response = _roundtrip(sock, ApiVersionsRequest[3](client_software_name="raw",
                                                      client_software_version="1"),
                          ApiVersionsResponse, 3)
    assert response.error_code == 0
    return {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}


def test_every_advertised_data_path_version_answers(
    local_cluster: Any, admin: AdminClient
) -> None:
    topic = make_topic(admin)
    leader = admin.describe_topics([topic])[0].partitions[0].leader
    with _connect(local_cluster.kafka_broker_addresses[leader]) as sock:
        versions = _advertised(sock)
        low, high = versions[3]
        for v in range(low, high + 1):
            cls = MetadataRequest[v]
            topics = [cls.MetadataRequestTopic(name=topic)] if v < 10 else [
                cls.MetadataRequestTopic(name=topic, topic_id=uuid.UUID(int=0))]
            meta = _roundtrip(sock, cls(topics=topics, allow_auto_topic_creation=False),
                              MetadataResponse, v)
            assert [t.name for t in meta.topics] == [topic], v
            assert meta.topics[0].partitions[0].leader_id == leader, v
        low, high = versions[0]
        for v in range(low, high + 1):
            cls = ProduceRequest[v]
            request = cls(transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
                cls.TopicProduceData(name=topic, partition_data=[
                    cls.TopicProduceData.PartitionProduceData(index=0, records=_batch())
                ])
            ])
            produced = _roundtrip(sock, request, ProduceResponse, v)
            part = produced.responses[0].partition_responses[0]
            assert part.error_code == 0 and part.base_offset == v - low, v
        count = versions[0][1] - versions[0][0] + 1
        low, high = versions[1]
        for v in range(low, high + 1):
            cls = FetchRequest[v]
            request = cls(replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=1 << 20,
                          isolation_level=0, session_id=0, session_epoch=-1, topics=[
                              cls.FetchTopic(topic=topic, partitions=[
                                  cls.FetchTopic.FetchPartition(
                                      partition=0, fetch_offset=0, partition_max_bytes=1 << 20,
                                      current_leader_epoch=-1, last_fetched_epoch=-1,
                                      log_start_offset=-1)
                              ])
                          ], forgotten_topics_data=[], rack_id="")
            fetched = _roundtrip(sock, request, FetchResponse, v)
            data = fetched.responses[0].partitions[0]
            assert data.error_code == 0 and data.high_watermark == count, v
            assert bytes(data.records).count(b"value") == count, v
        low, high = versions[2]
        for v in range(low, high + 1):
            cls = ListOffsetsRequest[v]
            request = cls(replica_id=-1, isolation_level=0, topics=[
                cls.ListOffsetsTopic(name=topic, partitions=[
                    cls.ListOffsetsTopic.ListOffsetsPartition(
                        partition_index=0, current_leader_epoch=-1, timestamp=-1)
                ])
            ])
            listed = _roundtrip(sock, request, ListOffsetsResponse, v)
            assert listed.topics[0].partitions[0].offset == count, v


# --- bad input ---------------------------------------------------------------------------------


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(WAIT_S)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_bad_frames_close_only_their_connection(local_cluster: Any) -> None:
    address = local_cluster.kafka_broker_addresses[0]
    stalled = _connect(address)
    stalled.sendall(struct.pack(">i", 100) + b"\x00\x03")  # half a frame, then nothing
    cases = {
        "oversized": struct.pack(">i", 200 * 1024 * 1024),
        "negative size": struct.pack(">i", -5),
        "shorter than a header": struct.pack(">i", 3) + b"\x00\x03\x00",
        "unknown api key": struct.pack(">ihhi", 8, 9999, 0, 7),
        "unsupported version": struct.pack(">ihhi", 8, 0, 99, 7),
        "garbage body": struct.pack(">ihhih", 12, 3, 9, 7, 300) + b"\xff\xff",
    }
    for what, frame in cases.items():
        with _connect(address) as sock:
            sock.sendall(frame)
            assert _closed(sock), what
    with _connect(address) as sock:  # ApiVersions at an unknown version: v0 answer, error 35
        sock.sendall(struct.pack(">ihhih", 10, 18, 99, 42, -1))
        size = struct.unpack(">i", _recv_exactly(sock, 4))[0]
        answer = ApiVersionsResponse.decode(_recv_exactly(sock, size), version=0, header=True)
        assert answer.header.correlation_id == 42 and answer.error_code == 35
        assert any(k.api_key == 18 for k in answer.api_keys)
    many = [_connect(address) for _ in range(300)]
    try:
        for sock in many[::30]:
            assert _advertised(sock)[0][1] >= 9
    finally:
        for sock in many:
            sock.close()
    with _connect(address) as sock:  # the listener goes on
        assert 18 in _advertised(sock)
    stalled.close()
