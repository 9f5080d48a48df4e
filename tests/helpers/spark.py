"""What the Spark test modules share besides fixtures (those are tests/spark/conftest.py's): the
bound of their waits and a producer of numbered records."""

from __future__ import annotations

from typing import Any

from fjord.client import Producer, RecordMetadata

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
