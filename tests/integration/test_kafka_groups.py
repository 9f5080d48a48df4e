"""Consumer groups over the Kafka listener of the group coordinators, against the shared local
cluster, with clients nobody here wrote: confluent-kafka groups with ``cooperative-sticky`` and
with ``range`` and their commits, a kafka-python group, a group mixing a fjord.client consumer
(gRPC) with a confluent-kafka one (Kafka protocol), AdminClient's group operations, and every
advertised version of the group APIs answering a raw request."""

from __future__ import annotations

import shutil
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import KafkaException
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient as CKAdmin
from kafka import KafkaConsumer
from kafka.protocol.admin.groups import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.find_coordinator import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
)
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse

from fjord.client import AdminClient, Consumer, NewTopic
from fjord.client import TopicPartition as FjordTopicPartition
from fjord.kafka.defaults import COORDINATOR_NODE_ID_BASE
from fjord.testing.waiting import wait_for
from tests.helpers.kafka_wire import connect as _connect
from tests.helpers.kafka_wire import roundtrip

pytestmark = pytest.mark.integration

WAIT_S = 40.0
PARTITIONS = 4


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> Iterator[AdminClient]:
    client = AdminClient({"bootstrap.servers": bootstrap, "default.api.timeout.ms": 20000})
    yield client
    client.close()


@pytest.fixture(scope="module")
def topic_with_records(admin: AdminClient, kafka_bootstrap: str) -> tuple[str, set[bytes]]:
    """A 4-partition topic holding 200 records (values unique), shared by the read-only group
    tests (each uses its own group)."""
    topic = new_name("g")
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, {})])
    producer = CKProducer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    values = {f"value-{i}".encode() for i in range(200)}
    for i, value in enumerate(sorted(values)):
        producer.produce(topic, key=f"k{i}".encode(), value=value)
    assert producer.flush(WAIT_S) == 0
    return topic, values


def ck_consumer(bootstrap: str, group: str, strategy: str, **extra: Any) -> CKConsumer:
    return CKConsumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "partition.assignment.strategy": strategy,
        "session.timeout.ms": 10000, "heartbeat.interval.ms": 500, **extra,
    })


def ck_assignment(consumer: CKConsumer) -> set[tuple[str, int]]:
    return {(tp.topic, tp.partition) for tp in consumer.assignment()}


def poll_until(consumers: list[Callable[[], None]], done: Callable[[], bool], what: str) -> None:
    """Poll every consumer in turn (one thread, short polls) until ``done()``."""

    def polled_until_done() -> bool:
        if done():
            return True
        for poll in consumers:
            poll()
        return False

    wait_for(polled_until_done, what, WAIT_S, interval=0)


def group_of_two_reads_everything(
    kafka_bootstrap: str, topic: str, values: set[bytes], strategy: str
) -> None:
    group = new_name(f"ck-{strategy}")
    first = ck_consumer(kafka_bootstrap, group, strategy)
    second = ck_consumer(kafka_bootstrap, group, strategy)
    seen: dict[bytes, int] = {}
    consumers = [first, second]

    def poller(consumer: CKConsumer) -> Callable[[], None]:
        def poll() -> None:
            message = consumer.poll(0.1)
            if message is None:
                return
            assert message.error() is None, message.error()
            seen[message.value()] = seen.get(message.value(), 0) + 1
        return poll

    try:
        first.subscribe([topic])
        second.subscribe([topic])
        polls = [poller(c) for c in consumers]
        every = {(topic, p) for p in range(PARTITIONS)}

        def split() -> bool:
            a, b = ck_assignment(first), ck_assignment(second)
            return bool(a) and bool(b) and not (a & b) and a | b == every

        poll_until(polls, split, f"{strategy} group of two to split {PARTITIONS} partitions")
        poll_until(polls, lambda: set(seen) == values, "every record")
        assert set(seen) == values
        for consumer in consumers:
            consumer.commit(asynchronous=False)
        committed = first.committed([CKTopicPartition(topic, p) for p in range(PARTITIONS)],
                                    timeout=WAIT_S)
        assert sum(tp.offset for tp in committed) == len(values)
    finally:
        for consumer in consumers:
            consumer.close()
    # A new member of the same group starts from the committed offsets: nothing left to read.
    again = ck_consumer(kafka_bootstrap, group, strategy)
    try:
        again.subscribe([topic])
        poll_until([lambda: None if again.poll(0.2) is None else pytest.fail("re-read")],
                   lambda: len(ck_assignment(again)) == PARTITIONS, "the lone member's assignment")
        positions = again.committed([CKTopicPartition(topic, p) for p in range(PARTITIONS)],
                                    timeout=WAIT_S)
        assert sum(tp.offset for tp in positions) == len(values)
    finally:
        again.close()


