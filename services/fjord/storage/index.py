"""Sparse per-segment indexes: offset -> file position, and timestamp -> offset."""

from __future__ import annotations

import bisect
import os
import struct
from array import array
from pathlib import Path

OFFSET_ENTRY = struct.Struct(">II")  # relative offset u32, position u32
TIME_ENTRY = struct.Struct(">qI")  # timestamp i64, relative offset u32
MAX_RELATIVE_OFFSET = 2**31 - 1
U32 = "I"  # array typecode of an unsigned 32-bit int (4 bytes on every supported platform)
I64 = "q"
assert array(U32).itemsize == 4 and array(I64).itemsize == 8


class _IndexFile:
    """Shared plumbing: entries live in memory, the file holds a prefix of them.

    Entries are appended to memory by the log and written to the file in bulk by
    :meth:`write_pending` (at flush, roll and close), so appends cost no system call. In memory
    they are compact arrays (4 or 8 bytes a field), not lists of Python ints.
    Invariant: the file holds exactly the first ``_written`` entries (never more).
    """

    entry: struct.Struct

    def __init__(self, path: Path, base_offset: int, max_entries: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(1, max_entries)
        self._written = 0
        self._unsynced = False  # the file changed since the last fsync

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def is_full(self) -> bool:
        return len(self) >= self.max_entries

    def _entry_bytes(self, start: int) -> bytes:
        raise NotImplementedError

    def write_pending(self) -> None:
        """Write the entries not yet in the file (page cache only; fsync is the caller's)."""
        if self._written == len(self):
            return
        data = self._entry_bytes(self._written)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, data, self._written * self.entry.size)
        finally:
            os.close(fd)
        self._written = len(self)
        self._unsynced = True

    def rewrite(self) -> None:
        """Replace the file with every in-memory entry (after truncation or a rebuild)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, self._entry_bytes(0))
        finally:
            os.close(fd)
        self._written = len(self)
        self._unsynced = True

    def _truncate_file(self, entries: int) -> None:
        if self._written > entries:
            os.truncate(self.path, entries * self.entry.size)
            self._written = entries
            self._unsynced = True

    def fsync(self) -> None:
        """fsync the file if it changed since the last fsync."""
        if not self._unsynced:
            return
        self._unsynced = False
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _read_raw(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None


class OffsetIndex(_IndexFile):
    """Sparse index of one segment: which file position holds the batch starting at an offset.

    On-disk format (``<base offset, 20 digits>.index``): a sequence of 8-byte big-endian entries
    ``(relative offset u32, position u32)``; relative offset = batch base offset - segment base
    offset. One entry is added before a batch whenever more than ``index.interval.bytes`` were
    appended since the previous entry.

    Invariants: relative offsets and positions strictly increase; every entry names the start of
    a batch whose base offset is exactly ``base_offset + relative offset``; the file holds a
    prefix of the in-memory entries (the rest is written at the next flush).
    """

    entry = OFFSET_ENTRY

    def __init__(self, path: Path, base_offset: int, max_entries: int) -> None:
        super().__init__(path, base_offset, max_entries)
        self.relative_offsets: array[int] = array(U32)
        self.positions: array[int] = array(U32)

    def __len__(self) -> int:
        return len(self.positions)

    def append(self, offset: int, position: int) -> None:
        self.relative_offsets.append(offset - self.base_offset)
        self.positions.append(position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """``(offset, position)`` of the last entry at or before ``offset``, else the segment
        start ``(base_offset, 0)``."""
        i = bisect.bisect_right(self.relative_offsets, offset - self.base_offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self.relative_offsets[i], self.positions[i]

    def lookup_position(self, position: int) -> tuple[int, int]:
        """``(offset, position)`` of the last entry whose position is <= ``position``."""
        i = bisect.bisect_right(self.positions, position) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self.relative_offsets[i], self.positions[i]

    @property
    def last_entry(self) -> tuple[int, int]:
        if not self.positions:
            return self.base_offset, 0
        return self.base_offset + self.relative_offsets[-1], self.positions[-1]

    def truncate_to_offset(self, offset: int) -> None:
        """Keep only the entries for batches that start before ``offset``."""
        keep = bisect.bisect_left(self.relative_offsets, offset - self.base_offset)
        del self.relative_offsets[keep:], self.positions[keep:]
        self._truncate_file(keep)

    def clear(self) -> None:
        del self.relative_offsets[:], self.positions[:]

    def _entry_bytes(self, start: int) -> bytes:
        out = bytearray(OFFSET_ENTRY.size * (len(self.positions) - start))
        for k, i in enumerate(range(start, len(self.positions))):
            OFFSET_ENTRY.pack_into(out, k * 8, self.relative_offsets[i], self.positions[i])
        return bytes(out)

    def load(self, segment_size: int) -> bool:
        """Read the file; returns False (leaving the index empty) when it is missing or fails the
        sanity checks: whole entries, strictly increasing, positions inside the segment."""
        raw = self._read_raw()
        if raw is None or len(raw) % OFFSET_ENTRY.size:
            return False
        rel: array[int] = array(U32)
        pos: array[int] = array(U32)
        for r, p in OFFSET_ENTRY.iter_unpack(raw):
            if (rel and (r <= rel[-1] or p <= pos[-1])) or r > MAX_RELATIVE_OFFSET:
                return False
            if p >= segment_size:
                return False
            rel.append(r)
            pos.append(p)
        self.relative_offsets, self.positions = rel, pos
        self._written = len(pos)
        return True


class TimeIndex(_IndexFile):
    """Sparse index of one segment: the largest timestamp seen so far, and where.

    On-disk format (``<base offset, 20 digits>.timeindex``): 12-byte big-endian entries
    ``(timestamp i64, relative offset u32)``. An entry is added next to an offset index entry when
    the segment's largest batch timestamp grew since the last entry, and once more when the
    segment stops being active. The relative offset is that of the batch that holds the timestamp.

    Invariants: timestamps strictly increase and relative offsets never decrease, so every batch
    before an entry's offset has a max timestamp <= that entry's timestamp.
    """

    entry = TIME_ENTRY

    def __init__(self, path: Path, base_offset: int, max_entries: int) -> None:
        super().__init__(path, base_offset, max_entries)
        self.timestamps: array[int] = array(I64)
        self.relative_offsets: array[int] = array(U32)

    def __len__(self) -> int:
        return len(self.timestamps)

    @property
    def last_timestamp(self) -> int:
        return self.timestamps[-1] if self.timestamps else -1

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Add ``(timestamp, offset)`` when the timestamp is newer than the last entry."""
        if timestamp > self.last_timestamp and (
            not self.relative_offsets or offset - self.base_offset >= self.relative_offsets[-1]
        ):
            self.timestamps.append(timestamp)
            self.relative_offsets.append(offset - self.base_offset)

    def lookup(self, timestamp: int) -> int:
        """An offset from which a forward scan finds the first batch with a max timestamp >=
        ``timestamp``: the offset of the last entry whose timestamp is < it, else the base."""
        i = bisect.bisect_left(self.timestamps, timestamp) - 1
        return self.base_offset + (self.relative_offsets[i] if i >= 0 else 0)

    def truncate_to_offset(self, offset: int) -> None:
        keep = bisect.bisect_left(self.relative_offsets, offset - self.base_offset)
        del self.timestamps[keep:], self.relative_offsets[keep:]
        self._truncate_file(keep)

    def clear(self) -> None:
        del self.timestamps[:], self.relative_offsets[:]

    def _entry_bytes(self, start: int) -> bytes:
        out = bytearray(TIME_ENTRY.size * (len(self.timestamps) - start))
        for k, i in enumerate(range(start, len(self.timestamps))):
            TIME_ENTRY.pack_into(out, k * 12, self.timestamps[i], self.relative_offsets[i])
        return bytes(out)

    def load(self, max_relative_offset: int) -> bool:
        """Read the file; False (index left empty) when missing or failing the sanity checks."""
        raw = self._read_raw()
        if raw is None or len(raw) % TIME_ENTRY.size:
            return False
        ts: array[int] = array(I64)
        rel: array[int] = array(U32)
        for t, r in TIME_ENTRY.iter_unpack(raw):
            if ts and (t <= ts[-1] or r < rel[-1]):
                return False
            if r > max_relative_offset:
                return False
            ts.append(t)
            rel.append(r)
        self.timestamps, self.relative_offsets = ts, rel
        self._written = len(ts)
        return True
