"""The consumer: manual assignment, positions, a prefetching fetcher, typed errors.

Threading: the application calls the consumer from one thread (as in Kafka, the consumer is not
thread-safe); fetches run on the client's private loop thread. The loop keeps one Fetch in
flight per broker, for the assigned, unpaused partitions that have a known position and no
buffered data, so the next records are usually already here when ``poll()`` is called.

With ``group.id`` the consumer is a member of a consumer group (``subscribe``): the membership
decisions live in the pure :class:`fjord.client.group_membership.GroupMembership`; this module
does the coordinator calls on the loop thread (a background task sends heartbeats, auto-commits
and enforces ``max.poll.interval.ms``) and applies rebalances in the thread that calls
``poll()``, where ``on_assign``/``on_revoke`` run (docs/clients.md, "Consumer groups").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import re
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal, overload

from fjord._proto import broker_pb2, coordinator_pb2
from fjord.client.group_membership import (
    GroupAction,
    GroupMembership,
    MembershipConfig,
    MemberState,
    Rebalanced,
)
from fjord.client.metadata import ClusterSnapshot, snapshot_from_response, topic_error
from fjord.client.network import EventLoopThread, Network, transport_error
from fjord.client.types import (
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    TopicPartition,
)
from fjord.config import consumer_config
from fjord.coordinator.defaults import CONSUMER_PROTOCOL_TYPE
from fjord.errors import (
    CommitFailedError,
    ErrorCode,
    FjordError,
    InvalidGroupIdError,
    InvalidRequestError,
    KafkaTimeoutError,
    MaxPollIntervalExceededError,
    OffsetOutOfRangeError,
    error_code_from_number,
    error_for_code,
)
from fjord.records.reader import RecordBatch, read_batches

log = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
_STRATEGY_TIMESTAMP = {"earliest": EARLIEST_TIMESTAMP, "latest": LATEST_TIMESTAMP}


class FeatureNotAvailableError(FjordError, NotImplementedError):
    """An API that belongs to a feature this client does not implement (kept for callers that
    catch it; nothing in the consumer raises it since consumer groups landed)."""

    code = ErrorCode.INVALID_REQUEST


class NoOffsetForPartitionError(OffsetOutOfRangeError):
    """No position for a partition and ``auto.offset.reset=none`` (Kafka's
    NoOffsetForPartitionException): seek() first, or choose earliest/latest."""


class IllegalStateError(FjordError):
    """The call is not valid now (e.g. position() of a partition that is not assigned)."""

    code = ErrorCode.INVALID_REQUEST


# Group answers meaning "this member's generation is over": a commit becomes CommitFailedError.
_COMMIT_FENCED = frozenset(
    {
        ErrorCode.ILLEGAL_GENERATION,
        ErrorCode.UNKNOWN_MEMBER_ID,
        ErrorCode.REBALANCE_IN_PROGRESS,
        ErrorCode.FENCED_INSTANCE_ID,
    }
)


_POLL_TIMER_REFRESH_S = 1.0
"""A group member waiting in a long poll() wakes this often to refresh its poll timer."""


def _now_ms() -> int:
    """The membership's injected clock: monotonic milliseconds."""
    return int(time.monotonic() * 1000)


def _normalize_offsets(
    offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
) -> dict[TopicPartition, OffsetAndMetadata]:
    """``{tp: offset | OffsetAndMetadata}`` checked (offsets >= 0, else the typed
    INVALID_COMMIT_OFFSET_SIZE error) and as OffsetAndMetadata."""
    out: dict[TopicPartition, OffsetAndMetadata] = {}
    for tp, value in offsets.items():
        om = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(value)
        if isinstance(om.offset, bool) or not isinstance(om.offset, int) or om.offset < 0:
            raise FjordError(
                f"invalid offset {om.offset!r} for {tp[0]}-{tp[1]}: offsets are integers >= 0",
                code=ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
            )
        out[TopicPartition(*tp)] = om
    return out


def _subscribed_topics(metadata: bytes) -> tuple[str, ...]:
    from fjord.coordinator.protocol import decode_subscription

    try:
        return decode_subscription(metadata).topics
    except FjordError:
        return ()


_MAX_QUEUED_FETCHES = 2  # per partition: the one being consumed and one prefetched after it
_BASE_OFFSET_AND_LENGTH = struct.Struct(">qi")
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23  # byte position in the batch header


def end_of_whole_batches(data: bytes) -> int:
    """The offset after the last complete batch in ``data`` (-1 when none is complete), read
    from the headers only: where a prefetch continues."""
    end = -1
    pos = 0
    size = len(data)
    while pos + 27 <= size:
        base, length = _BASE_OFFSET_AND_LENGTH.unpack_from(data, pos)
        if length <= 0 or pos + 12 + length > size:
            break
        (delta,) = _LAST_OFFSET_DELTA.unpack_from(data, pos + _LAST_OFFSET_DELTA_AT)
        end = base + delta + 1
        pos += 12 + length
    return end


_new_tuple = tuple.__new__  # builds a ConsumerRecord without NamedTuple's Python-level __new__


class CompletedFetch:
    """Records fetched for one partition, consumed a few at a time by ``poll()``.

    Invariants: ``fetch_offset`` is the position the fetch was made for; the data is used only
    while the partition's position is still that value (else a seek happened and it is
    dropped); ``next_offset`` is the position after everything taken so far. Batches are
    decoded one at a time, when reached, into ``_pending`` (records not yet returned start at
    ``_index``).
    """

    __slots__ = (
        "_batch_end",
        "_batches",
        "_index",
        "_pending",
        "end_offset",
        "fetch_offset",
        "high_watermark",
        "next_offset",
        "tp",
    )

    def __init__(self, tp: TopicPartition, fetch_offset: int, data: bytes, high_watermark: int):
        self.tp = tp
        self.fetch_offset = fetch_offset
        self.next_offset = fetch_offset
        self.high_watermark = high_watermark
        self._batches: Iterator[RecordBatch] = read_batches(data, allow_partial_tail=True)
        self._pending: list[ConsumerRecord] = []
        self._index = 0
        self._batch_end = fetch_offset
        self.end_offset = max(fetch_offset, end_of_whole_batches(data))

    def _decode_next_batch(self) -> bool:
        """Decode the next batch holding records at or after ``next_offset``; False at the end."""
        topic, partition = self.tp
        for batch in self._batches:
            header = batch.header
            position = self.next_offset
            if header.next_offset <= position:
                continue
            if not header.is_control:
                records = [
                    _new_tuple(ConsumerRecord, (topic, partition, o, k, v, hs, ts))
                    for o, ts, k, v, hs in batch.record_tuples()
                    if o >= position
                ]
                if records:
                    self._pending = records
                    self._index = 0
                    self._batch_end = header.next_offset
                    return True
            # Nothing to return in this batch (control batch, or compacted away): skip it.
            self.next_offset = header.next_offset
        return False

    def take(self, limit: int) -> list[ConsumerRecord]:
        """Up to ``limit`` records at or after ``next_offset``, advancing it."""
        out: list[ConsumerRecord] = []
        while len(out) < limit:
            index = self._index
            pending = self._pending
            if index >= len(pending) and not self._decode_next_batch():
                break
            index, pending = self._index, self._pending
            chunk = pending[index : index + limit - len(out)]
            out.extend(chunk)
            self._index = index + len(chunk)
            self.next_offset = chunk[-1].offset + 1
            if self._index >= len(pending):
                # The batch is done: continue after it even if its last offsets were compacted.
                self.next_offset = max(self.next_offset, self._batch_end)
        return out

    @property
    def exhausted(self) -> bool:
        return self._index >= len(self._pending) and not self._decode_next_batch()


