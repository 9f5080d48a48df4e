"""Bad input to fjord.records: every malformed batch raises a typed error that says what is
wrong, and nothing half-parsed escapes."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.errors import CorruptRecordError, ErrorCode, RecordTooLargeError
from fjord.records import (
    BATCH_HEADER_SIZE,
    BatchBuilder,
    Compression,
    crc32c,
    decode_records,
    read_batches,
    stamp_batch,
)
from fjord.records.header import CRC_START
from fjord.records.varint import encode_zigzag

# Every test runs with the pure-Python record code and with the C extension (issue 18).
pytestmark = pytest.mark.usefixtures("records_implementation")


def build(count: int = 3, codec: Compression = Compression.NONE, headers=()) -> bytes:
    builder = BatchBuilder(compression=codec)
    for i in range(count):
        assert builder.append(1_000 + i, b"key-%d" % i, b"value-%d" % i, headers)
    return builder.build()


def restamp_crc(batch: bytes | bytearray) -> bytes:
    """The same bytes with a CRC that matches them: damage the CRC cannot catch."""
    buf = bytearray(batch)
    struct.pack_into(">I", buf, 17, crc32c(bytes(buf[CRC_START:])))
    return bytes(buf)


def with_records_section(batch: bytes, section: bytes, record_count: int | None = None) -> bytes:
    """``batch`` with its records section replaced (length, count and CRC made consistent)."""
    buf = bytearray(batch[:BATCH_HEADER_SIZE] + section)
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    if record_count is not None:
        struct.pack_into(">i", buf, 57, record_count)
    return restamp_crc(buf)


def decode_all(buf: bytes) -> list:
    return [r for batch in read_batches(buf) for r in batch.records()]


def assert_corrupt(buf: bytes, message: str) -> None:
    with pytest.raises(CorruptRecordError, match=message) as info:
        decode_all(buf)
    assert info.value.code == ErrorCode.CORRUPT_MESSAGE


def test_wrong_crc() -> None:
    batch = bytearray(build())
    batch[-3] ^= 0x01
    assert_corrupt(bytes(batch), "CRC mismatch")
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        list(decode_records(bytes(batch)))


def test_wrong_magic() -> None:
    batch = bytearray(build())
    batch[16] = 1
    assert_corrupt(bytes(batch), "magic 1")


def test_truncated_batch_and_header() -> None:
    batch = build()
    assert_corrupt(batch[:-1], "truncated batch")
    assert_corrupt(batch[:30], "truncated batch header")


def test_over_long_length_field() -> None:
    batch = bytearray(build())
    struct.pack_into(">i", batch, 8, len(batch))  # 12 bytes more than there are
    assert_corrupt(bytes(batch), "truncated batch")
    struct.pack_into(">i", batch, 8, 20)  # shorter than a header
    assert_corrupt(bytes(batch), "less than a header")


def test_length_field_cutting_into_the_records() -> None:
    batch = build()
    shortened = bytearray(batch[:-4])
    struct.pack_into(">i", shortened, 8, len(shortened) - 12)
    assert_corrupt(restamp_crc(shortened), "runs past|declares length")


@pytest.mark.parametrize("declared", [2, 4, 0])
def test_record_count_mismatch(declared: int) -> None:
    batch = build(3)
    section = batch[BATCH_HEADER_SIZE:]
    assert_corrupt(with_records_section(batch, section, declared), "header says")


def test_record_count_mismatch_in_a_compressed_batch() -> None:
    batch = bytearray(build(3, Compression.ZSTD))
    struct.pack_into(">i", batch, 57, 5)
    assert_corrupt(restamp_crc(batch), "header says 5 records, records section holds 3")


def test_record_length_running_past_the_batch() -> None:
    batch = build(1)
    section = bytearray(batch[BATCH_HEADER_SIZE:])
    body = section[1:]  # a short record: its length varint is one byte
    assert len(encode_zigzag(len(body))) == 1
    bad = encode_zigzag(len(body) + 40) + body
    assert_corrupt(with_records_section(batch, bytes(bad)), "declares length")


def test_record_fields_longer_than_the_record_length() -> None:
    batch = build(1)
    body = batch[BATCH_HEADER_SIZE + 1 :]
    # The declared length is 2 bytes short of the fields; the rest would be a "second" record.
    bad = encode_zigzag(len(body) - 2) + body
    assert_corrupt(with_records_section(batch, bad), "fields take|runs past|declares")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda body: b"\x05" + body[1:], "attributes 5"),  # record attributes must be 0
        (lambda body: body[:3] + encode_zigzag(-3) + body[4:], "key length -3"),
    ],
)
def test_bad_record_fields(mutate, message) -> None:
    builder = BatchBuilder()
    builder.append(1, b"k", b"v")
    batch = builder.build()
    body = batch[BATCH_HEADER_SIZE + 1 :]
    bad = mutate(body)
    assert_corrupt(with_records_section(batch, encode_zigzag(len(bad)) + bad), message)


def test_offset_deltas_must_increase() -> None:
    builder = BatchBuilder()
    builder.append(1, b"k", b"v")
    builder.append(1, b"k", b"v")
    batch = builder.build()
    section = bytearray(batch[BATCH_HEADER_SIZE:])
    second = section.index(b"\x00\x00\x02", 5)  # attributes, ts delta 0, offset delta 1
    section[second + 2] = 0  # offset delta 1 -> 0: a repeated offset
    assert_corrupt(with_records_section(batch, bytes(section)), "offset delta 0")


def test_header_key_that_is_not_utf8() -> None:
    batch = build(1, headers=(("h", b"v"),))
    section = bytearray(batch[BATCH_HEADER_SIZE:])
    section[section.index(b"h")] = 0xFF
    assert_corrupt(with_records_section(batch, bytes(section)), "not UTF-8")


def test_compressed_section_that_does_not_decompress() -> None:
    for codec in (Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD):
        batch = build(3, codec)
        section = bytearray(batch[BATCH_HEADER_SIZE:])
        section[len(section) // 2 :] = b"\xaa" * (len(section) - len(section) // 2)
        assert_corrupt(with_records_section(batch, bytes(section)), codec.name.lower())


def test_unknown_codec_id() -> None:
    batch = bytearray(build())
    batch[22] |= 0x07  # attributes low byte: codec 7
    assert_corrupt(restamp_crc(batch), "unknown compression codec id 7")


def test_batch_over_max_message_bytes() -> None:
    batch = build(50)
    with pytest.raises(RecordTooLargeError, match=r"max\.message\.bytes") as info:
        list(read_batches(batch, max_batch_bytes=len(batch) - 1))
    assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE
    with pytest.raises(RecordTooLargeError):
        list(decode_records(batch, max_batch_bytes=100))
    assert len(list(decode_records(batch, max_batch_bytes=len(batch)))) == 50


def test_nothing_half_parsed_escapes() -> None:
    good = bytearray(build(3))
    stamp_batch(good, 0, 0, 0)
    bad = bytearray(build(4))
    stamp_batch(bad, 0, 3, 0)
    section = bytes(bad[BATCH_HEADER_SIZE:])
    bad_batch = with_records_section(bytes(bad), section[:-2] + b"\x7f\x7f")  # last record bad
    seen = []
    with pytest.raises(CorruptRecordError):
        for record in decode_records(bytes(good) + bad_batch):
            seen.append(record.offset)
    assert seen == [0, 1, 2]  # the good batch only: none of the damaged batch's records


# -- properties: damage either decodes to exactly the original or raises CorruptRecordError ------

BATCHES = st.builds(
    lambda counts, codecs: b"".join(build(n, c) for n, c in zip(counts, codecs, strict=False)),
    st.lists(st.integers(1, 5), min_size=1, max_size=3),
    st.lists(st.sampled_from(list(Compression)), min_size=3, max_size=3),
)


def snapshot(buf: bytes) -> list[tuple]:
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decode_all(buf)]


@settings(max_examples=300, deadline=None)
@given(BATCHES, st.data())
def test_byte_flips_are_caught(buf: bytes, data) -> None:
    original = snapshot(buf)
    # A batch's first 8 bytes are its base offset: outside the CRC by design (the broker stamps
    # it) and any value there is a valid base offset, so those bytes are not flipped.
    starts: set[int] = set()
    pos = 0
    for batch in read_batches(buf):
        starts.update(range(pos, pos + 8))
        pos += batch.size
    position = data.draw(st.sampled_from([p for p in range(len(buf)) if p not in starts]))
    damaged = bytearray(buf)
    damaged[position] ^= data.draw(st.integers(1, 255))
    with contextlib.suppress(CorruptRecordError):
        assert snapshot(bytes(damaged)) == original


@settings(max_examples=200, deadline=None)
@given(BATCHES, st.data())
def test_truncations_are_caught(buf: bytes, data) -> None:
    boundaries = [0]
    for batch in read_batches(buf):
        boundaries.append(boundaries[-1] + batch.size)
    cut = data.draw(st.integers(0, len(buf) - 1).filter(lambda c: c not in boundaries))
    with pytest.raises(CorruptRecordError):
        snapshot(buf[:cut])
    # a consumer skips the partial tail and loses only the damaged batch
    kept = list(decode_records(buf[:cut]))
    assert [(r.offset, r.key) for r in kept] == [(r[0], r[2]) for r in snapshot(buf)][: len(kept)]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.sampled_from(list(Compression)), st.data())
def test_damage_behind_a_valid_crc_never_escapes_as_another_error(count, codec, data) -> None:
    batch = build(count, codec, headers=(("h", b"v"),) if count % 2 else ())
    section = bytearray(batch[BATCH_HEADER_SIZE:])
    for _ in range(data.draw(st.integers(1, 3))):
        section[data.draw(st.integers(0, len(section) - 1))] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(0, len(section)))
    damaged = with_records_section(batch, bytes(section[:cut]))
    try:
        records = decode_all(damaged)
    except CorruptRecordError:
        return
    assert len(records) == count  # a decode that succeeds has the header's record count
