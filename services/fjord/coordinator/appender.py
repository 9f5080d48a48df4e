"""Writing and reading ``__consumer_offsets`` through fjord.client: the coordinator's appends
(one idempotent AsyncProducer, acks=all, linger 0) and the replay of an owned partition (a
Consumer with ``assign()``, no group, in a worker thread)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from fjord.client import AsyncProducer, Consumer, RecordMetadata, TopicPartition
from fjord.coordinator import defaults
from fjord.coordinator.manager import EncodedRecord
from fjord.coordinator.offsets_log import GroupMetadataLoader, LoadedGroup
from fjord.errors import CorruptRecordError, ErrorCode, FjordError, KafkaTimeoutError
from fjord.groups.defaults import OFFSETS_TOPIC

log = logging.getLogger(__name__)


def producer_settings(bootstrap: str, client_id: str, timeout_ms: int) -> dict[str, object]:
    """The coordinator's producer: idempotent, acks=all, nothing lingers, every wait bounded by
    ``offsets.commit.timeout.ms``."""
    return {
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 0,
        "request.timeout.ms": timeout_ms,
        "delivery.timeout.ms": timeout_ms,
        "max.block.ms": timeout_ms,
    }


class OffsetsAppender:
    """Appends encoded records to ``__consumer_offsets`` partitions, in submission order.

    Invariants: every record is sent with the coordinator epoch it was submitted with (the
    partition's leader refuses an older epoch than it knows: a coordinator whose lease ran out
    cannot write after a newer one took over); :meth:`submit` never suspends and queues; one
    worker task sends the queued appends one after the other (records of one append go out back
    to back, so they share a batch unless it is full), so the idempotent producer writes them to
    each partition in submission order; each append's future resolves when all its records are
    acknowledged (acks=all) or fails with the first record's FjordError. The producer is built
    lazily from ``bootstrap()`` (the live brokers' addresses) when the first append is sent.
    """

    def __init__(
        self,
        bootstrap: Callable[[], str],
        client_id: str,
        timeout_ms: int = defaults.OFFSETS_COMMIT_TIMEOUT_MS,
        topic: str = OFFSETS_TOPIC,
    ) -> None:
        self._bootstrap = bootstrap
        self._client_id = client_id
        self._timeout_ms = timeout_ms
        self._topic = topic
        self._queue: asyncio.Queue[
            tuple[int, int, Sequence[EncodedRecord], asyncio.Future[None]]
        ] = asyncio.Queue()
        self._producer: AsyncProducer | None = None
        self._worker: asyncio.Task[None] | None = None
        self._waits: set[asyncio.Task[None]] = set()

    def submit(
        self, partition: int, epoch: int, records: Sequence[EncodedRecord]
    ) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not records:
            future.set_result(None)
            return future
        if self._worker is None:
            self._worker = asyncio.ensure_future(self._run())
        self._queue.put_nowait((partition, epoch, records, future))
        return future

    async def _producer_for_send(self) -> AsyncProducer:
        if self._producer is None:
            bootstrap = self._bootstrap()
            if not bootstrap:
                raise FjordError("no live broker", ErrorCode.COORDINATOR_NOT_AVAILABLE)
            self._producer = AsyncProducer(
                producer_settings(bootstrap, self._client_id, self._timeout_ms)
            )
            await self._producer.start()
        return self._producer

    async def _run(self) -> None:
        while True:
            partition, epoch, records, future = await self._queue.get()
            if future.done():
                continue
            try:
                producer = await self._producer_for_send()
                sent = [
                    await producer.send(
                        self._topic,
                        value=value,
                        key=key,
                        partition=partition,
                        coordinator_epoch=epoch,
                    )
                    for key, value in records
                ]
            except FjordError as exc:
                future.set_exception(exc)
                continue
            except Exception as exc:  # a bug or a transport surprise: fail this append only
                log.exception("sending to %s-%d failed", self._topic, partition)
                future.set_exception(FjordError(str(exc), ErrorCode.UNKNOWN_SERVER_ERROR))
                continue
            wait = asyncio.ensure_future(self._settle(sent, future))
            self._waits.add(wait)
            wait.add_done_callback(self._waits.discard)

    async def _settle(
        self, sent: list[asyncio.Future[RecordMetadata]], future: asyncio.Future[None]
    ) -> None:
        # The producer's delivery.timeout.ms bounds each record; the outer bound only guards
        # against a record whose outcome never comes.
        bound_s = 2 * self._timeout_ms / 1000
        try:
            await asyncio.wait_for(asyncio.gather(*sent), bound_s)
        except FjordError as exc:
            if not future.done():
                future.set_exception(exc)
            return
        except TimeoutError:
            if not future.done():
                future.set_exception(
                    KafkaTimeoutError(f"append not acknowledged within {bound_s} s")
                )
            return
        if not future.done():
            future.set_result(None)

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        for wait in list(self._waits):
            wait.cancel()
        await asyncio.gather(*self._waits, return_exceptions=True)
        while not self._queue.empty():
            _, _, _, future = self._queue.get_nowait()
            if not future.done():
                future.set_exception(
                    FjordError("the coordinator is stopping", ErrorCode.COORDINATOR_NOT_AVAILABLE)
                )
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await self._producer.close(1.0)
            self._producer = None


class _Loader(Protocol):
    def apply_bytes(self, key: bytes, value: bytes | None) -> None: ...


def replay_partitions(
    bootstrap: str,
    partitions: Sequence[int],
    client_id: str,
    timeout_s: float = defaults.OFFSETS_LOAD_TIMEOUT_S,
    topic: str = OFFSETS_TOPIC,
    *,
    cancelled: threading.Event | None = None,
    read_to_at_least: Mapping[int, int] | None = None,
) -> dict[int, dict[str, LoadedGroup]]:
    """:func:`replay_into` ``__consumer_offsets`` partitions: each one's groups."""
    loaders = {p: GroupMetadataLoader() for p in partitions}
    replay_into(
        bootstrap, loaders, client_id, timeout_s, topic,
        cancelled=cancelled, read_to_at_least=read_to_at_least,
    )
    return {p: loader.groups() for p, loader in loaders.items()}


def replay_into(
    bootstrap: str,
    loaders: Mapping[int, _Loader],
    client_id: str,
    timeout_s: float,
    topic: str,
    *,
    cancelled: threading.Event | None = None,
    read_to_at_least: Mapping[int, int] | None = None,
) -> None:
    """Read ``topic`` partitions (the keys of ``loaders``) from their log start to their high
    watermark (as of the start of the replay), or to ``read_to_at_least[p]`` when that is further
    log end when this coordinator claimed the partition: every record admitted before the
    claim, waiting until the high watermark passes it), feeding each record to its
    partition's loader.
    Blocking: run it in a worker thread. Raises KafkaTimeoutError after ``timeout_s`` and the
    client's typed errors; stops early (KafkaTimeoutError) once ``cancelled`` is set (the
    coordinator is stopping).

    A record that does not decode (CorruptRecordError) is logged and skipped: one bad record
    must not keep every group of the partition unavailable.
    """
    deadline = time.monotonic() + timeout_s
    partitions = sorted(loaders)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        ends = consumer.end_offsets(tps, timeout=max(deadline - time.monotonic(), 0.1))
        starts = consumer.beginning_offsets(tps, timeout=max(deadline - time.monotonic(), 0.1))
        floor = read_to_at_least or {}
        todo = {
            tp: end
            for tp in tps
            if (end := max(ends[tp], floor.get(tp.partition, 0))) > starts[tp]
        }
        consumer.assign(list(todo))
        for tp in todo:
            consumer.seek(tp, starts[tp])
        while todo:
            if cancelled is not None and cancelled.is_set():
                raise KafkaTimeoutError("replay cancelled: the coordinator is stopping")
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(
                    f"replaying {topic} partitions {sorted(tp.partition for tp in todo)} "
                    f"took more than {timeout_s} s"
                )
            for record in consumer.poll(defaults.OFFSETS_LOAD_POLL_S):
                if record.key is None:
                    log.error(
                        "%s-%d@%d has no key; skipped", topic, record.partition, record.offset
                    )
                    continue
                try:
                    loaders[record.partition].apply_bytes(record.key, record.value)
                except CorruptRecordError as exc:
                    log.error(
                        "%s-%d@%d does not decode (%s); skipped",
                        topic,
                        record.partition,
                        record.offset,
                        exc,
                    )
            for tp in [tp for tp, end in todo.items() if consumer.position(tp) >= end]:
                del todo[tp]
    finally:
        consumer.close()
