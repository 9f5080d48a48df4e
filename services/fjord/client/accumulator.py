"""The producer's core: per-partition batches waiting to be sent, and what to do with the
broker's answer. No sockets and no thread of its own; the sender (:mod:`fjord.client.producer`)
does the I/O.

:class:`RecordAccumulator` is called from two threads: the application's (``append``) and the
sender's (``ready``/``drain``/``reenqueue``/``expire``/``deallocate``); one lock guards it.
Two things are not pure, both on the application's side: ``append`` blocks its caller (a
condition variable on that lock, up to ``max.block.ms``) while ``buffer.memory`` is full (a
caller on an event loop passes ``awaits_room`` instead: told :class:`NoRoomYet` with the batch
it must open, it awaits room itself, woken by ``on_room_freed``), and when it opens a batch
without being given ``now_ms`` it reads the clock injected at construction (monotonic
milliseconds by default). The sender's side takes ``now_ms`` as an argument and never reads a
clock.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from fjord.client.futures import BatchCompletion, RecordFuture
from fjord.client.types import Headers, TopicPartition
from fjord.config import MAX_IN_FLIGHT_FOR_IDEMPOTENCE
from fjord.errors import ConfigError, ErrorCode, FjordError, KafkaTimeoutError, error_for_code
from fjord.records.header import stamp_producer_state
from fjord.records.reader import RecordBatch
from fjord.records.speedups import ATOMIC_APPEND

#: Under many open batches a new one reserves batch.size / this (2 KiB by default: ~17
#: records of 100 bytes); see RecordAccumulator._spread_batch_size.
SPREAD_BATCH_FRACTION = 8
_MAX_SEQUENCE = 0x7FFFFFFF
_MAX_EPOCH = 0x7FFF


class Builder(Protocol):
    """What the accumulator needs of :class:`fjord.records.BatchBuilder`."""

    def append(
        self, timestamp_ms: int, key: bytes | None, value: bytes | None, headers: Headers = ()
    ) -> bool: ...

    def try_append(
        self, timestamp_ms: int, key: bytes | None, value: bytes | None, headers: Headers = ()
    ) -> int: ...

    def try_append_many(
        self,
        timestamp_ms: int,
        keys: list[bytes | None] | None,
        values: list[bytes | None],
        start: int,
    ) -> int: ...

    def try_append_future(
        self,
        future_type: type[RecordFuture],
        completion: BatchCompletion,
        timestamp_ms: int | None,
        key: bytes | None,
        value: bytes | None,
    ) -> RecordFuture | None: ...

    def seal(self) -> None: ...

    @property
    def record_count(self) -> int: ...

    @property
    def size_in_bytes(self) -> int: ...

    def build(self) -> bytes: ...


BuilderFactory = Callable[[], Builder]
#: Makes a builder whose batches may reach the given size in bytes.
SizedBuilderFactory = Callable[[int], Builder]


class BufferExhaustedError(KafkaTimeoutError):
    """``buffer.memory`` stayed full for ``max.block.ms``: the producer cannot keep up. A
    :class:`~fjord.errors.KafkaTimeoutError` (Kafka's BufferExhaustedException is a
    TimeoutException), whichever producer waited."""


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """The size of the batch a record must open (:meth:`RecordAccumulator._plan_batch`),
    decided once and kept while its caller waits for ``buffer.memory`` room: the batch
    reserves ``reserve`` bytes; ``grown``: it may fill up to ``blocked.batch.size``."""

    tp: TopicPartition
    reserve: int
    grown: bool


class NoRoomYet(BufferExhaustedError):
    """``append(..., awaits_room=True)`` must open a batch and ``buffer.memory`` has no room
    for it now; nothing was appended. The caller (:class:`~fjord.client.AsyncProducer`, on
    its event loop) awaits room (``on_room_freed``) and calls again with ``plan=error.plan``,
    so the batch keeps the size decided before the wait, as a blocking caller's does."""

    def __init__(self, plan: BatchPlan, buffer_memory: int, reserved: int) -> None:
        super().__init__(
            f"buffer.memory ({buffer_memory} bytes, {reserved} reserved) has no room now for "
            f"a batch of {plan.reserve} bytes for {plan.tp.topic}-{plan.tp.partition}"
        )
        self.plan = plan


class ProducerBatch:
    """Records for one partition, built into one RecordBatch when drained.

    Invariants: records are appended only while ``payload`` is None (open); once drained the
    payload is fixed, so a retry resends exactly the same bytes; ``attempts`` counts sends;
    ``last_error`` is the error of the latest failed send (None until one failed), kept so that
    a batch that expires later says why it could not be written. Every record of a batch was
    sent with the same ``coordinator_epoch`` (the group coordinator's fence on
    ``__consumer_offsets``; 0 for every other producer), which each send and retry carries.
    """

    __slots__ = (
        "attempts",
        "base_sequence",
        "builder",
        "completion",
        "coordinator_epoch",
        "created_ms",
        "last_error",
        "payload",
        "reserved_bytes",
        "retry_after_ms",
        "tp",
    )

    def __init__(
        self,
        tp: TopicPartition,
        builder: Builder,
        now_ms: float,
        reserved: int,
        coordinator_epoch: int = 0,
    ) -> None:
        self.tp = tp
        self.coordinator_epoch = coordinator_epoch
        self.builder = builder
        self.completion = BatchCompletion(tp.topic, tp.partition)
        self.created_ms = now_ms
        self.payload: bytes | None = None
        self.attempts = 0
        self.last_error: FjordError | None = None
        self.retry_after_ms: float = 0
        self.reserved_bytes = reserved
        self.base_sequence = -1  # idempotence: assigned when first drained, -1 before

    def stamp_producer_state(self, producer_id: int, epoch: int, base_sequence: int) -> None:
        """Write producer id, epoch and base sequence into the built payload (fields inside
        the CRC, so the CRC-32C is recomputed: one pass over the batch)."""
        payload = bytearray(self.close())
        stamp_producer_state(payload, producer_id, epoch, base_sequence)
        self.payload = bytes(payload)
        self.base_sequence = base_sequence

    @property
    def record_count(self) -> int:
        return self.builder.record_count

    def close(self) -> bytes:
        if self.payload is None:
            self.payload = self.builder.build()
        return self.payload


