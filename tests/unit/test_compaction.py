"""The cleaner's pure core (fjord.storage.compaction) against a model: the cleaned log holds
exactly the last record of each live key before the cleanable end plus everything after it,
offsets increase, every batch is CRC-valid RecordBatch v2 that kafka-python reads too, and
the producer's last batch survives emptied."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.memory_records import MemoryRecords

from fjord.errors import CorruptRecordError
from fjord.records import BatchBuilder, Compression, decode_records, read_batches, stamp_batch
from fjord.storage.compaction import (
    SegmentInfo,
    build_offset_map,
    clean_segment,
    cleanable_end,
    dirty_state,
    last_batch_of_each_producer,
    should_clean,
    tombstones_expired,
)

KEYS = [b"k%d" % i for i in range(6)]
# One record: (key, value); a None value is a tombstone.
record_strategy = st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.binary(max_size=8)))
batch_strategy = st.tuples(
    st.lists(record_strategy, min_size=1, max_size=5),
    st.sampled_from([Compression.NONE, Compression.LZ4, Compression.GZIP]),
    st.sampled_from([-1, 7, 8]),  # producer id (-1: not idempotent)
)
log_strategy = st.lists(st.lists(batch_strategy, min_size=1, max_size=4), min_size=1, max_size=6)


def make_segments(segments_spec) -> tuple[list[bytes], list[tuple[int, int, bytes, bytes | None]]]:
    """Segments' bytes and the model: every record as (offset, timestamp, key, value)."""
    offset = 0
    sequences: dict[int, int] = {}
    out: list[bytes] = []
    model = []
    for batches in segments_spec:
        data = bytearray()
        for records, codec, producer in batches:
            extra = {}
            if producer != -1:
                extra = {"producer_id": producer, "producer_epoch": 0,
                         "base_sequence": sequences.get(producer, 0)}
                sequences[producer] = sequences.get(producer, 0) + len(records)
            builder = BatchBuilder(compression=codec, batch_size=1 << 20, **extra)
            for key, value in records:
                assert builder.append(1000 + offset, key, value)
                model.append((offset, 1000 + offset, key, value))
                offset += 1
            batch = bytearray(builder.build())
            stamp_batch(batch, 0, offset - len(records), 3)
            data += batch
        out.append(bytes(data))
    return out, model


def segment_bases(segments: list[bytes]) -> list[int]:
    return [next(iter(read_batches(s))).base_offset for s in segments]


def clean(segments: list[bytes], bases: list[int], first_dirty: int, end: int, *,
          drop_tombstones: bool):
    """Clean every segment before ``end`` (a segment base) as the storage layer does (a
    segment may be empty after a clean: its base offset is its name)."""
    offset_map = build_offset_map(segments, first_dirty, end)
    producers = last_batch_of_each_producer(
        b.header for s in segments for b in read_batches(s)
    )
    cleaned = []
    for data, base in zip(segments, bases, strict=True):
        if base >= end:
            cleaned.append(data)
            continue
        result = clean_segment(
            data, offset_map, cleanable_end=end, drop_tombstones=drop_tombstones,
            producer_last_offsets=producers,
        )
        cleaned.append(result.data)
    return cleaned


def records_of(segments: list[bytes]) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return [(r.offset, r.timestamp, r.key, r.value) for s in segments for r in decode_records(s)]


def expected(model, end: int, *, drop_tombstones: bool):
    last = {}
    for offset, _, key, _ in model:
        if offset < end:
            last[key] = offset
    return [
        r for r in model
        if r[0] >= end or (last[r[2]] == r[0] and not (drop_tombstones and r[3] is None))
    ]


