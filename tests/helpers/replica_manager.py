"""A ReplicaManager over real partition logs in a temp dir, driven by metadata images built by
hand: the requests, images and answers the broker's unit tests (and the chaos regressions that
replay a finding at that level) share."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from fjord._proto import broker_pb2
from fjord.broker.replica_manager import ReplicaManager
from fjord.metadata import (
    BrokerRegistration,
    Keys,
    MetadataEvent,
    MetadataImage,
    PartitionState,
    TopicRecord,
)
from fjord.records import BatchBuilder
from fjord.storage import LogManager
from fjord.testing.waiting import wait_for_async

T = TypeVar("T")
BROKER = 1


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await asyncio.wait_for(coro, 20)

    return asyncio.run(main())


def batch(n: int = 1, ts: int = 1_000, value: bytes = b"v") -> bytes:
    builder = BatchBuilder(batch_size=1 << 30)
    for i in range(n):
        builder.append(ts + i, None, value)
    return builder.build()


class Cluster:
    """Builds successive metadata images for a one-cluster test."""

    def __init__(self) -> None:
        self.keys = Keys("c")
        self.revision = 0
        self.image = MetadataImage.empty("c")
        self.change([(self.keys.broker(BROKER), BrokerRegistration(BROKER, "h", 1).to_json())])

    def change(self, puts: list[tuple[str, bytes]], deletes: tuple[str, ...] = ()) -> MetadataImage:
        events = []
        for key, value in puts:
            self.revision += 1
            events.append(MetadataEvent.put(key, value, self.revision, self.revision))
        for key in deletes:
            self.revision += 1
            events.append(MetadataEvent.delete(key, self.revision))
        self.image = self.image.apply(events)
        return self.image

    def topic(
        self,
        name: str,
        states: list[PartitionState],
        config: dict[str, str] | None = None,
    ) -> MetadataImage:
        puts = [
            (
                self.keys.topic(name),
                TopicRecord("0" * 32, len(states), len(states[0].replicas), config or {}).to_json(),
            )
        ]
        puts += [(self.keys.partition(name, i), s.to_json()) for i, s in enumerate(states)]
        return self.change(puts)


def leader_state(
    replicas: tuple[int, ...] = (BROKER,),
    isr: tuple[int, ...] | None = None,
    leader: int = BROKER,
    epoch: int = 0,
) -> PartitionState:
    return PartitionState(replicas, isr if isr is not None else replicas, leader, epoch, epoch)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[ReplicaManager, Cluster, LogManager]]:
    logs = LogManager(tmp_path / "data")
    manager = ReplicaManager(BROKER, logs)
    yield manager, Cluster(), logs
    logs.close()


def produce_request(
    topic: str,
    partition: int,
    records: bytes,
    acks: int = 1,
    timeout_ms: int = 5000,
    coordinator_epoch: int = 0,
) -> broker_pb2.ProduceRequest:
    return broker_pb2.ProduceRequest(
        acks=acks,
        timeout_ms=timeout_ms,
        topics=[
            broker_pb2.ProduceTopic(
                name=topic,
                partitions=[
                    broker_pb2.ProducePartition(
                        partition=partition, records=records, coordinator_epoch=coordinator_epoch
                    )
                ],
            )
        ],
    )


def fetch_request(
    topic: str,
    partition: int,
    offset: int,
    *,
    max_wait_ms: int = 0,
    min_bytes: int = 0,
    replica_id: int = -1,
    epoch: int = -1,
    partition_max_bytes: int = 1 << 20,
) -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(
        replica_id=replica_id,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=1 << 20,
        topics=[
            broker_pb2.FetchTopic(
                name=topic,
                partitions=[
                    broker_pb2.FetchPartition(
                        partition=partition,
                        fetch_offset=offset,
                        partition_max_bytes=partition_max_bytes,
                        current_leader_epoch=epoch,
                    )
                ],
            )
        ],
    )


def one_produce(response: broker_pb2.ProduceResponse) -> broker_pb2.ProducePartitionResponse:
    return response.topics[0].partitions[0]


def one_fetch(response: broker_pb2.FetchResponse) -> broker_pb2.FetchPartitionResponse:
    return response.topics[0].partitions[0]


Env = tuple[ReplicaManager, Cluster, LogManager]


PARK_WAIT_S = 5.0
"""Bound of waiting for a request to park (it takes a few event-loop turns, never seconds)."""


async def until_parked(manager: ReplicaManager, fetches: int = 0, produces: int = 0) -> None:
    """Wait until exactly ``fetches`` fetches and ``produces`` produces wait in the manager's
    purgatories (parked and not completed): the condition a test needs before it acts on a
    waiting request, instead of sleeping for it."""

    async def parked() -> tuple[int, int]:
        return manager.parked()

    await wait_for_async(
        parked,
        f"{fetches} fetches and {produces} produces parked",
        PARK_WAIT_S,
        interval=0.001,
        accept=lambda now: now == (fetches, produces),
    )


class Clock:
    """An injected millisecond clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now
