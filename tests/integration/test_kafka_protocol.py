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
from fjord.kafka.defaults import COORDINATOR_NODE_ID_BASE
from fjord.records.builder import BatchBuilder
from fjord.testing.waiting import is_value, wait_for
from tests.helpers.kafka_wire import connect as _connect
from tests.helpers.kafka_wire import recv_exactly as _recv_exactly
from tests.helpers.kafka_wire import roundtrip as _roundtrip
from tests.helpers.kafka_wire import wait_for_topic as _wait_for_topic

pytestmark = pytest.mark.integration

WAIT_S = 30.0
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


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


@pytest.mark.skipif(
    shutil.which("kcat") is None, reason="kcat is not installed (`make kcat` installs it)"
)
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
        # Until its metadata has the topic, a broker says UNKNOWN_TOPIC_OR_PARTITION instead.
        _wait_for_topic(sock, topic)
        response = _roundtrip(sock, request, ProduceResponse, 9)
    assert response.responses[0].partition_responses[0].error_code == 6  # NOT_LEADER_OR_FOLLOWER


# --- every advertised version of the data-path APIs ------------------------------------------


def _batch() -> bytes:
    builder = BatchBuilder()
    builder.append(1_700_000_000_000, b"key", b"value")
    return builder.build()


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


def test_bad_frames_close_only_their_connection(
    local_cluster: Any, kafka_bootstrap: str, admin: AdminClient
) -> None:
    topic = make_topic(admin)
    producer = CKProducer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    written = [f"before-{i}".encode() for i in range(50)]
    for value in written:
        producer.produce(topic, value=value)
    assert producer.flush(WAIT_S) == 0
    leader = admin.describe_topics([topic])[0].partitions[0].leader
    address = local_cluster.kafka_broker_addresses[leader]
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
    with _connect(address) as sock:  # a corrupt RecordBatch: Produce's error, not a close
        batch = bytearray(_batch())
        batch[-1] ^= 0xFF  # the CRC no longer matches
        request = ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
            ProduceRequest[9].TopicProduceData(name=topic, partition_data=[
                ProduceRequest[9].TopicProduceData.PartitionProduceData(
                    index=0, records=bytes(batch))])])
        response = _roundtrip(sock, request, ProduceResponse, 9)
        assert response.responses[0].partition_responses[0].error_code == 2  # CORRUPT_MESSAGE
        assert 0 in _advertised(sock)  # the connection goes on
    many = [_connect(address) for _ in range(1000)]  # a thousand connections at once
    try:
        for sock in many:
            sock.sendall(_api_versions_frame())
        for sock in many:
            size = struct.unpack(">i", _recv_exactly(sock, 4))[0]
            assert ApiVersionsResponse.decode(_recv_exactly(sock, size), version=3,
                                              header=True).error_code == 0
    finally:
        for sock in many:
            sock.close()
    with _connect(address) as sock:  # the listener goes on
        assert 18 in _advertised(sock)
    stalled.close()
    # Nothing written before is lost, and the partition takes writes as before.
    assert [m.value() for m in ck_consume(kafka_bootstrap, topic, 1, 50)] == written
    producer.produce(topic, value=b"after")
    assert producer.flush(WAIT_S) == 0
    assert ck_consume(kafka_bootstrap, topic, 1, 51)[-1].value() == b"after"


def _api_versions_frame() -> bytes:
    request = ApiVersionsRequest[3](client_software_name="raw", client_software_version="1")
    request.with_header(correlation_id=1, client_id="many")
    return bytes(request.encode(version=3, header=True, framed=True))


# --- admin APIs ----------------------------------------------------------------------------------


def test_confluent_admin_client_topics_configs_records_cluster(kafka_bootstrap: str) -> None:
    from confluent_kafka.admin import (
        AdminClient as CKAdmin,
    )
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewPartitions,
    )
    from confluent_kafka.admin import (
        NewTopic as CKNewTopic,
    )

    client = CKAdmin({"bootstrap.servers": kafka_bootstrap})
    topic = new_name("adm")
    [created] = client.create_topics(
        [CKNewTopic(topic, 2, 1, config={"retention.ms": "3600000"})]
    ).values()
    assert created.result(WAIT_S) is None
    [again] = client.create_topics([CKNewTopic(topic, 2, 1)]).values()
    with pytest.raises(Exception, match="TOPIC_ALREADY_EXISTS"):
        again.result(WAIT_S)
    listing = client.list_topics(topic, timeout=WAIT_S)
    assert len(listing.topics[topic].partitions) == 2
    assert listing.controller_id in listing.brokers

    resource = ConfigResource("topic", topic)
    [described] = client.describe_configs([resource]).values()
    configs = described.result(WAIT_S)
    assert configs["retention.ms"].value == "3600000"
    assert configs["cleanup.policy"].value == "delete" and configs["cleanup.policy"].is_default

    change = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("segment.bytes", "1048576", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
    ])
    [altered] = client.incremental_alter_configs([change]).values()
    assert altered.result(WAIT_S) is None

    def described_configs() -> Any:
        [described] = client.describe_configs([resource]).values()
        return described.result(WAIT_S)

    # The broker answers from its metadata image, which follows etcd.
    configs = wait_for(described_configs, "segment.bytes altered",
                       accept=lambda c: c["segment.bytes"].value == "1048576")
    assert configs["retention.ms"].is_default

    [grown] = client.create_partitions([NewPartitions(topic, 3)]).values()
    assert grown.result(WAIT_S) is None

    producer = CKProducer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    for _ in range(10):
        producer.produce(topic, b"x", partition=0)
    assert producer.flush(WAIT_S) == 0
    [deleted] = client.delete_records([CKTopicPartition(topic, 0, 4)]).values()
    assert deleted.result(WAIT_S).low_watermark == 4
    consumer = CKConsumer({"bootstrap.servers": kafka_bootstrap, "group.id": new_name("u")})
    try:
        assert consumer.get_watermark_offsets(CKTopicPartition(topic, 0), WAIT_S) == (4, 10)
    finally:
        consumer.close()

    cluster = client.describe_cluster().result(WAIT_S)
    assert {n.id for n in cluster.nodes} == set(listing.brokers)

    [dropped] = client.delete_topics([topic]).values()
    assert dropped.result(WAIT_S) is None


