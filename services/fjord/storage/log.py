"""A partition's log: segments on disk, offsets, recovery, retention and durability."""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from fjord.errors import (
    InvalidRecordError,
    LogDamagedError,
    OffsetOutOfRangeError,
    StorageError,
)
from fjord.records.header import (
    STAMPED_PREFIX_SIZE,
    BatchHeader,
    check_crc,
    check_structure,
    set_log_append_time,
    stamp_batch,
    stamped_prefix,
    validate_batch,
)
from fjord.records.reader import RecordBatch
from fjord.storage import defaults
from fjord.storage.checkpoint import read_text, sync_directory, sync_file, write_atomically
from fjord.storage.config import LogConfig
from fjord.storage.disk_health import describe_os_error, is_out_of_space
from fjord.storage.epoch import LeaderEpochCache
from fjord.storage.index import MAX_RELATIVE_OFFSET
from fjord.storage.region import FileRegion
from fjord.storage.scrub import LogDamage, check_batches
from fjord.storage.segment import NO_TIMESTAMP, LogSegment
from fjord.storage.swap import (
    CleanerCheckpoint,
    read_cleaner_checkpoint,
    recover_interrupted_clean,
    write_cleaner_checkpoint,
)
from fjord.storage.txn_index import AbortedTxn

log = logging.getLogger(__name__)

PARTITION_CHECKPOINT_VERSION = 0


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


_CRC_POOL: ThreadPoolExecutor | None = None


def _crc_pool() -> ThreadPoolExecutor:
    global _CRC_POOL
    if _CRC_POOL is None:
        _CRC_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fjord-crc")
    return _CRC_POOL


def _check_crcs(buf: memoryview, headers: list[tuple[int, BatchHeader]]) -> None:
    for pos, header in headers:
        check_crc(buf, pos, header)


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """What an append did. ``log_append_time`` is the broker time stamped into the batches
    (LogAppendTime topics) or -1 (CreateTime)."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    log_append_time: int
    log_start_offset: int
    record_count: int
    batch_count: int
    valid_bytes: int


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What opening the log found: whether the previous stop was clean, how many segments were
    re-validated, and how many bytes of torn or corrupt data were cut off."""

    clean_shutdown: bool
    recovered_segments: int
    truncated_bytes: int
    deleted_segments: int


