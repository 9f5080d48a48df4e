"""Pure cores of replication: follower progress and ISR rules (maximal ISR, shrink only after
commit, expansion), epoch-based truncation (with a property: a diverged follower always ends
as a byte-identical copy of the leader's log without losing the common prefix), fetch-request
building per source broker, settings, and the high-watermark checkpoint format."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.broker.isr import FollowerState, IsrTracker
from fjord.broker.partition import Partition, PartitionAssignment
from fjord.broker.replication import (
    FollowerPosition,
    FollowerTarget,
    Truncation,
    build_fetch_request,
    group_by_source,
    truncation_for_divergence,
)
from fjord.broker.replication_checkpoint import (
    HighWatermarkCheckpoint,
    format_hw_checkpoint,
    parse_hw_checkpoint,
)
from fjord.cluster.broker_config import validate_broker_config
from fjord.cluster.replication_config import ReplicationSettings
from fjord.errors import ConfigError, InvalidRecordError, NotLeaderOrFollowerError, StorageError
from fjord.records import BatchBuilder
from fjord.storage import LogConfig, PartitionLog

LAG = 1_000


def batch(n: int = 1) -> bytes:
    builder = BatchBuilder(batch_size=1 << 30)
    for i in range(n):
        builder.append(1_000 + i, None, b"v%d" % i)
    return builder.build()


def make_partition(
    directory: Path,
    *,
    broker_id: int = 1,
    leader: int = 1,
    epoch: int = 0,
    replicas: tuple[int, ...] = (1, 2, 3),
    isr: tuple[int, ...] | None = None,
    partition_epoch: int = 0,
    min_isr: int = 1,
    initial_hw: int | None = None,
    name: str = "t-0",
) -> Partition:
    assignment = PartitionAssignment(
        leader, epoch, replicas, isr if isr is not None else replicas, partition_epoch
    )
    plog = PartitionLog.open(directory / name, LogConfig())
    return Partition(
        "t",
        0,
        broker_id,
        plog,
        assignment,
        min_insync_replicas=min_isr,
        initial_high_watermark=initial_hw,
    )


# --- follower progress ----------------------------------------------------------------------


def test_follower_caught_up_when_fetching_at_the_leader_end() -> None:
    state = FollowerState(last_caught_up_ms=0)
    state.on_fetch(5, 10, now_ms=100)  # behind: not caught up now
    assert (state.last_caught_up_ms, state.log_end_offset) == (0, 5)
    state.on_fetch(10, 12, now_ms=200)  # reached what the leader had at the previous fetch
    assert state.last_caught_up_ms == 100
    state.on_fetch(12, 12, now_ms=300)  # at the leader's end: caught up now
    assert state.last_caught_up_ms == 300
    state.on_fetch(11, 20, now_ms=400)  # it truncated: its log end follows, caught-up time not
    assert (state.last_caught_up_ms, state.log_end_offset) == (300, 11)


# --- ISR tracker ------------------------------------------------------------------------------


def test_maximal_isr_counts_expansion_at_once_and_shrink_only_after_commit() -> None:
    tracker = IsrTracker(1, (1, 2, 3), (1, 2), now_ms=0)
    tracker.on_fetch(3, 10, 10, now_ms=5)
    assert tracker.propose_expansion(
        3, high_watermark=10, leader_epoch_start_offset=0, partition_epoch=4
    ) == (1, 2, 3)
    assert tracker.maximal_isr == (1, 2, 3)  # expansion counts before the commit
    assert tracker.propose_shrink(10_000, LAG, 4) is None  # one change in flight at a time
    tracker.on_committed((1, 2, 3), (1, 2, 3), partition_epoch=5, now_ms=10)
    assert tracker.pending is None and tracker.committed == (1, 2, 3)
    # Follower 2 never fetched: lagging after LAG ms.
    assert tracker.lagging_followers(LAG, LAG) == []
    assert tracker.propose_shrink(LAG + 1, LAG, 5) == (1, 3)
    assert tracker.maximal_isr == (1, 2, 3)  # the shrink does not count until committed
    tracker.on_committed((1, 2, 3), (1, 2, 3), partition_epoch=5, now_ms=20)  # same epoch
    assert tracker.pending is not None
    tracker.on_committed((1, 2, 3), (1, 3), partition_epoch=6, now_ms=20)
    assert tracker.maximal_isr == (1, 3) and tracker.pending is None


def test_expansion_needs_the_high_watermark_and_the_epoch_start() -> None:
    tracker = IsrTracker(1, (1, 2), (1,), now_ms=0)
    assert tracker.propose_expansion(2, 0, 0, 0) is None  # never fetched
    tracker.on_fetch(2, 5, 10, now_ms=1)
    assert (
        tracker.propose_expansion(
            2, high_watermark=6, leader_epoch_start_offset=0, partition_epoch=0
        )
        is None
    )
    assert (
        tracker.propose_expansion(
            2, high_watermark=5, leader_epoch_start_offset=7, partition_epoch=0
        )
        is None
    )
    assert tracker.propose_expansion(9, 0, 0, 0) is None  # not a replica
    assert tracker.propose_expansion(2, 5, 5, 0) == (1, 2)
    tracker.clear_pending()
    assert tracker.maximal_isr == (1,)


def test_replica_set_changes_add_and_forget_followers() -> None:
    tracker = IsrTracker(1, (1, 2), (1, 2), now_ms=0)
    tracker.on_fetch(2, 3, 3, now_ms=1)
    tracker.on_committed((1, 2, 4), (1, 2), partition_epoch=1, now_ms=50)
    assert set(tracker.followers) == {2, 4}
    assert tracker.followers[4].last_caught_up_ms == 50
    tracker.on_committed((1, 4), (1,), partition_epoch=2, now_ms=60)
    assert set(tracker.followers) == {4}
    assert not tracker.on_fetch(2, 3, 3, now_ms=70)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(1, 5)),
            st.tuples(st.just("fetch"), st.sampled_from([2, 3]), st.integers(0, 60)),
            st.tuples(st.just("tick"), st.integers(0, 2 * LAG)),
            st.tuples(st.just("commit")),
            st.tuples(st.just("refuse")),
        ),
        max_size=40,
    )
)
def test_high_watermark_never_exceeds_what_the_committed_isr_holds(
    ops: list[tuple[Any, ...]],
) -> None:
    """Whatever the interleaving of appends, fetches, shrink proposals and commits: the high
    watermark never decreases, and never exceeds the minimum log end offset over the committed
    ISR (so a deposed leader whose shrink never got committed exposed nothing the old ISR
    lacks) nor over the maximal ISR."""
    with tempfile.TemporaryDirectory() as tmp:
        part = make_partition(Path(tmp))
        now = 0
        previous = part.high_watermark
        held = {2: 0, 3: 0}  # what each follower proved it holds
        for op in ops:
            if op[0] == "append":
                part.append_as_leader(batch(op[1]), acks=1)
            elif op[0] == "fetch":
                offset = min(op[2], part.log_end_offset)
                part.record_follower_fetch(op[1], offset, now)
                held[op[1]] = offset
                new_isr = part.propose_isr_expansion(op[1])
                if new_isr is not None:
                    assert held[op[1]] >= part.high_watermark
            elif op[0] == "tick":
                now += op[1]
                part.propose_isr_shrink(now, LAG)
            elif op[0] == "commit" and part.isr_change_pending:
                pending = part._isr.pending
                assert pending is not None
                a = part.assignment
                part.update_assignment(
                    PartitionAssignment(
                        a.leader, a.leader_epoch, a.replicas, pending.new_isr, a.partition_epoch + 1
                    ),
                    now,
                )
            elif op[0] == "refuse" and part.isr_change_pending:
                part.on_isr_change_failed(stale_epoch=False)
            hw = part.high_watermark
            assert hw >= previous
            for isr in (part.assignment.isr, part.maximal_isr):
                ends = [part.log_end_offset] + [held[r] for r in isr if r != 1]
                assert hw <= min(ends) or hw == previous
            previous = hw


# --- partition: leader fencing, follower append/truncate, checkpointed HW -------------------


def test_stale_epoch_refusal_fences_the_leader_until_newer_metadata(tmp_path: Path) -> None:
    part = make_partition(tmp_path, isr=(1, 2), partition_epoch=3)
    part.append_as_leader(batch(3), acks=1)
    part.record_follower_fetch(2, 1, now_ms=0)
    assert part.propose_isr_shrink(10 * LAG, LAG) == (1,)
    part.on_isr_change_failed(stale_epoch=True)
    with pytest.raises(NotLeaderOrFollowerError):
        part.check_produce(acks=1)
    assert not part.record_follower_fetch(2, 3, now_ms=1)  # a fenced leader commits nothing
    assert part.high_watermark == 1
    assert part.propose_isr_expansion(2) is None
    part.update_assignment(PartitionAssignment(1, 0, (1, 2, 3), (1, 2), 4), now_ms=2)
    part.check_produce(acks=1)
    assert part.high_watermark == 3


def test_leader_records_its_epoch_start_and_follower_appends_keep_offsets(tmp_path: Path) -> None:
    leader = make_partition(tmp_path, epoch=4, name="leader")
    assert leader.log.end_offset_for_epoch(4) == (4, 0)
    leader.append_as_leader(batch(3), acks=1)
    follower = make_partition(tmp_path, broker_id=2, epoch=4, name="follower")
    assert follower.log.latest_epoch == -1  # followers record epochs only from batches
    data = leader.log.read(0, 1 << 20)
    assert follower.append_as_follower(data, leader_high_watermark=2) == len(data)
    assert (follower.log_end_offset, follower.high_watermark) == (3, 2)
    assert follower.log.read(0, 1 << 20) == data
    with pytest.raises(NotLeaderOrFollowerError):
        leader.append_as_follower(data, 0)
    with pytest.raises(InvalidRecordError):
        leader.truncate_to(0)


def test_truncation_drops_an_epoch_assigned_but_never_written(tmp_path: Path) -> None:
    """A broker that became leader (epoch 2 at offset 3) and was deposed before appending: as a
    follower its epoch cache must forget epoch 2, or it would ask about it forever."""
    part = make_partition(tmp_path, epoch=1)
    part.append_as_leader(batch(3), acks=1)
    part.update_assignment(PartitionAssignment(1, 2, (1, 2, 3), (1, 2, 3), 1))
    assert part.log.latest_epoch == 2
    part.update_assignment(PartitionAssignment(2, 3, (1, 2, 3), (2, 3), 2))
    part.truncate_to(3)  # nothing to remove from the log...
    assert part.log.latest_epoch == 1  # ...but the unwritten epoch is gone
    assert part.log_end_offset == 3


def test_checkpointed_high_watermark_is_capped_at_the_log_end(tmp_path: Path) -> None:
    part = make_partition(tmp_path, initial_hw=10, replicas=(1, 2), name="a")
    assert part.high_watermark == 0
    part.log.append(batch(4), 0)
    part.log.close()
    again = make_partition(tmp_path, initial_hw=3, replicas=(1, 2), name="a")
    assert again.high_watermark == 3  # not the log start: committed data stays visible
    again.log.close()
    capped = make_partition(tmp_path, initial_hw=99, replicas=(1, 2), name="a")
    assert capped.high_watermark == 4


# --- truncation decisions ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("leader_answer", "local", "leo", "hw", "expected"),
    [
        ((-1, -1), (-1, -1), 10, 4, Truncation(4, True)),  # the leader knows nothing: to the HW
        ((-1, 6), (2, 10), 10, 4, Truncation(6, True)),  # no epoch, an end offset
        ((2, 6), (-1, -1), 10, 4, Truncation(6, True)),  # we know no such epoch
        ((2, 6), (1, 8), 10, 4, Truncation(8, False)),  # our epoch differs: ask again
        ((2, 6), (2, 10), 10, 4, Truncation(6, True)),  # same epoch: the smaller end
        ((2, 12), (2, 10), 10, 4, Truncation(10, True)),  # never past our own end
    ],
)
def test_truncation_for_divergence(
    leader_answer: tuple[int, int],
    local: tuple[int, int],
    leo: int,
    hw: int,
    expected: Truncation,
) -> None:
    assert truncation_for_divergence(*leader_answer, local, leo, hw) == expected


@settings(max_examples=40, deadline=None)
@given(
    common=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3)), max_size=4),
    follower_epoch_step=st.integers(0, 1),
    follower_tail=st.lists(st.integers(1, 3), max_size=3),
    leader_tail=st.lists(st.tuples(st.integers(1, 2), st.integers(1, 3)), max_size=3),
    leader_appends=st.integers(0, 2),
)
def test_diverged_follower_converges_to_the_leader_log(
    common: list[tuple[int, int]],
    follower_epoch_step: int,
    follower_tail: list[int],
    leader_tail: list[tuple[int, int]],
    leader_appends: int,
) -> None:
    """Build a common history, a follower tail in an epoch the new leader stopped or never saw,
    and leader-only batches in later epochs; run the fetch protocol (divergence answer ->
    truncation -> refetch). The follower always ends byte-identical to the leader and never
    truncates into the common prefix."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        leader_log = PartitionLog.open(base / "leader", LogConfig())
        follower_log = PartitionLog.open(base / "follower", LogConfig())
        epoch = 0
        for step, n in common:
            epoch += step
            data = batch(n)
            info = leader_log.append(data, epoch)
            follower_log.append_as_follower(leader_log.read(info.first_offset, 1 << 20))
        common_end = leader_log.log_end_offset
        follower_epoch = epoch + follower_epoch_step
        for n in follower_tail:  # the follower led in follower_epoch and wrote these alone
            follower_log.append(batch(n), follower_epoch)
        leader_epoch = follower_epoch
        for step, n in leader_tail:  # later leaders the follower never heard of
            leader_epoch += step
            leader_log.append(batch(n), leader_epoch)
        final_epoch = leader_epoch + 1
        replicas = (1, 2)
        leader = Partition(
            "t",
            0,
            1,
            leader_log,
            PartitionAssignment(1, final_epoch, replicas, replicas),
            min_insync_replicas=1,
        )
        for _ in range(leader_appends):
            leader.append_as_leader(batch(2), acks=1)
        follower = Partition(
            "t",
            0,
            2,
            follower_log,
            PartitionAssignment(1, final_epoch, replicas, replicas),
            min_insync_replicas=1,
        )
        lowest = follower.log_end_offset
        for _ in range(50):
            fetch_offset = follower.log_end_offset
            last_epoch = follower.log.latest_epoch if fetch_offset > 0 else -1
            diverging = leader.diverging_epoch(last_epoch, fetch_offset)
            if diverging is None:
                if fetch_offset >= leader.log_end_offset:
                    break
                follower.append_as_follower(
                    leader.log.read(fetch_offset, 1 << 20), leader.high_watermark
                )
                continue
            decision = truncation_for_divergence(
                *diverging,
                follower.log.end_offset_for_epoch(diverging[0]),
                follower.log_end_offset,
                follower.high_watermark,
            )
            follower.truncate_to(decision.offset)
            lowest = min(lowest, follower.log_end_offset)
        else:
            raise AssertionError("the follower did not converge within 50 fetches")
        assert follower.log_end_offset == leader.log_end_offset
        assert follower.log.read(0, 1 << 24) == leader.log.read(0, 1 << 24)
        assert lowest >= common_end
        leader_log.close()
        follower_log.close()


