"""Read RecordBatch v2 bytes: batch by batch (header only, what a broker needs) or record by
record (what a consumer needs).

Nothing half-parsed escapes: a batch is yielded only after its header, length and CRC-32C were
checked, and a batch's records are yielded only after the whole records section was decoded and
checked (every record's length, the record count in the header, offset deltas within the
header's last offset delta).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from itertools import chain, repeat
from typing import Any, TypeVar

from fjord.errors import CorruptRecordError
from fjord.records.codecs import decompress
from fjord.records.header import (
    BASE_OFFSET_AND_LENGTH,
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    Buffer,
    Compression,
    TimestampType,
    validate_batch,
)
from fjord.records.record import Header, Record
from fjord.records.speedups import EXTENSION, IMPLEMENTATION
from fjord.records.varint import ZIGZAG_ONE_BYTE, ZIGZAG_TWO_BYTES, decode_zigzag

RecordTuple = tuple[int, int, bytes | None, bytes | None, tuple[Header, ...]]

#: attributes, timestamp delta, offset delta, key length, value length, header count: 1 byte each
MIN_RECORD_BODY = 6


def _decode_headers(
    data: bytes, pos: int, record_end: int, index: int
) -> tuple[tuple[Header, ...], int]:
    """Decode a record's headers (count varint, then key/value pairs) ending by ``record_end``."""
    count, pos = decode_zigzag(data, pos)
    if count < 0 or count > record_end - pos:  # a header takes at least two bytes
        raise CorruptRecordError(f"record {index} declares {count} headers")
    headers: list[Header] = []
    for _ in range(count):
        name_len, pos = decode_zigzag(data, pos)
        if name_len < 0 or pos + name_len > record_end:
            raise CorruptRecordError(f"record {index} has a header key of length {name_len}")
        try:
            name = data[pos : pos + name_len].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(
                f"record {index} has a header key that is not UTF-8: {exc}"
            ) from None
        pos += name_len
        value_len, pos = decode_zigzag(data, pos)
        if value_len == -1:
            headers.append((name, None))
        elif 0 <= value_len <= record_end - pos:
            headers.append((name, data[pos : pos + value_len]))
            pos += value_len
        else:
            raise CorruptRecordError(f"record {index} has a header value of length {value_len}")
    return tuple(headers), pos


