"""fjord.storage.cleaner on real files: a clean compacts every closed segment and never the
active one, indexes still find every offset, the swap survives a crash at every step (the
reopened log is as it was or as it will be, never a mix), and a clean that sees the log
truncated under it changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fjord.records import BatchBuilder, decode_records, read_batches
from fjord.storage import LogConfig, PartitionLog
from fjord.storage.cleaner import clean_log, log_dirty_state, read_first_dirty_offset
from fjord.storage.swap import CLEANED_SUFFIX, SWAP_SUFFIX

CONFIG = LogConfig.from_dict({"segment.bytes": 400, "index.interval.bytes": 100})
NOW = 1_000_000
STEPS = ["written", "marked", "replaced", "checkpointed"]


class Crash(Exception):
    """Stands for the process dying after a step of the clean."""


def fill(log: PartitionLog, updates: list[tuple[bytes, bytes | None]]) -> None:
    for i, (key, value) in enumerate(updates):
        builder = BatchBuilder()
        builder.append(NOW - 100_000 + i, key, value)
        log.append(builder.build(), leader_epoch=0, now_ms=NOW)


def everything(log: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    out: list[tuple[int, bytes | None, bytes | None]] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20)
        assert data, f"read at {offset} returned nothing before the log end"
        out.extend((r.offset, r.key, r.value) for r in decode_records(data))
        offset = list(read_batches(data))[-1].next_offset
    return out


def compacted(records, end: int, *, drop_tombstones: bool):
    last = {key: offset for offset, key, _ in records if offset < end}
    return [(o, k, v) for o, k, v in records
            if o >= end or (last[k] == o and not (drop_tombstones and v is None))]


updates = st.lists(
    st.tuples(st.sampled_from([b"a", b"b", b"c", b"d"]),
              st.one_of(st.none(), st.binary(min_size=1, max_size=40))),
    min_size=10, max_size=60,
)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(updates, st.booleans())
def test_clean_keeps_last_value_per_key_and_the_active_segment(tmp_path_factory, plan, drop):
    directory = tmp_path_factory.mktemp("log")
    log = PartitionLog.open(directory, CONFIG, now_ms=NOW)
    fill(log, plan)
    before = everything(log)
    active = log.active_segment
    active_bytes = active.read(0, active.size)
    end = active.base_offset
    stats = clean_log(log, now_ms=NOW, delete_retention_ms=0 if drop else 10**9)
    if end == 0:
        assert stats is None
    else:
        assert stats is not None and stats.cleaned_to == end
    expected = compacted(before, end, drop_tombstones=drop)
    assert everything(log) == expected
    assert log.active_segment is active and active.read(0, active.size) == active_bytes
    # Every offset is still found (the rebuilt indexes), a gap answers with the next batch.
    for offset in range(log.log_start_offset, log.log_end_offset):
        first = next(iter(decode_records(log.read(offset, 1))), None)
        later = [r for r in expected if r[0] >= offset]
        if later and first is not None:
            assert first.offset == later[0][0] or first.offset < offset <= later[0][0]
    log.close()
    reopened = PartitionLog.open(directory, CONFIG, now_ms=NOW)
    assert everything(reopened) == expected
    assert read_first_dirty_offset(directory) == (end if end else 0)
    reopened.close()


@pytest.mark.parametrize("crash_at", range(len(STEPS) + 3))
def test_a_crash_at_every_step_leaves_the_log_as_it_was_or_as_it_will_be(
    tmp_path: Path, crash_at: int
) -> None:
    log = PartitionLog.open(tmp_path, CONFIG, now_ms=NOW)
    fill(log, [(b"k%d" % (i % 3), b"v%d" % i) for i in range(40)])
    before = everything(log)
    end = log.active_segment.base_offset
    after = compacted(before, end, drop_tombstones=True)
    calls: list[str] = []

    def step(name: str) -> None:
        calls.append(name)
        if len(calls) - 1 == crash_at:
            raise Crash(name)

    try:
        clean_log(log, now_ms=NOW, delete_retention_ms=0, on_step=step)
        crashed_after = None
    except Crash as crash:
        crashed_after = str(crash)
    log.abandon()
    reopened = PartitionLog.open(tmp_path, CONFIG, now_ms=NOW)
    seen = everything(reopened)
    if crashed_after == "written":
        assert seen == before
    else:
        assert seen == after, crashed_after
    assert not list(tmp_path.glob("*" + CLEANED_SUFFIX))
    assert not list(tmp_path.glob("*" + SWAP_SUFFIX))
    # Whatever happened, the next clean finishes the job, and the log takes appends again.
    clean_log(reopened, now_ms=NOW, delete_retention_ms=0)
    assert everything(reopened) == after
    fill(reopened, [(b"k0", b"new")])
    assert everything(reopened)[-1][1:] == (b"k0", b"new")
    reopened.close()
    assert crash_at >= len(calls) or calls[crash_at] == crashed_after


def test_a_crash_between_marking_renames_is_finished_at_open(tmp_path: Path) -> None:
    """The state after step 2 with some segments already replaced: no .cleaned, some .swap."""
    log = PartitionLog.open(tmp_path, CONFIG, now_ms=NOW)
    fill(log, [(b"k%d" % (i % 2), b"v%d" % i) for i in range(40)])
    before = everything(log)
    after = compacted(before, log.active_segment.base_offset, drop_tombstones=True)
    replaced = []

    def step(name: str) -> None:
        if name == "replaced":
            replaced.append(name)
            if len(replaced) == 2:
                raise Crash(name)

    with pytest.raises(Crash):
        clean_log(log, now_ms=NOW, delete_retention_ms=0, on_step=step)
    assert list(tmp_path.glob("*" + SWAP_SUFFIX))
    log.abandon()
    reopened = PartitionLog.open(tmp_path, CONFIG, now_ms=NOW)
    assert everything(reopened) == after
    reopened.close()


def test_a_clean_that_sees_the_log_truncated_changes_nothing(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, CONFIG, now_ms=NOW)
    fill(log, [(b"k", b"v%d" % i) for i in range(40)])

    def truncate(name: str) -> None:
        if name == "written":
            log.truncate_to(5, now_ms=NOW)

    before_truncation = everything(log)
    assert clean_log(log, now_ms=NOW, delete_retention_ms=0, on_step=truncate) is None
    assert everything(log) == before_truncation[:5]
    assert not list(tmp_path.glob("*" + CLEANED_SUFFIX))
    log.close()


def test_dirty_state_and_lag(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, CONFIG, now_ms=NOW)
    fill(log, [(b"k", b"v%d" % i) for i in range(40)])
    state = log_dirty_state(log, NOW, 0)
    assert state.first_dirty_offset == 0 and state.clean_bytes == 0 and state.dirty_ratio == 1.0
    assert log_dirty_state(log, NOW, 10**9).cleanable_end == 0  # every record is too young
    clean_log(log, now_ms=NOW, delete_retention_ms=0)
    state = log_dirty_state(log, NOW, 0)
    assert state.dirty_bytes == 0 and state.first_dirty_offset == state.cleanable_end
    log.close()


def test_a_follower_copies_compacted_batches_and_keeps_them_through_a_crash(
    tmp_path: Path,
) -> None:
    leader = PartitionLog.open(tmp_path / "leader", CONFIG, now_ms=NOW)
    fill(leader, [(b"k%d" % (i % 3), b"v%d" % i) for i in range(40)])
    clean_log(leader, now_ms=NOW, delete_retention_ms=0)
    follower = PartitionLog.open(tmp_path / "follower", CONFIG, now_ms=NOW)
    offset = 0
    while offset < leader.log_end_offset:
        data = leader.read(offset, 1 << 20)
        follower.append_as_follower(data, now_ms=NOW)
        offset = follower.log_end_offset
    assert everything(follower) == everything(leader)
    follower.abandon()  # a crash: recovery re-reads everything and must not cut at a gap
    reopened = PartitionLog.open(tmp_path / "follower", CONFIG, now_ms=NOW)
    assert everything(reopened) == everything(leader)
    reopened.close()
    leader.close()


def test_a_compacted_log_refuses_a_record_without_key_and_loses_nothing(tmp_path: Path) -> None:
    from fjord.errors import InvalidRecordError

    config = LogConfig.from_dict({"cleanup.policy": "compact"})
    log = PartitionLog.open(tmp_path, config, now_ms=NOW)
    fill(log, [(b"k", b"v")])
    builder = BatchBuilder()
    builder.append(NOW, b"k", b"with key")
    builder.append(NOW, None, b"without")
    with pytest.raises(InvalidRecordError, match="without a key"):
        log.append(builder.build(), leader_epoch=0, now_ms=NOW)
    assert everything(log) == [(0, b"k", b"v")]
    log.close()


def test_retention_deletes_nothing_without_the_delete_policy(tmp_path: Path) -> None:
    config = LogConfig.from_dict({"cleanup.policy": "compact", "segment.bytes": "400",
                                  "retention.ms": "1"})
    log = PartitionLog.open(tmp_path, config, now_ms=NOW)
    fill(log, [(b"k%d" % i, b"v") for i in range(40)])
    assert log.apply_retention(now_ms=NOW * 10) == 0 and log.log_start_offset == 0
    log.close()


def test_a_truncation_below_the_checkpoint_makes_the_rewritten_offsets_dirty(
    tmp_path: Path,
) -> None:
    log = PartitionLog.open(tmp_path, CONFIG, now_ms=NOW)
    fill(log, [(b"k%d" % (i % 3), b"v%d" % i) for i in range(40)])
    stats = clean_log(log, now_ms=NOW, delete_retention_ms=0)
    assert stats is not None and read_first_dirty_offset(tmp_path) == stats.cleaned_to
    log.truncate_to(5, now_ms=NOW)
    assert read_first_dirty_offset(tmp_path) == log.log_end_offset <= 5
    fill(log, [(b"k0", b"again-%d" % i) for i in range(40)])
    clean_log(log, now_ms=NOW, delete_retention_ms=0)
    active_base = log.active_segment.base_offset
    values = [v for o, k, v in everything(log) if k == b"k0" and o < active_base]
    assert len(values) <= 1
    log.close()


def test_every_read_of_a_clean_goes_through_the_throttle(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, CONFIG, now_ms=NOW)
    fill(log, [(b"k%d" % (i % 3), b"v%d" % i) for i in range(40)])
    asked: list[int] = []
    stats = clean_log(log, now_ms=NOW, delete_retention_ms=0, throttle=asked.append)
    assert stats is not None
    # Pass 1 reads the dirty segments (all of them: nothing was clean), pass 2 rewrites each.
    assert sum(asked) == 2 * stats.bytes_read
    log.close()


def test_cleaner_settings_and_their_typed_errors() -> None:
    from fjord.cluster.broker_config import validate_broker_config
    from fjord.cluster.cleaner_config import CleanerSettings
    from fjord.errors import ConfigError

    assert CleanerSettings.from_config({}) == CleanerSettings()
    assert CleanerSettings.from_config(
        {"log.cleaner.enable": "False", "log.cleaner.backoff.ms": "5",
         "log.cleaner.io.max.bytes.per.second": "1024",
         "log.cleaner.dedupe.buffer.size": "4096"}) == CleanerSettings(False, 1024, 5, 4096)
    for key, bad in (("log.cleaner.enable", "yes"), ("log.cleaner.backoff.ms", "0"),
                     ("log.cleaner.io.max.bytes.per.second", "fast"),
                     ("log.cleaner.dedupe.buffer.size", "0")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            validate_broker_config({key: bad})


bounded_updates = st.lists(
    st.tuples(st.sampled_from([b"k%d" % i for i in range(12)]),
              st.one_of(st.none(), st.binary(min_size=1, max_size=20))),
    min_size=10, max_size=60,
)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bounded_updates, st.integers(1, 4), st.booleans())
def test_a_bounded_offset_map_cleans_in_rounds_to_the_same_log(
    tmp_path_factory, plan, keys_that_fit, drop
) -> None:
    """log.cleaner.dedupe.buffer.size: with room for only a few keys each clean stops where
    its map filled (the checkpoint moves there, inside a segment if need be); the rounds that
    follow end with the log one unbounded clean makes."""
    from fjord.storage.compaction import offset_map_entry_bytes

    directory = tmp_path_factory.mktemp("bounded")
    log = PartitionLog.open(directory, CONFIG, now_ms=NOW)
    fill(log, plan)
    before = everything(log)
    end = log.active_segment.base_offset
    bound = keys_that_fit * offset_map_entry_bytes(b"k10")
    rounds, checkpoints = 0, []
    while (stats := clean_log(log, now_ms=NOW, delete_retention_ms=0 if drop else 10**9,
                              max_map_bytes=bound)) is not None:
        rounds += 1
        checkpoints.append(stats.cleaned_to)
        assert 0 < stats.offset_map_bytes <= bound
        assert read_first_dirty_offset(directory) == stats.cleaned_to <= end
        assert rounds <= len(plan), "a clean made no progress"
    assert checkpoints == sorted(set(checkpoints))
    assert (checkpoints[-1] if checkpoints else 0) == end
    distinct_below_end = len({key for offset, key, _ in before if offset < end})
    if distinct_below_end > keys_that_fit:
        assert rounds >= 2
    assert everything(log) == compacted(before, end, drop_tombstones=drop)
    log.close()
    reopened = PartitionLog.open(directory, CONFIG, now_ms=NOW)  # gaps inside segments: normal
    assert everything(reopened) == compacted(before, end, drop_tombstones=drop)
    reopened.close()


@pytest.mark.parametrize("crash_at", range(len(STEPS) + 1))
def test_a_crash_in_a_round_that_ends_inside_a_segment(tmp_path: Path, crash_at: int) -> None:
    """A bounded map ends the clean at a batch inside a segment: a crash at every step still
    leaves the log as it was or as that round makes it, and later rounds finish the job."""
    from fjord.storage.compaction import offset_map_entry_bytes

    bound = 4 * offset_map_entry_bytes(b"k10")
    plan = [(b"k%d" % (i % 2), b"v%d" % i) for i in range(10)]
    plan += [(b"k%d" % i, b"w%d" % i) for i in range(2, 30)]

    dry = PartitionLog.open(tmp_path / "dry", CONFIG, now_ms=NOW)
    fill(dry, plan)
    stats = clean_log(dry, now_ms=NOW, delete_retention_ms=0, max_map_bytes=bound)
    dry.close()
    assert stats is not None
    round_end = stats.cleaned_to
    directory = tmp_path / "log"
    log = PartitionLog.open(directory, CONFIG, now_ms=NOW)
    fill(log, plan)
    before = everything(log)
    end = log.active_segment.base_offset
    assert 0 < round_end < end
    assert round_end not in {s.base_offset for s in log.segments}  # inside a segment
    calls: list[str] = []

    def step(name: str) -> None:
        calls.append(name)
        if len(calls) - 1 == crash_at:
            raise Crash(name)

    try:
        clean_log(log, now_ms=NOW, delete_retention_ms=0, on_step=step, max_map_bytes=bound)
        crashed_after = None
    except Crash as crash:
        crashed_after = str(crash)
    log.abandon()
    reopened = PartitionLog.open(directory, CONFIG, now_ms=NOW)
    if crashed_after == "written":
        assert everything(reopened) == before
    else:
        assert everything(reopened) == compacted(before, round_end, drop_tombstones=True)
    for _ in range(len(plan)):
        if clean_log(reopened, now_ms=NOW, delete_retention_ms=0, max_map_bytes=bound) is None:
            break
    assert read_first_dirty_offset(directory) == end
    assert everything(reopened) == compacted(before, end, drop_tombstones=True)
    reopened.close()
