"""The consumer's public API (Kafka's ``KafkaConsumer``): assignment, positions, ``poll()``,
offset lookups and the group calls, with typed errors.

The work is split along Kafka's own seams, each in its module:

* :mod:`fjord.client.subscription_state`: what the parts share (assignment, positions, resets,
  paused partitions, errors for ``poll()``) under one lock;
* :mod:`fjord.client.fetcher`: Fetch requests on the loop thread and the buffered data
  ``poll()`` takes records from (``CompletedFetch``);
* :mod:`fjord.client.offset_fetcher`: ListOffsets, position resets, ``offsets_for_times``;
* :mod:`fjord.client.consumer_coordinator`: group membership (JoinGroup/SyncGroup, heartbeats,
  commits), with the decisions in the pure :mod:`fjord.client.group_membership`.

Threading: the application calls the consumer from one thread (as in Kafka, the consumer is not
thread-safe); fetches and coordinator calls run on the client's private loop thread; rebalances
are applied, and ``on_assign``/``on_revoke`` run, in the thread that calls ``poll()``
(docs/clients.md, "Consumer groups").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, overload

from fjord.client.consumer_coordinator import (
    POLL_TIMER_REFRESH_S,
    ConsumerCoordinator,
    normalize_offsets,
    now_ms,
)
from fjord.client.fetcher import Fetcher, RecordSink
from fjord.client.group_membership import GroupMembership, MembershipConfig
from fjord.client.metadata import ClusterSnapshot, topic_error
from fjord.client.network import EventLoopThread, Network
from fjord.client.offset_fetcher import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    NoOffsetForPartitionError,
    OffsetFetcher,
    no_position_error,
)
from fjord.client.subscription_state import SubscriptionState
from fjord.client.types import (
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    TopicPartition,
)
from fjord.config import consumer_config
from fjord.errors import (
    ErrorCode,
    FjordError,
    InvalidGroupIdError,
    InvalidRequestError,
    KafkaTimeoutError,
    OffsetOutOfRangeError,
    error_for_code,
)
from fjord.security import ClientSecurity

log = logging.getLogger(__name__)

__all__ = [
    "Consumer",
    "FeatureNotAvailableError",
    "IllegalStateError",
    "NoOffsetForPartitionError",
]


class FeatureNotAvailableError(FjordError, NotImplementedError):
    """An API that belongs to a feature this client does not implement (kept for callers that
    catch it; nothing in the consumer raises it since consumer groups landed)."""

    code = ErrorCode.INVALID_REQUEST


class IllegalStateError(FjordError):
    """The call is not valid now (e.g. position() of a partition that is not assigned)."""

    code = ErrorCode.INVALID_REQUEST


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
        self._state = state = SubscriptionState()
        self._io = EventLoopThread(f"fjord-consumer-{cfg['client.id']}")
        self._network = Network(
            cfg["bootstrap.servers"],
            client_id=cfg["client.id"],
            request_timeout_ms=cfg["request.timeout.ms"],
            allow_auto_topic_creation=cfg["allow.auto.create.topics"],
            service="consumer",
            tracer_provider=tracer_provider,
            security=ClientSecurity.from_config(cfg),
        )
        self._offsets = OffsetFetcher(state, self._network, cfg)
        self._fetcher = Fetcher(state, self._network, self._io, cfg, self._offsets)
        self._group_id: str | None = cfg["group.id"]
        self._auto_commit: bool = cfg["enable.auto.commit"]
        self._auto_store: bool = cfg["enable.auto.offset.store"]
        self._coordinator: ConsumerCoordinator | None = None
        if self._group_id is not None:
            membership = GroupMembership(
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
                now_ms(),
            )
            self._coordinator = ConsumerCoordinator(
                self,
                state,
                self._network,
                self._io,
                cfg,
                membership,
                set_assignment=self._set_assignment,
                wake_fetcher=self._fetcher.wake,
            )
            self._offsets.committed_lookup = self._coordinator.fetch_committed
        self._fetch_task = self._io.submit(self._fetcher.run())
        self._group_task = (
            self._io.submit(self._coordinator.run()) if self._coordinator is not None else None
        )

    # -- assignment and positions -------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (replacing any earlier assignment). With a
        ``group.id`` a new partition starts at the group's committed offset (else
        ``auto.offset.reset``), and commits are simple commits (no membership)."""
        self._check_open()
        if self._state.mode == "subscribe":
            raise IllegalStateError(
                "assign() while subscribed: subscription to topics, patterns and manual "
                "assignment are mutually exclusive; unsubscribe() first"
            )
        new = list(dict.fromkeys(TopicPartition(*tp) for tp in partitions))
        self._state.mode = "assign" if new else None
        self._set_assignment(new)
        self._network.topics_of_interest = {tp.topic for tp in new}
        self._fetcher.wake()

    def _set_assignment(self, new: list[TopicPartition]) -> None:
        """Fetch exactly ``new``: positions of kept partitions stay, new ones start at the
        committed offset (with a group) or ``auto.offset.reset``."""
        first = "committed" if self._group_id is not None else self._reset_policy
        with self._state.lock:
            self._state.assignment = new
            keep = set(new)
            for state in (self._state.positions, self._state.resets):
                for tp in [tp for tp in state if tp not in keep]:
                    del state[tp]
            if self._coordinator is not None:
                self._coordinator.forget_unassigned(keep)
            self._state.paused &= keep
            self._fetcher.drop_buffered(lambda tp: tp not in keep)
            for tp in new:
                if tp not in self._state.positions and tp not in self._state.resets:
                    self._state.resets[tp] = first

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
        return set(self._state.assignment)

    def _require_assigned(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        assigned = set(self._state.assignment)
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
        with self._state.lock:
            self._state.positions[tp] = offset
            self._state.resets.pop(tp, None)
            self._fetcher.drop_buffered(lambda t: t == tp)
        self._fetcher.wake()

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._seek_to("earliest", partitions)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._seek_to("latest", partitions)

    def _seek_to(self, strategy: str, partitions: Iterable[TopicPartition]) -> None:
        self._check_open()
        tps = self._require_assigned(partitions) if partitions else list(self._state.assignment)
        chosen = set(tps)
        with self._state.lock:
            for tp in tps:
                self._state.positions.pop(tp, None)
                self._state.resets[tp] = strategy
            self._fetcher.drop_buffered(lambda t: t in chosen)
        self._fetcher.wake()

    def position(self, partition: TopicPartition, timeout: float | None = None) -> int:
        """The offset of the next record ``poll()`` will return for ``partition`` (looks it up
        with ListOffsets when it must be reset; ``timeout`` defaults to request.timeout.ms)."""
        self._check_open()
        (tp,) = self._require_assigned([partition])
        with self._state.lock:
            if tp in self._state.positions:
                return self._state.positions[tp]
        wait = self._request_timeout_s if timeout is None else timeout
        self._io.run(self._offsets.reset_positions([tp], wait), wait + 1)
        with self._state.lock:
            self._state.raise_pending_error()
            if self._state.without_position([tp]) is not None:
                raise no_position_error(tp)
            if tp not in self._state.positions:
                raise KafkaTimeoutError(f"no position for {tp.topic}-{tp.partition} in time")
            return self._state.positions[tp]

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop returning records of these partitions (positions are kept)."""
        tps = set(self._require_assigned(partitions))
        with self._state.lock:
            self._state.paused |= tps
            self._fetcher.drop_buffered(lambda t: t in tps)

    def resume(self, *partitions: TopicPartition) -> None:
        tps = set(self._require_assigned(partitions))
        with self._state.lock:
            self._state.paused -= tps
        self._fetcher.wake()

    def paused(self) -> set[TopicPartition]:
        return set(self._state.paused)

    # -- polling ------------------------------------------------------------------------------

    def poll(self, timeout: float = 0.0) -> list[ConsumerRecord]:
        """Records fetched since the last call (at most ``max.poll.records``), waiting up to
        ``timeout`` seconds for some; raises the typed error of a failed partition.

        A partition whose position reaches a batch that cannot be read (bad CRC, does not
        decode) stops there: the records before it are returned, the other partitions go on,
        and :class:`~fjord.errors.RecordDeserializationError` (naming the partition, the
        offset and where the next intact batch starts) is raised by a ``poll()`` that has
        nothing else to return, again each time, until the application seeks past it."""
        out: list[ConsumerRecord] = []

        def collect(limit: int) -> tuple[int, bool]:
            nonlocal out
            out, used_up = self._fetcher.collect(limit)
            return len(out), used_up

        self._poll(timeout, collect)
        return out

    def poll_into(self, sink: RecordSink, timeout: float = 0.0) -> int:
        """:meth:`poll` for a columnar reader: the records go into ``sink``
        (:class:`fjord.client.fetcher.RecordSink`, e.g. the Spark source's Arrow columns) one
        whole batch at a time, with no ConsumerRecord per record where the sink decodes
        batches itself. Returns how many were added: at least ``max.poll.records`` when that
        many were buffered, and at most the rest of one batch more (a batch is never split,
        and positions move past exactly the records added). Waits and raises as
        :meth:`poll` does."""
        return self._poll(timeout, lambda limit: self._fetcher.collect_into(limit, sink))

    def _poll(self, timeout: float, collect: Callable[[int], tuple[int, bool]]) -> int:
        """The loop of :meth:`poll`: ``collect(max.poll.records)`` under the state's lock
        until it takes records or ``timeout`` passes; returns how many it took."""
        self._check_open()
        deadline = time.monotonic() + max(timeout, 0.0)
        limit = self._max_poll_records
        taken = 0
        woke_fetcher = False
        coordinator = self._coordinator
        if coordinator is not None:
            coordinator.poll_started()
        in_group = coordinator is not None and self._state.mode == "subscribe"
        while True:
            if in_group:
                assert coordinator is not None
                coordinator.run_group_work()
            with self._state.lock:
                self._state.raise_pending_error()
                unplaced = self._state.without_position()
                if unplaced is not None:
                    raise no_position_error(unplaced)
                taken, used_up = collect(limit)
                woke_fetcher = woke_fetcher or used_up
                if taken:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                if coordinator is not None:
                    if in_group and coordinator.work_pending():
                        continue
                    # Waiting inside poll() is polling: keep max.poll.interval.ms satisfied
                    # (Kafka's poll timer is refreshed by every round of its poll loop).
                    coordinator.still_polling()
                    remaining = min(remaining, POLL_TIMER_REFRESH_S)
                self._state.polls_waiting += 1
                try:
                    self._state.arrived.wait(remaining)
                finally:
                    self._state.polls_waiting -= 1
        if woke_fetcher:
            self._fetcher.wake()
        return taken

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
            found = await self._offsets.list_offsets(asked, wait)
            return await self._offsets.refine_to_records(found, asked)

        found = self._io.run(lookup(), wait + 1)
        return {
            tp: OffsetAndTimestamp(off, ts) if off >= 0 else None for tp, (off, ts) in found.items()
        }

    def current_lag(self, partition: TopicPartition) -> int | None:
        """Kafka's ``currentLag``: how far the position is behind the end of the partition as
        the latest fetch saw it (the last stable offset under ``isolation.level=
        read_committed``, else the high watermark); None before a fetch answered or without a
        position. No request is sent."""
        self._check_open()
        (tp,) = self._require_assigned([partition])
        with self._state.lock:
            end = self._fetcher.lag_ends.get(tp)
            position = self._state.positions.get(tp)
        if end is None or position is None:
            return None
        return max(0, end - position)

    def first_record_timestamps(
        self, offsets: Mapping[TopicPartition, int], timeout: float | None = None
    ) -> dict[TopicPartition, int | None]:
        """Fjord's addition: the timestamp of the first record at or after each offset (one
        Fetch per partition, concurrently; the consumer's position does not move). None where
        there is none (the offset is the log end) or the read failed. What time lag needs:
        the timestamp of the first record a group has not committed."""
        self._check_open()
        wait = self._request_timeout_s if timeout is None else timeout
        asked = {TopicPartition(*tp): offset for tp, offset in offsets.items()}

        async def lookup() -> dict[TopicPartition, int | None]:
            tps = list(asked)
            unknown = {tp.topic for tp in tps if tp not in self._network.snapshot.leaders}
            if unknown:
                with contextlib.suppress(FjordError):
                    await self._network.refresh_metadata(unknown)
            found = await asyncio.gather(
                *(self._offsets.first_record(tp, asked[tp]) for tp in tps)
            )
            return {tp: None if hit is None else hit[1] for tp, hit in zip(tps, found, strict=True)}

        return self._io.run(lookup(), wait + 1)

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
        found = self._io.run(self._offsets.list_offsets(asked, wait), wait + 1)
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
        coordinator = self._require_group("subscribe()")
        membership = coordinator.membership
        if self._state.mode == "assign":
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
        with self._state.lock:
            coordinator.set_listener(on_assign, on_revoke)
            if pattern is not None:
                membership.subscribe_pattern(pattern, now_ms())
            else:
                membership.subscribe(names)
            self._state.mode = "subscribe"
        if names:
            self._network.topics_of_interest = set(names)
        coordinator.wake()

    def unsubscribe(self) -> None:
        """Leave the group: commit (auto commit), ``on_revoke`` the owned partitions, send
        LeaveGroup (not for a static member, as Kafka), and stop fetching."""
        self._check_open()
        if self._state.mode != "subscribe" or self._coordinator is None:
            return
        self._coordinator.leave("the consumer unsubscribed")
        self._state.mode = None

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
        coordinator = self._require_group("commit()")
        if offsets is None:
            with self._state.lock:
                chosen = {
                    tp: OffsetAndMetadata(self._state.positions[tp])
                    for tp in self._state.assignment
                    if tp in self._state.positions
                }
        else:
            chosen = normalize_offsets(offsets)
        coro = coordinator.commit(chosen, time.monotonic() + self._request_timeout_s)
        if asynchronous:
            return self._io.submit(coro)
        return self._io.run(coro, self._request_timeout_s + 1)

    def consumer_group_metadata(self) -> ConsumerGroupMetadata:
        """This member's group identity for a transactional producer's
        ``send_offsets_to_transaction`` (confluent-kafka's API): group id, generation, member
        id and ``group.instance.id``."""
        self._check_open()
        if self._coordinator is None or self._group_id is None:
            raise IllegalStateError("consumer_group_metadata() needs a group.id")
        membership = self._coordinator.membership
        return ConsumerGroupMetadata(
            self._group_id,
            membership.generation,
            membership.member_id,
            self.config["group.instance.id"],
        )

    def committed(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None where nothing is committed)."""
        self._check_open()
        coordinator = self._require_group("committed()")
        tps = [TopicPartition(*tp) for tp in partitions]
        wait = self._request_timeout_s if timeout is None else timeout
        found = self._io.run(coordinator.fetch_committed(tps, time.monotonic() + wait), wait + 1)
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
        coordinator = self._require_group("store_offsets()")
        if self._auto_store:
            raise IllegalStateError(
                "store_offsets() needs enable.auto.offset.store=false (with true, poll() "
                "stores the positions itself)"
            )
        wanted: dict[TopicPartition, int] = {}
        if offsets is not None:
            wanted.update({tp: om.offset for tp, om in normalize_offsets(offsets).items()})
        if records is not None:
            items = [records] if isinstance(records, ConsumerRecord) else list(records)
            for record in items:
                tp = TopicPartition(record.topic, record.partition)
                wanted[tp] = max(wanted.get(tp, -1), record.offset + 1)
        with self._state.lock:
            assigned = set(self._state.assignment)
            for tp in wanted:
                if tp not in assigned:
                    raise IllegalStateError(
                        f"store_offsets(): partition {tp.topic}-{tp.partition} is not assigned"
                    )
            coordinator.store(wanted)

    def _require_group(self, what: str) -> ConsumerCoordinator:
        if self._coordinator is None:
            raise InvalidGroupIdError(f"{what} needs a group.id in the consumer configuration")
        return self._coordinator

    # -- consumer groups: the poll() thread ---------------------------------------------------

    # -- lifecycle ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._state.closed:
            raise IllegalStateError("the consumer is closed")

    def close(self) -> None:
        """Stop fetching and close connections. Idempotent. A group member first commits
        (auto commit), calls ``on_revoke`` and leaves the group (a static member does not send
        LeaveGroup: the coordinator keeps its partitions for ``session.timeout.ms``)."""
        if self._state.closed:
            return
        coordinator = self._coordinator
        try:
            if coordinator is not None and self._state.mode == "subscribe":
                coordinator.leave("the consumer is closing")
            elif coordinator is not None and self._auto_commit and self._state.mode == "assign":
                with self._state.lock:
                    offsets = coordinator.final_offsets(self._state.assignment)
                if offsets:
                    self._io.run(
                        coordinator.commit(offsets, time.monotonic() + self._request_timeout_s),
                        self._request_timeout_s + 1,
                    )
        except FjordError as exc:
            log.warning("committing/leaving the group on close failed: %s", exc)
        finally:
            self._state.closed = True
        with contextlib.suppress(Exception):
            self._io.run(self._shutdown(), 10.0)
        self._io.stop()

    async def _shutdown(self) -> None:
        self._fetch_task.cancel()
        if self._group_task is not None:
            self._group_task.cancel()
        if self._coordinator is not None:
            self._coordinator.cancel_tasks()
        await asyncio.sleep(0)
        await self._network.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