class Consumer:
    """Reads records from assigned partitions (Kafka's ``KafkaConsumer`` with ``assign``).

    Invariants: ``poll()`` returns each partition's records in offset order, starting at its
    position, and moves the position past the last record returned; a ``seek`` discards data
    fetched for the old position; paused partitions return nothing until resumed.

    ``tracer_provider`` (an OpenTelemetry SDK provider) traces this consumer's calls without a
    global provider; records keep their ``traceparent`` header (see
    :meth:`ConsumerRecord.trace_context`).
    """

    def __init__(self, config: Mapping[str, Any], *, tracer_provider: Any | None = None) -> None:
        self.config = consumer_config(config)
        cfg = self.config
        self._reset_policy: str = cfg["auto.offset.reset"]
        self._max_poll_records: int = cfg["max.poll.records"]
        self._request_timeout_s = cfg["request.timeout.ms"] / 1000
        self._backoff_s = cfg["retry.backoff.ms"] / 1000
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._assignment: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._resets: dict[TopicPartition, str] = {}
        self._paused: set[TopicPartition] = set()
        self._completed: deque[CompletedFetch] = deque()
        # Per partition with queued fetches: how many, and the last one (a prefetch continues
        # from its end while the application still consumes the earlier one).
        self._queued: dict[TopicPartition, int] = {}
        self._tail: dict[TopicPartition, CompletedFetch] = {}
        self._fetching: dict[int, set[TopicPartition]] = {}
        self._errors: list[FjordError] = []
        self._closed = False
        self._io = EventLoopThread(f"fjord-consumer-{cfg['client.id']}")
        self._network = Network(
            cfg["bootstrap.servers"],
            client_id=cfg["client.id"],
            request_timeout_ms=cfg["request.timeout.ms"],
            allow_auto_topic_creation=cfg["allow.auto.create.topics"],
            service="consumer",
            tracer_provider=tracer_provider,
        )
        self._wakeup: asyncio.Event | None = None
        self._wake_pending = False
        # -- group state (see the "consumer groups" section below) --
        self._group_id: str | None = cfg["group.id"]
        self._mode: str | None = None  # None, "assign" or "subscribe"
        self._auto_commit: bool = cfg["enable.auto.commit"]
        self._auto_store: bool = cfg["enable.auto.offset.store"]
        self._on_assign: Callable[[Consumer, list[TopicPartition]], Any] | None = None
        self._on_revoke: Callable[[Consumer, list[TopicPartition]], Any] | None = None
        # Events for the poll() thread, in order: ("rebalanced", Rebalanced), ("lost", tps),
        # ("error", FjordError).
        self._group_events: deque[tuple[str, Any]] = deque()
        # Offsets stored for auto commit: store_offsets(), or (enable.auto.offset.store) the
        # positions at the start of the last poll(), i.e. after the records returned before it.
        self._stored: dict[TopicPartition, int] = {}
        self._last_committed: dict[TopicPartition, int] = {}
        self._coordinator: str | None = None
        self._joining: asyncio.Task[Any] | None = None
        self._group_wakeup: asyncio.Event | None = None
        self._membership: GroupMembership | None = None
        if self._group_id is not None:
            self._membership = GroupMembership(
                MembershipConfig(
                    group_id=self._group_id,
                    group_instance_id=cfg["group.instance.id"],
                    strategies=cfg["partition.assignment.strategy"],
                    session_timeout_ms=cfg["session.timeout.ms"],
                    heartbeat_interval_ms=cfg["heartbeat.interval.ms"],
                    max_poll_interval_ms=cfg["max.poll.interval.ms"],
                    auto_commit_interval_ms=(
                        cfg["auto.commit.interval.ms"] if self._auto_commit else None
                    ),
                    metadata_max_age_ms=cfg["metadata.max.age.ms"],
                    retry_backoff_ms=cfg["retry.backoff.ms"],
                ),
                _now_ms(),
            )
        self._fetcher = self._io.submit(self._fetch_loop())
        self._group_task = (
            self._io.submit(self._group_loop()) if self._membership is not None else None
        )

    # -- assignment and positions -------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (replacing any earlier assignment). With a
        ``group.id`` a new partition starts at the group's committed offset (else
        ``auto.offset.reset``), and commits are simple commits (no membership)."""
        self._check_open()
        if self._mode == "subscribe":
            raise IllegalStateError(
                "assign() while subscribed: subscription to topics, patterns and manual "
                "assignment are mutually exclusive; unsubscribe() first"
            )
        new = list(dict.fromkeys(TopicPartition(*tp) for tp in partitions))
        self._mode = "assign" if new else None
        self._set_assignment(new)
        self._network.topics_of_interest = {tp.topic for tp in new}
        self._wake()

    def _set_assignment(self, new: list[TopicPartition]) -> None:
        """Fetch exactly ``new``: positions of kept partitions stay, new ones start at the
        committed offset (with a group) or ``auto.offset.reset``."""
        first = "committed" if self._group_id is not None else self._reset_policy
        with self._lock:
            self._assignment = new
            keep = set(new)
            for state in (self._positions, self._resets, self._stored, self._last_committed):
                for tp in [tp for tp in state if tp not in keep]:
                    del state[tp]
            self._paused &= keep
            self._drop_buffered(lambda tp: tp not in keep)
            for tp in new:
                if tp not in self._positions and tp not in self._resets:
                    self._resets[tp] = first

    def partitions_for_topic(self, topic: str, timeout: float | None = None) -> list[int]:
        """The partition numbers of ``topic`` (UNKNOWN_TOPIC_OR_PARTITION when it does not
        exist; a timeout error when no broker answers in ``timeout`` s)."""
        self._check_open()
        wait = self._request_timeout_s if timeout is None else timeout

        async def lookup(deadline: float) -> ClusterSnapshot:
            async def attempt() -> ClusterSnapshot:
                return await self._network.refresh_metadata([topic])

            return await self._network.call_with_retries(
                attempt, deadline=deadline, backoff_s=self._backoff_s, what="Metadata"
            )

        snapshot = self._io.run(lookup(time.monotonic() + wait), wait + 1)
        if topic in snapshot.topic_errors:
            code, message = snapshot.topic_errors[topic]
            raise topic_error(topic, code, message)
        description = snapshot.topics.get(topic)
        if description is None:
            raise error_for_code(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r} does not exist"
            )
        return [p.partition for p in description.partitions]

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer fetches now (assign()ed, or given by the group)."""
        return set(self._assignment)

    def _require_assigned(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        assigned = set(self._assignment)
        out = [TopicPartition(*tp) for tp in tps]
        for tp in out:
            if tp not in assigned:
                raise IllegalStateError(f"partition {tp.topic}-{tp.partition} is not assigned")
        return out

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Make ``offset`` the next position of ``partition``."""
        self._check_open()
        if offset < 0:
            raise OffsetOutOfRangeError(f"seek offset must be >= 0, got {offset}")
        (tp,) = self._require_assigned([partition])
        with self._lock:
            self._positions[tp] = offset
            self._resets.pop(tp, None)
            self._drop_buffered(lambda t: t == tp)
        self._wake()

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._seek_to("earliest", partitions)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._seek_to("latest", partitions)

    def _seek_to(self, strategy: str, partitions: Iterable[TopicPartition]) -> None:
        self._check_open()
        tps = self._require_assigned(partitions) if partitions else list(self._assignment)
        chosen = set(tps)
        with self._lock:
            for tp in tps:
                self._positions.pop(tp, None)
                self._resets[tp] = strategy
            self._drop_buffered(lambda t: t in chosen)
        self._wake()

    def position(self, partition: TopicPartition, timeout: float | None = None) -> int:
        """The offset of the next record ``poll()`` will return for ``partition`` (looks it up
        with ListOffsets when it must be reset; ``timeout`` defaults to request.timeout.ms)."""
        self._check_open()
        (tp,) = self._require_assigned([partition])
        with self._lock:
            if tp in self._positions:
                return self._positions[tp]
        wait = self._request_timeout_s if timeout is None else timeout
        self._io.run(self._reset_positions([tp], wait), wait + 1)
        with self._lock:
            self._raise_pending_error()
            if tp not in self._positions:
                raise KafkaTimeoutError(f"no position for {tp.topic}-{tp.partition} in time")
            return self._positions[tp]

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop returning records of these partitions (positions are kept)."""
        tps = set(self._require_assigned(partitions))
        with self._lock:
            self._paused |= tps
            self._drop_buffered(lambda t: t in tps)

    def resume(self, *partitions: TopicPartition) -> None:
        tps = set(self._require_assigned(partitions))
        with self._lock:
            self._paused -= tps
        self._wake()

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def _drop_buffered(self, predicate: Any) -> None:
        # Called with the lock held.
        self._completed = deque(cf for cf in self._completed if not predicate(cf.tp))
        for tp in [tp for tp in self._queued if predicate(tp)]:
            del self._queued[tp]
            del self._tail[tp]

    def _dequeue(self, cf: CompletedFetch) -> None:
        # Called with the lock held, for the head of ``_completed``.
        self._completed.popleft()
        tp = cf.tp
        left = self._queued.get(tp, 0) - 1
        if left > 0:
            self._queued[tp] = left
        else:
            self._queued.pop(tp, None)
            self._tail.pop(tp, None)

    # -- polling ------------------------------------------------------------------------------

    def poll(self, timeout: float = 0.0) -> list[ConsumerRecord]:
        """Records fetched since the last call (at most ``max.poll.records``), waiting up to
        ``timeout`` seconds for some; raises the typed error of a failed partition."""
        self._check_open()
        deadline = time.monotonic() + max(timeout, 0.0)
        limit = self._max_poll_records
        out: list[ConsumerRecord] = []
        woke_fetcher = False
        membership = self._membership
        if membership is not None:
            self._poll_started(membership)
        in_group = membership is not None and self._mode == "subscribe"
        while True:
            if in_group:
                self._run_group_work()
            with self._lock:
                self._raise_pending_error()
                while self._completed and len(out) < limit:
                    cf = self._completed[0]
                    tp = cf.tp
                    if self._positions.get(tp) != cf.next_offset or tp in self._paused:
                        self._dequeue(cf)
                        continue
                    out.extend(cf.take(limit - len(out)))
                    self._positions[tp] = cf.next_offset
                    if cf.exhausted:
                        self._dequeue(cf)
                        woke_fetcher = True
                if out:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                if in_group and self._group_work_pending():
                    continue
                if membership is not None:
                    # Waiting inside poll() is polling: keep max.poll.interval.ms satisfied
                    # (Kafka's poll timer is refreshed by every round of its poll loop).
                    membership.still_polling(_now_ms())
                    remaining = min(remaining, _POLL_TIMER_REFRESH_S)
                self._arrived.wait(remaining)
        if woke_fetcher:
            self._wake()
        return out

    def _raise_pending_error(self) -> None:
        if self._errors:
            error = self._errors.pop(0)
            raise error

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int], timeout: float | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition, the earliest offset whose timestamp is >= the one given (None
        when there is none)."""
        self._check_open()
        for tp, ts in timestamps.items():
            if ts < 0:
                raise FjordError(
                    f"timestamp for {tp.topic}-{tp.partition} must be >= 0, got {ts}",
                    code=ErrorCode.INVALID_REQUEST,
                )
        wait = self._request_timeout_s if timeout is None else timeout
        asked = {TopicPartition(*tp): ts for tp, ts in timestamps.items()}

        async def lookup() -> dict[TopicPartition, tuple[int, int]]:
            found = await self._list_offsets(asked, wait)
            return await self._refine_to_records(found, asked)

        found = self._io.run(lookup(), wait + 1)
        return {
            tp: OffsetAndTimestamp(off, ts) if off >= 0 else None for tp, (off, ts) in found.items()
        }

    async def _refine_to_records(
        self, found: dict[TopicPartition, tuple[int, int]], asked: dict[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int]]:
        """The broker's time index answers per batch (it never decodes records): the base
        offset of the first batch whose max timestamp is >= the one asked. Kafka's answer is the
        first *record* with such a timestamp, so read that batch and find it. When the read
        fails the broker's (batch-granular) answer is kept."""
        refined = dict(found)
        snapshot = self._network.snapshot
        for tp, (offset, _) in found.items():
            node = snapshot.leader_of(tp)
            if offset < 0 or node is None:
                continue
            request = broker_pb2.FetchRequest(
                replica_id=-1,
                max_wait_ms=0,
                min_bytes=0,
                max_bytes=self.config["max.partition.fetch.bytes"],
                topics=[
                    broker_pb2.FetchTopic(
                        name=tp.topic,
                        partitions=[
                            broker_pb2.FetchPartition(
                                partition=tp.partition,
                                fetch_offset=offset,
                                partition_max_bytes=self.config["max.partition.fetch.bytes"],
                                current_leader_epoch=snapshot.leader_epoch_of(tp),
                                last_fetched_epoch=-1,
                            )
                        ],
                    )
                ],
            )
            try:
                response = await self._network.broker(node.address).Fetch(
                    request, timeout=self._request_timeout_s
                )
            except Exception as exc:
                log.debug("offsets_for_times refinement of %s failed: %s", tp, exc)
                continue
            match = first_record_at_or_after(response, tp, offset, asked[tp])
            if match is not None:
                refined[tp] = match
        return refined

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        return self._edge_offsets(partitions, EARLIEST_TIMESTAMP, timeout)

    def end_offsets(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        """The high watermark of each partition (the offset the next record will get)."""
        return self._edge_offsets(partitions, LATEST_TIMESTAMP, timeout)

    def _edge_offsets(
        self, partitions: Iterable[TopicPartition], ts: int, timeout: float | None
    ) -> dict[TopicPartition, int]:
        self._check_open()
        wait = self._request_timeout_s if timeout is None else timeout
        asked = {TopicPartition(*tp): ts for tp in partitions}
        found = self._io.run(self._list_offsets(asked, wait), wait + 1)
        return {tp: off for tp, (off, _) in found.items()}

    # -- consumer groups: the application's side ---------------------------------------------

    def subscribe(
        self,
        topics: Iterable[str] | str | re.Pattern[str],
        on_assign: Callable[[Consumer, list[TopicPartition]], Any] | None = None,
        on_revoke: Callable[[Consumer, list[TopicPartition]], Any] | None = None,
    ) -> None:
        """Join the consumer group (``group.id``) and consume the partitions it assigns.

        ``topics``: a list of topic names, or a pattern (a ``str`` or compiled ``re`` pattern,
        matched against the whole topic name; internal topics never match) re-evaluated every
        ``metadata.max.age.ms``. ``on_assign(consumer, partitions)`` /
        ``on_revoke(consumer, partitions)`` run in the thread that calls ``poll()`` (or
        ``unsubscribe()``/``close()``) with lists of :class:`TopicPartition`: eager assignors
        revoke everything before a rebalance and assign everything after;
        ``cooperative-sticky`` only what moves. Partitions lost
        (the member was dropped) are passed to ``on_revoke`` too, without a commit first.
        An empty list unsubscribes."""
        self._check_open()
        membership = self._require_group("subscribe()")
        if self._mode == "assign":
            raise IllegalStateError(
                "subscribe() after assign(): subscription to topics, patterns and manual "
                "assignment are mutually exclusive; assign([]) first"
            )
        pattern: re.Pattern[str] | None = None
        names: list[str] = []
        if isinstance(topics, re.Pattern):
            pattern = topics
        elif isinstance(topics, str):
            try:
                pattern = re.compile(topics)
            except re.error as exc:
                raise InvalidRequestError(f"invalid topic pattern {topics!r}: {exc}") from None
        else:
            names = list(dict.fromkeys(topics))
            for name in names:
                if not isinstance(name, str) or not name:
                    raise InvalidRequestError(f"invalid topic name {name!r} in subscribe()")
            if not names:
                self.unsubscribe()
                return
        with self._lock:
            self._on_assign, self._on_revoke = on_assign, on_revoke
            if pattern is not None:
                membership.subscribe_pattern(pattern, _now_ms())
            else:
                membership.subscribe(names)
            self._mode = "subscribe"
        if names:
            self._network.topics_of_interest = set(names)
        self._wake_group()

    def unsubscribe(self) -> None:
        """Leave the group: commit (auto commit), ``on_revoke`` the owned partitions, send
        LeaveGroup (not for a static member, as Kafka), and stop fetching."""
        self._check_open()
        if self._mode != "subscribe" or self._membership is None:
            return
        self._leave("the consumer unsubscribed")
        self._mode = None

    def _leave(self, reason: str) -> None:
        membership = self._membership
        assert membership is not None
        with self._lock:
            owned = [TopicPartition(*tp) for tp in sorted(membership.owned)]
        if owned:
            self._revoke(owned, commit=True)
        with self._lock:
            member_id = membership.member_id
            _, leave = membership.unsubscribe()
            self._group_events.clear()
        self._set_assignment([])
        if leave:
            with contextlib.suppress(Exception):
                self._io.run(self._leave_group(member_id, reason), self._request_timeout_s + 1)

    @overload
    def commit(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None,
        asynchronous: Literal[False] = False,
    ) -> dict[TopicPartition, OffsetAndMetadata]: ...

    @overload
    def commit(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None,
        *,
        asynchronous: Literal[True],
    ) -> concurrent.futures.Future[dict[TopicPartition, OffsetAndMetadata]]: ...

    def commit(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None,
        asynchronous: bool = False,
    ) -> (
        dict[TopicPartition, OffsetAndMetadata]
        | concurrent.futures.Future[dict[TopicPartition, OffsetAndMetadata]]
    ):
        """Commit offsets (the next offset to consume per partition) to the group.

        ``offsets`` default: the positions of every assigned partition (what ``poll()`` has
        returned so far). A member commits with its generation (a refusal because the group
        moved on raises :class:`~fjord.errors.CommitFailedError`); with ``assign()`` it is a
        simple commit, accepted only while the group has no members. Returns what was
        committed, or with ``asynchronous=True`` a ``concurrent.futures.Future`` of it."""
        self._check_open()
        self._require_group("commit()")
        if offsets is None:
            with self._lock:
                chosen = {
                    tp: OffsetAndMetadata(self._positions[tp])
                    for tp in self._assignment
                    if tp in self._positions
                }
        else:
            chosen = _normalize_offsets(offsets)
        coro = self._commit(chosen, time.monotonic() + self._request_timeout_s)
        if asynchronous:
            return self._io.submit(coro)
        return self._io.run(coro, self._request_timeout_s + 1)

    def committed(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None where nothing is committed)."""
        self._check_open()
        self._require_group("committed()")
        tps = [TopicPartition(*tp) for tp in partitions]
        wait = self._request_timeout_s if timeout is None else timeout
        found = self._io.run(self._fetch_committed(tps, time.monotonic() + wait), wait + 1)
        return {tp: (found[tp].offset if tp in found else None) for tp in tps}

    def store_offsets(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None,
        *,
        records: ConsumerRecord | Iterable[ConsumerRecord] | None = None,
    ) -> None:
        """Mark offsets as processed, for the next auto commit (needs
        ``enable.auto.offset.store=false``: then only stored offsets are committed, so a record
        is committed only after the application says it is done with it). ``offsets`` are the
        next offsets to consume; each of ``records`` stores its offset + 1."""
        self._check_open()
        self._require_group("store_offsets()")
        if self._auto_store:
            raise IllegalStateError(
                "store_offsets() needs enable.auto.offset.store=false (with true, poll() "
                "stores the positions itself)"
            )
        wanted: dict[TopicPartition, int] = {}
        if offsets is not None:
            wanted.update({tp: om.offset for tp, om in _normalize_offsets(offsets).items()})
        if records is not None:
            items = [records] if isinstance(records, ConsumerRecord) else list(records)
            for record in items:
                tp = TopicPartition(record.topic, record.partition)
                wanted[tp] = max(wanted.get(tp, -1), record.offset + 1)
        with self._lock:
            assigned = set(self._assignment)
            for tp in wanted:
                if tp not in assigned:
                    raise IllegalStateError(
                        f"store_offsets(): partition {tp.topic}-{tp.partition} is not assigned"
                    )
            self._stored.update(wanted)

    def _require_group(self, what: str) -> GroupMembership:
        if self._membership is None:
            raise InvalidGroupIdError(f"{what} needs a group.id in the consumer configuration")
        return self._membership

    # -- consumer groups: the poll() thread ---------------------------------------------------

    def _poll_started(self, membership: GroupMembership) -> None:
        now = _now_ms()
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        with self._lock:
            expired = membership.poll_called(now)
            if self._auto_store:
                # Records returned before this poll() count as processed (Kafka's rule).
                self._stored.update(self._positions)
            if self._auto_commit and membership.auto_commit_due(now):
                membership.auto_commit_scheduled(now)
                offsets = self._offsets_to_auto_commit()
        if offsets:
            self._io.submit(self._commit_quietly(offsets))
        if self._mode == "subscribe":
            self._run_group_work()
        if expired:
            interval = self.config["max.poll.interval.ms"]
            raise MaxPollIntervalExceededError(
                f"poll() was not called within max.poll.interval.ms ({interval} ms), so this "
                f"consumer left group {self._group_id!r} and its partitions were reassigned; "
                "process records faster, lower max.poll.records or raise max.poll.interval.ms. "
                "The next poll() rejoins the group."
            )

    def _group_work_pending(self) -> bool:
        # Called with the lock held.
        membership = self._membership
        return bool(self._group_events) or (
            membership is not None and membership.should_start_join()
        )

    def _run_group_work(self) -> None:
        """Apply what the group task posted (assignments, lost partitions, errors), and start
        a rebalance when one is needed: callbacks run here, in the poll() thread."""
        membership = self._membership
        assert membership is not None
        while True:
            revoke: tuple[tuple[str, int], ...] = ()
            with self._lock:
                event = self._group_events.popleft() if self._group_events else None
                if event is None:
                    if self._mode != "subscribe" or not membership.should_start_join():
                        return
                    revoke = membership.start_join()
            if event is not None:
                self._apply_group_event(event)
                continue
            if revoke:
                self._revoke([TopicPartition(*tp) for tp in revoke], commit=True)
            self._io.call_soon(self._start_join_task)
            return

    def _apply_group_event(self, event: tuple[str, Any]) -> None:
        kind, payload = event
        if kind == "error":
            raise payload
        if kind == "lost":
            lost = [TopicPartition(*tp) for tp in payload]
            self._revoke(lost, commit=False)
            return
        rebalanced: Rebalanced = payload
        if rebalanced.revoked:
            self._revoke([TopicPartition(*tp) for tp in rebalanced.revoked], commit=True)
        assignment = [TopicPartition(*tp) for tp in rebalanced.assignment]
        self._set_assignment(assignment)
        self._network.topics_of_interest |= {tp.topic for tp in assignment}
        self._wake()
        log.info(
            "group %s generation %d: assigned %s", self._group_id, rebalanced.generation, assignment
        )
        if self._on_assign is not None:
            self._on_assign(self, [TopicPartition(*tp) for tp in rebalanced.added])

    def _revoke(self, partitions: list[TopicPartition], *, commit: bool) -> None:
        """Stop consuming ``partitions``: auto commit their positions first (not for lost
        partitions: another member may own them), then ``on_revoke``."""
        gone = set(partitions)
        try:
            if commit and self._auto_commit:
                with self._lock:
                    offsets = self._final_offsets(partitions)
                if offsets:
                    try:
                        self._io.run(
                            self._commit(offsets, time.monotonic() + self._request_timeout_s),
                            self._request_timeout_s + 1,
                        )
                    except FjordError as exc:
                        log.warning("commit before revoking %s failed: %s", partitions, exc)
            if self._on_revoke is not None:
                self._on_revoke(self, list(partitions))
        finally:
            with self._lock:
                remaining = [tp for tp in self._assignment if tp not in gone]
            self._set_assignment(remaining)

    def _final_offsets(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        # Called with the lock held: what auto commit sends when partitions are given up
        # (revoke, unsubscribe, close): the positions (everything poll() returned counts as
        # processed), or only the stored offsets with enable.auto.offset.store=false.
        source = self._positions if self._auto_store else self._stored
        return {
            tp: OffsetAndMetadata(source[tp])
            for tp in partitions
            if tp in source and source[tp] != self._last_committed.get(tp)
        }

    def _offsets_to_auto_commit(self) -> dict[TopicPartition, OffsetAndMetadata]:
        # Called with the lock held: stored offsets of assigned partitions not yet committed.
        assigned = set(self._assignment)
        return {
            tp: OffsetAndMetadata(offset)
            for tp, offset in self._stored.items()
            if tp in assigned and self._last_committed.get(tp) != offset
        }

    # -- consumer groups: the loop thread -----------------------------------------------------

    def _wake_group(self) -> None:
        def wake() -> None:
            if self._group_wakeup is not None:
                self._group_wakeup.set()

        self._io.call_soon(wake)

    def _notify_poller(self) -> None:
        # Called with the lock held: wake a poll() waiting for records.
        self._arrived.notify_all()

    def _post_lost(self, membership: GroupMembership) -> None:
        # Called with the lock held.
        lost = membership.take_lost()
        if lost:
            self._group_events.append(("lost", lost))
        self._notify_poller()

    def _start_join_task(self) -> None:
        if self._joining is None or self._joining.done():
            self._joining = asyncio.ensure_future(self._join())

    async def _group_loop(self) -> None:
        """Background duties of a member: enforce max.poll.interval.ms, heartbeat, auto commit,
        refresh metadata for patterns and partition counts; sleeps until the next deadline."""
        membership = self._membership
        assert membership is not None
        self._group_wakeup = wakeup = asyncio.Event()
        tasks: dict[str, asyncio.Task[Any]] = {}

        def launch(name: str, coro: Any) -> None:
            running = tasks.get(name)
            if running is not None and not running.done():
                coro.close()
                return
            task = asyncio.ensure_future(coro)
            tasks[name] = task
            task.add_done_callback(lambda _: wakeup.set())

        while not self._closed:
            wakeup.clear()
            now = _now_ms()
            offsets: dict[TopicPartition, OffsetAndMetadata] = {}
            heartbeat: tuple[int, str, str | None] | None = None
            with self._lock:
                subscribed = self._mode == "subscribe"
                member_id = membership.member_id
                leave = membership.check_poll_interval(now) if subscribed else None
                if leave is not None:
                    log.warning(
                        "consumer %s left group %s: poll() not called within max.poll.interval.ms",
                        member_id,
                        self._group_id,
                    )
                    self._post_lost(membership)
                if subscribed and membership.session_expired(now):
                    self._coordinator = None
                if subscribed and membership.heartbeat_due(now):
                    generation = membership.heartbeat_sent(now)
                    heartbeat = (
                        generation,
                        membership.member_id,
                        membership.config.group_instance_id,
                    )
                if self._auto_commit and self._mode is not None and membership.auto_commit_due(now):
                    membership.auto_commit_scheduled(now)
                    offsets = self._offsets_to_auto_commit()
                refresh = subscribed and membership.metadata_due(now)
                deadline = membership.next_deadline_ms()
            if leave:
                launch("leave", self._leave_group(member_id, "max.poll.interval.ms exceeded"))
            if heartbeat is not None:
                launch("heartbeat", self._heartbeat(*heartbeat))
            if offsets:
                launch("commit", self._commit_quietly(offsets))
            if refresh:
                launch("metadata", self._refresh_group_metadata())
            sleep = 1.0 if deadline is None else max((deadline - _now_ms()) / 1000, 0.001)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wakeup.wait(), min(sleep, 1.0))

    async def _coordinator_address(self, deadline: float) -> str:
        address = self._coordinator
        if address is None:
            group_id = self._group_id
            assert group_id is not None

            async def find() -> str:
                return await self._network.find_coordinator(group_id)

            address = await self._network.call_with_retries(
                find, deadline=deadline, backoff_s=self._backoff_s, what="FindCoordinator"
            )
            self._coordinator = address
        return address

    async def _group_call(self, method: str, request: Any, timeout_s: float) -> Any:
        """One call to the group's coordinator (found first when unknown); transport errors
        forget the coordinator and raise the typed retriable error."""
        address = await self._coordinator_address(time.monotonic() + self._request_timeout_s)
        try:
            return await getattr(self._network.coordinator(address), method)(
                request, timeout=timeout_s
            )
        except Exception as exc:
            self._coordinator = None
            raise transport_error(exc, address) from exc

    def _after_group_error(self, code: ErrorCode) -> None:
        if code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE):
            self._coordinator = None

    async def _join(self) -> None:
        """JoinGroup and SyncGroup until this member has an assignment (posted for poll()),
        is reset (lost partitions posted), or fails (the error posted)."""
        membership = self._membership
        assert membership is not None
        cfg = self.config
        join_timeout = max(self._request_timeout_s, cfg["max.poll.interval.ms"] / 1000 + 5)
        while not self._closed:
            with self._lock:
                if membership.state is not MemberState.PREPARING_REBALANCE:
                    return
                join = membership.join_request()
            request = coordinator_pb2.JoinGroupRequest(
                group_id=self._group_id,
                session_timeout_ms=join.session_timeout_ms,
                rebalance_timeout_ms=join.rebalance_timeout_ms,
                member_id=join.member_id,
                group_instance_id=join.group_instance_id or "",
                protocol_type=CONSUMER_PROTOCOL_TYPE,
                protocols=[
                    coordinator_pb2.JoinGroupProtocol(name=n, metadata=md)
                    for n, md in join.protocols
                ],
                client_id=cfg["client.id"],
                reason=join.reason,
            )
            try:
                response = await self._group_call("JoinGroup", request, join_timeout)
                code = error_code_from_number(response.error.code)
            except FjordError as exc:
                log.debug("JoinGroup failed: %s", exc)
                code = exc.code  # transport errors are retriable: rediscover
                response = None
            members = (
                [(m.member_id, m.group_instance_id or None, m.metadata) for m in response.members]
                if response is not None
                else []
            )
            with self._lock:
                action = membership.join_completed(
                    code,
                    member_id=response.member_id if response is not None else "",
                    generation=response.generation_id if response is not None else -1,
                    protocol=response.protocol_name if response is not None else "",
                    leader_id=response.leader if response is not None else "",
                    members=members,
                )
                generation, member_id = membership.generation, membership.member_id
                is_leader, protocol = membership.is_leader, membership.protocol
            if action is GroupAction.JOIN_AGAIN:
                continue
            if action is not GroupAction.SYNC:
                await self._join_failed(action, code, "JoinGroup")
                # poll() may have started the next attempt meanwhile (the loop's top checks).
                continue
            assignments: dict[str, bytes] = {}
            if is_leader:
                topics = {t for _, _, md in members for t in _subscribed_topics(md)}
                counts = await self._partition_counts(topics)
                with self._lock:
                    assignments = membership.assignments_to_send(members, counts)
            sync = coordinator_pb2.SyncGroupRequest(
                group_id=self._group_id,
                generation_id=generation,
                member_id=member_id,
                group_instance_id=join.group_instance_id or "",
                protocol_type=CONSUMER_PROTOCOL_TYPE,
                protocol_name=protocol or "",
                assignments=[
                    coordinator_pb2.SyncGroupAssignment(member_id=m, assignment=a)
                    for m, a in assignments.items()
                ],
            )
            try:
                answer = await self._group_call("SyncGroup", sync, join_timeout)
                code = error_code_from_number(answer.error.code)
                assignment = answer.assignment
            except FjordError as exc:
                log.debug("SyncGroup failed: %s", exc)
                code = exc.code  # transport errors are retriable: rediscover
                assignment = b""
            with self._lock:
                subscribed = membership.subscribed_topics
            counts = await self._partition_counts(subscribed) if code is ErrorCode.NONE else {}
            with self._lock:
                try:
                    result = membership.sync_completed(code, assignment, counts)
                except FjordError as exc:  # undecodable assignment bytes
                    self._group_events.append(("error", exc))
                    self._notify_poller()
                    return
                if isinstance(result, Rebalanced):
                    membership.stable_started(_now_ms())
                    self._group_events.append(("rebalanced", result))
                    self._notify_poller()
            if isinstance(result, Rebalanced):
                self._wake_group()
                return
            if result is not GroupAction.JOIN_AGAIN:
                await self._join_failed(result, code, "SyncGroup")

    async def _join_failed(self, action: GroupAction, code: ErrorCode, what: str) -> None:
        membership = self._membership
        assert membership is not None
        self._after_group_error(code)
        with self._lock:
            if action is GroupAction.RESET:
                self._post_lost(membership)
            elif action is GroupAction.FATAL:
                self._group_events.append(
                    (
                        "error",
                        error_for_code(code, f"{what} for group {self._group_id!r}: {code.name}"),
                    )
                )
        if action is not GroupAction.FATAL:
            await asyncio.sleep(self._backoff_s)
        with self._lock:
            self._notify_poller()

    async def _partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        """Partition counts of ``topics`` (those the metadata knows) from a fresh answer."""
        wanted = set(topics)
        if not wanted:
            return {}
        try:
            snapshot = await asyncio.wait_for(
                self._network.refresh_metadata(wanted), self._request_timeout_s
            )
        except (FjordError, TimeoutError) as exc:
            log.debug("metadata for the group failed: %s", exc)
            snapshot = self._network.snapshot
        counts = {}
        for topic in wanted:
            count = snapshot.partition_count(topic)
            if count:
                counts[topic] = count
        return counts

    async def _all_topic_counts(self) -> dict[str, int]:
        """Every topic and its partition count (a pattern subscription needs all names)."""
        request = broker_pb2.MetadataRequest(all_topics=True, allow_auto_topic_creation=False)
        last: FjordError | None = None
        for address in self._network.candidate_addresses():
            try:
                response = await self._network.broker(address).Metadata(
                    request, timeout=self._request_timeout_s
                )
            except Exception as exc:
                last = transport_error(exc, address)
                continue
            snapshot = snapshot_from_response(response)
            return {name: len(d.partitions) for name, d in snapshot.topics.items()}
        raise last or FjordError("no broker to ask", code=ErrorCode.NETWORK_EXCEPTION)

    async def _refresh_group_metadata(self) -> None:
        membership = self._membership
        assert membership is not None
        with self._lock:
            by_pattern = membership.pattern is not None
            watched = membership.topics_to_watch()
        try:
            if by_pattern:
                counts = await self._all_topic_counts()
            else:
                counts = await self._partition_counts(watched)
        except FjordError as exc:
            log.debug("group metadata refresh failed: %s", exc)
            return
        with self._lock:
            if membership.update_metadata(_now_ms(), counts, all_topics=by_pattern):
                log.info("group %s: rejoining (%s)", self._group_id, membership.rejoin_reason)
                if membership.pattern is not None:
                    self._network.topics_of_interest |= set(membership.subscribed_topics)
                self._notify_poller()

    async def _heartbeat(self, generation: int, member_id: str, instance_id: str | None) -> None:
        membership = self._membership
        assert membership is not None
        request = coordinator_pb2.HeartbeatRequest(
            group_id=self._group_id,
            generation_id=generation,
            member_id=member_id,
            group_instance_id=instance_id or "",
        )
        try:
            response = await self._group_call("Heartbeat", request, self._request_timeout_s)
            code = error_code_from_number(response.error.code)
        except FjordError as exc:
            code = exc.code
        self._after_group_error(code)
        with self._lock:
            action = membership.heartbeat_completed(code, generation, _now_ms())
            if action is GroupAction.RESET:
                log.info("group %s: member %s reset (%s)", self._group_id, member_id, code.name)
                self._post_lost(membership)
            elif action is GroupAction.REJOIN:
                self._notify_poller()
            elif action is GroupAction.FATAL:
                self._post_lost(membership)
                self._group_events.append(
                    ("error", error_for_code(code, f"Heartbeat of group {self._group_id!r}"))
                )
        if action is GroupAction.REDISCOVER:
            self._wake_group()

    async def _leave_group(self, member_id: str, reason: str) -> None:
        request = coordinator_pb2.LeaveGroupRequest(
            group_id=self._group_id,
            members=[coordinator_pb2.MemberIdentity(member_id=member_id, reason=reason)],
        )
        try:
            await self._group_call("LeaveGroup", request, self._request_timeout_s)
        except FjordError as exc:
            log.debug("LeaveGroup failed (the session timeout will remove the member): %s", exc)

    async def _commit_quietly(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        try:
            await self._commit(offsets, time.monotonic() + self._request_timeout_s)
        except FjordError as exc:
            log.warning("auto commit of group %s failed: %s", self._group_id, exc)

    async def _commit(
        self, offsets: dict[TopicPartition, OffsetAndMetadata], deadline: float
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """OffsetCommit, retrying coordinator moves until ``deadline``."""
        membership = self._membership
        assert membership is not None
        if not offsets:
            return {}
        with self._lock:
            as_member = self._mode == "subscribe"
            generation = membership.generation if as_member else -1
            member_id = membership.member_id if as_member else ""
            instance_id = membership.config.group_instance_id if as_member else None
        if as_member and generation < 0:
            raise CommitFailedError(
                f"cannot commit for group {self._group_id!r} now: this consumer is not a member "
                "of a generation (a rebalance is in progress); poll() rejoins, then commit",
                code=ErrorCode.REBALANCE_IN_PROGRESS,
            )
        by_topic: dict[str, list[coordinator_pb2.OffsetCommitPartition]] = {}
        for tp, om in offsets.items():
            by_topic.setdefault(tp.topic, []).append(
                coordinator_pb2.OffsetCommitPartition(
                    partition=tp.partition,
                    committed_offset=om.offset,
                    committed_leader_epoch=-1 if om.leader_epoch is None else om.leader_epoch,
                    committed_metadata=om.metadata,
                )
            )
        request = coordinator_pb2.OffsetCommitRequest(
            group_id=self._group_id,
            generation_id=generation,
            member_id=member_id,
            group_instance_id=instance_id or "",
            topics=[
                coordinator_pb2.OffsetCommitTopic(name=n, partitions=ps)
                for n, ps in by_topic.items()
            ],
        )
        last: FjordError | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaTimeoutError(
                    f"OffsetCommit for group {self._group_id!r} did not succeed in time; "
                    f"last error: {last}"
                )
            try:
                response = await self._group_call("OffsetCommit", request, remaining)
            except FjordError as exc:
                if not exc.retriable:
                    raise
                last = exc
                await asyncio.sleep(self._backoff_s)
                continue
            failures: list[tuple[TopicPartition | None, ErrorCode, str]] = [
                (None, error_code_from_number(response.error.code), response.error.message)
            ]
            for topic in response.topics:
                for p in topic.partitions:
                    failures.append(
                        (
                            TopicPartition(topic.name, p.partition),
                            error_code_from_number(p.error.code),
                            p.error.message,
                        )
                    )
            failures = [f for f in failures if f[1] is not ErrorCode.NONE]
            if not failures:
                with self._lock:
                    for tp, om in offsets.items():
                        self._last_committed[tp] = om.offset
                return dict(offsets)
            failed_tp, code, message = failures[0]
            if code.retriable:
                self._after_group_error(code)
                last = error_for_code(code, message)
                await asyncio.sleep(self._backoff_s)
                continue
            if code in _COMMIT_FENCED:
                if as_member:
                    with self._lock:
                        membership.commit_failed(code, generation)
                        self._post_lost(membership)
                    raise CommitFailedError(
                        f"commit for group {self._group_id!r} refused ({code.name}): the group "
                        "has rebalanced and this consumer's partitions may belong to another "
                        "member now; poll() rejoins",
                        code=code,
                    )
                raise CommitFailedError(
                    f"simple commit (assign()) for group {self._group_id!r} refused "
                    f"({code.name}): the group has active members",
                    code=code,
                )
            where = f"{failed_tp.topic}-{failed_tp.partition}: " if failed_tp is not None else ""
            raise error_for_code(code, f"OffsetCommit {where}{message or code.name}")

    async def _fetch_committed(
        self, partitions: list[TopicPartition], deadline: float
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """OffsetFetch: the committed offsets of ``partitions`` (absent: none committed)."""
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        request = coordinator_pb2.OffsetFetchRequest(
            group_id=self._group_id,
            topics=[
                coordinator_pb2.OffsetFetchTopic(name=n, partitions=ps)
                for n, ps in by_topic.items()
            ],
        )

        async def attempt() -> dict[TopicPartition, OffsetAndMetadata]:
            response = await self._group_call(
                "OffsetFetch", request, max(deadline - time.monotonic(), 0.001)
            )
            code = error_code_from_number(response.error.code)
            if code is not ErrorCode.NONE:
                self._after_group_error(code)
                raise error_for_code(code, f"OffsetFetch for group {self._group_id!r}")
            found: dict[TopicPartition, OffsetAndMetadata] = {}
            for topic in response.topics:
                for p in topic.partitions:
                    tp = TopicPartition(topic.name, p.partition)
                    pcode = error_code_from_number(p.error.code)
                    if pcode is not ErrorCode.NONE:
                        self._after_group_error(pcode)
                        raise error_for_code(pcode, f"OffsetFetch {tp.topic}-{tp.partition}")
                    if p.committed_offset >= 0:
                        epoch = p.committed_leader_epoch
                        found[tp] = OffsetAndMetadata(
                            p.committed_offset, p.metadata, epoch if epoch >= 0 else None
                        )
            return found

        return await self._network.call_with_retries(
            attempt, deadline=deadline, backoff_s=self._backoff_s, what="OffsetFetch"
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("the consumer is closed")

    def close(self) -> None:
        """Stop fetching and close connections. Idempotent. A group member first commits
        (auto commit), calls ``on_revoke`` and leaves the group (a static member does not send
        LeaveGroup: the coordinator keeps its partitions for ``session.timeout.ms``)."""
        if self._closed:
            return
        try:
            if self._membership is not None and self._mode == "subscribe":
                self._leave("the consumer is closing")
            elif self._membership is not None and self._auto_commit and self._mode == "assign":
                with self._lock:
                    offsets = self._final_offsets(self._assignment)
                if offsets:
                    self._io.run(
                        self._commit(offsets, time.monotonic() + self._request_timeout_s),
                        self._request_timeout_s + 1,
                    )
        except FjordError as exc:
            log.warning("committing/leaving the group on close failed: %s", exc)
        finally:
            self._closed = True
        with contextlib.suppress(Exception):
            self._io.run(self._shutdown(), 10.0)
        self._io.stop()

    async def _shutdown(self) -> None:
        self._fetcher.cancel()
        if self._group_task is not None:
            self._group_task.cancel()
        if self._joining is not None:
            self._joining.cancel()
        await asyncio.sleep(0)
        await self._network.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- the loop thread ----------------------------------------------------------------------

    def _wake(self) -> None:
        if not self._wake_pending and self._wakeup is not None:
            self._wake_pending = True
            self._io.call_soon(self._on_wake)

    def _on_wake(self) -> None:
        self._wake_pending = False
        if self._wakeup is not None:
            self._wakeup.set()

    async def _fetch_loop(self) -> None:
        self._wakeup = wakeup = asyncio.Event()
        tasks: set[asyncio.Task[Any]] = set()
        resetting: asyncio.Task[Any] | None = None
        refreshing: asyncio.Task[Any] | None = None
        while not self._closed:
            wakeup.clear()
            snapshot = self._network.snapshot
            need_metadata = False
            by_node: dict[int, dict[TopicPartition, int]] = {}
            with self._lock:
                resets = [tp for tp in self._assignment if tp in self._resets]
                for tp in self._assignment:
                    position = self._positions.get(tp)
                    if position is None or tp in self._paused:
                        continue
                    queued = self._queued.get(tp, 0)
                    if queued >= _MAX_QUEUED_FETCHES:
                        continue
                    if queued:
                        position = self._tail[tp].end_offset  # prefetch what comes next
                    leader = snapshot.leaders.get(tp)
                    if leader is None:
                        need_metadata = True
                        continue
                    if leader in self._fetching:
                        continue
                    by_node.setdefault(leader, {})[tp] = position
                for node_id, partitions in by_node.items():
                    self._fetching[node_id] = set(partitions)
            for node_id, partitions in by_node.items():
                task = asyncio.ensure_future(self._fetch(node_id, partitions))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if resets and (resetting is None or resetting.done()):
                resetting = asyncio.ensure_future(
                    self._reset_positions(resets, self._request_timeout_s)
                )
                resetting.add_done_callback(lambda _: wakeup.set())
            if need_metadata and (refreshing is None or refreshing.done()):
                refreshing = asyncio.ensure_future(self._refresh_quietly())
                refreshing.add_done_callback(lambda _: wakeup.set())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wakeup.wait(), 1.0)

    async def _refresh_quietly(self) -> None:
        try:
            await self._network.refresh_metadata()
        except FjordError as exc:
            log.debug("metadata refresh failed: %s", exc)
            await asyncio.sleep(self._backoff_s)

    async def _fetch(self, node_id: int, partitions: dict[TopicPartition, int]) -> None:
        cfg = self.config
        snapshot = self._network.snapshot
        node = snapshot.brokers.get(node_id)
        by_topic: dict[str, list[broker_pb2.FetchPartition]] = {}
        for tp, offset in partitions.items():
            by_topic.setdefault(tp.topic, []).append(
                broker_pb2.FetchPartition(
                    partition=tp.partition,
                    fetch_offset=offset,
                    partition_max_bytes=cfg["max.partition.fetch.bytes"],
                    current_leader_epoch=snapshot.leader_epoch_of(tp),
                    last_fetched_epoch=-1,
                )
            )
        request = broker_pb2.FetchRequest(
            replica_id=-1,
            max_wait_ms=cfg["fetch.max.wait.ms"],
            min_bytes=cfg["fetch.min.bytes"],
            max_bytes=cfg["fetch.max.bytes"],
            topics=[broker_pb2.FetchTopic(name=n, partitions=ps) for n, ps in by_topic.items()],
            isolation_level=1 if cfg["isolation.level"] == "read_committed" else 0,
        )
        failed = False
        try:
            if node is None:
                raise FjordError(f"broker {node_id} left", code=ErrorCode.BROKER_NOT_AVAILABLE)
            try:
                response = await self._network.broker(node.address).Fetch(
                    request, timeout=self._request_timeout_s
                )
            except Exception as exc:
                raise transport_error(exc, node.address) from exc
            failed = self._store_fetch(partitions, response)
        except FjordError as exc:
            log.debug("fetch from broker %s failed: %s", node_id, exc)
            failed = True
        finally:
            with self._lock:
                self._fetching.pop(node_id, None)
        if failed:
            await self._refresh_quietly()
            await asyncio.sleep(self._backoff_s)
        if self._wakeup is not None:
            self._wakeup.set()

    def _store_fetch(
        self, partitions: dict[TopicPartition, int], response: broker_pb2.FetchResponse
    ) -> bool:
        """Queue the fetched data and handle per-partition errors; True when metadata should
        be refreshed."""
        refresh = False
        top = error_code_from_number(response.error.code)
        if top is not ErrorCode.NONE:
            if top.retriable:
                return True
            with self._lock:
                self._errors.append(error_for_code(top, response.error.message))
                self._arrived.notify_all()
            return False
        with self._lock:
            for topic in response.topics:
                for p in topic.partitions:
                    tp = TopicPartition(topic.name, p.partition)
                    offset = partitions.get(tp)
                    tail = self._tail.get(tp)
                    expected = tail.end_offset if tail is not None else self._positions.get(tp)
                    if offset is None or expected != offset:
                        continue  # a seek moved the position while the fetch was in flight
                    code = error_code_from_number(p.error.code)
                    if code is ErrorCode.NONE:
                        if p.records:
                            cf = CompletedFetch(tp, offset, p.records, p.high_watermark)
                            self._completed.append(cf)
                            self._queued[tp] = self._queued.get(tp, 0) + 1
                            self._tail[tp] = cf
                    elif code is ErrorCode.OFFSET_OUT_OF_RANGE:
                        if tail is None:  # (a prefetch past the end: the next fetch retries)
                            del self._positions[tp]
                            self._resets[tp] = self._reset_policy
                    elif code.retriable:
                        refresh = True
                    else:
                        self._errors.append(
                            error_for_code(
                                code, f"{tp.topic}-{tp.partition}: {p.error.message or code.name}"
                            )
                        )
            self._arrived.notify_all()
        return refresh

    async def _reset_positions(self, tps: list[TopicPartition], timeout: float) -> None:
        with self._lock:
            pending = {tp: self._resets[tp] for tp in tps if tp in self._resets}
        if not pending:
            return
        committed = [tp for tp, strategy in pending.items() if strategy == "committed"]
        if committed:
            # Kafka's refreshCommittedOffsetsIfNeeded: the group's committed offset, else the
            # reset policy.
            try:
                found_committed = await self._fetch_committed(committed, time.monotonic() + timeout)
            except FjordError as exc:
                log.debug("committed offsets lookup failed: %s", exc)
                await asyncio.sleep(self._backoff_s)
                return
            with self._lock:
                for tp in committed:
                    if self._resets.get(tp) != "committed":
                        pending.pop(tp)  # a seek or a new assignment came meanwhile
                        continue
                    if tp in found_committed:
                        del self._resets[tp]
                        self._positions[tp] = found_committed[tp].offset
                        pending.pop(tp)
                    else:
                        self._resets[tp] = pending[tp] = self._reset_policy
                self._arrived.notify_all()
        asked: dict[TopicPartition, int] = {}
        for tp, strategy in pending.items():
            if strategy == "none":
                with self._lock:
                    self._resets.pop(tp, None)
                    self._errors.append(
                        NoOffsetForPartitionError(
                            f"no position for {tp.topic}-{tp.partition} and auto.offset.reset is "
                            "none: seek() to an offset first"
                        )
                    )
                    self._arrived.notify_all()
            else:
                asked[tp] = _STRATEGY_TIMESTAMP[strategy]
        if not asked:
            return
        try:
            found = await self._list_offsets(asked, timeout)
        except FjordError as exc:
            log.debug("offset reset failed: %s", exc)
            await asyncio.sleep(self._backoff_s)
            return
        with self._lock:
            for tp, (offset, _) in found.items():
                if self._resets.get(tp) == pending[tp] and offset >= 0:
                    del self._resets[tp]
                    self._positions[tp] = offset
            self._arrived.notify_all()

    async def _list_offsets(
        self, asked: dict[TopicPartition, int], timeout: float
    ) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets to each partition's leader, retrying retriable errors until
        ``timeout``; returns {tp: (offset, timestamp)}."""
        deadline = time.monotonic() + timeout
        remaining = dict(asked)
        found: dict[TopicPartition, tuple[int, int]] = {}
        last: FjordError | None = None
        while remaining:
            snapshot = self._network.snapshot
            missing = [tp for tp in remaining if tp not in snapshot.leaders]
            if missing:
                try:
                    snapshot = await asyncio.wait_for(
                        self._network.refresh_metadata({tp.topic for tp in missing}),
                        max(deadline - time.monotonic(), 0.001),
                    )
                except FjordError as exc:
                    last = exc
                except TimeoutError:
                    pass
                for tp in missing:
                    if tp.topic in snapshot.topic_errors:
                        code, message = snapshot.topic_errors[tp.topic]
                        if not code.retriable:
                            raise topic_error(tp.topic, code, message)
                        last = topic_error(tp.topic, code, message)
            by_node: dict[int, list[TopicPartition]] = {}
            for tp in remaining:
                leader = snapshot.leaders.get(tp)
                if leader is not None:
                    by_node.setdefault(leader, []).append(tp)
            for node_id, tps in by_node.items():
                node = snapshot.brokers[node_id]
                by_topic: dict[str, list[broker_pb2.ListOffsetsPartition]] = {}
                for tp in tps:
                    by_topic.setdefault(tp.topic, []).append(
                        broker_pb2.ListOffsetsPartition(
                            partition=tp.partition,
                            timestamp=remaining[tp],
                            current_leader_epoch=snapshot.leader_epoch_of(tp),
                        )
                    )
                request = broker_pb2.ListOffsetsRequest(
                    replica_id=-1,
                    isolation_level=0,
                    topics=[
                        broker_pb2.ListOffsetsTopic(name=n, partitions=ps)
                        for n, ps in by_topic.items()
                    ],
                )
                try:
                    response = await self._network.broker(node.address).ListOffsets(
                        request, timeout=max(min(deadline - time.monotonic(), 30.0), 0.001)
                    )
                except Exception as exc:
                    last = transport_error(exc, node.address)
                    continue
                for topic in response.topics:
                    for p in topic.partitions:
                        tp = TopicPartition(topic.name, p.partition)
                        if tp not in remaining:
                            continue
                        code = error_code_from_number(p.error.code)
                        if code is ErrorCode.NONE:
                            found[tp] = (p.offset, p.timestamp)
                            del remaining[tp]
                        elif code.retriable:
                            last = error_for_code(code, p.error.message)
                        else:
                            raise error_for_code(
                                code, f"{tp.topic}-{tp.partition}: {p.error.message or code.name}"
                            )
            if not remaining:
                break
            if time.monotonic() >= deadline:
                raise KafkaTimeoutError(
                    f"no offsets for {sorted(remaining)} within {timeout} s; last error: {last}"
                )
            await asyncio.sleep(self._backoff_s)
            with contextlib.suppress(FjordError, TimeoutError):
                await asyncio.wait_for(
                    self._network.refresh_metadata(),
                    max(deadline - time.monotonic(), 0.001),
                )
        return found


def first_record_at_or_after(
    response: broker_pb2.FetchResponse, tp: TopicPartition, offset: int, timestamp: int
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record at or after ``offset`` in a Fetch answer whose
    timestamp is >= ``timestamp`` (None when the answer holds none, or an error)."""
    for topic in response.topics:
        if topic.name != tp.topic:
            continue
        for p in topic.partitions:
            if p.partition != tp.partition or p.error.code != ErrorCode.NONE.code:
                continue
            try:
                for batch in read_batches(p.records, allow_partial_tail=True):
                    header = batch.header
                    if header.is_control or header.max_timestamp < timestamp:
                        continue
                    for o, ts, _, _, _ in batch.record_tuples():
                        if o >= offset and ts >= timestamp:
                            return o, ts
            except FjordError:
                return None
    return None
