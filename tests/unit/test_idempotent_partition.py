"""The broker hooks of idempotence: Partition's leader and follower paths keep the producer
state (real logs in temp dirs), and the producer-id block cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from fjord.broker.partition import Partition, PartitionAssignment
from fjord.broker.producer_ids import ProducerIdBlocks
from fjord.errors import FjordError, OutOfOrderSequenceError
from fjord.records.builder import BatchBuilder
from fjord.storage import PartitionLog
from fjord.storage.config import LogConfig


def batch(pid: int, seq: int, count: int = 2, epoch: int = 0) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    for i in range(count):
        builder.append(1000 + i, None, f"{pid}-{seq}-{i}".encode())
    return builder.build()


def partition(directory: Path, *, leader: int, epoch: int = 1) -> Partition:
    plog = PartitionLog.open(directory, LogConfig())
    assignment = PartitionAssignment(leader, epoch, (1, 2), (1, 2))
    return Partition("t", 0, 1, plog, assignment, min_insync_replicas=1)


def test_leader_dedupes_and_rejects_before_writing(tmp_path: Path) -> None:
    part = partition(tmp_path / "t-0", leader=1)
    first = part.append_as_leader(batch(9, 0), acks=1)
    assert (first.info.first_offset, first.duplicate) == (0, False)
    again = part.append_as_leader(batch(9, 0), acks=1)
    assert again.duplicate and (again.info.first_offset, again.info.last_offset) == (0, 1)
    assert part.log_end_offset == 2
    with pytest.raises(OutOfOrderSequenceError):
        part.append_as_leader(batch(9, 5), acks=1)
    assert part.log_end_offset == 2
    # Non-idempotent batches are untouched by the checks.
    plain = BatchBuilder()
    plain.append(1, None, b"x")
    assert part.append_as_leader(plain.build(), acks=1).info.first_offset == 2
    part.log.close()


def test_follower_learns_state_and_truncation_forgets_it(tmp_path: Path) -> None:
    leader = partition(tmp_path / "leader" / "t-0", leader=1)
    for seq in (0, 2, 4):
        leader.append_as_leader(batch(7, seq), acks=1)
    follower_log = PartitionLog.open(tmp_path / "follower" / "t-0", LogConfig())
    follower = Partition(
        "t", 0, 2, follower_log, PartitionAssignment(1, 1, (1, 2), (1, 2)), min_insync_replicas=1
    )
    follower.append_as_follower(leader.log.read(0, 1 << 20), leader.high_watermark)
    assert follower.producer_state.producers == leader.producer_state.producers
    follower.truncate_to(4)  # the batch with sequences 4-5 goes
    assert follower.producer_state.producers[7].last_sequence == 3
    # The follower becomes leader: the cut batch is new again, the kept ones are duplicates.
    follower.update_assignment(PartitionAssignment(2, 2, (1, 2), (2,)))
    assert follower.append_as_leader(batch(7, 2), acks=1).duplicate
    assert not follower.append_as_leader(batch(7, 4), acks=1).duplicate
    assert follower.log_end_offset == 6
    leader.log.close()
    follower.log.close()


def test_state_is_reloaded_when_the_partition_is_reopened(tmp_path: Path) -> None:
    part = partition(tmp_path / "t-0", leader=1)
    part.append_as_leader(batch(3, 0), acks=1)
    part.append_as_leader(batch(3, 2), acks=1)
    part.log.abandon()  # a crash: no snapshot, no clean-shutdown marker
    reopened = partition(tmp_path / "t-0", leader=1)
    outcome = reopened.append_as_leader(batch(3, 2), acks=1)
    assert outcome.duplicate and outcome.info.first_offset == 2
    reopened.log.close()


def test_producer_id_blocks() -> None:
    blocks = ProducerIdBlocks()
    assert blocks.take() is None
    blocks.add_block(1000, 3)
    assert [blocks.take(), blocks.take(), blocks.take(), blocks.take()] == [1000, 1001, 1002, None]
    with pytest.raises(FjordError):
        blocks.add_block(-1, 10)
    with pytest.raises(FjordError):
        blocks.add_block(5, 0)


def test_snapshot_written_across_a_truncation_is_never_published(tmp_path: Path) -> None:
    """The broker serialises a snapshot on the event loop and writes it in a worker thread; a
    follower truncation that runs on the loop meanwhile replaces the state, and the snapshot
    (which still counts the cut batches) must not appear: a restart would trust it."""
    import asyncio

    from fjord.broker.producer_state import list_snapshots
    from fjord.broker.server import snapshot_producer_state

    leader = partition(tmp_path / "leader" / "t-0", leader=1)
    for seq in (0, 2, 4):
        leader.append_as_leader(batch(7, seq), acks=1)
    follower = Partition(
        "t",
        0,
        2,
        PartitionLog.open(tmp_path / "follower" / "t-0", LogConfig()),
        PartitionAssignment(1, 1, (1, 2), (1, 2)),
        min_insync_replicas=1,
    )
    follower.append_as_follower(leader.log.read(0, 1 << 20), leader.high_watermark)
    directory = follower.log.directory

    async def snapshot_racing_a_truncation() -> bool:
        # Runs before the worker thread's completion is delivered to the loop.
        asyncio.get_running_loop().call_soon(follower.truncate_to, 4)
        return await snapshot_producer_state(follower, force=True)

    assert asyncio.run(snapshot_racing_a_truncation()) is False
    assert list_snapshots(directory) == []
    assert not list(directory.glob("*.tmp"))
    # Without a truncation the same call publishes the snapshot at the log end.
    assert asyncio.run(snapshot_producer_state(follower, force=True)) is True
    assert [end for end, _ in list_snapshots(directory)] == [follower.log_end_offset]
    leader.log.close()
    follower.log.close()


def test_snapshot_wanted_agrees_with_snapshot_due(tmp_path: Path) -> None:
    """The broker's periodic check asks the cheap ``snapshot_wanted`` of every partition and
    serialises (``snapshot_due``) only where it says yes: the two agree in every state."""
    import asyncio

    from fjord.broker.producer_state import snapshot_due, snapshot_wanted
    from fjord.broker.server import snapshot_producer_state

    part = partition(tmp_path / "t-0", leader=1)

    def agree(*, force: bool) -> bool:
        wanted = snapshot_wanted(part.producer_state, part.log, force=force)
        assert wanted == (snapshot_due(part.producer_state, part.log, force=force) is not None)
        return wanted

    # A new log: nothing to snapshot (recovery of an empty log reads nothing either).
    assert (agree(force=False), agree(force=True)) == (False, False)
    part.append_as_leader(batch(5, 0), acks=1)
    assert (agree(force=False), agree(force=True)) == (False, True)  # moved, not rolled
    part.log.roll()
    part.append_as_leader(batch(5, 2), acks=1)
    assert (agree(force=False), agree(force=True)) == (True, True)  # rolled since
    assert asyncio.run(snapshot_producer_state(part)) is True
    assert (agree(force=False), agree(force=True)) == (False, False)  # taken
    part.log.close()
