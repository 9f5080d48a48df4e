"""Log compaction, pure: which records of a log's cleanable section survive a clean (Kafka's
LogCleaner rules), over bytes the storage layer passes in. No file is opened here.

Terms (Kafka's): the log from its start to the *first dirty offset* (the cleaner checkpoint)
is the *clean* section, already compacted: each key appears there once at most. From the first
dirty offset to the *cleanable end* is the *dirty* section: what this clean compacts. The
cleanable end is a segment boundary at or before the active segment's base (the active
segment is never touched), earlier when ``min.compaction.lag.ms`` holds segments back. After a
clean the whole range ``[log start, cleanable end)`` is clean and the checkpoint moves to the
cleanable end.

A clean is two passes: :func:`build_bounded_offset_map` over the dirty section gives each key's
last offset there (bounded: when the map fills, the clean ends at that batch, Kafka's rounds);
:func:`clean_segment` then rewrites each segment of ``[log start, cleanable end)`` keeping a
record iff

- it has a key (a keyless record cannot be compacted; the produce path refuses them on a
  compacted topic, as Kafka does, so only records written before the topic became compacted
  can meet this rule: they are dropped, as Kafka's cleaner drops them, and counted), and
- it is the last record of its key (its offset is at least the key's offset in the map; a key
  absent from the map lives only in the clean section, where it is already unique), and
- it is not a tombstone (null value) whose segment's tombstone horizon has passed: tombstones
  stay ``delete.retention.ms`` after the segment's largest timestamp
  (:func:`tombstones_expired`), so consumers that read within that time see the delete.

Batches: a batch whose records all survive is copied byte for byte; one that lost some is
re-encoded by :func:`fjord.records.rebuild_batch` with the same base offset, last offset delta,
producer id / epoch / base sequence and attributes (offsets keep their gaps; the producer's
last sequence is unchanged). A batch that lost every record disappears, except the last batch
of a producer id in the whole log, which stays as a header-only batch (record count 0) so the
producer's sequence state survives (Kafka's ``RETAIN_EMPTY``).

Transactions (Kafka's cleaner rules, the part Fjord applies): the cleanable end never passes the
partition's last stable offset (the broker passes it), so every transaction below it is
complete; records of aborted transactions (``aborted``: the ``.txnindex`` entries, producer id
-> ``(first offset, marker offset)`` ranges) are dropped and never enter the offset map, so an
aborted write can never displace a committed value of its key; committed transactional records
are compacted like any other. A COMMIT marker is removed, as Kafka's cleaner removes it, once
no batch of its transaction is left (not even an emptied one: :class:`TransactionTracker`,
across the segments of one clean in log order), its segment's ``delete.retention.ms`` horizon
has passed (the tombstone rule) and it is neither its producer's last batch (the producer state)
nor its segment's last batch (contiguity). ABORT markers are always kept: each has an entry in
its segment's ``.txnindex``, which the cleaner does not rewrite, and a read_committed consumer
that meets an aborted-transaction entry skips its producer's transactional batches until that
producer's ABORT marker, so removing one without its entry would hide later committed data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fjord.records.builder import rebuild_batch
from fjord.records.control import control_record_of
from fjord.records.header import NO_PRODUCER_ID, BatchHeader, Buffer
from fjord.records.reader import RecordBatch, decode_record_tuples, read_batches

#: Producer id -> the ``(first offset, marker offset)`` ranges of its aborted transactions.
AbortedRanges = Mapping[int, Sequence[tuple[int, int]]]


def aborted_ranges(entries: Iterable[tuple[int, int, int]]) -> dict[int, list[tuple[int, int]]]:
    """:data:`AbortedRanges` from ``(producer id, first offset, marker offset)`` triples."""
    ranges: dict[int, list[tuple[int, int]]] = {}
    for pid, first, last in entries:
        ranges.setdefault(pid, []).append((first, last))
    return ranges


def _aborted_offsets(header: BatchHeader, aborted: AbortedRanges) -> list[tuple[int, int]]:
    """The aborted ranges that concern a transactional data batch (empty otherwise)."""
    if not header.is_transactional or header.is_control:
        return []
    return [r for r in aborted.get(header.producer_id, ())
            if r[0] <= header.last_offset and header.base_offset < r[1]]


def _is_aborted(offset: int, ranges: list[tuple[int, int]]) -> bool:
    return any(first <= offset < last for first, last in ranges)


#: What one key of the offset map costs, on top of the key's bytes, in a CPython dict (the
#: bytes object's header, the int, the dict's slot and index; measured with tracemalloc at
#: 107-117 bytes on CPython 3, by the dict's growth step): the unit of the memory bound
#: ``log.cleaner.dedupe.buffer.size`` (Kafka's map costs 24 bytes a key, MD5 and offset).
OFFSET_MAP_ENTRY_OVERHEAD_BYTES = 120


def offset_map_entry_bytes(key: bytes) -> int:
    return OFFSET_MAP_ENTRY_OVERHEAD_BYTES + len(key)


@dataclass(frozen=True, slots=True)
class OffsetMap:
    """Pass 1's result: each key's last offset in ``[start, end)``; ``end`` is where the map
    stopped: the requested end, or earlier (a batch boundary) when the memory bound was
    reached. The clean then compacts only up to ``end`` (Kafka's rounds)."""

    offsets: dict[bytes, int]
    end: int
    size_bytes: int


def build_bounded_offset_map(
    sections: Iterable[Buffer],
    start: int,
    end: int,
    aborted: AbortedRanges | None = None,
    max_bytes: int | None = None,
) -> OffsetMap:
    """Each key's last offset among the data records with offsets in ``[start, end)`` of
    ``sections`` (whole batches back to back, in offset order; batches outside the range are
    skipped, control batches, keyless records and records of ``aborted`` transactions
    ignored). Every batch read is CRC-checked. ``max_bytes``: the map (by
    :func:`offset_map_entry_bytes`) stops before the first batch whose new keys would take it
    past this; the result's ``end`` is that batch's base offset. The first batch with keys is
    always taken, so a clean always progresses."""
    offsets: dict[bytes, int] = {}
    size = 0
    for section in sections:
        for batch in read_batches(section):
            header = batch.header
            if header.is_control or header.last_offset < start or header.base_offset >= end:
                continue
            ranges = _aborted_offsets(header, aborted) if aborted else []
            found = [(offset, key) for offset, _, key, _, _ in _raw_tuples(header, batch.raw)
                     if key is not None and start <= offset < end
                     and not (ranges and _is_aborted(offset, ranges))]
            if max_bytes is not None:
                grows = sum(offset_map_entry_bytes(k) for k in {k for _, k in found}
                            if k not in offsets)
                if offsets and size + grows > max_bytes:
                    return OffsetMap(offsets, max(start, header.base_offset), size)
                size += grows
            for offset, key in found:
                offsets[key] = offset
    if max_bytes is None:
        size = sum(offset_map_entry_bytes(k) for k in offsets)
    return OffsetMap(offsets, end, size)


def build_offset_map(
    sections: Iterable[Buffer], start: int, end: int, aborted: AbortedRanges | None = None
) -> dict[bytes, int]:
    """:func:`build_bounded_offset_map` without a bound: the keys' last offsets."""
    return build_bounded_offset_map(sections, start, end, aborted).offsets


def last_batch_of_each_producer(headers: Iterable[BatchHeader]) -> dict[int, int]:
    """Producer id → last offset of its last batch, over headers in log order (the whole log:
    the cleaner must keep that batch, even emptied, for the producer's sequence state)."""
    last: dict[int, int] = {}
    for header in headers:
        if header.producer_id != NO_PRODUCER_ID:
            last[header.producer_id] = header.last_offset
    return last


def tombstones_expired(segment_max_timestamp: int, delete_retention_ms: int, now_ms: int) -> bool:
    """True when the tombstones of a segment whose largest timestamp is
    ``segment_max_timestamp`` have been kept ``delete.retention.ms`` and may be dropped."""
    return segment_max_timestamp + delete_retention_ms <= now_ms


class TransactionTracker:
    """Per producer id, whether a batch of its current transaction survives the clean: fed the
    data batches and markers of ``[log start, cleanable end)`` in log order (one tracker for
    all the segments of one clean). Every transaction below the cleanable end is complete, so
    each of its batches precedes its marker there."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[int, bool] = {}

    def data_batch(self, header: BatchHeader, kept: bool) -> None:
        """A transactional data batch was read; ``kept``: it is in the output (even emptied)."""
        if header.is_transactional and header.producer_id != NO_PRODUCER_ID:
            self._kept[header.producer_id] = self._kept.get(header.producer_id, False) or kept

    def marker(self, producer_id: int) -> bool:
        """A marker ends ``producer_id``'s transaction: True when none of its batches is kept
        (the marker may go then, by the other rules)."""
        return not self._kept.pop(producer_id, False)


@dataclass(frozen=True, slots=True)
class CleanedSegment:
    """What :func:`clean_segment` made of one segment's bytes. ``data`` holds whole, CRC-valid
    RecordBatch v2 batches in offset order (possibly none)."""

    data: bytes
    records_read: int
    records_kept: int
    tombstones_dropped: int
    keyless_dropped: int
    max_timestamp: int
    """Largest max timestamp of the kept batches, -1 when none is kept."""
    aborted_dropped: int = 0
    """Records of aborted transactions dropped."""
    markers_dropped: int = 0
    """COMMIT markers removed (their transaction's batches gone, past delete.retention.ms)."""


def clean_segment(
    data: Buffer,
    offset_map: Mapping[bytes, int],
    *,
    cleanable_end: int,
    drop_tombstones: bool,
    producer_last_offsets: Mapping[int, int],
    retain_last_batch: bool = False,
    aborted: AbortedRanges | None = None,
    transactions: TransactionTracker | None = None,
) -> CleanedSegment:
    """Rewrite one segment's bytes by the rules in the module docstring. Batches that start at
    or after ``cleanable_end`` are copied untouched. ``transactions``: the tracker of this
    clean, fed every segment below the cleanable end in order; without one markers are kept.
    ``retain_last_batch``: the segment's last batch stays (emptied when none of its records
    survives), so the cleaned segment still ends at the same offset and segments stay
    contiguous (the storage layer's invariant). Raises
    :class:`~fjord.errors.CorruptRecordError` for a damaged batch (nothing is written then)."""
    out: list[bytes] = []
    read = kept_count = tombstones = keyless = aborted_dropped = markers_dropped = 0
    max_timestamp = -1
    batches = list(read_batches(data))
    for index, batch in enumerate(batches):
        header = batch.header
        read += header.record_count
        last_of_segment = retain_last_batch and index == len(batches) - 1
        if (header.is_control and transactions is not None
                and header.base_offset < cleanable_end
                and transactions.marker(header.producer_id) and drop_tombstones
                and not last_of_segment
                and not _holds_producer_state(header, producer_last_offsets)
                and control_record_of(batch).committed):
            markers_dropped += 1
            continue
        if header.is_control or header.base_offset >= cleanable_end:
            out.append(bytes(batch.raw))
            kept_count += header.record_count
            max_timestamp = max(max_timestamp, header.max_timestamp)
            continue
        records = _raw_tuples(header, batch.raw)
        ranges = _aborted_offsets(header, aborted) if aborted else []
        kept = []
        for record in records:
            offset, _, key, value, _ = record
            if ranges and _is_aborted(offset, ranges):
                aborted_dropped += 1
            elif key is None:
                keyless += 1
            elif offset < offset_map.get(key, -1):
                pass
            elif value is None and drop_tombstones:
                tombstones += 1
            else:
                kept.append(record)
        if len(kept) == len(records):
            out.append(bytes(batch.raw))
        elif (kept or _holds_producer_state(header, producer_last_offsets)
              or last_of_segment):
            out.append(rebuild_batch(header, kept))
        else:
            if transactions is not None:
                transactions.data_batch(header, kept=False)
            continue
        if transactions is not None:
            transactions.data_batch(header, kept=True)
        kept_count += len(kept)
        max_timestamp = max(max_timestamp, header.max_timestamp)
    return CleanedSegment(b"".join(out), read, kept_count, tombstones, keyless, max_timestamp,
                          aborted_dropped, markers_dropped)


def _holds_producer_state(header: BatchHeader, producer_last_offsets: Mapping[int, int]) -> bool:
    return header.producer_id != NO_PRODUCER_ID and (
        producer_last_offsets.get(header.producer_id) == header.last_offset
    )


def _raw_tuples(
    header: BatchHeader, raw: memoryview
) -> list[tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]]:
    """The batch's records with their own timestamps (not a LOG_APPEND_TIME batch's max
    timestamp, which readers substitute): what a rewrite must carry over."""
    section = RecordBatch(raw).records_section()
    return decode_record_tuples(
        section, header.base_offset, header.base_timestamp, header.record_count,
        header.last_offset_delta,
    )


# ---- choosing what to clean --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What the choice of a cleanable range needs of one closed segment."""

    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int


def cleanable_end(
    closed: Sequence[SegmentInfo],
    active_base: int,
    now_ms: int,
    min_compaction_lag_ms: int,
    max_offset: int | None = None,
) -> int:
    """Kafka's first uncleanable offset: the active segment's base, or the base of the first
    closed segment holding a record younger than ``min.compaction.lag.ms`` or at or above
    ``max_offset`` (the high watermark: a record that may still be truncated away must not make
    an older one of its key disappear). Segments in offset order."""
    for segment in closed:
        if min_compaction_lag_ms > 0 and segment.max_timestamp > now_ms - min_compaction_lag_ms:
            return segment.base_offset
        if max_offset is not None and segment.next_offset > max_offset:
            return segment.base_offset
    return active_base


@dataclass(frozen=True, slots=True)
class DirtyState:
    """The cleaner's view of one log: bytes before and after the first dirty offset in the
    cleanable range, and the dirty ratio Kafka compares with ``min.cleanable.dirty.ratio``."""

    clean_bytes: int
    dirty_bytes: int
    first_dirty_offset: int
    cleanable_end: int
    oldest_dirty_timestamp: int
    """Smallest max timestamp among the dirty segments, -1 when none (for max.compaction.lag)."""

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def dirty_state(closed: Sequence[SegmentInfo], first_dirty: int, end: int) -> DirtyState:
    """Bytes of the closed segments before ``first_dirty`` (clean) and in ``[first_dirty, end)``
    (dirty). Segment granularity: a segment counts as dirty when it holds any offset at or after
    ``first_dirty``."""
    clean = dirty = 0
    oldest = -1
    for segment in closed:
        if segment.base_offset >= end:
            break
        if segment.next_offset <= first_dirty:
            clean += segment.size
        else:
            dirty += segment.size
            if segment.max_timestamp >= 0 and (oldest < 0 or segment.max_timestamp < oldest):
                oldest = segment.max_timestamp
    return DirtyState(clean, dirty, first_dirty, end, oldest)


def should_clean(
    state: DirtyState, min_dirty_ratio: float, max_compaction_lag_ms: int, now_ms: int
) -> bool:
    """Kafka's rule: something is dirty and the ratio reaches ``min.cleanable.dirty.ratio``, or
    a dirty record is older than ``max.compaction.lag.ms`` (then the ratio does not matter)."""
    if state.dirty_bytes == 0 or state.first_dirty_offset >= state.cleanable_end:
        return False
    if state.dirty_ratio >= min_dirty_ratio:
        return True
    return 0 <= state.oldest_dirty_timestamp <= now_ms - max_compaction_lag_ms
