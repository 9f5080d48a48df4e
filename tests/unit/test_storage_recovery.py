"""Crash recovery, proved by property tests that damage files at random byte positions.

Whatever the damage, the log reopens, holds a prefix of what was appended, and never serves a
partial or corrupt batch; what was flushed before a crash survives damage to the unflushed tail.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fjord.errors import StorageError
from fjord.records.header import iter_batches, parse_header
from fjord.storage import LogConfig, LogManager, PartitionLog
from fjord.storage.epoch import LeaderEpochCache
from fjord.storage.testing import make_batch

CONFIG = LogConfig.from_dict({"segment.bytes": 1500, "index.interval.bytes": 120})
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

appends = st.lists(
    st.tuples(st.integers(1, 5), st.integers(0, 80), st.integers(0, 3), st.booleans()),
    min_size=1,
    max_size=30,
)  # (records, value size, leader epoch step, flush after)


def build(
    directory: Path, plan: list[tuple[int, int, int, bool]]
) -> tuple[PartitionLog, list[bytes], int]:
    """Append per the plan; returns the log, every stamped batch and the recovery point."""
    log = PartitionLog.open(directory, CONFIG, now_ms=0)
    stamped, epoch = [], 0
    for i, (records, size, epoch_step, flush) in enumerate(plan):
        epoch += epoch_step
        values = [bytes([97 + (i + r) % 26]) * size for r in range(records)]
        info = log.append(make_batch(values, 1000 + i), epoch, now_ms=i)
        stamped.append(log.read(info.first_offset, 1))
        if flush:
            log.flush()
    return log, stamped, log.recovery_point


def read_all(log: PartitionLog) -> list[bytes]:
    """Every batch from the log start to the log end, each checked (header, length, CRC)."""
    out, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20)
        assert data, f"no data at {offset} below the log end {log.log_end_offset}"
        for pos, header in iter_batches(data):  # raises on a partial or corrupt batch
            out.append(bytes(data[pos : pos + header.size]))
            offset = header.next_offset
    return out


def without_epoch(batch: bytes) -> bytes:
    """The batch with its partition leader epoch (bytes 12-15) blanked. That field lies outside
    the CRC by the format's design (Kafka's too, so a leader can stamp it), so damage there is
    undetectable; everything else must match exactly."""
    return batch[:12] + b"\0\0\0\0" + batch[16:]


def assert_prefix(log: PartitionLog, stamped: list[bytes]) -> list[bytes]:
    got = read_all(log)
    assert [without_epoch(b) for b in got] == [without_epoch(b) for b in stamped[: len(got)]]
    end = parse_header(got[-1]).next_offset if got else log.log_start_offset
    assert log.log_end_offset == end
    # the epoch cache describes exactly the surviving batches (an epoch starts at the first
    # batch that carries a higher epoch than all before it, Kafka's rule)
    expected_epochs: list[tuple[int, int]] = []
    for raw in got:
        h = parse_header(raw)
        # a negative epoch is never cached (Kafka's rule): the epoch field is outside the CRC,
        # so damage can flip it, e.g. 0 to -2**31, undetected
        if h.partition_leader_epoch < 0:
            continue
        if not expected_epochs or h.partition_leader_epoch > expected_epochs[-1][0]:
            expected_epochs.append((h.partition_leader_epoch, h.base_offset))
    assert log.epoch_cache.entries == expected_epochs
    # and the log takes new appends at its end
    info = log.append(make_batch([b"after"]), log.latest_epoch + 1, now_ms=0)
    assert info.first_offset == (parse_header(got[-1]).next_offset if got else 0)
    return got


def damage(path: Path, kind: int, where: float, value: int, keep: int = 0) -> None:
    """Damage ``path`` at a byte position chosen by ``where`` (0..1) among those at or after
    ``keep`` (bytes that must stay intact)."""
    size = path.stat().st_size
    pos = keep + int(where * (size - keep))
    if kind == 0 and size:  # flip one byte
        with open(path, "r+b") as f:
            f.seek(min(pos, size - 1))
            byte = f.read(1)
            f.seek(min(pos, size - 1))
            f.write(bytes([byte[0] ^ (value or 1)]))
    elif kind == 1:  # cut the file
        os.truncate(path, pos)
    elif kind == 2:  # garbage appended (a torn write of something else)
        with open(path, "ab") as f:
            f.write(bytes([value]) * (1 + value % 70))
    elif kind == 3 and path.suffix == ".log":
        # a segment whose content never reached the disk (deleting the first segment outright
        # is retention's business: the log would then rightly start at the next segment)
        os.truncate(path, 0)
    elif kind == 3:
        path.unlink()


damages = st.lists(
    st.tuples(st.integers(0, 1000), st.integers(0, 3), st.floats(0, 1), st.integers(0, 255)),
    min_size=1,
    max_size=4,
)


@SETTINGS
@given(plan=appends, hits=damages)
def test_crash_with_damage_past_the_recovery_point_keeps_everything_flushed(
    tmp_path_factory: pytest.TempPathFactory,
    plan: list[tuple[int, int, int, bool]],
    hits: list[tuple[int, int, float, int]],
) -> None:
    directory = tmp_path_factory.mktemp("crash") / "t-0"
    log, stamped, recovery_point = build(directory, plan)
    flushed = sum(1 for raw in stamped if parse_header(raw).next_offset <= recovery_point)
    segments = [(s.base_offset, s.size) for s in log.segments]
    flushed_sizes = {}
    for base, size in segments:  # bytes of each segment below the recovery point
        flushed_sizes[base] = size if base < recovery_point else 0
    last = [s for s in log.segments if s.base_offset <= recovery_point][-1]
    found = last.locate(recovery_point)
    flushed_sizes[last.base_offset] = found[0] if found else last.size
    log.abandon()  # the crash: no flush, no checkpoint, no clean-shutdown marker
    for choice, kind, where, value in hits:
        files = sorted(
            p for p in directory.iterdir() if p.suffix in (".log", ".index", ".timeindex")
        )
        path = files[choice % len(files)]
        keep = 0
        if path.suffix == ".log":
            keep = flushed_sizes.get(int(path.stem), 0)
            if path.stat().st_size <= keep or (kind == 3 and keep):
                continue  # only the unflushed tail of a log may be torn by a crash
        damage(path, kind, where, value, keep)
    reopened = PartitionLog.open(directory, CONFIG)
    assert reopened.log_end_offset >= recovery_point
    got = assert_prefix(reopened, stamped)
    assert len(got) >= flushed
    reopened.close()


@SETTINGS
@given(plan=appends, hits=damages, lose_checkpoints=st.booleans())
def test_any_damage_anywhere_with_full_recovery_leaves_a_valid_prefix(
    tmp_path_factory: pytest.TempPathFactory,
    plan: list[tuple[int, int, int, bool]],
    hits: list[tuple[int, int, float, int]],
    lose_checkpoints: bool,
) -> None:
    directory = tmp_path_factory.mktemp("any") / "t-0"
    log, stamped, _ = build(directory, plan)
    log.abandon()
    (directory / "partition-checkpoint").unlink()  # unknown recovery point: check it all
    if lose_checkpoints:
        (directory / "leader-epoch-checkpoint").unlink(missing_ok=True)  # written at flush
    for choice, kind, where, value in hits:
        files = sorted(p for p in directory.iterdir() if not p.name.startswith("."))
        damage(files[choice % len(files)], kind, where, value)
    reopened = PartitionLog.open(directory, CONFIG)
    assert reopened.recovery is not None and not reopened.recovery.clean_shutdown
    assert_prefix(reopened, stamped)
    reopened.close()


@SETTINGS
@given(plan=appends, hits=damages)
def test_damaged_indexes_after_a_clean_close_never_change_what_is_read(
    tmp_path_factory: pytest.TempPathFactory,
    plan: list[tuple[int, int, int, bool]],
    hits: list[tuple[int, int, float, int]],
) -> None:
    directory = tmp_path_factory.mktemp("index") / "t-0"
    log, stamped, _ = build(directory, plan)
    log.close()
    for choice, kind, where, value in hits:
        files = sorted(p for p in directory.iterdir() if p.suffix in (".index", ".timeindex"))
        if not files:
            break  # every index file deleted already
        damage(files[choice % len(files)], kind, where, value)
    reopened = PartitionLog.open(directory, CONFIG)
    assert read_all(reopened) == stamped
    for raw in stamped:  # every offset, not only batch starts, finds its batch
        h = parse_header(raw)
        assert reopened.read(h.last_offset, 1) == raw
    reopened.close()


def test_torn_last_batch_is_cut_and_indexes_rebuilt(tmp_path: Path) -> None:
    log, stamped, _ = build(tmp_path / "t-0", [(2, 30, 0, False)] * 12)
    active = log.active_segment
    log.abandon()
    log_path = active.path(".log")
    os.truncate(log_path, log_path.stat().st_size - 7)
    active.path(".index").unlink()
    reopened = PartitionLog.open(tmp_path / "t-0", CONFIG)
    report = reopened.recovery
    assert report is not None and report.truncated_bytes == len(stamped[-1]) - 7
    assert read_all(reopened) == stamped[:-1]
    assert active.path(".index").exists()
    reopened.close()


def test_log_manager_loads_every_partition_and_reports_bad_ones(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = LogManager(tmp_path, CONFIG)
    for topic, partition in [("orders", 0), ("orders", 1), ("my-topic.v2", 10)]:
        log = manager.get_or_create(topic, partition)
        log.append(make_batch([topic.encode()]), 0, now_ms=0)
    with pytest.raises(StorageError, match="in use"):
        LogManager(tmp_path, CONFIG)
    crashed = manager.get("orders", 1)
    assert crashed is not None
    crashed.append(make_batch([b"unflushed"]), 0, now_ms=0)
    manager._logs.pop(("orders", 1))
    crashed.abandon()
    manager.close()

    with caplog.at_level("INFO", logger="fjord.storage.manager"):
        manager = LogManager(tmp_path, CONFIG)
    # one line for the directory, not one per recovered log (thousands after a crash)
    assert [r.getMessage().split(" from ")[0] for r in caplog.records] == [
        "loaded 3 partition logs"
    ]
    assert "(1 recovered after an unclean shutdown)" in caplog.records[0].getMessage()
    assert sorted(manager.logs()) == [("my-topic.v2", 10), ("orders", 0), ("orders", 1)]
    orders_1 = manager.get("orders", 1)
    assert orders_1 is not None and orders_1.log_end_offset == 2
    assert orders_1.recovery is not None and not orders_1.recovery.clean_shutdown
    assert manager.logs_needing_flush(now_ms=0) == []
    eager = manager.get_or_create("orders", 0, LogConfig.from_dict({"flush.messages": 1}))
    eager.append(make_batch([b"x"]), 0, now_ms=0)
    assert manager.logs_needing_flush(now_ms=0) == [eager]
    assert manager.delete("orders", 0) and not (tmp_path / "orders-0").exists()
    assert not manager.delete("orders", 0)
    with pytest.raises(Exception, match="invalid topic"):
        manager.get_or_create("bad/name", 0)
    manager.close()

    (tmp_path / "not a partition").mkdir()
    with pytest.raises(StorageError, match="not a partition"):
        LogManager(tmp_path, CONFIG)
    (tmp_path / "not a partition").rmdir()
    (tmp_path / "orders-1" / "00000000000000000xyz.log").write_bytes(b"")
    with pytest.raises(StorageError, match="orders-1"):
        LogManager(tmp_path, CONFIG)


# ---- what an open after a crash makes durable -------------------------------------------------
#
# Opening a log after an unclean stop fsyncs nothing (Kafka's LogLoader): the recovery point
# stays where the checkpoint says and the next flush syncs the re-validated segments before it
# moves. These tests record every fsync and check the invariant that makes this safe: every
# byte below the recovery point the log claims has been fsync'd, so a power loss that takes
# everything else loses nothing below it.


class FsyncRecorder:
    """Wraps os.fsync: the size of every regular file at its last fsync (what a power loss
    keeps of it, at worst) and how many fsyncs ran."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.durable: dict[str, int] = {}
        self.calls = 0
        real = os.fsync

        def fsync(fd: int) -> None:
            real(fd)
            self.calls += 1
            path = os.readlink(f"/proc/self/fd/{fd}")
            if path.endswith(".log"):
                self.durable[path] = os.fstat(fd).st_size

        monkeypatch.setattr(os, "fsync", fsync)

    def assert_recovery_point_durable(self, log: PartitionLog) -> None:
        """Every byte below ``log.recovery_point`` lies within what was fsync'd."""
        for segment in log.segments:
            if segment.base_offset >= log.recovery_point:
                break
            found = segment.locate(log.recovery_point)
            below = found[0] if found and segment.next_offset > log.recovery_point else segment.size
            durable = self.durable.get(str(segment.path(".log")), 0)
            assert below <= durable, (
                f"segment {segment.base_offset}: {below} bytes below the recovery point "
                f"{log.recovery_point}, only {durable} fsync'd"
            )

    def lose_power(self, directory: Path) -> None:
        """What a power loss may leave at worst: each segment file cut to its fsync'd size."""
        for path in directory.glob("*.log"):
            keep = self.durable.get(str(path), 0)
            if path.stat().st_size > keep:
                os.truncate(path, keep)


