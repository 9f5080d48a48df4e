"""The AsyncProducer grows a blocked partition's batch as the blocking Producer does
(``blocked.batch.size``), awaiting ``buffer.memory`` room for it up to ``max.block.ms`` on its
event loop, against a real broker.

A private one-broker cluster (the shared one must not lose or freeze processes): its broker is
stopped (SIGSTOP) while the producer's 5-batch window is unanswered, so the window stays full
and the memory stays held for as long as the test needs, then continued (SIGCONT).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from fjord.client import (
    AdminClient,
    AsyncProducer,
    KafkaTimeoutError,
    NewTopic,
    RecordMetadata,
    TopicPartition,
)
from fjord.client.accumulator import BufferExhaustedError, ProducerBatch
from fjord.local.cluster import LocalCluster
from fjord.testing.waiting import wait_for_async

pytestmark = pytest.mark.integration

WAIT_S = 60.0
GROWN = 64 * 1024  # blocked.batch.size
# Twice GROWN (open grown batches may reserve at most half of buffer.memory): with one full
# grown batch queued behind the window, a second one has no room, a batch.size one has.
BUFFER_MEMORY = 2 * GROWN
VALUE = b"v" * 1000
MAX_RECORDS = 10 * GROWN // len(VALUE)  # bounds the loops: far more than a grown batch holds


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # A long broker lease: a stopped broker keeps its registration (and its leadership).
    with LocalCluster(
        tmp_path_factory.mktemp("async-blocked"), brokers=1, controllers=1, coordinators=0,
        unsafe_etcd_no_fsync=True, broker_lease_ttl_s=60,
    ) as started:  # fmt: skip
        yield started


@contextmanager
def broker_stopped(cluster: LocalCluster) -> Iterator[None]:
    pid = cluster.process("broker", 0).pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def new_topic(cluster: LocalCluster) -> str:
    name = f"blocked-{uuid.uuid4().hex[:10]}"
    with AdminClient(
        {"bootstrap.servers": cluster.bootstrap_servers, "default.api.timeout.ms": 30000}
    ) as admin:
        admin.create_topics([NewTopic(name, 1, 1)])
    return name


def producer_config(cluster: LocalCluster, max_block_ms: int) -> dict[str, object]:
    return {
        "bootstrap.servers": cluster.bootstrap_servers,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 0,
        "blocked.batch.size": GROWN,
        "buffer.memory": BUFFER_MEMORY,
        "max.block.ms": max_block_ms,
        # Nothing of a stopped broker's window may time out meanwhile.
        "request.timeout.ms": int(WAIT_S * 1000),
        "delivery.timeout.ms": int(3 * WAIT_S * 1000),
    }


async def fill_window_and_grow_a_batch(
    producer: AsyncProducer, topic: str
) -> tuple[list[asyncio.Future[RecordMetadata]], ProducerBatch]:
    """With the broker stopped: records sent one at a time, each batch taken by the sender
    before the next record, until the partition's window is full (5 batches unanswered); then
    one record, which opens a grown batch behind it. Returns the records' futures and the
    grown batch. How many records a batch holds is the producer's business: the loops look at
    the accumulator, never count records."""
    acc = producer._accumulator
    tp = TopicPartition(topic, 0)
    futures: list[asyncio.Future[RecordMetadata]] = []
    for _ in range(MAX_RECORDS):
        if acc.window_full(tp):
            break
        futures.append(await producer.send(topic, VALUE, partition=0))

        async def taken() -> bool:
            return not acc._queues.get(tp)

        await wait_for_async(taken, "the sender took the batch", WAIT_S, interval=0.001)
    assert acc.window_full(tp), "5 batches sent to a stopped broker fill the window"
    futures.append(await producer.send(topic, VALUE, partition=0))
    grown = acc.open_batch(tp)
    assert grown is not None and grown.reserved_bytes == GROWN, "the blocked batch grew"
    # A second grown batch has no room now (a batch.size one has): the rule under test.
    assert acc._reserved + GROWN > BUFFER_MEMORY >= acc._reserved + acc._batch_size
    return futures, grown


async def records_until_a_new_batch(
    producer: AsyncProducer,
    topic: str,
    grown: ProducerBatch,
    futures: list[asyncio.Future[RecordMetadata]],
) -> None:
    """Records into ``grown`` until one opens a new batch: that send() is the one that needs
    room (none of the others yields to the loop: they find room in the open batch)."""
    acc = producer._accumulator
    tp = TopicPartition(topic, 0)
    for _ in range(MAX_RECORDS):
        futures.append(await producer.send(topic, VALUE, partition=0))
        if acc.open_batch(tp) is not grown:
            return
    raise AssertionError("the grown batch never filled")


def test_a_full_window_waits_for_room_for_a_grown_batch_then_grows_it(
    cluster: LocalCluster,
) -> None:
    """The record that needs a new batch behind the full window, with room in buffer.memory
    for a batch.size batch but not for a grown one, awaits the room (the old rule opened a
    batch.size batch at once), the loop going on meanwhile; once the broker answers, it opens
    a grown batch. Every record then lands once, in order."""
    topic = new_topic(cluster)

    async def scenario() -> list[int]:
        async with AsyncProducer(producer_config(cluster, int(WAIT_S * 1000))) as producer:
            # The producer id, the metadata and a leader that serves, before the broker stops.
            first = await producer.send_and_wait(topic, b"first", partition=0)
            acc = producer._accumulator
            tp = TopicPartition(topic, 0)
            continued: list[float] = []

            def continue_broker() -> None:
                # Runs on the loop's next turn: only once a send() yields, i.e. awaits room.
                continued.append(time.monotonic())
                os.kill(cluster.process("broker", 0).pid, signal.SIGCONT)

            with broker_stopped(cluster):
                futures, grown = await fill_window_and_grow_a_batch(producer, topic)
                asyncio.get_running_loop().call_soon(continue_broker)
                await records_until_a_new_batch(producer, topic, grown, futures)
                # Checked before the loop turns again (the sender could take it then).
                opened = acc.open_batch(tp)
                assert continued, "the send() opening a new batch did not wait for room"
                assert opened is not None and opened is not grown
                assert opened.reserved_bytes == GROWN and opened.record_count == 1
            await producer.flush(WAIT_S)
            return [first.offset] + [(await f).offset for f in futures]

    offsets = asyncio.run(scenario())
    assert offsets == list(range(len(offsets)))  # every record once, in send order


def test_the_wait_for_room_for_a_grown_batch_ends_at_max_block_ms(cluster: LocalCluster) -> None:
    """The broker stays stopped: the record that needs a new batch behind the full window
    waits max.block.ms and fails with BufferExhaustedError, a KafkaTimeoutError, having
    opened no batch.size batch meanwhile nor appended anything; once the broker continues,
    every earlier record lands once, in order."""
    topic = new_topic(cluster)
    max_block_ms = 1000

    async def scenario() -> tuple[list[int], float, BaseException]:
        async with AsyncProducer(producer_config(cluster, max_block_ms)) as producer:
            first = await producer.send_and_wait(topic, b"first", partition=0)
            acc = producer._accumulator
            tp = TopicPartition(topic, 0)
            with broker_stopped(cluster):
                futures, grown = await fill_window_and_grow_a_batch(producer, topic)
                queued = list(acc._queues[tp])
                started = time.monotonic()
                with pytest.raises(BufferExhaustedError) as exhausted:
                    await records_until_a_new_batch(producer, topic, grown, futures)
                waited = time.monotonic() - started
                assert list(acc._queues[tp]) == queued  # no new batch of any size
                assert acc.open_batch(tp) is None  # the grown one is full, none opened
            await producer.flush(WAIT_S)
            offsets = [first.offset] + [(await f).offset for f in futures]
            return offsets, waited, exhausted.value

    offsets, waited, error = asyncio.run(scenario())
    assert isinstance(error, KafkaTimeoutError) and "max.block.ms" in str(error)
    # Not before max.block.ms; the upper bound only tells it from a wait that went on until
    # the broker continued (a loaded machine may add seconds: no speed target).
    assert max_block_ms / 1000 <= waited < WAIT_S / 2
    assert offsets == list(range(len(offsets)))