# --- fetch requests per source broker -------------------------------------------------------


def test_partitions_are_grouped_by_their_leader() -> None:
    targets = {
        ("a", 0): FollowerTarget(2, 5),
        ("a", 1): FollowerTarget(3, 1),
        ("b", 0): FollowerTarget(2, 7),
        ("c", 0): FollowerTarget(-1, 2),  # offline: nobody to fetch from
    }
    groups = group_by_source(targets)
    assert set(groups) == {2, 3}
    assert set(groups[2]) == {("a", 0), ("b", 0)}
    assert groups[3] == {("a", 1): FollowerTarget(3, 1)}


def test_one_fetch_request_carries_every_partition_of_a_source() -> None:
    s = ReplicationSettings(fetch_wait_max_ms=250, fetch_max_bytes=4096)
    request = build_fetch_request(
        7,
        42,
        [
            FollowerPosition("a", 0, 10, 3, 5, 0),
            FollowerPosition("b", 2, 0, -1, 1, 0),
            FollowerPosition("a", 1, 4, 2, 5, 2),
        ],
        s,
    )
    assert (request.replica_id, request.replica_epoch, request.max_wait_ms) == (7, 42, 250)
    assert [t.name for t in request.topics] == ["a", "b"]
    a0, a1 = request.topics[0].partitions
    assert (a0.partition, a0.fetch_offset, a0.last_fetched_epoch, a0.current_leader_epoch) == (
        0,
        10,
        3,
        5,
    )
    assert (a1.partition, a1.log_start_offset, a1.partition_max_bytes) == (1, 2, 4096)
    assert request.topics[1].partitions[0].last_fetched_epoch == -1


