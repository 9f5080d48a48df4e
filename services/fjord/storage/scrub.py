"""The scrubber's pure parts: checking stored batches, the throttle, and which closed segment to
verify next. No I/O and no clock of their own: the broker's shell
(:mod:`fjord.broker.scrubber`) reads the bytes, sleeps and passes the time in.

Why: bytes at rest can rot (a flipped bit on the disk, a bad controller, a torn write that a
checksum-less filesystem never noticed). Kafka notices only when a consumer trips over the
batch; Fjord verifies every closed segment in the background, throttled, and repairs a damaged
replica from a healthy one (see docs/storage.md, "Scrubbing").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fjord.errors import CorruptRecordError
from fjord.records.header import (
    BATCH_HEADER_SIZE,
    BatchHeader,
    check_crc,
    check_structure,
    parse_header,
)
from fjord.topic_partition import TopicPartition


@dataclass(frozen=True, slots=True)
class LogDamage:
    """A damaged batch in a stored log.

    ``offset``: the first offset not provably intact (the damaged batch's base offset, or the
    offset where the previous intact batch ended when the framing itself is damaged);
    ``resume_offset``: the first offset after the damage that can be read again (the next
    intact batch), None when nothing after it in that segment can be trusted (the framing is
    lost: everything up to the segment's end is unreadable); ``reason``: what the check found.
    """

    offset: int
    resume_offset: int | None
    reason: str

    def covers(self, offset: int) -> bool:
        return offset >= self.offset and (self.resume_offset is None or offset < self.resume_offset)


@dataclass(frozen=True, slots=True)
class BatchCheck:
    """What :func:`check_batches` found in a buffer: ``valid_bytes`` of whole intact batches
    from its start, ending at ``next_offset``; ``damage`` when the batch after them is damaged
    (None: the buffer ended, possibly inside a batch that needs more bytes)."""

    valid_bytes: int
    next_offset: int
    damage: LogDamage | None = None


def check_batches(
    buf: bytes | memoryview, expected_offset: int, *, final: bool, allow_gaps: bool = False
) -> BatchCheck:
    """Check the stored batches at the start of ``buf``: header, length, CRC-32C, and that each
    starts at ``expected_offset`` (the base offset and length are outside the CRC, so a flip
    there only shows as a gap or overlap; ``allow_gaps``: at or after it, for a segment the
    cleaner compacted, where gaps are normal and only an overlap shows). ``final``:
    ``buf`` reaches the end of the segment, so a batch cut off by its end is damage, not a
    reason to read more.

    Pure; never decodes records. The damaged batch's framing is trusted for ``resume_offset``
    only when its header parses, its length fits, and the batch after it starts exactly where it
    should (one more intact header).
    """
    view = memoryview(buf).cast("B")
    pos = 0
    offset = expected_offset
    while pos < view.nbytes:
        if view.nbytes - pos < BATCH_HEADER_SIZE and not final:
            break
        try:
            header = check_structure(view, pos)
        except CorruptRecordError as exc:
            if not final and "truncated batch" in str(exc):
                break  # a whole batch needs more bytes than this chunk holds
            return BatchCheck(pos, offset, LogDamage(offset, None, str(exc)))
        if header.base_offset < offset or (not allow_gaps and header.base_offset != offset):
            reason = (f"batch at position {pos} starts at offset {header.base_offset}, "
                      f"expected {offset} or later")
            return BatchCheck(pos, offset, LogDamage(offset, None, reason))
        try:
            check_crc(view, pos, header)
        except CorruptRecordError as exc:
            return BatchCheck(pos, offset, LogDamage(offset, _resume_after(view, pos, header),
                                                     str(exc)))
        pos += header.size
        offset = header.next_offset
    return BatchCheck(pos, offset)


def _resume_after(view: memoryview, pos: int, header: BatchHeader) -> int | None:
    """The next batch's offset when its header is intact and where the damaged one's framing
    says it is; None otherwise (or when the buffer ends there)."""
    after = pos + header.size
    if view.nbytes - after < BATCH_HEADER_SIZE:
        return header.next_offset if after == view.nbytes else None
    try:
        following = parse_header(view, after)
    except CorruptRecordError:
        return None
    return following.base_offset if following.base_offset == header.next_offset else None


class ScrubThrottle:
    """A token bucket of ``rate`` bytes per second (``log.scrubber.io.max.bytes.per.second``):
    :meth:`delay_for` says how long to wait before reading ``nbytes`` more. At most one
    second's worth of unused allowance is saved up, so a scrubber that was idle does not then
    read at full disk speed."""

    def __init__(self, rate_bytes_per_s: int, now_s: float) -> None:
        if rate_bytes_per_s <= 0:
            raise ValueError("the scrub rate must be positive")
        self.rate = rate_bytes_per_s
        self._allowance = 0.0
        self._last = now_s

    def delay_for(self, nbytes: int, now_s: float) -> float:
        """Seconds to wait before reading ``nbytes`` (0 when allowed now); the read is counted
        as done once that wait is over."""
        elapsed = max(0.0, now_s - self._last)
        self._last = now_s
        self._allowance = min(float(self.rate), self._allowance + elapsed * self.rate)
        self._allowance -= nbytes
        if self._allowance >= 0:
            return 0.0
        return -self._allowance / self.rate


@dataclass(frozen=True, slots=True)
class SegmentRef:
    """A closed segment the scrubber may verify: its partition, base offset and size."""

    topic: str
    partition: int
    base_offset: int
    size: int

    @property
    def key(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class ScrubProgress:
    """Where the current pass stands: segments and bytes verified of those known now."""

    pass_number: int
    verified_segments: int
    total_segments: int
    verified_bytes: int
    total_bytes: int

    @property
    def fraction(self) -> float:
        return 1.0 if self.total_bytes == 0 else self.verified_bytes / self.total_bytes


class ScrubScheduler:
    """Which closed segment to verify next, pass after pass.

    Invariants: within one pass each segment (partition, base offset) is verified at most once;
    segments of partitions marked :meth:`prioritize` (recovered after an unclean shutdown) come
    first, newest first (those were written closest to the crash), then every other partition's
    in (topic, partition, base offset) order; a segment that appears during a pass (a roll) is
    verified in that pass; one that disappears (retention, truncation) is forgotten.
    """

    def __init__(self) -> None:
        self.pass_number = 1
        self._verified: set[tuple[TopicPartition, int]] = set()
        self._priority: set[TopicPartition] = set()

    def prioritize(self, key: TopicPartition) -> None:
        self._priority.add(key)

    def next_segment(self, candidates: Iterable[SegmentRef]) -> SegmentRef | None:
        """The next segment to verify among the closed segments that exist now; None when this
        pass has verified them all (call :meth:`start_pass` to begin the next)."""
        pending = [c for c in candidates if (c.key, c.base_offset) not in self._verified]
        if not pending:
            return None
        urgent = [c for c in pending if c.key in self._priority]
        if urgent:
            return max(urgent, key=lambda c: (c.base_offset, c.key))
        return min(pending, key=lambda c: (c.key, c.base_offset))

    def mark_verified(self, segment: SegmentRef) -> None:
        self._verified.add((segment.key, segment.base_offset))

    def start_pass(self) -> None:
        self.pass_number += 1
        self._verified.clear()
        self._priority.clear()

    def progress(self, candidates: Iterable[SegmentRef]) -> ScrubProgress:
        segments = list(candidates)
        done = [c for c in segments if (c.key, c.base_offset) in self._verified]
        return ScrubProgress(
            self.pass_number,
            len(done),
            len(segments),
            sum(c.size for c in done),
            sum(c.size for c in segments),
        )
