"""Build one RecordBatch v2 from records appended one at a time."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from fjord.errors import InvalidRecordError, UnsupportedCompressionError
from fjord.records.codecs import compress
from fjord.records.defaults import DEFAULT_BATCH_SIZE
from fjord.records.header import (
    ATTR_COMPRESSION_MASK,
    ATTR_CONTROL,
    ATTR_DELETE_HORIZON,
    ATTR_TIMESTAMP_TYPE,
    ATTR_TRANSACTIONAL,
    BATCH_HEADER_SIZE,
    CRC_START,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    MAGIC_V2,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchHeader,
    Compression,
    TimestampType,
    crc32c,
    write_crc,
)
from fjord.records.speedups import EXTENSION, IMPLEMENTATION
from fjord.records.varint import SMALL_LIMIT, ZIGZAG_TABLE, encode_zigzag, zigzag_size

_F = TypeVar("_F")
_NULL_LENGTH = ZIGZAG_TABLE[SMALL_LIMIT - 1]  # zigzag(-1): a null key, value or header value
_NO_HEADERS = ZIGZAG_TABLE[SMALL_LIMIT]  # zigzag(0): headers count 0
_ATTRIBUTES = b"\x00"  # record attributes: unused in v2, always 0
_INT32_MAX = (1 << 31) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def _encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    """headersCount varint, then per header: key length + UTF-8 key, value length + value."""
    parts = [encode_zigzag(len(headers))]
    for item in headers:
        try:
            name, value = item
        except (TypeError, ValueError):
            raise InvalidRecordError(
                f"a record header must be a (str, bytes | None) pair, got {item!r}"
            ) from None
        if not isinstance(name, str):
            raise InvalidRecordError(f"record header key must be str, got {type(name).__name__}")
        try:
            raw_name = name.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidRecordError(
                f"record header key {name!r} is not valid UTF-8: {exc}"
            ) from None
        parts.append(encode_zigzag(len(raw_name)))
        parts.append(raw_name)
        if value is None:
            parts.append(_NULL_LENGTH)
        elif isinstance(value, bytes | bytearray | memoryview):
            raw_value = bytes(value)
            parts.append(encode_zigzag(len(raw_value)))
            parts.append(raw_value)
        else:
            raise InvalidRecordError(
                f"record header {name!r} value must be bytes or None, got {type(value).__name__}"
            )
    return b"".join(parts)


def _check_range(what: str, value: object, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise InvalidRecordError(f"{what} must be an int in [{low}, {high}], got {value!r}")


def _timestamp_delta(timestamp_ms: int, base_timestamp: int | None) -> bytes:
    """The varlong of a large timestamp delta (the first record's is 0), checking both
    timestamps fit the header's int64 fields."""
    _check_range("record timestamp", timestamp_ms, _INT64_MIN, _INT64_MAX)
    if base_timestamp is None:
        return ZIGZAG_TABLE[SMALL_LIMIT]
    delta = timestamp_ms - base_timestamp
    _check_range("timestamp delta from the batch's first record", delta, _INT64_MIN, _INT64_MAX)
    return encode_zigzag(delta)


def _as_bytes(data: object, what: str) -> bytes:
    if isinstance(data, bytes | bytearray | memoryview):  # bytes subclasses, bytes-likes
        return bytes(data)
    raise InvalidRecordError(f"record {what} must be bytes or None, got {type(data).__name__}")


def record_size_upper_bound(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]] = ()
) -> int:
    """Bytes a batch holding only this record takes at most (Kafka's
    ``estimateSizeInBytesUpperBound``): what a producer compares with ``max.request.size``
    before it appends. An upper bound of the uncompressed batch's size, whatever the timestamp."""
    key_size = 1 if key is None else zigzag_size(len(key)) + len(key)
    value_size = 1 if value is None else zigzag_size(len(value)) + len(value)
    headers_size = len(_encode_headers(headers)) if headers else 1
    # attributes (1) + timestamp delta (up to 10) + offset delta (up to 5)
    body = 1 + 10 + 5 + key_size + value_size + headers_size
    return BATCH_HEADER_SIZE + zigzag_size(body) + body


