"""fjord.records: builder and reader round trips, exact layout, varints, codecs, limits."""

from __future__ import annotations

import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.errors import CorruptRecordError, InvalidRecordError, UnsupportedCompressionError
from fjord.records import (
    BATCH_HEADER_SIZE,
    BatchBuilder,
    Compression,
    Record,
    TimestampType,
    compress,
    compression_by_name,
    crc32c,
    decode_records,
    decompress,
    iter_batches,
    parse_header,
    read_batches,
    record_size_upper_bound,
    stamp_batch,
    validate_batch,
)
from fjord.records.codecs import LZ4_FRAME_HEADER, XERIAL_HEADER
from fjord.records.defaults import DEFAULT_BATCH_SIZE, XERIAL_SNAPPY_BLOCK_SIZE
from fjord.records.reader import records_from_tuples
from fjord.records.varint import (
    SMALL_LIMIT,
    ZIGZAG_ONE_BYTE,
    ZIGZAG_TWO_BYTES,
    decode_zigzag,
    encode_unsigned_varint,
    encode_zigzag,
    zigzag_size,
)

# Every test runs with the pure-Python record code and with the C extension (issue 18).
pytestmark = pytest.mark.usefixtures("records_implementation")

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
KEYS_BOUND = st.one_of(st.none(), st.binary(max_size=10_000))
VALUES_BOUND = st.one_of(st.none(), st.binary(max_size=20_000))
KEYS = st.one_of(st.none(), st.binary(max_size=40))
VALUES = st.one_of(st.none(), st.binary(max_size=300))
HEADERS = st.lists(
    st.tuples(st.text(max_size=10), st.one_of(st.none(), st.binary(max_size=20))), max_size=3
).map(tuple)
RECORDS = st.lists(
    st.tuples(st.integers(-1, 1 << 45), KEYS, VALUES, HEADERS), min_size=1, max_size=40
)
HEADERS_BOUND = st.lists(
    st.tuples(st.text(max_size=10), st.one_of(st.none(), st.binary(max_size=200))), max_size=3
).map(tuple)


def build(records, compression=Compression.NONE, **kwargs) -> bytes:
    builder = BatchBuilder(compression=compression, batch_size=1 << 30, **kwargs)
    for timestamp, key, value, headers in records:
        assert builder.append(timestamp, key, value, headers)
    return builder.build()


def as_tuples(records) -> list[tuple]:
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records]


# -- varints -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, b"\x00"),
        (-1, b"\x01"),
        (1, b"\x02"),
        (63, b"\x7e"),
        (-64, b"\x7f"),
        (64, b"\x80\x01"),
        (100, b"\xc8\x01"),
        (-(1 << 63), b"\xff" * 9 + b"\x01"),
        ((1 << 63) - 1, b"\xfe" + b"\xff" * 8 + b"\x01"),
    ],
)
def test_zigzag_known_encodings(value: int, encoded: bytes) -> None:
    assert encode_zigzag(value) == encoded
    assert zigzag_size(value) == len(encoded)
    assert decode_zigzag(encoded + b"tail", 0) == (value, len(encoded))


@given(INT64)
def test_zigzag_round_trip(value: int) -> None:
    encoded = encode_zigzag(value)
    assert zigzag_size(value) == len(encoded)
    assert decode_zigzag(b"x" + encoded, 1) == (value, 1 + len(encoded))


def test_zigzag_tables_agree_with_the_slow_decoder() -> None:
    for value in range(-SMALL_LIMIT, SMALL_LIMIT):
        encoded = encode_zigzag(value)
        if len(encoded) == 1:
            assert ZIGZAG_ONE_BYTE[encoded[0]] == value
        else:
            assert ZIGZAG_TWO_BYTES[(encoded[1] << 8) | encoded[0]] == value


def test_malformed_varints() -> None:
    with pytest.raises(CorruptRecordError, match="runs past"):
        decode_zigzag(b"\x80\x80", 0)
    with pytest.raises(CorruptRecordError, match="longer than 10 bytes"):
        decode_zigzag(b"\xff" * 11, 0)
    with pytest.raises(CorruptRecordError, match="exceeds 64 bits"):
        decode_zigzag(b"\xff" * 9 + b"\x7f", 0)


