"""What the Spark test modules share besides fixtures (those are tests/spark/conftest.py's): the
bound of their waits, a producer of numbered records, and the orders -> shipments job's input
(orders keyed by order id) and read-back (a topic to its end)."""

from __future__ import annotations

import json
from typing import Any

from fjord.client import Consumer, ConsumerRecord, Producer, RecordMetadata, TopicPartition
from fjord.testing.waiting import wait_for

#: Bound of every wait in the Spark tests (streaming progress, retention).
SPARK_WAIT_S = 180.0


def produce(
    bootstrap: str,
    topic: str,
    count: int,
    start: int = 0,
    partition: int | None = None,
    **config: Any,
) -> list[RecordMetadata]:
    """Send ``count`` keyed records (key ``k<i>``, value ``v<i>``, header ``i``) and return
    where each landed, in send order."""
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, **config}) as producer:
        futures = [
            producer.send(
                topic,
                value=f"v{i}".encode(),
                key=f"k{i}".encode(),
                partition=partition,
                headers=[("i", str(i).encode())],
            )
            for i in range(start, start + count)
        ]
        producer.flush()
        return [f.result(30) for f in futures]


def send_orders(
    bootstrap: str,
    topic: str,
    values: list[tuple[str, str]],
    partition: int | None = None,
    **config: Any,
) -> None:
    """Produce (key, value) records, as the order service would (keyed by order id; to
    ``partition`` when given; ``config`` adds producer properties, e.g. security)."""
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, **config}) as producer:
        futures = [
            producer.send(topic, value=value, key=key, partition=partition) for key, value in values
        ]
        producer.flush()
        for future in futures:
            future.result(30)


def order(order_id: str, sku: str, qty: int = 1) -> tuple[str, str]:
    body = {"order_id": order_id, "user_id": f"user-{order_id}", "sku": sku, "qty": qty}
    return order_id, json.dumps(body)


def read_all(bootstrap: str, topic: str, **config: Any) -> list[ConsumerRecord]:
    """Every record of ``topic`` up to its current end (read with the Fjord consumer, which is
    cheaper than a Spark job; ``config`` adds consumer properties, e.g. isolation.level: under
    read_committed the end is the last stable offset)."""
    settings = {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest", **config}
    with Consumer(settings) as consumer:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(tps)
        end = consumer.end_offsets(tps)
        records: list[ConsumerRecord] = []

        def read_to_end() -> bool:
            if all(consumer.position(tp) >= end[tp] for tp in tps):
                return True
            records.extend(consumer.poll(timeout=1.0))
            return False

        wait_for(read_to_end, f"{topic} read to its end", SPARK_WAIT_S, interval=0)
        return records
