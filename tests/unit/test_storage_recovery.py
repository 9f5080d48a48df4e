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
        (directory / "leader-epoch-checkpoint").unlink()
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


def test_log_manager_loads_every_partition_and_reports_bad_ones(tmp_path: Path) -> None:
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

    manager = LogManager(tmp_path, CONFIG)
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
