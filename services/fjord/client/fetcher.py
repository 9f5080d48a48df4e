"""The consumer's fetcher (Kafka's ``Fetcher`` and ``FetchBuffer``): Fetch requests on the
client's loop thread, the fetched data buffered per partition, and the records ``poll()`` takes
from it.

The loop keeps one Fetch in flight per broker, for the assigned, unpaused partitions that have
a known position and fewer than two buffered fetches (a prefetch continues where the buffered
data ends), so the next records are usually already here when ``poll()`` is called. The task
that got an answer sends the broker's next Fetch itself as soon as the answer is stored (and
handed to a waiting ``poll()``), so the broker is left without a parked Fetch as briefly as
possible: a record appended meanwhile waits for the next Fetch to arrive.
Positions live in the shared :class:`~fjord.client.subscription_state.SubscriptionState`; the
buffer here is changed only under its lock.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Set
from typing import Any, Protocol

from fjord._proto import broker_pb2
from fjord.client.metadata import ClusterSnapshot
from fjord.client.network import EventLoopThread, Network
from fjord.client.offset_fetcher import OffsetFetcher
from fjord.client.subscription_state import SubscriptionState
from fjord.client.types import ConsumerRecord, TopicPartition
from fjord.config import ClientConfig
from fjord.errors import (
    ErrorCode,
    FjordError,
    RecordDeserializationError,
    error_code_from_number,
    error_for_code,
)
from fjord.records.control import ControlType, control_record_of
from fjord.records.header import NO_PRODUCER_ID, end_of_whole_batches, next_intact_batch_offset
from fjord.records.reader import RecordBatch, read_batches
from fjord.wakeups import wait_event

log = logging.getLogger(__name__)

_MAX_QUEUED_FETCHES = 2  # per partition: the one being consumed and one prefetched after it


class RecordSink(Protocol):
    """Where :meth:`Consumer.poll_into` puts records instead of returning ConsumerRecords (a
    columnar consumer: the Spark source's read tasks build Arrow columns from it).

    ``add_batch`` takes the records at or after ``min_offset`` of one batch of ``topic``'s
    ``partition`` (decoded and checked in full, raising what :meth:`RecordBatch.records_as`
    raises, and then adding nothing) and answers how many it added; ``add_records`` takes
    records already decoded into ConsumerRecords."""

    def add_batch(self, batch: RecordBatch, topic: str, partition: int, min_offset: int) -> int:
        ...

    def add_records(self, records: list[ConsumerRecord]) -> int:
        ...


class CompletedFetch:
    """Records fetched for one partition, consumed a few at a time by ``poll()``.

    Invariants: ``fetch_offset`` is the position the fetch was made for; the data is used only
    while the partition's position is still that value (else a seek happened and it is
    dropped); ``next_offset`` is the position after everything taken so far. Batches are
    decoded one at a time, when reached, into ``_pending`` (records not yet returned start at
    ``_index``). A batch that cannot be read (bad CRC, does not decode, anything raised while
    reading it) sets ``error``, a :class:`RecordDeserializationError` at ``next_offset``: the
    records before it are still taken, none after it.

    read_committed (``aborted`` is not None: the fetch's aborted transactions, ``(producer id,
    first offset)``), Kafka's client rule: before a batch of a producer is read, every aborted
    transaction starting at or before the batch's last offset puts its producer in the aborted
    set; a transactional batch of a producer in that set is skipped whole; that producer's
    ABORT marker takes it out again. Control batches are never returned; positions move past
    them and past skipped batches.
    """

    __slots__ = (
        "_aborted",
        "_aborted_producers",
        "_batch_end",
        "_batches",
        "_data",
        "_index",
        "_peeked",
        "_pending",
        "end_offset",
        "error",
        "fetch_offset",
        "high_watermark",
        "next_offset",
        "tp",
    )

    def __init__(
        self,
        tp: TopicPartition,
        fetch_offset: int,
        data: bytes,
        high_watermark: int,
        aborted: list[tuple[int, int]] | None = None,
    ):
        self.tp = tp
        self.fetch_offset = fetch_offset
        self.next_offset = fetch_offset
        self.high_watermark = high_watermark
        # A heap by first offset (Kafka's PriorityQueue); None: read_uncommitted.
        self._aborted: list[tuple[int, int]] | None = None
        if aborted is not None:
            self._aborted = [(first, pid) for pid, first in aborted]
            heapq.heapify(self._aborted)
        self._aborted_producers: set[int] = set()
        self._data = data
        self._batches: Iterator[RecordBatch] = read_batches(data, allow_partial_tail=True)
        self._peeked: RecordBatch | None = None
        self._pending: list[ConsumerRecord] = []
        self._index = 0
        self._batch_end = fetch_offset
        self.end_offset = max(fetch_offset, end_of_whole_batches(data))
        self.error: RecordDeserializationError | None = None

    def _peek_data_batch(self) -> RecordBatch | None:
        """The next batch that may hold records at or after ``next_offset``, left to
        :meth:`_next_data_batch` (``next_offset`` moves past control batches, aborted ones and
        batches wholly before it); None at the end or at a batch that cannot be read (then
        ``error`` is set)."""
        if self._peeked is not None and self._peeked.header.next_offset > self.next_offset:
            return self._peeked
        self._peeked = None
        if self.error is not None:
            return None
        try:
            for batch in self._batches:
                header = batch.header
                if header.next_offset <= self.next_offset:
                    continue
                if (self._aborted is not None and header.producer_id != NO_PRODUCER_ID
                        and self._skip_aborted(batch)):
                    self.next_offset = header.next_offset
                    continue
                if not header.is_control:
                    self._peeked = batch
                    return batch
                self.next_offset = header.next_offset  # a control batch: nothing to return
        except Exception as exc:  # every failure to read: the position stops here (Kafka's rule)
            self.error = self._unreadable(exc)
        return None

    def _next_data_batch(self) -> RecordBatch | None:
        """:meth:`_peek_data_batch`, taken."""
        batch = self._peek_data_batch()
        self._peeked = None
        return batch

    def _decode_next_batch(self) -> bool:
        """Decode the next batch holding records at or after ``next_offset``; False at the end
        or at a batch that cannot be read (then ``error`` is set)."""
        topic, partition = self.tp
        while (batch := self._next_data_batch()) is not None:
            try:
                # One call per batch: records built straight into ConsumerRecords (in C with
                # the extension, fjord.records.speedups).
                records = batch.records_as(ConsumerRecord, topic, partition, self.next_offset)
            except Exception as exc:  # the position stops here (Kafka's rule)
                self.error = self._unreadable(exc)
                return False
            if records:
                self._pending = records
                self._index = 0
                self._batch_end = batch.header.next_offset
                return True
            self.next_offset = batch.header.next_offset  # compacted away: skip it
        return False

    def _skip_aborted(self, batch: RecordBatch) -> bool:
        """read_committed: whether ``batch`` belongs to an aborted transaction (see the class
        docstring); an ABORT marker ends its producer's aborted run."""
        header = batch.header
        aborted = self._aborted
        assert aborted is not None
        while aborted and aborted[0][0] <= header.last_offset:
            self._aborted_producers.add(heapq.heappop(aborted)[1])
        if header.is_control:
            if control_record_of(batch).type is ControlType.ABORT:
                self._aborted_producers.discard(header.producer_id)
            return False
        return header.is_transactional and header.producer_id in self._aborted_producers

    def _unreadable(self, cause: Exception) -> RecordDeserializationError:
        topic, partition = self.tp
        offset = self.next_offset
        resume = next_intact_batch_offset(self._data, offset)
        way_on = (
            f"seek to {resume} (the next intact batch) to skip it"
            if resume is not None
            else "seek past it to continue"
        )
        error = RecordDeserializationError(
            f"{topic}-{partition}: the records at offset {offset} cannot be read "
            f"({type(cause).__name__}: {cause}); every record before it was returned; {way_on}",
            topic=topic,
            partition=partition,
            offset=offset,
            resume_offset=resume,
        )
        error.__cause__ = cause
        return error

    def take(self, limit: int) -> list[ConsumerRecord]:
        """Up to ``limit`` records at or after ``next_offset``, advancing it (stops before a
        batch that cannot be read)."""
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

    def take_into(self, limit: int, sink: RecordSink) -> int:
        """Records at or after ``next_offset`` into ``sink``, advancing it: whole batches
        until at least ``limit`` were added or the data ends (records an earlier
        :meth:`take` decoded and left go first); stops before a batch that cannot be read.
        Returns how many were added."""
        added = 0
        if self._index < len(self._pending):
            rest = self._pending[self._index :]
            added += sink.add_records(rest)
            self._index = len(self._pending)
            self.next_offset = max(rest[-1].offset + 1, self._batch_end)
        topic, partition = self.tp
        while added < limit and (batch := self._next_data_batch()) is not None:
            try:
                added += sink.add_batch(batch, topic, partition, self.next_offset)
            except Exception as exc:  # the position stops here (Kafka's rule)
                self.error = self._unreadable(exc)
                break
            self.next_offset = batch.header.next_offset
        return added

    @property
    def exhausted(self) -> bool:
        """Every record was taken (False while records remain or when ``error`` is set)."""
        return (
            self._index >= len(self._pending)
            and self._peek_data_batch() is None
            and self.error is None
        )