@SETTINGS
@given(plan=appends, after=appends)
def test_power_loss_after_a_crash_recovery_keeps_everything_below_the_recovery_point(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    plan: list[tuple[int, int, int, bool]],
    after: list[tuple[int, int, int, bool]],
) -> None:
    """Crash, reopen (recovery fsyncs nothing), append and flush per ``after`` (checking at
    every step that the claimed recovery point is durable), then lose power: everything below
    the last recovery point survives."""
    recorder = FsyncRecorder(monkeypatch)
    directory = tmp_path_factory.mktemp("power") / "t-0"
    log, stamped, recovery_point = build(directory, plan)
    recorder.assert_recovery_point_durable(log)
    log.abandon()
    calls = recorder.calls
    log = PartitionLog.open(directory, CONFIG, now_ms=0)
    assert recorder.calls == calls or log.recovery_point != recovery_point  # nothing to persist
    assert log.recovery_point == recovery_point  # not moved past what was fsync'd
    recorder.assert_recovery_point_durable(log)
    epoch = log.latest_epoch
    for i, (records, size, epoch_step, flush) in enumerate(after):
        epoch += epoch_step
        info = log.append(make_batch([b"n" * size] * records, 5000 + i), epoch, now_ms=i)
        stamped.append(log.read(info.first_offset, 1))
        if flush:
            log.flush()
        recorder.assert_recovery_point_durable(log)
    recovery_point = log.recovery_point
    log.abandon()
    recorder.lose_power(directory)
    reopened = PartitionLog.open(directory, CONFIG, now_ms=0)
    got = assert_prefix(reopened, stamped)
    assert reopened.log_end_offset >= recovery_point
    assert sum(1 for raw in got if parse_header(raw).next_offset <= recovery_point) == sum(
        1 for raw in stamped if parse_header(raw).next_offset <= recovery_point
    )
    reopened.close()


