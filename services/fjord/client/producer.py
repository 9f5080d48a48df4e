"""The producer: ``send()`` appends to per-partition batches; a sender on the client's event
loop ships every ready batch for a broker in one Produce request.

Threading: ``send`` runs on the caller's thread and costs one lock, one builder append and one
light :class:`~fjord.client.futures.RecordFuture` (sharing its batch's completion, no
``concurrent.futures.Future``) per record; it blocks only for a topic's first metadata (asked
on the loop thread) or while ``buffer.memory`` is full, each up to ``max.block.ms``. The
sender coroutine runs on the client's private loop thread (see
:class:`fjord.client.network.EventLoopThread`) and is woken only when a batch closes or a new
one opens. Callbacks run on that loop thread: keep them short, never block.

Ordering: records of one partition are sent in order. With ``enable.idempotence`` (the default)
each batch carries the producer id, epoch and a per-partition sequence, is sent alone for its
partition in a request, at most 5 batches of a partition are outstanding (across leader
changes too), and retries go out in sequence order: no duplicate, no reordering with up to 5
requests in flight (docs/idempotence.md). Without it, a retried batch may land after a
later one when ``max.in.flight.requests.per.connection > 1`` (as in Kafka).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from fjord._proto import broker_pb2
from fjord.client.accumulator import (
    BatchPlan,
    IdempotenceState,
    NoRoomYet,
    PartitionResult,
    ProducerBatch,
    RecordAccumulator,
    handle_produce_results,
)
from fjord.client.consumer_coordinator import normalize_offsets
from fjord.client.futures import BatchCompletion, RecordFuture, RecordsFuture
from fjord.client.metadata import topic_error
from fjord.client.network import EventLoopThread, Network, transport_error
from fjord.client.partitioner import StickyPartitioner, group_by_partition, partition_for_key
from fjord.client.transactions import ClientTransactionManager
from fjord.client.types import (
    ConsumerGroupMetadata,
    OffsetAndMetadata,
    RecordMetadata,
    TopicPartition,
)
from fjord.config import ClientConfig, producer_config
from fjord.errors import (
    ErrorCode,
    FjordError,
    InvalidRequestError,
    InvalidTxnStateError,
    KafkaTimeoutError,
    RecordTooLargeError,
    TransactionAbortedError,
    TransactionError,
    error_code_from_number,
    error_for_code,
)
from fjord.records import Compression
from fjord.records.builder import BatchBuilder
from fjord.records.speedups import ATOMIC_APPEND, EXTENSION
from fjord.security import ClientSecurity
from fjord.topic_names import validate_topic_name
from fjord.wakeups import wait_event

log = logging.getLogger(__name__)

T = TypeVar("T")

_CODECS = {
    "none": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}
_HEADER_OVERHEAD = 80  # record and batch framing around one record's key and value, generously


def _mono_ms() -> float:
    # Not rounded: the sender sleeps until a batch's linger.ms ends exactly (an int clock made
    # that up to a millisecond late, on top of the event loop's own rounding).
    return time.monotonic() * 1000


def linger_wait(delay_ms: float) -> tuple[float, float]:
    """How the sender waits ``delay_ms`` for its next due batch: (seconds on the event loop's
    timer, seconds of blocking sleep), one of them 0.

    The loop's timer is epoll's, whose timeout is whole milliseconds rounded up: waiting 4.3 ms
    on it wakes after 5 (measured: 0.6 ms late at the median, more under load), and the batch
    left that much after its ``linger.ms``. So the timer waits the whole milliseconds only
    (rounded down: it wakes just before the batch is due) and the rest, under 1 ms, is slept
    precisely on the next turn. Never early: a batch still leaves no sooner than ``linger.ms``
    after it opened (Kafka's rule)."""
    if delay_ms <= 0:
        return 0.0, 0.0
    whole_ms = int(delay_ms)
    if whole_ms >= 1:
        return whole_ms / 1000, 0.0
    return 0.0, delay_ms / 1000


def _to_bytes(data: Any, what: str) -> bytes | None:
    if data is None or type(data) is bytes:
        return data
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"record {what} must be bytes, str or None, got {type(data).__name__}")


def _normalize_headers(headers: Any) -> tuple[tuple[str, bytes | None], ...]:
    if not headers:
        return ()
    items = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for name, value in items:
        if not isinstance(name, str):
            raise TypeError(f"header names must be str, got {type(name).__name__}")
        out.append((name, _to_bytes(value, f"header {name!r}")))
    return tuple(out)


