"""The leader epoch cache of a partition: at which offset each leader epoch began."""

from __future__ import annotations

import bisect
import itertools
import threading
from pathlib import Path

from fjord.storage.checkpoint import read_text, sync_file, write_atomically

CHECKPOINT_VERSION = 0
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


class LeaderEpochCache:
    """Epoch -> start offset of the first batch written in that epoch, Kafka's
    ``leader-epoch-checkpoint``.

    Invariants: entries are sorted, strictly increasing in epoch *and* in start offset; epochs and
    offsets are >= 0. Assigning an entry that breaks monotonicity first drops the entries it
    conflicts with (as Kafka does), so the cache always describes one linear history.

    On-disk format (text, Kafka's)::

        0                 <- version
        2                 <- number of entries
        0 0               <- "epoch start_offset", one line per entry, oldest first
        3 150

    A change is kept in memory and written by :meth:`sync` (a temporary file renamed over it, then
    fsync'd), which the log calls from ``flush()`` and ``close()`` before it moves the recovery
    point. New entries start at or past the recovery point (a new leader's log end, a follower's
    appended batch), so the file on disk is right for every offset below the recovery point, and
    that is all an open after an unclean stop trusts: it drops the entries from the first
    re-validated segment on and re-learns them from the batches' partition leader epochs
    (Kafka's rule). Writing the file at every change instead cost a file creation and a rename
    per partition on the event loop whenever thousands of partitions changed leader at once
    (docs/performance.md, "The broker at scale").

    Threads: the event loop changes the cache while a flush may run :meth:`sync` in a worker
    thread; ``_mutex`` makes the snapshot written, and the pending flag, consistent.
    """

    def __init__(self, path: Path, entries: list[tuple[int, int]] | None = None) -> None:
        self.path = path
        self._unsynced = False
        self._write_pending = False
        self._mutex = threading.Lock()
        self._epochs: list[int] = []
        self._offsets: list[int] = []
        for epoch, offset in entries or []:
            self._epochs.append(epoch)
            self._offsets.append(offset)

    @classmethod
    def load(cls, path: Path) -> tuple[LeaderEpochCache, bool]:
        """The cache stored at ``path`` and whether it was read intact (False: missing or
        malformed, in which case the cache starts empty and the caller rebuilds it)."""
        text = read_text(path)
        if text is None:
            return cls(path), False
        entries = parse_checkpoint(text)
        if entries is None:
            return cls(path), False
        return cls(path, entries), True

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._offsets, strict=True))

    @property
    def latest_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; returns whether the cache changed.

        A no-op when ``epoch`` is already the latest with an earlier or equal start offset.
        Entries with an epoch >= ``epoch`` or a start offset >= ``start_offset`` are removed first.
        """
        if epoch < 0 or start_offset < 0:
            return False
        if self._epochs and self._epochs[-1] == epoch and self._offsets[-1] <= start_offset:
            return False
        with self._mutex:
            while self._epochs and (
                self._epochs[-1] >= epoch or self._offsets[-1] >= start_offset
            ):
                self._epochs.pop()
                self._offsets.pop()
            self._epochs.append(epoch)
            self._offsets.append(start_offset)
            self._write_pending = True
        return True

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch answer: ``(epoch, end_offset)`` where ``end_offset`` is
        the first offset of the next higher epoch (or the log end offset for the latest epoch)
        and ``epoch`` the largest known epoch <= the requested one. ``(-1, -1)`` when the
        requested epoch is undefined or newer than every known epoch."""
        if requested_epoch == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested_epoch == self._epochs[-1]:
            return requested_epoch, log_end_offset
        higher = bisect.bisect_right(self._epochs, requested_epoch)
        if higher == len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return requested_epoch, self._offsets[0]
        return self._epochs[higher - 1], self._offsets[higher]

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch in which ``offset`` was written (-1 when before every entry)."""
        i = bisect.bisect_right(self._offsets, offset)
        return self._epochs[i - 1] if i else UNDEFINED_EPOCH

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop the entries that start at or after ``end_offset`` (the log was truncated)."""
        keep = bisect.bisect_left(self._offsets, end_offset)
        if keep < len(self._offsets):
            with self._mutex:
                del self._epochs[keep:], self._offsets[keep:]
                self._write_pending = True

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at ``start_offset``: drop older entries, keeping the epoch that
        covers ``start_offset`` with its start moved up to it."""
        covering = bisect.bisect_right(self._offsets, start_offset) - 1
        if covering < 0 or (covering == 0 and self._offsets[0] == start_offset):
            return
        with self._mutex:
            del self._epochs[:covering], self._offsets[:covering]
            self._offsets[0] = start_offset
            self._write_pending = True

    def clear(self) -> None:
        if self._epochs:
            with self._mutex:
                self._epochs.clear()
                self._offsets.clear()
                self._write_pending = True

    @property
    def write_pending(self) -> bool:
        """Whether the cache holds changes the file does not have yet."""
        return self._write_pending

    def sync(self) -> None:
        """Write the pending changes and make the file durable (no-op when it is). Raises the
        OSError of a write that cannot be done (the disk is full): the caller's flush then
        fails and the recovery point stays behind."""
        if self._write_pending:
            self._write_strict()
        if self._unsynced:
            self._unsynced = False
            sync_file(self.path)

    def _write_strict(self) -> None:
        with self._mutex:
            lines = [str(CHECKPOINT_VERSION), str(len(self._epochs))]
            lines += [f"{e} {o}" for e, o in zip(self._epochs, self._offsets, strict=True)]
            self._write_pending = False  # a change from here on is pending again
        try:
            write_atomically(self.path, "\n".join(lines) + "\n", sync=False)
        except OSError:
            self._write_pending = True
            raise
        self._unsynced = True


def parse_checkpoint(text: str) -> list[tuple[int, int]] | None:
    """The entries of a leader-epoch-checkpoint text, or None when it is malformed (wrong
    version, count mismatch, non-integers or entries that are not strictly increasing)."""
    lines = text.splitlines()
    try:
        if len(lines) < 2 or int(lines[0]) != CHECKPOINT_VERSION:
            return None
        count = int(lines[1])
        if count != len(lines) - 2:
            return None
        entries = []
        for line in lines[2:]:
            epoch_text, offset_text = line.split()
            entries.append((int(epoch_text), int(offset_text)))
    except ValueError:
        return None
    for (e1, o1), (e2, o2) in itertools.pairwise(entries):
        if e2 <= e1 or o2 <= o1:
            return None
    if any(e < 0 or o < 0 for e, o in entries):
        return None
    return entries