class PyRecordAppender:
    """The records section of one RecordBatch v2, encoded as records are appended: the
    record-by-record half of :class:`BatchBuilder`, in pure Python. ``fjord.records._speedups``
    has the same class in C (``RecordAppender``); both produce the same bytes.

    Invariants: records are encoded as they are appended (``length varint, attributes int8 = 0,
    timestampDelta varlong, offsetDelta varint, key, value, headers``); offset deltas are
    ``0 .. record_count - 1``; timestamp deltas are relative to the first record's timestamp
    (``base_timestamp``) and may be negative; ``size_in_bytes`` is the exact uncompressed size
    of the batch so far (61-byte header + records). The first record is always accepted; a later
    one only while the batch stays within ``batch_size``. After :meth:`take_records` no append
    is accepted.
    """

    __slots__ = (
        "_base_timestamp",
        "_batch_size",
        "_count",
        "_max_timestamp",
        "_parts",
        "_sealed",
        "_size",
        "_taken",
    )

    def __init__(self, batch_size: int) -> None:
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        self._batch_size = batch_size
        self._parts: list[bytes] = []
        self._count = 0
        self._size = BATCH_HEADER_SIZE
        self._base_timestamp = 0
        self._max_timestamp = -1
        self._taken = False
        self._sealed = False

    @property
    def record_count(self) -> int:
        return self._count

    @property
    def size_in_bytes(self) -> int:
        """Bytes of the batch if built now without compression (header included)."""
        return self._size

    @property
    def base_timestamp(self) -> int:
        """The first record's timestamp (0 before it)."""
        return self._base_timestamp

    @property
    def max_timestamp(self) -> int:
        """The largest timestamp appended (-1 before the first record)."""
        return self._max_timestamp

    @property
    def records_taken(self) -> bool:
        return self._taken

    def append(
        self,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> bool:
        """Add a record; return False (adding nothing) when it would overflow ``batch_size``.

        The first record is always accepted. Raises :class:`InvalidRecordError` for a key,
        value or header of the wrong type, and when the records were already taken.
        """
        if self._taken:
            raise InvalidRecordError("cannot append to a batch that has been built")
        if type(timestamp_ms) is not int:
            raise InvalidRecordError(
                f"record timestamp must be an int (ms), got {type(timestamp_ms).__name__}"
            )
        count = self._count
        delta = timestamp_ms - self._base_timestamp if count else 0
        # Fast path: exact bytes skip the conversions; small varints come from the table.
        if type(key) is not bytes:
            key = None if key is None else _as_bytes(key, "key")
        if type(value) is not bytes:
            value = None if value is None else _as_bytes(value, "value")
        if key is None:
            key_length = _NULL_LENGTH
            key = b""
        else:
            key_len = len(key)
            key_length = (
                ZIGZAG_TABLE[key_len + SMALL_LIMIT]
                if key_len < SMALL_LIMIT
                else encode_zigzag(key_len)
            )
        if value is None:
            value_length = _NULL_LENGTH
            value = b""
        else:
            value_len = len(value)
            value_length = (
                ZIGZAG_TABLE[value_len + SMALL_LIMIT]
                if value_len < SMALL_LIMIT
                else encode_zigzag(value_len)
            )
        body = b"".join(
            (
                _ATTRIBUTES,
                ZIGZAG_TABLE[delta + SMALL_LIMIT]
                if -SMALL_LIMIT <= delta < SMALL_LIMIT
                else _timestamp_delta(timestamp_ms, self._base_timestamp if count else None),
                ZIGZAG_TABLE[count + SMALL_LIMIT] if count < SMALL_LIMIT else encode_zigzag(count),
                key_length,
                key,
                value_length,
                value,
                _encode_headers(headers) if headers else _NO_HEADERS,
            )
        )
        body_len = len(body)
        length_part = (
            ZIGZAG_TABLE[body_len + SMALL_LIMIT]
            if body_len < SMALL_LIMIT
            else encode_zigzag(body_len)
        )
        size = self._size + len(length_part) + body_len
        if count and (size > self._batch_size or count == _INT32_MAX):
            return False
        if count == 0:
            _check_range("record timestamp", timestamp_ms, _INT64_MIN, _INT64_MAX)
            self._base_timestamp = self._max_timestamp = timestamp_ms
        elif timestamp_ms > self._max_timestamp:
            self._max_timestamp = timestamp_ms
        self._parts.append(length_part + body)
        self._size = size
        self._count = count + 1
        return True

    def try_append(
        self,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> int:
        """As :meth:`append`, but returns the record's index in the batch, or -1 (adding
        nothing) when it would overflow ``batch_size`` or the records were already taken.
        Also -1 once :meth:`seal` was called. (Unlike the C one, this is not atomic against
        another thread's :meth:`take_records`: callers that do not hold a lock must check
        ``fjord.records.speedups.ATOMIC_APPEND``.)"""
        if self._taken or self._sealed:
            return -1
        count = self._count
        return count if self.append(timestamp_ms, key, value, headers) else -1

    def try_append_future(
        self,
        future_type: Callable[[Any, int, int], _F],
        completion: Any,
        timestamp_ms: int | None,
        key: bytes | None,
        value: bytes | None,
    ) -> _F | None:
        """:meth:`try_append` without headers, then ``future_type(completion, index,
        timestamp_ms)`` (the producer's fast path in one call); None when refused.
        ``timestamp_ms`` None: now (``int(time.time() * 1000)``)."""
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        index = self.try_append(timestamp_ms, key, value)
        return None if index < 0 else future_type(completion, index, timestamp_ms)

    def try_append_many(
        self,
        timestamp_ms: int,
        keys: list[bytes | None] | None,
        values: list[bytes | None],
        start: int,
    ) -> int:
        """:meth:`try_append` of records ``start``, ``start + 1``, ... (``keys`` None: null
        keys; no headers; all with ``timestamp_ms``) until one is refused or the lists end;
        returns the index of the first record not appended (``start`` when none was)."""
        if keys is not None and len(keys) != len(values):
            raise ValueError("try_append_many(): keys and values differ in length")
        if start < 0:
            raise ValueError("try_append_many(): start must be >= 0")
        for index in range(start, len(values)):
            key = None if keys is None else keys[index]
            if self.try_append(timestamp_ms, key, values[index]) < 0:
                return index
        return max(start, len(values))

    def seal(self) -> None:
        """From now on :meth:`try_append` refuses every record (:meth:`append` is unaffected):
        the producer's accumulator seals a batch that stops being its partition's open one."""
        self._sealed = True

    def take_records(self) -> tuple[bytes, int, int, int]:
        """``(records section, record count, base timestamp, max timestamp)``; no append is
        accepted afterwards."""
        if self._taken:
            raise InvalidRecordError("the records were already taken")
        self._taken = True
        records = b"".join(self._parts)
        self._parts = []
        return records, self._count, self._base_timestamp, self._max_timestamp


if TYPE_CHECKING:
    _RecordAppender = PyRecordAppender
else:
    _RecordAppender = (
        EXTENSION.RecordAppender
        if IMPLEMENTATION == "c" and EXTENSION is not None
        else PyRecordAppender
    )


_BUILDER_SLOTS = (
    "_base_sequence",
    "_built",
    "_compression",
    "_is_control",
    "_is_transactional",
    "_producer_epoch",
    "_producer_id",
    "_timestamp_type",
)


class _BatchBuilding:
    """What :class:`BatchBuilder` adds to a record appender (either implementation): the
    batch's settings, checked at construction, and :meth:`build` (codec, 61-byte header,
    CRC-32C). Only the final classes have slots (a C base forbids them in a mixin)."""

    if TYPE_CHECKING:
        __slots__ = _BUILDER_SLOTS
    else:
        __slots__ = ()
    _compression: Compression
    _producer_id: int
    _producer_epoch: int
    _base_sequence: int
    _timestamp_type: TimestampType
    _is_transactional: bool
    _is_control: bool
    _built: bytes | None

    if TYPE_CHECKING:  # provided by the appender, the next base class

        @property
        def record_count(self) -> int: ...
        @property
        def base_timestamp(self) -> int: ...
        @property
        def max_timestamp(self) -> int: ...
        def take_records(self) -> tuple[bytes, int, int, int]: ...

    def __init__(
        self,
        compression: Compression = Compression.NONE,
        batch_size: int = DEFAULT_BATCH_SIZE,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        base_sequence: int = NO_SEQUENCE,
        timestamp_type: TimestampType = TimestampType.CREATE_TIME,
        *,
        is_transactional: bool = False,
        is_control: bool = False,
    ) -> None:
        try:
            self._compression = Compression(compression)
        except ValueError:
            raise UnsupportedCompressionError(
                f"unknown compression codec {compression!r}; known: "
                + ", ".join(f"{c.value} ({c.name.lower()})" for c in Compression)
            ) from None
        if type(batch_size) is not int or batch_size <= 0:
            raise InvalidRecordError(f"batch size must be a positive int, got {batch_size!r}")
        _check_range("producer id", producer_id, _INT64_MIN, _INT64_MAX)
        _check_range("producer epoch", producer_epoch, -(1 << 15), (1 << 15) - 1)
        _check_range("base sequence", base_sequence, -(1 << 31), _INT32_MAX)
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._base_sequence = base_sequence
        if timestamp_type not in (TimestampType.CREATE_TIME, TimestampType.LOG_APPEND_TIME):
            raise InvalidRecordError(f"unknown timestamp type {timestamp_type!r}")
        self._timestamp_type = TimestampType(timestamp_type)
        self._is_transactional = is_transactional
        self._is_control = is_control  # transaction markers (fjord.records.control) only
        self._built = None
        super().__init__(batch_size)  # type: ignore[call-arg]  # the appender, next in the MRO

    @property
    def compression(self) -> Compression:
        return self._compression

    @property
    def is_closed(self) -> bool:
        return self._built is not None

    def build(self) -> bytes:
        """The batch's bytes (base offset 0, leader epoch -1); closes the builder.

        Raises :class:`InvalidRecordError` when no record was appended: Kafka has no empty
        data batches.
        """
        if self._built is not None:
            return self._built
        if self.record_count == 0:
            raise InvalidRecordError("cannot build a batch without records")
        # One step: with the C appender another thread's try_append cannot slip in between.
        records, count, base_timestamp, max_timestamp = self.take_records()
        # Only a timestamp within a few seconds of the int64 limit can get here out of range.
        _check_range("max timestamp", max_timestamp, _INT64_MIN, _INT64_MAX)
        if self._compression != Compression.NONE:
            records = compress(self._compression, records)
        attributes = int(self._compression)
        if self._timestamp_type == TimestampType.LOG_APPEND_TIME:
            attributes |= ATTR_TIMESTAMP_TYPE
        if self._is_transactional:
            attributes |= ATTR_TRANSACTIONAL
        if self._is_control:
            attributes |= ATTR_CONTROL
        header = bytearray(
            HEADER_STRUCT.pack(
                0,
                BATCH_HEADER_SIZE - LOG_OVERHEAD + len(records),
                NO_PARTITION_LEADER_EPOCH,
                MAGIC_V2,
                0,
                attributes,
                count - 1,
                base_timestamp,
                max_timestamp,
                self._producer_id,
                self._producer_epoch,
                self._base_sequence,
                count,
            )
        )
        crc = crc32c(memoryview(header)[CRC_START:])
        crc = crc32c(records, crc)
        write_crc(header, crc)
        self._built = bytes(header) + records
        return self._built


class BatchBuilder(_BatchBuilding, _RecordAppender):
    """Accumulates records into one RecordBatch v2 (magic 2), then builds its bytes.

    Invariants: records are encoded as they are appended (see :class:`PyRecordAppender`), so
    :meth:`build` only compresses and writes the 61-byte header; ``size_in_bytes`` is an upper
    bound of the built size for every codec but a pathological one. The first record is always
    accepted; a later one only while the batch stays within ``batch_size``. After :meth:`build`
    the builder is closed: ``append`` raises, ``build`` returns the same bytes.

    The built batch has base offset 0 and partition leader epoch -1 (the broker stamps both).
    The record encoding is the C extension's when it is built (``fjord.records.speedups``),
    else :class:`PyRecordAppender`'s; :class:`PyBatchBuilder` is always the pure-Python one.
    """

    __slots__ = _BUILDER_SLOTS


if not hasattr(BatchBuilder, "try_append_many"):
    # An extension built before try_append_many existed (a stale build, until it is rebuilt):
    # the Python loop over its try_append, same results.
    BatchBuilder.try_append_many = PyRecordAppender.try_append_many  # type: ignore[method-assign]


class PyBatchBuilder(_BatchBuilding, PyRecordAppender):
    """:class:`BatchBuilder` with the pure-Python record encoding, whatever is built (the
    reference the C extension is tested against)."""

    __slots__ = _BUILDER_SLOTS


def _encode_record_at(
    timestamp_delta: int,
    offset_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
) -> bytes:
    """One record (length varint first) with the given deltas: what :meth:`BatchBuilder.append`
    writes, for a record whose offset delta is not its position in the batch."""
    body = b"".join(
        (
            _ATTRIBUTES,
            encode_zigzag(timestamp_delta),
            encode_zigzag(offset_delta),
            _NULL_LENGTH if key is None else encode_zigzag(len(key)) + key,
            _NULL_LENGTH if value is None else encode_zigzag(len(value)) + value,
            _encode_headers(headers) if headers else _NO_HEADERS,
        )
    )
    return encode_zigzag(len(body)) + body


def rebuild_batch(
    original: BatchHeader,
    kept: Sequence[tuple[int, int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
    compression: Compression | None = None,
) -> bytes:
    """A new RecordBatch v2 holding ``kept`` (``(offset, timestamp, key, value, headers)``
    tuples, a subset of ``original``'s records in order): Kafka's cleaner output for one batch.

    Invariants: base offset, last offset delta, partition leader epoch, producer id / epoch /
    base sequence, codec, timestamp type and the transactional and control bits are
    ``original``'s, so offsets (with gaps), the producer's last sequence and the batch's place
    in the log are unchanged; every kept record keeps its absolute offset (offset delta =
    offset - base offset) and its timestamp. ``record_count`` is ``len(kept)``; with nothing kept
    the batch is header-only (Kafka's empty batch that preserves producer state), its base and
    max timestamps the original's max timestamp,
    its codec none. The CRC is computed anew.

    ``compression``: the codec of the new batch (None: ``original``'s), so that a broker can
    recompress a batch to its topic's ``compression.type`` with every record, offset and
    timestamp kept.
    """
    base = original.base_offset
    if kept:
        base_timestamp = kept[0][1]
        if original.timestamp_type == TimestampType.LOG_APPEND_TIME:
            max_timestamp = original.max_timestamp
        else:
            max_timestamp = max(record[1] for record in kept)
    else:
        base_timestamp = max_timestamp = original.max_timestamp
    parts = []
    previous = -1
    for offset, timestamp, key, value, headers in kept:
        delta = offset - base
        if not previous < delta <= original.last_offset_delta:
            raise InvalidRecordError(
                f"kept record at offset {offset} is outside batch {base}..{original.last_offset} "
                "or out of order"
            )
        previous = delta
        parts.append(_encode_record_at(timestamp - base_timestamp, delta, key, value, headers))
    records = b"".join(parts)
    codec = original.compression if compression is None else compression
    attributes = original.attributes & ~ATTR_DELETE_HORIZON & ~ATTR_COMPRESSION_MASK
    if kept:  # Kafka's empty header is uncompressed: there is nothing to decompress
        attributes |= codec
        if codec != Compression.NONE:
            records = compress(codec, records)
    header = bytearray(
        HEADER_STRUCT.pack(
            base,
            BATCH_HEADER_SIZE - LOG_OVERHEAD + len(records),
            original.partition_leader_epoch,
            MAGIC_V2,
            0,
            attributes,
            original.last_offset_delta,
            base_timestamp,
            max_timestamp,
            original.producer_id,
            original.producer_epoch,
            original.base_sequence,
            len(kept),
        )
    )
    crc = crc32c(memoryview(header)[CRC_START:])
    write_crc(header, crc32c(records, crc))
    return bytes(header) + records
