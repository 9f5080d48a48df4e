"""The Kafka group APIs' translation (fjord.kafka.groups) over a real GroupManager whose
``__consumer_offsets`` is in memory, through the dispatcher's frame codec: Kafka's
per-version rules (KIP-394's member-id round trip from JoinGroup v4, LeaveGroup v0-v2 vs
batched v3+, OffsetFetch's group errors per partition in v1 / at the top in v2-v7 / per group
in v8+, ListGroups' type filter), and group-level errors where Kafka puts them. The process and
real clients are covered by tests/integration/test_kafka_groups.py."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

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

from fjord.coordinator.group import GroupConfig
from fjord.coordinator.kafka_groups import GroupKafkaHandlers
from fjord.coordinator.manager import GroupManager
from fjord.errors import ErrorCode
from fjord.groups.offsets_topic import group_partition
from fjord.kafka.dispatch import KafkaDispatcher, Reply
from tests.helpers.offsets_log import Log

GROUP = "payments"
OTHER_GROUP = next(
    f"g{i}" for i in range(1000) if group_partition(f"g{i}") != group_partition(GROUP)
)
CONFIG = GroupConfig(initial_rebalance_delay_ms=0, min_session_timeout_ms=50)
NOT_COORDINATOR = ErrorCode.NOT_COORDINATOR.code


def served() -> tuple[GroupManager, KafkaDispatcher, Log]:
    """A manager owning only GROUP's partition, and a dispatcher of its Kafka group APIs."""
    log = Log()
    manager = GroupManager(log, CONFIG, partition_exists=lambda topic, p: topic != "nope")
    manager.active = True
    manager.assign({group_partition(GROUP): 1})
    assert manager.install(group_partition(GROUP), 1, {})
    return manager, KafkaDispatcher(GroupKafkaHandlers(manager).apis()), log


async def call(dispatcher: KafkaDispatcher, request: Any, response_class: Any, v: int) -> Any:
    request.with_header(correlation_id=7, client_id="unit")
    frame = request.encode(version=v, header=True, framed=True)
    outcome = await dispatcher.dispatch(frame[4:], "/10.0.0.1")
    assert isinstance(outcome, Reply) and outcome.frame is not None, outcome
    size = struct.unpack(">i", outcome.frame[:4])[0]
    assert size == len(outcome.frame) - 4
    return response_class.decode(outcome.frame[4:], version=v, header=True)


def join_request(v: int, group: str = GROUP, member_id: str = "") -> Any:
    cls = JoinGroupRequest[v]
    return cls(group_id=group, session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
               member_id=member_id, group_instance_id=None, protocol_type="consumer",
               protocols=[cls.JoinGroupRequestProtocol(name="range", metadata=b"sub")],
               reason=None)


async def join(dispatcher: KafkaDispatcher, v: int) -> Any:
    joined = await call(dispatcher, join_request(v), JoinGroupResponse, v)
    if v >= 4:
        assert joined.error_code == ErrorCode.MEMBER_ID_REQUIRED.code
        joined = await call(dispatcher, join_request(v, member_id=joined.member_id),
                            JoinGroupResponse, v)
    assert joined.error_code == 0
    return joined


def test_join_v3_admits_at_once_v4_asks_for_the_member_id_first() -> None:
    async def scenario() -> None:
        _, dispatcher, _ = served()
        old = await call(dispatcher, join_request(3), JoinGroupResponse, 3)
        assert old.error_code == 0 and old.member_id and old.leader == old.member_id
        assert old.protocol_name == "range" and [m.metadata for m in old.members] == [b"sub"]
        _, dispatcher, _ = served()
        first = await call(dispatcher, join_request(7), JoinGroupResponse, 7)
        assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED.code and first.member_id
        assert first.protocol_name is None and first.protocol_type is None  # nullable from v7

    asyncio.run(scenario())