def test_varint_range_errors() -> None:
    with pytest.raises(ValueError, match="int64"):
        encode_zigzag(1 << 63)
    with pytest.raises(ValueError, match="unsigned"):
        encode_unsigned_varint(-1)


# -- exact layout --------------------------------------------------------------------------------


def test_record_layout_byte_for_byte() -> None:
    builder = BatchBuilder()
    assert builder.append(1_000, None, b"v")
    assert builder.append(1_003, b"key", None, (("h", b"x"), ("n", None)))
    batch = builder.build()
    header = validate_batch(batch)
    assert (header.base_offset, header.partition_leader_epoch, header.magic) == (0, -1, 2)
    assert (header.record_count, header.last_offset_delta) == (2, 1)
    assert (header.base_timestamp, header.max_timestamp) == (1_000, 1_003)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (-1, -1, -1)
    assert header.attributes == 0
    # length 7, attributes 0, ts delta 0, offset delta 0, key null, value len 1, "v", 0 headers
    first = bytes([14, 0, 0, 0, 1, 2]) + b"v" + b"\x00"
    # ts delta 3, offset delta 1, key len 3 "key", value null, 2 headers: "h"=b"x", "n"=null
    second_body = bytes([0, 6, 2, 6]) + b"key" + bytes([1, 4, 2]) + b"h" + bytes([2]) + b"x"
    second_body += bytes([2]) + b"n" + bytes([1])
    second = bytes([2 * len(second_body)]) + second_body
    assert batch[BATCH_HEADER_SIZE:] == first + second
    assert header.size == len(batch) == builder.size_in_bytes


def test_header_fields_from_builder_arguments() -> None:
    builder = BatchBuilder(
        compression=Compression.GZIP,
        producer_id=42,
        producer_epoch=3,
        base_sequence=17,
        timestamp_type=TimestampType.LOG_APPEND_TIME,
        is_transactional=True,
    )
    builder.append(5, b"k", b"v")
    header = validate_batch(builder.build())
    assert header.compression == Compression.GZIP
    assert header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert header.is_transactional and not header.is_control
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 17)


# -- builder behaviour ---------------------------------------------------------------------------


def test_builder_fills_up_to_batch_size_and_always_takes_the_first_record() -> None:
    builder = BatchBuilder(batch_size=300)
    assert builder.append(0, b"k", b"x" * 1000)  # first record: accepted although too big
    assert not builder.append(0, b"k", b"x")
    assert builder.record_count == 1

    builder = BatchBuilder(batch_size=400)
    accepted = 0
    while builder.append(0, b"key", b"v" * 50):
        accepted += 1
        assert builder.size_in_bytes <= 400
    assert builder.record_count == accepted > 1
    size_before = builder.size_in_bytes
    assert not builder.append(0, b"key", b"v" * 50)  # a refused append changes nothing
    assert builder.size_in_bytes == size_before
    batch = builder.build()
    assert len(batch) == size_before
    assert [r.offset for r in decode_records(batch)] == list(range(accepted))


def test_a_refused_record_leaves_no_trace() -> None:
    builder = BatchBuilder(batch_size=200)
    assert builder.append(10, b"k", b"v" * 100)
    assert not builder.append(99_999, b"k", b"v" * 100)  # refused: would overflow
    header = validate_batch(builder.build())
    assert (header.record_count, header.max_timestamp) == (1, 10)


@settings(max_examples=50, deadline=None)
@given(RECORDS)
def test_size_in_bytes_is_exact_without_compression(records) -> None:
    builder = BatchBuilder(batch_size=1 << 30)
    for timestamp, key, value, headers in records:
        builder.append(timestamp, key, value, headers)
    assert len(builder.build()) == builder.size_in_bytes