def test_a_flush_after_a_crash_recovery_syncs_every_revalidated_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several segments past the recovery point (rolled, never flushed): the open leaves the
    recovery point, and a flush fsyncs all of them, not only the active one, before moving it
    to the log end."""
    recorder = FsyncRecorder(monkeypatch)
    log, _, _ = build(tmp_path / "t-0", [(2, 40, 0, False)] * 3 + [(2, 40, 0, True)]
                      + [(2, 60, 1, False)] * 30)
    flushed_at = log.recovery_point
    log.abandon()
    log = PartitionLog.open(tmp_path / "t-0", CONFIG, now_ms=0)
    past = [s for s in log.segments if s.next_offset > flushed_at]
    assert len(past) >= 3 and log.recovery_point == flushed_at
    assert log.recovery is not None and log.recovery.recovered_segments == len(past)
    assert not log.needs_flush(now_ms=0)  # the default policy: no flush made due by the crash
    assert log.flush() == log.log_end_offset
    for segment in past:
        assert recorder.durable[str(segment.path(".log"))] == segment.size
    log.close()


def test_opening_after_a_crash_fsyncs_nothing_and_after_a_clean_stop_only_the_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cost that grows with partitions at start (docs/performance.md, "The broker at
    scale"): per partition no fsync after a crash when nothing changed, one (the directory,
    the clean-shutdown marker gone) after a clean stop; the leader epoch checkpoint recovery
    re-learned is written by the next flush or close, once, however many epochs it met."""
    manager = LogManager(tmp_path, CONFIG)
    for partition in range(5):
        log = manager.get_or_create("t", partition)
        for epoch in range(6):  # six epochs: recovery re-learns six entries
            log.append(make_batch([b"x" * 20]), epoch, now_ms=0)
    for log in manager.logs().values():
        log.abandon()
    os.close(manager._lock_fd)  # the crash also ends the process's lock
    manager._lock_fd = -1
    recorder = FsyncRecorder(monkeypatch)
    writes: list[Path] = []
    real_write = LeaderEpochCache._write_strict

    def counted(self: LeaderEpochCache) -> None:
        writes.append(self.path)
        real_write(self)

    monkeypatch.setattr(LeaderEpochCache, "_write_strict", counted)
    manager = LogManager(tmp_path, CONFIG)
    assert recorder.calls == 0 and writes == []
    for log in manager.logs().values():
        assert log.recovery is not None and not log.recovery.clean_shutdown
        assert log.epoch_cache.entries == [(e, e) for e in range(6)]
    manager.close()
    assert len(writes) == 5  # one per partition (recovery dropped and re-learned six)
    recorder.calls = 0
    manager = LogManager(tmp_path, CONFIG)
    assert recorder.calls == 5
    for log in manager.logs().values():
        assert log.recovery is not None and log.recovery.clean_shutdown
        assert LeaderEpochCache.load(log.epoch_cache.path)[0].entries == log.epoch_cache.entries
        assert log.epoch_cache.entries == [(e, e) for e in range(6)]
    manager.close()


def test_an_index_failing_below_the_recovery_point_keeps_the_later_segments_epochs(
    tmp_path: Path,
) -> None:
    """A segment below the recovery point whose index fails its checks is re-validated, which
    drops the cached epochs from its base on: the trusted segments after it re-learn theirs
    from their headers (found by hypothesis: they were lost)."""
    plan = [(1, 0, 0, False)] * 4 + [(5, 60, 3, False)] * 10 + [(5, 15, 3, True), (5, 18, 3, False)]
    log, stamped, recovery_point = build(tmp_path / "t-0", plan)
    assert len([s for s in log.segments if s.next_offset <= recovery_point]) >= 2
    first = log.segments[0]
    log.abandon()
    index = first.path(".index")
    data = bytearray(index.read_bytes())
    data[-1] ^= 1
    index.write_bytes(bytes(data))
    reopened = PartitionLog.open(tmp_path / "t-0", CONFIG)
    assert reopened.recovery is not None and reopened.recovery.recovered_segments >= 2
    assert_prefix(reopened, stamped)
    reopened.close()
