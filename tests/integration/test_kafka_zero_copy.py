"""Zero copy on the Kafka listener (fjord.kafka.zerocopy): Fetch answers whose records go from
the segment files to the socket with sendfile are read correctly by confluent-kafka and
kafka-python: several partitions per answer, values from a few bytes to 300 KiB, fetch limits
smaller than a batch (the first batch whole, others only as whole batches), the bytes
counted in fjord_kafka_sendfile_bytes_total, none in fjord_kafka_fetch_record_bytes_total's
copied path."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import TopicPartition as CKTopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KPTopicPartition

from fjord.client import AdminClient, NewTopic, Producer
from fjord.testing.metrics_probe import scrape_metric
from fjord.testing.waiting import wait_for

pytestmark = pytest.mark.integration

WAIT_S = 60.0
PARTITIONS = 3
SENDFILE_METRIC = "fjord_kafka_sendfile_bytes_total"
COPIED_METRIC = 'fjord_kafka_fetch_record_bytes_total{path="copied"}'


@pytest.fixture(scope="module")
def written(bootstrap: str) -> tuple[str, dict[int, list[bytes]]]:
    """A topic of 3 partitions, each with values of every size class, in batches of several."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "default.api.timeout.ms": 20000})
    topic = f"zc-{uuid.uuid4().hex[:8]}"
    try:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1, {})])
    finally:
        admin.close()
    sent: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20,
                         "batch.size": 65536, "max.request.size": 4 << 20})
    try:
        for i in range(120):
            partition = i % PARTITIONS
            size = (10, 100, 5_000, 70_000, 300_000)[i % 5]
            value = i.to_bytes(4, "big") + os.urandom(size)
            producer.send(topic, value=value, partition=partition)
            sent[partition].append(value)
        producer.flush()
    finally:
        producer.close()
    return topic, sent


def sendfile_bytes(local_cluster: Any, metric: str = SENDFILE_METRIC) -> float:
    return sum(scrape_metric(local_cluster.metrics_address("broker", b), metric)
               for b in local_cluster.broker_addresses)


@pytest.mark.parametrize("limits", [(1 << 20, 50 << 20), (40_000, 100_000)])
def test_confluent_kafka_reads_every_record(
    local_cluster: Any, kafka_bootstrap: str, written: tuple[str, dict[int, list[bytes]]],
    limits: tuple[int, int],
) -> None:
    topic, sent = written
    before = sendfile_bytes(local_cluster)
    copied_before = sendfile_bytes(local_cluster, COPIED_METRIC)
    partition_max, total_max = limits
    consumer = CKConsumer({"bootstrap.servers": kafka_bootstrap, "group.id": "unused",
                           "enable.auto.commit": False, "max.partition.fetch.bytes": partition_max,
                           "fetch.max.bytes": total_max, "fetch.queue.backoff.ms": 10,
                           # librdkafka wants fetch.max.bytes >= message.max.bytes
                           "message.max.bytes": min(total_max, 1_000_000)})
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    total = sum(len(v) for v in sent.values())
    try:
        consumer.assign([CKTopicPartition(topic, p, 0) for p in range(PARTITIONS)])

        def read_all() -> bool:
            for message in consumer.consume(100, 0.5):
                assert message.error() is None, message.error()
                got[message.partition()].append(message.value())
            return sum(len(v) for v in got.values()) >= total

        wait_for(read_all, "every record read by confluent-kafka", WAIT_S)
    finally:
        consumer.close()
    assert got == sent
    assert sendfile_bytes(local_cluster) - before >= sum(len(v) for vs in sent.values() for v in vs)
    # Segments written by this broker process: no record byte went through Python.
    assert sendfile_bytes(local_cluster, COPIED_METRIC) == copied_before


def test_kafka_python_reads_every_record(
    local_cluster: Any, kafka_bootstrap: str, written: tuple[str, dict[int, list[bytes]]]
) -> None:
    topic, sent = written
    before = sendfile_bytes(local_cluster)
    copied_before = sendfile_bytes(local_cluster, COPIED_METRIC)
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", max_partition_fetch_bytes=50_000,
                             fetch_max_bytes=120_000)
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    total = sum(len(v) for v in sent.values())
    try:
        consumer.assign([KPTopicPartition(topic, p) for p in range(PARTITIONS)])

        def read_all() -> bool:
            for tp, records in consumer.poll(timeout_ms=500).items():
                got[tp.partition].extend(r.value for r in records)
            return sum(len(v) for v in got.values()) >= total

        wait_for(read_all, "every record read by kafka-python", WAIT_S)
    finally:
        consumer.close()
    assert got == sent
    assert sendfile_bytes(local_cluster) - before > 0
    assert sendfile_bytes(local_cluster, COPIED_METRIC) == copied_before
