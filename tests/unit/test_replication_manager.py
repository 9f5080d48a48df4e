"""ReplicaManager's replication paths against real logs in a temp dir (no network): follower
fetch responses (append, divergence truncation, errors), ISR expansion requests from follower
fetches, lag-driven shrinks with an injected clock, AlterPartition answers (commit, stale-epoch
fencing), acks=all outcomes (NOT_ENOUGH_REPLICAS_AFTER_APPEND, waiting for the ISR) and
replica-aware ListOffsets."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from fjord._proto import broker_pb2
from fjord.broker.partition import PartitionAssignment
from fjord.broker.replica_manager import DEBUGGING_REPLICA_ID, ReplicaManager
from fjord.broker.replication import FollowerTarget
from fjord.errors import ErrorCode
from fjord.metadata import BrokerRegistration, PartitionState
from fjord.storage import LogManager, PartitionLog
from tests.helpers.replica_manager import (
    BROKER,
    Clock,
    Cluster,
    batch,
    fetch_request,
    one_fetch,
    one_produce,
    produce_request,
    run,
)

LAG_MS = 1_000


Env = tuple[ReplicaManager, Cluster, Clock]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    logs = LogManager(tmp_path / "data")
    clock = Clock()
    manager = ReplicaManager(BROKER, logs, {"replica.lag.time.max.ms": str(LAG_MS)}, clock_ms=clock)
    yield manager, Cluster(), clock
    logs.close()


def state(
    leader: int, isr: tuple[int, ...], epoch: int = 0, partition_epoch: int = 0
) -> PartitionState:
    return PartitionState((BROKER, 2, 3), isr, leader, epoch, partition_epoch)


def follower_fetch(offset: int, replica: int, last_epoch: int = -1) -> broker_pb2.FetchRequest:
    request = fetch_request("t", 0, offset, replica_id=replica)
    request.topics[0].partitions[0].last_fetched_epoch = last_epoch
    return request


def leader_response(
    records: bytes = b"", hw: int = 0, diverging: tuple[int, int] | None = None
) -> broker_pb2.FetchPartitionResponse:
    out = broker_pb2.FetchPartitionResponse(partition=0, high_watermark=hw, records=records)
    if diverging is not None:
        out.diverging_epoch.epoch, out.diverging_epoch.end_offset = diverging
    return out


def leader_batches(tmp: Path, epochs: list[tuple[int, int]]) -> bytes:
    """Batches as a leader with the given (epoch, record count) history would serve them."""
    plog = PartitionLog.open(tmp / "source-0")
    for epoch, n in epochs:
        plog.append(batch(n), epoch)
    data = plog.read(0, 1 << 20)
    plog.close()
    return data


def test_follower_appends_truncates_and_reports_errors(env: Env, tmp_path: Path) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [state(2, (BROKER, 2, 3), epoch=4)]))
        target = FollowerTarget(2, 4)
        assert manager.follower_targets() == {("t", 0): target}
        pos = manager.follower_position(("t", 0), target)
        assert pos is not None and (pos.fetch_offset, pos.last_fetched_epoch) == (0, -1)
        data = leader_batches(tmp_path, [(1, 2), (3, 2)])
        result = manager.on_follower_fetch_response(("t", 0), target, leader_response(data, 3))
        assert result.error is None and result.appended_bytes == len(data)
        part = manager.partitions[("t", 0)]
        assert (part.log_end_offset, part.high_watermark) == (4, 3)
        pos = manager.follower_position(("t", 0), target)
        assert pos is not None and (pos.fetch_offset, pos.last_fetched_epoch) == (4, 3)
        # The leader says epoch 1 is the last we share, ending at 2: truncate to 2.
        result = manager.on_follower_fetch_response(
            ("t", 0), target, leader_response(diverging=(1, 2))
        )
        assert result.truncated and result.error is None
        assert (part.log_end_offset, part.log.latest_epoch, part.high_watermark) == (2, 1, 2)
        # An error answer is reported (the fetcher backs off), nothing changes.
        out = leader_response()
        out.error.code = ErrorCode.FENCED_LEADER_EPOCH.code
        result = manager.on_follower_fetch_response(("t", 0), target, out)
        assert result.error is not None and result.error.code is ErrorCode.FENCED_LEADER_EPOCH
        # Batches that do not start at our log end are refused, not appended.
        result = manager.on_follower_fetch_response(("t", 0), target, leader_response(data))
        assert result.error is not None and part.log_end_offset == 2
        # An answer for an epoch we no longer follow in is ignored.
        stale = manager.on_follower_fetch_response(
            ("t", 0), FollowerTarget(2, 3), leader_response(data)
        )
        assert stale.error is None and stale.appended_bytes == 0
        assert manager.follower_position(("t", 0), FollowerTarget(2, 3)) is None

    run(scenario())


def test_an_answer_for_a_log_end_that_moved_is_dropped(env: Env, tmp_path: Path) -> None:
    """A fetch built at log end 4 whose answer arrives after the log was truncated to 2 (a
    repair): the records (offsets 4..) are not appended, which would leave a hole 2..4."""
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [state(2, (BROKER, 2, 3), epoch=4)]))
        target = FollowerTarget(2, 4)
        plog = PartitionLog.open(tmp_path / "source-0")
        for n in (2, 2, 2):
            plog.append(batch(n), 1)
        first, later = plog.read(0, 1 << 20), plog.read(4, 1 << 20)
        plog.close()
        first_four = first[: len(first) - len(later)]
        result = manager.on_follower_fetch_response(
            ("t", 0), target, leader_response(first_four, 2), fetch_offset=0
        )
        assert result.error is None
        part = manager.partitions[("t", 0)]
        assert part.log_end_offset == 4
        part.truncate_to(2)  # what a repair of a damaged batch at 2 does
        result = manager.on_follower_fetch_response(
            ("t", 0), target, leader_response(later, 6), fetch_offset=4
        )
        assert result.truncated and result.error is None and result.appended_bytes == 0
        assert part.log_end_offset == 2
        pos = manager.follower_position(("t", 0), target)
        assert pos is not None and pos.fetch_offset == 2

    run(scenario())


def test_follower_fetch_expands_the_isr_and_lag_shrinks_it(env: Env) -> None:
    manager, cluster, clock = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [state(BROKER, (BROKER, 2))]))
        assert one_produce(await manager.produce(produce_request("t", 0, batch(3)))).error.code == 0
        await manager.fetch(follower_fetch(3, 2))
        part = manager.partitions[("t", 0)]
        assert part.high_watermark == 3
        assert manager.take_isr_requests() == []
        # Follower 3 catches up to the high watermark: asked to join (and counts at once).
        clock.now = 10
        await manager.fetch(follower_fetch(3, 3))
        (request,) = manager.take_isr_requests()
        assert (request.new_isr, request.leader_epoch, request.partition_epoch) == (
            (BROKER, 2, 3),
            0,
            0,
        )
        assert part.maximal_isr == (BROKER, 2, 3)
        manager.on_isr_change_result(
            request, 0, PartitionAssignment(BROKER, 0, (BROKER, 2, 3), (BROKER, 2, 3), 1)
        )
        assert part.assignment.isr == (BROKER, 2, 3) and not part.isr_change_pending
        # Follower 2 stops fetching; follower 3 keeps up.
        assert one_produce(await manager.produce(produce_request("t", 0, batch(1)))).error.code == 0
        clock.now = LAG_MS  # follower 2 last caught up at 0
        await manager.fetch(follower_fetch(4, 3))
        assert manager.check_isr_lag() == 0  # not lagging for longer than the limit yet
        clock.now = LAG_MS + 1
        assert manager.check_isr_lag() == 1
        (shrink,) = manager.take_isr_requests()
        assert shrink.new_isr == (BROKER, 3)
        assert part.high_watermark == 3  # follower 2 still counts until the shrink is committed
        manager.on_isr_change_result(
            shrink, 0, PartitionAssignment(BROKER, 0, (BROKER, 2, 3), (BROKER, 3), 2)
        )
        assert part.high_watermark == 4

    run(scenario())


def test_stale_epoch_refusal_fails_waiting_produces(env: Env) -> None:
    manager, cluster, clock = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [state(BROKER, (BROKER, 2))]))
        waiting = asyncio.ensure_future(
            manager.produce(produce_request("t", 0, batch(2), acks=-1, timeout_ms=10_000))
        )
        await asyncio.sleep(0)  # parked in the purgatory
        clock.now = 5 * LAG_MS
        assert manager.check_isr_lag() == 1
        (shrink,) = manager.take_isr_requests()
        manager.on_isr_change_result(shrink, ErrorCode.INVALID_UPDATE_VERSION.code, None)
        out = one_produce(await waiting)
        assert out.error.code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code
        again = one_produce(await manager.produce(produce_request("t", 0, batch(1))))
        assert again.error.code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code
        # Newer metadata (a new partition epoch) lifts the fence.
        await manager.apply_metadata(
            cluster.topic("t", [state(BROKER, (BROKER,), partition_epoch=1)])
        )
        assert one_produce(await manager.produce(produce_request("t", 0, batch(1)))).error.code == 0

    run(scenario())


def test_failed_isr_change_is_proposed_again(env: Env) -> None:
    manager, cluster, clock = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [state(BROKER, (BROKER, 2))]))
        clock.now = 5 * LAG_MS
        assert manager.check_isr_lag() == 1
        (shrink,) = manager.take_isr_requests()
        assert manager.check_isr_lag() == 0  # one change in flight at a time
        manager.on_isr_change_result(shrink, ErrorCode.UNKNOWN_SERVER_ERROR.code, None)
        assert manager.check_isr_lag() == 1  # the call failed: not fenced, tried again
        manager.fenced = True
        manager.take_isr_requests()
        assert manager.check_isr_lag() == 0  # a broker without registration proposes nothing

    run(scenario())


def test_not_enough_replicas_after_append(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        config = {"min.insync.replicas": "2"}
        await manager.apply_metadata(cluster.topic("t", [state(BROKER, (BROKER, 2))], config))
        waiting = asyncio.ensure_future(
            manager.produce(produce_request("t", 0, batch(2), acks=-1, timeout_ms=10_000))
        )
        await asyncio.sleep(0)
        # The ISR shrinks to the leader alone (the controller dropped follower 2): the
        # high watermark passes the batch, but it is no longer on min.insync.replicas brokers.
        await manager.apply_metadata(
            cluster.topic("t", [state(BROKER, (BROKER,), partition_epoch=1)], config)
        )
        out = one_produce(await waiting)
        assert out.error.code == ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND.code
        assert out.base_offset == 0  # it was appended
        refused = one_produce(await manager.produce(produce_request("t", 0, batch(1), acks=-1)))
        assert refused.error.code == ErrorCode.NOT_ENOUGH_REPLICAS.code

    run(scenario())


def test_acks_all_waits_for_every_isr_member(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [state(BROKER, (BROKER, 2, 3))]))
        waiting = asyncio.ensure_future(
            manager.produce(produce_request("t", 0, batch(2), acks=-1, timeout_ms=10_000))
        )
        await asyncio.sleep(0)
        await manager.fetch(follower_fetch(2, 2))
        await asyncio.sleep(0)
        assert not waiting.done()  # follower 3 has not fetched it yet
        await manager.fetch(follower_fetch(2, 3))
        out = one_produce(await asyncio.wait_for(waiting, 5))
        assert (out.error.code, out.base_offset) == (0, 0)

    run(scenario())


def test_debugging_list_offsets_reads_a_follower(env: Env, tmp_path: Path) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [state(2, (BROKER, 2, 3), epoch=1)]))
        data = leader_batches(tmp_path, [(1, 3)])
        manager.on_follower_fetch_response(("t", 0), FollowerTarget(2, 1), leader_response(data, 1))
        request = broker_pb2.ListOffsetsRequest(replica_id=DEBUGGING_REPLICA_ID)
        request.topics.add(name="t").partitions.add(
            partition=0, timestamp=-1, current_leader_epoch=-1
        )
        out = manager.list_offsets(request).topics[0].partitions[0]
        assert (out.error.code, out.offset) == (0, 3)  # the follower's log end
        request.replica_id = -1  # a consumer: only the leader answers
        out = manager.list_offsets(request).topics[0].partitions[0]
        assert out.error.code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code
        assert manager.high_watermarks() == {("t", 0): 1}
        consumer = one_fetch(await manager.fetch(fetch_request("t", 0, 0)))
        assert consumer.error.code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code

    run(scenario())


def test_fetch_from_a_stale_incarnation_counts_for_nothing(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        cluster.change([(cluster.keys.broker(2), BrokerRegistration(2, "h", 2).to_json())])
        image = cluster.topic("t", [state(BROKER, (BROKER, 2), epoch=0)])
        epoch_of_2 = image.broker_epoch(2)
        assert epoch_of_2 is not None
        await manager.apply_metadata(image)
        assert one_produce(await manager.produce(produce_request("t", 0, batch(3)))).error.code == 0
        stale = follower_fetch(3, 2)
        stale.replica_epoch = epoch_of_2 - 1  # e.g. restarted before its old lease expired
        out = one_fetch(await manager.fetch(stale))
        assert out.error.code == 0 and out.high_watermark == 0
        current = follower_fetch(3, 2)
        current.replica_epoch = epoch_of_2
        assert one_fetch(await manager.fetch(current)).high_watermark == 3

    run(scenario())


def test_follower_below_the_leaders_log_start_restarts_there(env: Env, tmp_path: Path) -> None:
    """Retention ran on the leader while the follower was away: the follower's fetch offset is
    below the leader's log start, so it drops its log, restarts empty at the leader's log start
    and fetches on from there (it could never rejoin the ISR otherwise)."""
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [state(2, (BROKER, 2, 3), epoch=4)]))
        target = FollowerTarget(2, 4)
        part = manager.partitions[("t", 0)]
        manager.on_follower_fetch_response(
            ("t", 0), target, leader_response(leader_batches(tmp_path / "a", [(1, 4)]), 4)
        )
        assert part.log_end_offset == 4
        out = leader_response()
        out.error.code = ErrorCode.OFFSET_OUT_OF_RANGE.code
        out.log_start_offset = 10
        result = manager.on_follower_fetch_response(("t", 0), target, out)
        assert result.truncated and result.error is None
        assert (part.log_start_offset, part.log_end_offset, part.high_watermark) == (10, 10, 10)
        pos = manager.follower_position(("t", 0), target)
        assert pos is not None and (pos.fetch_offset, pos.last_fetched_epoch) == (10, -1)
        # The leader's batches from offset 10 on append as usual.
        source = PartitionLog.open(tmp_path / "b" / "source-0")
        source.truncate_fully_and_start_at(10)
        source.append(batch(3), 4)
        data = source.read(10, 1 << 20)
        source.close()
        result = manager.on_follower_fetch_response(("t", 0), target, leader_response(data, 13))
        assert result.error is None and (part.log_end_offset, part.high_watermark) == (13, 13)
        # An out-of-range answer while we are inside the leader's log changes nothing.
        out.log_start_offset = 12
        result = manager.on_follower_fetch_response(("t", 0), target, out)
        assert result.error is not None and part.log_start_offset == 10

    run(scenario())


def test_follower_moves_its_log_start_with_the_leader(env: Env, tmp_path: Path) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [state(2, (BROKER, 2, 3), epoch=4)]))
        target = FollowerTarget(2, 4)
        part = manager.partitions[("t", 0)]
        data = leader_batches(tmp_path, [(1, 2), (2, 2), (3, 2)])
        out = leader_response(data, 6)
        out.log_start_offset = 2
        assert manager.on_follower_fetch_response(("t", 0), target, out).error is None
        assert (part.log_start_offset, part.log_end_offset) == (2, 6)
        # Never past its own log end, never backwards.
        out = leader_response(hw=6)
        out.log_start_offset = 1
        manager.on_follower_fetch_response(("t", 0), target, out)
        assert part.log_start_offset == 2

    run(scenario())
