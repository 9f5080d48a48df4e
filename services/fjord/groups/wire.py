"""Kafka's classic (non-flexible) schema primitives, big-endian, as used by the ConsumerProtocol
and the ``__consumer_offsets`` records.

- int8/int16/int32/int64: two's complement big-endian; uvarint (flexible versions' lengths).
- string: int16 length + UTF-8 bytes; nullable string: length -1 means null.
- bytes: int32 length + bytes; nullable bytes: length -1 means null.
- array: int32 count + elements (count -1 = null array, read as empty).

:class:`Reader` raises :class:`~fjord.errors.CorruptRecordError` on truncated or malformed input
instead of an IndexError or struct.error, so callers get one typed error for bad bytes.
"""

from __future__ import annotations

import struct

from fjord.errors import CorruptRecordError

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class Writer:
    """Accumulates one encoded structure; ``bytes()`` returns it."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def int8(self, value: int) -> Writer:
        self._parts.append(struct.pack(">b", value))
        return self

    def int16(self, value: int) -> Writer:
        self._parts.append(_I16.pack(value))
        return self

    def int32(self, value: int) -> Writer:
        self._parts.append(_I32.pack(value))
        return self

    def int64(self, value: int) -> Writer:
        self._parts.append(_I64.pack(value))
        return self

    def string(self, value: str | None) -> Writer:
        if value is None:
            return self.int16(-1)
        data = value.encode("utf-8")
        if len(data) > 0x7FFF:
            raise ValueError(f"string of {len(data)} bytes does not fit Kafka's int16 length")
        self.int16(len(data))
        self._parts.append(data)
        return self

    def bytes_(self, value: bytes | None) -> Writer:
        if value is None:
            return self.int32(-1)
        self.int32(len(value))
        self._parts.append(bytes(value))
        return self

    def bytes(self) -> bytes:
        return b"".join(self._parts)


class Reader:
    """Reads primitives from ``data`` in order; ``done()`` tells whether all bytes were used."""

    def __init__(self, data: bytes, what: str) -> None:
        self._data = memoryview(bytes(data))
        self._pos = 0
        self._what = what

    def _take(self, n: int) -> memoryview:
        if n < 0 or self._pos + n > len(self._data):
            raise CorruptRecordError(
                f"{self._what}: truncated at byte {self._pos} (need {n} more bytes)"
            )
        view = self._data[self._pos : self._pos + n]
        self._pos += n
        return view

    def int8(self) -> int:
        return int(struct.unpack(">b", self._take(1))[0])

    def int16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def uvarint(self) -> int:
        """An unsigned varint (flexible versions' compact lengths and tag counts)."""
        shift = value = 0
        while True:
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise CorruptRecordError(f"{self._what}: varint longer than 5 bytes")

    def raw(self, n: int) -> bytes:
        return bytes(self._take(n))

    def int32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def int64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def nullable_string(self) -> str | None:
        n = self.int16()
        if n == -1:
            return None
        if n < 0:
            raise CorruptRecordError(f"{self._what}: negative string length {n}")
        try:
            return bytes(self._take(n)).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(f"{self._what}: string is not UTF-8") from exc

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise CorruptRecordError(f"{self._what}: null where a string is required")
        return value

    def nullable_bytes(self) -> bytes | None:
        n = self.int32()
        if n == -1:
            return None
        if n < 0:
            raise CorruptRecordError(f"{self._what}: negative bytes length {n}")
        return bytes(self._take(n))

    def array_length(self) -> int:
        n = self.int32()
        if n == -1:
            return 0
        if n < 0 or n > len(self._data) - self._pos:
            raise CorruptRecordError(f"{self._what}: bad array length {n}")
        return n

    def remaining(self) -> int:
        return len(self._data) - self._pos

    def done(self) -> bool:
        return self._pos == len(self._data)