def test_confluent_group_cooperative_sticky(
    kafka_bootstrap: str, topic_with_records: tuple[str, set[bytes]]
) -> None:
    topic, values = topic_with_records
    group_of_two_reads_everything(kafka_bootstrap, topic, values, "cooperative-sticky")


def test_confluent_group_range(
    kafka_bootstrap: str, topic_with_records: tuple[str, set[bytes]]
) -> None:
    topic, values = topic_with_records
    group_of_two_reads_everything(kafka_bootstrap, topic, values, "range")


def test_kafka_python_group_reads_and_commits(
    kafka_bootstrap: str, bootstrap: str, topic_with_records: tuple[str, set[bytes]]
) -> None:
    topic, values = topic_with_records
    group = new_name("kp")
    consumer = KafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=int(WAIT_S * 1000))
    try:
        seen = set()
        for message in consumer:
            seen.add(message.value)
            if seen == values:
                break
        assert seen == values
        consumer.commit()
    finally:
        consumer.close()
    # The commit went to the same __consumer_offsets the gRPC side reads.
    native = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        committed = native.committed([FjordTopicPartition(topic, p) for p in range(PARTITIONS)])
        assert sum(offset or 0 for offset in committed.values()) == len(values)
    finally:
        native.close()


def test_mixed_group_fjord_client_and_confluent_split_partitions(
    kafka_bootstrap: str, bootstrap: str, topic_with_records: tuple[str, set[bytes]]
) -> None:
    topic, _ = topic_with_records
    group = new_name("mixed")
    native = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                       "auto.offset.reset": "earliest", "enable.auto.commit": False,
                       "partition.assignment.strategy": "range",
                       "session.timeout.ms": 10000, "heartbeat.interval.ms": 500})
    kafka = ck_consumer(kafka_bootstrap, group, "range")
    try:
        native.subscribe([topic])
        kafka.subscribe([topic])
        every = {(topic, p) for p in range(PARTITIONS)}

        def native_assignment() -> set[tuple[str, int]]:
            return {(tp.topic, tp.partition) for tp in native.assignment()}

        def split() -> bool:
            a, b = native_assignment(), ck_assignment(kafka)
            return bool(a) and bool(b) and not (a & b) and a | b == every

        poll_until([lambda: native.poll(0.1) and None, lambda: kafka.poll(0.1) and None], split,
                   "the mixed group to split the partitions")
        assert len(native_assignment()) == len(ck_assignment(kafka)) == PARTITIONS // 2
    finally:
        kafka.close()
        native.close()


def test_admin_client_lists_describes_deletes_groups(
    kafka_bootstrap: str, topic_with_records: tuple[str, set[bytes]]
) -> None:
    topic, _ = topic_with_records
    group = new_name("adm")
    consumer = ck_consumer(kafka_bootstrap, group, "range", **{"client.id": "described"})
    admin = CKAdmin({"bootstrap.servers": kafka_bootstrap})
    try:
        consumer.subscribe([topic])
        poll_until([lambda: consumer.poll(0.1) and None],
                   lambda: len(ck_assignment(consumer)) == PARTITIONS, "the assignment")
        consumer.commit(offsets=[CKTopicPartition(topic, 0, 1)], asynchronous=False)

        def described() -> Any:
            d = admin.describe_consumer_groups([group])[group].result(WAIT_S)
            return d if d.state.name == "STABLE" else None

        description = wait_for(described, "a Stable description", WAIT_S)
        assert description.partition_assignor == "range"
        (member,) = description.members
        assert member.client_id == "described" and member.host.startswith("/127.0.0.1")
        assert {tp.partition for tp in member.assignment.topic_partitions} == set(
            range(PARTITIONS))
        listed = admin.list_consumer_groups().result(WAIT_S)
        assert listed.errors == []
        assert group in {g.group_id for g in listed.valid}
        deleted = admin.delete_consumer_groups([group])[group]
        with pytest.raises(KafkaException, match="NON_EMPTY_GROUP"):
            deleted.result(WAIT_S)
    finally:
        consumer.close()
    admin.delete_consumer_groups([group])[group].result(WAIT_S)
    listed = admin.list_consumer_groups().result(WAIT_S)
    assert group not in {g.group_id for g in listed.valid}


