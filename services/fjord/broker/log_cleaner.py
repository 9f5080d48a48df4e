"""The broker's log cleaner, asyncio shell: every ``log.cleaner.backoff.ms`` (or at once after
a clean) it looks at the hosted partitions whose ``cleanup.policy`` holds compact, picks the
dirtiest one that Kafka's rule says to clean (:func:`fjord.storage.compaction.should_clean`:
dirty ratio at least ``min.cleanable.dirty.ratio``, or a dirty record older than
``max.compaction.lag.ms``) and cleans it in a worker thread (:func:`fjord.storage.cleaner.
clean_log`, below the high watermark, never the active segment), reads throttled to
``log.cleaner.io.max.bytes.per.second``. One clean at a time per broker, like Kafka's single
cleaner thread. Leaders and followers clean their own copies alike.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from fjord.broker.replica_manager import ReplicaManager
from fjord.broker.throttled_task import ThrottledTask
from fjord.cluster.cleaner_config import CleanerSettings
from fjord.errors import FjordError
from fjord.observability import metrics
from fjord.storage.cleaner import CleanStats, clean_log, log_dirty_state
from fjord.storage.compaction import DirtyState, should_clean
from fjord.storage.log import PartitionLog
from fjord.topic_partition import TopicPartition

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PartitionCleanerState:
    """What ``fjord topics describe`` and ``fjord log-dirs describe`` show for one compacted
    partition replica (through DescribeLogDirs)."""

    dirty_ratio: float
    first_dirty_offset: int
    """The cleaner checkpoint: offsets below it are compacted (the last cleaned offset + 1)."""
    cleanable_end: int


class LogCleaner(ThrottledTask[CleanerSettings]):
    """Invariants: at most one clean runs at a time; a clean never starts on a log whose
    policy lacks compact; the choice (segment metadata, checkpoint files) and the clean run in
    worker threads, never on the event loop."""

    def __init__(self, replicas: ReplicaManager, settings: CleanerSettings) -> None:
        self._replicas = replicas
        super().__init__(settings, time.monotonic())
        self.states: dict[TopicPartition, PartitionCleanerState] = {}
        self.cleans_completed = 0
        self.last_stats: CleanStats | None = None

    def _throttle_read(self, nbytes: int) -> None:
        """Called in the worker thread before each read: sleeping there keeps the loop free."""
        delay = self._throttle.delay_for(nbytes, time.monotonic())
        if delay > 0:
            time.sleep(delay)

    def _choose(self, now_ms: int) -> tuple[TopicPartition, PartitionLog, int] | None:
        best: tuple[float, TopicPartition, PartitionLog, int] | None = None
        states: dict[TopicPartition, PartitionCleanerState] = {}
        for key, partition in self._replicas.hosted():
            plog = partition.log
            config = plog.config
            if not config.compact or plog.closed:
                continue
            # Never past an open (or not yet replicated) transaction: its outcome decides
            # which of its records survive (Kafka cleans below the first unstable offset).
            hw = partition.last_stable_offset
            try:
                state: DirtyState = log_dirty_state(plog, now_ms, config.min_compaction_lag_ms, hw)
            except (OSError, FjordError):
                continue
            states[key] = PartitionCleanerState(
                state.dirty_ratio, state.first_dirty_offset, state.cleanable_end
            )
            due = should_clean(state, config.min_cleanable_dirty_ratio,
                               config.max_compaction_lag_ms, now_ms)
            if due and (best is None or state.dirty_ratio > best[0]):
                best = (state.dirty_ratio, key, plog, hw)
        self.states = states
        metrics.set_cleaner_max_dirty_ratio(
            max((s.dirty_ratio for s in states.values()), default=0.0)
        )
        return None if best is None else best[1:]

    async def clean_once(self) -> CleanStats | None:
        """Choose and clean one log; None when none needed it (or it changed meanwhile)."""
        now_ms = int(time.time() * 1000)
        chosen = await asyncio.to_thread(self._choose, now_ms)  # reads checkpoint files
        if chosen is None:
            return None
        key, plog, hw = chosen
        config = plog.config
        try:
            stats = await asyncio.to_thread(
                clean_log, plog, now_ms=now_ms, delete_retention_ms=config.delete_retention_ms,
                min_compaction_lag_ms=config.min_compaction_lag_ms, high_watermark=hw,
                throttle=self._throttle_read, max_map_bytes=self.settings.dedupe_buffer_size,
            )
        except (OSError, FjordError) as exc:
            metrics.record_clean("failed")
            log.warning("cleaning %s-%d failed: %s", key[0], key[1], exc)
            return None
        if stats is None:
            metrics.record_clean("skipped")
            return None
        self.cleans_completed += 1
        self.last_stats = stats
        metrics.record_clean("cleaned", stats.bytes_read, stats.bytes_written,
                             stats.records_read - stats.records_kept, stats.seconds)
        metrics.set_cleaner_buffer_utilization(
            min(1.0, stats.offset_map_bytes / self.settings.dedupe_buffer_size))
        log.info("cleaned %s-%d [%d, %d): %d segments, %d -> %d bytes, %d of %d records kept "
                 "in %.2f s", key[0], key[1], stats.first_dirty_offset, stats.cleaned_to,
                 stats.segments, stats.bytes_read, stats.bytes_written, stats.records_kept,
                 stats.records_read, stats.seconds)
        return stats

    async def run(self) -> None:
        if not self.settings.enable:
            return
        while True:
            try:
                cleaned = await self.clean_once()
                metrics.record_cleaner_pass(time.time())
            except Exception:  # a bug must not end cleaning
                log.exception("log cleaner pass failed")
                cleaned = None
            if cleaned is None:
                await self._back_off()
            else:
                await asyncio.sleep(0)