class _Sender:
    """The coroutine that drains the accumulator into Produce requests (loop thread only).

    Invariants: at most ``max.in.flight.requests.per.connection`` requests per broker are
    unanswered; each request carries at most one batch per partition; every drained batch is
    eventually completed, failed or put back (``handle_produce_results``).
    """

    def __init__(self, config: ClientConfig, accumulator: RecordAccumulator, network: Network):
        self.config = config
        self.accumulator = accumulator
        self.network = network
        self.acks: int = config["acks"]
        self.timeout_s = config["request.timeout.ms"] / 1000
        self.max_in_flight: int = config["max.in.flight.requests.per.connection"]
        self.in_flight: dict[int, int] = {}
        self.in_flight_total = 0
        self.wakeup = asyncio.Event()
        self.wake_pending = False
        #: True when the loop is the client's own I/O thread (``Producer``): the last fraction
        #: of a linger wait may then block it; never the application's loop (AsyncProducer).
        self.owns_loop = False
        self.closing = False
        self.partition_counts: dict[str, int] = {}
        self._refresh_task: asyncio.Task[Any] | None = None
        self._requests: set[asyncio.Task[None]] = set()
        self._last_refresh_ms: float = 0
        self._init_task: asyncio.Task[None] | None = None
        #: The transactional producer's state (None: not transactional).
        self.txn: ClientTransactionManager | None = None

    def wake(self) -> None:
        self.wakeup.set()

    def request_metadata_refresh(self) -> None:
        if self._refresh_task is None or self._refresh_task.done():
            self._refresh_task = asyncio.ensure_future(self._refresh())

    async def _refresh(self) -> None:
        try:
            await self.network.refresh_metadata()
        except FjordError as exc:
            log.debug("metadata refresh failed: %s", exc)
            await asyncio.sleep(self.config["retry.backoff.ms"] / 1000)
        self._last_refresh_ms = _mono_ms()
        self.update_partition_counts()
        self.wakeup.set()

    def update_partition_counts(self) -> None:
        snapshot = self.network.snapshot
        self.partition_counts = {
            name: len(t.partitions) for name, t in snapshot.topics.items() if t.partitions
        }

    async def run(self) -> None:
        acc = self.accumulator
        max_age = self.config["metadata.max.age.ms"]
        while True:
            self.wake_pending = False
            self.wakeup.clear()
            now = _mono_ms()
            for batch in acc.expire(now):
                if acc.idempotence is not None:
                    acc.idempotence.done(batch, failed=True)
                acc.deallocate(batch)
                error = acc.expiry_error(batch, KafkaTimeoutError)
                batch.completion.fail(error)
                if self.txn is not None:
                    self.txn.abortable(error)
            ready, delay_ms = acc.ready(now)
            idem = acc.idempotence
            if idem is not None and idem.bump_needed and not ready and self._idempotence_ready():
                # ready() holds every partition back while an epoch bump is pending, so the
                # bump is applied here (once nothing is in flight); without this the producer
                # stalled for good after a batch failed (found by tests/chaos).
                ready, delay_ms = acc.ready(now)
            if self.closing and not ready and not acc.has_pending() and not self._requests:
                return
            if acc.idempotence is not None and ready and not self._idempotence_ready():
                # Sending waits for a producer id or an epoch bump; both wake the loop when
                # done (as does every answer), the backoff only bounds the wait.
                ready = []
                delay_ms = max(delay_ms, self.config["retry.backoff.ms"])
            blocked = self._send_ready(ready)
            if now - self._last_refresh_ms > max_age:
                self.request_metadata_refresh()
            if blocked:
                delay_ms = max(delay_ms, self.config["retry.backoff.ms"])
            timer_s, precise_s = linger_wait(delay_ms)
            if timer_s > 0:
                await self._wait_woken(timer_s)
            elif precise_s > 0 and self.owns_loop:
                # The last fraction of a millisecond before a batch is due: a blocking sleep
                # (precise to tens of microseconds) holds this loop for under 1 ms, where the
                # loop's own timer would wake up to 1 ms late (see linger_wait).
                time.sleep(precise_s)
            elif precise_s > 0:
                await self._wait_woken(precise_s)  # the application's loop: never blocked
            else:
                await asyncio.sleep(0)

    async def _wait_woken(self, timeout_s: float) -> None:
        """Until woken or ``timeout_s`` passed (a timer that sets the wake-up event: cheaper
        than ``asyncio.wait_for``, which makes a task per wait)."""
        await wait_event(self.wakeup, timeout_s)

    def _idempotence_ready(self) -> bool:
        """Whether batches may be drained: a producer id is known and no epoch bump is
        pending. Both changes wait until no request is in flight (a batch of the old epoch
        landing after the change would be fenced); the id is fetched in the background."""
        idem = self.accumulator.idempotence
        assert idem is not None
        if idem.has_producer_id and not idem.bump_needed:
            return True
        if self.txn is not None:
            # A transactional producer's id and epochs come from its transaction coordinator
            # only (init_transactions(), and a new epoch after each abort).
            return False
        if any(not task.done() for task in self._requests) or (
            self._init_task is not None and not self._init_task.done()
        ):
            return False
        if idem.has_producer_id and self.accumulator.bump_epoch_if_needed():
            log.info("producer id %d: epoch bumped to %d", idem.producer_id, idem.producer_epoch)
            return True
        self._init_task = asyncio.ensure_future(self._init_producer_id())
        return False

    async def _init_producer_id(self) -> None:
        """InitProducerId on any broker (known ones first, then bootstrap)."""
        request = broker_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1)
        errors: list[str] = []
        try:
            for address in self.network.candidate_addresses():
                try:
                    response = await self.network.broker(address).InitProducerId(
                        request, timeout=self.timeout_s
                    )
                except Exception as exc:
                    errors.append(str(transport_error(exc, address)))
                    continue
                if response.error.code:
                    errors.append(f"{address}: {response.error.message}")
                    continue
                self.accumulator.set_producer_id(response.producer_id, response.producer_epoch)
                log.info(
                    "idempotent producer id %d epoch %d",
                    response.producer_id,
                    response.producer_epoch,
                )
                return
            log.debug("InitProducerId failed: %s", "; ".join(errors[-3:]))
            await asyncio.sleep(self.config["retry.backoff.ms"] / 1000)
            self.request_metadata_refresh()
        finally:
            self.wakeup.set()

    def _send_ready(self, ready: list[TopicPartition]) -> bool:
        """Start requests for the ready partitions; True when some had to wait (no leader
        known, or the broker's in-flight limit reached)."""
        if not ready:
            return False
        leaders = self.network.snapshot.leaders
        by_node: dict[int, list[TopicPartition]] = {}
        blocked = False
        if self.txn is not None:
            allowed = [tp for tp in ready if self.txn.may_send(tp)]
            blocked = len(allowed) < len(ready)  # woken again once the partitions are added
            ready = allowed
        for tp in ready:
            leader = leaders.get(tp)
            if leader is None:
                blocked = True
                continue
            by_node.setdefault(leader, []).append(tp)
        if blocked:
            self.request_metadata_refresh()
        max_request = self.config["max.request.size"]
        for node_id, tps in by_node.items():
            while self.in_flight.get(node_id, 0) < self.max_in_flight:
                batches = self.accumulator.drain(tps, max_request, _mono_ms())
                if not batches:
                    break
                self.in_flight[node_id] = self.in_flight.get(node_id, 0) + 1
                self.in_flight_total += 1
                task = asyncio.ensure_future(self._produce(node_id, batches))
                self._requests.add(task)
                task.add_done_callback(self._requests.discard)
            else:
                blocked = True
        return blocked

    async def _produce(self, node_id: int, batches: list[ProducerBatch]) -> None:
        node = self.network.snapshot.brokers.get(node_id)
        results: dict[TopicPartition, PartitionResult] | BaseException
        try:
            if node is None:
                raise FjordError(
                    f"broker {node_id} left the cluster", ErrorCode.BROKER_NOT_AVAILABLE
                )
            request = build_produce_request(
                batches, self.acks, int(self.timeout_s * 1000),
                transactional_id=self.txn.transactional_id if self.txn is not None else "",
            )
            response = await self.network.produce(node.address, request, self.timeout_s)
            if self.acks == 0:
                results = {b.tp: PartitionResult(ErrorCode.NONE) for b in batches}
            else:
                results = parse_produce_response(response)
        except FjordError as exc:
            results = exc
        finally:
            self.in_flight[node_id] -= 1
            self.in_flight_total -= 1
        outcome = handle_produce_results(
            self.accumulator,
            batches,
            results,
            _mono_ms(),
            retries=self.config["retries"],
            retry_backoff_ms=self.config["retry.backoff.ms"],
            make_timeout_error=KafkaTimeoutError,
            idempotence=self.accumulator.idempotence,
        )
        if self.txn is not None:
            for batch in batches:
                error = batch.completion.error
                if batch.completion.done and error is not None:
                    self.txn.abortable(error)
        if outcome.refresh_metadata:
            self.request_metadata_refresh()
        self.wakeup.set()


