"""An acks=all producer load that counts every broker answer, and a read-back of a topic:
what the rolling-restart proofs (issue 19's roll, issue 16's certificate rotation) check
"not one NOT_ENOUGH_REPLICAS, every acknowledged record read back" with."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Mapping

from fjord.client import Consumer, Producer, TopicPartition
from fjord.errors import FjordError
from fjord.testing.waiting import wait_for

TOPIC = "rolling"
PARTITIONS = 10
#: The refusals a safe roll must never cause.
REFUSALS = ("NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND")


class AcksAllLoad:
    """A thread producing acks=all to ``topic`` without client retries (``retries=0``, no
    idempotence), so each answer is counted: ``acked`` values, ``errors`` by code name; a
    failed record is sent again. ``crashed``: what ended the thread, if anything."""

    def __init__(
        self,
        bootstrap: str,
        client_config: Mapping[str, object] | None = None,
        *,
        topic: str = TOPIC,
    ) -> None:
        self.topic = topic
        self.producer = Producer({
            **(client_config or {}),  # a secure cluster's security.protocol and ssl.*
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "retries": 0,
            "enable.idempotence": False,
            "linger.ms": 2,
            "request.timeout.ms": 10_000,
            "delivery.timeout.ms": 15_000,
        })
        self.acked: set[bytes] = set()
        self.errors: Counter[str] = Counter()
        self.crashed: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="acks-all-load", daemon=True)
        self._next = 0

    def _run(self) -> None:
        try:
            self._produce()
        except BaseException as exc:  # seen by the test, not only in a thread warning
            self.crashed = exc
            raise

    def _produce(self) -> None:
        retry: list[bytes] = []
        while not self._stop.is_set():
            values = retry + [f"r{self._next + i}".encode() for i in range(20 - len(retry))]
            self._next += 20 - len(retry)
            retry = []
            futures = [(v, self.producer.send(self.topic, value=v, key=v)) for v in values]
            for value, future in futures:
                try:
                    future.result(timeout=30)
                    self.acked.add(value)
                except FjordError as exc:
                    self.errors[exc.code.name] += 1
                    retry.append(value)
            if retry:
                time.sleep(0.05)  # a leader moved: give the metadata a moment

    def start(self) -> None:
        self._thread.start()

    def wait_acked(self, count: int, timeout: float = 60) -> None:
        """Until ``count`` records more than now are acknowledged (the thread still runs)."""
        target = len(self.acked) + count
        wait_for(lambda: len(self.acked) >= target or self.crashed is not None,
                 f"{count} more records acknowledged", timeout)
        assert self.crashed is None, self.crashed

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self.producer.close()


def read_values(
    bootstrap: str,
    client_config: Mapping[str, object] | None = None,
    *,
    topic: str = TOPIC,
    partitions: int = PARTITIONS,
    timeout: float = 60,
) -> set[bytes]:
    """Every value of ``topic`` (partitions 0..partitions-1) up to its current end."""
    config = {**(client_config or {}), "bootstrap.servers": bootstrap,
              "auto.offset.reset": "earliest"}
    with Consumer(config) as consumer:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        end = consumer.end_offsets(tps)
        values: set[bytes] = set()

        def read_to_end() -> bool:
            if all(consumer.position(tp) >= end[tp] for tp in tps):
                return True
            values.update(r.value for r in consumer.poll(timeout=1.0) if r.value is not None)
            return False

        wait_for(read_to_end, f"{topic} read to its end", timeout, interval=0)
        return values
