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
It is the one place that knows these offsets: the builder, the producer's accumulator and the
log write header fields through the functions below (:func:`stamp_batch`,
:func:`stamped_prefix`, :func:`stamp_producer_state`, :func:`set_log_append_time`,
:func:`write_crc`, :func:`seal_batch`).
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
_LEADER_EPOCH_AT = 12
_STAMPED_PREFIX = struct.Struct(">qii")  # base offset, batch length, partition leader epoch
STAMPED_PREFIX_SIZE = _STAMPED_PREFIX.size  # 16: the bytes before magic
_CRC = struct.Struct(">I")
_CRC_AT = 17
_ATTRIBUTES = struct.Struct(">h")
_ATTRIBUTES_AT = 21
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23
_MAX_TIMESTAMP = struct.Struct(">q")
_MAX_TIMESTAMP_AT = 35
_PRODUCER_STATE = struct.Struct(">qhi")  # producer id, producer epoch, base sequence
_PRODUCER_STATE_AT = 43
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
    header = check_structure(buf, pos, max_batch_bytes)
    check_crc(buf, pos, header)
    return header


def check_structure(buf: Buffer, pos: int = 0, max_batch_bytes: int | None = None) -> BatchHeader:
    """Everything :func:`validate_batch` checks except the CRC (a log checks the CRCs of a large
    append in another thread, with :func:`check_crc`, while it writes)."""
    header = parse_header(buf, pos)
    if max_batch_bytes is not None and header.size > max_batch_bytes:
        raise RecordTooLargeError(
            f"batch of {header.size} bytes exceeds max.message.bytes={max_batch_bytes}"
        )
    if pos + header.size > len(buf):
        raise CorruptRecordError(
            f"truncated batch at position {pos}: declares {header.size} bytes, "
            f"only {len(buf) - pos} present"
        )
    return header


def check_crc(buf: Buffer, pos: int, header: BatchHeader) -> None:
    """Raise :class:`CorruptRecordError` unless the CRC-32C of the complete batch at ``buf[pos]``
    (whose header :func:`check_structure` returned) matches the stored one."""
    actual = crc32c(memoryview(buf)[pos + CRC_START : pos + header.size])
    if actual != header.crc:
        raise CorruptRecordError(
            f"CRC mismatch in batch at position {pos} (base offset {header.base_offset}): "
            f"stored {header.crc:#010x}, computed {actual:#010x}"
        )


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
    LEADER_EPOCH_STRUCT.pack_into(buf, pos + _LEADER_EPOCH_AT, leader_epoch)


def stamped_prefix(base_offset: int, batch_length: int, leader_epoch: int) -> bytes:
    """The first :data:`STAMPED_PREFIX_SIZE` bytes of a batch as the log stamps it (base offset,
    the batch's unchanged length, partition leader epoch): written in front of the rest of the
    batch, they give what :func:`stamp_batch` gives, without copying the batch."""
    return _STAMPED_PREFIX.pack(base_offset, batch_length, leader_epoch)


def write_crc(buf: bytearray | memoryview, crc: int, pos: int = 0) -> None:
    """Store ``crc`` as the CRC-32C field of the batch header at ``buf[pos]`` (for a builder that
    computed it over the header and records held apart)."""
    _CRC.pack_into(buf, pos + _CRC_AT, crc)


def seal_batch(buf: bytearray | memoryview, pos: int = 0) -> None:
    """Recompute the CRC-32C of the whole batch at ``buf[pos]`` (which must be complete) after
    a field inside the CRC changed."""
    _, length = BASE_OFFSET_AND_LENGTH.unpack_from(buf, pos)
    end = pos + LOG_OVERHEAD + length
    write_crc(buf, crc32c(memoryview(buf)[pos + CRC_START : end]), pos)


def stamp_producer_state(
    buf: bytearray | memoryview, producer_id: int, producer_epoch: int, base_sequence: int,
    pos: int = 0,
) -> None:
    """Write producer id, epoch and base sequence into the complete batch at ``buf[pos]`` (the
    idempotent producer assigns them when the batch is first sent) and recompute the CRC: these
    fields lie inside it. One pass over the batch."""
    _PRODUCER_STATE.pack_into(
        buf, pos + _PRODUCER_STATE_AT, producer_id, producer_epoch, base_sequence
    )
    seal_batch(buf, pos)


def set_log_append_time(buf: bytearray | memoryview, timestamp: int, pos: int = 0) -> None:
    """Mark the complete batch at ``buf[pos]`` as LOG_APPEND_TIME with ``max_timestamp`` =
    ``timestamp`` and recompute its CRC (Kafka's ``setMaxTimestamp``); the records' own
    timestamps are left as they are (readers take the batch's)."""
    (attributes,) = _ATTRIBUTES.unpack_from(buf, pos + _ATTRIBUTES_AT)
    _ATTRIBUTES.pack_into(buf, pos + _ATTRIBUTES_AT, attributes | ATTR_TIMESTAMP_TYPE)
    _MAX_TIMESTAMP.pack_into(buf, pos + _MAX_TIMESTAMP_AT, timestamp)
    seal_batch(buf, pos)


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


def has_transactional_batch(buf: Buffer) -> bool:
    """Whether any batch header in ``buf`` (concatenated batches, as a Produce carries them)
    has the transactional bit: Kafka's ``ProduceRequest.hasTransactionalRecords``, which
    decides whether the request needs Write on its TransactionalId. Every header is read, not
    only the first, so a transactional batch behind a plain one is found too; a truncated
    tail is left to the append's own validation."""
    view = memoryview(buf)
    pos, end = 0, len(view)
    while pos + _ATTRIBUTES_AT + _ATTRIBUTES.size <= end:
        (_, length) = BASE_OFFSET_AND_LENGTH.unpack_from(view, pos)
        (attributes,) = _ATTRIBUTES.unpack_from(view, pos + _ATTRIBUTES_AT)
        if attributes & ATTR_TRANSACTIONAL:
            return True
        if length <= 0:
            return False
        pos += LOG_OVERHEAD + length
    return False