def test_default_batch_size_is_kafkas() -> None:
    assert DEFAULT_BATCH_SIZE == 16384
    builder = BatchBuilder()
    while builder.append(0, b"12345678", b"v" * 100):
        pass
    assert 16384 - 200 < builder.size_in_bytes <= 16384


def test_build_closes_the_builder() -> None:
    builder = BatchBuilder()
    builder.append(1, b"k", b"v")
    first = builder.build()
    assert builder.is_closed and builder.build() == first
    with pytest.raises(InvalidRecordError, match="built"):
        builder.append(2, b"k", b"v")


def test_empty_batch_is_refused() -> None:
    with pytest.raises(InvalidRecordError, match="without records"):
        BatchBuilder().build()


def test_bytes_like_keys_and_values_are_accepted() -> None:
    batch = build([(1, bytearray(b"k"), memoryview(b"value"), (("h", bytearray(b"x")),))])
    (record,) = decode_records(batch)
    assert (record.key, record.value, record.headers) == (b"k", b"value", (("h", b"x"),))
    assert type(record.key) is bytes and type(record.value) is bytes


@pytest.mark.parametrize(
    ("kwargs", "append_args", "message"),
    [
        ({}, (1, "text", b"v"), "key must be bytes"),
        ({}, (1, b"k", 3), "value must be bytes"),
        ({}, (1.5, b"k", b"v"), "timestamp must be an int"),
        ({}, (1 << 63, b"k", b"v"), "record timestamp"),
        ({}, (1, b"k", b"v", ((b"bytes-key", b"v"),)), "header key must be str"),
        ({}, (1, b"k", b"v", (("h", "str"),)), "value must be bytes or None"),
        ({}, (1, b"k", b"v", ("not-a-pair",)), "pair"),
        ({}, (1, b"k", b"v", (("\ud800", b"v"),)), "not valid UTF-8"),
    ],
)
def test_bad_append_arguments_raise_and_add_nothing(kwargs, append_args, message) -> None:
    builder = BatchBuilder(**kwargs)
    with pytest.raises(InvalidRecordError, match=message):
        builder.append(*append_args)
    assert builder.record_count == 0 and builder.size_in_bytes == BATCH_HEADER_SIZE
    builder.append(7, b"ok", b"ok")  # still usable
    assert [r.key for r in decode_records(builder.build())] == [b"ok"]


