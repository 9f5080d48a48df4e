"""Compression of a batch's records section, framed the way Kafka's Java client frames it.

- gzip: a gzip stream (RFC 1952).
- snappy: xerial's SnappyOutputStream framing, which Kafka's Java client writes: a 16-byte
  header (``0x82 'SNAPPY' 0x00``, version 1, compatible version 1, both big-endian int32), then
  blocks of ``[big-endian int32 compressed length][raw snappy block]``, each block compressing at
  most :data:`~fjord.records.defaults.XERIAL_SNAPPY_BLOCK_SIZE` input bytes. On read, data
  without the xerial header is taken as one raw snappy block (as Java's SnappyInputStream and
  kafka-python do).
- lz4: the LZ4 frame format exactly as Kafka's Lz4BlockOutputStream writes it: magic, FLG 0x60
  (version 1, independent blocks, no block or content checksum, no content size), BD 0x40 (64 KiB
  blocks), header checksum; then blocks of ``[little-endian uint32 size][data]`` (high bit set:
  stored uncompressed), then a zero end mark. On read, any valid LZ4 frame is accepted.
- zstd: a zstd frame.

All codecs are cramjam's. Decompression failures raise :class:`CorruptRecordError`.
"""

from __future__ import annotations

import struct

import cramjam

from fjord.errors import CorruptRecordError, FjordError, UnsupportedCompressionError
from fjord.records.defaults import (
    DEFAULT_GZIP_LEVEL,
    DEFAULT_ZSTD_LEVEL,
    LZ4_BLOCK_SIZE,
    MAX_DECOMPRESSED_RECORDS_BYTES,
    XERIAL_SNAPPY_BLOCK_SIZE,
)
from fjord.records.header import Compression

XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
_XERIAL_MAGIC = XERIAL_HEADER[:8]
_BLOCK_LENGTH = struct.Struct(">i")

#: LZ4 frame magic, FLG 0x60, BD 0x40, and the header checksum byte: the second byte of
#: xxHash32(FLG BD), fixed because the descriptor is (test_records checks it against lz4.frame).
LZ4_FRAME_HEADER = b"\x04\x22\x4d\x18\x60\x40\x82"
_LZ4_BLOCK_SIZE_FIELD = struct.Struct("<I")
_LZ4_UNCOMPRESSED_BIT = 0x80000000
_LZ4_END_MARK = b"\x00\x00\x00\x00"

Buffer = bytes | bytearray | memoryview


def _xerial_snappy_compress(data: Buffer) -> bytes:
    view = memoryview(data)
    parts = [XERIAL_HEADER]
    for start in range(0, len(view), XERIAL_SNAPPY_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + XERIAL_SNAPPY_BLOCK_SIZE]))
        parts.append(_BLOCK_LENGTH.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _xerial_snappy_decompress(data: Buffer) -> bytes:
    view = memoryview(data)
    if len(view) < len(XERIAL_HEADER) or bytes(view[:8]) != _XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(view))
    parts = []
    pos = len(XERIAL_HEADER)
    end = len(view)
    total = 0
    while pos < end:
        if end - pos < 4:
            raise CorruptRecordError("xerial snappy stream ends inside a block length")
        (length,) = _BLOCK_LENGTH.unpack_from(view, pos)
        pos += 4
        if length < 0 or pos + length > end:
            raise CorruptRecordError(
                f"xerial snappy block of {length} bytes runs past the end of the stream"
            )
        block = bytes(cramjam.snappy.decompress_raw(view[pos : pos + length]))
        total += len(block)
        if total > MAX_DECOMPRESSED_RECORDS_BYTES:
            raise CorruptRecordError("snappy records section inflates past the allowed size")
        parts.append(block)
        pos += length
    return b"".join(parts)


def _lz4_compress(data: Buffer) -> bytes:
    view = memoryview(data)
    parts = [LZ4_FRAME_HEADER]
    for start in range(0, len(view), LZ4_BLOCK_SIZE):
        chunk = view[start : start + LZ4_BLOCK_SIZE]
        block = bytes(cramjam.lz4.compress_block(chunk, store_size=False))
        if len(block) < len(chunk):
            parts.append(_LZ4_BLOCK_SIZE_FIELD.pack(len(block)))
            parts.append(block)
        else:  # incompressible: store it (Kafka's writer does the same)
            parts.append(_LZ4_BLOCK_SIZE_FIELD.pack(len(chunk) | _LZ4_UNCOMPRESSED_BIT))
            parts.append(bytes(chunk))
    parts.append(_LZ4_END_MARK)
    return b"".join(parts)


def compression_by_name(name: str) -> Compression:
    """The codec for a ``compression.type`` value (``none``, ``gzip``, ``snappy``, ``lz4``,
    ``zstd``; case-insensitive), or :class:`UnsupportedCompressionError` naming the choices."""
    try:
        return Compression[name.upper()]
    except (KeyError, AttributeError):
        raise UnsupportedCompressionError(
            f"unknown compression.type {name!r}; expected one of "
            + ", ".join(c.name.lower() for c in Compression)
        ) from None


def compress(codec: Compression, data: Buffer) -> bytes:
    """Compress a records section with ``codec`` (NONE returns the bytes unchanged)."""
    if codec == Compression.NONE:
        return bytes(data)
    if codec == Compression.GZIP:
        return bytes(cramjam.gzip.compress(data, level=DEFAULT_GZIP_LEVEL))
    if codec == Compression.SNAPPY:
        return _xerial_snappy_compress(data)
    if codec == Compression.LZ4:
        return _lz4_compress(data)
    if codec == Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data, level=DEFAULT_ZSTD_LEVEL))
    raise UnsupportedCompressionError(f"unknown compression codec {codec!r}")


def decompress(codec: Compression, data: Buffer) -> bytes:
    """Inflate a records section; :class:`CorruptRecordError` when the data is not valid."""
    try:
        if codec == Compression.NONE:
            return bytes(data)
        if codec == Compression.SNAPPY:
            out = _xerial_snappy_decompress(data)
        elif codec == Compression.GZIP:
            out = bytes(cramjam.gzip.decompress(data))
        elif codec == Compression.LZ4:
            out = bytes(cramjam.lz4.decompress(data))
        elif codec == Compression.ZSTD:
            out = bytes(cramjam.zstd.decompress(data))
        else:
            raise UnsupportedCompressionError(f"unknown compression codec {codec!r}")
    except FjordError:
        raise
    except Exception as exc:  # cramjam raises DecompressionError, and ValueError on odd input
        raise CorruptRecordError(
            f"{Compression(codec).name.lower()} records section does not decompress: {exc}"
        ) from exc
    if len(out) > MAX_DECOMPRESSED_RECORDS_BYTES:
        raise CorruptRecordError(
            f"{Compression(codec).name.lower()} records section inflates to {len(out)} bytes, "
            f"more than {MAX_DECOMPRESSED_RECORDS_BYTES}"
        )
    return out