def build_produce_request(
    batches: Iterable[ProducerBatch], acks: int, timeout_ms: int, *, transactional_id: str = ""
) -> broker_pb2.ProduceRequest:
    """One request; consecutive batches of a partition are concatenated in one records field
    (they must share their coordinator epoch: ValueError otherwise). A transactional producer
    names its ``transactional_id``: the broker checks Write on it (Kafka's rule)."""
    by_partition: dict[TopicPartition, list[bytes]] = {}
    epochs: dict[TopicPartition, int] = {}
    for batch in batches:
        by_partition.setdefault(batch.tp, []).append(batch.close())
        if epochs.setdefault(batch.tp, batch.coordinator_epoch) != batch.coordinator_epoch:
            raise ValueError(f"batches of {batch.tp} with different coordinator epochs")
    # Built in place with add(): a message passed to a constructor is copied, payload and all
    # (three copies of every batch before the request was serialized).
    request = broker_pb2.ProduceRequest(
        acks=acks, timeout_ms=timeout_ms, transactional_id=transactional_id
    )
    topics: dict[str, broker_pb2.ProduceTopic] = {}
    for tp, payloads in by_partition.items():
        topic = topics.get(tp.topic)
        if topic is None:
            topic = topics[tp.topic] = request.topics.add(name=tp.topic)
        topic.partitions.add(
            partition=tp.partition,
            records=payloads[0] if len(payloads) == 1 else b"".join(payloads),
            coordinator_epoch=epochs[tp],
        )
    return request


def parse_produce_response(
    response: broker_pb2.ProduceResponse,
) -> dict[TopicPartition, PartitionResult]:
    results: dict[TopicPartition, PartitionResult] = {}
    for topic in response.topics:
        for p in topic.partitions:
            results[TopicPartition(topic.name, p.partition)] = PartitionResult(
                error_code_from_number(p.error.code),
                p.error.message,
                p.base_offset,
                p.log_append_time_ms if p.log_append_time_ms > 0 else -1,
            )
    return results


