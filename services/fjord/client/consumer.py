"""The consumer: manual assignment, positions, a prefetching fetcher, typed errors.

Threading: the application calls the consumer from one thread (as in Kafka, the consumer is not
thread-safe); fetches run on the client's private loop thread. The loop keeps one Fetch in
flight per broker, for the assigned, unpaused partitions that have a known position and no
buffered data, so the next records are usually already here when ``poll()`` is called.

Consumer groups (``subscribe``, ``commit``, ``committed``) are a later feature: those methods
raise :class:`FeatureNotAvailableError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from fjord._proto import broker_pb2
from fjord.client.metadata import ClusterSnapshot, topic_error
from fjord.client.network import EventLoopThread, Network, transport_error
from fjord.client.types import ConsumerRecord, OffsetAndTimestamp, TopicPartition
from fjord.config import consumer_config
from fjord.errors import (
    ErrorCode,
    FjordError,
    KafkaTimeoutError,
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
    """An API that belongs to a feature this client does not implement yet (consumer groups)."""

    code = ErrorCode.INVALID_REQUEST


class NoOffsetForPartitionError(OffsetOutOfRangeError):
    """No position for a partition and ``auto.offset.reset=none`` (Kafka's
    NoOffsetForPartitionException): seek() first, or choose earliest/latest."""


class IllegalStateError(FjordError):
    """The call is not valid now (e.g. position() of a partition that is not assigned)."""

    code = ErrorCode.INVALID_REQUEST


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
        self._fetcher = self._io.submit(self._fetch_loop())

    # -- assignment and positions -------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (replacing any earlier assignment)."""
        self._check_open()
        new = list(dict.fromkeys(TopicPartition(*tp) for tp in partitions))
        with self._lock:
            self._assignment = new
            keep = set(new)
            for state in (self._positions, self._resets):
                for tp in [tp for tp in state if tp not in keep]:
                    del state[tp]
            self._paused &= keep
            self._drop_buffered(lambda tp: tp not in keep)
            for tp in new:
                if tp not in self._positions and tp not in self._resets:
                    self._resets[tp] = self._reset_policy
        self._network.topics_of_interest = {tp.topic for tp in new}
        self._wake()

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
        return set(self._assignment)

    def subscribe(self, *_: Any, **__: Any) -> None:
        raise FeatureNotAvailableError(
            "subscribe() needs consumer groups, a later feature of Fjord: use assign()"
        )

    def commit(self, *_: Any, **__: Any) -> None:
        raise FeatureNotAvailableError("commit() needs consumer groups, a later feature of Fjord")

    def committed(self, *_: Any, **__: Any) -> None:
        raise FeatureNotAvailableError(
            "committed() needs consumer groups, a later feature of Fjord"
        )

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
        with self._lock:
            while True:
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

    # -- lifecycle ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("the consumer is closed")

    def close(self) -> None:
        """Stop fetching and close connections. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._io.run(self._shutdown(), 10.0)
        self._io.stop()

    async def _shutdown(self) -> None:
        self._fetcher.cancel()
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
