"""The idempotent producer's broker core: decisions, snapshots and rebuild from the log."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.broker.producer_state import (
    BATCHES_PER_PRODUCER,
    Duplicate,
    ProducerStateManager,
    list_snapshots,
    load_producer_state,
    next_sequence,
    write_snapshot,
)
from fjord.errors import (
    CorruptRecordError,
    ErrorCode,
    FjordError,
    InvalidProducerEpochError,
    InvalidRecordError,
    OutOfOrderSequenceError,
    UnknownProducerIdError,
)
from fjord.records.builder import BatchBuilder
from fjord.records.header import BatchHeader, parse_header
from fjord.storage import PartitionLog
from fjord.storage.config import LogConfig


def batch_bytes(pid: int, epoch: int, seq: int, count: int = 1, ts: int = 1000) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq)
    for i in range(count):
        builder.append(ts, None, f"v{seq}-{i}".encode())
    return builder.build()


def header(pid: int, epoch: int, seq: int, count: int = 1, ts: int = 1000) -> BatchHeader:
    return parse_header(batch_bytes(pid, epoch, seq, count, ts))


def append(state: ProducerStateManager, h: BatchHeader) -> Duplicate | int:
    """Leader append against a fake log end: the duplicate, or the new first offset."""
    dup = state.check_append([h])
    if dup is not None:
        return dup
    first = state.end_offset
    state.record_append([h], first)
    return first


# --- the rules, one by one -----------------------------------------------------------------------


def test_new_producer_must_start_at_zero() -> None:
    state = ProducerStateManager()
    with pytest.raises(UnknownProducerIdError) as info:
        state.check_append([header(7, 0, 3)])
    assert info.value.code is ErrorCode.UNKNOWN_PRODUCER_ID
    assert not info.value.retriable
    assert state.producers == {}
    assert append(state, header(7, 0, 0, count=3)) == 0
    assert state.producers[7].last_sequence == 2


def test_duplicate_gets_original_offsets_and_gap_is_rejected() -> None:
    state = ProducerStateManager()
    assert append(state, header(1, 0, 0, count=2)) == 0
    state.apply_batch(header(-1, -1, -1, count=5), 2, 6)  # another, non-idempotent producer
    assert append(state, header(1, 0, 2, count=3)) == 7
    assert append(state, header(1, 0, 0, count=2)) == Duplicate(0, 1)
    assert append(state, header(1, 0, 2, count=3)) == Duplicate(7, 9)
    with pytest.raises(OutOfOrderSequenceError):
        state.check_append([header(1, 0, 6)])  # 5 is missing
    with pytest.raises(OutOfOrderSequenceError):
        state.check_append([header(1, 0, 1, count=2)])  # overlaps, not a known batch
    assert append(state, header(1, 0, 5)) == 10


def test_stale_epoch_is_fenced_and_new_epoch_restarts_at_zero() -> None:
    state = ProducerStateManager()
    append(state, header(1, 3, 0))
    with pytest.raises(InvalidProducerEpochError) as info:
        state.check_append([header(1, 2, 1)])
    assert info.value.code is ErrorCode.INVALID_PRODUCER_EPOCH
    with pytest.raises(OutOfOrderSequenceError):
        state.check_append([header(1, 4, 1)])
    assert append(state, header(1, 4, 0)) == 1
    assert state.producers[1].producer_epoch == 4
    assert len(state.producers[1].batches) == 1
    # The old epoch's batch is no longer a duplicate: it is a fenced zombie.
    with pytest.raises(InvalidProducerEpochError):
        state.check_append([header(1, 3, 0)])


def test_only_the_last_five_batches_are_remembered() -> None:
    state = ProducerStateManager()
    for seq in range(8):
        append(state, header(1, 0, seq))
    assert len(state.producers[1].batches) == BATCHES_PER_PRODUCER
    assert append(state, header(1, 0, 3)) == Duplicate(3, 3)
    with pytest.raises(OutOfOrderSequenceError):
        state.check_append([header(1, 0, 2)])  # too old to be recognised


def test_sequence_wraps_after_int32_max() -> None:
    assert next_sequence(2**31 - 1) == 0
    state = ProducerStateManager()
    append(state, header(1, 0, 0))
    entry = state.producers[1]
    # Pretend the producer is about to wrap (as if it had sent 2**31-2 more records).
    last = entry.batches[-1]
    entry.batches[-1] = type(last)(0, 2**31 - 2, 0, 0, last.timestamp)
    assert append(state, header(1, 0, 2**31 - 1, count=2)) == 1  # last sequence wraps to 0
    assert state.producers[1].last_sequence == 0
    assert append(state, header(1, 0, 1)) == 3


def test_idempotent_batch_needs_sequence_and_epoch() -> None:
    state = ProducerStateManager()
    with pytest.raises(InvalidRecordError):
        state.check_append([header(1, 0, -1)])
    with pytest.raises(InvalidRecordError):
        state.check_append([header(1, -1, 0)])


def test_multi_batch_payload_is_checked_as_a_chain() -> None:
    state = ProducerStateManager()
    assert state.check_append([header(1, 0, 0, 2), header(1, 0, 2), header(-1, -1, -1)]) is None
    with pytest.raises(OutOfOrderSequenceError):
        state.check_append([header(1, 0, 0, 2), header(1, 0, 3)])
    state.record_append([header(1, 0, 0, 2), header(1, 0, 2)], 10)
    assert [(b.first_offset, b.last_offset) for b in state.producers[1].batches] == [
        (10, 11),
        (12, 12),
    ]
    assert state.check_append([header(1, 0, 0, 2), header(1, 0, 2)]) == Duplicate(10, 12)
    with pytest.raises(InvalidRecordError):
        state.check_append([header(1, 0, 2), header(1, 0, 3)])  # duplicate + new batch


def test_expiration() -> None:
    state = ProducerStateManager(expiration_ms=1000)
    append(state, header(1, 0, 0, ts=5000))
    append(state, header(2, 0, 0, ts=5500))
    assert state.remove_expired(5999) == []
    assert state.remove_expired(6000) == [1]
    assert set(state.producers) == {2}
    with pytest.raises(UnknownProducerIdError):
        state.check_append([header(1, 0, 1, ts=6000)])


# --- property: the manager matches a simple reference model -----------------------------------


@dataclass
class ModelProducer:
    epoch: int
    # Every batch accepted in this epoch: (first seq, last seq, first offset, last offset).
    batches: list[tuple[int, int, int, int]] = field(default_factory=list)


class ReferenceModel:
    """Kafka's rules written as directly as possible, keeping every batch ever accepted."""

    def __init__(self) -> None:
        self.producers: dict[int, ModelProducer] = {}
        self.end = 0

    def produce(self, pid: int, epoch: int, seq: int, count: int) -> tuple[str, int]:
        last_seq = (seq + count - 1) % 2**31
        p = self.producers.get(pid)
        if p is not None and epoch < p.epoch:
            return "INVALID_PRODUCER_EPOCH", -1
        if p is not None and epoch == p.epoch:
            for first_s, last_s, first_o, _ in p.batches[-5:]:
                if (first_s, last_s) == (seq, last_seq):
                    return "DUPLICATE", first_o
        if p is None and seq != 0:
            return "UNKNOWN_PRODUCER_ID", -1
        if p is not None and epoch > p.epoch and seq != 0:
            return "OUT_OF_ORDER_SEQUENCE_NUMBER", -1
        if p is not None and epoch == p.epoch and seq != (p.batches[-1][1] + 1) % 2**31:
            return "OUT_OF_ORDER_SEQUENCE_NUMBER", -1
        if p is None or epoch != p.epoch:
            p = self.producers[pid] = ModelProducer(epoch)
        first = self.end
        self.end += count
        p.batches.append((seq, last_seq, first, self.end - 1))
        return "APPENDED", first