class _ProducerBase:
    """What both producer APIs share: config, accumulator, partitioners, network and sender.

    The subclass decides where the sender's loop runs (a private thread for :class:`Producer`,
    the caller's loop for :class:`AsyncProducer`) and how to wait.
    """

    def __init__(self, config: Mapping[str, Any], tracer_provider: Any | None = None) -> None:
        self.config = producer_config(config)
        cfg = self.config
        codec = _CODECS[cfg["compression.type"]]
        batch_size = cfg["batch.size"]
        transactional = cfg["transactional.id"] is not None
        self._accumulator = RecordAccumulator(
            lambda: BatchBuilder(
                compression=codec, batch_size=batch_size, is_transactional=transactional
            ),
            batch_size=batch_size,
            linger_ms=cfg["linger.ms"],
            buffer_memory=cfg["buffer.memory"],
            delivery_timeout_ms=cfg["delivery.timeout.ms"],
            guarantee_order=cfg["max.in.flight.requests.per.connection"] == 1,
            clock=_mono_ms,
            idempotence=(
                IdempotenceState(transactional=transactional)
                if cfg["enable.idempotence"] else None
            ),
            sized_builder=lambda size: BatchBuilder(
                compression=codec, batch_size=size, is_transactional=transactional
            ),
            blocked_batch_size=min(cfg["blocked.batch.size"], cfg["max.request.size"]),
        )
        self._max_block_s = cfg["max.block.ms"] / 1000
        self._max_record = cfg["max.request.size"]
        self._ignore_keys = cfg["partitioner.ignore.keys"]
        self._sticky = StickyPartitioner()
        self._tps: dict[str, list[TopicPartition]] = {}
        self._network = Network(
            cfg["bootstrap.servers"],
            client_id=cfg["client.id"],
            request_timeout_ms=cfg["request.timeout.ms"],
            allow_auto_topic_creation=cfg["allow.auto.create.topics"],
            service="producer",
            tracer_provider=tracer_provider,
            security=ClientSecurity.from_config(cfg),
        )
        # With tracing configured, records sent inside a span carry its traceparent header
        # (decided once here: the check is not free and send() is the hot path).
        self._trace_records = _tracing_configured(tracer_provider)
        self._sender = _Sender(cfg, self._accumulator, self._network)
        self._closed = False
        self._txn: ClientTransactionManager | None = None
        if transactional:
            assert self._accumulator.idempotence is not None
            self._txn = self._sender.txn = ClientTransactionManager(
                cfg["transactional.id"],
                cfg["transaction.timeout.ms"],
                self._network,
                self._accumulator.idempotence,
                retry_backoff_ms=cfg["retry.backoff.ms"],
                request_timeout_s=cfg["request.timeout.ms"] / 1000,
                wake_sender=self._sender.wake,
                fail_queued=self._fail_queued,
            )

    def _transactions(self) -> ClientTransactionManager:
        if self._txn is None:
            raise InvalidTxnStateError(
                "this producer has no transactional.id: transactions are not available"
            )
        return self._txn

    def _txn_timeout(self, timeout: float | None) -> float:
        """A transactional call's bound: ``timeout`` seconds, by default ``max.block.ms``."""
        return self._max_block_s if timeout is None or timeout < 0 else timeout

    @staticmethod
    def _not_flushed(commit: bool, wait_s: float, cause: KafkaTimeoutError) -> TransactionError:
        """The retriable error of a commit or abort whose flush did not end in ``wait_s``."""
        if commit:
            what = "commit_transaction(): records not acknowledged"
        else:
            what = "abort_transaction(): requests in flight not answered"
        return TransactionError(
            f"{what} within {wait_s} s", ErrorCode.REQUEST_TIMED_OUT, retriable=True, cause=cause
        )

    def _check_transactional_send(self) -> None:
        if self._txn is not None:
            self._txn.check_send()

    def _abort_queued(self) -> None:
        """abort_transaction(): records not sent yet are dropped (they fail with
        TransactionAbortedError), as Kafka's producer does."""
        self._fail_queued(
            TransactionAbortedError(
                "the transaction was aborted before this record was sent",
                ErrorCode.TRANSACTION_ABORTABLE,
            )
        )

    def _fail_queued(self, error: BaseException) -> None:
        for batch in self._accumulator.abort_all():
            self._accumulator.deallocate(batch)
            batch.completion.fail(error)

    async def _await_topic(self, topic: str) -> int:
        """The partition count of ``topic``, refreshing metadata until ``max.block.ms``. An
        illegal name raises :class:`InvalidTopicError` at once (no topic can have it)."""
        validate_topic_name(topic)
        deadline = time.monotonic() + self._max_block_s
        last = ""
        while True:
            try:
                snapshot = await asyncio.wait_for(
                    self._network.refresh_metadata([topic]),
                    max(deadline - time.monotonic(), 0.001),
                )
                self._sender.update_partition_counts()
                count = snapshot.partition_count(topic)
                if count:
                    return count
                code, message = snapshot.topic_errors.get(
                    topic, (ErrorCode.LEADER_NOT_AVAILABLE, "no partitions yet")
                )
                if not code.retriable:
                    raise topic_error(topic, code, message)
                last = f"{code.name} {message}".strip()
            except FjordError as exc:
                if not exc.retriable:
                    raise
                last = str(exc)
            except TimeoutError:
                pass
            if time.monotonic() >= deadline:
                raise KafkaTimeoutError(
                    f"topic {topic!r} not present in metadata after "
                    f"{int(self._max_block_s * 1000)} ms (max.block.ms); last error: {last}"
                )
            await asyncio.sleep(min(self.config["retry.backoff.ms"] / 1000, 0.5))

    def _prepare(
        self, value: Any, key: Any, headers: Any
    ) -> tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]:
        if self._closed:
            raise FjordError("send() after close()", code=ErrorCode.INVALID_REQUEST)
        if type(value) is not bytes:
            value = _to_bytes(value, "value")
        if type(key) is not bytes:
            key = _to_bytes(key, "key")
        header_items = _normalize_headers(headers) if headers else ()
        if self._trace_records:
            header_items = _with_traceparent(header_items)
        self._check_size(value, key)
        return value, key, header_items

    def _check_size(self, value: bytes | None, key: bytes | None) -> None:
        size = _HEADER_OVERHEAD + (len(key) if key else 0) + (len(value) if value else 0)
        if size > self._max_record:
            raise RecordTooLargeError(
                f"the record is {size} bytes with framing, more than max.request.size "
                f"({self._max_record})"
            )

    def _partitions(self, topic: str) -> list[TopicPartition] | None:
        """The cached partitions of ``topic`` (None: metadata needed first)."""
        tps = self._tps.get(topic)
        known = self._sender.partition_counts.get(topic)
        if tps is not None and (known is None or known == len(tps)):
            return tps
        if known is None:
            return None
        tps = self._tps[topic] = [TopicPartition(topic, p) for p in range(known)]  # new or grew
        return tps

    def _place(
        self,
        tps: list[TopicPartition],
        value: bytes | None,
        key: bytes | None,
        partition: int | None,
        header_items: tuple[tuple[str, bytes | None], ...],
        timestamp_ms: int,
    ) -> tuple[RecordFuture, bool] | int:
        """Choose the record's partition: (future, wake the sender) when the sticky
        partition's open batch took it, else the partition number whose batch it goes to
        (``accumulator.append``, which may open a batch and wait for room)."""
        count = len(tps)
        topic = tps[0].topic
        if partition is None:
            if key is not None and not self._ignore_keys:
                return partition_for_key(key, count)
            partition = self._sticky.partition(topic, count)
            future, wake = self._accumulator.append(
                tps[partition], timestamp_ms, key, value, header_items, -1,
                abort_on_new_batch=True,
            )  # fmt: skip
            if future is not None:
                return future, wake
            return self._sticky.on_new_batch(topic, count, partition)
        if not 0 <= partition < count:
            raise error_for_code(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"partition {partition} of topic {topic!r} does not exist ({count} partitions)",
            )
        return partition

    def _abort_unsent(self) -> None:
        self._accumulator.close()
        for batch in self._accumulator.abort_all():
            self._accumulator.deallocate(batch)
            batch.completion.fail(KafkaTimeoutError("the producer was closed before sending"))

    async def _stop_sender(self, sender_done: Awaitable[Any]) -> None:
        self._sender.closing = True
        self._sender.wakeup.set()
        try:
            await asyncio.wait_for(sender_done, 5.0)
        except Exception:
            log.warning("the producer's sender did not stop in time")
        await self._network.close()


