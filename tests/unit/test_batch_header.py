"""The RecordBatch v2 header: parsing, validation and stamping, on hand-built batches."""

from __future__ import annotations

import struct

import pytest

from fjord.errors import CorruptRecordError, ErrorCode, RecordTooLargeError
from fjord.records.header import (
    BATCH_HEADER_SIZE,
    CRC_START,
    HEADER_STRUCT,
    STAMPED_PREFIX_SIZE,
    Compression,
    check_crc,
    check_structure,
    crc32c,
    iter_batches,
    parse_header,
    set_log_append_time,
    stamp_batch,
    stamp_producer_state,
    stamped_prefix,
    validate_batch,
)


def make_batch(payload: bytes = b"\x00" * 10, record_count: int = 1, attributes: int = 0) -> bytes:
    """A header with a valid CRC over ``payload`` (records are not decoded here)."""
    length = BATCH_HEADER_SIZE - 12 + len(payload)
    fields = [0, length, -1, 2, 0, attributes, record_count - 1, 1000, 1000, -1, -1, -1,
              record_count]
    buf = bytearray(HEADER_STRUCT.pack(*fields) + payload)
    struct.pack_into(">I", buf, 17, crc32c(buf[CRC_START:]))
    return bytes(buf)


def test_crc32c_known_vector() -> None:
    assert crc32c(b"123456789") == 0xE3069283


def test_header_round_trip_and_properties() -> None:
    h = validate_batch(make_batch(record_count=3, attributes=Compression.LZ4 | 0x08))
    assert h.size == BATCH_HEADER_SIZE + 10
    assert h.record_count == 3 and h.last_offset_delta == 2 and h.next_offset == 3
    assert h.compression is Compression.LZ4
    assert h.timestamp_type.name == "LOG_APPEND_TIME"


def test_stamp_keeps_crc_valid() -> None:
    buf = bytearray(make_batch())
    stamp_batch(buf, 0, base_offset=42, leader_epoch=7)
    h = validate_batch(buf)
    assert (h.base_offset, h.partition_leader_epoch, h.last_offset) == (42, 7, 42)


def test_iter_batches_walks_concatenation() -> None:
    a, b = make_batch(b"a" * 5), make_batch(b"b" * 9, record_count=2)
    found = list(iter_batches(a + b))
    assert [pos for pos, _ in found] == [0, len(a)]
    assert [h.record_count for _, h in found] == [1, 2]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b[:30], "truncated batch header"),
        (lambda b: b[:-1], "truncated batch"),
        (lambda b: b[:16] + b"\x01" + b[17:], "magic 1"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "CRC mismatch"),
        (lambda b: b[:8] + struct.pack(">i", 10) + b[12:], "less than a header"),
        (lambda b: b[:22] + b"\x07" + b[23:], "unknown compression"),
    ],
)
def test_corrupt_headers_raise_typed_errors(mutate, message) -> None:
    with pytest.raises(CorruptRecordError, match=message) as info:
        validate_batch(mutate(make_batch()))
    assert info.value.code is ErrorCode.CORRUPT_MESSAGE


def test_too_large_batch() -> None:
    with pytest.raises(RecordTooLargeError, match=r"max\.message\.bytes=50"):
        validate_batch(make_batch(), max_batch_bytes=50)


def test_parse_header_does_not_check_crc() -> None:
    bad = bytearray(make_batch())
    bad[-1] ^= 0xFF
    assert parse_header(bad).record_count == 1


def test_stamped_prefix_gives_what_stamp_batch_gives() -> None:
    batch = make_batch(b"x" * 7)
    stamped = bytearray(batch)
    stamp_batch(stamped, 0, base_offset=9, leader_epoch=3)
    length = parse_header(batch).batch_length
    assert stamped_prefix(9, length, 3) + batch[STAMPED_PREFIX_SIZE:] == bytes(stamped)


def test_producer_state_is_written_inside_a_valid_crc() -> None:
    buf = bytearray(b"pad" + make_batch(record_count=4))
    stamp_producer_state(buf, producer_id=77, producer_epoch=5, base_sequence=100, pos=3)
    h = validate_batch(buf, 3)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence) == (77, 5, 100, 103)
    assert h.record_count == 4 and h.max_timestamp == 1000


def test_log_append_time_marks_the_batch_and_keeps_its_crc_valid() -> None:
    buf = bytearray(make_batch(attributes=Compression.GZIP))
    set_log_append_time(buf, 123_456)
    h = validate_batch(buf)
    assert h.timestamp_type.name == "LOG_APPEND_TIME" and h.max_timestamp == 123_456
    assert h.compression is Compression.GZIP and h.base_timestamp == 1000


def test_structure_and_crc_are_checked_apart() -> None:
    bad = bytearray(make_batch())
    bad[-1] ^= 0xFF
    header = check_structure(bad)  # the CRC is not its business
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        check_crc(bad, 0, header)
    with pytest.raises(CorruptRecordError, match="truncated batch at position 0"):
        check_structure(bad[:-1])


def test_has_transactional_batch_finds_one_behind_plain_batches() -> None:
    from fjord.records import BatchBuilder
    from fjord.records.header import has_transactional_batch

    def batch(transactional: bool) -> bytes:
        builder = BatchBuilder(producer_id=7 if transactional else -1,
                               producer_epoch=0 if transactional else -1,
                               base_sequence=0 if transactional else -1,
                               is_transactional=transactional)
        builder.append(0, None, b"v")
        return builder.build()

    plain, txn = batch(False), batch(True)
    assert not has_transactional_batch(b"")
    assert not has_transactional_batch(plain + plain)
    assert has_transactional_batch(txn)
    assert has_transactional_batch(plain + plain + txn)
    assert not has_transactional_batch(plain + txn[:20])  # a truncated header is not read