# --- raw requests: every advertised version ------------------------------------------------------


def _roundtrip(sock: socket.socket, request: Any, response_class: Any, version: int) -> Any:
    return roundtrip(sock, request, response_class, version, correlation_id=version + 100,
                     client_id="raw-groups")


def _advertised(sock: socket.socket) -> dict[int, tuple[int, int]]:
    response = _roundtrip(sock, ApiVersionsRequest[3](client_software_name="raw",
                                                      client_software_version="1"),
                          ApiVersionsResponse, 3)
    return {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}


def _versions(advertised: dict[int, tuple[int, int]], key: int) -> range:
    low, high = advertised[key]
    return range(low, high + 1)


def _find(sock: socket.socket, group: str, version: int) -> tuple[int, str]:
    cls = FindCoordinatorRequest[version]
    if version >= 4:
        answer = _roundtrip(sock, cls(key_type=0, coordinator_keys=[group]),
                            FindCoordinatorResponse, version).coordinators[0]
    else:
        answer = _roundtrip(sock, cls(key=group, key_type=0), FindCoordinatorResponse, version)
    assert answer.error_code == 0, (version, answer)
    return answer.node_id, f"{answer.host}:{answer.port}"


def test_every_advertised_group_version_answers(
    local_cluster: Any, kafka_bootstrap: str, topic_with_records: tuple[str, set[bytes]]
) -> None:
    topic, _ = topic_with_records
    broker_address = kafka_bootstrap.split(",")[0]
    coordinators = set(local_cluster.kafka_coordinator_addresses.values())
    with _connect(broker_address) as sock:
        advertised = _advertised(sock)
        for v in _versions(advertised, 10):
            node, address = wait_for(lambda v=v: _find_ready(sock, v), "a coordinator", WAIT_S)
            assert node >= COORDINATOR_NODE_ID_BASE and address in coordinators
        listed = _roundtrip(sock, ListGroupsRequest[4](states_filter=[]), ListGroupsResponse, 4)
        assert listed.error_code == 0 and listed.groups == []  # brokers coordinate no group
        meta = _roundtrip(sock, MetadataRequest[12](topics=[], allow_auto_topic_creation=False),
                          MetadataResponse, 12)
        nodes = {f"{b.host}:{b.port}" for b in meta.brokers}
        assert coordinators <= nodes  # listed, or librdkafka would drop them
    for group_version in range(10):  # JoinGroup v0..v9, the other APIs at their nearest
        group = new_name(f"raw{group_version}")
        with _connect(broker_address) as sock:
            _, address = _find(sock, group, 3)
        with _connect(address) as sock:
            advertised = _advertised(sock)
            assert set(advertised) >= {3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 42}
            _one_member_round(sock, advertised, group, topic, group_version)


def _find_ready(sock: socket.socket, version: int) -> tuple[int, str] | None:
    try:
        return _find(sock, new_name("probe"), version)
    except AssertionError:
        return None


def _nearest(advertised: dict[int, tuple[int, int]], key: int, index: int) -> int:
    low, high = advertised[key]
    return min(max(index, low), high)


