"""The broker's partitions: which it hosts, produce/fetch/list-offsets against them, and the
delayed operations (long-poll fetch, acks=all) that wait on them.

This is the layer between the gRPC servicer (which only translates) and the pure cores
(:mod:`fjord.broker.partition`, :mod:`fjord.broker.fetch`, :mod:`fjord.broker.purgatory`). It
takes and returns protobuf messages directly, so the hot path builds no intermediate objects.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol, cast

from fjord._proto import broker_pb2
from fjord.broker import defaults
from fjord.broker.coordinator_fence import CoordinatorEpochFence
from fjord.broker.damage import DamageAction, damage_action, no_healthy_copy_message
from fjord.broker.fetch import FetchSlot, assemble_fetch, read_size_bound
from fjord.broker.fetch_session import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    NO_SESSION,
    FetchSession,
    FetchSessionCache,
    FetchSessionError,
    has_news,
)
from fjord.broker.fetch_wire import DetachedRecords
from fjord.broker.partition import Partition, PartitionAssignment
from fjord.broker.purgatory import DelayedFetch, DelayedProduce, Purgatory
from fjord.broker.replication import (
    NO_EPOCH,
    FollowerPosition,
    FollowerTarget,
    truncation_for_divergence,
)
from fjord.cluster.broker_config import TopicSettings, topic_settings
from fjord.cluster.dynamic_config import effective_broker_config
from fjord.cluster.replication_config import ReplicationSettings
from fjord.errors import (
    CorruptRecordError,
    ErrorCode,
    FjordError,
    InvalidRequestError,
    InvalidRequiredAcksError,
    InvalidTopicError,
    LogDamagedError,
    NotEnoughReplicasAfterAppendError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    StorageError,
    UnknownTopicOrPartitionError,
    error_code_from_number,
    error_for_code,
)
from fjord.groups.defaults import OFFSETS_TOPIC
from fjord.metadata import MetadataImage
from fjord.observability import metrics
from fjord.records.control import build_control_batch
from fjord.records.header import Compression, end_of_whole_batches
from fjord.records.recompress import check_timestamps, needs_recompression, recompress
from fjord.storage import PartitionLog
from fjord.storage.region import FileRegion
from fjord.topic_names import topic_name_problem
from fjord.topic_partition import TopicPartition
from fjord.transactions.defaults import TRANSACTION_STATE_TOPIC
from fjord.wakeups import wait_woken

log = logging.getLogger(__name__)

#: Zero copy: the marker to put in a FetchResponse where a FileRegion's records go.
RegionMarker = Callable[[FileRegion], bytes]


class ProducePartitionInput(Protocol):
    """What :meth:`ReplicaManager.produce` reads of a request's partition: protobuf's
    ``ProducePartition`` or the Kafka listener's view of a Kafka request (no copy of the
    records through protobuf)."""

    @property
    def partition(self) -> int: ...
    @property
    def records(self) -> bytes: ...
    @property
    def coordinator_epoch(self) -> int: ...


class ProduceTopicInput(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def partitions(self) -> Sequence[ProducePartitionInput]: ...


class ProduceInput(Protocol):
    """What :meth:`ReplicaManager.produce` reads of a request (see ProducePartitionInput)."""

    @property
    def acks(self) -> int: ...
    @property
    def timeout_ms(self) -> int: ...
    @property
    def topics(self) -> Sequence[ProduceTopicInput]: ...


EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3

#: Fetch / ListOffsets isolation levels (Kafka's): read_uncommitted sees up to the high
#: watermark, read_committed up to the last stable offset.
READ_UNCOMMITTED = 0
READ_COMMITTED = 1

#: ListOffsets ``replica_id`` of a debugging client (Kafka's DEBUGGING_REPLICA_ID): it may read
#: any replica, leader or follower, up to its log end (tools and tests check replication with it).
DEBUGGING_REPLICA_ID = -2

#: AlterPartition errors that mean this leader's view is stale: it stops leading the partition
#: until newer metadata arrives (fencing).
STALE_ISR_ERRORS = frozenset(
    {
        ErrorCode.FENCED_LEADER_EPOCH.code,
        ErrorCode.INVALID_UPDATE_VERSION.code,
        ErrorCode.NOT_LEADER_OR_FOLLOWER.code,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code,
    }
)


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass(frozen=True, slots=True)
class IsrChangeRequest:
    """An ISR change this leader wants the controller to commit (one AlterPartition item)."""

    topic: str
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[int, ...]
    old_isr: tuple[int, ...] = ()
    #: The leader gives up leadership instead (``reason``: "disk" or "damage"); the controller
    #: elects another live ISR member and drops this broker from the ISR.
    resign: bool = False
    reason: str = ""


@dataclass(frozen=True, slots=True)
class FollowerFetchResult:
    """What handling one partition of a follower fetch response did.

    ``appended_bytes``: bytes appended; ``truncated``: the log was truncated (divergence);
    ``error``: the partition's error (the fetcher backs off on this partition), None if none;
    ``quiet``: the error was already reported where it is logged once (a data directory that
    cannot be written), so the fetcher does not log it again every backoff.
    """

    appended_bytes: int = 0
    truncated: bool = False
    error: FjordError | None = None
    quiet: bool = False


class LogManagerLike(Protocol):
    """The part of fjord.storage.LogManager the replica manager uses."""

    def get_or_create(self, topic: str, partition: int, config: Any) -> Any: ...

    def get(self, topic: str, partition: int) -> Any: ...

    def delete(self, topic: str, partition: int) -> Any: ...

    def logs(self) -> Mapping[TopicPartition, Any]: ...


def _set_error(target: Any, exc: FjordError) -> None:
    target.error.code = exc.code.code
    target.error.message = str(exc)


def _unexpected(exc: Exception) -> FjordError:
    log.exception("unexpected error while handling a partition request")
    return FjordError(f"{type(exc).__name__}: {exc}", code=ErrorCode.UNKNOWN_SERVER_ERROR)


class ReplicaManager:
    """Every partition replica this broker hosts, indexed by (topic, partition).

    Invariants:
    - ``partitions`` holds exactly the partitions of the last applied metadata image whose
      replica set contains this broker; each has an open log from the LogManager.
    - A produce is appended only by the partition's leader, in the current leader epoch, and
      only while the broker is not ``fenced`` (fenced: its etcd registration was lost and it has
      not yet re-registered and caught up with the metadata; it must not act as a leader).
    - An append to ``__consumer_offsets`` is admitted only from its current group coordinator
      (:class:`~fjord.broker.coordinator_fence.CoordinatorEpochFence`): a coordinator epoch
      older than the newest in the metadata or seen before is refused, nothing appended. A
      produce with a coordinator epoch and no records is a new owner's claim: admitted like an
      append, nothing written, answered with the log end offset.
    - Every delayed operation is watched in its purgatory from the moment it waits until it
      completes, times out or its caller is cancelled, and never after.
    """

    def __init__(
        self,
        broker_id: int,
        logs: LogManagerLike,
        broker_config: Mapping[str, str] | None = None,
        *,
        initial_high_watermarks: Mapping[TopicPartition, int] | None = None,
        clock_ms: Callable[[], int] = monotonic_ms,
    ) -> None:
        self.broker_id = broker_id
        self._logs = logs
        self._broker_config = dict(broker_config or {})
        self.replication = ReplicationSettings.from_config(self._broker_config)
        self._initial_high_watermarks = dict(initial_high_watermarks or {})
        self._clock_ms = clock_ms
        #: ISR changes waiting to be sent to the controller, and the event that wakes the sender.
        self.isr_requests: dict[TopicPartition, IsrChangeRequest] = {}
        #: Leadership resignations waiting to be sent (same sender, same wake-up event), and
        #: the leader epoch each partition's last sent resignation was for (one in flight).
        self.resign_requests: dict[TopicPartition, IsrChangeRequest] = {}
        self._resigning: dict[TopicPartition, int] = {}
        self._resign_refusals_logged: set[tuple[TopicPartition, int]] = set()
        #: Resignations the controller refused because no other live ISR member could lead.
        self._no_other_leader: set[tuple[TopicPartition, int]] = set()
        #: Damage handling: the damage offset already reported per partition, how a pending
        #: discovery was triggered (a follower's report), repairs under way (old log end, when
        #: they started in ms, the damage offset) and partitions whose leader must hear that
        #: what it sent failed its check here.
        self._damage_seen: dict[TopicPartition, int] = {}
        self._damage_sources: dict[TopicPartition, str] = {}
        self.repairs: dict[TopicPartition, tuple[int, int, int]] = {}
        self.damage_found = 0
        self.repairs_done = 0
        self._report_damage: set[TopicPartition] = set()
        #: Followed partitions whose log end moved outside the replica fetcher (a repair's
        #: truncation): the fetcher recomputes their position before its next fetch
        #: (:meth:`take_moved_follower_logs`).
        self._moved_follower_logs: set[TopicPartition] = set()
        self.isr_requests_ready = asyncio.Event()
        #: False while the data directory cannot be written (set by the broker's disk
        #: monitor): followers stop fetching (they could not append, and an idle follower at
        #: the high watermark would rejoin the ISR and be elected again).
        self.disk_writable = True
        #: Called with (operation, exception) for every failed write to the data directory;
        #: returns True when it recognised an OS write error (and logged or counted it).
        self.on_write_error: Callable[[str, BaseException], bool] | None = None
        self.partitions: dict[TopicPartition, Partition] = {}
        #: Grows whenever a hosted partition is added or dropped, or one's leader or leader
        #: epoch changes: :meth:`follower_targets` can only differ when it grew.
        self.leadership_generation = 0
        self.image: MetadataImage | None = None
        self.fenced = False
        self.closing = False
        self._fetch_waiters: Purgatory[DelayedFetch] = Purgatory()
        self._produce_waiters: Purgatory[DelayedProduce] = Purgatory()
        self._wakeups: dict[DelayedFetch | DelayedProduce, asyncio.Future[None]] = {}
        #: Parked fetches and produces woken so far (purgatory and fetch sessions): an
        #: append compares it before and after to know whether it woke one.
        self.waiters_woken = 0
        #: Incremental fetch sessions (KIP-227) of followers and Kafka consumers, the parked
        #: session fetches (woken by touches of their partitions, and all of them by close),
        #: how often a session fetch looks at every partition of its session (every two
        #: replica.lag.time.max.ms: a safety net, touches say what changed) and how often a
        #: follower's session fetch counts as a fetch of every partition in it (a third of it:
        #: the caught-up times the ISR check, every half of it, reads stay younger than it).
        self._fetch_sessions: FetchSessionCache[TopicPartition, Any] = FetchSessionCache()
        self._session_waits: set[asyncio.Future[None]] = set()
        self._session_full_pass_s = 2 * self.replication.lag_time_max_ms / 1000
        self._session_refresh_s = self.replication.lag_time_max_ms / 3000
        self._metadata_lock = asyncio.Lock()
        self._strays_removed = False
        #: What :meth:`_apply_metadata` last applied to each partition (the image's state
        #: object and the assignment it made of it) and each topic's settings: a partition
        #: whose state object, assignment and settings are the same again is skipped (an
        #: image shares the state objects of partitions no change touched).
        self._applied: dict[TopicPartition, tuple[Any, PartitionAssignment]] = {}
        self._applied_settings: dict[str, TopicSettings | None] = {}
        self.coordinator_fence = CoordinatorEpochFence()
        #: One fence per coordinator-owned topic (``__transaction_state`` p is owned with
        #: ``__consumer_offsets`` p: same owner, same epoch).
        self.coordinator_fences = {
            OFFSETS_TOPIC: self.coordinator_fence,
            TRANSACTION_STATE_TOPIC: CoordinatorEpochFence(TRANSACTION_STATE_TOPIC),
        }

    @property
    def static_config(self) -> Mapping[str, str]:
        """The broker's ``--config`` entries as given at start (its dynamic configs are in the
        metadata image: fjord.cluster.dynamic_config)."""
        return MappingProxyType(self._broker_config)

    # --- metadata -------------------------------------------------------------------------------

    def _settings_for(self, image: MetadataImage, topic: str) -> TopicSettings | None:
        record = image.topic(topic)
        if record is None:
            return None
        try:
            # Kafka's layers: static --config < dynamic cluster default < this broker's
            # dynamic config < the topic's own (a dynamic change reaches open logs here).
            broker_level = effective_broker_config(
                self._broker_config, image.cluster_config, image.broker_config(self.broker_id)
            )
            return topic_settings(broker_level, {}, record.config)
        except FjordError as exc:
            log.error("topic %s has an invalid config, not hosting it: %s", topic, exc)
            return None

    async def apply_metadata(self, image: MetadataImage) -> None:
        """Open, update and drop local replicas to match ``image`` (called on every change)."""
        async with self._metadata_lock:
            await self._apply_metadata(image)

    async def _apply_metadata(self, image: MetadataImage) -> None:
        previous, self.image = self.image, image
        wanted = image.replica_states_on(self.broker_id)
        settings_by_topic: dict[str, TopicSettings | None] = {}
        to_open: list[tuple[TopicPartition, PartitionAssignment, TopicSettings]] = []
        same_settings: dict[str, bool] = {}
        applied = self._applied
        for looked_at, (key, state) in enumerate(wanted.items()):
            if looked_at % defaults.APPLY_YIELD_EVERY == defaults.APPLY_YIELD_EVERY - 1:
                # Lease keep-alives, fetches and produces run between slices: a pass over
                # tens of thousands of partitions must not hold the loop for seconds (a
                # broker whose lease lapses is fenced, re-registers, and every partition it
                # leads changes twice more: each change another pass).
                await asyncio.sleep(0)
            topic, number = key
            if topic not in settings_by_topic:
                settings_by_topic[topic] = self._settings_for(image, topic)
                same_settings[topic] = settings_by_topic[topic] == self._applied_settings.get(
                    topic
                )
            settings = settings_by_topic[topic]
            if settings is None:
                continue
            existing = self.partitions.get(key)
            done = applied.get(key)
            if (done is not None and existing is not None and done[0] is state
                    and existing.assignment is done[1] and same_settings[topic]):
                continue  # unchanged since it was applied (images share unchanged states)
            assignment = PartitionAssignment(
                leader=state.leader,
                leader_epoch=state.leader_epoch,
                replicas=tuple(state.replicas),
                isr=tuple(state.isr),
                partition_epoch=state.partition_epoch,
            )
            if existing is None:
                to_open.append((key, assignment, settings))
                applied[key] = (state, assignment)
                continue
            if existing.assignment != assignment:
                self._fetch_sessions.touch(key)
                epoch_changed = existing.assignment.leader_epoch != assignment.leader_epoch
                if existing.update_assignment(assignment, self._clock_ms()):
                    self._notify_high_watermark(key, existing, None)
                if epoch_changed:
                    self._wake_producers(key)
            existing.update_config(
                min_insync_replicas=settings.min_insync_replicas,
                compression=settings.compression,
                max_timestamp_difference_ms=settings.max_timestamp_difference_ms,
            )
            if getattr(existing.log, "config", None) != settings.log_config:
                existing.log.config = settings.log_config  # alter-configs reach open logs
            applied[key] = (state, existing.assignment)
        self._applied_settings = settings_by_topic
        if previous is not None:
            self._touch_for_new_incarnations(previous, image)
        # Partitions this broker already hosts are up to date; new ones are opened (directory,
        # files, producer state: disk work) in a worker thread, a chunk at a time, so that a
        # topic with thousands of partitions never holds the event loop (lease keep-alives,
        # produce and fetch go on between chunks).
        chunk = defaults.OPEN_PARTITIONS_CHUNK
        # A few chunks at once (each open mostly waits for its fsyncs, which overlap).
        parallel = asyncio.Semaphore(defaults.OPEN_PARTITIONS_PARALLEL)

        async def open_chunk(part: list[Any]) -> list[tuple[TopicPartition, Partition]]:
            async with parallel:
                if self.closing:
                    return []
                return await asyncio.to_thread(self._open_partitions, part, self._clock_ms())

        to_open.sort(key=lambda item: item[0])
        chunks = [to_open[start : start + chunk] for start in range(0, len(to_open), chunk)]
        for opening in asyncio.as_completed([open_chunk(part) for part in chunks]):
            opened = await opening
            for key, partition in opened:
                if self.closing:
                    return
                self.partitions[key] = partition
                partition.on_leadership_change = self._leadership_changed
                self._leadership_changed()
                self._fetch_sessions.touch(key)
        if len(to_open) > defaults.OPEN_PARTITIONS_LOGGED:
            log.info("hosting %d new partitions (%s ... %s)", len(to_open),
                     "-".join(map(str, to_open[0][0])), "-".join(map(str, to_open[-1][0])))
        gone = [key for key in self.partitions if key not in wanted]
        if not self._strays_removed and image.revision > 0:
            # Logs left on disk for partitions this broker no longer hosts (the topic was
            # deleted or moved while it was down): drop them once the first snapshot is known.
            self._strays_removed = True
            gone += [key for key in self._logs.logs() if key not in wanted and key not in gone]
        for key in gone:
            if self.partitions.pop(key, None) is not None:
                self._leadership_changed()
            applied.pop(key, None)
            if key[0] in self.coordinator_fences:
                self.coordinator_fences[key[0]].forget(key[1])
            self._wake_producers(key)
            self._wake_fetchers(key)
        for topic, number in gone:
            log.info("no longer a replica of %s-%d: deleting its local log", topic, number)
            try:
                await asyncio.to_thread(self._logs.delete, topic, number)
            except Exception:
                log.exception("deleting the log of %s-%d failed", topic, number)
        metrics.set_partitions_led(sum(1 for p in self.partitions.values() if p.is_leader))
        metrics.set_under_replicated_partitions(
            sum(
                1
                for p in self.partitions.values()
                if p.is_leader and len(p.assignment.isr) < len(p.assignment.replicas)
            )
        )

    def _look_again_later(self, key: TopicPartition) -> None:
        """Make every fetch session holding ``key`` look at it again after the fetch backoff
        (not at once: a parked follower fetch would wake and propose the same change again
        as fast as the controller answers)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # outside the event loop (unit tests call the handlers directly)
            self._fetch_sessions.touch(key)
            return
        loop.call_later(self.replication.fetch_backoff_ms / 1000, self._fetch_sessions.touch, key)

    def _touch_for_new_incarnations(self, previous: MetadataImage, image: MetadataImage) -> None:
        """A restarted follower's first fetches may arrive before this broker's metadata
        shows its new registration: they are served but count for nothing
        (:meth:`_current_incarnation`). Its fetch session then names only partitions whose
        fetch offset moves, so on an idle partition the follower would rejoin the ISR only at
        the session's next full pass (2 x replica.lag.time.max.ms). Once the registration is
        known, every partition it replicates that we lead is looked at again on its next
        fetch (touched), with the fetch offset its session holds."""
        renewed = {
            broker for broker in image.brokers
            if image.broker_epoch(broker) != previous.broker_epoch(broker)
        }
        if not renewed:
            return
        for key, partition in self.partitions.items():
            if partition.is_leader and not renewed.isdisjoint(partition.assignment.replicas):
                self._fetch_sessions.touch(key)

    def _open_partitions(
        self,
        items: list[tuple[TopicPartition, PartitionAssignment, TopicSettings]],
        now_ms: int,
    ) -> list[tuple[TopicPartition, Partition]]:
        """Open (or create) the logs of ``items`` and their :class:`Partition` state. Blocking
        file I/O: runs in a worker thread; a log that cannot be opened is logged and left out
        (the next metadata change tries again)."""
        out: list[tuple[TopicPartition, Partition]] = []
        for key, assignment, settings in items:
            topic, number = key
            try:
                plog = self._logs.get_or_create(topic, number, settings.log_config)
            except FjordError as exc:
                log.error("cannot open log of %s-%d: %s", topic, number, exc)
                continue
            out.append((key, Partition(
                topic,
                number,
                self.broker_id,
                plog,
                assignment,
                min_insync_replicas=settings.min_insync_replicas,
                compression=settings.compression,
                max_timestamp_difference_ms=settings.max_timestamp_difference_ms,
                initial_high_watermark=self._initial_high_watermarks.pop(key, None),
                now_ms=now_ms,
            )))
            if len(items) <= defaults.OPEN_PARTITIONS_LOGGED:
                log.info("hosting %s-%d (leader %d, epoch %d)", topic, number,
                         assignment.leader, assignment.leader_epoch)
        return out

    def _current_incarnation(self, replica_id: int, replica_epoch: int) -> bool:
        """Whether a follower's fetch comes from its current registration (Kafka's KIP-903):
        a fetch from an older or not yet registered incarnation of a broker the metadata still
        lists (e.g. restarted before its old lease expired) proves nothing for the ISR or the
        high watermark; it is served, but not counted."""
        image = self.image
        if image is None:
            return True
        registered = image.broker_epoch(replica_id)
        return registered is None or registered == replica_epoch

    def _missing_partition_error(self, topic: str, partition: int) -> FjordError:
        """Kafka's choice: NOT_LEADER_OR_FOLLOWER when the partition exists elsewhere,
        UNKNOWN_TOPIC_OR_PARTITION when this broker's metadata does not know it,
        INVALID_TOPIC_EXCEPTION (not retriable) when no topic can have that name."""
        problem = topic_name_problem(topic)
        if problem is not None:
            return InvalidTopicError(problem)
        image = self.image
        if image is not None and image.partition(topic, partition) is not None:
            return NotLeaderOrFollowerError(
                f"broker {self.broker_id} hosts no replica of {topic}-{partition}"
            )
        return UnknownTopicOrPartitionError(f"unknown topic or partition {topic}-{partition}")

    # --- wakeups ------------------------------------------------------------------------------

    def _notify_high_watermark(
        self, key: TopicPartition, partition: Partition, new_bytes: int | None,
        *, by_follower_fetch: bool = False,
    ) -> None:
        """The partition's high watermark advanced (by ``new_bytes`` bytes, None: unknown).
        ``by_follower_fetch``: a follower's fetch moved it and nothing was appended, so the
        sessions of followers are marked but their parked fetches not woken: a parked
        follower fetch waits for bytes (min_bytes >= 1; with 0 it never parks), and a moved
        high watermark alone does not answer it (Kafka's rule); it carries the new value in
        its next answer. Woken, it only ran a pass that answered nothing."""
        self._fetch_sessions.touch(
            key, _not_a_follower_session if by_follower_fetch else None
        )
        hw = partition.high_watermark
        for produce_op in self._produce_waiters.watchers(key):
            if produce_op.on_high_watermark(key, hw):
                self._complete(produce_op)
        for fetch_op in self._fetch_waiters.watchers(key):
            if fetch_op.on_visible_bytes(key, new_bytes):
                self._complete(fetch_op)

    def _notify_log_end(self, key: TopicPartition, new_bytes: int) -> None:
        """Bytes were appended beyond the high watermark: only followers can read them."""
        self._fetch_sessions.touch(key)
        for fetch_op in self._fetch_waiters.watchers(key):
            if fetch_op.for_replica and fetch_op.on_visible_bytes(key, new_bytes):
                self._complete(fetch_op)

    def _complete(self, op: DelayedFetch | DelayedProduce) -> None:
        future = self._wakeups.get(op)
        if future is not None and not future.done():
            future.set_result(None)
            self.waiters_woken += 1

    def _wake_producers(self, key: TopicPartition) -> None:
        self._fetch_sessions.touch(key)  # leadership changed: fetchers' answers too
        for op in self._produce_waiters.watchers(key):
            self._complete(op)

    def _wake_fetchers(self, key: TopicPartition) -> None:
        self._fetch_sessions.touch(key)
        for op in self._fetch_waiters.watchers(key):
            self._complete(op)

    def parked(self) -> tuple[int, int]:
        """(fetches, produces) parked in purgatory and not completed yet: what Kafka reports as
        its purgatory sizes. An operation counts from the moment it waits until it is completed,
        woken or timed out, so a caller can tell "parked and still waiting" without sleeping."""

        def waiting(purgatory: Purgatory[Any]) -> int:
            return sum(
                1
                for op in purgatory.operations()
                if (future := self._wakeups.get(op)) is not None and not future.done()
            )

        sessions = sum(1 for woken in self._session_waits if not woken.done())
        return waiting(self._fetch_waiters) + sessions, waiting(self._produce_waiters)

    async def _wait(
        self,
        op: DelayedFetch | DelayedProduce,
        purgatory: Purgatory[Any],
        timeout_s: float,
    ) -> None:
        """Park until ``op`` is completed (or woken by a leadership change) or the timeout."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._wakeups[op] = future
        purgatory.watch(op)
        parked = metrics.BROKER_PURGATORY_SIZE.labels(
            operation="fetch" if isinstance(op, DelayedFetch) else "produce"
        )
        parked.inc()
        try:
            # Resumed on the first loop turn after the wake-up (asyncio.wait_for: a turn
            # later): an append's records reach a parked fetch sooner (fjord.wakeups).
            await wait_woken(future, timeout_s)
        finally:
            parked.dec()
            purgatory.unwatch(op)
            self._wakeups.pop(op, None)

    def close(self) -> None:
        """The broker is shutting down: answer every parked fetch and produce now."""
        self.closing = True
        for op in list(self._wakeups):
            self._complete(op)
        for woken in list(self._session_waits):
            if not woken.done():
                woken.set_result(None)

    # --- produce ------------------------------------------------------------------------------

    async def produce(self, request: ProduceInput) -> broker_pb2.ProduceResponse:
        """Append every partition's batches; acks=all waits for the high watermark."""
        response = broker_pb2.ProduceResponse()
        acks = request.acks
        if acks not in (0, 1, -1):
            bad_acks = InvalidRequiredAcksError(f"acks must be 0, 1 or -1 (all), got {acks}")
            for topic in request.topics:
                topic_out = response.topics.add(name=topic.name)
                for p in topic.partitions:
                    out = topic_out.partitions.add(
                        partition=p.partition, base_offset=-1, log_append_time_ms=-1
                    )
                    _set_error(out, bad_acks)
            return response
        waiting: dict[TopicPartition, tuple[Any, Partition, int]] = {}
        rewritten = await self._recompressed(request)
        woken_before = self.waiters_woken
        for topic in request.topics:
            topic_out = response.topics.add(name=topic.name)
            for p in topic.partitions:
                out = topic_out.partitions.add(
                    partition=p.partition, base_offset=-1, log_append_time_ms=-1
                )
                key = TopicPartition(topic.name, p.partition)
                partition = self.partitions.get(key)
                try:
                    partition = self._writable(partition, topic.name, p.partition)
                    if topic.name in self.coordinator_fences and partition.is_leader:
                        self._admit_coordinator(topic.name, p.partition, p.coordinator_epoch)
                        if not p.records:
                            # A new owner's claim: its epoch is now the newest here; nothing
                            # is appended, the answer is the log end (what it must replay to).
                            partition.check_leader()
                            out.base_offset = partition.log_end_offset
                            out.log_start_offset = partition.log_start_offset
                            continue
                    # p.records copies the payload at each read (upb): read it once.
                    payload = p.records
                    records = rewritten.get(key, payload)
                    if isinstance(records, FjordError):
                        raise records
                    outcome = partition.append_as_leader(records, acks)
                except Exception as exc:
                    self._append_failed(out, exc)
                    continue
                info = outcome.info
                out.base_offset = info.first_offset
                append_time = getattr(info, "log_append_time", -1)
                out.log_append_time_ms = append_time if append_time is not None else -1
                out.log_start_offset = partition.log_start_offset
                metrics.record_bytes_in(topic.name, len(payload), info.record_count)
                self._notify_append(key, partition, outcome.high_watermark_advanced,
                                    len(payload))
                required = info.last_offset + 1
                if acks == -1 and partition.high_watermark < required:
                    waiting[key] = (out, partition, required)
        if waiting:
            await self._await_replication(waiting, request.timeout_ms)
        elif self.waiters_woken != woken_before:
            # These appends woke parked fetches (a consumer's or follower's long poll, or a
            # produce waiting for the high watermark): let them answer on the next loop turn,
            # before this answer is serialised and sent (~0.1 ms): the woken answer carries
            # the records on to their readers, this one only acknowledges.
            await asyncio.sleep(0)
        return response

    async def _recompressed(
        self, request: ProduceInput
    ) -> dict[TopicPartition, bytes | FjordError]:
        """Kafka's LogValidator on the leader, for topics whose configs ask for it: record
        timestamps checked against message.timestamp.difference.max.ms (INVALID_TIMESTAMP),
        then each payload with a batch whose codec differs from its topic's compression.type
        (not ``producer``) rewritten in that codec; or the typed error that makes the
        partition's append fail (nothing is appended). Partitions whose topic asks for
        neither are not in the answer and cost nothing. Large payloads are handled in a worker
        thread, off the event loop."""
        out: dict[TopicPartition, bytes | FjordError] = {}
        for topic in request.topics:
            for p in topic.partitions:
                key = TopicPartition(topic.name, p.partition)
                partition = self.partitions.get(key)
                if partition is None:
                    continue
                codec = partition.compression
                difference = partition.max_timestamp_difference_ms
                # Checked before p.records is read: each read of a protobuf bytes field copies
                # the payload, and most topics ask for neither check.
                if (codec is None and difference is None) or not p.records:
                    continue
                rewrite = codec is not None and needs_recompression(p.records, codec)
                if not rewrite and difference is None:
                    continue
                limit = partition.log.config.max_message_bytes

                def validate(records: bytes = p.records, codec: Compression | None = codec,
                             difference: int | None = difference, rewrite: bool = rewrite,
                             limit: int = limit) -> bytes:
                    if difference is not None:  # against the wall clock, as Kafka's
                        check_timestamps(records, int(time.time() * 1000), difference)
                    if rewrite and codec is not None:  # Compression.NONE is falsy
                        return recompress(records, codec, limit)
                    return records

                try:
                    if len(p.records) > defaults.RECOMPRESS_INLINE_MAX_BYTES:
                        out[key] = await asyncio.to_thread(validate)
                    else:
                        out[key] = validate()
                except FjordError as exc:
                    out[key] = exc
        return out

    def _writable(self, partition: Partition | None, topic: str, number: int) -> Partition:
        """``partition``, unless it is not hosted or this broker may not append (fenced):
        then raise."""
        if partition is None:
            raise self._missing_partition_error(topic, number)
        if self.fenced:
            raise NotLeaderOrFollowerError(
                f"broker {self.broker_id} lost its registration and is re-registering"
            )
        return partition

    def _append_failed(self, out: Any, exc: Exception) -> None:
        """Answer a failed append in ``out`` (typed errors as they are, anything else as a bug
        or I/O error: answered, never dropped); a storage error is reported."""
        if not isinstance(exc, FjordError):
            _set_error(out, _unexpected(exc))
            return
        if isinstance(exc, StorageError):
            self.report_write_error("append", exc)
        _set_error(out, exc)

    def _notify_append(
        self, key: TopicPartition, partition: Partition, hw_advanced: bool, nbytes: int
    ) -> None:
        if hw_advanced:
            self._notify_high_watermark(key, partition, nbytes)
        else:
            self._notify_log_end(key, nbytes)

    def _admit_coordinator(self, topic: str, partition: int, epoch: int) -> None:
        """Refuse (typed FjordError) an append to ``topic``-``partition`` (a coordinator's
        topic) from anyone but its current coordinator."""
        owner = None if self.image is None else self.image.offsets_owner(partition)
        known = None if owner is None else owner.coordinator_epoch
        try:
            self.coordinator_fences[topic].admit(partition, epoch, known)
        except FjordError as exc:
            log.warning("refused an append: %s", exc)
            raise

    async def _await_replication(
        self, waiting: dict[TopicPartition, tuple[Any, Partition, int]], timeout_ms: int
    ) -> None:
        timeout_s = (timeout_ms if timeout_ms > 0 else defaults.DEFAULT_REQUEST_TIMEOUT_MS) / 1000
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        epochs = {key: part.leader_epoch for key, (_, part, _) in waiting.items()}
        pending = dict(waiting)
        while pending:
            op = DelayedProduce({k: req for k, (_, _, req) in pending.items()})
            for key, (_, part, _) in pending.items():
                op.on_high_watermark(key, part.high_watermark)
            if not op.completed:
                await self._wait(op, self._produce_waiters, max(0.0, deadline - loop.time()))
            timed_out = loop.time() >= deadline
            for key in list(pending):
                out, waited_on, required = pending[key]
                still_hosted = self.partitions.get(key) is waited_on
                if (
                    not still_hosted
                    or not waited_on.is_leader
                    or waited_on.leader_epoch != epochs[key]
                    or waited_on.stale_partition_epoch >= 0
                ):
                    _set_error(
                        out,
                        NotLeaderOrFollowerError(
                            f"leadership of {key[0]}-{key[1]} moved before the write was "
                            "replicated; it may or may not be committed"
                        ),
                    )
                    del pending[key]
                elif waited_on.high_watermark >= required:
                    if len(waited_on.assignment.isr) < waited_on.min_insync_replicas:
                        # Kafka's check when the delayed produce completes: the ISR shrank
                        # below min.insync.replicas while the batch was being replicated.
                        _set_error(
                            out,
                            NotEnoughReplicasAfterAppendError(
                                f"{key[0]}-{key[1]}: the ISR {list(waited_on.assignment.isr)} "
                                f"fell below min.insync.replicas="
                                f"{waited_on.min_insync_replicas} after the append"
                            ),
                        )
                    del pending[key]
                elif timed_out:
                    _set_error(
                        out,
                        RequestTimedOutError(
                            f"{key[0]}-{key[1]}: not replicated to the ISR within {timeout_s} s"
                        ),
                    )
                    del pending[key]
                elif self.closing:
                    _set_error(
                        out,
                        NotLeaderOrFollowerError(
                            f"broker {self.broker_id} is shutting down before {key[0]}-{key[1]} "
                            "was replicated; the write may or may not be committed"
                        ),
                    )
                    del pending[key]

    # --- transaction markers (WriteTxnMarkers, from the transaction coordinator) -----------

    async def write_txn_markers(
        self, request: broker_pb2.WriteTxnMarkersRequest, timeout_ms: int = 0
    ) -> broker_pb2.WriteTxnMarkersResponse:
        """Append each marker's control batch to each of its partitions this broker leads and
        answer once replicated to the ISR (acks=all; NOT_ENOUGH_REPLICAS below
        min.insync.replicas, REQUEST_TIMED_OUT after ``timeout_ms``). Errors are per partition
        (see :meth:`Partition.append_marker`); the other partitions are written regardless."""
        response = broker_pb2.WriteTxnMarkersResponse()
        now_ms = int(time.time() * 1000)
        # One wait per round of distinct partitions (two markers of one request may end
        # transactions of two producers on the same partition).
        rounds: list[dict[TopicPartition, tuple[Any, Partition, int]]] = []
        for m in request.markers:
            result = response.markers.add(producer_id=m.producer_id)
            try:
                batch = build_control_batch(
                    m.producer_id, m.producer_epoch, committed=m.committed,
                    coordinator_epoch=m.coordinator_epoch, timestamp_ms=now_ms,
                )
                bad: FjordError | None = None
            except FjordError as exc:
                bad = exc
            for tp in m.partitions:
                out = result.partitions.add(topic=tp.topic, partition=tp.partition)
                key = TopicPartition(tp.topic, tp.partition)
                partition = self.partitions.get(key)
                try:
                    if bad is not None:
                        raise bad
                    partition = self._writable(partition, tp.topic, tp.partition)
                    outcome = partition.append_marker(batch)
                except Exception as exc:
                    self._append_failed(out, exc)
                    continue
                self._notify_append(key, partition, outcome.high_watermark_advanced, len(batch))
                required = outcome.info.last_offset + 1
                if partition.high_watermark < required:
                    for waiting in rounds:
                        if key not in waiting:
                            break
                    else:
                        waiting = {}
                        rounds.append(waiting)
                    waiting[key] = (out, partition, required)
        if rounds:
            await asyncio.gather(*(self._await_replication(w, timeout_ms) for w in rounds))
        return response

    # --- fetch --------------------------------------------------------------------------------

    async def fetch(
        self, request: broker_pb2.FetchRequest, *, open_session: bool | None = None,
        region_marker: RegionMarker | None = None, detached: DetachedRecords | None = None,
    ) -> broker_pb2.FetchResponse:
        """A long poll: answer once ``min_bytes`` are available or ``max_wait_ms`` passed.

        Session metadata (``session_id``/``session_epoch``, Kafka's KIP-227, see
        :mod:`fjord.broker.fetch_session`) makes it incremental. ``open_session`` says whether
        a fetch with neither (proto3's zeros, Kafka's INITIAL epoch) opens a session: by default
        only followers' do, so that a gRPC consumer that knows nothing of sessions stays
        sessionless; the Kafka listener passes True (Kafka's numbering exactly).

        ``region_marker`` (zero copy, the Kafka listener's plaintext doors): records of
        verified segments are not read; each partition's ``records`` holds instead the marker
        this function returns for the :class:`FileRegion` where they are.

        ``detached`` (a follower's fetch over gRPC): the records are put there, not into the
        answer (:class:`fjord.broker.fetch_wire.DetachedRecords`: protobuf would copy them
        twice); the caller attaches them for serialisation.
        """
        if request.max_bytes < 0 or request.min_bytes < 0 or request.max_wait_ms < 0:
            response = broker_pb2.FetchResponse()
            _set_error(
                response,
                InvalidRequestError("max_bytes, min_bytes and max_wait_ms must not be negative"),
            )
            return response
        if open_session is None:
            open_session = request.replica_id >= 0
        epoch = request.session_epoch
        if epoch == INITIAL_EPOCH and request.session_id == NO_SESSION and not open_session:
            epoch = FINAL_EPOCH
        if request.session_id == NO_SESSION and epoch == FINAL_EPOCH:
            requested = [
                (TopicPartition(topic.name, fp.partition), fp)
                for topic in request.topics
                for fp in topic.partitions
            ]
            return await self._fetch_sessionless(request, requested, region_marker, detached)
        return await self._fetch_in_session(request, epoch, region_marker, detached)

    async def _fetch_sessionless(
        self, request: broker_pb2.FetchRequest, requested: list[tuple[TopicPartition, Any]],
        region_marker: RegionMarker | None = None, detached: DetachedRecords | None = None,
    ) -> broker_pb2.FetchResponse:
        loop = asyncio.get_running_loop()
        wait_s = min(request.max_wait_ms, defaults.MAX_FETCH_WAIT_MS) / 1000
        deadline = loop.time() + wait_s
        while True:
            answers, total, keys, has_error = await self._fetch_once(
                request, requested, region_marker is not None
            )
            if total >= request.min_bytes or has_error or not keys or self.closing:
                return _render_fetch(answers, region_marker, detached)
            remaining = deadline - loop.time()
            if remaining <= 0:
                return _render_fetch(answers, region_marker, detached)
            op = DelayedFetch(keys, request.min_bytes, total, for_replica=request.replica_id >= 0)
            await self._wait(op, self._fetch_waiters, remaining)
            if loop.time() >= deadline:
                answers = (await self._fetch_once(
                    request, requested, region_marker is not None
                ))[0]
                return _render_fetch(answers, region_marker, detached)

    async def _fetch_in_session(
        self, request: broker_pb2.FetchRequest, epoch: int,
        region_marker: RegionMarker | None = None, detached: DetachedRecords | None = None,
    ) -> broker_pb2.FetchResponse:
        """A fetch that opens, continues or closes a fetch session.

        Only the partitions that may have news are looked at: those the request names, those
        touched since the session's last answer (:meth:`FetchSessionCache.touch`, called
        wherever a partition's log end, high watermark, log start or leadership changes), and,
        every ``session_full_pass_s``, all of them (a follower's caught-up time for the ISR
        is refreshed there, and nothing a touch missed stays unanswered longer). The answer
        holds only partitions with news, unless the fetch is full.
        """
        loop = asyncio.get_running_loop()
        requested = {
            TopicPartition(topic.name, fp.partition): fp
            for topic in request.topics
            for fp in topic.partitions
        }
        forgotten = [
            TopicPartition(topic.name, number)
            for topic in request.forgotten
            for number in topic.partitions
        ]
        owner = ("replica", request.replica_id) if request.replica_id >= 0 else None
        now = self._clock_ms() / 1000  # the injected clock: tests move it for the ISR
        try:
            context = self._fetch_sessions.new_context(
                request.session_id, epoch, requested, forgotten, now, owner
            )
        except FetchSessionError as exc:
            response = broker_pb2.FetchResponse()
            response.error.code = exc.code.code
            response.error.message = str(exc)
            return response
        session = context.session
        if session is None:  # FINAL epoch: the session (if any) closed, a sessionless fetch
            return await self._fetch_sessionless(
                request, list(requested.items()), region_marker, detached
            )
        deadline = loop.time() + min(request.max_wait_ms, defaults.MAX_FETCH_WAIT_MS) / 1000
        # A follower whose broker epoch changed (it registered after its first fetches, which
        # therefore counted for nothing: _current_incarnation) has every partition looked at
        # again, not only those its incremental fetch names: an idle one would otherwise
        # rejoin the ISR only at the next full pass, 2 x replica.lag.time.max.ms later.
        renewed = request.replica_id >= 0 and session.owner_epoch != request.replica_epoch
        if request.replica_id >= 0:
            session.owner_epoch = request.replica_epoch
        full_pass = (context.full or renewed
                     or now - session.last_full_pass >= self._session_full_pass_s)
        if full_pass:
            session.last_full_pass = session.last_refresh = now
            look_at: Iterable[TopicPartition] = list(session.partitions)
            session.dirty.clear()
        else:
            look_at = set(requested)
            if (request.replica_id >= 0 and now - session.last_refresh >= self._session_refresh_s
                    and self._current_incarnation(request.replica_id, request.replica_epoch)):
                session.last_refresh = now
                self._refresh_follower_session(request.replica_id, session, look_at)
        # key -> (answer, state); the latest answer of each key looked at in any pass.
        results: dict[TopicPartition, _FetchAnswer] = {}
        woken: asyncio.Future[None] | None = None

        def wake() -> None:
            if woken is not None and not woken.done():
                woken.set_result(None)
                self.waiters_woken += 1

        while True:
            keys_now = set(look_at) | session.dirty
            session.dirty = set()
            # Keys that carried data before are read again: one pass's byte limits hold.
            keys_now.update(k for k, a in results.items() if a.records)
            items = [
                (key, cached.request)
                for key in keys_now
                if (cached := session.partitions.get(key)) is not None
            ]
            items.sort(key=lambda item: item[0])
            answers, total, _keys, has_error = await self._fetch_once(
                request, items, region_marker is not None, session
            )
            for answer in answers:
                replaced = results.get(answer.key)
                if replaced is not None and isinstance(replaced.records, FileRegion):
                    replaced.records.close()  # read again in this pass
                results[answer.key] = answer
            look_at = ()
            remaining = deadline - loop.time()
            if (total >= request.min_bytes or has_error or remaining <= 0 or self.closing
                    or self._fetch_sessions.get(session.session_id) is not session):
                break
            woken = loop.create_future()
            session.woken = wake
            if session.dirty:
                wake()
            parked = metrics.BROKER_PURGATORY_SIZE.labels(operation="fetch")
            parked.inc()
            self._session_waits.add(woken)
            try:
                await wait_woken(woken, remaining)  # (see _wait)
            finally:
                parked.dec()
                self._session_waits.discard(woken)
                session.woken = None
                woken = None
        chosen: list[_FetchAnswer] = []
        for key in sorted(results):
            answer = results[key]
            cached = session.partitions.get(key)
            if cached is None:
                continue  # forgotten meanwhile (a newer fetch of the session)
            state = answer.state()
            if context.full or has_news(cached, state, answer.always_sent()):
                chosen.append(answer)
            cached.sent_state = state
        response = _render_fetch(chosen, region_marker, detached)
        response.session_id = session.session_id
        return response

    def _refresh_follower_session(
        self, replica_id: int, session: FetchSession[TopicPartition, Any],
        skip: set[TopicPartition],
    ) -> None:
        """A follower's incremental fetch proves again what its previous fetches of the
        partitions it did not name proved: it still holds everything below their fetch offsets
        (Kafka's leader sees each of them in every fetch). Record that for the ISR, without
        answering them: untouched, they have no news."""
        now_ms = self._clock_ms()
        partitions = self.partitions
        for key, cached in session.partitions.items():
            if key in skip:
                continue
            partition = partitions.get(key)
            if partition is not None:
                fp = cached.request
                partition.refresh_follower_fetch(
                    replica_id, fp.fetch_offset, fp.current_leader_epoch, now_ms
                )

    async def _fetch_once(
        self, request: broker_pb2.FetchRequest, requested: list[tuple[TopicPartition, Any]],
        as_regions: bool = False, session: FetchSession[TopicPartition, Any] | None = None,
    ) -> tuple[list[_FetchAnswer], int, list[TopicPartition], bool]:
        """One pass: check every partition of ``requested`` (in that order), then read.
        Returns (one answer per partition, bytes read, keys a delayed fetch should wait on,
        whether any partition had an error). ``session``: the fetch session this pass serves
        (a follower's fetch that advances a high watermark does not mark its own session's
        partition for another look: this pass's answer already holds the new value)."""
        replica_id = request.replica_id
        is_follower = replica_id >= 0
        read_committed = not is_follower and request.isolation_level == READ_COMMITTED
        committed_reads: list[tuple[Any, Partition, int, int]] = []
        max_bytes = min(request.max_bytes or defaults.FETCH_MAX_BYTES, defaults.FETCH_MAX_BYTES)
        slots: list[FetchSlot] = []
        targets: list[tuple[_FetchAnswer, TopicPartition, _PartitionReader]] = []
        keys: list[TopicPartition] = []
        answers: list[_FetchAnswer] = []
        has_error = False
        for key, fp in requested:
            out = _FetchAnswer(key)
            answers.append(out)
            partition = self.partitions.get(key)
            try:
                if partition is None:
                    raise self._missing_partition_error(key[0], key[1])
                if is_follower and partition.on_newer_leader_epoch(fp.current_leader_epoch):
                    log.warning(
                        "%s-%d: replica %d fetched with leader epoch %d, newer than ours "
                        "(%d): not acting as leader until newer metadata arrives",
                        key[0], key[1], replica_id, fp.current_leader_epoch,
                        partition.leader_epoch,
                    )
                    self._wake_producers(key)
                partition.check_leader(fp.current_leader_epoch)
                diverging = None
                if is_follower and fp.damaged_at_fetch_offset:
                    # Check our copy as we read it again (the follower found a bad CRC).
                    log.warning("%s-%d: follower %d reports that the batch at %d failed "
                                "its check; verifying this copy", key[0], key[1],
                                replica_id, fp.fetch_offset)
                    partition.log.distrust(fp.fetch_offset)
                    self._damage_sources[key] = "report"
                if is_follower:
                    diverging = partition.diverging_epoch(fp.last_fetched_epoch, fp.fetch_offset)
                    if diverging is None and self._current_incarnation(
                        replica_id, request.replica_epoch
                    ):
                        if partition.record_follower_fetch(
                            replica_id, fp.fetch_offset, self._clock_ms()
                        ):
                            dirty_before = session is not None and key in session.dirty
                            self._notify_high_watermark(key, partition, None,
                                                        by_follower_fetch=True)
                            if session is not None and not dirty_before:
                                # Our own touch: the high watermark is read below, after it
                                # moved, so this answer carries it; looking again would only
                                # cost a pass (an empty one) before this fetch parks. Other
                                # sessions holding the partition stay touched.
                                session.dirty.discard(key)
                        new_isr = partition.propose_isr_expansion(replica_id)
                        if new_isr is not None:
                            self._request_isr_change(key, partition, new_isr)
                # A diverging follower may fetch past our log end (its extra records are
                # what it must truncate): it gets the divergence, not OFFSET_OUT_OF_RANGE.
                upper = (partition.fetch_upper_bound(fp.fetch_offset, replica_id)
                         if diverging is None else 0)
            except FjordError as exc:
                out.error = exc
                if partition is not None:
                    out.leader_id = partition.assignment.leader
                    out.leader_epoch = partition.leader_epoch
                    # An out-of-range follower restarts from here when it fell behind.
                    out.log_start_offset = partition.log_start_offset
                has_error = True
                continue
            hw = partition.high_watermark
            lso = partition.last_stable_offset
            out.high_watermark = hw
            out.last_stable_offset = lso
            out.log_start_offset = partition.log_start_offset
            out.leader_id = partition.assignment.leader
            out.leader_epoch = partition.leader_epoch
            if diverging is not None:
                # The follower must truncate first: no data, and answer at once.
                out.diverging = diverging
                has_error = True
                continue
            keys.append(key)
            offset = fp.fetch_offset
            if read_committed:
                upper = min(upper, lso)
            if offset >= upper:
                continue  # nothing visible yet: no read at all
            limit = fp.partition_max_bytes
            if limit <= 0:
                limit = defaults.PARTITION_FETCH_MAX_BYTES
            reader = _PartitionReader(partition.log, offset, upper, as_regions)
            slots.append(FetchSlot(limit, reader, partition.log.readable_bytes_bound(offset)))
            targets.append((out, key, reader))
            if read_committed:
                committed_reads.append((out, partition, offset, upper))
        total = 0
        if slots:
            if read_size_bound(slots, max_bytes) > defaults.READ_IN_THREAD_THRESHOLD_BYTES and any(
                reader.may_read_bytes() for _, _, reader in targets
            ):
                # Possibly a big read: keep the event loop free (the log locks its own state).
                # Decided by the bytes there are to read, not by the fetch's limits alone: a
                # follower (limits of megabytes) that is caught up reads a few KiB per answer.
                # Not when every read is a region (zero copy): those read no records, only
                # the index, and a worker-thread hop would cost more than the read.
                datas = await asyncio.to_thread(assemble_fetch, slots, max_bytes)
            else:
                datas = assemble_fetch(slots, max_bytes)
            for (out, read_key, reader), data in zip(targets, datas, strict=True):
                topic_name = read_key[0]
                damage = reader.plog.damage
                if damage is not None and self._damage_seen.get(read_key) != damage.offset:
                    self.handle_damage(read_key, self._damage_sources.pop(read_key, "read"))
                if isinstance(reader.error, LogDamagedError):
                    reader.error = self._damage_error(read_key)
                if reader.error is not None:
                    out.error = reader.error
                    has_error = True
                elif data:
                    out.records = cast("bytes | FileRegion", data)
                    total += len(data)
                    if not is_follower:
                        metrics.record_bytes_out(topic_name, len(data))
        for out, partition, offset, upper in committed_reads:
            if out.records:
                # Kafka's upper bound: the end of what is returned (never past the LSO).
                records = out.records
                end = (records.end_offset if isinstance(records, FileRegion)
                       else end_of_whole_batches(records))
                upper = min(upper, max(offset + 1, end))
                out.aborted = partition.aborted_transactions(offset, upper)
        return answers, total, keys, has_error

    # --- list offsets -------------------------------------------------------------------------

    def list_offsets(
        self, request: broker_pb2.ListOffsetsRequest
    ) -> broker_pb2.ListOffsetsResponse:
        response = broker_pb2.ListOffsetsResponse()
        for topic in request.topics:
            topic_out = response.topics.add(name=topic.name)
            for lp in topic.partitions:
                out = topic_out.partitions.add(
                    partition=lp.partition, timestamp=-1, offset=-1, leader_epoch=-1
                )
                partition = self.partitions.get(TopicPartition(topic.name, lp.partition))
                try:
                    if partition is None:
                        raise self._missing_partition_error(topic.name, lp.partition)
                    if request.replica_id != DEBUGGING_REPLICA_ID:
                        partition.check_leader(lp.current_leader_epoch)
                    self._list_offset(partition, lp.timestamp, request.replica_id, out,
                                      request.isolation_level == READ_COMMITTED)
                except FjordError as exc:
                    _set_error(out, exc)
                except Exception as exc:
                    _set_error(out, _unexpected(exc))
        return response

    def _list_offset(
        self, partition: Partition, timestamp: int, replica_id: int, out: Any,
        read_committed: bool = False,
    ) -> None:
        follower_view = replica_id >= 0 or replica_id == DEBUGGING_REPLICA_ID
        visible_end = partition.log_end_offset if follower_view else (
            partition.last_stable_offset if read_committed else partition.high_watermark
        )
        if timestamp == EARLIEST_TIMESTAMP:
            out.offset = partition.log_start_offset
            out.leader_epoch = partition.leader_epoch
        elif timestamp == LATEST_TIMESTAMP:
            out.offset = visible_end
            out.leader_epoch = partition.leader_epoch
        elif timestamp == MAX_TIMESTAMP:
            found = _max_timestamp(partition.log, visible_end)
            if found is not None:
                out.offset, out.timestamp = found
                out.leader_epoch = partition.leader_epoch
        elif timestamp >= 0:
            found = partition.log.offset_for_timestamp(timestamp)
            if found is not None and found[0] < visible_end:
                out.offset, out.timestamp = int(found[0]), int(found[1])
                out.leader_epoch = partition.leader_epoch
        else:
            raise InvalidRequestError(
                f"timestamp {timestamp}: expected -2 (earliest), -1 (latest), -3 (max "
                "timestamp) or a timestamp in ms >= 0"
            )

    # --- DeleteRecords and OffsetForLeaderEpoch (client requests to the leader) --------------

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """Kafka's DeleteRecords on the leader: move the log start offset up to ``offset``
        (-1: the high watermark); returns the new log start offset (the low watermark).

        Raises NOT_LEADER_OR_FOLLOWER / UNKNOWN_TOPIC_OR_PARTITION like a produce, and
        OFFSET_OUT_OF_RANGE for an offset above the high watermark or below -1. Followers move
        their log start with the leader's on their next fetch (``follow_leader_log_start``)."""
        key = TopicPartition(topic, partition)
        hosted = self.partitions.get(key)
        if hosted is None:
            raise self._missing_partition_error(topic, partition)
        hosted.check_leader()
        hw = hosted.high_watermark
        target = hw if offset == -1 else offset
        if target < 0 or target > hw:
            raise OffsetOutOfRangeError(
                f"{topic}-{partition}: delete-records offset {offset} is outside "
                f"[0, high watermark {hw}]"
            )
        low = hosted.log.delete_records(target)
        self.on_log_start_moved([key])
        return int(low)

    def offset_for_leader_epoch(
        self, topic: str, partition: int, current_leader_epoch: int, leader_epoch: int
    ) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch for a client: (the largest epoch <= ``leader_epoch``
        this leader's log knows, the offset where it ends); raises like a fetch."""
        hosted = self.partitions.get(TopicPartition(topic, partition))
        if hosted is None:
            raise self._missing_partition_error(topic, partition)
        hosted.check_leader(current_leader_epoch)
        epoch, end_offset = hosted.log.end_offset_for_epoch(leader_epoch)
        return int(epoch), int(end_offset)

    # --- replication: ISR changes (leader side) ---------------------------------------------

    def _request_isr_change(
        self, key: TopicPartition, partition: Partition, new_isr: tuple[int, ...]
    ) -> None:
        log.info(
            "%s-%d: asking the controller to change the ISR %s -> %s",
            key[0],
            key[1],
            list(partition.assignment.isr),
            list(new_isr),
        )
        self.isr_requests[key] = IsrChangeRequest(
            key[0],
            key[1],
            partition.leader_epoch,
            partition.assignment.partition_epoch,
            new_isr,
            partition.assignment.isr,
        )
        self.isr_requests_ready.set()

    def check_isr_lag(self) -> int:
        """Propose an ISR shrink for every led partition with a follower that has not caught up
        for replica.lag.time.max.ms (the server calls this periodically). Returns how many."""
        if self.fenced:
            return 0
        now = self._clock_ms()
        proposed = 0
        for key, partition in self.hosted():
            if partition.log.damage is not None and partition.is_leader:
                self.request_resignation(key, "damage")  # again, if refused before
            new_isr = partition.propose_isr_shrink(now, self.replication.lag_time_max_ms)
            if new_isr is not None:
                self._request_isr_change(key, partition, new_isr)
                proposed += 1
        return proposed

    def take_isr_requests(self) -> list[IsrChangeRequest]:
        """Every ISR change and resignation waiting to be sent (the AlterPartition sender takes
        them all)."""
        out = list(self.isr_requests.values()) + list(self.resign_requests.values())
        self.isr_requests.clear()
        self.resign_requests.clear()
        self.isr_requests_ready.clear()
        return out

    # --- damaged copies (found by the scrubber, a read, or a follower's report) ---------------

    def handle_damage(self, key: TopicPartition, source: str) -> DamageAction | None:
        """Act on the damage recorded in ``key``'s log (``log.damage``): re-fetch it as a
        follower, hand leadership over as a leader with another ISR member, or keep refusing
        the damaged range when no healthy copy exists (see :func:`damage_action`). Each damage
        is counted and logged once. Returns the action, None when nothing is damaged."""
        partition = self.partitions.get(key)
        damage = None if partition is None else partition.log.damage
        if partition is None or damage is None:
            return None
        self._fetch_sessions.touch(key)
        assignment = partition.assignment
        action = damage_action(self.broker_id, assignment.leader, assignment.isr)
        new = self._damage_seen.get(key) != damage.offset
        if new:
            self._damage_seen[key] = damage.offset
            self.damage_found += 1
            metrics.record_log_damage(source)
            log.error("%s-%d: this broker's copy is damaged at offset %d (%s; found by %s): %s",
                      key[0], key[1], damage.offset, damage.reason, source, action.value)
        if action is DamageAction.RESIGN:
            self.request_resignation(key, "damage")
        elif action is DamageAction.REFETCH:
            self._truncate_damaged(key, partition)
        elif action is DamageAction.NO_HEALTHY_COPY and new:
            log.error("%s", self._damage_error(key))
        return action

    def _damage_error(self, key: TopicPartition) -> FjordError:
        """What a fetch of the damaged range is answered: NOT_LEADER_OR_FOLLOWER while a healthy
        copy exists elsewhere (the client refreshes its metadata and reads from the new
        leader), CORRUPT_MESSAGE naming offset and way forward when none does."""
        partition = self.partitions[key]
        damage = partition.log.damage
        if damage is None:
            return NotLeaderOrFollowerError(f"{key[0]}-{key[1]}: retry")
        action = damage_action(self.broker_id, partition.assignment.leader,
                               partition.assignment.isr)
        refused = (key, partition.leader_epoch) in self._no_other_leader
        if action is DamageAction.NO_HEALTHY_COPY or refused:
            # No other in-sync replica can take over (now): say so rather than let clients
            # retry NOT_LEADER_OR_FOLLOWER against a leader that stays.
            return LogDamagedError(no_healthy_copy_message(
                key[0], key[1], damage.offset, damage.resume_offset, self.broker_id,
                damage.reason, others_down=action is not DamageAction.NO_HEALTHY_COPY),
                offset=damage.offset)
        return NotLeaderOrFollowerError(
            f"{key[0]}-{key[1]}: broker {self.broker_id}'s copy is damaged at offset "
            f"{damage.offset}; leadership moves to a healthy in-sync replica"
        )

    def _truncate_damaged(self, key: TopicPartition, partition: Partition) -> None:
        """A follower drops its copy from the damaged batch on; the fetcher then fetches it
        again from the leader (a repair, complete once the log end is back where it was)."""
        damage = partition.log.damage
        if damage is None or partition.is_leader:
            return
        old_end = partition.log_end_offset
        try:
            partition.truncate_to(damage.offset)
            self._moved_follower_logs.add(key)
        except (OSError, FjordError) as exc:
            # The truncation could not be made durable (a full disk): the damage stays known
            # (reads of it are refused) and the next fetcher pass tries again.
            if not self.report_write_error("truncation", exc):
                log.warning("%s-%d: truncating the damaged copy at %d failed: %s", key[0],
                            key[1], damage.offset, exc)
            return
        started = self._clock_ms()
        previous = self.repairs.get(key)
        self.repairs[key] = (max(old_end, previous[0]) if previous else old_end,
                             previous[1] if previous else started, damage.offset)
        log.warning("%s-%d: truncated the damaged copy at offset %d (its end was %d); fetching "
                    "it again from leader %d", key[0], key[1], damage.offset, old_end,
                    partition.assignment.leader)

    def _check_repaired(self, key: TopicPartition, partition: Partition) -> None:
        repair = self.repairs.get(key)
        if repair is None or partition.log_end_offset < repair[0]:
            return
        del self.repairs[key]
        self.repairs_done += 1
        seconds = max(0, self._clock_ms() - repair[1]) / 1000
        metrics.record_log_repair(seconds)
        log.warning("%s-%d: repaired: offsets %d..%d fetched again from leader %d in %.2f s",
                    key[0], key[1], repair[2], repair[0] - 1, partition.assignment.leader,
                    seconds)

    # --- giving up leadership (disk cannot be written, damaged copy) -------------------------

    def report_write_error(self, operation: str, exc: BaseException) -> bool:
        """A write to the data directory failed: hand it to the disk monitor (which logs the
        condition once and counts every failure). Returns whether it was recognised."""
        hook = self.on_write_error
        return hook is not None and hook(operation, exc)

    def request_resignation(self, key: TopicPartition, reason: str) -> bool:
        """Ask the controller to move the leadership of ``key`` to another ISR member. Only for
        a partition this broker leads (not fenced), with another ISR member, and not already
        asked in this leader epoch. Returns whether a request was queued."""
        partition = self.partitions.get(key)
        if (
            partition is None
            or self.fenced
            or not partition.is_leader
            or partition.stale_partition_epoch >= 0
            or len(partition.assignment.isr) < 2
            or self._resigning.get(key) == partition.leader_epoch
        ):
            return False
        self._resigning[key] = partition.leader_epoch
        self.resign_requests[key] = IsrChangeRequest(
            key[0],
            key[1],
            partition.leader_epoch,
            partition.assignment.partition_epoch,
            tuple(r for r in partition.assignment.isr if r != self.broker_id),
            partition.assignment.isr,
            resign=True,
            reason=reason,
        )
        self.isr_requests_ready.set()
        return True

    def resign_all(self, reason: str) -> int:
        """:meth:`request_resignation` for every partition this broker leads; returns how
        many requests were queued."""
        return sum(self.request_resignation(key, reason) for key, _ in self.hosted())

    def resigning(self, key: TopicPartition) -> bool:
        """Whether a resignation of ``key`` in its current leader epoch is in flight."""
        partition = self.partitions.get(key)
        return partition is not None and self._resigning.get(key) == partition.leader_epoch

    def _on_resign_result(
        self, request: IsrChangeRequest, error_code: int, state: PartitionAssignment | None
    ) -> None:
        key = TopicPartition(request.topic, request.partition)
        if self._resigning.get(key) == request.leader_epoch:
            del self._resigning[key]
        partition = self.partitions.get(key)
        if error_code == 0 and state is not None:
            metrics.record_leadership_resignation(request.reason)
            log.warning(
                "%s-%d: handed leadership to broker %d (epoch %d, ISR %s): %s",
                key[0], key[1], state.leader, state.leader_epoch, list(state.isr),
                "this broker's data directory cannot be written" if request.reason == "disk"
                else "this broker's copy holds a damaged batch",
            )
        if partition is None or partition.leader_epoch != request.leader_epoch:
            return  # leadership moved on meanwhile (the watch brought the answer first)
        if error_code == 0 and state is not None:
            if state.partition_epoch > partition.assignment.partition_epoch:
                # Adopt the answer before the watch event (as for ISR changes): stop leading.
                partition.update_assignment(state, self._clock_ms())
                self._wake_producers(key)
                self._wake_fetchers(key)
            return
        marker = (key, request.leader_epoch)
        if error_code == ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE.code:
            self._no_other_leader.add(marker)
        if marker not in self._resign_refusals_logged:
            self._resign_refusals_logged.add(marker)
            log.warning(
                "%s-%d: could not hand leadership over (%s); still leading",
                key[0], key[1], error_code_from_number(error_code).name,
            )

    def on_isr_change_result(
        self, request: IsrChangeRequest, error_code: int, state: PartitionAssignment | None
    ) -> None:
        """The controller's answer to one ISR change (``error_code`` 0: committed as ``state``;
        a refusal may carry the controller's current ``state``; an RPC failure is reported as
        UNKNOWN_SERVER_ERROR with no state).

        A stale-epoch refusal fences the partition until metadata newer than the request's
        partition epoch arrives, except when that is already here (the refusal crossed an
        update, or it carries the newer committed state, which is adopted): then the leader
        proposes again at once. A refusal from a controller whose state is older than the
        request's is not stale (the controller's watch lags): it is retried like a failed call.
        """
        if request.resign:
            self._on_resign_result(request, error_code, state)
            return
        key = TopicPartition(request.topic, request.partition)
        partition = self.partitions.get(key)
        if partition is None or partition.leader_epoch != request.leader_epoch:
            return  # leadership moved on meanwhile: the metadata already says what counts
        if error_code == 0 and state is not None:
            current = partition.assignment
            if set(request.new_isr) < set(request.old_isr):
                metrics.record_isr_shrink()
            elif set(request.new_isr) > set(request.old_isr):
                metrics.record_isr_expand()
            # The answer may arrive before the watch event: apply it now (Kafka does too).
            if (
                state.leader_epoch == current.leader_epoch
                and state.partition_epoch > current.partition_epoch
                and partition.update_assignment(state, self._clock_ms())
            ):
                self._notify_high_watermark(key, partition, None)
            return
        stale = error_code in STALE_ISR_ERRORS
        current = partition.assignment
        if stale and state is not None:
            if state.partition_epoch < request.partition_epoch:
                # The controller's view lags behind ours (its watch, e.g. right after a
                # fail-over; the partition epoch grows with every change, leader changes
                # included): our epochs are not stale; retry once it has caught up.
                stale = False
            elif (
                state.leader == self.broker_id
                and state.leader_epoch == current.leader_epoch
                and state.partition_epoch > current.partition_epoch
                # The refusal carries the committed state we have not seen yet: adopt it (as
                # for a commit) instead of waiting for the watch, then propose again from it.
                and partition.update_assignment(state, self._clock_ms())
            ):
                self._notify_high_watermark(key, partition, None)
        advanced = partition.on_isr_change_failed(
            stale_epoch=stale, sent_partition_epoch=request.partition_epoch
        )
        if not stale and set(request.new_isr) > set(request.old_isr):
            # A refused expansion (the follower was not live yet in the controller's view: a
            # restarted broker fetches before its registration reaches the controller) is
            # proposed again only when the partition is looked at again; an idle follower's
            # session names it only at its next full pass, 2 x replica.lag.time.max.ms later
            # (Kafka's leader looks at every partition of a session in every fetch).
            self._look_again_later(key)
        if stale and partition.stale_partition_epoch >= 0:
            log.warning(
                "%s-%d: the controller refused an ISR change for a stale epoch (error %d); "
                "not acting as leader until metadata newer than partition epoch %d arrives",
                key[0],
                key[1],
                error_code,
                partition.stale_partition_epoch,
            )
            self._wake_producers(key)
        elif advanced:
            self._notify_high_watermark(key, partition, None)

    # --- replication: follower side -------------------------------------------------------

    def _leadership_changed(self) -> None:
        self.leadership_generation += 1

    def follower_targets(self) -> dict[TopicPartition, FollowerTarget]:
        """Every hosted partition this broker follows, with its leader and leader epoch (the
        same as long as :attr:`leadership_generation` is)."""
        return {
            key: FollowerTarget(p.assignment.leader, p.leader_epoch)
            for key, p in self.partitions.items()
            if not p.is_leader and p.assignment.leader >= 0
        }

    def _followed(self, key: TopicPartition, target: FollowerTarget) -> Partition | None:
        p = self.partitions.get(key)
        if (
            p is None
            or p.is_leader
            or p.assignment.leader != target.leader_id
            or p.leader_epoch != target.leader_epoch
        ):
            return None
        return p

    def follower_position(
        self, key: TopicPartition, target: FollowerTarget
    ) -> FollowerPosition | None:
        """Where to fetch ``key`` from its leader next; None when we no longer follow it there."""
        p = self._followed(key, target)
        if p is None or not self.disk_writable:
            return None
        if p.log.damage is not None:
            self.handle_damage(key, self._damage_sources.pop(key, "scrub"))
        latest = p.log.latest_epoch if p.log_end_offset > p.log_start_offset else NO_EPOCH
        report = key in self._report_damage
        self._report_damage.discard(key)
        return FollowerPosition(
            key[0], key[1], p.log_end_offset, latest, p.leader_epoch, p.log_start_offset,
            damaged_at_fetch_offset=report,
        )

    def take_moved_follower_logs(self, keys: Iterable[TopicPartition]) -> set[TopicPartition]:
        """Those of ``keys`` whose log end moved outside the fetcher since it last asked
        (forgotten once returned)."""
        moved = self._moved_follower_logs.intersection(keys)
        self._moved_follower_logs.difference_update(moved)
        return moved

    def on_follower_fetch_response(
        self, key: TopicPartition, target: FollowerTarget, out: Any, fetch_offset: int | None = None
    ) -> FollowerFetchResult:
        """Apply one partition of the leader's fetch response: truncate on divergence, append
        the records (offsets and epochs kept), adopt the leader's high watermark.

        ``fetch_offset``: the offset the leader served from (the position the fetch was built
        with). When the log end is no longer there (a repair truncated the log meanwhile) the
        answer is dropped: appending it would leave a hole between the log end and the records
        (an incremental fetch session keeps serving the position the leader last heard)."""
        p = self._followed(key, target)
        if p is None:
            return FollowerFetchResult()  # metadata moved on while the fetch was in flight
        if fetch_offset is not None and p.log_end_offset != fetch_offset:
            log.info("%s-%d: fetched from %d but the log now ends at %d; fetching again",
                     key[0], key[1], fetch_offset, p.log_end_offset)
            return FollowerFetchResult(truncated=True)
        if out.error.code != 0:
            code = error_code_from_number(out.error.code)
            if code is ErrorCode.OFFSET_OUT_OF_RANGE and out.log_start_offset > p.log_end_offset:
                # Retention on the leader passed everything we hold: nothing to keep, so
                # continue from the leader's log start (Kafka's truncateFullyAndStartAt).
                log.warning(
                    "%s-%d: log end %d is below leader %d's log start %d; restarting there",
                    key[0],
                    key[1],
                    p.log_end_offset,
                    target.leader_id,
                    out.log_start_offset,
                )
                try:
                    p.restart_at_leader_log_start(out.log_start_offset)
                except FjordError as exc:
                    return FollowerFetchResult(error=exc)
                return FollowerFetchResult(truncated=True)
            return FollowerFetchResult(error=error_for_code(code, out.error.message))
        try:
            if out.HasField("diverging_epoch"):
                before = (p.log_end_offset, p.log.latest_epoch)
                epoch, end = out.diverging_epoch.epoch, out.diverging_epoch.end_offset
                decision = truncation_for_divergence(
                    epoch,
                    end,
                    p.log.end_offset_for_epoch(epoch),
                    p.log_end_offset,
                    p.high_watermark,
                )
                log.info(
                    "%s-%d: log diverged from leader %d (its epoch %d ends at %d); "
                    "truncating %d -> %d",
                    key[0],
                    key[1],
                    target.leader_id,
                    epoch,
                    end,
                    p.log_end_offset,
                    decision.offset,
                )
                p.truncate_to(decision.offset)
                if (p.log_end_offset, p.log.latest_epoch) == before:
                    # Nothing changed: asking again at once would get the same answer.
                    return FollowerFetchResult(
                        truncated=True,
                        error=FjordError(
                            f"{key[0]}-{key[1]}: divergence at {end} (epoch {epoch}) "
                            "did not shorten the log",
                            code=ErrorCode.UNKNOWN_SERVER_ERROR,
                        ),
                    )
                return FollowerFetchResult(truncated=True)
            appended = p.append_as_follower(out.records, out.high_watermark)
            p.follow_leader_log_start(out.log_start_offset)
            if key in self.repairs:
                self._check_repaired(key, p)
        except CorruptRecordError as exc:
            # What the leader sent failed its check here: tell it on the next fetch, so it
            # verifies its copy (and hands leadership over if that copy is the damaged one).
            self._report_damage.add(key)
            return FollowerFetchResult(error=exc)
        except StorageError as exc:
            return FollowerFetchResult(
                error=exc, quiet=self.report_write_error("follower append", exc)
            )
        except OSError as exc:  # a checkpoint after a truncation could not be written
            return FollowerFetchResult(
                error=StorageError(f"{key[0]}-{key[1]}: {exc}"),
                quiet=self.report_write_error("follower append", exc),
            )
        except FjordError as exc:
            return FollowerFetchResult(error=exc)
        return FollowerFetchResult(appended_bytes=appended)

    def high_watermarks(self) -> dict[TopicPartition, int]:
        """Every hosted partition's high watermark (for the replication-offset-checkpoint)."""
        return {key: p.high_watermark for key, p in self.partitions.items()}

    # --- maintenance (called by the server's periodic tasks) ------------------------------

    def hosted(self) -> list[tuple[TopicPartition, Partition]]:
        """A snapshot of the hosted partitions (safe to iterate while metadata changes)."""
        return list(self.partitions.items())

    def on_log_start_moved(self, keys: Iterable[TopicPartition]) -> None:
        """Retention or delete_records moved log starts: keep high watermarks consistent."""
        for key in keys:
            self._fetch_sessions.touch(key)  # followers follow the log start
            partition = self.partitions.get(key)
            if partition is not None and partition.update_assignment(partition.assignment):
                self._notify_high_watermark(key, partition, None)


def _not_a_follower_session(session: FetchSession[TopicPartition, Any]) -> bool:
    """Whether a fetch session is a consumer's (owner None), not a follower's (owner
    ``("replica", id)``, as :meth:`ReplicaManager._fetch_in_session` opens them)."""
    owner = session.owner
    return not (isinstance(owner, tuple) and owner and owner[0] == "replica")


class _PartitionReader:
    """Reads one partition for :func:`assemble_fetch`; a failure (the log was deleted or
    retention passed the offset since the checks) becomes that partition's error, not the
    whole call's."""

    __slots__ = ("as_region", "error", "offset", "plog", "upper")

    def __init__(
        self, plog: PartitionLog, offset: int, upper: int, as_region: bool = False
    ) -> None:
        self.plog = plog
        self.offset = offset
        self.upper = upper
        #: Where the bytes are (a FileRegion, zero copy) rather than the bytes, when it can.
        self.as_region = as_region
        self.error: FjordError | None = None

    def may_read_bytes(self) -> bool:
        """Whether this read may copy records into memory: always unless it reads a region
        of a verified segment (a lock-free guess: a segment list changing meanwhile only
        decides where the read runs, not what it returns)."""
        return not (self.as_region and self.plog.serves_regions_at(self.offset))

    def __call__(self, limit: int) -> bytes | FileRegion:
        try:
            if self.as_region:
                return self.plog.read_region(self.offset, limit, self.upper)
            return self.plog.read(self.offset, limit, self.upper)
        except FjordError as exc:
            self.error = exc
        except Exception as exc:
            self.error = _unexpected(exc)
        return b""


def _max_timestamp(plog: PartitionLog, visible_end: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the batch with the largest max timestamp below ``visible_end``
    (ties: the earliest), from the segments' own bookkeeping; None for an empty log."""
    best: tuple[int, int] | None = None
    for segment in plog.segments:
        ts = segment.max_timestamp
        offset = segment.offset_of_max_timestamp
        if ts < 0 or offset >= visible_end or segment.next_offset == segment.base_offset:
            continue
        if best is None or ts > best[1]:
            best = (int(offset), int(ts))
    return best


class _FetchAnswer:
    """One partition's answer to a fetch, before it becomes protobuf (a session fetch picks the
    answers with news first)."""

    __slots__ = (
        "aborted", "diverging", "error", "high_watermark", "key", "last_stable_offset",
        "leader_epoch", "leader_id", "log_start_offset", "records",
    )

    def __init__(self, key: TopicPartition) -> None:
        self.key = key
        self.error: FjordError | None = None
        self.high_watermark = -1
        self.last_stable_offset = -1
        self.log_start_offset = -1
        self.leader_id = -1
        self.leader_epoch = -1
        self.diverging: tuple[int, int] | None = None
        self.records: bytes | FileRegion = b""
        #: read_committed: (producer id, first offset) of the aborted transactions that
        #: overlap ``records``.
        self.aborted: Iterable[tuple[int, int]] = ()

    def state(self) -> tuple[int, int, int, int, int]:
        """What an unchanged partition would repeat in every answer (a session leaves it out
        while this stays the same)."""
        return (self.high_watermark, self.last_stable_offset, self.log_start_offset,
                self.leader_id, self.leader_epoch)

    def always_sent(self) -> bool:
        return bool(self.records) or self.error is not None or self.diverging is not None


def _render_fetch(
    answers: Iterable[_FetchAnswer], region_marker: RegionMarker | None = None,
    detached: DetachedRecords | None = None,
) -> broker_pb2.FetchResponse:
    """The FetchResponse of ``answers``, consecutive answers of one topic under one entry
    (records in a FileRegion as the marker ``region_marker`` gives for it; with ``detached``,
    records in memory go there instead, keyed by their place in the answer)."""
    response = broker_pb2.FetchResponse()
    topic_out: Any = None
    topic_name: str | None = None
    topic_index = -1
    for answer in answers:
        name, number = answer.key
        if name != topic_name:
            topic_out = response.topics.add(name=name)
            topic_name = name
            topic_index += 1
        out = topic_out.partitions.add(
            partition=number,
            high_watermark=answer.high_watermark,
            last_stable_offset=answer.last_stable_offset,
            log_start_offset=answer.log_start_offset,
            leader_id=answer.leader_id,
            leader_epoch=answer.leader_epoch,
        )
        if answer.error is not None:
            _set_error(out, answer.error)
        if answer.diverging is not None:
            out.diverging_epoch.epoch, out.diverging_epoch.end_offset = answer.diverging
        if answer.records:
            records = answer.records
            if isinstance(records, FileRegion):
                assert region_marker is not None
                out.records = region_marker(records)
            elif detached is not None:
                detached.records[topic_index, len(topic_out.partitions) - 1] = records
            else:
                out.records = records
            for pid, first in answer.aborted:
                out.aborted_transactions.add(producer_id=pid, first_offset=first)
    return response
