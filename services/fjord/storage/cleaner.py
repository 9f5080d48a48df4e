"""Cleaning one partition log on disk: the I/O around :mod:`fjord.storage.compaction`.

:func:`clean_log` compacts ``[log start, cleanable end)`` of a :class:`PartitionLog` (never
the active segment) and moves the log's *cleaner checkpoint* (``cleaner-checkpoint`` in the
partition directory: the first dirty offset) to the cleanable end. It runs in a worker thread
while the broker appends to the active segment and reads: it reads closed segments (immutable
but for truncation and retention, which bump the log's generation; a clean that sees the
generation moved discards its work) and takes the log's lock only for the swap.

The swap (Kafka's scheme), one file per cleaned segment ``<base>.log``:

1. **write**: each segment's cleaned bytes go to ``<base>.log.cleaned``, fsync'd;
2. **mark**: every ``.cleaned`` file is renamed to ``<base>.log.swap``, then the directory is
   fsync'd; from the first ``.swap`` on the clean is decided, but only once no ``.cleaned``
   file is left;
3. **replace**: per segment, its ``.index`` and ``.timeindex`` are deleted, the ``.swap`` file
   is renamed over ``<base>.log`` (atomic), the segment reopened and its indexes rebuilt;
   the directory is fsync'd;
4. **checkpoint**: ``cleaner-checkpoint`` (:class:`fjord.storage.swap.CleanerCheckpoint`) is
   rewritten atomically with the cleanable end as first dirty offset. (Before step 2 it was
   rewritten with the cleanable end as ``gaps-below``: a segment with offset gaps must never
   be opened by a recovery that takes gaps for damage.)

Recovery (:func:`fjord.storage.swap.recover_interrupted_clean`, called by the log's open before it
lists segments): a ``.cleaned`` file means the crash came before or during step 2, when no segment
was replaced yet: every ``.cleaned`` and ``.swap`` file is deleted and the log is as it was. No
``.cleaned`` but some ``.swap`` files: the crash came in step 2's last rename or in step 3: each
``.swap`` replaces its segment (indexes deleted first, rebuilt at load) and the log is as it will
be. A crash before step 4 leaves the old checkpoint: the next clean redoes the work, which changes
nothing (a clean of a clean range is the identity). Either way the log is never a mix of the two.

Every cleaned segment keeps its last batch (emptied when needed) so segments stay contiguous;
inside a segment offsets have gaps where records were dropped.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fjord.errors import CorruptRecordError
from fjord.records.header import BatchHeader
from fjord.storage import defaults
from fjord.storage.checkpoint import sync_directory, write_new_file
from fjord.storage.compaction import (
    CleanedSegment,
    DirtyState,
    SegmentInfo,
    TransactionTracker,
    aborted_ranges,
    build_bounded_offset_map,
    clean_segment,
    cleanable_end,
    dirty_state,
    last_batch_of_each_producer,
    tombstones_expired,
)
from fjord.storage.log import PartitionLog
from fjord.storage.segment import LogSegment, segment_file_name
from fjord.storage.swap import (
    CLEANED_SUFFIX,
    SWAP_SUFFIX,
    CleanerCheckpoint,
    read_cleaner_checkpoint,
    write_cleaner_checkpoint,
)

#: Called after each step of a clean with the step's name ("written", "marked", "replaced",
#: "checkpointed"): tests raise from it to simulate a crash there.
StepHook = Callable[[str], None]


def _no_step(_: str) -> None:
    return None


def _no_throttle(_: int) -> None:
    return None


def read_first_dirty_offset(directory: Path) -> int:
    """The cleaner checkpoint's first dirty offset: offsets below it are clean."""
    return read_cleaner_checkpoint(directory).first_dirty


@dataclass(frozen=True, slots=True)
class CleanStats:
    """One clean of one log."""

    first_dirty_offset: int
    cleaned_to: int
    """The new first dirty offset (the cleanable end)."""
    segments: int
    bytes_read: int
    bytes_written: int
    records_read: int
    records_kept: int
    tombstones_dropped: int
    keyless_dropped: int
    seconds: float
    offset_map_bytes: int = 0
    """The offset map's size (:func:`fjord.storage.compaction.offset_map_entry_bytes`)."""


def _infos(segments: list[LogSegment]) -> list[SegmentInfo]:
    return [SegmentInfo(s.base_offset, s.next_offset, s.size, s.max_timestamp) for s in segments]


def log_dirty_state(
    log: PartitionLog, now_ms: int, min_compaction_lag_ms: int, high_watermark: int | None = None
) -> DirtyState:
    """The cleaner's view of ``log`` now (cheap: segment metadata and the checkpoint file)."""
    segments = log.segments
    closed = _infos(segments[:-1])
    end = cleanable_end(closed, segments[-1].base_offset, now_ms, min_compaction_lag_ms,
                        high_watermark)
    first_dirty = max(read_first_dirty_offset(log.directory), segments[0].base_offset)
    return dirty_state(closed, first_dirty, end)


