"""A topic's compression.type on the leader (fjord.records.recompress): batches in another codec
are rewritten with every record, offset, timestamp and producer field kept and a valid CRC, as
kafka-python (an implementation nobody here wrote) reads them; control batches, batches already
in the codec and ``producer`` are left byte for byte; damaged batches are refused, never given
a fresh CRC."""

from __future__ import annotations

import warnings

import pytest

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from fjord.errors import (
    ConfigError,
    CorruptRecordError,
    InvalidTimestampError,
    RecordTooLargeError,
)
from fjord.records import BatchBuilder, Compression, TimestampType, read_batches
from fjord.records.control import build_control_batch
from fjord.records.recompress import (
    check_timestamps,
    needs_recompression,
    recompress,
    topic_codec,
)

SAMPLE = [
    (1_700_000_000_000, b"key-0", b"value-0" * 30, ()),
    (1_700_000_000_005, None, b"null key", (("trace", b"abc"), ("null", None))),
    (1_699_999_999_000, b"earlier", b"", ()),
    (1_700_000_000_009, b"null value", None, ()),
]


def batch(codec: Compression, *, base_sequence: int = 42) -> bytes:
    builder = BatchBuilder(compression=codec, batch_size=1 << 20, producer_id=77,
                           producer_epoch=3, base_sequence=base_sequence)
    for timestamp, key, value, headers in SAMPLE:
        assert builder.append(timestamp, key, value, headers)
    return builder.build()


def kafka_python_view(data: bytes) -> list[tuple]:
    parsed = DefaultRecordBatch(data)
    assert parsed.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in parsed]


EXPECTED = [(i, ts, k, v, tuple(h)) for i, (ts, k, v, h) in enumerate(SAMPLE)]


@pytest.mark.parametrize("target", list(Compression), ids=lambda c: c.name.lower())
@pytest.mark.parametrize("source", list(Compression), ids=lambda c: c.name.lower())
def test_every_codec_pair_keeps_the_records(source: Compression, target: Compression) -> None:
    original = batch(source)
    assert needs_recompression(original, target) is (source != target)
    out = recompress(original, target)
    if source == target:
        assert out == original
        return
    parsed = DefaultRecordBatch(out)
    assert parsed.compression_type == target
    assert kafka_python_view(out) == EXPECTED
    assert (parsed.producer_id, parsed.producer_epoch, parsed.base_sequence) == (77, 3, 42)
    assert parsed.last_offset_delta == len(SAMPLE) - 1
    assert parsed.max_timestamp == max(ts for ts, *_ in SAMPLE)
    (ours,) = read_batches(out)
    assert ours.header.compression == target
    assert ours.header.timestamp_type == TimestampType.CREATE_TIME


def test_several_batches_kafka_python_built_and_control_batches() -> None:
    theirs = DefaultRecordBatchBuilder(magic=2, compression_type=int(Compression.SNAPPY),
                                       is_transactional=False, producer_id=-1, producer_epoch=-1,
                                       base_sequence=-1, batch_size=1 << 20)
    for offset, (timestamp, key, value, headers) in enumerate(SAMPLE):
        theirs.append(offset, timestamp, key, value, list(headers))
    control = build_control_batch(9, 1, committed=True, coordinator_epoch=2, timestamp_ms=5)
    payload = bytes(theirs.build()) + batch(Compression.GZIP, base_sequence=46) + control
    out = recompress(payload, Compression.LZ4)
    batches = list(read_batches(out))
    assert [b.header.compression for b in batches] == [
        Compression.LZ4, Compression.LZ4, Compression.NONE
    ]
    assert bytes(batches[2].raw) == control  # a control batch is never rewritten
    for b in batches[:2]:
        assert kafka_python_view(bytes(b.raw)) == EXPECTED


def test_damaged_or_oversized_batches_are_refused() -> None:
    damaged = bytearray(batch(Compression.GZIP))
    damaged[-1] ^= 0xFF
    assert needs_recompression(bytes(damaged), Compression.ZSTD)
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        recompress(bytes(damaged), Compression.ZSTD)
    with pytest.raises(CorruptRecordError):
        recompress(batch(Compression.NONE)[:-3], Compression.ZSTD)
    with pytest.raises(RecordTooLargeError, match=r"max\.message\.bytes=100"):
        recompress(batch(Compression.NONE), Compression.ZSTD, max_batch_bytes=100)


def test_topic_codec_names() -> None:
    assert topic_codec("producer") is None
    assert topic_codec("uncompressed") is Compression.NONE
    assert topic_codec(" ZSTD ") is Compression.ZSTD
    with pytest.raises(ConfigError, match=r"compression\.type: 'none' is not one of producer"):
        topic_codec("none")


def test_timestamps_checked_record_by_record() -> None:
    """message.timestamp.difference.max.ms: every record, including one earlier than the
    batch's base timestamp (a negative delta the header does not show)."""
    now = 1_700_000_000_005
    check_timestamps(batch(Compression.GZIP), now, 10_000)  # SAMPLE spans now-1005 .. now+4
    with pytest.raises(InvalidTimestampError, match=r"timestamp 1699999999000 .* delta 2"):
        check_timestamps(batch(Compression.ZSTD), now, 1_000)  # only the third is too early
    control = build_control_batch(9, 1, committed=True, coordinator_epoch=2, timestamp_ms=5)
    check_timestamps(control, now, 0)  # control batches are not checked
    damaged = bytearray(batch(Compression.NONE))
    damaged[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        check_timestamps(bytes(damaged), now, 10**12)