class Producer(_ProducerBase):
    """Sends records to Fjord topics (Kafka's ``KafkaProducer``), configured with Kafka's names.

    ``send()`` returns a :class:`RecordFuture` (``concurrent.futures.Future`` interface) that
    resolves to :class:`RecordMetadata` or raises the typed error. Invariants: records sent to
    the same partition from one thread are appended in call order; after ``flush()`` returns
    every earlier ``send()`` is complete; after ``close()`` ``send()`` raises. Callbacks run on
    the producer's I/O thread.

    ``tracer_provider`` (an OpenTelemetry SDK provider) traces this producer's calls and adds
    the ``traceparent`` record header without a global provider (see docs/observability.md).
    """

    def __init__(self, config: Mapping[str, Any], *, tracer_provider: Any | None = None) -> None:
        super().__init__(config, tracer_provider)
        # send()'s fast path: per topic, (builder, completion, batch) of the open batch its
        # sticky partition fills, and the largest value that needs no size check (0 with
        # tracing: records get a header).
        self._sticky_batches: dict[str, tuple[Any, BatchCompletion, ProducerBatch]] = {}
        self._yield_per_batch = bool(self.config["enable.idempotence"])
        self._fast_value_limit = 0 if self._trace_records else self._max_record - _HEADER_OVERHEAD
        if ATOMIC_APPEND and self._fast_value_limit > 0 and hasattr(EXTENSION, "FastSend"):
            # The same fast path whole in C (no Python frame per record): send(topic, value)
            # with a bytes value goes through it, everything else to the method below.
            assert EXTENSION is not None
            self.__dict__["send"] = EXTENSION.FastSend(
                self._sticky_batches, RecordFuture, type(self).send.__get__(self),
                self._fast_value_limit,
            )
        self._io = EventLoopThread(f"fjord-producer-{self.config['client.id']}")
        self._io_thread_id = self._io.thread_id
        self._sender.owns_loop = True
        self._sender_task = self._io.submit(self._start_sender())

    async def _start_sender(self) -> None:
        # Recreate the event on the loop it is used on, then run until close.
        self._sender.wakeup = asyncio.Event()
        await self._sender.run()

    def _wake_sender(self) -> None:
        sender = self._sender
        # Called once per new or full batch, not per record. Even with a request in flight the
        # sender must learn now when this batch's linger.ms ends: waiting for that request's
        # answer to re-run it would add the request's latency to this batch's.
        if not sender.wake_pending:
            sender.wake_pending = True
            self._io.call_soon(sender.wake)

    def _not_from_callback(self, what: str) -> None:
        # A callback runs on the I/O thread: waiting there for that thread would deadlock.
        if self._io.in_loop_thread:
            raise FjordError(
                f"{what} cannot wait inside a produce callback", code=ErrorCode.INVALID_REQUEST
            )

    def partitions_for(self, topic: str) -> list[int]:
        """The partition numbers of ``topic`` (fetching metadata, up to ``max.block.ms``)."""
        tps = self._partitions(topic)
        if tps is None:
            self._not_from_callback("partitions_for()")
            self._io.run(self._await_topic(topic), self._max_block_s + 1)
            tps = self._partitions(topic)
        return [tp.partition for tp in tps or ()]

    def send(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Any = None,
        timestamp_ms: int | None = None,
    ) -> RecordFuture:
        """Queue a record; returns its future at once (blocks only for the topic's first
        metadata or when ``buffer.memory`` is full, each up to ``max.block.ms``)."""
        if (
            key is None
            and partition is None
            and headers is None
            and timestamp_ms is None
            and type(value) is bytes
            and not self._closed
        ):
            # Fast path (issue 18): a record without key or headers goes into the batch its
            # topic's sticky partition is filling, while that batch is open and has room (never
            # for a transactional producer: its cache stays empty).
            target = self._sticky_batches.get(topic)
            if target is not None and len(value) <= self._fast_value_limit:
                # Timestamp None: now, read by the builder (in C: one Python call less).
                if ATOMIC_APPEND:  # (accumulator.try_append_open, inlined: this is per record)
                    future = target[0].try_append_future(
                        RecordFuture, target[1], None, None, value
                    )
                else:
                    future = self._accumulator.try_append_open(target[2], None, value)
                if future is not None:
                    return future
        if self._closed:
            raise FjordError("send() after close()", code=ErrorCode.INVALID_REQUEST)
        if self._txn is not None:
            self._txn.check_send()
        value_bytes = value if type(value) is bytes else _to_bytes(value, "value")
        key_bytes = key if key is None or type(key) is bytes else _to_bytes(key, "key")
        header_items = _normalize_headers(headers) if headers else ()
        if self._trace_records:
            header_items = _with_traceparent(header_items)
        if (len(value_bytes) if value_bytes else 0) + (len(key_bytes) if key_bytes else 0) > (
            self._max_record - _HEADER_OVERHEAD
        ):
            self._check_size(value_bytes, key_bytes)
        tps = self._tps.get(topic)
        if tps is None or self._sender.partition_counts.get(topic) != len(tps):
            tps = self._partitions(topic)  # first use, or the topic grew
        if tps is None:
            self._not_from_callback("send() to a topic without metadata yet")
            self._io.run(self._await_topic(topic), self._max_block_s + 1)
            tps = self._partitions(topic)
            assert tps is not None
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        placed = self._place(tps, value_bytes, key_bytes, partition, header_items, timestamp_ms)
        if isinstance(placed, int):
            # From a callback (the I/O thread) a full buffer cannot drain while we wait: fail
            # fast. now_ms -1: the accumulator reads its clock only when it opens a batch.
            max_block = 0.0 if threading.get_ident() == self._io_thread_id else self._max_block_s
            future, wake = self._accumulator.append(
                tps[placed], timestamp_ms, key_bytes, value_bytes, header_items, -1,
                max_block_s=max_block,
            )  # fmt: skip
        else:
            future, wake = placed
        assert future is not None
        if key is None and partition is None and not header_items and self._txn is None:
            # The batch the next null-key records of this topic fill (see the fast path).
            batch = self._accumulator.open_batch(tps[self._sticky.partition(topic, len(tps))])
            if batch is not None and batch.coordinator_epoch == 0:
                self._sticky_batches[topic] = (batch.builder, batch.completion, batch)
            else:
                self._sticky_batches.pop(topic, None)
        if wake:
            self._wake_sender()
            if self._yield_per_batch:
                # Give the GIL to the I/O thread once per batch: an application thread that
                # does nothing but send() keeps it for the whole switch interval (5 ms), and
                # every step of a Produce round trip on the I/O thread (answer, completion, next
                # request) then waits that long. With idempotence (at most 5 batches of a
                # partition unanswered) those waits set the throughput. Without it, the waits
                # let batches pile up into fewer, larger requests: yielding there cost more
                # throughput (about half, bench_e2e) than it saved in latency.
                time.sleep(0)
        return future

    def send_many(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordsFuture:
        """Queue many records of one topic at once: record ``i`` is ``values[i]`` with key
        ``keys[i]`` (``keys`` None: no keys), no headers, all with one timestamp
        (``timestamp_ms``, default now). Partitions as :meth:`send` chooses them (``partition``,
        else Kafka's murmur2 of the key, else the sticky partition; all null-key records of
        one call go to one partition), and records of a partition keep their order. The bulk
        form of :meth:`send` for callers that hold records in columns (the Spark sink): the
        records go into batches in one C call per batch (with the extension) and there is
        one future for all of them, a :class:`RecordsFuture` (``result()``: the count, or
        the first failed batch's error). Same blocking and size rules as :meth:`send`: a
        record larger than ``max.request.size`` raises RecordTooLargeError before anything
        of this call is queued; a value or key that is not bytes-like raises with the
        records before it queued."""
        self._not_from_callback("send_many()")
        if self._closed:
            raise FjordError("send_many() after close()", code=ErrorCode.INVALID_REQUEST)
        if self._txn is not None:
            self._txn.check_send()
        values = values if type(values) is list else list(values)
        if keys is not None:
            keys = keys if type(keys) is list else list(keys)
            if len(keys) != len(values):
                raise ValueError(
                    f"send_many(): {len(keys)} keys for {len(values)} values (one key per value)"
                )
        if not values:
            return RecordsFuture([], 0)
        if self._trace_records:  # every record needs its own traceparent header: one by one
            futures = [
                self.send(topic, value, None if keys is None else keys[i], partition, None,
                          timestamp_ms)
                for i, value in enumerate(values)
            ]  # fmt: skip
            return RecordsFuture(list(dict.fromkeys(f._batch for f in futures)), len(futures))
        self._check_sizes(values, keys)
        tps = self._tps.get(topic)
        if tps is None or self._sender.partition_counts.get(topic) != len(tps):
            tps = self._partitions(topic)
        if tps is None:
            self._io.run(self._await_topic(topic), self._max_block_s + 1)
            tps = self._partitions(topic)
            assert tps is not None
        count = len(tps)
        if partition is not None:
            if not 0 <= partition < count:
                raise error_for_code(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"partition {partition} of topic {topic!r} does not exist ({count} "
                    "partitions)",
                )
            groups: list[tuple[int, list[Any] | None, list[Any]]] = [(partition, keys, values)]
        else:
            sticky = self._sticky.partition(topic, count)
            if keys is None or self._ignore_keys:
                groups = [(sticky, keys, values)]
            else:
                groups = [
                    (p, group[0], group[1])
                    for p, group in enumerate(group_by_partition(keys, values, count, sticky))
                    if group is not None
                ]
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        completions: list[Any] = []
        moved_sticky = False
        for number, group_keys, group_values in groups:
            done, wake = self._accumulator.append_many(
                tps[number], timestamp_ms, group_keys, group_values, max_block_s=self._max_block_s
            )
            completions.extend(done)
            if wake:
                self._wake_sender()
                if partition is None and not moved_sticky:
                    self._sticky.on_new_batch(topic, count, sticky)  # KIP-480: move on
                    moved_sticky = True
                if self._yield_per_batch:
                    time.sleep(0)  # (see send(): the I/O thread needs the GIL once per batch)
        return RecordsFuture(completions, len(values))

    def _check_sizes(self, values: list[Any], keys: list[Any] | None) -> None:
        """RecordTooLargeError for the first record larger than max.request.size allows (the
        exact check only when the largest key and value together could be too large)."""
        limit = self._max_record - _HEADER_OVERHEAD
        largest = max(map(len, filter(None, values)), default=0)
        if keys is not None:
            largest += max(map(len, filter(None, keys)), default=0)
        if largest <= limit:
            return
        for i, value in enumerate(values):
            self._check_size(value, None if keys is None else keys[i])

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now and wait until each record is acknowledged or failed
        (``timeout`` in seconds: KafkaTimeoutError when it passes)."""
        self._not_from_callback("flush()")
        deadline = None if timeout is None else time.monotonic() + timeout
        completions = self._accumulator.begin_flush()
        try:
            self._io.call_soon(self._sender.wake)
            for completion in completions:
                remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
                if not completion.wait(remaining):
                    raise KafkaTimeoutError(f"flush() did not complete within {timeout} s")
        finally:
            self._accumulator.end_flush()

    # --- transactions (confluent-kafka's Producer API; docs/transactions.md) ---------------

    def init_transactions(self, timeout: float | None = None) -> None:
        """Register ``transactional.id`` with its transaction coordinator: get the producer
        id and a new epoch, which fences any older producer with the same id and aborts its
        open transaction. Once per producer, before any other transactional call. Raises
        TransactionError (``retriable`` on a timeout: call again; ``fatal``: give up)."""
        self._not_from_callback("init_transactions()")
        txn, wait_s = self._transactions(), self._txn_timeout(timeout)
        self._io.run(txn.init(wait_s), wait_s + 5)

    def begin_transaction(self) -> None:
        """Start a transaction: every record sent until commit/abort belongs to it."""
        txn = self._transactions()
        self._io.run(_call_async(txn.begin), self._max_block_s)

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
        group_metadata: ConsumerGroupMetadata | str,
        timeout: float | None = None,
    ) -> None:
        """Commit a consumer's ``offsets`` ({partition: next offset to read}) as part of the
        transaction: they count only if it commits (consume-transform-produce exactly once).
        ``group_metadata``: the consumer's ``consumer_group_metadata()`` (or a group id)."""
        self._not_from_callback("send_offsets_to_transaction()")
        txn, wait_s = self._transactions(), self._txn_timeout(timeout)
        group = _group_metadata(group_metadata)
        chosen = normalize_offsets(offsets)
        self._io.run(txn.send_offsets(chosen, group, wait_s), wait_s + 5)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush the transaction's records, then commit it. A record that failed makes this
        raise TransactionAbortedError (``txn_requires_abort()``): call abort_transaction()."""
        self._not_from_callback("commit_transaction()")
        self._end_transaction(True, timeout)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the transaction: records not sent yet are dropped, those sent are never
        seen by read_committed consumers; the producer then takes a new epoch."""
        self._not_from_callback("abort_transaction()")
        self._end_transaction(False, timeout)

    def _end_transaction(self, commit: bool, timeout: float | None) -> None:
        txn, wait_s = self._transactions(), self._txn_timeout(timeout)
        deadline = time.monotonic() + wait_s
        if commit:
            txn.check_send()  # an abortable or fatal error: raised before anything else
        else:
            self._abort_queued()
        try:
            self.flush(wait_s)  # (abort: what is in flight must be answered before the markers)
        except KafkaTimeoutError as exc:
            raise self._not_flushed(commit, wait_s, exc) from exc
        remaining = max(deadline - time.monotonic(), 0.1)
        self._io.run(txn.end(commit, remaining), remaining + 5)

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop the sender and close connections. Records still unsent after
        ``timeout`` seconds fail with KafkaTimeoutError. Idempotent."""
        if self._closed:
            return
        self._not_from_callback("close()")
        self._closed = True
        fast_send = self.__dict__.get("send")
        if fast_send is not None:
            fast_send.close()  # send() raises from now on, as the method does
        try:
            self.flush(timeout)
        except KafkaTimeoutError:
            pass
        finally:
            self._abort_unsent()
            sender_done = asyncio.wrap_future(self._sender_task, loop=self._io.loop)
            self._io.run(self._stop_sender(sender_done), 10.0)
            self._io.stop()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncProducer(_ProducerBase):
    """The asyncio producer: the same core, its sender running on the caller's event loop.

    ``await send(...)`` queues the record and returns an ``asyncio.Future`` of
    :class:`RecordMetadata` (await it for the acknowledgement, or use ``send_and_wait``).
    Create, use and close it on one event loop; it never blocks that loop (a full
    ``buffer.memory`` is waited for with ``await``, up to ``max.block.ms``).
    """

    def __init__(self, config: Mapping[str, Any], *, tracer_provider: Any | None = None) -> None:
        super().__init__(config, tracer_provider)
        self._sender_task: asyncio.Task[None] | None = None
        # Set whenever buffer.memory is freed: the sender frees it on this same loop.
        self._room_freed = asyncio.Event()
        self._accumulator.on_room_freed = self._room_freed.set

    async def start(self) -> None:
        """Start the sender (``send`` does it on first use)."""
        if self._sender_task is None:
            self._sender.wakeup = asyncio.Event()
            self._sender_task = asyncio.ensure_future(self._sender.run())

    async def partitions_for(self, topic: str) -> list[int]:
        await self.start()
        tps = self._partitions(topic)
        if tps is None:
            await self._await_topic(topic)
            tps = self._partitions(topic)
        return [tp.partition for tp in tps or ()]

    async def send(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Any = None,
        timestamp_ms: int | None = None,
        *,
        coordinator_epoch: int = 0,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue a record. ``coordinator_epoch`` is Fjord's group coordinator's fence on its
        ``__consumer_offsets`` appends (the partition's leader refuses an older epoch than it
        knows); other producers leave it 0."""
        if self._txn is not None:
            self._txn.check_send()
        value_bytes, key_bytes, header_items = self._prepare(value, key, headers)
        await self.start()
        tps = self._partitions(topic)
        if tps is None:
            await self._await_topic(topic)
            tps = self._partitions(topic)
            assert tps is not None
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        placed = self._place(tps, value_bytes, key_bytes, partition, header_items, timestamp_ms)
        if isinstance(placed, int):
            try:  # (no coroutine per record: only a record that must wait for room awaits)
                record_future, wake = self._accumulator.append(
                    tps[placed], timestamp_ms, key_bytes, value_bytes, header_items, -1,
                    coordinator_epoch=coordinator_epoch, awaits_room=self._max_block_s > 0,
                )  # fmt: skip
            except NoRoomYet as no_room:
                record_future, wake = await self._await_room(
                    no_room.plan, timestamp_ms, key_bytes, value_bytes, header_items,
                    coordinator_epoch,
                )  # fmt: skip
        else:
            record_future, wake = placed
        assert record_future is not None
        if wake:
            self._sender.wake()
        result: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        record_future.add_done_callback(functools.partial(_settle, result))
        return result

    async def _await_room(
        self,
        plan: BatchPlan,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        header_items: tuple[tuple[str, bytes | None], ...],
        coordinator_epoch: int,
    ) -> tuple[RecordFuture, bool]:
        """A record that must open a batch (sized by ``plan``, as the blocking
        :class:`Producer` sizes it: ``RecordAccumulator._plan_batch``, a partition blocked
        behind its window growing its batch up to ``blocked.batch.size``) found no
        ``buffer.memory`` room for it: where the blocking ``send()`` blocks, this awaits the
        room, woken whenever memory is freed (answers come on this loop), then appends the
        record into that batch; after ``max.block.ms`` it raises BufferExhaustedError, a
        KafkaTimeoutError, having appended nothing."""
        acc = self._accumulator
        deadline = time.monotonic() + self._max_block_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise acc.buffer_exhausted(self._max_block_s)
            self._sender.wake()  # batches that may leave now free their memory once answered
            await wait_event(self._room_freed, remaining)
            self._room_freed.clear()  # (nothing frees memory between here and the append)
            try:
                future, wake = acc.append(
                    plan.tp, timestamp_ms, key, value, header_items, -1,
                    coordinator_epoch=coordinator_epoch, awaits_room=True, plan=plan,
                )  # fmt: skip
            except NoRoomYet:
                continue  # another record took the room first
            assert future is not None
            return future, wake

    async def send_and_wait(self, topic: str, *args: Any, **kwargs: Any) -> RecordMetadata:
        return await (await self.send(topic, *args, **kwargs))

    async def flush(self, timeout: float | None = None) -> None:
        completions = self._accumulator.begin_flush()
        try:
            self._sender.wake()
            waiters = []
            loop = asyncio.get_running_loop()
            for completion in completions:
                waiter: asyncio.Future[RecordMetadata] = loop.create_future()
                completion.add_callback(
                    functools.partial(_settle, waiter), RecordFuture(completion, 0, 0)
                )
                waiters.append(waiter)
            if waiters:
                done, pending = await asyncio.wait(waiters, timeout=timeout)
                for waiter in done:
                    waiter.exception()  # failures belong to the records' own futures
                if pending:
                    for waiter in pending:
                        # Nobody awaits them any more: a failure settled later would be
                        # logged as "Future exception was never retrieved" (_settle skips
                        # a done target).
                        waiter.cancel()
                    raise KafkaTimeoutError(f"flush() did not complete within {timeout} s")
        finally:
            self._accumulator.end_flush()

    # --- transactions: the same API as Producer's, awaited ---------------------------------

    async def init_transactions(self, timeout: float | None = None) -> None:
        await self.start()
        await self._transactions().init(self._txn_timeout(timeout))

    async def begin_transaction(self) -> None:
        self._transactions().begin()

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
        group_metadata: ConsumerGroupMetadata | str,
        timeout: float | None = None,
    ) -> None:
        txn = self._transactions()
        wait_s = self._txn_timeout(timeout)
        await txn.send_offsets(
            normalize_offsets(offsets), _group_metadata(group_metadata), wait_s
        )

    async def commit_transaction(self, timeout: float | None = None) -> None:
        await self._end_transaction(True, timeout)

    async def abort_transaction(self, timeout: float | None = None) -> None:
        await self._end_transaction(False, timeout)

    async def _end_transaction(self, commit: bool, timeout: float | None) -> None:
        # As Producer's commit_transaction() and abort_transaction(), awaited.
        txn = self._transactions()
        wait_s = self._txn_timeout(timeout)
        deadline = time.monotonic() + wait_s
        if commit:
            txn.check_send()
        else:
            self._abort_queued()
        try:
            await self.flush(wait_s)
        except KafkaTimeoutError as exc:
            raise self._not_flushed(commit, wait_s, exc) from exc
        await txn.end(commit, max(deadline - time.monotonic(), 0.1))

    async def close(self, timeout: float | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.flush(timeout)
        except KafkaTimeoutError:
            pass
        finally:
            self._abort_unsent()
            if self._sender_task is not None:
                await self._stop_sender(self._sender_task)
            else:
                await self._network.close()

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


def _group_metadata(value: ConsumerGroupMetadata | str) -> ConsumerGroupMetadata:
    if isinstance(value, str):
        return ConsumerGroupMetadata(value)
    if not isinstance(value, ConsumerGroupMetadata) or not value.group_id:
        raise InvalidRequestError(
            "group_metadata must be a consumer's consumer_group_metadata() or a group id"
        )
    return value


async def _call_async(fn: Callable[[], T]) -> T:
    """Run ``fn`` on the loop (the transaction state is only touched there)."""
    return fn()


def _tracing_configured(tracer_provider: Any | None) -> bool:
    if tracer_provider is None and "opentelemetry.trace" not in sys.modules:
        return False  # nobody installed a provider without importing OpenTelemetry
    from fjord.observability.clients import tracing_configured

    return tracing_configured(tracer_provider)


def _with_traceparent(
    headers: tuple[tuple[str, bytes | None], ...],
) -> tuple[tuple[str, bytes | None], ...]:
    from fjord.observability.clients import with_traceparent

    return with_traceparent(headers)


def _settle(target: asyncio.Future[RecordMetadata], record_future: RecordFuture) -> None:
    # Runs on the sender's loop, which is the target's loop for AsyncProducer.
    if target.done():
        return
    error = record_future.exception()
    if error is not None:
        target.set_exception(error)
    else:
        target.set_result(record_future.result())