def test_timestamp_delta_out_of_int64_range_is_refused() -> None:
    builder = BatchBuilder()
    builder.append(-(1 << 62) * 2, b"k", b"v")
    with pytest.raises(InvalidRecordError, match="timestamp delta"):
        builder.append((1 << 63) - 1, b"k", b"v")
    assert builder.record_count == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"compression": 7}, UnsupportedCompressionError, "unknown compression codec 7"),
        ({"batch_size": 0}, InvalidRecordError, "batch size"),
        ({"producer_epoch": 1 << 15}, InvalidRecordError, "producer epoch"),
        ({"base_sequence": 1 << 31}, InvalidRecordError, "base sequence"),
        ({"producer_id": 1 << 63}, InvalidRecordError, "producer id"),
        ({"timestamp_type": 2}, InvalidRecordError, "timestamp type"),
    ],
)
def test_bad_builder_arguments(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        BatchBuilder(**kwargs)


# -- reader --------------------------------------------------------------------------------------


def test_offsets_are_absolute_after_stamping_and_timestamps_follow_the_type() -> None:
    batches = bytearray()
    for base_offset, timestamp_type in ((100, TimestampType.CREATE_TIME), (102, 1)):
        builder = BatchBuilder(timestamp_type=TimestampType(timestamp_type))
        builder.append(10, b"a", b"1")
        builder.append(30, b"b", b"2")
        builder.append(20, b"c", b"3")  # out of order: max stays 30
        batch = bytearray(builder.build())
        stamp_batch(batch, 0, base_offset, 7)
        batches += batch
    records = list(decode_records(batches))
    assert [(r.offset, r.timestamp) for r in records] == [
        (100, 10),
        (101, 30),
        (102, 20),
        (102, 30),  # LOG_APPEND_TIME: every record reports the batch's max timestamp
        (103, 30),
        (104, 30),
    ]
    headers = [b.header for b in read_batches(batches)]
    assert [(h.base_offset, h.partition_leader_epoch) for h in headers] == [(100, 7), (102, 7)]


def test_read_batches_gives_headers_without_decoding_records() -> None:
    batch = build([(1, b"k", b"v", ())] * 3, Compression.ZSTD)
    (read,) = read_batches(batch + batch[:-1], allow_partial_tail=True)
    assert read.header == parse_header(batch) and bytes(read.raw) == batch
    assert (read.base_offset, read.last_offset, read.next_offset, read.size) == (
        0,
        2,
        3,
        len(batch),
    )
    assert "ZSTD" in repr(read)
    assert len(read.record_tuples()) == 3


def test_decode_records_skips_a_trailing_partial_batch() -> None:
    batch = build([(1, b"k", b"v" * 10, ())])
    for cut in (1, 11, 12, 60, 61, len(batch) - 1):
        assert as_tuples(decode_records(batch + batch[:cut])) == as_tuples(decode_records(batch))
    assert list(decode_records(b"")) == []
    assert list(decode_records(batch[:40])) == []


def test_bytearray_and_memoryview_input() -> None:
    batch = build([(1, b"k", b"v", (("h", b"x"),)), (2, None, None, ())])
    expected = as_tuples(decode_records(batch))
    assert as_tuples(decode_records(bytearray(batch))) == expected
    assert as_tuples(decode_records(memoryview(batch))) == expected
    padded = memoryview(b"junk" + batch)[4:]
    assert as_tuples(decode_records(padded)) == expected
    assert all(type(r.key) in (bytes, type(None)) for r in decode_records(memoryview(batch)))


def test_records_from_tuples_equals_the_constructor() -> None:
    tuples = [(1, 2, b"k", None, ()), (2, 3, None, b"v", (("h", None),))]
    made = records_from_tuples(tuples)
    assert made == [Record(*t) for t in tuples]
    assert records_from_tuples([]) == []
    assert hash(made[0]) == hash(Record(*tuples[0]))


def test_record_is_frozen() -> None:
    (record,) = decode_records(build([(1, b"k", b"v", ())]))
    with pytest.raises(AttributeError):
        record.offset = 5  # type: ignore[misc]


def test_control_batches_are_skipped_by_decode_records() -> None:
    control = bytearray(build([(1, b"\x00\x00\x00\x01", b"marker", ())]))
    control[22] |= 0x20  # attributes low byte: control bit
    struct.pack_into(">I", control, 17, crc32c(bytes(control[21:])))
    data = build([(2, b"k", b"v", ())])
    (read,) = read_batches(bytes(control))
    assert read.header.is_control and len(list(read.records())) == 1
    assert [r.key for r in decode_records(bytes(control) + data)] == [b"k"]


@settings(max_examples=100, deadline=None)
@given(KEYS_BOUND, VALUES_BOUND, HEADERS_BOUND, INT64)
def test_record_size_upper_bound(key, value, headers, timestamp) -> None:
    single = build([(timestamp, key, value, headers)])
    assert len(single) <= record_size_upper_bound(key, value, headers)
    # and the bound is tight enough to be useful: at most 14 bytes of slack for the deltas
    assert record_size_upper_bound(key, value, headers) - len(single) <= 14


# -- codecs --------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", list(Compression))
def test_codec_round_trip_and_framing(codec: Compression) -> None:
    data = b"".join(b"record %d " % i for i in range(20_000))  # > several snappy blocks
    packed = compress(codec, data)
    assert decompress(codec, packed) == data
    if codec == Compression.GZIP:
        assert packed[:2] == b"\x1f\x8b"
    elif codec == Compression.SNAPPY:
        assert packed.startswith(XERIAL_HEADER)
        blocks, pos = 0, len(XERIAL_HEADER)
        while pos < len(packed):
            (length,) = struct.unpack_from(">i", packed, pos)
            pos += 4 + length
            blocks += 1
        assert pos == len(packed) and blocks == -(-len(data) // XERIAL_SNAPPY_BLOCK_SIZE)
    elif codec == Compression.LZ4:
        import lz4.frame

        # Kafka's writer: version 1, independent blocks, no checksums, 64 KiB blocks
        expected = lz4.frame.compress(
            b"",
            block_size=lz4.frame.BLOCKSIZE_MAX64KB,
            block_linked=False,
            content_checksum=False,
            block_checksum=False,
            store_size=False,
        )
        assert packed.startswith(LZ4_FRAME_HEADER) and expected.startswith(LZ4_FRAME_HEADER)
        assert lz4.frame.decompress(packed) == data
        assert compress(codec, b"") == expected
    elif codec == Compression.ZSTD:
        assert packed[:4] == b"\x28\xb5\x2f\xfd"


def test_compression_by_name() -> None:
    assert [compression_by_name(c.name.lower()) for c in Compression] == list(Compression)
    assert compression_by_name("ZSTD") == Compression.ZSTD
    with pytest.raises(UnsupportedCompressionError, match="brotli"):
        compression_by_name("brotli")


def test_raw_snappy_without_xerial_framing_is_read() -> None:
    import cramjam

    data = b"plain snappy block " * 100
    assert decompress(Compression.SNAPPY, bytes(cramjam.snappy.compress_raw(data))) == data


# -- properties ----------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(RECORDS, st.sampled_from(list(Compression)), st.integers(0, 1 << 40))
def test_round_trip_property(records, codec, base_offset) -> None:
    batch = bytearray(build(records, codec))
    stamp_batch(batch, 0, base_offset, 3)
    decoded = list(decode_records(batch))
    assert as_tuples(decoded) == [
        (base_offset + i, ts, key, value, tuple(headers))
        for i, (ts, key, value, headers) in enumerate(records)
    ]
    header = validate_batch(batch)
    assert header.max_timestamp == max(r[0] for r in records)
    assert header.base_timestamp == records[0][0]
    assert [h.record_count for _, h in iter_batches(batch)] == [len(records)]


def test_try_append_seal_and_take_records() -> None:
    """The producer's fast-path calls: the record's index or -1, never an exception for a
    full, sealed or built batch; take_records returns the section with its count and
    timestamps in one step."""
    from fjord.client.futures import BatchCompletion, RecordFuture

    builder = BatchBuilder(batch_size=61 + 3 * 8)  # three records with a 1-byte value
    assert [builder.try_append(100 + i, None, b"v") for i in range(4)] == [0, 1, 2, -1]
    builder = BatchBuilder()
    assert builder.try_append(5, b"k", b"v", (("h", b"x"),)) == 0
    completion = BatchCompletion("t", 1)
    future = builder.try_append_future(RecordFuture, completion, 7, None, b"w")
    assert isinstance(future, RecordFuture) and not future.done()
    completion.complete(40)
    assert (future.result(0).offset, future.result(0).timestamp) == (41, 7)
    before = int(time.time() * 1000)
    now = builder.try_append_future(RecordFuture, completion, None, None, b"n")  # None: now
    assert now is not None and before <= now._timestamp <= int(time.time() * 1000)
    builder.seal()
    assert builder.try_append(8, None, b"x") == -1
    assert builder.try_append_future(RecordFuture, completion, 8, None, b"x") is None
    assert builder.append(9, None, b"y")  # seal() only stops the fast path
    built = builder.build()
    assert builder.try_append(10, None, b"z") == -1
    assert [(r.offset, r.value) for r in decode_records(built)] == [
        (0, b"v"), (1, b"w"), (2, b"n"), (3, b"y"),
    ]  # fmt: skip
    with pytest.raises(InvalidRecordError):
        builder.take_records()
    fresh = BatchBuilder()
    fresh.append(3, None, b"a")
    fresh.append(1, None, b"b")
    section, count, base, newest = fresh.take_records()
    assert (count, base, newest) == (2, 3, 3) and len(section) == fresh.size_in_bytes - 61