class FetchBuffer:
    """The fetched data waiting for ``poll()``, and the collection of records from it (Kafka's
    ``FetchBuffer`` and ``FetchCollector``). Pure: no I/O, no lock of its own (the consumer
    calls it with the subscription state's lock held).

    Invariants: fetches are kept in arrival order; ``queued(tp)`` counts those of ``tp`` and
    ``tail(tp)`` is the last one. :meth:`collect` never moves a position past a record it did
    not return: a partition whose next batch cannot be read keeps its position there, its
    fetch stays buffered, and the other partitions are collected around it; its error is
    raised only by a collection that has nothing else to return.
    """

    def __init__(self) -> None:
        self._completed: deque[CompletedFetch] = deque()
        self._queued: dict[TopicPartition, int] = {}
        self._tail: dict[TopicPartition, CompletedFetch] = {}

    def add(self, cf: CompletedFetch) -> None:
        self._completed.append(cf)
        self._queued[cf.tp] = self._queued.get(cf.tp, 0) + 1
        self._tail[cf.tp] = cf

    def queued(self, tp: TopicPartition) -> int:
        return self._queued.get(tp, 0)

    def tail(self, tp: TopicPartition) -> CompletedFetch | None:
        return self._tail.get(tp)

    def drop(self, predicate: Callable[[TopicPartition], bool]) -> None:
        """Forget the buffered data of the partitions ``predicate`` selects."""
        self._completed = deque(cf for cf in self._completed if not predicate(cf.tp))
        for tp in [tp for tp in self._queued if predicate(tp)]:
            del self._queued[tp]
            del self._tail[tp]

    def _remove(self, index: int) -> None:
        cf = self._completed[index]
        del self._completed[index]
        tp = cf.tp
        left = self._queued.get(tp, 0) - 1
        if left > 0:
            self._queued[tp] = left
        else:
            self._queued.pop(tp, None)
            self._tail.pop(tp, None)

    def collect(
        self, positions: dict[TopicPartition, int], paused: Set[TopicPartition], limit: int
    ) -> tuple[list[ConsumerRecord], bool]:
        """Up to ``limit`` buffered records at the partitions' ``positions``, advancing them
        past exactly the records returned. Returns the records and whether a buffered fetch
        was used up (then more should be fetched). Data for another position (a seek) or a
        paused partition is dropped. Raises the :class:`RecordDeserializationError` of a
        partition whose position reached a batch that cannot be read, but only when no other
        partition has a record to return (so polling on returns everything else first)."""
        out: list[ConsumerRecord] = []

        def take(cf: CompletedFetch, wanted: int) -> int:
            records = cf.take(wanted)
            out.extend(records)
            return len(records)

        _, used_up = self._collect(positions, paused, limit, take)
        return out, used_up

    def collect_into(
        self,
        positions: dict[TopicPartition, int],
        paused: Set[TopicPartition],
        limit: int,
        sink: RecordSink,
    ) -> tuple[int, bool]:
        """:meth:`collect`, the records going into ``sink`` in whole batches (so at least
        ``limit`` when that many are buffered, and at most one batch more); returns how many
        were added and whether a buffered fetch was used up."""
        return self._collect(
            positions, paused, limit, lambda cf, wanted: cf.take_into(wanted, sink)
        )

    def _collect(
        self,
        positions: dict[TopicPartition, int],
        paused: Set[TopicPartition],
        limit: int,
        take: Callable[[CompletedFetch, int], int],
    ) -> tuple[int, bool]:
        taken = 0
        used_up = False
        blocked: dict[TopicPartition, RecordDeserializationError] = {}
        completed = self._completed
        index = 0
        while index < len(completed) and taken < limit:
            cf = completed[index]
            tp = cf.tp
            if tp in blocked:
                index += 1  # (a prefetch behind the unreadable batch waits with it)
                continue
            if positions.get(tp) != cf.next_offset or tp in paused:
                self._remove(index)
                continue
            taken += take(cf, limit - taken)
            # (``exhausted`` reads on past batches that return nothing: control batches,
            # aborted ones, so it comes before the position is taken.)
            used = cf.exhausted
            # Past the records returned and skipped batches, never an unread batch.
            positions[tp] = cf.next_offset
            if used:
                self._remove(index)
                used_up = True
            elif cf.error is not None:
                blocked[tp] = cf.error
                index += 1
        if not taken and blocked:
            error = next(iter(blocked.values()))
            raise error.with_traceback(None)
        return taken, used_up