@settings(max_examples=150, deadline=None)
@given(log_strategy, st.booleans())
def test_cleaned_log_holds_last_value_of_each_key_and_everything_after(spec, drop) -> None:
    segments, model = make_segments(spec)
    end = segment_bases(segments)[-1]  # the last segment is the active one
    cleaned = clean(segments, segment_bases(segments), 0, end, drop_tombstones=drop)
    assert records_of(cleaned) == expected(model, end, drop_tombstones=drop)
    offsets = [b.header.base_offset for s in cleaned for b in read_batches(s)]  # CRCs checked
    assert offsets == sorted(set(offsets))
    # kafka-python reads the cleaned log, batch by batch and record by record.
    theirs = []
    for data in cleaned:
        memory = MemoryRecords(data)
        while (batch := memory.next_batch()) is not None:
            assert batch.validate_crc()
            theirs.extend((r.offset, r.timestamp, r.key, r.value) for r in batch)
    assert theirs == records_of(cleaned)
    # Every producer's last batch is still there (possibly emptied): its sequence state.
    before = last_batch_of_each_producer(b.header for s in segments for b in read_batches(s))
    after = {
        b.header.producer_id: (b.header.last_offset, b.header.last_sequence)
        for s in cleaned for b in read_batches(s) if b.header.producer_id != -1
    }
    last_sequences = {
        b.header.producer_id: b.header.last_sequence
        for s in segments for b in read_batches(s) if b.header.producer_id != -1
    }
    assert after == {p: (o, last_sequences[p]) for p, o in before.items()}


@settings(max_examples=100, deadline=None)
@given(log_strategy, st.data())
def test_cleaning_in_two_passes_equals_one(spec, data) -> None:
    segments, model = make_segments(spec)
    bases = segment_bases(segments)
    end = bases[-1]
    middle = data.draw(st.sampled_from(bases))
    once = clean(segments, bases, 0, end, drop_tombstones=False)
    first = clean(segments, bases, 0, middle, drop_tombstones=False)
    twice = clean(first, bases, middle, end, drop_tombstones=False)
    assert records_of(twice) == records_of(once) == expected(model, end, drop_tombstones=False)
    # A clean of a clean log changes nothing.
    assert clean(once, bases, end, end, drop_tombstones=False) == once


def test_keyless_records_are_dropped_and_counted() -> None:
    builder = BatchBuilder()
    for key in (b"a", None, b"a"):
        builder.append(5, key, b"v")
    result = clean_segment(builder.build(), {b"a": 2}, cleanable_end=10, drop_tombstones=False,
                           producer_last_offsets={})
    assert [(r.offset, r.key) for r in decode_records(result.data)] == [(2, b"a")]
    assert (result.records_read, result.records_kept, result.keyless_dropped) == (3, 1, 1)


def test_an_emptied_batch_of_no_producer_disappears() -> None:
    builder = BatchBuilder()
    builder.append(5, b"a", b"old")
    result = clean_segment(builder.build(), {b"a": 9}, cleanable_end=10, drop_tombstones=False,
                           producer_last_offsets={})
    assert result.data == b"" and result.max_timestamp == -1


def test_damaged_segment_is_refused() -> None:
    builder = BatchBuilder()
    builder.append(5, b"a", b"v")
    data = bytearray(builder.build())
    data[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        clean_segment(bytes(data), {}, cleanable_end=10, drop_tombstones=False,
                      producer_last_offsets={})


def test_choosing_the_range_and_the_ratio() -> None:
    closed = [SegmentInfo(0, 10, 100, 1_000), SegmentInfo(10, 20, 100, 5_000),
              SegmentInfo(20, 30, 100, 9_000)]
    assert cleanable_end(closed, 30, now_ms=10_000, min_compaction_lag_ms=0) == 30
    assert cleanable_end(closed, 30, now_ms=10_000, min_compaction_lag_ms=2_000) == 20
    state = dirty_state(closed, first_dirty=10, end=30)
    assert (state.clean_bytes, state.dirty_bytes, state.oldest_dirty_timestamp) == (100, 200, 5000)
    assert state.dirty_ratio == pytest.approx(2 / 3)
    assert should_clean(state, 0.5, max_compaction_lag_ms=10**9, now_ms=10_000)
    assert not should_clean(state, 0.9, max_compaction_lag_ms=10**9, now_ms=10_000)
    assert should_clean(state, 0.9, max_compaction_lag_ms=5_000, now_ms=10_000)  # overdue
    assert not should_clean(dirty_state(closed, 30, 30), 0.0, 0, 10_000)
    assert tombstones_expired(1_000, 500, 1_500) and not tombstones_expired(1_000, 500, 1_499)
