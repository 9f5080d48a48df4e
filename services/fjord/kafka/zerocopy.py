"""Zero-copy Fetch answers on the Kafka listener: records go from the segment file to the socket
with ``sendfile``, the frame around them is encoded as usual.

The broker's Fetch handler now writes its answer with fjord.kafka.fastpath (regions put in
place as it writes, no marker search); the markers below still name regions between the
ReplicaManager and that handler, and the splice serves any handler answering with a
kafka-python message (bench/bench_zero_copy_listener.py's).

kafka-python's encoder (which writes every Kafka layout, as the project's rule wants) needs the
bytes of every field. So a handler puts a unique 16-byte *marker* where a partition's records
go and keeps the :class:`~fjord.storage.region.FileRegion` that holds them; after encoding,
:func:`splice_frame` finds each marker with the length prefix the encoder wrote before it, and
cuts the frame into parts: encoded bytes, a new length prefix, the region, encoded bytes, ...
with the frame's size prefix rewritten for the real lengths. The listener writes bytes parts
and ``sendfile``s regions.

A records field is either ``INT32 length`` + bytes (Fetch v4-v11) or ``UNSIGNED_VARINT
length + 1`` + bytes (v12+, flexible): for a 16-byte marker that is ``00 00 00 10`` or ``11``
before it, which cannot be confused.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fjord.records.varint import encode_unsigned_varint
from fjord.storage.region import FileRegion

MARKER_BYTES = 16
_INT32 = struct.Struct(">i")
_INT32_MARKER_PREFIX = _INT32.pack(MARKER_BYTES)
_COMPACT_MARKER_PREFIX = MARKER_BYTES + 1

#: One part of a spliced frame: bytes to write, or a region to sendfile.
Part = bytes | bytearray | memoryview | FileRegion


class SpliceError(ValueError):
    """A marker was not found exactly once behind a records length prefix (never expected;
    the caller then sends the records as bytes)."""


@dataclass
class FileBackedResponse:
    """A handler's response whose records fields hold markers of ``regions``."""

    response: Any
    regions: dict[bytes, FileRegion] = field(default_factory=dict)

    def add(self, region: FileRegion) -> bytes:
        """A new marker standing for ``region`` (put it where its records go)."""
        while True:
            marker = os.urandom(MARKER_BYTES)
            if marker not in self.regions:
                self.regions[marker] = region
                return marker

    def close(self) -> None:
        for region in self.regions.values():
            region.close()

    def read_back(self) -> None:
        """Put the records themselves where the markers are (a Fetch response's
        ``responses[].partitions[].records``) and close the regions: the fallback when the
        frame cannot be spliced."""
        for topic in self.response.responses:
            for partition in topic.partitions:
                region = self.regions.get(partition.records) if partition.records else None
                if region is not None:
                    partition.records = region.read()
        self.close()


def splice_frame(frame: bytes | bytearray, regions: Mapping[bytes, FileRegion]) -> list[Part]:
    """Cut an encoded response ``frame`` (size prefix included) at each marker of ``regions``:
    the parts, in order, are the same frame with each marker's records replaced by its region
    (length prefix rewritten) and the size prefix rewritten. Raises :class:`SpliceError` when
    a marker is missing, repeated, or not behind a records length prefix."""
    data = frame  # the encoder's own fresh buffer: cut, never copied whole
    cuts: list[tuple[int, int, bytes, FileRegion]] = []  # (start, end, new prefix, region)
    for marker, region in regions.items():
        at = data.find(marker)
        if at < 0 or data.find(marker, at + 1) >= 0:
            raise SpliceError("a records marker is missing or not unique in the frame")
        end = at + MARKER_BYTES
        if at >= 1 and data[at - 1] == _COMPACT_MARKER_PREFIX:
            cuts.append((at - 1, end, encode_unsigned_varint(region.count + 1), region))
        elif at >= 4 and data[at - 4 : at] == _INT32_MARKER_PREFIX:
            cuts.append((at - 4, end, _INT32.pack(region.count), region))
        else:
            raise SpliceError("a records marker is not behind a records length prefix")
    cuts.sort(key=lambda cut: cut[0])
    view = memoryview(data)
    parts: list[Part] = []
    size = len(data) - 4
    position = 4
    for start, end, prefix, region in cuts:
        if start < position:
            raise SpliceError("records markers overlap")
        parts.append(bytes(view[position:start]) + prefix)  # small: headers between records
        parts.append(region)
        size += len(prefix) + region.count - (end - start)
        position = end
    parts.append(view[position:])
    # The size prefix goes with the bytes after it (a few dozen bytes copied): one send and
    # one packet fewer per answer.
    first = parts[0]
    assert not isinstance(first, FileRegion)  # a cut starts at 4 or later: bytes come first
    parts[0] = _INT32.pack(size) + first
    return parts


def materialize(parts: list[Part]) -> bytes:
    """The frame as plain bytes (tests, and a sender that cannot sendfile)."""
    return b"".join(p.read() if isinstance(p, FileRegion) else bytes(p) for p in parts)
