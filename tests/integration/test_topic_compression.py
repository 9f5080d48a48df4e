"""Topic-level compression.type on the shared cluster, as Kafka's broker applies it: a codec
makes the leader rewrite every batch in another codec (what lands on every replica's disk is
in the topic's codec), ``producer`` keeps each batch as sent, and a change takes effect on the
next produce. What was rewritten is read back record for record by fjord.client, kafka-python
and confluent-kafka (librdkafka) through both doors."""

from __future__ import annotations

import os
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KPTopicPartition

from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.records import Compression, read_batches
from fjord.testing.waiting import is_value, wait_for

pytestmark = pytest.mark.integration

WAIT_S = 30
LINGER_MS = 10_000
"""Longer than any pause of the test process between two sends; flush() does not wait for it."""


def stored_codecs(data_dir: Path, topic: str) -> dict[str, list[Compression]]:
    """The codec of every batch in each replica's segment files of ``topic``-0 (a batch the
    replica is writing at that moment, partly read, is not counted yet)."""
    out = {}
    for directory in sorted(data_dir.glob(f"brokers/*/{topic}-0")):
        data = b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))
        out[directory.parent.name] = [b.header.compression
                                      for b in read_batches(data, allow_partial_tail=True)]
    return out


def all_replicas_hold(data_dir: Path, topic: str, count: int) -> dict[str, list[Compression]]:
    """Wait until both replicas hold ``count`` batches; returns their codecs."""
    def found() -> dict[str, list[Compression]] | None:
        codecs = stored_codecs(data_dir, topic)
        return codecs if len(codecs) == 2 and all(
            len(c) == count for c in codecs.values()) else None
    return wait_for(found, f"two replicas of {topic}-0 with {count} batches", WAIT_S)


def read_with_kafka_python(kafka_bootstrap: str, topic: str, n: int) -> list[tuple[Any, ...]]:
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=WAIT_S * 1000)
    try:
        consumer.assign([KPTopicPartition(topic, 0)])
        out = []
        for record in consumer:
            out.append((record.offset, record.key, record.value, record.timestamp))
            if len(out) == n:
                break
        return out
    finally:
        consumer.close()


def read_with_librdkafka(kafka_bootstrap: str, topic: str, n: int) -> list[tuple[Any, ...]]:
    consumer = CKConsumer({"bootstrap.servers": kafka_bootstrap, "enable.auto.commit": False,
                           "group.id": f"unused-{uuid.uuid4().hex[:6]}"})
    try:
        consumer.assign([CKTopicPartition(topic, 0, 0)])
        out: list[tuple[Any, ...]] = []
        deadline = time.monotonic() + WAIT_S
        while len(out) < n and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            out.append((message.offset(), message.key(), message.value(),
                        message.timestamp()[1]))
        return out
    finally:
        consumer.close()


def read_with_fjord(bootstrap: str, topic: str, n: int) -> list[tuple[Any, ...]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, 0)])
        out: list[tuple[Any, ...]] = []
        deadline = time.monotonic() + WAIT_S
        while len(out) < n and time.monotonic() < deadline:
            out += [(r.offset, r.key, r.value, r.timestamp) for r in consumer.poll(0.5)]
        return out
    finally:
        consumer.close()


def test_topic_codec_rewrites_batches_and_every_client_reads_them(
    bootstrap: str, kafka_bootstrap: str, local_cluster: Any
) -> None:
    topic = f"codec-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 1, 2, {"compression.type": "zstd"})])
    sent: list[tuple[bytes, bytes, int]] = []

    def record(i: int) -> tuple[bytes, bytes, int]:
        # The first batch, 5 random 3 KiB values, is larger than RECOMPRESS_INLINE_MAX_BYTES:
        # the leader rewrites it in a worker thread.
        value = os.urandom(3072) if i < 5 else f"value {i} ".encode() * 20
        item = (f"k{i}".encode(), value, 1_700_000_000_000 + i)
        sent.append(item)
        return item

    # Batch 1: fjord.client, uncompressed; batch 2: kafka-python, gzip (idempotent);
    # batch 3: librdkafka, lz4. Each client's five records are one batch because its linger
    # (LINGER_MS) outlasts any stall of this process and flush() sends at once: with 50 ms, a
    # loaded machine's pause between two sends split a client's records into two batches
    # (4 batches, never 3).
    with Producer({"bootstrap.servers": bootstrap, "acks": "all",
                   "linger.ms": LINGER_MS}) as producer:
        for i in range(5):
            key, value, ts = record(i)
            producer.send(topic, value, key=key, partition=0, timestamp_ms=ts)
        producer.flush(WAIT_S)
    kp = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=LINGER_MS,
                       enable_idempotence=True, compression_type="gzip")
    for i in range(5, 10):
        key, value, ts = record(i)
        kp.send(topic, key=key, value=value, partition=0, timestamp_ms=ts)
    kp.flush(WAIT_S)
    kp.close()
    ck = CKProducer({"bootstrap.servers": kafka_bootstrap, "acks": "all", "linger.ms": LINGER_MS,
                     "compression.type": "lz4"})
    for i in range(10, 15):
        key, value, ts = record(i)
        ck.produce(topic, key=key, value=value, partition=0, timestamp=ts)
    assert ck.flush(WAIT_S) == 0

    codecs = all_replicas_hold(local_cluster.data_dir, topic, 3)
    assert all(c == [Compression.ZSTD] * 3 for c in codecs.values()), codecs
    expected = [(i, k, v, ts) for i, (k, v, ts) in enumerate(sent)]
    assert read_with_fjord(bootstrap, topic, 15) == expected
    assert read_with_kafka_python(kafka_bootstrap, topic, 15) == expected
    assert read_with_librdkafka(kafka_bootstrap, topic, 15) == expected

    # `producer` keeps the client's codec; `uncompressed` stores none; each on the next produce.
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        for setting, expected_codec in (("producer", Compression.GZIP),
                                        ("uncompressed", Compression.NONE)):
            admin.alter_configs({topic: {"compression.type": setting}})

            def produced_in(codec: Compression, setting: str = setting) -> Compression | None:
                with Producer({"bootstrap.servers": bootstrap, "acks": "all",
                               "compression.type": "gzip"}) as p:
                    key, value, ts = record(len(sent))
                    p.send(topic, value, key=key, partition=0, timestamp_ms=ts).result(WAIT_S)
                last = stored_codecs(local_cluster.data_dir, topic)
                newest = [c[-1] for c in last.values() if len(c) == len(sent) - 12]
                # The broker learns the change from etcd a moment after the controller wrote
                # it: a produce before that is stored as the old setting said.
                return codec if newest and all(c == codec for c in newest) else None

            wait_for(lambda c=expected_codec: produced_in(c),  # type: ignore[misc]
                     f"a gzip batch stored as {expected_codec.name} after {setting}", WAIT_S,
                     accept=is_value)
    expected = [(i, k, v, ts) for i, (k, v, ts) in enumerate(sent)]
    assert read_with_librdkafka(kafka_bootstrap, topic, len(sent)) == expected
    assert read_with_kafka_python(kafka_bootstrap, topic, len(sent)) == expected