class IdempotenceState:
    """The idempotent producer's sequence bookkeeping (Kafka's TransactionManager, without
    transactions). Pure; used under the accumulator's lock and on the sender's loop.

    Invariants: each partition's batches get consecutive sequences in drain order, starting at
    0 for every producer epoch; ``unacked[tp]`` holds the base sequences, in assignment order,
    of drained batches not yet completed or failed (in flight or waiting for a retry); a
    retried batch is sent only when it is the first of them, so retries go out in sequence
    order. ``window[tp]`` holds the base sequences assigned since the oldest unacknowledged
    batch of the partition (completed ones included: a later batch may be answered first by
    another broker) and never grows past ``max_window`` batches, the number of batches a
    broker remembers per producer and partition: whatever the leader changes, every batch a
    broker holds after the oldest unacknowledged one belongs to this window, so that batch is
    still among the broker's remembered ones when it is retried (a duplicate is recognised,
    never appended again). ``bump_needed``: a batch with a sequence failed for good (a hole in
    the sequence), so once nothing is in flight the epoch is bumped and every partition
    restarts at sequence 0 (Kafka's KIP-360 epoch bump).

    A batch refused as too large and split (:meth:`split`) hands its sequence range to its
    parts, which take its place in ``unacked`` and ``window``: the window may then hold more
    than ``max_window`` batches, but none of them is written yet (the broker refused the first
    of them, so it refused every later one as out of order) and from then on they go one at a
    time (each is a retry, sent only as the oldest unacknowledged batch), while new batches
    wait until the window is back under ``max_window``. So the broker still never holds more
    than ``max_window`` batches after the oldest unacknowledged one.
    """

    def __init__(
        self, max_window: int = MAX_IN_FLIGHT_FOR_IDEMPOTENCE, *, transactional: bool = False
    ) -> None:
        if max_window < 1:
            raise ConfigError(f"max_window must be at least 1 batch, got {max_window}")
        #: A transactional producer's: an OUT_OF_ORDER sequence fails the batch (the
        #: transaction aborts) instead of an epoch bump and a retry (see _sequence_retry).
        self.transactional = transactional
        self.producer_id = -1
        self.producer_epoch = -1
        self.bump_needed = False
        self.max_window = max_window
        self._next_sequence: dict[TopicPartition, int] = {}
        self.unacked: dict[TopicPartition, list[int]] = {}
        self.window: dict[TopicPartition, deque[int]] = {}

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    def set_producer_id(self, producer_id: int, epoch: int) -> None:
        """A new id and epoch (from InitProducerId): every partition restarts at sequence 0."""
        self.producer_id, self.producer_epoch = producer_id, epoch
        self._reset()

    def bump_epoch(self) -> bool:
        """Bump the epoch locally (restarting every sequence at 0); False when the epoch would
        overflow int16 and a new producer id is needed instead."""
        if self.producer_epoch >= _MAX_EPOCH:
            return False
        self.producer_epoch += 1
        self._reset()
        return True

    def _reset(self) -> None:
        self._next_sequence.clear()
        self.unacked.clear()
        self.window.clear()
        self.bump_needed = False

    def may_send(self, batch: ProducerBatch) -> bool:
        """Whether ``batch`` may be drained now: a new batch only while the partition's window
        has room (at most ``max_window`` batches since the oldest unacknowledged one, whichever
        brokers they went to), a retry only when it is the oldest unacknowledged batch."""
        if self.bump_needed:
            return False
        if batch.base_sequence < 0:
            return len(self.window.get(batch.tp, ())) < self.max_window
        pending = self.unacked.get(batch.tp)
        return not pending or pending[0] == batch.base_sequence

    def assign(self, batch: ProducerBatch) -> None:
        sequence = self._next_sequence.get(batch.tp, 0)
        batch.stamp_producer_state(self.producer_id, self.producer_epoch, sequence)
        self._next_sequence[batch.tp] = (sequence + batch.record_count) & _MAX_SEQUENCE
        self.unacked.setdefault(batch.tp, []).append(sequence)
        self.window.setdefault(batch.tp, deque()).append(sequence)

    def split(self, batch: ProducerBatch, parts: list[ProducerBatch]) -> bool:
        """``batch`` (unacknowledged, refused as too large, so not written) is replaced by
        ``parts`` (its records, in order): they get the contiguous sequences from its base
        sequence on, in its place in ``unacked`` and ``window``, so the batches after it
        keep theirs. False (nothing changed) when ``batch`` holds no current sequence."""
        pending = self.unacked.get(batch.tp)
        base = batch.base_sequence
        if base < 0 or not pending or base not in pending:
            return False
        sequences: list[int] = []
        sequence = base
        for part in parts:
            part.stamp_producer_state(self.producer_id, self.producer_epoch, sequence)
            sequences.append(sequence)
            sequence = (sequence + part.record_count) & _MAX_SEQUENCE
        assert sequence == (base + batch.record_count) & _MAX_SEQUENCE
        at = pending.index(base)
        pending[at : at + 1] = sequences
        window = list(self.window.get(batch.tp, ()))
        if base in window:
            at = window.index(base)
            window[at : at + 1] = sequences
        self.window[batch.tp] = deque(window)
        return True

    def has_earlier_unacked(self, batch: ProducerBatch) -> bool:
        pending = self.unacked.get(batch.tp)
        return pending is not None and bool(pending) and pending[0] != batch.base_sequence

    def done(self, batch: ProducerBatch, *, failed: bool) -> None:
        """The batch completed (or failed for good: a hole, so the epoch must be bumped)."""
        if batch.base_sequence < 0:
            return
        pending = self.unacked.get(batch.tp)
        if pending and batch.base_sequence in pending:
            pending.remove(batch.base_sequence)
            if failed:
                self.bump_needed = True
            window = self.window.get(batch.tp)
            while window and window[0] not in pending:
                window.popleft()  # answered, and so is everything before it