def test_replication_settings_from_broker_config() -> None:
    s = ReplicationSettings.from_config({"replica.lag.time.max.ms": "5000"})
    assert s.lag_time_max_ms == 5000 and s.fetch_wait_max_ms == 500
    with pytest.raises(ConfigError, match=r"replica\.lag\.time\.max\.ms"):
        ReplicationSettings.from_config({"replica.lag.time.max.ms": "soon"})
    with pytest.raises(ConfigError, match=r"replica\.fetch\.backoff\.ms"):
        validate_broker_config({"replica.fetch.backoff.ms": "0"})
    assert validate_broker_config({"replica.fetch.wait.max.ms": "100"})


# --- high-watermark checkpoint ----------------------------------------------------------------

topic_names = st.text(alphabet="abcxyz._-0123456789", min_size=1, max_size=12)


@settings(max_examples=30, deadline=None)
@given(st.dictionaries(st.tuples(topic_names, st.integers(0, 99)), st.integers(0, 2**62)))
def test_hw_checkpoint_round_trip(entries: dict[tuple[str, int], int]) -> None:
    assert parse_hw_checkpoint(format_hw_checkpoint(entries)) == entries


def test_hw_checkpoint_is_kafkas_text_format(tmp_path: Path) -> None:
    text = format_hw_checkpoint({("orders", 1): 1498, ("orders", 0): 1500})
    assert text == "0\n2\norders 0 1500\norders 1 1498\n"
    checkpoint = HighWatermarkCheckpoint(tmp_path)
    assert checkpoint.read() == {}
    checkpoint.write({("t", 0): 5})
    assert (tmp_path / "replication-offset-checkpoint").read_text() == "0\n1\nt 0 5\n"
    assert checkpoint.read() == {("t", 0): 5}
    (tmp_path / "replication-offset-checkpoint").write_text("garbage")
    assert checkpoint.read() == {}  # unusable: start from the log start, never fail


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "missing"),
        ("1\n0\n", "version"),
        ("0\nx\n", "count"),
        ("0\n2\nt 0 1\n", "holds 1"),
        ("0\n1\nt 0\n", "bad line"),
        ("0\n1\nt zero 1\n", "bad line"),
        ("0\n1\nt 0 -5\n", "negative"),
    ],
)
def test_malformed_hw_checkpoints_are_named(text: str, problem: str) -> None:
    with pytest.raises(StorageError, match=problem):
        parse_hw_checkpoint(text)
