"""A grown batch (``blocked.batch.size``) against a topic whose ``max.message.bytes`` is below
the grown size, with real processes (the shared session cluster): the broker refuses it with
MESSAGE_TOO_LARGE and the idempotent producer splits it into ``batch.size`` batches (Kafka's
splitAndReenqueue) instead of failing its records; every record lands exactly once, in order.
"""

from __future__ import annotations

import uuid

import pytest

from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.client.types import ConsumerRecord
from fjord.testing.waiting import wait_for

pytestmark = pytest.mark.integration

WAIT_S = 60.0
MAX_MESSAGE_BYTES = 64 * 1024  # below the grown size (512 KiB), above batch.size (16 KiB)
CHUNK = 100  # records of 1 KB per send_many() (100 KB), one call after another
PADDING = b"v" * 1000
MAX_RECORDS = 100_000
AFTER_SPLIT = 5_000


def test_a_grown_batch_too_large_for_the_topic_is_split_and_delivered_once_in_order(
    bootstrap: str,
) -> None:
    topic = f"split-{uuid.uuid4().hex[:10]}"
    with AdminClient({"bootstrap.servers": bootstrap, "default.api.timeout.ms": 20000}) as admin:
        admin.create_topics(
            [NewTopic(topic, 1, 3, {"max.message.bytes": str(MAX_MESSAGE_BYTES)})]
        )
    config = {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "request.timeout.ms": 20000,
        "delivery.timeout.ms": 60000,
        # Small enough that send_many() soon waits for answers (the split is seen after a
        # few MB, not after the default 32 MiB), large enough for grown batches (2 x 512 KiB).
        "buffer.memory": 4 << 20,
    }
    sent = 0
    futures = []
    with Producer(config) as producer:
        accumulator = producer._accumulator
        assert accumulator._blocked_batch_size > MAX_MESSAGE_BYTES  # growth is on
        # Records faster than acks=all answers: the window fills, the batch opened then grows
        # past max.message.bytes, is refused and split. Until a split was seen (bounded; after
        # 4,900-6,400 records in 4 runs at load 2-3), then AFTER_SPLIT more (the topic's
        # batches stay at batch.size now: none is refused again).
        split_at = MAX_RECORDS
        while sent < min(MAX_RECORDS, split_at + AFTER_SPLIT):
            values = [b"%09d|" % (sent + i) + PADDING for i in range(CHUNK)]
            futures.append(producer.send_many(topic, values, partition=0))
            sent += CHUNK
            if split_at == MAX_RECORDS and topic in accumulator._no_growth_topics:
                split_at = sent
        producer.flush(WAIT_S)
        assert topic in accumulator._no_growth_topics, "no batch was refused and split"
        assert [f.result(timeout=0) for f in futures] == [CHUNK] * len(futures)

    tp = TopicPartition(topic, 0)
    received: list[ConsumerRecord] = []
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([tp])
        wait_for(
            lambda: received.extend(consumer.poll(0.5)) or len(received) >= sent,
            f"{sent} records consumed",
            WAIT_S,
        )
    numbers = [int(r.value[:9]) for r in received if r.value is not None]
    assert numbers == list(range(sent))  # every record once, in send order
    assert [r.offset for r in received] == list(range(sent))