def test_a_member_round_reaches_the_shared_state_machine_and_log() -> None:
    async def scenario() -> None:
        manager, dispatcher, log = served()
        joined = await join(dispatcher, 9)
        member, generation = joined.member_id, joined.generation_id
        sync_cls = SyncGroupRequest[5]
        synced = await call(dispatcher, sync_cls(
            group_id=GROUP, generation_id=generation, member_id=member, group_instance_id=None,
            protocol_type="consumer", protocol_name="range",
            assignments=[sync_cls.SyncGroupRequestAssignment(member_id=member, assignment=b"a")],
        ), SyncGroupResponse, 5)
        assert (synced.error_code, synced.assignment, synced.protocol_name) == (0, b"a", "range")
        description = manager.describe_group(GROUP)
        assert description.state.value == "Stable"
        (described_member,) = description.members
        assert described_member.client_id == "unit"
        assert described_member.client_host == "/10.0.0.1"
        commit_cls = OffsetCommitRequest[9]
        topic_cls = commit_cls.OffsetCommitRequestTopic
        committed = await call(dispatcher, commit_cls(
            group_id=GROUP, generation_id_or_member_epoch=generation, member_id=member,
            group_instance_id=None, topics=[
                topic_cls(name="orders", partitions=[topic_cls.OffsetCommitRequestPartition(
                    partition_index=0, committed_offset=42, committed_leader_epoch=3,
                    committed_metadata=None)]),
                topic_cls(name="nope", partitions=[topic_cls.OffsetCommitRequestPartition(
                    partition_index=0, committed_offset=1, committed_leader_epoch=-1,
                    committed_metadata="x")]),
            ]), OffsetCommitResponse, 9)
        errors = {(t.name, p.partition_index): p.error_code
                  for t in committed.topics for p in t.partitions}
        assert errors == {("orders", 0): 0,
                          ("nope", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code}
        fetched = manager.fetch_offsets(GROUP, [("orders", 0)])[("orders", 0)]
        assert (fetched.offset, fetched.leader_epoch, fetched.metadata) == (42, 3, "")
        assert log.records  # group metadata and the commit went to __consumer_offsets
        stale = await call(dispatcher, HeartbeatRequest[4](
            group_id=GROUP, generation_id=generation + 1, member_id=member,
            group_instance_id=None), HeartbeatResponse, 4)
        assert stale.error_code == ErrorCode.ILLEGAL_GENERATION.code

    asyncio.run(scenario())


def test_leave_group_single_member_before_v3_batched_from_v3() -> None:
    async def scenario() -> None:
        manager, dispatcher, _ = served()
        joined = await join(dispatcher, 3)
        left = await call(dispatcher, LeaveGroupRequest[1](group_id=GROUP,
                                                           member_id=joined.member_id),
                          LeaveGroupResponse, 1)
        assert left.error_code == 0 and manager.describe_group(GROUP).members == ()
        cls = LeaveGroupRequest[5]
        unknown = await call(dispatcher, cls(group_id=GROUP, members=[
            cls.MemberIdentity(member_id="ghost", group_instance_id=None, reason="bye")]),
            LeaveGroupResponse, 5)
        assert unknown.error_code == 0
        assert [(m.member_id, m.error_code) for m in unknown.members] == [
            ("ghost", ErrorCode.UNKNOWN_MEMBER_ID.code)]
        empty = await call(dispatcher, cls(group_id=GROUP, members=[]), LeaveGroupResponse, 5)
        assert empty.error_code == ErrorCode.INVALID_REQUEST.code

    asyncio.run(scenario())


def test_group_errors_go_where_each_version_carries_them() -> None:
    """OTHER_GROUP lives in a partition this manager does not own: NOT_COORDINATOR, placed per
    Kafka's layout of each API and version."""

    async def scenario() -> None:
        _, dispatcher, _ = served()
        joined = await call(dispatcher, join_request(5, OTHER_GROUP), JoinGroupResponse, 5)
        assert joined.error_code == NOT_COORDINATOR and joined.protocol_name == ""
        beat = await call(dispatcher, HeartbeatRequest[0](
            group_id=OTHER_GROUP, generation_id=1, member_id="m"), HeartbeatResponse, 0)
        assert beat.error_code == NOT_COORDINATOR
        commit_cls = OffsetCommitRequest[2]
        topic_cls = commit_cls.OffsetCommitRequestTopic
        committed = await call(dispatcher, commit_cls(
            group_id=OTHER_GROUP, generation_id_or_member_epoch=-1, member_id="",
            retention_time_ms=-1, topics=[topic_cls(name="orders", partitions=[
                topic_cls.OffsetCommitRequestPartition(partition_index=p, committed_offset=1,
                                                       committed_metadata="")
                for p in (0, 1)])]), OffsetCommitResponse, 2)
        assert [p.error_code for p in committed.topics[0].partitions] == [NOT_COORDINATOR] * 2
        v1 = OffsetFetchRequest[1]
        fetched = await call(dispatcher, v1(group_id=OTHER_GROUP, topics=[
            v1.OffsetFetchRequestTopic(name="orders", partition_indexes=[0, 1])]),
            OffsetFetchResponse, 1)
        assert [p.error_code for p in fetched.topics[0].partitions] == [NOT_COORDINATOR] * 2
        v7 = OffsetFetchRequest[7]
        fetched = await call(dispatcher, v7(group_id=OTHER_GROUP, topics=None,
                                            require_stable=True), OffsetFetchResponse, 7)
        assert fetched.error_code == NOT_COORDINATOR and fetched.topics == []
        v8 = OffsetFetchRequest[8]
        fetched = await call(dispatcher, v8(groups=[
            v8.OffsetFetchRequestGroup(group_id=g, topics=None) for g in (GROUP, OTHER_GROUP)
        ], require_stable=False), OffsetFetchResponse, 8)
        assert [(g.group_id, g.error_code) for g in fetched.groups] == [
            (GROUP, 0), (OTHER_GROUP, NOT_COORDINATOR)]
        described = await call(dispatcher, DescribeGroupsRequest[5](
            groups=[GROUP, OTHER_GROUP], include_authorized_operations=False),
            DescribeGroupsResponse, 5)
        assert [(g.group_id, g.error_code, g.group_state) for g in described.groups] == [
            (GROUP, 0, "Dead"), (OTHER_GROUP, NOT_COORDINATOR, "")]
        deleted = await call(dispatcher, DeleteGroupsRequest[2](
            groups_names=[GROUP, OTHER_GROUP]), DeleteGroupsResponse, 2)
        assert [(r.group_id, r.error_code) for r in deleted.results] == [
            (GROUP, ErrorCode.GROUP_ID_NOT_FOUND.code), (OTHER_GROUP, NOT_COORDINATOR)]

    asyncio.run(scenario())


def test_list_groups_filters_states_and_types() -> None:
    async def scenario() -> None:
        _, dispatcher, _ = served()
        await join(dispatcher, 4)  # CompletingRebalance until it syncs

        async def listed(v: int, states: list[str], types: list[str]) -> list[tuple[str, str]]:
            answer = await call(dispatcher, ListGroupsRequest[v](
                states_filter=states, types_filter=types), ListGroupsResponse, v)
            assert answer.error_code == 0
            return [(g.group_id, g.protocol_type) for g in answer.groups]

        assert await listed(0, [], []) == [(GROUP, "consumer")]
        assert await listed(4, ["Stable"], []) == []
        assert await listed(4, ["completingrebalance"], []) == [(GROUP, "consumer")]
        assert await listed(5, [], ["consumer"]) == []  # KIP-848 groups: Fjord has none
        assert await listed(5, [], ["Classic"]) == [(GROUP, "consumer")]

    asyncio.run(scenario())
