"""One segment of a partition log: a ``.log`` file of batches, its two sparse indexes and its
aborted-transactions index."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from fjord.errors import CorruptRecordError, StorageError
from fjord.records.header import BATCH_HEADER_SIZE, BatchHeader, parse_header, validate_batch
from fjord.storage import defaults
from fjord.storage.disk_health import is_out_of_space
from fjord.storage.index import OffsetIndex, TimeIndex
from fjord.storage.txn_index import TransactionIndex

NO_TIMESTAMP = -1
_IOV_MAX = os.sysconf("SC_IOV_MAX")  # most buffers one writev takes (1024 on Linux)


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:0{defaults.OFFSET_DIGITS}d}{suffix}"


def write_fully(fd: int, buffers: Sequence[bytes | bytearray | memoryview]) -> None:
    """``os.writev`` until every byte is written (writev may write less than asked)."""
    pending = [memoryview(b) for b in buffers if len(b)]
    while pending:
        written = os.writev(fd, pending[:_IOV_MAX])
        while written and pending:
            if written >= len(pending[0]):
                written -= len(pending[0])
                pending.pop(0)
            else:
                pending[0] = pending[0][written:]
                written = 0


class LogSegment:
    """A ``<base offset>.log`` file plus its ``.index`` and ``.timeindex``, and its
    ``.txnindex`` (:class:`~fjord.storage.txn_index.TransactionIndex`: the aborted transactions
    whose ABORT marker is in this segment; no file while there is none).

    On-disk format of ``.log``: RecordBatch v2 batches back to back, exactly as produced (with
    base offset and partition leader epoch stamped), nothing else: no segment header or footer.

    Invariants: the batches are contiguous in offsets, the first starts at ``base_offset``
    (unless ``may_have_gaps``: the log cleaner dropped batches, so offsets only increase; it
    always keeps a segment's last batch, so the segment still ends where it ended; an empty
    segment has ``next_offset == base_offset``), ``size`` is the file length and ends at a
    batch boundary, ``max_timestamp`` is the largest batch max timestamp in the file (-1 when
    empty) and every offset index entry names a batch start. A segment knows nothing of other
    segments; the :class:`~fjord.storage.log.PartitionLog` owns those rules.
    """

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        index_interval_bytes: int,
        max_index_bytes: int,
        fd: int,
        now_ms: int,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.fd = fd
        self.size = os.fstat(fd).st_size
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = base_offset
        self.created_ms = now_ms
        """When the segment got its first batch (or was created): the segment.ms clock."""
        self.bytes_since_index_entry = 0
        self.offset_index = OffsetIndex(
            self.path(defaults.INDEX_SUFFIX), base_offset, max_index_bytes // 8
        )
        self.time_index = TimeIndex(
            self.path(defaults.TIME_INDEX_SUFFIX), base_offset, max_index_bytes // 12
        )
        self.txn_index = TransactionIndex(self.path(defaults.TXN_INDEX_SUFFIX))
        self.closed = False
        #: Every batch in the file passed its CRC check in this process: written here (appends
        #: are checked), recovered, or scrubbed. Reads of an unverified segment check the CRCs
        #: of what they return (see PartitionLog.read) until the scrubber has verified it.
        self.verified = False
        #: The log cleaner may have rewritten this segment (or a follower copied a compacted
        #: one): offsets may have gaps between batches. Otherwise a gap is damage (a flipped
        #: base offset, which the CRC does not cover).
        self.may_have_gaps = False

    # ---- opening -------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        base_offset: int,
        index_interval_bytes: int,
        max_index_bytes: int,
        now_ms: int,
        *,
        create: bool,
    ) -> LogSegment:
        path = directory / segment_file_name(base_offset, defaults.LOG_SUFFIX)
        flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT | os.O_TRUNC if create else 0)
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as e:
            raise StorageError(f"cannot open segment {path}: {e}") from e
        segment = cls(directory, base_offset, index_interval_bytes, max_index_bytes, fd, now_ms)
        if create:
            for index in (segment.offset_index, segment.time_index):
                index.rewrite()
            segment.txn_index.delete()  # a left-over of an earlier segment at this base
            segment.verified = True
        return segment

    def path(self, suffix: str) -> Path:
        return self.directory / segment_file_name(self.base_offset, suffix)

    def load_trusted(self) -> bool:
        """Load a segment that needs no recovery: read both indexes (rebuilding them from the
        batch headers when missing or failing their checks) and find the end state by scanning
        the headers after the last index entry. Returns False when the file does not end on a
        batch boundary or a header is malformed: the caller must :meth:`recover` it."""
        if not self.offset_index.load(self.size):
            return self._rebuild_indexes()
        if not self.time_index.load(2**32 - 1):
            self.time_index.clear()
            return self._rebuild_indexes()
        offset, position = self.offset_index.last_entry
        try:
            headers = list(self.iter_headers(position, self.size))
        except CorruptRecordError:
            return False
        first = headers[0][1].base_offset if headers else offset
        if first < offset or (position and first != offset):  # see locate
            return self._rebuild_indexes()
        self.max_timestamp = self.time_index.last_timestamp
        if self.time_index.timestamps:
            self.offset_of_max_timestamp = self.base_offset + self.time_index.relative_offsets[-1]
        self._absorb_tail(headers, position)
        self._init_roll_clock()
        return True

    def _absorb_tail(self, headers: list[tuple[int, BatchHeader]], start: int) -> None:
        end = start
        for pos, header in headers:
            self._note_batch(header.base_offset, header.max_timestamp)
            self.next_offset = header.next_offset
            end = pos + header.size
        self.bytes_since_index_entry = end - start

    def _init_roll_clock(self) -> None:
        """After loading, segment.ms counts from the first batch's max timestamp (Kafka's
        rule), or from the load time when it has none."""
        if self.size:
            first = parse_header(os.pread(self.fd, BATCH_HEADER_SIZE, 0))
            if first.max_timestamp >= 0:
                self.created_ms = first.max_timestamp

    def _rebuild_indexes(self) -> bool:
        """Rebuild both indexes from the batch headers (no CRC check: the data is trusted)."""
        self.offset_index.clear()
        self.time_index.clear()
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = self.base_offset
        self.next_offset = self.base_offset
        self.bytes_since_index_entry = 0
        try:
            for pos, header in self.iter_headers(0, self.size):
                if not self._follows(header.base_offset):
                    return False
                self._index_batch(pos, header.base_offset, header.max_timestamp, header.size)
                self.next_offset = header.next_offset
        except CorruptRecordError:
            return False
        self.offset_index.rewrite()
        self.time_index.rewrite()
        self._init_roll_clock()
        return True

    def _follows(self, base_offset: int) -> bool:
        """Whether a batch at ``base_offset`` may come next (see ``may_have_gaps``)."""
        if self.may_have_gaps:
            return base_offset >= self.next_offset
        return base_offset == self.next_offset

    def recover(self, on_batch: Callable[[BatchHeader], object]) -> int:
        """Validate every batch (length, CRC, offsets increasing from ``base_offset``), rebuild
        both indexes, and cut the file at the first bad byte. Returns the bytes cut off."""
        self.offset_index.clear()
        self.time_index.clear()
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = self.base_offset
        self.next_offset = self.base_offset
        self.bytes_since_index_entry = 0
        valid_end = 0
        pos = 0
        buf = b""
        buf_start = 0
        while pos < self.size:
            rel = pos - buf_start
            if len(buf) - rel < BATCH_HEADER_SIZE:
                buf = os.pread(self.fd, defaults.RECOVERY_READ_BYTES, pos)
                buf_start, rel = pos, 0
            try:
                header = parse_header(buf, rel)
                if rel + header.size > len(buf) and pos + header.size <= self.size:
                    buf = os.pread(self.fd, max(header.size, defaults.RECOVERY_READ_BYTES), pos)
                    buf_start, rel = pos, 0
                validate_batch(buf, rel)
            except CorruptRecordError:
                break
            if not self._follows(header.base_offset):
                break
            on_batch(header)
            self._index_batch(pos, header.base_offset, header.max_timestamp, header.size)
            self.next_offset = header.next_offset
            pos += header.size
            valid_end = pos
        cut = self.size - valid_end
        if cut:
            os.ftruncate(self.fd, valid_end)
            self.size = valid_end
        self.verified = True
        for index in (self.offset_index, self.time_index):
            try:
                index.rewrite()
            except OSError as e:  # a full disk: a prefix of a sparse index is still valid
                if not is_out_of_space(e):
                    raise
        self._init_roll_clock()
        return cut

    # ---- appending -----------------------------------------------------------------------

    def _note_batch(self, base_offset: int, max_timestamp: int) -> None:
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = base_offset

    def _index_batch(self, position: int, base_offset: int, max_timestamp: int, size: int) -> None:
        """Account one batch written at ``position`` in the indexes (Kafka's rule: an entry when
        more than index.interval.bytes were appended since the previous one)."""
        self._note_batch(base_offset, max_timestamp)
        if self.bytes_since_index_entry > self.index_interval_bytes:
            self.offset_index.append(base_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self.bytes_since_index_entry = 0
        self.bytes_since_index_entry += size

    def append(
        self,
        buffers: Sequence[bytes | bytearray | memoryview],
        batches: Sequence[tuple[int, int, int, int]],
        next_offset: int,
        now_ms: int,
        before_commit: Callable[[], object] | None = None,
    ) -> None:
        """Write ``buffers`` (whole batches) at the end of the file in one writev and index
        them. ``batches`` lists ``(relative position, base offset, max timestamp, size)``.
        ``before_commit`` runs after the write; if it raises, the write is cut back and the
        exception propagates. On a write error the file is cut back too (StorageError), so no
        partial batch stays behind."""
        start = self.size
        try:
            write_fully(self.fd, buffers)
            if before_commit is not None:
                try:
                    before_commit()
                except Exception:
                    os.ftruncate(self.fd, start)
                    raise
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, start)
            raise StorageError(f"write to {self.path(defaults.LOG_SUFFIX)} failed: {e}") from e
        if start == 0:
            self.created_ms = now_ms
        for rel, base_offset, max_timestamp, size in batches:
            self._index_batch(start + rel, base_offset, max_timestamp, size)
        last = batches[-1]
        self.size = start + last[0] + last[3]
        self.next_offset = next_offset

    # ---- reading -------------------------------------------------------------------------

    def iter_headers(self, start: int, end: int) -> Iterator[tuple[int, BatchHeader]]:
        """Yield ``(position, header)`` of the batches in ``[start, end)`` reading headers only
        (no CRC). Raises CorruptRecordError on a malformed header or one that overruns ``end``."""
        pos = start
        while pos < end:
            header = parse_header(os.pread(self.fd, BATCH_HEADER_SIZE, pos))
            if pos + header.size > end:
                raise CorruptRecordError(
                    f"batch at position {pos} of {self.path(defaults.LOG_SUFFIX)} overruns the "
                    f"segment end {end}"
                )
            yield pos, header
            pos += header.size

    def locate(self, offset: int) -> tuple[int, BatchHeader] | None:
        """``(position, header)`` of the batch that holds ``offset``, or None when ``offset`` is
        at or past ``next_offset``. Lookup: bisect the index, then scan forward."""
        if offset >= self.next_offset:
            return None
        for attempt in range(2):
            entry_offset, position = self.offset_index.lookup(offset)
            first = True
            try:
                for pos, header in self.iter_headers(position, self.size):
                    # An entry names a batch start; position 0 (no entry) is the segment's first
                    # batch, which starts after the base offset when the cleaner dropped some.
                    if first and (header.base_offset < entry_offset
                                  or (position and header.base_offset != entry_offset)):
                        raise CorruptRecordError("index entry does not name a batch start")
                    first = False
                    if header.next_offset > offset:
                        return pos, header
            except CorruptRecordError:
                if attempt or not self._rebuild_indexes():
                    raise StorageError(
                        f"segment {self.path(defaults.LOG_SUFFIX)} is corrupt near position "
                        f"{position}"
                    ) from None
                continue
            return None
        return None

    def position_before(self, offset: int) -> int:
        """Position of the batch holding ``offset``, or ``size`` when beyond the segment."""
        found = self.locate(offset)
        return self.size if found is None else found[0]

    def last_boundary_within(self, start: int, limit: int) -> int:
        """The end of the last whole batch that starts at or after ``start`` and ends at or
        before ``limit`` (``start`` itself when the first batch is larger). Short scan from the
        index entry nearest below ``limit``."""
        if limit >= self.size:
            return self.size
        _, position = self.offset_index.lookup_position(limit)
        pos = max(position, start)
        for p, header in self.iter_headers(pos, self.size):
            if p + header.size > limit:
                return p
        return self.size

    def read(self, start: int, end: int) -> bytes:
        return os.pread(self.fd, end - start, start)

    def offset_at(self, position: int) -> int:
        """The offset after the batches that end at ``position`` (a batch boundary): the base
        offset of the batch starting there, ``next_offset`` at the end."""
        if position >= self.size:
            return self.next_offset
        return parse_header(os.pread(self.fd, BATCH_HEADER_SIZE, position)).base_offset

    # ---- changing ------------------------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Remove the batch holding ``offset`` and every later one; returns bytes removed."""
        found = self.locate(offset)
        if found is None:
            return 0
        position, header = found
        removed = self.size - position
        os.ftruncate(self.fd, position)
        self.size = position
        self.offset_index.truncate_to_offset(header.base_offset)
        self.time_index.truncate_to_offset(header.base_offset)
        self.txn_index.truncate_to(header.base_offset)
        self.max_timestamp = self.time_index.last_timestamp
        self.offset_of_max_timestamp = (
            self.base_offset + self.time_index.relative_offsets[-1]
            if self.time_index.timestamps
            else self.base_offset
        )
        self.next_offset = self.base_offset
        start_offset, start = self.offset_index.last_entry
        headers = list(self.iter_headers(start, self.size))
        self.next_offset = start_offset
        self._absorb_tail(headers, start)
        return removed

    def seal(self) -> None:
        """The segment stops being active: record its final max timestamp in the time index and
        write pending index entries (Kafka's onBecomeInactiveSegment)."""
        self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
        self.write_pending_indexes()

    def write_pending_indexes(self) -> None:
        self.offset_index.write_pending()
        self.time_index.write_pending()

    def fsync(self) -> None:
        os.fsync(self.fd)
        self.offset_index.fsync()
        self.time_index.fsync()
        self.txn_index.fsync()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)

    def delete(self) -> None:
        self.close()
        for suffix in (defaults.LOG_SUFFIX, defaults.INDEX_SUFFIX, defaults.TIME_INDEX_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                self.path(suffix).unlink()
        self.txn_index.delete()

    @property
    def is_empty(self) -> bool:
        return self.size == 0