@st.composite
def produce_ops(draw: st.DrawFn) -> list[tuple[int, int, int, int]]:
    ops = []
    next_seq: dict[tuple[int, int], int] = {}
    for _ in range(draw(st.integers(1, 60))):
        pid = draw(st.integers(0, 2))
        epoch = draw(st.integers(0, 2))
        count = draw(st.integers(1, 3))
        expected = next_seq.get((pid, epoch), 0)
        kind = draw(st.sampled_from(["next", "next", "next", "retry", "gap", "zero", "any"]))
        if kind == "next":
            seq = expected
        elif kind == "retry":
            seq = max(0, expected - draw(st.integers(1, 8)))
        elif kind == "gap":
            seq = expected + draw(st.integers(1, 3))
        elif kind == "zero":
            seq = 0
        else:
            seq = draw(st.integers(0, 20))
        next_seq[(pid, epoch)] = max(expected, seq + count)
        ops.append((pid, epoch, seq, count))
    return ops


@settings(max_examples=150, deadline=None)
@given(produce_ops())
def test_manager_matches_reference_model(ops: list[tuple[int, int, int, int]]) -> None:
    state = ProducerStateManager()
    model = ReferenceModel()
    for pid, epoch, seq, count in ops:
        expected, offset = model.produce(pid, epoch, seq, count)
        h = header(pid, epoch, seq, count)
        try:
            result = append(state, h)
        except FjordError as exc:
            assert exc.code.name == expected, (pid, epoch, seq, count)
            continue
        if isinstance(result, Duplicate):
            assert expected == "DUPLICATE"
            assert result.first_offset == offset
        else:
            assert expected == "APPENDED"
            assert result == offset
    # A snapshot round trip keeps every decision the same.
    restored = ProducerStateManager.from_snapshot_bytes(state.to_snapshot_bytes())
    assert restored.producers == state.producers
    assert restored.end_offset == state.end_offset