def py_decode_record_tuples(
    data: bytes, base_offset: int, base_timestamp: int, record_count: int, last_offset_delta: int
) -> list[RecordTuple]:
    """Decode a whole (uncompressed) records section into ``(offset, timestamp, key, value,
    headers)`` tuples, checking every length and that it holds exactly ``record_count`` records.

    Raises :class:`CorruptRecordError` for anything malformed; returns nothing partial. The
    pure-Python implementation (the reference); :func:`decode_record_tuples` is the one in use.
    """
    # Hot loop: one iteration per record the header announces (a section that ends early
    # raises IndexError, one that holds more leaves bytes behind). One- and two-byte varints
    # (nearly every field) are decoded inline from tables; longer ones, headers and every error
    # go through the slow helpers. A short slice past a record's end is caught by the
    # ``pos != record_end`` check.
    out: list[RecordTuple] = []
    append = out.append
    one = ZIGZAG_ONE_BYTE
    two = ZIGZAG_TWO_BYTES
    slow = decode_zigzag
    no_headers: tuple[Header, ...] = ()
    end = len(data)
    pos = 0
    previous_delta = -1
    try:
        for _ in range(record_count):
            byte = data[pos]
            if byte < 0x80:
                length = one[byte]
                pos += 1
            elif (second := data[pos + 1]) < 0x80:
                length = two[(second << 8) | byte]
                pos += 2
            else:
                length, pos = slow(data, pos)
            record_end = pos + length
            # A length under MIN_RECORD_BODY fails the end-position check below.
            if record_end > end or data[pos]:
                raise _bad_record_start(len(out), length, end - pos, data[pos])
            byte = data[pos + 1]
            if byte < 0x80:
                timestamp_delta = one[byte]
                pos += 2
            else:
                timestamp_delta, pos = slow(data, pos + 1)
            byte = data[pos]
            if byte < 0x80:
                offset_delta = one[byte]
                pos += 1
            elif (second := data[pos + 1]) < 0x80:
                offset_delta = two[(second << 8) | byte]
                pos += 2
            else:
                offset_delta, pos = slow(data, pos)
            if offset_delta <= previous_delta or offset_delta > last_offset_delta:
                raise CorruptRecordError(
                    f"record {len(out)} has offset delta {offset_delta}: deltas must increase "
                    f"and stay within the batch's last offset delta {last_offset_delta}"
                )
            previous_delta = offset_delta
            byte = data[pos]
            if byte < 0x80:
                key_len = one[byte]
                pos += 1
            elif (second := data[pos + 1]) < 0x80:
                key_len = two[(second << 8) | byte]
                pos += 2
            else:
                key_len, pos = slow(data, pos)
            if key_len >= 0:
                key: bytes | None = data[pos : pos + key_len]
                pos += key_len
            elif key_len == -1:
                key = None
            else:
                raise CorruptRecordError(f"record {len(out)} has key length {key_len}")
            byte = data[pos]
            if byte < 0x80:
                value_len = one[byte]
                pos += 1
            elif (second := data[pos + 1]) < 0x80:
                value_len = two[(second << 8) | byte]
                pos += 2
            else:
                value_len, pos = slow(data, pos)
            if value_len >= 0:
                value: bytes | None = data[pos : pos + value_len]
                pos += value_len
            elif value_len == -1:
                value = None
            else:
                raise CorruptRecordError(f"record {len(out)} has value length {value_len}")
            if not data[pos]:
                headers = no_headers
                pos += 1
            else:
                headers, pos = _decode_headers(data, pos, record_end, len(out))
            if pos != record_end:
                raise CorruptRecordError(
                    f"record {len(out)} declares length {length} but its fields take "
                    f"{length + pos - record_end} bytes"
                )
            append(
                (
                    base_offset + offset_delta,
                    base_timestamp + timestamp_delta,
                    key,
                    value,
                    headers,
                )
            )
    except IndexError:
        if pos == end:  # the section ended where a record should start
            raise CorruptRecordError(
                f"batch header says {record_count} records, records section holds {len(out)}"
            ) from None
        raise CorruptRecordError(
            f"record {len(out)} runs past the end of the records section"
        ) from None
    if pos != end:
        raise CorruptRecordError(
            f"batch header says {record_count} records, records section holds more "
            f"({end - pos} bytes follow record {record_count - 1})"
        )
    return out


_T = TypeVar("_T", bound=tuple[Any, ...])


def py_decode_records_as(
    cls: type[_T],
    data: bytes,
    base_offset: int,
    base_timestamp: int,
    record_count: int,
    last_offset_delta: int,
    min_offset: int,
    topic: str,
    partition: int,
    fixed_timestamp: int | None,
) -> list[_T]:
    """The records of a section at or after ``min_offset`` as ``cls(topic, partition, offset,
    key, value, headers, timestamp)`` (``cls`` a tuple subclass with those fields, such as the
    consumer's ``ConsumerRecord``; filled as ``tuple.__new__`` does, without its ``__new__``),
    every timestamp ``fixed_timestamp`` when it is not None (a LOG_APPEND_TIME batch). Checks
    as :func:`py_decode_record_tuples`. Pure Python; :func:`decode_records_as` is the one in
    use."""
    tuples = py_decode_record_tuples(
        data, base_offset, base_timestamp, record_count, last_offset_delta
    )
    new = _NEW_TUPLE
    if fixed_timestamp is None:
        return [
            new(cls, (topic, partition, o, k, v, hs, ts))
            for o, ts, k, v, hs in tuples
            if o >= min_offset
        ]
    return [
        new(cls, (topic, partition, o, k, v, hs, fixed_timestamp))
        for o, _, k, v, hs in tuples
        if o >= min_offset
    ]


_NEW_TUPLE = tuple.__new__