class RecordAccumulator:
    """Per-partition queues of :class:`ProducerBatch`, bounded by ``buffer.memory``.

    Invariants: within a partition, batches leave in the order they were created, and a batch
    put back for a retry goes back to the head of its queue; only the last batch of a queue is
    open for appends; the bytes reserved by queued and in-flight batches never exceed
    ``buffer_memory`` except for one batch larger than it (which is let through alone). A batch
    reserves ``batch_size`` (or its first record's size, if larger; a fraction of it when open
    batches of many partitions fill half the buffer: :meth:`_spread_batch_size`) while it takes
    appends and only its built payload's size once drained (the memory it still holds).
    A partition is *muted* while one of its batches is in flight when ``guarantee_order`` (Kafka's
    ``max.in.flight.requests.per.connection=1``), so retries cannot reorder it.

    Growing while blocked (``blocked_batch_size``, Fjord's, not Kafka's): a batch that an
    idempotent producer opens while its partition's window is full (``max_window`` batches
    unanswered, so nothing of the partition can leave) may grow to ``blocked_batch_size``
    instead of ``batch_size``. It only collects records that would otherwise wait in further
    ``batch_size`` batches behind the window: it leaves as soon as the window has room (it is
    past ``batch_size`` by then, or it would not have grown), so no record waits longer, and
    each answer of the partition carries more records. One batch is still one sequence range,
    so the broker's duplicate detection (the last 5 batches) is unchanged.
    """

    def __init__(
        self,
        builder_factory: BuilderFactory,
        *,
        batch_size: int,
        linger_ms: int,
        buffer_memory: int,
        delivery_timeout_ms: int,
        guarantee_order: bool = False,
        clock: Callable[[], float] | None = None,
        idempotence: IdempotenceState | None = None,
        sized_builder: SizedBuilderFactory | None = None,
        blocked_batch_size: int = 0,
    ) -> None:
        self._new_builder = builder_factory
        self._sized_builder = sized_builder
        # Growth is off without a sized builder, without idempotence, or when not larger.
        self._blocked_batch_size = (
            blocked_batch_size
            if sized_builder is not None and idempotence is not None
            and blocked_batch_size > batch_size
            else 0
        )
        # Milliseconds for batch creation times when append() is given now_ms=-1 (the producer
        # passes -1 so the clock is read once per batch, not once per record).
        self._clock = clock or (lambda: time.monotonic() * 1000)
        self._open: dict[TopicPartition, ProducerBatch] = {}
        #: The partitions whose open batch is a grown one (``_plan_batch``).
        self._open_grown: set[TopicPartition] = set()
        #: Topics whose broker refused a batch as too large (``split_and_reenqueue``):
        #: their batches no longer grow past ``batch_size``.
        self._no_growth_topics: set[str] = set()
        self._batch_size = batch_size
        self._linger_ms = linger_ms
        self._buffer_memory = buffer_memory
        self._delivery_timeout_ms = delivery_timeout_ms
        self._guarantee_order = guarantee_order
        self.idempotence = idempotence
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._incomplete: set[BatchCompletion] = set()
        self._muted: set[TopicPartition] = set()
        self._reserved = 0
        self._flushes = 0
        self.closed = False
        #: Called (with the lock held, on the thread that freed it) whenever memory is freed
        #: or the accumulator closes: how a caller that awaits room instead of blocking on
        #: the condition (AsyncProducer, whose sender frees memory on the same loop) wakes.
        self.on_room_freed: Callable[[], None] | None = None

    # -- the application's side ---------------------------------------------------------------

    def append(
        self,
        tp: TopicPartition,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        now_ms: float,
        *,
        abort_on_new_batch: bool = False,
        max_block_s: float = 0.0,
        coordinator_epoch: int = 0,
        awaits_room: bool = False,
        plan: BatchPlan | None = None,
    ) -> tuple[RecordFuture | None, bool]:
        """Add a record (``now_ms=-1``: read the injected clock, only if a batch is opened).
        Returns (future, wake_sender): ``wake_sender`` is True when a batch was
        closed (full) or the first batch of a partition was opened, i.e. when the sender has
        something new to schedule. With ``abort_on_new_batch`` returns (None, False) instead of
        opening a new batch (the sticky partitioner then picks another partition). A record
        whose ``coordinator_epoch`` differs from the open batch's closes that batch and opens
        a new one (a batch is sent with one epoch).

        A new batch is sized by :meth:`_plan_batch` and its bytes reserved in
        ``buffer.memory``, waiting for room up to ``max_block_s`` (0: never; the caller may
        not wait). ``awaits_room``: the caller waits for room itself, outside the lock (the
        AsyncProducer, on its event loop): the batch is sized as for a caller that may wait,
        and where such a caller would wait this raises :class:`NoRoomYet` at once, appending
        nothing; once room was freed the caller calls again with ``plan=`` the error's plan."""
        with self._lock:
            if self.closed:
                raise FjordError("the producer is closed", code=ErrorCode.INVALID_REQUEST)
            batch = self._open.get(tp)
            if batch is not None and batch.coordinator_epoch != coordinator_epoch:
                self._close_open(tp, batch)
                batch = None
            if batch is not None:
                # try_append: the record's index comes from the same step that appends it (a
                # lock-free fast-path append from another thread cannot slip in between).
                index = batch.builder.try_append(timestamp_ms, key, value, headers)
                if index >= 0:
                    return RecordFuture(batch.completion, index, timestamp_ms), False
                self._close_open(tp, batch)  # full: it waits for the sender; a new one opens
            queue = self._queues.get(tp)
            if queue is None:
                queue = self._queues[tp] = deque()
            if abort_on_new_batch:
                # KIP-480: a new batch (the previous one filled up or was sent after
                # linger.ms) is the moment the sticky partitioner moves on.
                return None, False
            size = _record_size_estimate(key, value, headers)
            if plan is None:
                plan = self._plan_batch(tp, size, awaits_room or max_block_s > 0, spread=True)
            elif plan.tp != tp:
                raise ValueError(f"a batch plan for {plan.tp} used for {tp}")
            self._reserve_for(plan, max_block_s, awaits_room)
            builder = self._builder_for(plan, size)
            created = now_ms if now_ms >= 0 else self._clock()
            batch = ProducerBatch(tp, builder, created, plan.reserve, coordinator_epoch)
            batch.builder.append(timestamp_ms, key, value, headers)
            queue.append(batch)
            self._set_open(tp, batch, plan.grown)
            self._incomplete.add(batch.completion)
            # A new batch means the previous one is full, or a linger timer must start.
            return RecordFuture(batch.completion, 0, timestamp_ms), True

    def _spread_batch_size(self, record_size: int) -> int:
        """With the lock held: the bytes a new batch reserves (and may fill). ``batch.size``
        (at least the record) while ``buffer.memory`` is less than three quarters full or
        while sent batches hold most of it (back-pressure: wait for answers, Kafka's way);
        ``batch.size / SPREAD_BATCH_FRACTION`` (at least the record) once it is that full
        and open batches at ``batch.size`` each would hold over half of it, i.e. records are
        spread over more than ``buffer.memory / batch.size / 2`` partitions at once (1,024
        by default). There each batch holds a few records when it leaves after
        ``linger.ms``, and reserving ``batch.size`` for each made ``send()`` wait for memory
        that no record used (bench/bench_scale.py, docs/performance.md). Fjord's, not
        Kafka's (Kafka reserves ``batch.size`` and blocks)."""
        full = max(self._batch_size, record_size)
        memory = self._buffer_memory
        if (self._sized_builder is None
                or self._reserved + full <= memory * 3 // 4
                or len(self._open) * self._batch_size <= memory // 2):
            return full
        return max(record_size, self._batch_size // SPREAD_BATCH_FRACTION)

    def window_full(self, tp: TopicPartition) -> bool:
        """Whether ``tp``'s idempotence window is full: no new batch of it may leave until an
        answer comes (False without idempotence)."""
        idem = self.idempotence
        return idem is not None and len(idem.window.get(tp, ())) >= idem.max_window

    def blocked_behind_window(self, tp: TopicPartition) -> bool:
        """Whether a batch of ``tp`` opened now could not leave before an answer comes: the
        batches unanswered and those queued to leave (each takes a place in the window)
        fill the idempotence window (False without idempotence). The queued ones count:
        between an answer and the sender's next drain the window has room, but a batch
        queued ahead takes it; a batch opened then and sized ``batch.size`` would later
        leave alone holding a whole window slot for one round trip (issue 18: a third to
        two thirds of a replicated round's batches were such 16 KiB batches)."""
        idem = self.idempotence
        if idem is None:
            return False
        queue = self._queues.get(tp)
        # (A retried batch queued again may be counted twice: it only makes growth likelier.)
        queued = 0 if queue is None else len(queue)
        return len(idem.window.get(tp, ())) + queued >= idem.max_window

    def _plan_batch(
        self, tp: TopicPartition, record_size: int, may_wait: bool, *, spread: bool
    ) -> BatchPlan:
        """With the lock held, when a batch of ``tp`` is to be opened for a record of
        ``record_size`` bytes: a grown batch (``blocked_batch_size`` reserved) when
        :meth:`_may_grow` and ``buffer.memory`` has room for it now or the caller may wait for
        that room; else a normal one (``spread``: :meth:`_spread_batch_size`, else
        ``batch.size`` or the record's size). Pure: both producers decide so, and only how
        they wait differs (a condition for the blocking one, ``await`` for the asyncio one).

        A blocked partition's caller that may wait (up to ``max.block.ms``, as for any batch)
        does so for a grown batch rather than open a normal one: the record cannot leave
        before an answer anyway, and normal batches opened on a nearly full buffer fed on
        themselves (each answer freed a normal batch's bytes, so the next batch was normal
        again): in rounds larger than ``buffer.memory`` most batches of an acks=all producer
        were ``batch.size`` batches, at a third of the records/s and three times the brokers'
        CPU (issue 18, bench/RESULTS.md). A caller that may not wait (a send() from a
        callback) gets a normal batch when there is no room."""
        grown = self._blocked_batch_size
        if self._may_grow(tp, record_size) and (may_wait or self._has_room(grown)):
            return BatchPlan(tp, grown, True)
        if spread:
            return BatchPlan(tp, self._spread_batch_size(record_size), False)
        return BatchPlan(tp, max(self._batch_size, record_size), False)

    def _may_grow(self, tp: TopicPartition, record_size: int) -> bool:
        """With the lock held: whether a batch of ``tp`` opened now may grow to
        ``blocked_batch_size``: growth is on, the record fits, the partition is blocked
        (:meth:`blocked_behind_window`), its topic never refused a grown batch, and the open
        grown batches (``_open_grown``) would reserve at most half of ``buffer.memory``."""
        grown = self._blocked_batch_size
        if not grown or record_size > grown or not self.blocked_behind_window(tp):
            return False
        if tp.topic in self._no_growth_topics:
            return False  # its max.message.bytes refused a larger batch
        # Open grown batches may be mostly empty (reserved whole, filled slowly): they hold at
        # most half of buffer.memory, so many blocked partitions with a few records each
        # cannot reserve it all. Full grown batches waiting to leave hold records and count
        # as any batch does (a backlog keeps growing its batches).
        return (len(self._open_grown) + 1) * grown <= self._buffer_memory // 2

    def _builder_for(self, plan: BatchPlan, record_size: int) -> Builder:
        # A builder whose batch may reach the planned size (the default builder for batch.size
        # or a larger first record: it takes one record of any size).
        if plan.grown or (
            self._sized_builder is not None and plan.reserve != max(self._batch_size, record_size)
        ):
            assert self._sized_builder is not None  # (growth is off without one)
            return self._sized_builder(plan.reserve)
        return self._new_builder()

    def append_many(
        self,
        tp: TopicPartition,
        timestamp_ms: int,
        keys: list[bytes | None] | None,
        values: list[bytes | None],
        *,
        max_block_s: float = 0.0,
    ) -> tuple[list[BatchCompletion], bool]:
        """Add records ``(keys[i] or None, values[i])`` (no headers, all with ``timestamp_ms``)
        to ``tp`` in order: into its open batch while it has room, then into new batches
        (each reserving ``batch.size`` or its first record's size). Returns the completions
        of the batches the records went into, in order, and whether the sender must be woken
        (a batch was filled or opened). The same invariants as :meth:`append`; a record that
        cannot be encoded raises with the records before it appended."""
        completions: list[BatchCompletion] = []
        wake = False
        start, count = 0, len(values)
        with self._lock:
            if self.closed:
                raise FjordError("the producer is closed", code=ErrorCode.INVALID_REQUEST)
            batch = self._open.get(tp)
            if batch is not None and batch.coordinator_epoch != 0:
                self._close_open(tp, batch)
                batch = None
            if batch is not None:
                after = batch.builder.try_append_many(timestamp_ms, keys, values, start)
                if after > start:
                    completions.append(batch.completion)
                    start = after
                if start < count:
                    self._close_open(tp, batch)  # full
                    wake = True
            while start < count:
                if self._open.get(tp) is batch is not None:
                    self._close_open(tp, batch)  # full
                queue = self._queues.get(tp)
                if queue is None:
                    queue = self._queues[tp] = deque()
                key = None if keys is None else keys[start]
                value = values[start]
                estimate = _record_size_estimate(
                    key if type(key) is bytes else None,  # (others: the builder's error)
                    value if type(value) is bytes else None,
                    (),
                )
                plan = self._plan_batch(tp, estimate, max_block_s > 0, spread=False)
                self._reserve(plan.reserve, max_block_s)
                reserve = plan.reserve
                batch = ProducerBatch(tp, self._builder_for(plan, estimate), self._clock(), reserve)
                try:  # (a fresh batch takes at least its first record, unless it raises)
                    start = batch.builder.try_append_many(timestamp_ms, keys, values, start)
                finally:
                    if batch.record_count:  # queued even when a later record raised
                        queue.append(batch)
                        self._set_open(tp, batch, plan.grown)
                        self._incomplete.add(batch.completion)
                        completions.append(batch.completion)
                        wake = True
                    else:  # never queued: give its reservation back
                        self._reserved -= reserve
                        self._room_freed()
        return completions, wake

    def open_batch(self, tp: TopicPartition) -> ProducerBatch | None:
        """The batch of ``tp`` that appends go to now (None: the next append opens one)."""
        return self._open.get(tp)

    def try_append_open(
        self, batch: ProducerBatch, timestamp_ms: int | None, value: bytes
    ) -> RecordFuture | None:
        """The producer's fast path: append a record without key or headers to ``batch`` if it
        is still its partition's open batch and has room; None (nothing appended) otherwise,
        and the caller takes :meth:`append`. A batch stops being the open one only here, under
        the lock, and is sealed then (its builder refuses ``try_append``), so with a builder
        whose appends and build are atomic against each other
        (``fjord.records.speedups.ATOMIC_APPEND``, the C builder) no lock is taken: a batch
        the sender builds meanwhile refuses the record, one it builds after holds it. The
        same order guarantee as :meth:`append`: a batch that is no longer the open one never
        takes a record. ``timestamp_ms`` None: now (the wall clock, read by the builder)."""
        if self.closed:
            return None
        builder = batch.builder
        if ATOMIC_APPEND:
            return builder.try_append_future(
                RecordFuture, batch.completion, timestamp_ms, None, value
            )
        with self._lock:
            return builder.try_append_future(
                RecordFuture, batch.completion, timestamp_ms, None, value
            )

    def _set_open(self, tp: TopicPartition, batch: ProducerBatch, grown: bool) -> None:
        # With the lock held: ``batch`` (grown or not) is the one appends of ``tp`` go to.
        previous = self._open.get(tp)
        if previous is not None and previous is not batch:
            # Opened by another thread while this one waited for buffer.memory (the wait
            # releases the lock): queued ahead of ``batch``, it takes no more records.
            previous.builder.seal()
        self._open[tp] = batch
        if grown:
            self._open_grown.add(tp)
        else:
            self._open_grown.discard(tp)

    def _close_open(self, tp: TopicPartition, batch: ProducerBatch) -> None:
        # With the lock held: ``batch`` stops taking appends (it is full, built, or of another
        # coordinator epoch); the fast path must not append to it either.
        del self._open[tp]
        self._open_grown.discard(tp)
        batch.builder.seal()

    def _has_room(self, nbytes: int) -> bool:
        # With the lock held. A batch bigger than the whole buffer is let through alone.
        return self._reserved == 0 or self._reserved + nbytes <= self._buffer_memory

    def _reserve(self, nbytes: int, max_block_s: float) -> None:
        # With the lock held: wait (the condition releases the lock) up to max_block_s.
        if not self._space.wait_for(lambda: self._has_room(nbytes), timeout=max_block_s):
            raise self.buffer_exhausted(max_block_s)
        self._reserved += nbytes

    def _reserve_for(self, plan: BatchPlan, max_block_s: float, awaits_room: bool) -> None:
        # With the lock held: reserve a planned batch's bytes (see append's awaits_room).
        if awaits_room and not self._has_room(plan.reserve):
            raise NoRoomYet(plan, self._buffer_memory, self._reserved)
        self._reserve(plan.reserve, max_block_s)

    def buffer_exhausted(self, max_block_s: float) -> BufferExhaustedError:
        """The error of a send() that waited ``max_block_s`` for ``buffer.memory`` room."""
        return BufferExhaustedError(
            f"buffer.memory ({self._buffer_memory} bytes) stayed full for max.block.ms "
            f"({int(max_block_s * 1000)} ms)"
        )

    def _room_freed(self) -> None:
        # With the lock held, whenever reserved bytes go down (or the accumulator closes).
        self._space.notify_all()
        if self.on_room_freed is not None:
            self.on_room_freed()

    def begin_flush(self) -> list[BatchCompletion]:
        """Make every batch ready now; returns the completions to wait for."""
        with self._lock:
            self._flushes += 1
            return list(self._incomplete)

    def end_flush(self) -> None:
        with self._lock:
            self._flushes -= 1

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._room_freed()

    # -- the sender's side --------------------------------------------------------------------

    def ready(self, now_ms: float) -> tuple[list[TopicPartition], float]:
        """Partitions whose head batch may be sent now, and the ms until the next one may
        (linger or retry backoff), at most 1000 ms."""
        ready: list[TopicPartition] = []
        next_ms: float = 1000
        with self._lock:
            sending_all = self._flushes > 0 or self.closed
            idem = self.idempotence
            for tp, queue in self._queues.items():
                if not queue or tp in self._muted:
                    continue
                head = queue[0]
                if idem is not None and not idem.may_send(head):
                    continue  # woken when an answer (or the epoch bump) lets it go
                if head.retry_after_ms > now_ms:
                    next_ms = min(next_ms, head.retry_after_ms - now_ms)
                    continue
                due = head.created_ms + self._linger_ms
                if (
                    sending_all
                    or len(queue) > 1
                    or head.payload is not None
                    or due <= now_ms
                    or head.builder.size_in_bytes >= self._batch_size
                ):
                    ready.append(tp)
                else:
                    next_ms = min(next_ms, due - now_ms)
        return ready, max(next_ms, 0)

    def has_pending(self) -> bool:
        with self._lock:
            return bool(self._incomplete)

    def drain(
        self, partitions: Iterable[TopicPartition], max_request_bytes: int, now_ms: float
    ) -> list[ProducerBatch]:
        """Take the sendable batches at the head of each partition's queue, in order (every
        batch but an open, non-full last one still lingering), closing them; at most
        ``max_request_bytes`` in all but at least one batch. Consecutive batches of a partition
        travel in one request (their bytes concatenated), which keeps per-request overhead off
        a busy partition. The caller must later ``reenqueue`` or ``deallocate`` each batch."""
        drained: list[ProducerBatch] = []
        total = 0
        idem = self.idempotence
        with self._lock:
            sending_all = self._flushes > 0 or self.closed
            for tp in partitions:
                queue = self._queues.get(tp)
                if not queue or tp in self._muted:
                    continue
                epoch = queue[0].coordinator_epoch
                while queue:
                    head = queue[0]
                    if head.retry_after_ms > now_ms or head.coordinator_epoch != epoch:
                        break  # (one request carries one coordinator epoch per partition)
                    if idem is not None and not idem.may_send(head):
                        break  # a retry waits until it is the lowest unanswered sequence
                    if len(queue) == 1 and not (
                        sending_all
                        or head.payload is not None
                        or head.created_ms + self._linger_ms <= now_ms
                        or head.builder.size_in_bytes >= self._batch_size
                    ):
                        break
                    payload = head.close()
                    if self._open.get(tp) is head:
                        self._close_open(tp, head)  # built: no more appends
                    self._shrink_to_payload(head)
                    if drained and total + len(payload) > max_request_bytes:
                        return drained
                    queue.popleft()
                    if idem is not None and head.base_sequence < 0:
                        idem.assign(head)
                        payload = head.close()
                    head.attempts += 1
                    total += len(payload)
                    drained.append(head)
                    if self._guarantee_order:
                        self._muted.add(tp)
                    if idem is not None:
                        break  # one batch per partition per request (Kafka's rule)
        return drained

    def reenqueue(self, batch: ProducerBatch, now_ms: float, backoff_ms: int) -> None:
        """Put a batch that failed with a retriable error back at the head of its queue."""
        with self._lock:
            batch.retry_after_ms = now_ms + backoff_ms
            queue = self._queues.setdefault(batch.tp, deque())
            if batch.base_sequence >= 0:
                self._insert_by_sequence(queue, batch)
            else:
                queue.appendleft(batch)
            self._muted.discard(batch.tp)

    def split_and_reenqueue(
        self, batch: ProducerBatch, error: FjordError, now_ms: float
    ) -> bool:
        """A batch the broker refused with MESSAGE_TOO_LARGE (so nothing of it was written)
        goes back as several batches of at most ``batch_size`` (Kafka's splitAndReenqueue):
        its records in order, at the head of its partition's queue (ahead of anything queued
        and of later retries), each record's future following its new batch. With
        idempotence they get contiguous sequences from the refused batch's base sequence on,
        so the batches sent after it keep theirs. Its topic's batches stop growing past
        ``batch_size``. Returns False, changing nothing, when the records fit one batch of
        ``batch_size`` (a single record, or a batch no larger: splitting would send the same
        records again): the caller fails the batch as before. The parts keep the batch's
        creation time (``delivery.timeout.ms`` counts from it) and its error as their last."""
        if batch.record_count < 2:
            return False
        parts: list[ProducerBatch] = []
        firsts: list[int] = []
        builder: Builder | None = None
        records = RecordBatch(batch.close()).record_tuples()
        for index, (_, timestamp, key, value, headers) in enumerate(records):
            if builder is None or not builder.append(timestamp, key, value, headers):
                builder = self._new_builder()
                builder.append(timestamp, key, value, headers)  # (a fresh one takes a record)
                parts.append(
                    ProducerBatch(
                        batch.tp, builder, batch.created_ms, 0, batch.coordinator_epoch
                    )
                )
                firsts.append(index)
        if len(parts) < 2:
            return False
        for part in parts:
            part.reserved_bytes = len(part.close())
            part.last_error = error
        idem = self.idempotence
        with self._lock:
            self._no_growth_topics.add(batch.tp.topic)
            if idem is not None:
                idem.split(batch, parts)  # False: no sequence (an epoch bump unassigns them)
            # The parts hold about what the batch held (more if it was compressed): the
            # sender never waits for memory, so this may pass buffer.memory for a moment.
            self._reserved += sum(part.reserved_bytes for part in parts) - batch.reserved_bytes
            batch.reserved_bytes = 0
            self._incomplete.discard(batch.completion)
            batch.completion.split_into(
                [(first, part.completion) for first, part in zip(firsts, parts, strict=True)]
            )
            queue = self._queues.setdefault(batch.tp, deque())
            if parts[0].base_sequence >= 0:
                for part in parts:  # in sequence order, after earlier retries
                    self._insert_by_sequence(queue, part)
            else:
                queue.extendleft(reversed(parts))
            for part in parts:
                self._incomplete.add(part.completion)
            self._muted.discard(batch.tp)
            self._room_freed()
        return True

    @staticmethod
    def _insert_by_sequence(queue: deque[ProducerBatch], batch: ProducerBatch) -> None:
        # Idempotence: retries wait in sequence order, ahead of unsequenced batches.
        at = 0
        while (
            at < len(queue)
            and queue[at].base_sequence >= 0
            and queue[at].base_sequence < batch.base_sequence
        ):
            at += 1
        queue.insert(at, batch)

    def set_producer_id(self, producer_id: int, epoch: int) -> None:
        """Idempotence: a new producer id (nothing in flight); queued batches lose their old
        sequences and get new ones when drained again."""
        assert self.idempotence is not None
        with self._lock:
            self._unassign_sequences()
            self.idempotence.set_producer_id(producer_id, epoch)

    def _unassign_sequences(self) -> None:
        for queue in self._queues.values():
            for batch in queue:
                batch.base_sequence = -1

    def bump_epoch_if_needed(self) -> bool:
        """Idempotence: apply a pending epoch bump (the caller made sure nothing is in flight).
        Queued batches lose their old sequences and get new ones when drained again. Returns
        False when a new producer id is needed (the epoch would overflow)."""
        idem = self.idempotence
        if idem is None or not idem.bump_needed:
            return True
        with self._lock:
            self._unassign_sequences()
            return idem.bump_epoch()

    def _shrink_to_payload(self, batch: ProducerBatch) -> None:
        # With the lock held, once ``batch`` is built: from now on it holds its payload's
        # bytes, not the batch.size reserved while it took appends. Without this, every batch
        # in flight held batch.size until answered, and a producer spreading records over
        # thousands of partitions (a few records per batch) blocked on buffer.memory with a
        # few hundred KiB really buffered (bench/bench_scale.py: 2.5x the records/s at 1,000
        # partitions with the memory counted as it is used).
        held = len(batch.payload) if batch.payload is not None else batch.reserved_bytes
        if held < batch.reserved_bytes:
            self._reserved -= batch.reserved_bytes - held
            batch.reserved_bytes = held
            self._room_freed()

    def deallocate(self, batch: ProducerBatch) -> None:
        """A batch is finished (completed or failed): free its memory and unmute its partition."""
        with self._lock:
            self._reserved -= batch.reserved_bytes
            batch.reserved_bytes = 0
            self._incomplete.discard(batch.completion)
            self._muted.discard(batch.tp)
            self._room_freed()

    def expired(self, batch: ProducerBatch, now_ms: float) -> bool:
        return now_ms - batch.created_ms >= self._delivery_timeout_ms

    def expiry_error(
        self, batch: ProducerBatch, make_timeout_error: Callable[[str], FjordError]
    ) -> FjordError:
        """The error a batch past ``delivery.timeout.ms`` fails with: a timeout that names the
        partition, the deadline and, for a batch that was sent, the attempts and the last error
        it got (also its ``__cause__``): NOT_ENOUGH_REPLICAS or KAFKA_STORAGE_ERROR stays
        visible instead of a bare timeout."""
        where = f"{batch.record_count} record(s) for {batch.tp.topic}-{batch.tp.partition}"
        deadline = f"delivery.timeout.ms={self._delivery_timeout_ms}"
        last = batch.last_error
        if last is None:
            return make_timeout_error(f"{where} expired after {deadline} before they could be sent")
        error = make_timeout_error(
            f"{where} expired after {deadline} and {batch.attempts} attempt(s); "
            f"last error: {describe_error(last)}"
        )
        error.__cause__ = last
        return error

    def expire(self, now_ms: float) -> list[ProducerBatch]:
        """Remove and return the queued batches older than ``delivery.timeout.ms``."""
        out: list[ProducerBatch] = []
        with self._lock:
            for queue in self._queues.values():
                while queue and now_ms - queue[0].created_ms >= self._delivery_timeout_ms:
                    out.append(queue.popleft())
        return out

    def abort_all(self) -> list[ProducerBatch]:
        """Remove and return every queued batch (on a forced close)."""
        with self._lock:
            out = [b for q in self._queues.values() for b in q]
            for q in self._queues.values():
                q.clear()
        return out


def describe_error(error: FjordError) -> str:
    """``CODE: message`` (just the code when the message is nothing more)."""
    text = str(error)
    name = error.code.name
    return text if text == name or text.startswith(f"{name}:") else f"{name}: {text}"


def _record_size_estimate(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    size = 70 + (len(key) if key else 0) + (len(value) if value else 0)
    for name, hvalue in headers:
        size += len(name) + (len(hvalue) if hvalue else 0) + 4
    return size


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """One partition's answer in a Produce response (translated from protobuf by the shell)."""

    error_code: ErrorCode
    message: str = ""
    base_offset: int = -1
    log_append_time: int = -1


@dataclass(slots=True)
class ResponseOutcome:
    """What the sender must do after handling a response."""

    refresh_metadata: bool = False
    retried: int = 0
    split: int = 0
    failed: int = 0
    completed: int = 0


def handle_produce_results(
    accumulator: RecordAccumulator,
    batches: list[ProducerBatch],
    results: dict[TopicPartition, PartitionResult] | BaseException,
    now_ms: float,
    *,
    retries: int,
    retry_backoff_ms: int,
    make_timeout_error: Callable[[str], FjordError],
    idempotence: IdempotenceState | None = None,
) -> ResponseOutcome:
    """Complete, retry or fail each batch of one Produce request.

    ``results`` is the per-partition answer, or the exception of a failed call (transport error:
    every batch is treated as having hit a retriable error). A batch is retried when its error is
    retriable, it has been sent at most ``retries`` times before, and ``delivery.timeout.ms`` has
    not passed; otherwise it fails with the typed error (a timeout error after the deadline).
    """
    outcome = ResponseOutcome()
    # Several batches of one partition share its answer: offsets follow one another.
    next_base: dict[TopicPartition, int] = {}
    to_retry: list[ProducerBatch] = []
    for batch in batches:
        error: FjordError | None
        if isinstance(results, BaseException):
            if isinstance(results, FjordError):
                error = results
            else:
                error = FjordError(str(results), code=ErrorCode.NETWORK_EXCEPTION)
        else:
            result = results.get(batch.tp)
            if result is None:
                error = FjordError(
                    f"no answer for {batch.tp.topic}-{batch.tp.partition}",
                    code=ErrorCode.UNKNOWN_SERVER_ERROR,
                )
            elif result.error_code is ErrorCode.NONE or (
                result.error_code is ErrorCode.DUPLICATE_SEQUENCE_NUMBER
            ):
                # DUPLICATE_SEQUENCE_NUMBER: written before, offset unknown (Kafka: success).
                if idempotence is not None:
                    idempotence.done(batch, failed=False)
                base = next_base.get(batch.tp, result.base_offset)
                if base >= 0:
                    next_base[batch.tp] = base + batch.record_count
                accumulator.deallocate(batch)
                batch.completion.complete(base, result.log_append_time)
                outcome.completed += 1
                continue
            else:
                error = error_for_code(result.error_code, result.message)
        if idempotence is not None and batch.base_sequence >= 0 and _sequence_retry(
            idempotence, batch, error.code
        ):
            if batch.last_error is None:  # a sequence error echoes an earlier one: keep that
                batch.last_error = error
            if not accumulator.expired(batch, now_ms):
                to_retry.append(batch)
                outcome.retried += 1
                continue
            error = accumulator.expiry_error(batch, make_timeout_error)
        elif (
            error.code is ErrorCode.MESSAGE_TOO_LARGE
            and not accumulator.expired(batch, now_ms)
            and accumulator.split_and_reenqueue(batch, error, now_ms)
        ):
            # Refused as too large, not written: its records go again in batch.size batches
            # (a grown batch past the topic's max.message.bytes). Not a hole in the sequence.
            outcome.split += 1
            continue
        elif error.retriable:
            outcome.refresh_metadata = True
            batch.last_error = error
            if accumulator.expired(batch, now_ms):
                error = accumulator.expiry_error(batch, make_timeout_error)
            elif batch.attempts <= retries:
                to_retry.append(batch)
                outcome.retried += 1
                continue
        if idempotence is not None:
            idempotence.done(batch, failed=True)
        accumulator.deallocate(batch)
        batch.completion.fail(error)
        outcome.failed += 1
    # Put back last-first, so each partition's queue keeps its original order.
    for batch in reversed(to_retry):
        accumulator.reenqueue(batch, now_ms, retry_backoff_ms)
    return outcome


def _sequence_retry(idem: IdempotenceState, batch: ProducerBatch, code: ErrorCode) -> bool:
    """Idempotence: whether a sequence error is retried rather than the batch's failure.

    OUT_OF_ORDER_SEQUENCE or UNKNOWN_PRODUCER_ID while an earlier batch of the partition is
    unanswered or being retried, or while an epoch bump is pending, means that earlier batch
    is not written yet: retried as it is. For the oldest unacknowledged batch, the broker has
    a hole before it or forgot us (UNKNOWN_PRODUCER_ID: expiration): the epoch is bumped and
    the batch sent again from sequence 0, Kafka's rule for the idempotent producer (KIP-360,
    TransactionManager.canRetry). An OUT_OF_ORDER answer can also be an echo whose cause was
    answered first: answers of different brokers come back in any order, so by the time a
    deposed leader's refusal of sequence n arrives, sequence n-1's retry may have been
    acknowledged by the new leader (the batch was never written: found by
    tests/unit/test_idempotent_failover.py). A transactional producer fails the batch on
    OUT_OF_ORDER instead (the transaction aborts), as Kafka's does."""
    if code not in (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.UNKNOWN_PRODUCER_ID):
        return False
    if idem.bump_needed or idem.has_earlier_unacked(batch):
        return True
    if code is ErrorCode.UNKNOWN_PRODUCER_ID or not idem.transactional:
        idem.bump_needed = True
        return True
    return False