# --- files: snapshots, corruption, rebuild from the log --------------------------------------


def open_log(path: Path) -> PartitionLog:
    return PartitionLog.open(path, LogConfig.from_dict({"segment.bytes": 400}))


def fill_log(plog: PartitionLog, state: ProducerStateManager, batches: list[bytes]) -> None:
    for raw in batches:
        h = parse_header(raw)
        assert state.check_append([h]) is None
        info = plog.append(raw, 0)
        state.record_append([h], info.first_offset)


def test_snapshot_round_trip_and_corruption(tmp_path: Path) -> None:
    state = ProducerStateManager()
    for pid in range(3):
        for seq in range(7):
            append(state, header(pid, 1, seq, ts=100 + seq))
    data = state.to_snapshot_bytes()
    path = write_snapshot(tmp_path, data, state.end_offset)
    assert path.name == f"{state.end_offset:020d}.snapshot"
    restored = ProducerStateManager.from_snapshot_bytes(path.read_bytes())
    assert restored.producers == state.producers
    assert restored.last_snapshot_offset == state.end_offset
    for bad in (
        data[:-1],
        data[:5],
        data + b"\0",
        data[:20] + bytes([data[20] ^ 1]) + data[21:],
        b"\0\7" + data[2:],
    ):
        with pytest.raises(CorruptRecordError):
            ProducerStateManager.from_snapshot_bytes(bad)
    # Only the newest snapshots are kept.
    for end in (1, 2, 3):
        write_snapshot(tmp_path, data, state.end_offset + end)
    assert [o for o, _ in list_snapshots(tmp_path)] == [state.end_offset + 2, state.end_offset + 3]


def test_rebuild_from_log_with_and_without_snapshot(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0")
    state = ProducerStateManager()
    fill_log(plog, state, [batch_bytes(1, 0, s, 2) for s in range(0, 12, 2)])
    assert len(plog.segments) > 1  # the rebuild crosses segments
    # No snapshot at all: a full header scan gives the same state.
    assert load_producer_state(plog).producers == state.producers
    # A snapshot in the middle, then more batches: snapshot + scan of the tail.
    write_snapshot(plog.directory, state.to_snapshot_bytes(), state.end_offset)
    fill_log(plog, state, [batch_bytes(2, 0, 0), batch_bytes(1, 0, 12, 3)])
    loaded = load_producer_state(plog)
    assert loaded.producers == state.producers
    assert loaded.end_offset == plog.log_end_offset
    assert loaded.check_append([header(1, 0, 12, 3)]) == Duplicate(13, 15)
    plog.close()


def test_corrupt_snapshot_falls_back_to_the_log(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0")
    state = ProducerStateManager()
    fill_log(plog, state, [batch_bytes(1, 0, s) for s in range(6)])
    path = write_snapshot(plog.directory, state.to_snapshot_bytes(), state.end_offset)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    loaded = load_producer_state(plog)
    assert loaded.producers == state.producers
    assert not path.exists()  # the corrupt file is removed
    plog.close()


def test_truncation_drops_snapshots_past_the_log_end(tmp_path: Path) -> None:
    plog = open_log(tmp_path / "t-0")
    state = ProducerStateManager()
    fill_log(plog, state, [batch_bytes(1, 0, s) for s in range(4)])
    early = ProducerStateManager.from_snapshot_bytes(state.to_snapshot_bytes())
    write_snapshot(plog.directory, state.to_snapshot_bytes(), state.end_offset)
    fill_log(plog, state, [batch_bytes(1, 0, s) for s in range(4, 8)])
    late = write_snapshot(plog.directory, state.to_snapshot_bytes(), state.end_offset)
    plog.truncate_to(4)
    loaded = load_producer_state(plog)
    assert loaded.producers == early.producers
    assert not late.exists()
    assert loaded.check_append([header(1, 0, 4)]) is None  # the cut batch is new again
    plog.close()
