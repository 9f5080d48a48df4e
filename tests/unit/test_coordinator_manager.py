"""GroupManager, the coordinator's group shell, on a real event loop: routing by partition
ownership, parked requests, appends in order and their outcomes, partition loss, cancelled
RPCs, timers, and a replay of what it wrote. The appender is an in-memory log that acknowledges
(or fails) appends when the test says so, the way the broker would; the gRPC and process side
is covered by tests/integration/test_coordinator_service.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

import pytest

from fjord.coordinator.group import (
    GroupConfig,
    JoinGroupResponse,
    OffsetCommitRequestPartition,
)
from fjord.coordinator.manager import GroupManager
from fjord.coordinator.offsets_log import (
    OffsetCommitKey,
    OffsetCommitValue,
    decode_record,
)
from fjord.errors import ErrorCode, FjordError, InvalidGroupIdError
from fjord.groups.offsets_topic import group_partition
from fjord.groups.protocol import Subscription, encode_subscription
from fjord.groups.state import GroupState
from fjord.testing.waiting import wait_for_async
from tests.helpers.offsets_log import Log

WAIT_S = 10.0
SESSION_MS = 6_000
GROUP = "billing"
PARTITION = group_partition(GROUP)
CONFIG = GroupConfig(initial_rebalance_delay_ms=0, min_session_timeout_ms=50)


def serving(log: Log, partitions: Sequence[int] = (PARTITION,)) -> GroupManager:
    manager = GroupManager(log, CONFIG, partition_exists=lambda topic, p: topic != "nope")
    manager.active = True
    assert manager.assign(dict.fromkeys(partitions, 1)) == [(p, 1) for p in sorted(partitions)]
    for p in partitions:
        assert manager.install(p, 1, {})
    return manager


async def join(
    manager: GroupManager, client: str, member_id: str = "", **kw: Any
) -> JoinGroupResponse:
    args: dict[str, Any] = {
        "member_id": member_id,
        "group_instance_id": None,
        "client_id": client,
        "client_host": "/127.0.0.1",
        "session_timeout_ms": SESSION_MS,
        "rebalance_timeout_ms": SESSION_MS,
        "protocol_type": "consumer",
        "protocols": [("range", encode_subscription(Subscription(("orders",))))],
    } | kw
    return await manager.join_group(GROUP, **args)


async def stable_member(manager: GroupManager, client: str = "c") -> JoinGroupResponse:
    first = await join(manager, client)
    assert first.error is ErrorCode.MEMBER_ID_REQUIRED
    joined = await join(manager, client, first.member_id)
    assert joined.error is ErrorCode.NONE
    synced = await manager.sync_group(
        GROUP,
        member_id=joined.member_id,
        generation_id=joined.generation_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocol_name="range",
        assignments={joined.member_id: b"a"},
    )
    assert synced.error is ErrorCode.NONE and synced.assignment == b"a"
    return joined


def commit(
    manager: GroupManager, offsets: dict[int, int], member_id: str = "", generation: int = -1
) -> Awaitable[dict[tuple[str, int], ErrorCode]]:
    return manager.commit_offsets(
        GROUP,
        member_id=member_id,
        generation_id=generation,
        group_instance_id=None,
        offsets={("orders", p): OffsetCommitRequestPartition(o) for p, o in offsets.items()},
    )


def test_routing_follows_ownership_and_loading() -> None:
    async def scenario() -> None:
        log = Log()
        manager = GroupManager(log, CONFIG)
        with pytest.raises(FjordError) as inactive:
            manager.fetch_offsets(GROUP, None)
        assert inactive.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
        manager.active = True
        with pytest.raises(FjordError) as not_owner:
            manager.fetch_offsets(GROUP, None)
        assert not_owner.value.code is ErrorCode.NOT_COORDINATOR
        assert manager.assign({PARTITION: 4}) == [(PARTITION, 4)]
        assert manager.unloaded() == {PARTITION: 4}
        with pytest.raises(FjordError) as loading:
            await join(manager, "c")
        assert loading.value.code is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert manager.list_groups()[0] is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        assert not manager.install(PARTITION, 3, {})  # a replay for an older epoch
        assert manager.install(PARTITION, 4, {})
        assert manager.fetch_offsets(GROUP, [("orders", 0)])[("orders", 0)].offset == -1
        assert manager.list_groups() == (ErrorCode.NONE, [])
        with pytest.raises(InvalidGroupIdError):
            manager.heartbeat("", member_id="m", generation_id=1, group_instance_id=None)
        assert manager.assign({PARTITION: 4}) == []  # same epoch: nothing to replay

    asyncio.run(scenario())


def test_commit_is_answered_only_after_its_append() -> None:
    async def scenario() -> None:
        log = Log(auto=False)
        manager = serving(log)
        pending = asyncio.ensure_future(commit(manager, {0: 5, 1: 7}))
        while not log.held:
            await asyncio.sleep(0)
        assert not pending.done()
        assert manager.fetch_offsets(GROUP, [("orders", 0)])[("orders", 0)].offset == -1
        log.release()
        assert await asyncio.wait_for(pending, WAIT_S) == {
            ("orders", 0): ErrorCode.NONE,
            ("orders", 1): ErrorCode.NONE,
        }
        assert manager.fetch_offsets(GROUP, None)[("orders", 1)].offset == 7

        # A failed append is mapped (Kafka's GroupMetadataManager) and changes nothing.
        failing = asyncio.ensure_future(commit(manager, {0: 9}))
        while not log.held:
            await asyncio.sleep(0)
        log.release(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        assert await asyncio.wait_for(failing, WAIT_S) == {("orders", 0): ErrorCode.NOT_COORDINATOR}
        assert manager.fetch_offsets(GROUP, None)[("orders", 0)].offset == 5

        mixed = await manager.commit_offsets(
            GROUP,
            member_id="",
            generation_id=-1,
            group_instance_id=None,
            offsets={("nope", 0): OffsetCommitRequestPartition(3)},
        )
        assert mixed == {("nope", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}

    asyncio.run(scenario())


def test_appends_reach_the_log_in_emission_order_and_replay_to_the_same_groups() -> None:
    async def scenario() -> None:
        log = Log()
        manager = serving(log)
        member = await stable_member(manager)
        # Five commits of one partition in flight at once: written in the order they came.
        await asyncio.gather(
            *(
                commit(manager, {0: offset * 10, 1: offset}, member.member_id, member.generation_id)
                for offset in range(1, 6)
            )
        )
        assert {partition for partition, _ in log.submitted} == {PARTITION}
        written = [decode_record(k, v) for _, records in log.submitted for k, v in records]
        assert [
            value.offset
            for key, value in written
            if isinstance(key, OffsetCommitKey)
            and key.partition == 0
            and isinstance(value, OffsetCommitValue)
        ] == [10, 20, 30, 40, 50]
        # The replay of what was written rebuilds the same group: Stable, same member, offsets.
        other = GroupManager(Log(), CONFIG)
        other.active = True
        other.assign({PARTITION: 2})
        assert other.install(PARTITION, 2, log.replay(PARTITION).groups())
        assert other.fetch_offsets(GROUP, None) == manager.fetch_offsets(GROUP, None)
        assert other.fetch_offsets(GROUP, [("orders", 0)])[("orders", 0)].offset == 50
        description = other.describe_group(GROUP)
        assert description.state is GroupState.STABLE
        assert [m.member_id for m in description.members] == [member.member_id]
        beat = other.heartbeat(
            GROUP,
            member_id=member.member_id,
            generation_id=member.generation_id,
            group_instance_id=None,
        )
        assert beat is ErrorCode.NONE

    asyncio.run(scenario())


def test_losing_the_partition_answers_parked_requests_not_coordinator() -> None:
    async def scenario() -> None:
        log = Log()
        manager = serving(log)
        member = await stable_member(manager, "a")
        # A second member joins: the rebalance parks its JoinGroup until "a" rejoins.
        first = await join(manager, "b")
        parked = asyncio.ensure_future(join(manager, "b", first.member_id))
        await asyncio.sleep(0)
        assert not parked.done()
        log.auto = False  # appends from now on wait for an acknowledgement
        in_flight = asyncio.ensure_future(
            commit(manager, {0: 1}, member.member_id, member.generation_id)
        )
        while not log.held:
            await asyncio.sleep(0)
        manager.assign({})  # the controller gave the partition to another coordinator
        for request in (parked, in_flight):
            with pytest.raises(FjordError) as lost:
                await asyncio.wait_for(request, WAIT_S)
            assert lost.value.code is ErrorCode.NOT_COORDINATOR
        log.release()  # a late acknowledgement is dropped, nothing is answered twice
        await asyncio.sleep(0)
        with pytest.raises(FjordError) as after:
            manager.describe_group(GROUP)
        assert after.value.code is ErrorCode.NOT_COORDINATOR

    asyncio.run(scenario())


def test_cancelled_parked_request_leaves_nothing_behind() -> None:
    async def scenario() -> None:
        manager = serving(Log())
        member = await stable_member(manager, "a")
        first = await join(manager, "b")
        parked = asyncio.ensure_future(join(manager, "b", first.member_id))
        await asyncio.sleep(0)
        parked.cancel()  # the client's RPC went away
        with pytest.raises(asyncio.CancelledError):
            await parked
        group = manager._partitions[PARTITION].groups[GROUP]
        assert group.waiters == {}
        # The join phase still completes for the others (the Reply for the cancelled request
        # finds no future and is dropped).
        again = asyncio.ensure_future(join(manager, "b", first.member_id))
        rejoined = await asyncio.wait_for(join(manager, "a", member.member_id), WAIT_S)
        b = await asyncio.wait_for(again, WAIT_S)
        assert rejoined.error is b.error is ErrorCode.NONE
        assert rejoined.generation_id == b.generation_id == member.generation_id + 1
        assert group.waiters == {}


def test_timers_expire_sessions_and_vacant_or_dead_groups_are_forgotten() -> None:
    async def scenario() -> None:
        manager = serving(Log())
        refused = await join(manager, "c", session_timeout_ms=10)  # below the minimum
        assert refused.error is ErrorCode.INVALID_SESSION_TIMEOUT
        assert manager.list_groups() == (ErrorCode.NONE, [])  # nothing left behind

        first = await join(manager, "c", session_timeout_ms=100)
        joined = await join(manager, "c", first.member_id, session_timeout_ms=100)
        assert joined.error is ErrorCode.NONE
        await manager.sync_group(
            GROUP,
            member_id=joined.member_id,
            generation_id=joined.generation_id,
            group_instance_id=None,
            protocol_type=None,
            protocol_name=None,
            assignments={},
        )
        assert manager.describe_group(GROUP).state is GroupState.STABLE
        # No heartbeat: the group's timer expires the member and the group becomes Empty.

        async def empty() -> bool:
            return manager.describe_group(GROUP).state is GroupState.EMPTY

        await wait_for_async(empty, "the session to expire", WAIT_S, interval=0.02)
        assert manager.state_counts()["Empty"] == 1

        await commit(manager, {0: 3})
        assert await manager.delete_group(GROUP) is ErrorCode.NONE
        assert manager.describe_group(GROUP).state is GroupState.DEAD
        assert await manager.delete_group(GROUP) is ErrorCode.GROUP_ID_NOT_FOUND
        assert manager.fetch_offsets(GROUP, None) == {}
        # A new simple commit brings the group back, fresh.
        assert await commit(manager, {0: 4}) == {("orders", 0): ErrorCode.NONE}
        assert manager.list_groups() == (ErrorCode.NONE, [(GROUP, "", "Empty")])

    asyncio.run(scenario())


def test_unknown_groups_get_kafkas_answers_without_being_created() -> None:
    async def scenario() -> None:
        manager = serving(Log())
        assert (
            manager.heartbeat(GROUP, member_id="m", generation_id=1, group_instance_id=None)
            is ErrorCode.UNKNOWN_MEMBER_ID
        )
        assert manager.leave_group(GROUP, [("m", None)]) == [ErrorCode.UNKNOWN_MEMBER_ID]
        assert (await join(manager, "c", "m-1")).error is ErrorCode.UNKNOWN_MEMBER_ID
        assert await commit(manager, {0: 1}, "m-1", 3) == {
            ("orders", 0): ErrorCode.ILLEGAL_GENERATION
        }
        assert manager.describe_group(GROUP).state is GroupState.DEAD
        assert manager.list_groups() == (ErrorCode.NONE, [])

    asyncio.run(scenario())


def test_a_fenced_append_drops_the_partition_until_a_newer_epoch() -> None:
    async def scenario() -> None:
        log = Log(auto=False)
        manager = serving(log)
        pending = asyncio.ensure_future(commit(manager, {0: 7}))
        while not log.held:
            await asyncio.sleep(0)
        assert log.epochs == [(PARTITION, 1)]
        log.release(ErrorCode.TRANSACTION_COORDINATOR_FENCED)
        assert await asyncio.wait_for(pending, 5) == {("orders", 0): ErrorCode.NOT_COORDINATOR}
        with pytest.raises(FjordError) as gone:
            manager.describe_group("billing")
        assert gone.value.code is ErrorCode.NOT_COORDINATOR
        # This coordinator's metadata still names it at epoch 1: it does not take it back.
        assert manager.assign({PARTITION: 1}) == []
        assert manager.owned() == {}
        # The controller gives it back later (a newer epoch): owned and replayed again.
        assert manager.assign({PARTITION: 2}) == [(PARTITION, 2)]
        # Its claim before the replay is refused too (the leader knows a newer owner): given
        # up before serving anything, and an older epoch's refusal changes nothing.
        manager.fence(PARTITION, 2)
        assert manager.owned() == {} and manager.assign({PARTITION: 2}) == []
        assert manager.assign({PARTITION: 3}) == [(PARTITION, 3)]
        manager.fence(PARTITION, 2)
        assert manager.owned() == {PARTITION: 3}

    asyncio.run(scenario())