class Fetcher:
    """Fetches for one consumer and buffers the answers until ``poll()`` takes them.

    Invariants (under the state's lock): ``_completed`` holds the buffered fetches in arrival
    order; ``_queued[tp]`` counts those of ``tp`` and ``_tail[tp]`` is the last one (a prefetch
    asks from its ``end_offset``); a fetch whose ``fetch_offset`` no longer matches where the
    partition's data must continue (a seek, pause or reassignment happened) is dropped.
    """

    def __init__(
        self,
        state: SubscriptionState,
        network: Network,
        io: EventLoopThread,
        config: ClientConfig,
        offsets: OffsetFetcher,
    ) -> None:
        self._state = state
        self._network = network
        self._io = io
        self._config = config
        self._offsets = offsets
        self._reset_policy: str = config["auto.offset.reset"]
        self._request_timeout_s = config["request.timeout.ms"] / 1000
        self._backoff_s = config["retry.backoff.ms"] / 1000
        self._read_committed = config["isolation.level"] == "read_committed"
        self._buffer = FetchBuffer()
        self._fetching: dict[int, set[TopicPartition]] = {}
        self._wakeup: asyncio.Event | None = None
        self._wake_pending = False
        self._hand_over = False  # records stored while a poll() waited for some (loop thread)
        #: Per partition, the end its lag is measured to, from the latest fetch answer: the
        #: last stable offset under read_committed, else the high watermark (Kafka's rule).
        self.lag_ends: dict[TopicPartition, int] = {}

    # -- the buffer (application thread, with the lock held) ---------------------------------

    def drop_buffered(self, predicate: Callable[[TopicPartition], bool]) -> None:
        """Forget the buffered data of the partitions ``predicate`` selects (with the lock)."""
        self._buffer.drop(predicate)

    def collect(self, limit: int) -> tuple[list[ConsumerRecord], bool]:
        """:meth:`FetchBuffer.collect` at the state's positions (called with the lock held)."""
        state = self._state
        return self._buffer.collect(state.positions, state.paused, limit)

    def collect_into(self, limit: int, sink: RecordSink) -> tuple[int, bool]:
        """:meth:`FetchBuffer.collect_into` at the state's positions (with the lock held)."""
        state = self._state
        return self._buffer.collect_into(state.positions, state.paused, limit, sink)

    # -- the loop thread ----------------------------------------------------------------------

    def wake(self) -> None:
        """Make the fetch loop look at the state again (from any thread)."""
        if not self._wake_pending and self._wakeup is not None:
            self._wake_pending = True
            self._io.call_soon(self._on_wake)

    def _on_wake(self) -> None:
        self._wake_pending = False
        if self._wakeup is not None:
            self._wakeup.set()

    def _fetchable(
        self, snapshot: ClusterSnapshot
    ) -> tuple[dict[int, dict[TopicPartition, int]], bool]:
        """What to fetch now, by leader: the assigned, unpaused partitions with a position and
        fewer than ``_MAX_QUEUED_FETCHES`` buffered fetches (a prefetch asks from the buffered
        data's end), on leaders with no Fetch in flight; and whether a leader is unknown (call
        with the state's lock held)."""
        state = self._state
        need_metadata = False
        by_node: dict[int, dict[TopicPartition, int]] = {}
        for tp in state.assignment:
            position = state.positions.get(tp)
            if position is None or tp in state.paused:
                continue
            if self._buffer.queued(tp) >= _MAX_QUEUED_FETCHES:
                continue
            tail = self._buffer.tail(tp)
            if tail is not None:
                position = tail.end_offset  # prefetch what comes next
            leader = snapshot.leaders.get(tp)
            if leader is None:
                need_metadata = True
                continue
            if leader in self._fetching:
                continue
            by_node.setdefault(leader, {})[tp] = position
        return by_node, need_metadata

    async def run(self) -> None:
        """The fetch loop: start Fetches, position resets and metadata refreshes as needed;
        sleeps until woken (or 1 s)."""
        self._wakeup = wakeup = asyncio.Event()
        tasks: set[asyncio.Task[Any]] = set()
        resetting: asyncio.Task[Any] | None = None
        refreshing: asyncio.Task[Any] | None = None
        while not self._state.closed:
            wakeup.clear()
            snapshot = self._network.snapshot
            with self._state.lock:
                resets = [  # "none" waits for a seek (poll() raises meanwhile)
                    tp
                    for tp in self._state.assignment
                    if self._state.resets.get(tp, "none") != "none"
                ]
                by_node, need_metadata = self._fetchable(snapshot)
                for node_id, partitions in by_node.items():
                    self._fetching[node_id] = set(partitions)
            for node_id, partitions in by_node.items():
                task = asyncio.ensure_future(self._fetch(node_id, partitions))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if resets and (resetting is None or resetting.done()):
                resetting = asyncio.ensure_future(
                    self._offsets.reset_positions(resets, self._request_timeout_s)
                )
                resetting.add_done_callback(lambda _: wakeup.set())
            if need_metadata and (refreshing is None or refreshing.done()):
                refreshing = asyncio.ensure_future(self._refresh_quietly())
                refreshing.add_done_callback(lambda _: wakeup.set())
            # Woken by a finished Fetch, poll() or a seek (or 1 s): resumed on the next loop
            # turn, without a task per wait (asyncio.wait_for makes one; fjord.wakeups).
            await wait_event(wakeup, 1.0)

    async def _refresh_quietly(self) -> None:
        try:
            await self._network.refresh_metadata()
        except FjordError as exc:
            log.debug("metadata refresh failed: %s", exc)
            await asyncio.sleep(self._backoff_s)

    def _start_fetch(
        self, node_id: int, partitions: dict[TopicPartition, int]
    ) -> Awaitable[broker_pb2.FetchResponse]:
        """A Fetch of ``partitions`` from their offsets to broker ``node_id`` (sent when
        awaited); raises FjordError when the broker is gone."""
        cfg = self._config
        snapshot = self._network.snapshot
        node = snapshot.brokers.get(node_id)
        if node is None:
            raise FjordError(f"broker {node_id} left", code=ErrorCode.BROKER_NOT_AVAILABLE)
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
            isolation_level=1 if self._read_committed else 0,
        )
        return self._network.fetch(node.address, request, self._request_timeout_s)

    def _next_fetch(self, node_id: int) -> dict[TopicPartition, int]:
        """After an answer from ``node_id`` was stored: what to fetch next from it (claimed in
        ``_fetching``, possibly nothing); wakes the fetch loop when something else needs it
        (another leader's partitions, an unknown leader, a position reset)."""
        with self._state.lock:
            self._fetching.pop(node_id, None)
            by_node, need_metadata = self._fetchable(self._network.snapshot)
            partitions = by_node.pop(node_id, {})
            if partitions:
                self._fetching[node_id] = set(partitions)
            others = bool(by_node) or need_metadata or bool(self._state.resets)
        if others and self._wakeup is not None:
            self._wakeup.set()
        return partitions

    async def _fetch(self, node_id: int, partitions: dict[TopicPartition, int]) -> None:
        """Fetches from broker ``node_id`` for as long as there is something to fetch there
        (``_fetching[node_id]`` is held until this returns): as soon as an answer is stored,
        the next Fetch leaves from where the buffered data ends, from this task, not a few
        loop turns later from the fetch loop's. The broker answers a parked Fetch at the
        append that gives it records, so a record appended while no Fetch is parked there
        waits for the next one to arrive: the shorter that gap, the fewer records wait."""
        failed = False
        try:
            answer = self._start_fetch(node_id, partitions)
            while True:
                response = await answer
                failed = self._store_fetch(partitions, response)
                if self._hand_over:
                    self._hand_over = False
                    # A poll() waits for these records: let its thread take the GIL now rather
                    # than after this thread's next Fetch is built and sent (~0.2 ms at the
                    # median, more in the tail; bench/latency_breakdown.py). Only then: a busy
                    # poll() that is decoding would otherwise delay the next Fetch. (The next
                    # Fetch sent first, before this hand-over, measured worse: docs/performance.md.)
                    time.sleep(0)
                if failed or self._state.closed:
                    break
                partitions = self._next_fetch(node_id)
                if not partitions:
                    break
                answer = self._start_fetch(node_id, partitions)
        except FjordError as exc:
            log.debug("fetch from broker %s failed: %s", node_id, exc)
            failed = True
        finally:
            with self._state.lock:
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
            with self._state.lock:
                self._state.errors.append(error_for_code(top, response.error.message))
                self._state.notify()
            return False
        with self._state.lock:
            for topic in response.topics:
                for p in topic.partitions:
                    tp = TopicPartition(topic.name, p.partition)
                    offset = partitions.get(tp)
                    tail = self._buffer.tail(tp)
                    expected = (
                        tail.end_offset if tail is not None else self._state.positions.get(tp)
                    )
                    if offset is None or expected != offset:
                        continue  # a seek moved the position while the fetch was in flight
                    code = error_code_from_number(p.error.code)
                    if code is ErrorCode.NONE:
                        self.lag_ends[tp] = (
                            p.last_stable_offset if self._read_committed else p.high_watermark
                        )
                        records = p.records  # (protobuf copies it at every read: once)
                        if records:
                            self._hand_over = self._state.polls_waiting > 0
                            self._buffer.add(CompletedFetch(
                                tp, offset, records, p.high_watermark,
                                [(a.producer_id, a.first_offset) for a in p.aborted_transactions]
                                if self._read_committed else None,
                            ))
                    elif code is ErrorCode.OFFSET_OUT_OF_RANGE:
                        if tail is None:  # (a prefetch past the end: the next fetch retries)
                            del self._state.positions[tp]
                            self._state.resets[tp] = self._reset_policy
                    elif code.retriable:
                        refresh = True
                    else:
                        self._state.errors.append(
                            error_for_code(
                                code, f"{tp.topic}-{tp.partition}: {p.error.message or code.name}"
                            )
                        )
            self._state.notify()
        return refresh