def test_kafka_python_admin(kafka_bootstrap: str) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewPartitions
    from kafka.admin import NewTopic as KPNewTopic

    client = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        topic = new_name("kpa")
        client.create_topics([KPNewTopic(topic, 2, 1, topic_configs={"retention.ms": "5000000"})])
        assert topic in client.list_topics()
        [described] = client.describe_topics([topic])
        assert len(described["partitions"]) == 2
        resource = ConfigResource(ConfigResourceType.TOPIC, topic,
                                  configs={"retention.ms": "6000000"})
        client.alter_configs([resource])
        client.create_partitions({topic: NewPartitions(3)})
        cluster = client.describe_cluster()
        assert len(cluster["brokers"]) >= 1
        client.delete_topics([topic])
    finally:
        client.close()


def test_every_advertised_admin_version_answers(local_cluster: Any, admin: AdminClient) -> None:
    from kafka.protocol.admin.cluster import DescribeClusterRequest, DescribeClusterResponse
    from kafka.protocol.admin.configs import (
        AlterConfigsRequest,
        AlterConfigsResponse,
        DescribeConfigsRequest,
        DescribeConfigsResponse,
        IncrementalAlterConfigsRequest,
        IncrementalAlterConfigsResponse,
    )
    from kafka.protocol.admin.topics import (
        CreatePartitionsRequest,
        CreatePartitionsResponse,
        CreateTopicsRequest,
        CreateTopicsResponse,
        DeleteRecordsRequest,
        DeleteRecordsResponse,
        DeleteTopicsRequest,
        DeleteTopicsResponse,
    )
    from kafka.protocol.consumer.offsets import (
        OffsetForLeaderEpochRequest,
        OffsetForLeaderEpochResponse,
    )
    from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

    # Cluster-wide admin APIs: on a broker, and on a coordinator (a node in Metadata, so
    # clients that pick the least loaded node send them there too).
    coordinator = next(iter(local_cluster.kafka_coordinator_addresses.values()))
    for address in (local_cluster.kafka_broker_addresses[0], coordinator):
        with _connect(address) as sock:
            versions = _advertised(sock)
            for v in range(versions[19][0], versions[19][1] + 1):
                name = new_name(f"raw{v}")
                cls = CreateTopicsRequest[v]
                request = cls(timeout_ms=10000, validate_only=False, topics=[cls.CreatableTopic(
                    name=name, num_partitions=1, replication_factor=1, assignments=[],
                    configs=[cls.CreatableTopic.CreatableTopicConfig(name="retention.ms",
                                                                     value="7200000")])])
                [result] = _roundtrip(sock, request, CreateTopicsResponse, v).topics
                assert (result.name, result.error_code) == (name, 0), v
                _wait_for_topic(sock, name)
                for cv in range(versions[32][0], versions[32][1] + 1):
                    dcls = DescribeConfigsRequest[cv]
                    described = _roundtrip(sock, dcls(resources=[dcls.DescribeConfigsResource(
                        resource_type=2, resource_name=name, configuration_keys=["retention.ms"])],
                        include_synonyms=False, include_documentation=False),
                        DescribeConfigsResponse, cv)
                    [entry] = described.results[0].configs
                    assert (entry.name, entry.value) == ("retention.ms", "7200000"), (v, cv)
                if v == versions[19][0]:
                    for av in range(versions[33][0], versions[33][1] + 1):
                        acls = AlterConfigsRequest[av]
                        res = acls.AlterConfigsResource
                        altered = _roundtrip(sock, acls(validate_only=False, resources=[res(
                            resource_type=2, resource_name=name, configs=[res.AlterableConfig(
                                name="retention.ms", value=str(7200000 + av))])]),
                            AlterConfigsResponse, av)
                        assert altered.responses[0].error_code == 0, av
                    for iv in range(versions[44][0], versions[44][1] + 1):
                        icls = IncrementalAlterConfigsRequest[iv]
                        res = icls.AlterConfigsResource
                        altered = _roundtrip(sock, icls(validate_only=False, resources=[res(
                            resource_type=2, resource_name=name, configs=[res.AlterableConfig(
                                name="segment.ms", config_operation=0, value="600000")])]),
                            IncrementalAlterConfigsResponse, iv)
                        assert altered.responses[0].error_code == 0, iv
                    for pv in range(versions[37][0], versions[37][1] + 1):
                        pcls = CreatePartitionsRequest[pv]
                        grown = _roundtrip(sock, pcls(
                            timeout_ms=10000, validate_only=False, topics=[
                                pcls.CreatePartitionsTopic(name=name, count=2 + pv,
                                                           assignments=None)]),
                            CreatePartitionsResponse, pv)
                        assert grown.results[0].error_code == 0, pv
                        _wait_for_topic(sock, name, 2 + pv)
            for dv in range(versions[20][0], versions[20][1] + 1):
                name = make_topic(admin)
                dcls2 = DeleteTopicsRequest[dv]
                deleted = _roundtrip(sock, dcls2(topic_names=[name], timeout_ms=10000),
                                     DeleteTopicsResponse, dv)
                assert deleted.responses[0].error_code == 0, dv
            for cv in range(versions[60][0], versions[60][1] + 1):
                described = _roundtrip(sock, DescribeClusterRequest[cv](
                    include_cluster_authorized_operations=False, endpoint_type=1),
                    DescribeClusterResponse, cv)
                assert described.error_code == 0
                # Every node of the Metadata answer: brokers, and coordinators by their node id.
                assert {b.broker_id for b in described.brokers} == set(
                    local_cluster.kafka_broker_addresses) | {
                    COORDINATOR_NODE_ID_BASE + c for c in local_cluster.coordinator_addresses
                }, cv
            for iv in range(versions[22][0], versions[22][1] + 1):
                answer = _roundtrip(sock, InitProducerIdRequest[iv](
                    transactional_id=None, transaction_timeout_ms=60000, producer_id=-1,
                    producer_epoch=-1), InitProducerIdResponse, iv)
                assert answer.error_code == 0 and answer.producer_id >= 0, iv

    topic = make_topic(admin)
    leader = admin.describe_topics([topic])[0].partitions[0].leader
    with _connect(local_cluster.kafka_broker_addresses[leader]) as sock:
        versions = _advertised(sock)
        pcls = ProduceRequest[9]

        def produce_one() -> int:
            request = pcls(transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
                pcls.TopicProduceData(name=topic, partition_data=[
                    pcls.TopicProduceData.PartitionProduceData(index=0, records=_batch())])])
            return int(_roundtrip(sock, request, ProduceResponse, 9).responses[0]
                       .partition_responses[0].error_code)

        # The controller names the leader before that broker has opened the replica; until then
        # it answers NOT_LEADER_OR_FOLLOWER (6), on which every Kafka client retries.
        def leader_answered() -> int | None:
            code = produce_one()
            return None if code == 6 else code

        assert wait_for(leader_answered, f"{topic}'s leader accepting writes",
                        accept=is_value) == 0
        for _ in range(19):
            assert produce_one() == 0
        for ev in range(versions[23][0], versions[23][1] + 1):
            ecls = OffsetForLeaderEpochRequest[ev]
            answer = _roundtrip(sock, ecls(replica_id=-1, topics=[ecls.OffsetForLeaderTopic(
                topic=topic, partitions=[ecls.OffsetForLeaderTopic.OffsetForLeaderPartition(
                    partition=0, current_leader_epoch=-1, leader_epoch=0)])]),
                OffsetForLeaderEpochResponse, ev)
            part = answer.topics[0].partitions[0]
            assert (part.error_code, part.leader_epoch, part.end_offset) == (0, 0, 20), ev
        for rv in range(versions[21][0], versions[21][1] + 1):
            rcls = DeleteRecordsRequest[rv]
            answer = _roundtrip(sock, rcls(timeout_ms=5000, topics=[rcls.DeleteRecordsTopic(
                name=topic, partitions=[rcls.DeleteRecordsTopic.DeleteRecordsPartition(
                    partition_index=0, offset=rv + 1)])]), DeleteRecordsResponse, rv)
            part = answer.topics[0].partitions[0]
            assert (part.error_code, part.low_watermark) == (0, rv + 1), rv
        rcls = DeleteRecordsRequest[2]
        answer = _roundtrip(sock, rcls(timeout_ms=5000, topics=[rcls.DeleteRecordsTopic(
            name=topic, partitions=[rcls.DeleteRecordsTopic.DeleteRecordsPartition(
                partition_index=0, offset=21)])]), DeleteRecordsResponse, 2)
        assert answer.topics[0].partitions[0].error_code == 1  # OFFSET_OUT_OF_RANGE
