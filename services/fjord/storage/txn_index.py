"""The aborted-transactions index of one segment: ``<base offset>.txnindex`` (Kafka's
TransactionIndex).

On-disk format: fixed 34-byte entries back to back, nothing else (Kafka's ``AbortedTxn``,
big-endian)::

    version             int16   0
    producer_id         int64   the producer whose transaction was aborted
    first_offset        int64   first offset of the transaction (its first transactional batch)
    last_offset         int64   offset of its ABORT marker (the control batch)
    last_stable_offset  int64   the partition's last stable offset once it was aborted: the
                                first offset of another open transaction, else last_offset + 1

An entry lives in the index of the segment that holds its ABORT marker (``last_offset``), so the
aborted transactions that overlap a fetch from ``fetch_offset`` are all in the indexes of the
segment holding ``fetch_offset`` and the later ones. Entries are in marker order
(``last_offset`` strictly increasing). The file is written by the partition when an ABORT marker
is appended (leader and follower alike), truncated with its segment, deleted with it, kept
through compaction (the cleaner replaces only ``.log``, ``.index`` and ``.timeindex``), and
rebuilt from the log for every marker the producer state replays at start-up (an entry already
present is not added again). A torn last entry (a crash in the middle of a write) is dropped
when the file is loaded; an entry with an unknown version ends the file there (logged).
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from fjord.errors import StorageError

log = logging.getLogger(__name__)

ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = ENTRY.size  # 34
ENTRY_VERSION = 0


@dataclass(frozen=True, slots=True, order=True)
class AbortedTxn:
    """One aborted transaction: records of ``producer_id`` in ``[first_offset, last_offset)``
    are aborted; ``last_offset`` is the ABORT marker's offset."""

    last_offset: int
    producer_id: int
    first_offset: int
    last_stable_offset: int

    def to_bytes(self) -> bytes:
        return ENTRY.pack(ENTRY_VERSION, self.producer_id, self.first_offset, self.last_offset,
                          self.last_stable_offset)


def parse_entries(data: bytes, where: str = "txnindex") -> list[AbortedTxn]:
    """Entries of a ``.txnindex`` file's bytes, stopping (with a warning) at a torn last entry,
    an entry of an unknown version, or one out of marker order."""
    entries: list[AbortedTxn] = []
    whole = len(data) - len(data) % ENTRY_SIZE
    if whole != len(data):
        log.warning("%s: dropping a torn last entry (%d bytes)", where, len(data) - whole)
    for version, pid, first, last, lso in ENTRY.iter_unpack(data[:whole]):
        if version != ENTRY_VERSION or (entries and last <= entries[-1].last_offset):
            log.warning("%s: entry %d is invalid (version %d, marker offset %d): index ends "
                        "there", where, len(entries), version, last)
            break
        entries.append(AbortedTxn(last, pid, first, lso))
    return entries


class TransactionIndex:
    """The ``.txnindex`` of one segment, held in memory and written through to its file.

    Invariants: ``entries`` equals the file's content (after load, every change rewrites or
    appends to the file before returning) and is sorted by ``last_offset`` without repeats. No
    file exists while the index is empty and was never written (most segments)."""

    __slots__ = ("entries", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc}") from exc
        self.entries = parse_entries(data, str(path))
        if len(self.entries) * ENTRY_SIZE != len(data):
            self._rewrite()

    def __len__(self) -> int:
        return len(self.entries)

    def append(self, entry: AbortedTxn) -> bool:
        """Add ``entry`` (a marker after every entry's); returns False, adding nothing, when
        an entry for the same transaction (producer, first offset, marker) is already there (a
        replay at start-up; its last stable offset is not compared: a search hint only).
        Raises StorageError for an entry out of marker order or a failed write."""
        if self.entries and entry.last_offset <= self.entries[-1].last_offset:
            if any(e.last_offset == entry.last_offset and e.producer_id == entry.producer_id
                   and e.first_offset == entry.first_offset for e in self.entries):
                return False
            raise StorageError(
                f"{self.path}: aborted transaction with marker at {entry.last_offset} is not "
                f"after the last entry's marker {self.entries[-1].last_offset}"
            )
        try:
            with open(self.path, "ab") as f:
                f.write(entry.to_bytes())
        except OSError as exc:
            raise StorageError(f"write to {self.path} failed: {exc}") from exc
        self.entries.append(entry)
        return True

    def truncate_to(self, offset: int) -> None:
        """Forget the transactions whose marker is at or after ``offset`` (the log is cut
        there)."""
        kept = [e for e in self.entries if e.last_offset < offset]
        if len(kept) != len(self.entries):
            self.entries = kept
            self._rewrite()

    def collect(self, fetch_offset: int, upper: int) -> tuple[list[AbortedTxn], bool]:
        """Entries overlapping ``[fetch_offset, upper)`` (marker at or after the fetch offset,
        first offset below ``upper``), and whether the search may stop here: an entry whose
        last stable offset reaches ``upper`` proves no later segment holds an overlapping one
        (Kafka's TxnIndexSearchResult.isComplete)."""
        found = []
        for entry in self.entries:
            if entry.last_offset >= fetch_offset and entry.first_offset < upper:
                found.append(entry)
            if entry.last_stable_offset >= upper:
                return found, True
        return found, False

    def _rewrite(self) -> None:
        data = b"".join(e.to_bytes() for e in self.entries)
        try:
            if not data:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
                return
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, self.path)
        except OSError as exc:
            raise StorageError(f"rewrite of {self.path} failed: {exc}") from exc

    def fsync(self) -> None:
        if not self.entries:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def delete(self) -> None:
        self.entries = []
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
