"""The 61-byte header of a Kafka RecordBatch v2, and the checks a broker makes on it.

Layout (big-endian), byte offsets from the start of the batch::

     0  base_offset              int64   stamped by the log on append (outside the CRC)
     8  batch_length             int32   bytes after this field (= total size - 12)
    12  partition_leader_epoch   int32   stamped by the log on append (outside the CRC)
    16  magic                    int8    always 2
    17  crc                      uint32  CRC-32C (Castagnoli) of bytes [21, end)
    21  attributes               int16   bits 0-2 codec, 3 timestamp type, 4 transactional,
                                         5 control, 6 delete horizon
    23  last_offset_delta        int32
    27  base_timestamp           int64
    35  max_timestamp            int64
    43  producer_id              int64   -1 when not idempotent
    51  producer_epoch           int16
    53  base_sequence            int32
    57  record_count             int32
    61  records ...              (compressed as a whole when the codec is not none)

This module only reads and stamps headers: it never decodes records. That is all a broker needs.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum

import crc32c as _crc32c

from fjord.errors import CorruptRecordError, RecordTooLargeError

HEADER_STRUCT = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_SIZE = HEADER_STRUCT.size  # 61
LOG_OVERHEAD = 12  # base_offset + batch_length: the bytes not counted by batch_length
MAGIC_V2 = 2
CRC_START = 21  # the CRC covers attributes .. end of batch
BASE_OFFSET_AND_LENGTH = struct.Struct(">qi")
LEADER_EPOCH_STRUCT = struct.Struct(">i")
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_DELETE_HORIZON = 0x40


class Compression(IntEnum):
    """Codec ids in the low three bits of the attributes (Kafka's numbering)."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC-32C (Castagnoli), computed in C by the ``crc32c`` package."""
    return int(_crc32c.crc32c(data, value))


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """A parsed batch header. Invariant after :func:`parse_header`: ``magic == 2`` and
    ``size >= BATCH_HEADER_SIZE``; the CRC is checked only by :func:`validate_batch`."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch on disk and on the wire."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & ATTR_COMPRESSION_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType(1 if self.attributes & ATTR_TIMESTAMP_TYPE else 0)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


Buffer = bytes | bytearray | memoryview


def parse_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    """Parse the header of the batch that starts at ``buf[pos]``.

    Raises :class:`CorruptRecordError` when fewer than 61 bytes remain, the magic is not 2, the
    length field is too small to hold a header, or the codec id is unknown. Does not check the CRC
    or that the whole batch is present (see :func:`validate_batch`).
    """
    available = len(buf) - pos
    if available < BATCH_HEADER_SIZE:
        raise CorruptRecordError(
            f"truncated batch header at position {pos}: {available} bytes, need {BATCH_HEADER_SIZE}"
        )
    header = BatchHeader(*HEADER_STRUCT.unpack_from(buf, pos))
    if header.magic != MAGIC_V2:
        raise CorruptRecordError(
            f"batch at position {pos} has magic {header.magic}; only RecordBatch v2 (magic 2) "
            "is supported"
        )
    if header.size < BATCH_HEADER_SIZE:
        raise CorruptRecordError(
            f"batch at position {pos} declares length {header.batch_length}, "
            f"less than a header ({BATCH_HEADER_SIZE - LOG_OVERHEAD})"
        )
    if header.attributes & ATTR_COMPRESSION_MASK > Compression.ZSTD:
        raise CorruptRecordError(
            f"batch at position {pos} has unknown compression codec id "
            f"{header.attributes & ATTR_COMPRESSION_MASK}"
        )
    if header.record_count < 0 or header.last_offset_delta < 0:
        raise CorruptRecordError(
            f"batch at position {pos} has negative record count {header.record_count} "
            f"or last offset delta {header.last_offset_delta}"
        )
    return header


def validate_batch(buf: Buffer, pos: int = 0, max_batch_bytes: int | None = None) -> BatchHeader:
    """Parse and fully check the batch at ``buf[pos]``: header, complete length and CRC-32C.

    Raises :class:`RecordTooLargeError` when the batch is larger than ``max_batch_bytes`` and
    :class:`CorruptRecordError` for anything malformed. Never decodes records.
    """
    header = parse_header(buf, pos)
    if max_batch_bytes is not None and header.size > max_batch_bytes:
        raise RecordTooLargeError(
            f"batch of {header.size} bytes exceeds max.message.bytes={max_batch_bytes}"
        )
    end = pos + header.size
    if end > len(buf):
        raise CorruptRecordError(
            f"truncated batch at position {pos}: declares {header.size} bytes, "
            f"only {len(buf) - pos} present"
        )
    actual = crc32c(memoryview(buf)[pos + CRC_START : end])
    if actual != header.crc:
        raise CorruptRecordError(
            f"CRC mismatch in batch at position {pos} (base offset {header.base_offset}): "
            f"stored {header.crc:#010x}, computed {actual:#010x}"
        )
    return header


def iter_batches(
    buf: Buffer, max_batch_bytes: int | None = None
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for each batch in a buffer of concatenated batches, each one
    validated by :func:`validate_batch`. The buffer must hold whole batches only."""
    pos = 0
    end = len(buf)
    while pos < end:
        header = validate_batch(buf, pos, max_batch_bytes)
        yield pos, header
        pos += header.size


def stamp_batch(buf: bytearray | memoryview, pos: int, base_offset: int, leader_epoch: int) -> None:
    """Write the base offset and partition leader epoch into the batch at ``buf[pos]``.

    Both fields lie outside the CRC, so the batch stays valid and the CRC is not recomputed.
    """
    struct.pack_into(">q", buf, pos, base_offset)
    LEADER_EPOCH_STRUCT.pack_into(buf, pos + 12, leader_epoch)


def end_of_whole_batches(buf: Buffer) -> int:
    """The offset after the last complete batch in ``buf`` (concatenated batches, the last one
    possibly cut), or -1 when no batch is complete. Reads base offset, length and last offset
    delta of each header only: no CRC check, no decoding (a consumer's prefetch continues
    there)."""
    end = -1
    pos = 0
    size = len(buf)
    while pos + _LAST_OFFSET_DELTA_AT + _LAST_OFFSET_DELTA.size <= size:
        base, length = BASE_OFFSET_AND_LENGTH.unpack_from(buf, pos)
        if length <= 0 or pos + LOG_OVERHEAD + length > size:
            break
        (delta,) = _LAST_OFFSET_DELTA.unpack_from(buf, pos + _LAST_OFFSET_DELTA_AT)
        end = base + delta + 1
        pos += LOG_OVERHEAD + length
    return end


def next_intact_batch_offset(buf: Buffer, after: int) -> int | None:
    """The base offset of the first batch in ``buf`` (concatenated batches) that starts after
    offset ``after`` and passes :func:`validate_batch`, walking the length fields from the
    start; None when the walk meets a length that does not fit, or that batch is damaged too.
    Where a reader can continue after a damaged batch that holds ``after``."""
    pos = 0
    size = len(buf)
    while pos + LOG_OVERHEAD <= size:
        base, length = BASE_OFFSET_AND_LENGTH.unpack_from(buf, pos)
        if length <= 0 or pos + LOG_OVERHEAD + length > size:
            return None
        if base > after:
            try:
                validate_batch(buf, pos)
            except (CorruptRecordError, RecordTooLargeError):
                return None
            return int(base)
        pos += LOG_OVERHEAD + length
    return None