# The implementations in use (fjord.records.speedups): the C extension's when it is built and
# not refused by FJORD_PURE_PYTHON, else the pure-Python ones above. Same results, same errors.
decode_record_tuples: Callable[[Buffer, int, int, int, int], list[RecordTuple]]
decode_records_as: Callable[..., list[Any]]
if IMPLEMENTATION == "c" and EXTENSION is not None:
    decode_record_tuples = EXTENSION.decode_record_tuples
    decode_records_as = EXTENSION.decode_records_as
else:
    decode_record_tuples = py_decode_record_tuples  # type: ignore[assignment]
    decode_records_as = py_decode_records_as


def _bad_record_start(index: int, length: int, remaining: int, attributes: int) -> Exception:
    if length < MIN_RECORD_BODY or length > remaining:
        return CorruptRecordError(
            f"record {index} declares length {length}: {remaining} bytes remain in the "
            f"records section and a record takes at least {MIN_RECORD_BODY}"
        )
    return CorruptRecordError(f"record {index} has attributes {attributes}, not 0")


class RecordBatch:
    """One validated batch: its parsed header and its bytes (a view into the caller's buffer).

    Invariant: the header, the batch length and the CRC-32C were checked at construction
    (:func:`~fjord.records.header.validate_batch`), so ``raw`` is a complete, intact batch. The
    records are decoded only by :meth:`records` / :meth:`record_tuples`, in full before any is
    returned.

    ``raw`` shares the caller's buffer (no copy): a bytearray cannot be resized while a batch
    read from it is alive, and changes to it show through. Decoded keys and values are copies.
    """

    __slots__ = ("header", "raw")

    def __init__(self, buf: Buffer, pos: int = 0, max_batch_bytes: int | None = None) -> None:
        self.header: BatchHeader = validate_batch(buf, pos, max_batch_bytes)
        self.raw = memoryview(buf)[pos : pos + self.header.size]

    def __repr__(self) -> str:
        h = self.header
        return (
            f"RecordBatch(base_offset={h.base_offset}, records={h.record_count}, "
            f"size={h.size}, compression={h.compression.name})"
        )

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def last_offset(self) -> int:
        return self.header.last_offset

    @property
    def next_offset(self) -> int:
        return self.header.next_offset

    @property
    def size(self) -> int:
        return self.header.size

    def records_section(self) -> bytes:
        """The records section, decompressed."""
        header = self.header
        section = self.raw[BATCH_HEADER_SIZE:]
        if header.compression == Compression.NONE:
            return bytes(section)
        return decompress(header.compression, section)

    def _section_to_decode(self, pure_python: bool) -> Buffer:
        # The C decoders read the batch's own bytes (no copy); Python's slices must be bytes.
        if self.header.compression == Compression.NONE and not pure_python:
            return self.raw[BATCH_HEADER_SIZE:]
        return self.records_section()

    def records_as(
        self, cls: type[_T], topic: str, partition: int, min_offset: int = -1
    ) -> list[_T]:
        """The records at or after ``min_offset`` as ``cls(topic, partition, offset, key,
        value, headers, timestamp)`` (see :func:`py_decode_records_as`), decoded and checked in
        full first; LOG_APPEND_TIME batches report their max timestamp for every record. The
        consumer's path: one C call per batch with the extension."""
        header = self.header
        return decode_records_as(
            cls,
            self._section_to_decode(decode_records_as is py_decode_records_as),
            header.base_offset,
            header.base_timestamp,
            header.record_count,
            header.last_offset_delta,
            min_offset,
            topic,
            partition,
            header.max_timestamp
            if header.timestamp_type == TimestampType.LOG_APPEND_TIME
            else None,
        )

    def append_columns(self, builder: Any, min_offset: int) -> int | None:
        """The records at or after ``min_offset`` appended to ``builder``, a
        ``fjord.records._speedups.ColumnBuilder`` (no Python object per record); the count, or
        None when the builder left the section alone (records with headers, anything
        malformed): decode it with :meth:`records_as` then, which also raises its errors.
        LOG_APPEND_TIME batches report their max timestamp for every record, as there."""
        header = self.header
        return builder.append_section(
            self._section_to_decode(False),
            header.base_offset,
            header.base_timestamp,
            header.record_count,
            header.last_offset_delta,
            min_offset,
            header.max_timestamp
            if header.timestamp_type == TimestampType.LOG_APPEND_TIME
            else None,
        )

    def record_tuples(self) -> list[RecordTuple]:
        """All records as ``(offset, timestamp, key, value, headers)`` tuples: the fast path
        for a consumer that wraps records in its own type. Timestamps follow Kafka's rule for
        LOG_APPEND_TIME batches (every record reports the batch's max timestamp)."""
        header = self.header
        tuples = decode_record_tuples(
            self._section_to_decode(decode_record_tuples is py_decode_record_tuples),
            header.base_offset,
            header.base_timestamp,
            header.record_count,
            header.last_offset_delta,
        )
        if header.timestamp_type == TimestampType.LOG_APPEND_TIME:
            ts = header.max_timestamp
            tuples = [(o, ts, k, v, hs) for o, _, k, v, hs in tuples]
        return tuples

    def decoded_records(self) -> list[Record]:
        """The batch's records as a list (decoded and checked in full)."""
        return records_from_tuples(self.record_tuples())

    def records(self) -> Iterator[Record]:
        """The batch's records with absolute offsets (decoded and checked in full first)."""
        return iter(self.decoded_records())