def _one_member_round(
    sock: socket.socket, advertised: dict[int, tuple[int, int]], group: str, topic: str,
    index: int,
) -> None:
    """Join, sync, heartbeat, commit, fetch, describe, leave, delete one group with the
    ``index``-th version of each API (clamped to its range)."""
    v = {key: _nearest(advertised, key, index) for key in (8, 9, 11, 12, 13, 14, 15, 16, 42)}
    join_cls = JoinGroupRequest[v[11]]
    join = join_cls(group_id=group, session_timeout_ms=10000, rebalance_timeout_ms=10000,
                    member_id="", group_instance_id=None, protocol_type="consumer",
                    protocols=[join_cls.JoinGroupRequestProtocol(name="range", metadata=b"md")],
                    reason=None)
    loading = (14, 15)  # COORDINATOR_LOAD_IN_PROGRESS / _NOT_AVAILABLE: clients retry
    joined = wait_for(lambda: _roundtrip(sock, join, JoinGroupResponse, v[11]),
                      "the group's partition to load", WAIT_S,
                      accept=lambda r: r.error_code not in loading)
    if v[11] >= 4:
        assert joined.error_code == 79, joined  # MEMBER_ID_REQUIRED
        join.member_id = joined.member_id
        joined = _roundtrip(sock, join, JoinGroupResponse, v[11])
    assert joined.error_code == 0 and joined.leader == joined.member_id, (index, joined)
    member, generation = joined.member_id, joined.generation_id
    assert [m.metadata for m in joined.members] == [b"md"]
    sync_cls = SyncGroupRequest[v[14]]
    synced = _roundtrip(sock, sync_cls(
        group_id=group, generation_id=generation, member_id=member, group_instance_id=None,
        protocol_type="consumer", protocol_name="range",
        assignments=[sync_cls.SyncGroupRequestAssignment(member_id=member, assignment=b"as")],
    ), SyncGroupResponse, v[14])
    assert synced.error_code == 0 and synced.assignment == b"as", (index, synced)
    beat = _roundtrip(sock, HeartbeatRequest[v[12]](
        group_id=group, generation_id=generation, member_id=member, group_instance_id=None,
    ), HeartbeatResponse, v[12])
    assert beat.error_code == 0, (index, beat)
    commit_cls = OffsetCommitRequest[v[8]]
    topic_cls = commit_cls.OffsetCommitRequestTopic
    committed = _roundtrip(sock, commit_cls(
        group_id=group, generation_id_or_member_epoch=generation, member_id=member,
        group_instance_id=None, retention_time_ms=-1,
        topics=[topic_cls(name=topic, partitions=[topic_cls.OffsetCommitRequestPartition(
            partition_index=1, committed_offset=7, committed_leader_epoch=-1,
            committed_metadata="m")])],
    ), OffsetCommitResponse, v[8])
    assert [p.error_code for t in committed.topics for p in t.partitions] == [0], index
    fetch_cls = OffsetFetchRequest[v[9]]
    if v[9] >= 8:
        group_cls = fetch_cls.OffsetFetchRequestGroup
        request = fetch_cls(groups=[group_cls(group_id=group, member_id=None, member_epoch=-1,
                                              topics=[group_cls.OffsetFetchRequestTopics(
                                                  name=topic, partition_indexes=[1, 2])])],
                            require_stable=False)
        fetched = _roundtrip(sock, request, OffsetFetchResponse, v[9]).groups[0]
    else:
        request = fetch_cls(group_id=group, require_stable=False, topics=[
            fetch_cls.OffsetFetchRequestTopic(name=topic, partition_indexes=[1, 2])])
        fetched = _roundtrip(sock, request, OffsetFetchResponse, v[9])
    assert fetched.error_code == 0 if v[9] >= 2 else True
    offsets = {p.partition_index: (p.committed_offset, p.metadata)
               for t in fetched.topics for p in t.partitions}
    assert offsets == {1: (7, "m"), 2: (-1, "")}, index
    described = _roundtrip(sock, DescribeGroupsRequest[v[15]](
        groups=[group], include_authorized_operations=False), DescribeGroupsResponse, v[15])
    (d,) = described.groups
    assert (d.error_code, d.group_state, d.protocol_data) == (0, "Stable", "range"), index
    assert [bytes(m.member_assignment) for m in d.members] == [b"as"]
    listed = _roundtrip(sock, ListGroupsRequest[v[16]](states_filter=["Stable"],
                                                      types_filter=[]), ListGroupsResponse, v[16])
    assert group in {g.group_id for g in listed.groups}, index
    leave_cls = LeaveGroupRequest[v[13]]
    left = _roundtrip(sock, leave_cls(group_id=group, member_id=member, members=[
        leave_cls.MemberIdentity(member_id=member, group_instance_id=None, reason=None)]),
        LeaveGroupResponse, v[13])
    assert left.error_code == 0 and all(m.error_code == 0 for m in left.members or []), index
    deleted = _roundtrip(sock, DeleteGroupsRequest[v[42]](groups_names=[group]),
                         DeleteGroupsResponse, v[42])
    assert [(r.group_id, r.error_code) for r in deleted.results] == [(group, 0)], index


