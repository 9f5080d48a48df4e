"""Kafka's varints: unsigned LEB128 and zigzag-encoded signed integers (protobuf's encoding).

Record fields are zigzag varints (``varint``, 32-bit) or varlongs (64-bit). The encoding is the
same for both; only the accepted range differs. Small values, which make up nearly every record
field (offset delta, lengths, header count), are served from precomputed tables.
"""

from __future__ import annotations

from fjord.errors import CorruptRecordError

#: Zigzag values in ``[-SMALL_LIMIT, SMALL_LIMIT)`` come from :data:`ZIGZAG_TABLE`; all of
#: them encode to at most two bytes.
SMALL_LIMIT = 1 << 13

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
MAX_VARLONG_BYTES = 10


def encode_unsigned_varint(value: int) -> bytes:
    """LEB128: seven bits per byte, least significant group first, high bit = more follows.
    (Also the Kafka protocol's compact lengths and counts, per field of every response the
    Kafka listener encodes: one-byte values come from a table.)"""
    if 0 <= value < 0x80:
        return _ONE_BYTE_UVARINTS[value]
    if value < 0:
        raise ValueError(f"unsigned varint cannot hold {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_ONE_BYTE_UVARINTS: tuple[bytes, ...] = tuple(bytes([n]) for n in range(0x80))


def _zigzag_slow(value: int) -> bytes:
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"varlong out of int64 range: {value}")
    return encode_unsigned_varint((value << 1) ^ (value >> 63))


#: ``ZIGZAG_TABLE[n + SMALL_LIMIT]`` is the zigzag varint of ``n`` for small ``n``.
ZIGZAG_TABLE: tuple[bytes, ...] = tuple(_zigzag_slow(n) for n in range(-SMALL_LIMIT, SMALL_LIMIT))

#: Zigzag decoding of a one-byte varint (``b < 0x80``): ``(b >> 1) ^ -(b & 1)``.
ZIGZAG_ONE_BYTE: tuple[int, ...] = tuple((b >> 1) ^ -(b & 1) for b in range(0x80))

#: Zigzag decoding of a two-byte varint ``b0 b1`` (``b0 >= 0x80 > b1``), indexed by
#: ``(b1 << 8) | b0``; the other slots are unused (0).
ZIGZAG_TWO_BYTES: tuple[int, ...] = tuple(
    ((((i & 0x7F) | ((i >> 8) << 7)) >> 1) ^ -(((i & 0x7F) | ((i >> 8) << 7)) & 1))
    if i & 0x80
    else 0
    for i in range(0x8000)
)


def encode_zigzag(value: int) -> bytes:
    """The zigzag varint (or varlong) of a signed 64-bit integer."""
    if -SMALL_LIMIT <= value < SMALL_LIMIT:
        return ZIGZAG_TABLE[value + SMALL_LIMIT]
    return _zigzag_slow(value)


def zigzag_size(value: int) -> int:
    """Bytes that :func:`encode_zigzag` produces for ``value``."""
    if -SMALL_LIMIT <= value < SMALL_LIMIT:
        return len(ZIGZAG_TABLE[value + SMALL_LIMIT])
    zz = (value << 1) ^ (value >> 63)
    return max(1, (zz.bit_length() + 6) // 7)


def decode_zigzag(buf: bytes, pos: int) -> tuple[int, int]:
    """Decode the zigzag varlong at ``buf[pos]``; return ``(value, next_position)``.

    Raises :class:`CorruptRecordError` when the buffer ends inside the varint, or the varint is
    longer than ten bytes or holds more than 64 bits.
    """
    shift = 0
    result = 0
    end = len(buf)
    start = pos
    while True:
        if pos >= end:
            raise CorruptRecordError(f"varint at position {start} runs past the end of the data")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if result >> 64:
                raise CorruptRecordError(f"varint at position {start} exceeds 64 bits")
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift >= 7 * MAX_VARLONG_BYTES:
            raise CorruptRecordError(f"varint at position {start} is longer than 10 bytes")