_NEW_OBJECT = object.__new__
_RECORD_FIELD_SETTERS = tuple(getattr(Record, name).__set__ for name in Record.__dataclass_fields__)


def records_from_tuples(tuples: list[RecordTuple]) -> list[Record]:
    """``[Record(*t) for t in tuples]``, about twice as fast.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``, which costs
    more than decoding the record. Here the objects are allocated and their slots filled column by
    column by C-level ``map`` calls, with no Python frame per record. The result is identical to
    calling the constructor (the dataclass has no ``__post_init__``).
    """
    records: list[Record] = list(map(_NEW_OBJECT, repeat(Record, len(tuples))))
    for setter, column in zip(_RECORD_FIELD_SETTERS, zip(*tuples, strict=True), strict=False):
        deque(map(setter, records, column), maxlen=0)
    return records


def read_batches(
    buf: Buffer, *, max_batch_bytes: int | None = None, allow_partial_tail: bool = False
) -> Iterator[RecordBatch]:
    """Yield each batch of a buffer of concatenated batches, validated (header, length, CRC).

    A batch that ends past the buffer raises :class:`CorruptRecordError`, unless
    ``allow_partial_tail`` is true: then an incomplete last batch is skipped, as a consumer must
    when a fetch response was cut at ``max_bytes``. Raises :class:`RecordTooLargeError` for a
    batch larger than ``max_batch_bytes``.
    """
    view = memoryview(buf)
    end = len(view)
    pos = 0
    while pos < end:
        if allow_partial_tail:
            remaining = end - pos
            if remaining < LOG_OVERHEAD:
                return
            _, batch_length = BASE_OFFSET_AND_LENGTH.unpack_from(view, pos)
            if batch_length + LOG_OVERHEAD > remaining:
                return
        batch = RecordBatch(view, pos, max_batch_bytes)
        yield batch
        pos += batch.header.size


def decode_records(buf: Buffer, *, max_batch_bytes: int | None = None) -> Iterator[Record]:
    """Every record of a buffer of concatenated batches, in order, with absolute offsets.

    Control batches (transaction markers) are skipped, as Kafka's consumer skips them. A trailing
    partial batch is skipped (a fetch cut at ``max_bytes``); any other damage raises
    :class:`CorruptRecordError` when iteration reaches the damaged batch (the records of the
    batches before it have been yielded; none of the damaged one).
    """
    batches = read_batches(buf, max_batch_bytes=max_batch_bytes, allow_partial_tail=True)
    # chain + map keep the per-record step in C; only each batch runs Python code.
    return chain.from_iterable(map(_data_records, batches))


def _data_records(batch: RecordBatch) -> list[Record]:
    return [] if batch.header.is_control else batch.decoded_records()