class PartitionLog:
    """The log of one partition replica in ``directory`` (named ``<topic>-<partition>``).

    On-disk layout::

        00000000000000000000.log        batches, back to back (see LogSegment)
        00000000000000000000.index      sparse offset -> position (see OffsetIndex)
        00000000000000000000.timeindex  sparse max timestamp -> offset (see TimeIndex)
        00000000000000004096.log ...    next segment, named by its base offset (20 digits)
        leader-epoch-checkpoint         Kafka's text format (see LeaderEpochCache)
        partition-checkpoint            "0\\nrecovery-point N\\nlog-start-offset M\\n"
        .clean-shutdown                 present only while the log is cleanly closed

    Invariants:
      * segments are sorted by base offset, contiguous (each starts where the previous ends;
        within a segment offsets may have gaps after compaction, see fjord.storage.cleaner),
        only the last one (the active segment) is appended to; there is always one;
      * ``log_start_offset <= log_end_offset``, the log start lies in the first segment;
      * ``recovery_point <= log_end_offset`` and every byte below the recovery point has been
        fsync'd, so recovery after a crash only re-reads the segments holding what follows it
        (indexes are checked at every open and rebuilt when they fail their checks);
      * every batch in the log has passed header and CRC checks, with offsets stamped.

    Threads: every method runs on the caller's thread (the broker's event loop) except
    :meth:`flush`, which may run in a worker thread concurrently with the others: a lock guards
    the in-memory state, and fsync itself runs on duplicated file descriptors outside the lock.
    """

    def __init__(self, directory: Path, config: LogConfig) -> None:
        self.directory = directory
        self.config = config
        self._segments: list[LogSegment] = []
        self._bases: list[int] = []
        self._lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self.log_start_offset = 0
        self.recovery_point = 0
        self._unflushed_records = 0
        self._first_unflushed_ms: int | None = None
        self._unsynced_segments: list[LogSegment] = []
        #: Segments re-validated at open after an unclean stop and not fsync'd since: the next
        #: :meth:`flush` syncs them before it moves the recovery point past them (unlike
        #: ``_unsynced_segments`` they do not make a flush due: Kafka's rule, the recovery
        #: point only advances when the log is flushed).
        self._recovered_unsynced: list[LogSegment] = []
        self._generation = 0  # bumped when offsets below the end go away (truncate, delete)
        self._checkpoint_unsynced = False  # partition-checkpoint written but not fsync'd
        #: (recovery point, log start) the partition-checkpoint file holds (None: unknown).
        self._checkpoint_on_disk: tuple[int, int] | None = None
        self.epoch_cache = LeaderEpochCache(directory / defaults.LEADER_EPOCH_CHECKPOINT)
        self.recovery: RecoveryReport | None = None
        self.closed = False
        #: The lowest damaged batch found by a read or the scrubber (None: none known). Reads
        #: of the offsets it covers raise LogDamagedError; truncating below it clears it.
        self.damage: LogDamage | None = None

    # ---- opening -------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        config: LogConfig | None = None,
        now_ms: int | None = None,
    ) -> PartitionLog:
        """Open (creating if needed) the log in ``directory``, recovering after an unclean
        stop. Raises :class:`StorageError` naming the directory when it cannot be used."""
        path = Path(directory)
        self = cls(path, config or LogConfig())
        try:
            path.mkdir(parents=True, exist_ok=True)
            self._load(wall_clock_ms() if now_ms is None else now_ms)
        except StorageError:
            self._close_segments()
            raise
        except (OSError, ValueError) as e:
            self._close_segments()
            raise StorageError(f"cannot load partition log {path}: {e}") from e
        return self

    def _load(self, now_ms: int) -> None:
        d = self.directory
        clean = (d / defaults.CLEAN_SHUTDOWN_MARKER).exists()
        for leftover in d.glob("*.tmp"):
            leftover.unlink()
        if recover_interrupted_clean(d) is not None:
            clean = False  # replaced segments need their indexes rebuilt and checked
        gaps_below = read_cleaner_checkpoint(d).gaps_below
        bases = []
        for entry in d.iterdir():
            name = entry.name
            if name.endswith(defaults.LOG_SUFFIX):
                stem = name[: -len(defaults.LOG_SUFFIX)]
                if len(stem) != defaults.OFFSET_DIGITS or not stem.isdigit():
                    raise StorageError(f"unexpected file {entry} in partition directory {d}")
                bases.append(int(stem))
        bases.sort()
        index_suffixes = (
            defaults.INDEX_SUFFIX, defaults.TIME_INDEX_SUFFIX, defaults.TXN_INDEX_SUFFIX
        )
        for suffix in index_suffixes:
            for index_file in d.glob("*" + suffix):  # indexes whose log is gone
                if index_file.name[: -len(suffix)] not in {f"{b:020d}" for b in bases}:
                    index_file.unlink()
        recovery_point, log_start = self._read_partition_checkpoint()
        if recovery_point is not None and log_start is not None:
            self._checkpoint_on_disk = (recovery_point, log_start)
        if not clean and recovery_point is None:
            recovery_point = 0
        self.epoch_cache, epochs_intact = LeaderEpochCache.load(
            d / defaults.LEADER_EPOCH_CHECKPOINT
        )
        rebuild_epochs = not epochs_intact and bool(bases)
        if rebuild_epochs:
            self.epoch_cache.clear()
        recovered = truncated = deleted = 0
        for i, base in enumerate(bases):
            segment = LogSegment.open(
                d,
                base,
                self.config.index_interval_bytes,
                self.config.segment_index_bytes,
                now_ms,
                create=False,
            )
            segment.may_have_gaps = base < gaps_below
            if self._segments and base != self._segments[-1].next_offset:
                # A gap or overlap: the previous segment was cut by recovery. Nothing after
                # the cut can be trusted to be contiguous, so it goes.
                segment.delete()
                deleted += len(bases) - i
                for later in bases[i + 1 :]:
                    self._delete_segment_files(later)
                break
            next_base = bases[i + 1] if i + 1 < len(bases) else None
            below_recovery_point = clean or (
                next_base is not None and recovery_point is not None and next_base <= recovery_point
            )
            trusted = below_recovery_point and segment.load_trusted()
            if not trusted:
                recovered += 1
                # Epochs are re-learned from the recovered batches (Kafka does the same): what
                # the checkpoint says about this segment and later ones is not trusted, so a
                # later segment that needs no recovery (this one failed its index checks below
                # the recovery point) has its epochs re-learned from its headers too.
                self.epoch_cache.truncate_from_end(segment.base_offset)
                rebuild_epochs = True
                cut = segment.recover(self._learn_epoch)
                truncated += cut
                if cut:
                    log.warning(
                        "recovery cut %d bytes off %s", cut, segment.path(defaults.LOG_SUFFIX)
                    )
            elif rebuild_epochs:
                for _, h in segment.iter_headers(0, segment.size):
                    self._learn_epoch(h)
            self._add_segment(segment)
        if self._segments:
            # Aborted transactions whose marker recovery cut off are no longer in the log.
            self._segments[-1].txn_index.truncate_to(self._segments[-1].next_offset)
        if not self._segments:
            start = log_start or 0
            self._add_segment(self._new_segment(start, now_ms))
        first_base = self._segments[0].base_offset
        self.log_start_offset = max(first_base, log_start or first_base)
        if self.log_start_offset > self.log_end_offset:
            # Everything below the log start is logically deleted; start empty there.
            start = self.log_start_offset
            for segment in self._segments:
                segment.delete()
            self._segments.clear()
            self._bases.clear()
            self._add_segment(self._new_segment(start, now_ms))
        self.epoch_cache.truncate_from_end(self.log_end_offset)
        self.epoch_cache.truncate_from_start(self.log_start_offset)
        self.recovery = RecoveryReport(clean, recovered, truncated, deleted)
        # After a clean stop everything was fsync'd at close: the recovery point is the log
        # end. After an unclean one the recovery point stays where the checkpoint says (capped
        # at the log end) and the re-validated segments are not fsync'd here: the next flush
        # syncs them before moving it (Kafka's LogLoader does the same). A crash before then
        # re-validates the same segments again, from the same recovery point: what recovery
        # cut or rebuilt need not be durable. Opening thousands of partitions after a crash
        # then costs reads, not several fsyncs each (docs/performance.md, "The broker at
        # scale"). The partition checkpoint is rewritten (fsync'd) only when it changes, the
        # leader epoch checkpoint by the next flush (see LeaderEpochCache).
        if not clean:
            self._recovered_unsynced = [
                s for s in self._segments if s.next_offset > min(recovery_point or 0,
                                                                 self.log_end_offset)
            ]
        try:
            for segment in self._segments:
                segment.write_pending_indexes()
            if clean:
                self.epoch_cache.sync()
                self.recovery_point = self.log_end_offset
            else:
                self.recovery_point = min(recovery_point or 0, self.log_end_offset)
            if (recovery_point, log_start) != (self.recovery_point, self.log_start_offset):
                self._write_partition_checkpoint(sync=True)
        except OSError as e:
            if not is_out_of_space(e):
                raise
            # A full disk must not keep the broker from starting and serving reads. The
            # recovery point stays where the checkpoint on disk says (a crash re-reads from
            # there again), index entries stay pending for the next flush.
            self.recovery_point = min(recovery_point or 0, self.log_end_offset)
            log.warning("%s: cannot write the recovery checkpoint (%s); opened read-mostly",
                        d, describe_os_error(e))
        marker = d / defaults.CLEAN_SHUTDOWN_MARKER
        if marker.exists():
            marker.unlink()  # removing a file works on a full disk too
            sync_directory(d)

    def _learn_epoch(self, header: BatchHeader) -> None:
        if header.partition_leader_epoch > self.epoch_cache.latest_epoch:
            self.epoch_cache.assign(header.partition_leader_epoch, header.base_offset)

    def _read_partition_checkpoint(self) -> tuple[int | None, int | None]:
        text = read_text(self.directory / defaults.PARTITION_CHECKPOINT)
        if text is None:
            return None, None
        values: dict[str, int] = {}
        lines = text.splitlines()
        try:
            if not lines or int(lines[0]) != PARTITION_CHECKPOINT_VERSION:
                raise ValueError(lines[:1])
            for line in lines[1:]:
                key, value = line.split()
                values[key] = int(value)
            return values["recovery-point"], values["log-start-offset"]
        except (ValueError, KeyError):
            log.warning(
                "ignoring malformed %s in %s: full recovery",
                defaults.PARTITION_CHECKPOINT,
                self.directory,
            )
            return None, None

    def _write_partition_checkpoint(self, *, sync: bool) -> None:
        self._checkpoint_unsynced = not sync
        text = (
            f"{PARTITION_CHECKPOINT_VERSION}\nrecovery-point {self.recovery_point}\n"
            f"log-start-offset {self.log_start_offset}\n"
        )
        self._checkpoint_on_disk = None  # unknown until the write succeeded
        write_atomically(self.directory / defaults.PARTITION_CHECKPOINT, text, sync=sync)
        self._checkpoint_on_disk = (self.recovery_point, self.log_start_offset)

    def _delete_segment_files(self, base: int) -> None:
        for suffix in (defaults.LOG_SUFFIX, defaults.INDEX_SUFFIX, defaults.TIME_INDEX_SUFFIX,
                       defaults.TXN_INDEX_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                (self.directory / f"{base:0{defaults.OFFSET_DIGITS}d}{suffix}").unlink()

    def _new_segment(self, base_offset: int, now_ms: int) -> LogSegment:
        return LogSegment.open(
            self.directory,
            base_offset,
            self.config.index_interval_bytes,
            self.config.segment_index_bytes,
            now_ms,
            create=True,
        )

    def _add_segment(self, segment: LogSegment) -> None:
        self._segments.append(segment)
        self._bases.append(segment.base_offset)

    # ---- state ---------------------------------------------------------------------------

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def segments(self) -> list[LogSegment]:
        """A snapshot of the segments, oldest first."""
        with self._lock:
            return list(self._segments)

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def latest_epoch(self) -> int:
        return self.epoch_cache.latest_epoch

    def _check_open(self) -> None:
        if self.closed:
            raise StorageError(f"partition log {self.directory} is closed")

    # ---- appending -----------------------------------------------------------------------

    def append(
        self, batches: bytes | bytearray | memoryview, leader_epoch: int, now_ms: int | None = None
    ) -> AppendInfo:
        """Append producer batches as leader: validate each (header, CRC, size limit), assign
        offsets from the log end by stamping base offset and ``leader_epoch`` (outside the CRC),
        and write them all with one writev. Nothing is kept or visible unless every batch is
        valid (big appends check CRCs while writing and cut the write back on a mismatch).

        Raises :class:`~fjord.errors.CorruptRecordError`, :class:`RecordTooLargeError` or
        :class:`InvalidRecordError` (empty input, empty batch, count/offset-delta mismatch).
        """
        now = wall_clock_ms() if now_ms is None else now_ms
        buf = memoryview(batches).cast("B")
        # A big append checks its CRCs in a helper thread while the write proceeds (both release
        # the GIL); a bad CRC then cuts the write back before anything is indexed or visible.
        overlap = buf.nbytes >= defaults.CRC_OVERLAP_BYTES and not self.config.log_append_time
        headers = self._validate(buf, leader=True, check_crc=not overlap)
        with self._lock:
            self._check_open()
            first = self.log_end_offset
            self._roll_for_append(buf.nbytes, first, headers, now)
            append_time = now if self.config.log_append_time else -1
            iovecs: list[bytes | bytearray | memoryview] = []
            placed: list[tuple[int, int, int, int]] = []
            next_offset = first
            max_ts, offset_of_max, records = NO_TIMESTAMP, first, 0
            for pos, h in headers:
                end = pos + h.size
                if append_time >= 0:
                    batch = bytearray(buf[pos:end])
                    set_log_append_time(batch, append_time)
                    stamp_batch(batch, 0, next_offset, leader_epoch)
                    iovecs.append(batch)
                    batch_ts = append_time
                else:
                    iovecs.append(stamped_prefix(next_offset, h.batch_length, leader_epoch))
                    iovecs.append(buf[pos + STAMPED_PREFIX_SIZE : end])
                    batch_ts = h.max_timestamp
                placed.append((pos, next_offset, batch_ts, h.size))
                if batch_ts > max_ts:
                    max_ts, offset_of_max = batch_ts, next_offset
                next_offset += h.last_offset_delta + 1
                records += h.record_count
            crc_check = _crc_pool().submit(_check_crcs, buf, headers) if overlap else None
            try:
                self.active_segment.append(
                    iovecs, placed, next_offset, now, crc_check.result if crc_check else None
                )
            except StorageError:
                self._go_offline_if_inconsistent()
                raise
            self.epoch_cache.assign(leader_epoch, first)
            self._note_unflushed(records, now)
            return AppendInfo(
                first,
                next_offset - 1,
                max_ts,
                offset_of_max,
                append_time,
                self.log_start_offset,
                records,
                len(headers),
                buf.nbytes,
            )

    def append_as_follower(
        self, batches: bytes | bytearray | memoryview, now_ms: int | None = None
    ) -> AppendInfo:
        """Append batches copied from the leader, keeping their stamped offsets and leader
        epochs. Each must start at or after the end of the previous one (the first at or after
        the log end): the leader's compacted segments have gaps, which the follower keeps. The
        epoch cache learns every batch's partition leader epoch."""
        now = wall_clock_ms() if now_ms is None else now_ms
        buf = memoryview(batches).cast("B")
        headers = self._validate(buf, leader=False)
        with self._lock:
            self._check_open()
            expected = self.log_end_offset
            for _, h in headers:
                if h.base_offset < expected:
                    raise InvalidRecordError(
                        f"follower append to {self.directory}: batch has base offset "
                        f"{h.base_offset}, expected {expected} or later (log end offset "
                        f"{self.log_end_offset})"
                    )
                expected = h.next_offset
            first = self.log_end_offset
            self._roll_for_append(buf.nbytes, first, headers, now)
            if expected - first != sum(h.last_offset_delta + 1 for _, h in headers):
                self._note_gaps_below(expected)
            placed = [(pos, h.base_offset, h.max_timestamp, h.size) for pos, h in headers]
            try:
                self.active_segment.append([buf], placed, expected, now)
            except StorageError:
                self._go_offline_if_inconsistent()
                raise
            max_ts, offset_of_max, records = NO_TIMESTAMP, first, 0
            for _, h in headers:
                self.epoch_cache.assign(h.partition_leader_epoch, h.base_offset)
                records += h.record_count
                if h.max_timestamp > max_ts:
                    max_ts, offset_of_max = h.max_timestamp, h.base_offset
            self._note_unflushed(records, now)
            return AppendInfo(
                first,
                expected - 1,
                max_ts,
                offset_of_max,
                -1,
                self.log_start_offset,
                records,
                len(headers),
                buf.nbytes,
            )

    def _note_gaps_below(self, offset: int) -> None:
        """A follower append with offset gaps (compacted batches from the leader): make it
        durable that the active segment may have gaps before they are written, so recovery
        does not cut them as damage."""
        checkpoint = read_cleaner_checkpoint(self.directory)
        if checkpoint.gaps_below < offset:
            write_cleaner_checkpoint(
                self.directory, CleanerCheckpoint(checkpoint.first_dirty, offset)
            )
        self.active_segment.may_have_gaps = True

    def _go_offline_if_inconsistent(self) -> None:
        """After a failed write that could not be cut back, the file no longer matches the
        in-memory state: refuse further use (Kafka takes the log directory offline)."""
        active = self.active_segment
        try:
            consistent = os.fstat(active.fd).st_size == active.size
        except OSError:
            consistent = False
        if not consistent:
            log.error(
                "partition log %s is inconsistent after a write error: offline", self.directory
            )
            self._close_segments()
            self.closed = True

    def _validate(
        self, buf: memoryview, *, leader: bool, check_crc: bool = True
    ) -> list[tuple[int, BatchHeader]]:
        if buf.nbytes == 0:
            raise InvalidRecordError(f"append to {self.directory} carries no batch")
        headers = []
        pos = 0
        limit = self.config.max_message_bytes if leader else None
        while pos < buf.nbytes:
            h = validate_batch(buf, pos, limit) if check_crc else check_structure(buf, pos, limit)
            if leader and (h.record_count == 0 or h.record_count != h.last_offset_delta + 1):
                raise InvalidRecordError(
                    f"batch at position {pos} has {h.record_count} records but last offset "
                    f"delta {h.last_offset_delta}"
                )
            headers.append((pos, h))
            pos += h.size
        if leader and self.config.compact:
            self._refuse_keyless(buf, headers)
        return headers

    def _refuse_keyless(self, buf: memoryview, headers: list[tuple[int, BatchHeader]]) -> None:
        """Kafka's rule for a compacted topic: a record without a key cannot be compacted, so
        the produce is refused (INVALID_RECORD). The one place the log decodes records."""
        for pos, h in headers:
            if h.is_control:
                continue
            for offset_delta, (_, _, key, _, _) in enumerate(RecordBatch(buf, pos).record_tuples()):
                if key is None:
                    raise InvalidRecordError(
                        f"compacted topic {self.directory.name} cannot accept a record without "
                        f"a key (record {offset_delta} of the batch at position {pos})"
                    )

    def _roll_for_append(
        self, size: int, first_offset: int, headers: list[tuple[int, BatchHeader]], now_ms: int
    ) -> None:
        """:meth:`_maybe_roll_for`, with a failed roll (a full disk: the sealed indexes or the
        new segment's files cannot be written) raised as StorageError like a failed write, so
        the broker answers KAFKA_STORAGE_ERROR and reports the disk instead of logging a
        traceback per request. Nothing was appended; a later append rolls again."""
        try:
            self._maybe_roll_for(size, first_offset, headers, now_ms)
        except OSError as e:
            raise StorageError(f"rolling a new segment of {self.directory} failed: {e}") from e

    def _maybe_roll_for(
        self, size: int, first_offset: int, headers: list[tuple[int, BatchHeader]], now_ms: int
    ) -> None:
        active = self.active_segment
        last_offset = first_offset + sum(h.last_offset_delta + 1 for _, h in headers) - 1
        if active.is_empty:
            return
        if (
            active.size + size > self.config.segment_bytes
            or now_ms - active.created_ms >= self.config.segment_ms
            or active.offset_index.is_full
            or active.time_index.is_full
            or last_offset - active.base_offset > MAX_RELATIVE_OFFSET
        ):
            self._roll(now_ms)

    def _roll(self, now_ms: int) -> None:
        old = self.active_segment
        old.seal()
        self._unsynced_segments.append(old)
        self._add_segment(self._new_segment(old.next_offset, now_ms))

    def maybe_roll(self, now_ms: int | None = None) -> bool:
        """Roll a non-empty active segment older than segment.ms; returns whether it rolled."""
        now = wall_clock_ms() if now_ms is None else now_ms
        with self._lock:
            self._check_open()
            active = self.active_segment
            if active.is_empty or now - active.created_ms < self.config.segment_ms:
                return False
            self._roll(now)
            return True

    def roll_due(self, now_ms: int) -> bool:
        """Whether :meth:`maybe_roll` would roll now: a lock-free check the broker makes on
        its event loop before handing the roll to a worker thread (which checks again)."""
        active = self.active_segment
        return not active.is_empty and now_ms - active.created_ms >= self.config.segment_ms

    def retention_may_delete(self) -> bool:
        """Whether :meth:`apply_retention` could delete anything (a closed segment exists and
        the policy deletes): a lock-free check made before handing it to a worker thread."""
        return self.config.delete and len(self._segments) > 1

    def roll(self, now_ms: int | None = None) -> None:
        """Start a new active segment now (no-op when the active one is empty)."""
        with self._lock:
            self._check_open()
            if not self.active_segment.is_empty:
                self._roll(wall_clock_ms() if now_ms is None else now_ms)

    def _note_unflushed(self, records: int, now_ms: int) -> None:
        self._unflushed_records += records
        if self._first_unflushed_ms is None:
            self._first_unflushed_ms = now_ms

    # ---- reading -------------------------------------------------------------------------

    def segment_for(self, offset: int) -> LogSegment:
        """The segment whose range holds ``offset`` (bisect on the base offsets)."""
        return self._segments[max(0, bisect.bisect_right(self._bases, offset) - 1)]

    def readable_bytes_bound(self, offset: int) -> int:
        """At least as many bytes as :meth:`read` or :meth:`read_region` from ``offset`` can
        return, whatever their limits: the bytes from the index entry at or below ``offset``
        to the end of the segment holding it (a read never crosses a segment). No scan: a
        bisection of the segments and of that segment's index; 0 at or past the log end."""
        with self._lock:
            if self.closed or offset >= self.log_end_offset:
                return 0
            segment = self.segment_for(offset)
            _, position = segment.offset_index.lookup(offset)
            return max(0, segment.size - position)

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        """Raw batches from the one that holds ``offset``: whole batches up to ``max_bytes``
        (the first one whole even when larger, as Kafka does), none that starts at or after
        ``max_offset`` (the high watermark) and at most to the end of that segment.
        Empty at the log end. Raises :class:`OffsetOutOfRangeError` outside
        ``[log_start_offset, log_end_offset]``."""
        data = self._read(offset, max_bytes, max_offset, as_region=False)
        assert isinstance(data, bytes)
        return data

    def read_region(
        self, offset: int, max_bytes: int, max_offset: int | None = None
    ) -> FileRegion | bytes:
        """What :meth:`read` returns, as the place in the segment file where those bytes are
        (a :class:`FileRegion` holding its own descriptor, for ``sendfile``) when the segment
        was verified in this process; else (its batches must be checked as they are read)
        the bytes themselves."""
        return self._read(offset, max_bytes, max_offset, as_region=True)

    def serves_regions_at(self, offset: int) -> bool:
        """Whether :meth:`read_region` at ``offset`` would give a region rather than bytes
        (its segment was verified in this process). Lock-free, so only a guess while the
        segments change (a roll, retention, truncation in another thread)."""
        try:
            return bool(self.segment_for(offset).verified)
        except IndexError:
            return False

    def _read(
        self, offset: int, max_bytes: int, max_offset: int | None, *, as_region: bool
    ) -> FileRegion | bytes:
        with self._lock:
            self._check_open()
            if offset < self.log_start_offset or offset > self.log_end_offset:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is outside [{self.log_start_offset}, "
                    f"{self.log_end_offset}] of {self.directory}"
                )
            damage = self.damage
            if damage is not None:
                if damage.covers(offset):
                    raise LogDamagedError(f"{self.directory.name}: offset {offset}: "
                                          f"{damage.reason}", offset=damage.offset)
                if offset < damage.offset:
                    max_offset = damage.offset if max_offset is None else min(
                        max_offset, damage.offset)
            if offset == self.log_end_offset or (max_offset is not None and offset >= max_offset):
                return b""
            segment = self.segment_for(offset)
            found = segment.locate(offset)
            if found is None:
                return b""
            start, first = found
            end = segment.size
            if max_offset is not None and max_offset < segment.next_offset:
                end = segment.position_before(max_offset)
                if end <= start:
                    return b""
            if max_bytes < end - start:
                end = max(
                    segment.last_boundary_within(start, start + max_bytes), start + first.size
                )
            if as_region and segment.verified:
                return FileRegion(os.dup(segment.fd), start, end - start, segment.offset_at(end))
            data = segment.read(start, end)
            if segment.verified:
                return data
            # Not verified in this process yet (loaded from disk, not scrubbed): never serve a
            # damaged batch; serve the intact ones before it.
            check = check_batches(data, first.base_offset, final=True,
                                  allow_gaps=segment.may_have_gaps)
            if check.damage is None:
                return data
            self.note_damage(check.damage)
            if check.valid_bytes == 0:
                raise LogDamagedError(f"{self.directory.name}: offset {offset}: "
                                      f"{check.damage.reason}", offset=check.damage.offset)
            return data[: check.valid_bytes]

    def note_damage(self, damage: LogDamage) -> bool:
        """Remember a damaged batch (the lowest one wins); returns whether it is new."""
        with self._lock:
            if self.damage is not None and self.damage.offset <= damage.offset:
                return False
            if damage.offset >= self.log_end_offset:
                return False  # truncated away meanwhile
            self.damage = damage
            return True

    def distrust(self, offset: int) -> None:
        """Reads of the segment holding ``offset`` check CRCs again (a follower reported that a
        batch we sent it from there failed its check)."""
        with self._lock:
            if self.log_start_offset <= offset < self.log_end_offset:
                self.segment_for(offset).verified = False

    def closed_segments(self) -> list[LogSegment]:
        """Every segment but the active one (those the scrubber verifies)."""
        with self._lock:
            return self._segments[:-1]

    def still_holds(self, segment: LogSegment, size: int) -> bool:
        """Whether ``segment`` is still a closed segment of this log with ``size`` bytes (a
        scrub result about it still means something)."""
        with self._lock:
            return (not self.closed and not segment.closed and segment.size == size
                    and segment in self._segments[:-1])

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """``(offset, max timestamp)`` of the first batch whose max timestamp is >=
        ``timestamp``, or None when there is none. Batch granularity: the log never decodes
        records, so the offset is that batch's base offset (or the log start when later)."""
        with self._lock:
            self._check_open()
            for segment in self._segments:
                if segment.max_timestamp < timestamp or segment.is_empty:
                    continue
                scan_from = segment.time_index.lookup(timestamp)
                found = segment.locate(max(scan_from, segment.base_offset))
                start = found[0] if found is not None else 0
                for _, h in segment.iter_headers(start, segment.size):
                    if h.max_timestamp >= timestamp and h.next_offset > self.log_start_offset:
                        return max(h.base_offset, self.log_start_offset), h.max_timestamp
            return None

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch: ``(largest epoch <= epoch, its end offset)``, or
        ``(-1, -1)`` when unknown (see :meth:`LeaderEpochCache.end_offset_for`)."""
        with self._lock:
            return self.epoch_cache.end_offset_for(epoch, self.log_end_offset)

    # ---- aborted transactions (the segments' .txnindex files) ------------------------------

    def add_aborted_txn(
        self, producer_id: int, first_offset: int, last_offset: int, last_stable_offset: int
    ) -> bool:
        """Record an aborted transaction in the ``.txnindex`` of the segment holding its ABORT
        marker (``last_offset``, already in the log). Returns False when that entry is already
        there (the producer state replays markers at start-up)."""
        with self._lock:
            self._check_open()
            entry = AbortedTxn(last_offset, producer_id, first_offset, last_stable_offset)
            return self.segment_for(last_offset).txn_index.append(entry)

    def aborted_transactions(self, fetch_offset: int, upper: int) -> list[tuple[int, int]]:
        """``(producer id, first offset)`` of every aborted transaction overlapping
        ``[fetch_offset, upper)``: marker at or after ``fetch_offset``, first offset below
        ``upper`` (Kafka's collectAbortedTxns; searched from the segment holding
        ``fetch_offset`` on, stopping once an entry's last stable offset reaches ``upper``)."""
        return [(t.producer_id, t.first_offset) for t in self.aborted_txns(fetch_offset, upper)]

    def aborted_txns(self, fetch_offset: int, upper: int) -> list[AbortedTxn]:
        """The ``.txnindex`` entries behind :meth:`aborted_transactions`."""
        found: list[AbortedTxn] = []
        with self._lock:
            start = bisect.bisect_right(self._bases, fetch_offset) - 1
            for segment in self._segments[max(0, start):]:
                entries, complete = segment.txn_index.collect(fetch_offset, upper)
                found.extend(entries)
                if complete:
                    break
        return found

    def batch_header_at(self, offset: int) -> BatchHeader | None:
        """The header of the batch that holds ``offset`` (None past the end)."""
        with self._lock:
            found = self.segment_for(offset).locate(offset)
            return None if found is None else found[1]

    # ---- shrinking -----------------------------------------------------------------------

    def truncate_to(self, offset: int, now_ms: int | None = None) -> None:
        """Remove every batch at or after the one holding ``offset`` (a follower truncating to
        the divergence point). Below the log start: the log is emptied and restarts at
        ``offset``. A no-op at or past the log end."""
        now = wall_clock_ms() if now_ms is None else now_ms
        with self._lock:
            self._check_open()
            if offset >= self.log_end_offset:
                return
            if offset < self.log_start_offset:
                self.truncate_fully_and_start_at(offset, now)
                return
            self._generation += 1
            while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
                self._forget(self._segments.pop())
                self._bases.pop()
            self.active_segment.truncate_to(offset)
            if self.damage is not None and self.log_end_offset <= self.damage.offset:
                self.damage = None
            self.epoch_cache.truncate_from_end(self.log_end_offset)
            self.recovery_point = min(self.recovery_point, self.log_end_offset)
            # Rewritten only when it changes: a follower truncating its unflushed tail (every
            # partition of a broker restarted after a crash) leaves it as it is, and each
            # rewrite is a file creation and a rename on the event loop.
            if (self.recovery_point, self.log_start_offset) != self._checkpoint_on_disk:
                self._write_partition_checkpoint(sync=False)
            self._truncate_cleaner_checkpoint(self.log_end_offset)

    def _truncate_cleaner_checkpoint(self, end: int) -> None:
        """Offsets written anew after a truncation are dirty again (Kafka's
        maybeTruncateCheckpoint): without this the cleaner would take them as already clean and
        leave their keys' older values in place."""
        checkpoint = read_cleaner_checkpoint(self.directory)
        if checkpoint.first_dirty > end:
            write_cleaner_checkpoint(self.directory, CleanerCheckpoint(end, checkpoint.gaps_below))

    def truncate_fully_and_start_at(self, offset: int, now_ms: int | None = None) -> None:
        """Drop every segment and restart the log, empty, at ``offset`` (Kafka's
        truncateFullyAndStartAt): a follower whose log end fell below the leader's log start
        (retention ran on the leader while it was away) can only continue from there."""
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot restart {self.directory} at offset {offset}")
        now = wall_clock_ms() if now_ms is None else now_ms
        with self._lock:
            self._check_open()
            self._generation += 1
            for segment in self._segments:
                self._forget(segment)
            self._segments.clear()
            self._bases.clear()
            self._add_segment(self._new_segment(offset, now))
            self.log_start_offset = offset
            self.damage = None
            self.epoch_cache.clear()
            self.recovery_point = offset
            self._write_partition_checkpoint(sync=False)

    def delete_records(self, before_offset: int) -> int:
        """Move the log start offset up to ``before_offset`` (Kafka's DeleteRecords) and delete
        the segments wholly below it; returns the new log start offset."""
        with self._lock:
            self._check_open()
            if before_offset > self.log_end_offset or before_offset < 0:
                raise OffsetOutOfRangeError(
                    f"delete-records offset {before_offset} is outside [0, "
                    f"{self.log_end_offset}] of {self.directory}"
                )
            if before_offset > self.log_start_offset:
                self.log_start_offset = before_offset
                self._delete_segments_below_start()
                self.epoch_cache.truncate_from_start(self.log_start_offset)
                self._write_partition_checkpoint(sync=False)
            return self.log_start_offset

    def _delete_segments_below_start(self) -> int:
        deleted = 0
        while len(self._segments) > 1 and self._segments[1].base_offset <= self.log_start_offset:
            self._forget(self._segments.pop(0))
            self._bases.pop(0)
            deleted += 1
        return deleted

    def apply_retention(self, now_ms: int | None = None, max_offset: int | None = None) -> int:
        """Delete the oldest whole segments that retention.ms or retention.bytes condemn (never
        the active one, none holding offsets at or above ``max_offset``, the high watermark);
        moves the log start offset. Returns how many segments were deleted. Nothing when the
        cleanup.policy lacks delete (a compacted topic keeps every live key)."""
        now = wall_clock_ms() if now_ms is None else now_ms
        with self._lock:
            self._check_open()
            if not self.config.delete:
                return 0
            retention_ms, retention_bytes = self.config.retention_ms, self.config.retention_bytes
            excess = self.size_in_bytes - retention_bytes if retention_bytes >= 0 else -1
            deleted = 0
            while len(self._segments) > 1:
                oldest = self._segments[0]
                if max_offset is not None and oldest.next_offset > max_offset:
                    break
                by_time = retention_ms >= 0 and now - oldest.max_timestamp > retention_ms
                by_size = retention_bytes >= 0 and excess - oldest.size >= 0
                if not (by_time or by_size):
                    break
                excess -= oldest.size
                self._forget(self._segments.pop(0))
                self._bases.pop(0)
                deleted += 1
            if deleted:
                self._generation += 1
                self.log_start_offset = max(self.log_start_offset, self._segments[0].base_offset)
                self.epoch_cache.truncate_from_start(self.log_start_offset)
                self._write_partition_checkpoint(sync=False)
            return deleted

    def _forget(self, segment: LogSegment) -> None:
        if segment in self._unsynced_segments:
            self._unsynced_segments.remove(segment)
        segment.delete()

    # ---- durability ----------------------------------------------------------------------

    def needs_flush(self, now_ms: int | None = None) -> bool:
        """Whether flush.messages or flush.ms asks for an fsync now, or a rolled segment is
        still unsynced (the broker then calls :meth:`flush` in a worker thread)."""
        if not self._unsynced_segments and self._first_unflushed_ms is None:
            return False  # the idle case, without the lock (one call per partition per second)
        now = wall_clock_ms() if now_ms is None else now_ms
        with self._lock:
            if self._unsynced_segments:
                return True
            if self._first_unflushed_ms is None:
                return False
            return (
                self._unflushed_records >= self.config.flush_messages
                or now - self._first_unflushed_ms >= self.config.flush_ms
            )

    @property
    def unflushed_records(self) -> int:
        return self._unflushed_records

    def flush(self) -> int:
        """fsync every segment written since the last flush, with its indexes, then move the
        recovery point to the log end captured at the start and persist it. Thread-safe; may
        run in a worker thread while the event loop appends. Returns the new recovery point."""
        with self._flush_lock:
            with self._lock:
                if self.closed:
                    return self.recovery_point
                target = self.log_end_offset
                generation = self._generation
                pending = [s for s in (*self._recovered_unsynced, *self._unsynced_segments)
                           if not s.closed]
                if self.active_segment not in pending:
                    pending.append(self.active_segment)
                fds = []
                for segment in pending:
                    segment.write_pending_indexes()
                    fds.append((os.dup(segment.fd), segment))
                flushed_records = self._unflushed_records
            try:
                for fd, segment in fds:
                    os.fsync(fd)
                    segment.offset_index.fsync()
                    segment.time_index.fsync()
                self.epoch_cache.sync()
            finally:
                for fd, _ in fds:
                    os.close(fd)
            with self._lock:
                for _, segment in fds:
                    if segment in self._unsynced_segments:
                        self._unsynced_segments.remove(segment)
                    if segment in self._recovered_unsynced:
                        self._recovered_unsynced.remove(segment)
                self._unflushed_records -= flushed_records
                if self._unflushed_records <= 0:
                    self._unflushed_records = 0
                    self._first_unflushed_ms = None
                before = self.recovery_point
                if generation == self._generation and not self.closed:
                    self.recovery_point = max(self.recovery_point, target)
                else:
                    self.recovery_point = min(self.recovery_point, self.log_end_offset)
                changed = self.recovery_point != before or self._checkpoint_unsynced
                if changed and not self.closed:
                    self._write_partition_checkpoint(sync=False)
                self._checkpoint_unsynced = False  # a later write sets it again
            if changed:
                sync_file(self.directory / defaults.PARTITION_CHECKPOINT)
            return self.recovery_point

    def close(self) -> None:
        """Flush everything, write the checkpoints and the clean-shutdown marker, and release
        the files. Idempotent."""
        if self.closed:
            return
        self.flush()
        with self._lock:
            for segment in self._segments:
                segment.seal()
                segment.fsync()
            self.recovery_point = self.log_end_offset
            self._write_partition_checkpoint(sync=True)
            self.epoch_cache.sync()  # raises when it cannot be written: no marker over a stale file
            marker = self.directory / defaults.CLEAN_SHUTDOWN_MARKER
            marker.touch()
            sync_directory(self.directory)
            self._close_segments()
            self.closed = True

    def _close_segments(self) -> None:
        for segment in self._segments:
            segment.close()

    def abandon(self) -> None:
        """Release the files without flushing or marking a clean shutdown: what a crash leaves
        behind (the next open recovers). For tests and the demo."""
        with self._lock:
            self._close_segments()
            self.closed = True

    def __repr__(self) -> str:
        return (
            f"PartitionLog({str(self.directory)!r}, start={self.log_start_offset}, "
            f"end={self.log_end_offset}, segments={len(self._segments)})"
        )
