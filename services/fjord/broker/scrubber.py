"""The broker's scrubber, asyncio shell: verifies every closed segment of every hosted
partition in the background, throttled, and hands damage to the ReplicaManager.

The decisions are pure (:mod:`fjord.storage.scrub`: which segment next, the throttle, the batch
check; :mod:`fjord.broker.damage`: what to do about damage); this reads chunks in a worker
thread, sleeps as the throttle says and updates the metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from fjord.broker.replica_manager import ReplicaManager
from fjord.broker.throttled_task import ThrottledTask
from fjord.cluster.scrubber_config import ScrubberSettings
from fjord.errors import CorruptRecordError
from fjord.observability import metrics
from fjord.records.header import parse_header
from fjord.storage.log import PartitionLog
from fjord.storage.scrub import (
    ScrubProgress,
    ScrubScheduler,
    SegmentRef,
    check_batches,
)
from fjord.storage.segment import LogSegment
from fjord.topic_partition import TopicPartition

log = logging.getLogger(__name__)

#: Bytes read per step (smaller when the throttle allows less per second).
SCRUB_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ScrubStatus:
    """What ``fjord`` shows about the scrubber: the current pass, damage found, repairs."""

    enabled: bool
    progress: ScrubProgress
    passes_completed: int
    damage_found: int
    repairs_done: int
    repairs_in_progress: int


class Scrubber(ThrottledTask[ScrubberSettings]):
    """Verifies closed segments pass after pass.

    Invariants: a segment is marked verified (``LogSegment.verified``, which lets reads skip
    their own check) only after every byte of it passed :func:`check_batches` and the segment
    was still the same closed segment of its log when the check ended; damage is only recorded
    under the same condition (a segment truncated or deleted meanwhile proves nothing); reads
    never exceed ``log.scrubber.io.max.bytes.per.second`` on average.
    """

    def __init__(
        self,
        replicas: ReplicaManager,
        settings: ScrubberSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._replicas = replicas
        super().__init__(settings, clock())
        self._clock = clock
        self.scheduler = ScrubScheduler()
        self.passes_completed = 0
        self._last_progress = ScrubProgress(1, 0, 0, 0, 0)

    def prioritize_unclean(self, logs: dict[TopicPartition, PartitionLog]) -> None:
        """Partitions recovered after an unclean shutdown are scrubbed first."""
        for key, plog in logs.items():
            if plog.recovery is not None and not plog.recovery.clean_shutdown:
                self.scheduler.prioritize(key)

    def _candidates(self) -> dict[SegmentRef, tuple[PartitionLog, LogSegment]]:
        out = {}
        for key, partition in self._replicas.hosted():
            for segment in partition.log.closed_segments():
                ref = SegmentRef(key[0], key[1], segment.base_offset, segment.size)
                out[ref] = (partition.log, segment)
        return out

    def status(self) -> ScrubStatus:
        replicas = self._replicas
        return ScrubStatus(self.settings.enable, self._last_progress, self.passes_completed,
                           replicas.damage_found, replicas.repairs_done, len(replicas.repairs))

    async def run(self) -> None:
        if not self.settings.enable:
            return
        started = self._clock()
        while True:
            candidates = self._candidates()
            self._last_progress = self.scheduler.progress(candidates)
            metrics.set_scrub_progress(self._last_progress.fraction)
            ref = self.scheduler.next_segment(candidates)
            if ref is None:
                self.passes_completed += 1
                metrics.set_scrub_progress(1.0, pass_completed=True)
                progress = self._last_progress
                log.debug("scrub pass %d: verified %d closed segments (%d bytes) in %.1f s",
                         progress.pass_number, progress.total_segments, progress.total_bytes,
                         self._clock() - started)
                await self._back_off()
                self.scheduler.start_pass()
                started = self._clock()
                continue
            plog, segment = candidates[ref]
            try:
                await self.verify(ref, plog, segment)
            except Exception:  # a bug must not end scrubbing; this segment waits a pass
                log.exception("scrubbing %s-%d segment %d failed", ref.topic, ref.partition,
                              ref.base_offset)
            self.scheduler.mark_verified(ref)

    async def verify(self, ref: SegmentRef, plog: PartitionLog, segment: LogSegment) -> bool:
        """Verify one closed segment; returns False when it is damaged or changed meanwhile."""
        size = ref.size
        pos, expected = 0, segment.base_offset
        chunk = max(1, min(SCRUB_CHUNK_BYTES, self.settings.io_max_bytes_per_second))
        while pos < size:
            want = min(chunk, size - pos)
            delay = self._throttle.delay_for(want, self._clock())
            if delay > 0:
                await asyncio.sleep(delay)
            if not plog.still_holds(segment, size):
                return False
            try:
                data = await asyncio.to_thread(segment.read, pos, pos + want)
            except OSError:
                return False  # closed meanwhile (retention, truncation, shutdown)
            final = pos + want >= size
            check = check_batches(data, expected, final=final,
                                  allow_gaps=segment.may_have_gaps)
            if check.damage is None and check.valid_bytes == 0:
                # One batch larger than the chunk: read exactly that batch next.
                try:
                    chunk = max(chunk, parse_header(data).size)
                except CorruptRecordError:
                    return False
                continue
            metrics.record_scrub_bytes(check.valid_bytes)
            pos += check.valid_bytes
            expected = check.next_offset
            if check.damage is not None:
                if not plog.still_holds(segment, size):
                    return False
                plog.note_damage(check.damage)
                self._replicas.handle_damage(ref.key, "scrub")
                return False
        if not plog.still_holds(segment, size):
            return False
        segment.verified = True
        metrics.record_scrub_segment()
        return True