def clean_log(
    log: PartitionLog,
    *,
    now_ms: int,
    delete_retention_ms: int,
    min_compaction_lag_ms: int = 0,
    high_watermark: int | None = None,
    throttle: Callable[[int], None] = _no_throttle,
    on_step: StepHook = _no_step,
    max_map_bytes: int | None = None,
) -> CleanStats | None:
    """Compact ``log`` up to its cleanable end (see the module docstring; never past the
    segment holding ``high_watermark``, when given). Returns None when
    there was nothing to clean or the log changed under the clean (truncation, retention,
    close): nothing is changed then. ``throttle(n)`` is called before ``n`` bytes are read
    (the cleaner's I/O limit). ``max_map_bytes`` (``log.cleaner.dedupe.buffer.size``): when the
    offset map of the dirty section would outgrow it, this clean stops where the map filled (a
    batch boundary, possibly inside a segment) and the checkpoint moves there; the next clean
    goes on from it (Kafka's rounds). Raises :class:`~fjord.errors.CorruptRecordError` for a damaged
    segment (nothing changed)."""
    started = time.monotonic()
    directory = log.directory
    with log._lock:
        if log.closed:
            return None
        segments = list(log._segments)
        generation = log._generation
    closed = segments[:-1]
    end = cleanable_end(_infos(closed), segments[-1].base_offset, now_ms, min_compaction_lag_ms,
                        high_watermark)
    first_dirty = max(read_first_dirty_offset(directory), segments[0].base_offset)
    if first_dirty >= end:
        return None
    to_clean = [s for s in closed if s.base_offset < end]
    sizes = [s.size for s in to_clean]

    def contents(segment: LogSegment, size: int) -> bytes:
        throttle(size)
        return segment.read(0, size)

    dirty = [(s, n) for s, n in zip(to_clean, sizes, strict=True) if s.next_offset > first_dirty]
    # Every transaction below the cleanable end is complete (the broker passes its last stable
    # offset): its aborted records are dropped, never mapped (fjord.storage.compaction).
    aborted = aborted_ranges(
        (t.producer_id, t.first_offset, t.last_offset) for t in log.aborted_txns(0, end)
    )
    bounded = build_bounded_offset_map((contents(s, n) for s, n in dirty), first_dirty, end,
                                       aborted, max_map_bytes)
    offset_map = bounded.offsets
    if bounded.end < end:  # the map filled up: this round cleans up to where it stopped
        end = bounded.end
        kept = [(s, n) for s, n in zip(to_clean, sizes, strict=True) if s.base_offset < end]
        to_clean, sizes = [s for s, _ in kept], [n for _, n in kept]
    producers = last_batch_of_each_producer(_headers(segments))
    results: list[tuple[LogSegment, CleanedSegment]] = []
    written: list[Path] = []
    transactions = TransactionTracker()  # across the segments, in log order
    try:
        for segment, size in zip(to_clean, sizes, strict=True):
            result = clean_segment(
                contents(segment, size),
                offset_map,
                cleanable_end=end,
                drop_tombstones=tombstones_expired(
                    segment.max_timestamp, delete_retention_ms, now_ms
                ),
                producer_last_offsets=producers,
                retain_last_batch=True,
                aborted=aborted,
                transactions=transactions,
            )
            path = directory / segment_file_name(segment.base_offset, CLEANED_SUFFIX)
            written.append(path)
            write_new_file(path, result.data)
            results.append((segment, result))
        sync_directory(directory)
        on_step("written")
        checkpoint = read_cleaner_checkpoint(directory)
        write_cleaner_checkpoint(directory, CleanerCheckpoint(
            checkpoint.first_dirty, max(checkpoint.gaps_below, end)))
        with log._lock:
            if (log.closed or log._generation != generation
                    or any(s.closed or s not in log._segments for s in to_clean)
                    or any(s.size != n for s, n in zip(to_clean, sizes, strict=True))):
                _discard(written)
                return None
            for path in written:
                os.replace(path, path.with_name(path.name[: -len(CLEANED_SUFFIX)] + SWAP_SUFFIX))
            written = []
            sync_directory(directory)
            on_step("marked")
            for segment, _ in results:
                _replace(log, segment)
                on_step("replaced")
            sync_directory(directory)
    except BaseException:
        _discard(written)
        raise
    write_cleaner_checkpoint(directory, CleanerCheckpoint(end, max(checkpoint.gaps_below, end)))
    on_step("checkpointed")
    return CleanStats(
        first_dirty, end, len(results), sum(sizes), sum(len(r.data) for _, r in results),
        sum(r.records_read for _, r in results), sum(r.records_kept for _, r in results),
        sum(r.tombstones_dropped for _, r in results), sum(r.keyless_dropped for _, r in results),
        time.monotonic() - started, bounded.size_bytes,
    )


def _headers(segments: list[LogSegment]) -> list[BatchHeader]:
    """Every batch header of the log (the active segment's up to its size now). A truncation
    of the active segment meanwhile cuts its scan short: the clean then keeps an emptied batch
    or two too many (harmless), and the swap's generation check discards it anyway."""
    closed, active = segments[:-1], segments[-1]
    headers = [h for s in closed for _, h in s.iter_headers(0, s.size)]
    with contextlib.suppress(CorruptRecordError, OSError):
        headers.extend(h for _, h in active.iter_headers(0, active.size))
    return headers


def _discard(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _replace(log: PartitionLog, old: LogSegment) -> None:
    """Step 3 for one segment, under the log's lock: its ``.swap`` file becomes its ``.log``,
    the segment object in the log is replaced by one with rebuilt indexes."""
    base = old.base_offset
    directory = log.directory
    old.close()
    for suffix in (defaults.INDEX_SUFFIX, defaults.TIME_INDEX_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            old.path(suffix).unlink()
    os.replace(directory / segment_file_name(base, SWAP_SUFFIX), old.path(defaults.LOG_SUFFIX))
    new = LogSegment.open(directory, base, log.config.index_interval_bytes,
                          log.config.segment_index_bytes, old.created_ms, create=False)
    new.may_have_gaps = True
    new._rebuild_indexes()
    new.may_have_gaps = True
    new.verified = True  # written by this process from CRC-checked batches
    new.created_ms = old.created_ms
    at = log._segments.index(old)
    log._segments[at] = new
