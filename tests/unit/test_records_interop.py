"""Cross-check with kafka-python, an implementation nobody here wrote: it decodes every batch we
build and we decode every batch it builds, for every codec, with headers, null keys and empty
values. Uncompressed batches must be byte-identical."""

from __future__ import annotations

import os
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():
    # kafka-python's protocol package loads its schemas with a deprecated importlib API.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
    from kafka.record.memory_records import MemoryRecords

from fjord.records import (
    BatchBuilder,
    Compression,
    TimestampType,
    decode_records,
    read_batches,
    stamp_batch,
)

# Every test runs with the pure-Python record code and with the C extension (issue 18).
pytestmark = pytest.mark.usefixtures("records_implementation")

SAMPLE = [
    (1_700_000_000_000, b"key-0", b"value-0", ()),
    (1_700_000_000_005, None, b"null key", (("trace", b"abc"), ("empty", b""))),
    (1_700_000_000_001, b"empty value", b"", (("null", None),)),
    (1_700_000_000_009, b"null value", None, ()),
    (1_699_999_999_000, b"", b"x" * 5000, (("k", b"v"), ("k", b"repeated key"))),
    (1_700_000_000_009, b"\xff\x00 binary", os.urandom(300), (("unicode-\u00e9", b"\x00"),)),
]
PRODUCER = {"producer_id": 1234, "producer_epoch": 7, "base_sequence": 42}


def ours(records, codec, timestamp_type=TimestampType.CREATE_TIME, **producer) -> bytes:
    builder = BatchBuilder(
        compression=codec, batch_size=1 << 30, timestamp_type=timestamp_type, **producer
    )
    for timestamp, key, value, headers in records:
        assert builder.append(timestamp, key, value, headers)
    return builder.build()


def theirs(records, codec, producer_id=-1, producer_epoch=-1, base_sequence=-1) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 30,
    )
    for offset, (timestamp, key, value, headers) in enumerate(records):
        assert builder.append(offset, timestamp, key, value, list(headers)) is not None
    return bytes(builder.build())


def kafka_python_view(batch: bytes) -> list[tuple]:
    parsed = DefaultRecordBatch(batch)
    assert parsed.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in parsed]


def our_view(batch: bytes) -> list[tuple]:
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decode_records(batch)]


def expected(records, base_offset: int = 0) -> list[tuple]:
    return [
        (base_offset + i, ts, key, value, tuple(headers))
        for i, (ts, key, value, headers) in enumerate(records)
    ]


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: c.name.lower())
def test_kafka_python_decodes_our_batches(codec: Compression) -> None:
    batch = ours(SAMPLE, codec, **PRODUCER)
    assert kafka_python_view(batch) == expected(SAMPLE)
    parsed = DefaultRecordBatch(batch)
    assert parsed.compression_type == codec
    assert (parsed.producer_id, parsed.producer_epoch, parsed.base_sequence) == (1234, 7, 42)
    assert parsed.max_timestamp == max(ts for ts, *_ in SAMPLE)
    assert parsed.last_offset_delta == len(SAMPLE) - 1


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: c.name.lower())
def test_we_decode_kafka_python_batches(codec: Compression) -> None:
    batch = theirs(SAMPLE, codec, **PRODUCER)
    assert our_view(batch) == expected(SAMPLE)
    (read,) = read_batches(batch)
    header = read.header
    assert header.compression == codec
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (1234, 7, 42)
    assert header.record_count == len(SAMPLE)


def same_bytes_but_leader_epoch(a: bytes, b: bytes) -> bool:
    """kafka-python writes partition leader epoch 0 where Kafka's Java producer (and we) write
    -1; the field lies outside the CRC and the broker overwrites it. All else must match."""
    return a[:12] == b[:12] and a[16:] == b[16:] and a[12:16] == b"\xff\xff\xff\xff"


def test_uncompressed_batches_are_byte_identical() -> None:
    assert same_bytes_but_leader_epoch(
        ours(SAMPLE, Compression.NONE, **PRODUCER), theirs(SAMPLE, Compression.NONE, **PRODUCER)
    )
    assert same_bytes_but_leader_epoch(
        ours(SAMPLE[:1], Compression.NONE), theirs(SAMPLE[:1], Compression.NONE)
    )


def test_log_append_time_batches_agree() -> None:
    batch = ours(SAMPLE, Compression.LZ4, TimestampType.LOG_APPEND_TIME)
    max_ts = max(ts for ts, *_ in SAMPLE)
    assert [r[1] for r in kafka_python_view(batch)] == [max_ts] * len(SAMPLE)
    assert [r[1] for r in our_view(batch)] == [max_ts] * len(SAMPLE)


def test_incompressible_data_round_trips_through_every_codec() -> None:
    records = [(1, b"k", os.urandom(70_000), ()), (2, None, os.urandom(100_000), ())]
    for codec in Compression:
        batch = ours(records, codec)
        assert kafka_python_view(batch) == expected(records)
        assert our_view(theirs(records, codec)) == expected(records)


def test_concatenated_stamped_batches_read_by_memory_records() -> None:
    buf = bytearray()
    base_offset = 500
    for codec in Compression:
        batch = bytearray(ours(SAMPLE, codec))
        stamp_batch(batch, 0, base_offset, 3)
        buf += batch
        base_offset += len(SAMPLE)
    theirs_records = []
    memory = MemoryRecords(bytes(buf))
    while (batch := memory.next_batch()) is not None:
        assert batch.validate_crc() and batch.leader_epoch == 3
        theirs_records += [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch]
    assert our_view(bytes(buf)) == theirs_records
    assert [r[0] for r in theirs_records] == list(range(500, base_offset))


HEADERS = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=16))), max_size=3
).map(tuple)
RECORDS = st.lists(
    st.tuples(
        st.integers(0, 1 << 44),
        st.one_of(st.none(), st.binary(max_size=30)),
        st.one_of(st.none(), st.binary(max_size=200)),
        HEADERS,
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(RECORDS, st.sampled_from(list(Compression)))
def test_interop_property(records, codec) -> None:
    assert kafka_python_view(ours(records, codec)) == expected(records)
    assert our_view(theirs(records, codec)) == expected(records)
    if codec == Compression.NONE:
        assert same_bytes_but_leader_epoch(ours(records, codec), theirs(records, codec))
