"""PartitionLog: append, read, roll, retention, truncation, timestamps, epochs, durability."""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.errors import (
    CorruptRecordError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageError,
)
from fjord.records.header import iter_batches, parse_header, validate_batch
from fjord.storage import LogConfig, PartitionLog
from fjord.storage.testing import make_batch, make_batch_of_size

SMALL = LogConfig.from_dict({"segment.bytes": 2000, "index.interval.bytes": 150})


def batch(records: int = 2, ts: int = 1000, size: int = 5) -> bytes:
    return make_batch([bytes([65 + i % 26]) * size for i in range(records)], ts)


def offsets_in(data: bytes) -> list[tuple[int, int]]:
    return [(h.base_offset, h.last_offset) for _, h in iter_batches(data)]


def fill(log: PartitionLog, count: int, epoch: int = 0) -> list[tuple[int, int, bytes]]:
    """Append ``count`` batches of varying shape; returns (first, last, stamped bytes) each."""
    out = []
    for i in range(count):
        info = log.append(batch(1 + i % 4, 1000 + 10 * i, 5 + (i * 7) % 60), epoch, now_ms=i)
        stamped = log.read(info.first_offset, 1)
        out.append((info.first_offset, info.last_offset, stamped))
    return out


def test_append_stamps_offsets_and_epoch_and_reads_back_the_same_bytes(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    raw = batch(3)
    info = log.append(raw, leader_epoch=7, now_ms=1)
    assert (info.first_offset, info.last_offset, info.record_count) == (0, 2, 3)
    info2 = log.append(raw + batch(2), leader_epoch=7, now_ms=2)
    assert (info2.first_offset, info2.last_offset, info2.batch_count) == (3, 7, 2)
    assert log.log_end_offset == 8
    data = log.read(0, 10_000)
    assert offsets_in(data) == [(0, 2), (3, 5), (6, 7)]
    for _, h in iter_batches(data):
        assert h.partition_leader_epoch == 7
    assert data[21 : 21 + len(raw) - 21] == raw[21:]  # bytes under the CRC untouched
    assert info.log_append_time == -1 and info.max_timestamp == 1000
    log.close()


def test_read_serves_whole_batches_from_the_one_holding_the_offset(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    appended = fill(log, 80)
    sizes = {first: len(b) for first, _, b in appended}
    for first, last, stamped in appended:
        for offset in (first, last):
            one = log.read(offset, 1)
            assert one == stamped  # a too-small max_bytes still returns the first batch whole
            for max_bytes in (len(stamped) + 1, 300, 1000, 5000):
                data = log.read(offset, max_bytes)
                got = offsets_in(data)  # raises on a partial batch
                assert got[0][0] == first
                assert len(data) <= max(max_bytes, len(stamped))
                after = got[-1][1] + 1
                if after in sizes and len(data) + sizes[after] <= max_bytes:
                    # it stopped early only at a segment end
                    seg = log.segment_for(first)
                    assert got[-1][1] + 1 == seg.next_offset
    assert log.read(log.log_end_offset, 100) == b""
    with pytest.raises(OffsetOutOfRangeError):
        log.read(log.log_end_offset + 1, 100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)
    log.close()


def test_read_stops_before_max_offset(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), now_ms=0)
    for _ in range(5):
        log.append(batch(2), 0, now_ms=0)  # batches at 0, 2, 4, 6, 8
    assert offsets_in(log.read(0, 10_000, max_offset=6)) == [(0, 1), (2, 3), (4, 5)]
    assert offsets_in(log.read(3, 10_000, max_offset=5)) == [(2, 3)]  # 4-5 holds max_offset
    assert log.read(6, 10_000, max_offset=6) == b""
    assert log.read(4, 10_000, max_offset=5) == b""
    log.close()


def test_readable_bytes_bound_covers_every_read_and_stays_within_its_segment(
    tmp_path: Path,
) -> None:
    """The broker decides whether to read a fetch in a worker thread by this bound: it must be
    at least what any read from the offset returns, and no more than the rest of its segment."""
    log = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    fill(log, 80)
    assert len(log.segments) > 3
    for offset in range(log.log_end_offset):
        bound = log.readable_bytes_bound(offset)
        segment = log.segment_for(offset)
        assert len(log.read(offset, 1 << 20)) <= bound <= segment.size
        # Not much more than the read from the batch holding the offset: at most the index
        # interval (150 bytes) plus one batch before it.
        assert bound - len(log.read(offset, 1 << 20)) <= 150 + 300
    assert log.readable_bytes_bound(log.log_end_offset) == 0
    log.close()
    assert log.readable_bytes_bound(0) == 0


def test_roll_by_segment_bytes_names_segments_by_base_offset(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    fill(log, 60)
    segments = log.segments
    assert len(segments) > 3
    for prev, nxt in itertools.pairwise(segments):
        assert prev.size <= 2000 and prev.next_offset == nxt.base_offset
    names = sorted(p.name for p in (tmp_path / "t-0").glob("*.log"))
    assert names == [f"{s.base_offset:020d}.log" for s in segments]
    for s in segments:  # sparse: one entry per >150 bytes, each naming a batch start
        assert len(s.offset_index) >= s.size // 400
        for rel, pos in zip(s.offset_index.relative_offsets, s.offset_index.positions, strict=True):
            assert parse_header(os.pread(s.fd, 61, pos)).base_offset == s.base_offset + rel
    log.close()


def test_a_batch_larger_than_a_segment_still_goes_in_alone(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    log.append(batch(1, size=10), 0, now_ms=0)
    big = make_batch_of_size(5000)
    log.append(big, 0, now_ms=0)
    assert [s.size for s in log.segments] == [len(batch(1, size=10)), 5000]
    log.close()


def test_roll_by_segment_ms_and_by_index_size(tmp_path: Path) -> None:
    config = LogConfig.from_dict(
        {"segment.ms": 100, "segment.index.bytes": 16, "index.interval.bytes": 0}
    )
    log = PartitionLog.open(tmp_path / "t-0", config, now_ms=0)
    assert not log.maybe_roll(now_ms=1000)  # empty active segment never rolls
    log.append(batch(), 0, now_ms=1000)
    assert not log.maybe_roll(now_ms=1099)
    assert log.maybe_roll(now_ms=1100)
    assert len(log.segments) == 2
    log.append(batch(), 0, now_ms=1100)
    log.append(batch(), 0, now_ms=1150)  # same segment; rolls at append once 100 ms old
    log.append(batch(), 0, now_ms=1201)
    assert [s.base_offset for s in log.segments] == [0, 2, 6]
    for _ in range(3):  # 16-byte index = 2 entries: the third indexed batch rolls
        log.append(batch(), 0, now_ms=1201)
    assert len(log.segments) == 4
    log.close()


def test_retention_by_bytes_and_time_deletes_whole_old_segments(tmp_path: Path) -> None:
    config = LogConfig.from_dict(
        {"segment.bytes": 1000, "retention.bytes": 2500, "retention.ms": -1}
    )
    log = PartitionLog.open(tmp_path / "t-0", config, now_ms=0)
    fill(log, 60)
    before = log.segments
    assert log.apply_retention(now_ms=10**12, max_offset=before[1].base_offset) == 1
    deleted = log.apply_retention(now_ms=10**12)
    after = log.segments
    assert deleted == len(before) - len(after) - 1
    assert log.size_in_bytes - after[0].size < 2500 <= log.size_in_bytes
    assert log.log_start_offset == after[0].base_offset
    assert not (tmp_path / "t-0" / f"{before[0].base_offset:020d}.log").exists()
    with pytest.raises(OffsetOutOfRangeError):
        log.read(log.log_start_offset - 1, 100)
    # by time: segments whose newest batch is older than retention.ms; never the active one
    log.config = LogConfig.from_dict({"retention.ms": 50})
    newest = max(s.max_timestamp for s in log.segments)
    assert log.apply_retention(now_ms=newest + 10**6) == len(after) - 1
    assert len(log.segments) == 1
    assert log.log_start_offset == log.active_segment.base_offset
    log.close()


def test_delete_records_moves_log_start_inside_a_segment(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    appended = fill(log, 40, epoch=2)
    target = appended[25][0] + 1  # inside a batch
    assert log.delete_records(target) == target
    assert log.log_start_offset == target
    assert log.segments[0].base_offset <= target < log.segments[0].next_offset
    assert log.delete_records(3) == target  # never moves back
    with pytest.raises(OffsetOutOfRangeError):
        log.read(target - 1, 10)
    assert offsets_in(log.read(target, 1))[0][0] == appended[25][0]
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records(log.log_end_offset + 1)
    assert log.epoch_cache.entries == [(2, target)]
    log.close()
    reopened = PartitionLog.open(tmp_path / "t-0", SMALL)
    assert reopened.log_start_offset == target
    reopened.close()


def test_truncate_to_removes_the_batch_holding_the_offset_and_later(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    first = fill(log, 30, epoch=1)
    second = fill(log, 30, epoch=4)
    cut_batch = second[5]
    log.truncate_to(cut_batch[0] + 1)
    assert log.log_end_offset == cut_batch[0]
    assert log.epoch_cache.entries == [(1, 0), (4, second[0][0])]
    assert log.end_offset_for_epoch(1) == (1, second[0][0])
    assert offsets_in(log.read(second[4][0], 10_000))[-1] == second[4][:2]
    log.truncate_to(first[10][0])  # back across segment boundaries
    assert log.log_end_offset == first[10][0]
    assert log.epoch_cache.entries == [(1, 0)]
    assert all(s.base_offset <= first[10][0] for s in log.segments)
    info = log.append(batch(), 5, now_ms=0)
    assert info.first_offset == first[10][0]
    assert log.end_offset_for_epoch(1) == (1, first[10][0])
    log.truncate_to(10_000)  # past the end: nothing happens
    assert log.log_end_offset == info.last_offset + 1
    log.close()
    reopened = PartitionLog.open(tmp_path / "t-0", SMALL)
    assert reopened.log_end_offset == info.last_offset + 1
    assert reopened.epoch_cache.entries == [(1, 0), (5, first[10][0])]
    reopened.close()


def test_truncating_an_unflushed_tail_leaves_the_partition_checkpoint_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower restarted after a crash truncates the unflushed tail of thousands of
    partitions on the event loop: the partition checkpoint (recovery point, log start) is
    rewritten only when the truncation changes it, and a crash afterwards recovers from what
    it says either way."""
    import fjord.storage.log as log_module

    written: list[str] = []
    real = log_module.write_atomically

    def recorded(path: Path, text: str, *, sync: bool) -> None:
        written.append(path.name)
        real(path, text, sync=sync)

    log = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    fill(log, 10)
    flushed = log.flush()
    tail = fill(log, 10)
    monkeypatch.setattr(log_module, "write_atomically", recorded)
    log.truncate_to(tail[3][0])  # the unflushed tail only: recovery point unchanged
    assert log.recovery_point == flushed and written == []
    log.truncate_to(flushed - 3)  # below the recovery point: it moves down, and is written
    assert log.recovery_point == log.log_end_offset < flushed
    assert written == ["partition-checkpoint"]
    end = log.log_end_offset
    log.abandon()  # a crash
    reopened = PartitionLog.open(tmp_path / "t-0", SMALL)
    assert reopened.log_end_offset == end and reopened.recovery_point == end
    reopened.close()


def test_truncate_below_log_start_restarts_the_log_there(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    fill(log, 30)
    log.delete_records(40)
    log.truncate_to(20)
    assert (log.log_start_offset, log.log_end_offset, len(log.segments)) == (20, 20, 1)
    assert log.append(batch(), 3, now_ms=0).first_offset == 20
    assert [p.name for p in sorted((tmp_path / "t-0").glob("*.log"))] == [f"{20:020d}.log"]
    log.close()


def test_offset_for_timestamp_matches_brute_force(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    stamps = [5, 3, 9, 9, 12, 11, 20, 15, 30, 31, 31, 40] * 4
    stamps = [s + 100 * (i // 12) for i, s in enumerate(stamps)]
    firsts = [log.append(batch(2, ts), 0, now_ms=0).first_offset for ts in stamps]
    for probe in range(0, 450):
        expected = next(((firsts[i], ts) for i, ts in enumerate(stamps) if ts >= probe), None)
        assert log.offset_for_timestamp(probe) == expected, probe
    log.close()
    reopened = PartitionLog.open(tmp_path / "t-0", SMALL)  # from the time index files
    for probe in range(0, 450, 7):
        expected = next(((firsts[i], ts) for i, ts in enumerate(stamps) if ts >= probe), None)
        assert reopened.offset_for_timestamp(probe) == expected, probe
    assert reopened.offset_for_timestamp(310) == (80, 312)
    reopened.delete_records(81)  # inside that batch: the answer moves to the log start
    assert reopened.offset_for_timestamp(310) == (81, 312)
    reopened.close()


def test_log_append_time_stamps_the_broker_time_and_keeps_the_crc_valid(tmp_path: Path) -> None:
    config = LogConfig.from_dict({"message.timestamp.type": "LogAppendTime"})
    log = PartitionLog.open(tmp_path / "t-0", config, now_ms=0)
    info = log.append(batch(3, ts=5) + batch(1, ts=6), 0, now_ms=777)
    assert info.log_append_time == 777 and info.max_timestamp == 777
    for pos, h in iter_batches(log.read(0, 10_000)):
        assert h.max_timestamp == 777 and h.timestamp_type.name == "LOG_APPEND_TIME"
        assert pos >= 0
    log.close()


def test_follower_append_keeps_offsets_and_learns_epochs(tmp_path: Path) -> None:
    leader = PartitionLog.open(tmp_path / "leader-0", SMALL, now_ms=0)
    fill(leader, 10, epoch=1)
    fill(leader, 10, epoch=3)
    follower = PartitionLog.open(tmp_path / "follower-0", SMALL, now_ms=0)
    offset = 0
    while offset < leader.log_end_offset:
        chunk = leader.read(offset, 500)
        info = follower.append_as_follower(chunk, now_ms=0)
        assert info.first_offset == offset
        offset = info.last_offset + 1
    assert follower.log_end_offset == leader.log_end_offset
    assert follower.epoch_cache.entries == leader.epoch_cache.entries
    assert (
        follower.read(0, 10**6)
        == b"".join(leader.read(s.base_offset, 10**6) for s in leader.segments)[
            : len(follower.read(0, 10**6))
        ]
    )
    with pytest.raises(InvalidRecordError, match="expected"):
        follower.append_as_follower(leader.read(0, 1))  # not at the log end
    leader.close()
    follower.close()


def test_invalid_appends_are_rejected_whole_and_change_nothing(tmp_path: Path) -> None:
    log = PartitionLog.open(
        tmp_path / "t-0", LogConfig.from_dict({"max.message.bytes": 500}), now_ms=0
    )
    log.append(batch(), 0, now_ms=0)
    size_before = log.size_in_bytes
    bad_crc = bytearray(batch())
    bad_crc[-1] ^= 0xFF
    cases: list[tuple[bytes, type[Exception]]] = [
        (batch() + bytes(bad_crc) + batch(), CorruptRecordError),
        (batch() + batch()[:-3], CorruptRecordError),
        (b"\x00" * 70, CorruptRecordError),
        (batch() + make_batch_of_size(600), RecordTooLargeError),
        (b"", InvalidRecordError),
    ]
    mismatched = bytearray(make_batch([b"a", b"b"]))
    mismatched[57:61] = (3).to_bytes(4, "big")  # record count outside the CRC? no: inside
    cases.append((bytes(mismatched), CorruptRecordError))
    for data, error in cases:
        with pytest.raises(error):
            log.append(data, 0, now_ms=0)
        assert (log.log_end_offset, log.size_in_bytes) == (2, size_before)
    log.close()


def test_a_big_batch_with_a_bad_crc_is_cut_back_after_the_overlapped_write(
    tmp_path: Path,
) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(), now_ms=0)
    good = make_batch_of_size(300 * 1024)  # above CRC_OVERLAP_BYTES: CRC checked while writing
    log.append(good, 0, now_ms=0)
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x01
    with pytest.raises(CorruptRecordError, match="CRC"):
        log.append(bytes(bad), 0, now_ms=0)
    segment = log.active_segment
    assert log.log_end_offset == 1
    assert os.fstat(segment.fd).st_size == segment.size == len(good)
    with pytest.raises(CorruptRecordError, match="CRC"):  # the second of two batches is bad
        log.append(good + bytes(bad), 0, now_ms=0)
    assert os.fstat(segment.fd).st_size == segment.size == len(good)
    assert log.append(good, 0, now_ms=0).first_offset == 1
    assert offsets_in(log.read(0, 10**6)) == [(0, 0), (1, 1)]
    log.close()


def test_flush_policy_and_recovery_point(tmp_path: Path) -> None:
    config = LogConfig.from_dict({"flush.messages": 5, "flush.ms": 1000})
    log = PartitionLog.open(tmp_path / "t-0", config, now_ms=0)
    assert not log.needs_flush(now_ms=0)
    log.append(batch(2), 0, now_ms=10)
    assert not log.needs_flush(now_ms=500)
    assert log.needs_flush(now_ms=1010)  # flush.ms since the first unflushed append
    log.append(batch(3), 0, now_ms=20)
    assert log.needs_flush(now_ms=20)  # flush.messages reached
    assert log.flush() == 5 == log.recovery_point
    assert not log.needs_flush(now_ms=10**9)
    assert "recovery-point 5\n" in (tmp_path / "t-0" / "partition-checkpoint").read_text()
    log.roll(now_ms=30)
    assert log.needs_flush(now_ms=30)  # the rolled segment awaits its fsync
    log.flush()
    assert not log.needs_flush(now_ms=30)
    log.close()


def test_flush_in_a_thread_while_appending(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    stop = threading.Event()
    points: list[int] = []

    def flusher() -> None:
        while not stop.is_set():
            points.append(log.flush())

    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        appended = fill(log, 300)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert points == sorted(points) and points[-1] <= log.log_end_offset
    assert log.flush() == log.log_end_offset == appended[-1][1] + 1
    log.close()


def test_flush_in_a_thread_while_truncating_never_claims_lost_offsets(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    stop = threading.Event()
    violations: list[tuple[int, int]] = []

    def flusher() -> None:
        while not stop.is_set():
            point = log.flush()
            with log._lock:  # compare against the end as of the same moment
                if log.recovery_point > log.log_end_offset:
                    violations.append((point, log.log_end_offset))

    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        for round_ in range(40):
            fill(log, 5)
            log.truncate_to(max(0, log.log_end_offset - 7 - round_ % 5))
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive() and violations == []
    assert log.flush() == log.log_end_offset
    end = log.log_end_offset
    log.abandon()
    reopened = PartitionLog.open(tmp_path / "t-0", SMALL)
    assert reopened.log_end_offset == end
    reopened.close()


def test_clean_close_and_reopen_keeps_everything(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", SMALL, now_ms=0)
    fill(log, 50, epoch=1)
    state = [
        (
            s.base_offset,
            s.size,
            s.next_offset,
            s.max_timestamp,
            s.offset_index.positions,
            s.time_index.timestamps,
        )
        for s in log.segments
    ]
    data = [log.read(s.base_offset, 10**6) for s in log.segments]
    log.close()
    assert (tmp_path / "t-0" / ".clean-shutdown").exists()
    with pytest.raises(StorageError, match="closed"):
        log.read(0, 10)
    reopened = PartitionLog.open(tmp_path / "t-0", SMALL)
    assert reopened.recovery is not None and reopened.recovery.clean_shutdown
    assert reopened.recovery.recovered_segments == 0
    assert not (tmp_path / "t-0" / ".clean-shutdown").exists()  # a crash now means recovery
    assert [
        (
            s.base_offset,
            s.size,
            s.next_offset,
            s.max_timestamp,
            s.offset_index.positions,
            s.time_index.timestamps,
        )
        for s in reopened.segments
    ] == state
    assert [reopened.read(s.base_offset, 10**6) for s in reopened.segments] == data
    reopened.close()


def test_unexpected_file_names_raise_storage_error_naming_them(tmp_path: Path) -> None:
    (tmp_path / "t-0").mkdir()
    (tmp_path / "t-0" / "garbage.log").write_bytes(b"")
    with pytest.raises(StorageError, match=r"garbage\.log"):
        PartitionLog.open(tmp_path / "t-0", SMALL)


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=40),
    probes=st.lists(st.tuples(st.integers(0, 200), st.integers(1, 3000)), max_size=20),
)
def test_read_any_offset_any_size_yields_valid_whole_batches(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], probes: list[tuple[int, int]]
) -> None:
    log = PartitionLog.open(tmp_path_factory.mktemp("p") / "t-0", SMALL, now_ms=0)
    for n in sizes:
        log.append(batch(n, size=17 * n), 0, now_ms=0)
    for offset, max_bytes in probes:
        offset %= log.log_end_offset + 1
        data = log.read(offset, max_bytes)
        if offset == log.log_end_offset:
            assert data == b""
            continue
        headers = [h for _, h in iter_batches(data)]
        assert headers[0].base_offset <= offset <= headers[0].last_offset
        assert len(data) <= max_bytes or len(headers) == 1
        for pos, _ in iter_batches(data):
            validate_batch(data, pos)
    log.close()