def test_coordinator_answers_what_clients_send_any_node(
    local_cluster: Any, topic_with_records: tuple[str, set[bytes]]
) -> None:
    """A coordinator is listed in Metadata, so clients also send it Metadata, FindCoordinator,
    InitProducerId (forwarded to a broker) and the admin APIs (swept in test_kafka_protocol's
    test_every_advertised_admin_version_answers): every advertised version answers."""
    from kafka.protocol.admin.cluster import DescribeClusterRequest, DescribeClusterResponse
    from kafka.protocol.admin.configs import DescribeConfigsRequest, DescribeConfigsResponse
    from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

    topic, _ = topic_with_records
    for address in local_cluster.kafka_coordinator_addresses.values():
        with _connect(address) as sock:
            advertised = _advertised(sock)
            # The ACL APIs (29-31) and the SCRAM credential APIs (50-51) are forwarded to the
            # controller by the same handlers as on brokers, proven in test_acls and test_sasl;
            # the transaction APIs (24-26, 28) are proven with confluent-kafka's transactional
            # producer in test_transaction_coordinator.
            assert set(advertised) == {3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 19, 20, 22, 24,
                                       25, 26, 28, 29, 30, 31, 32, 33, 37, 42, 44, 50, 51, 60,
                                       65, 66}
            for v in _versions(advertised, 3):
                cls = MetadataRequest[v]
                meta = _roundtrip(sock, cls(topics=[cls.MetadataRequestTopic(name=topic)],
                                            allow_auto_topic_creation=False),
                                  MetadataResponse, v)
                assert [len(t.partitions) for t in meta.topics] == [PARTITIONS], v
                assert v == 0 or meta.controller_id in local_cluster.kafka_broker_addresses, v
            for v in _versions(advertised, 10):
                node, _ = wait_for(lambda v=v: _find_ready(sock, v), "a coordinator", WAIT_S)
                assert node >= COORDINATOR_NODE_ID_BASE, v
            ids = set()
            for v in _versions(advertised, 22):
                answer = _roundtrip(sock, InitProducerIdRequest[v](
                    transactional_id=None, transaction_timeout_ms=60000, producer_id=-1,
                    producer_epoch=-1), InitProducerIdResponse, v)
                assert answer.error_code == 0 and answer.producer_id >= 0, v
                ids.add(answer.producer_id)
            assert len(ids) == len(_versions(advertised, 22))  # never the same id twice
            for v in _versions(advertised, 32):
                cls = DescribeConfigsRequest[v]
                described = _roundtrip(sock, cls(resources=[cls.DescribeConfigsResource(
                    resource_type=2, resource_name=topic, configuration_keys=None)],
                    include_synonyms=False, include_documentation=False),
                    DescribeConfigsResponse, v)
                assert described.results[0].error_code == 0, v
                assert any(c.name == "retention.ms" for c in described.results[0].configs), v
            for v in _versions(advertised, 60):
                cluster = _roundtrip(sock, DescribeClusterRequest[v](
                    include_cluster_authorized_operations=False, endpoint_type=1),
                    DescribeClusterResponse, v)
                assert cluster.error_code == 0, v
                assert {f"{b.host}:{b.port}" for b in cluster.brokers} >= {address}, v


@pytest.mark.skipif(
    shutil.which("kcat") is None, reason="kcat is not installed (`make kcat` installs it)"
)
def test_kcat_balanced_consumer_group(
    kafka_bootstrap: str, topic_with_records: tuple[str, set[bytes]]
) -> None:
    topic, values = topic_with_records
    read = subprocess.run(
        ["kcat", "-b", kafka_bootstrap, "-G", new_name("kcat"), "-X", "auto.offset.reset=earliest",
         "-e", "-f", "%s\n", topic],
        capture_output=True, timeout=WAIT_S, check=True,
    )
    assert set(read.stdout.splitlines()) == values
