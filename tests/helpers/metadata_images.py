"""Metadata images built by hand for the controller's pure cores (planner, elections,
reassignments, limits): one cluster ``c`` with registered brokers, topics and partition states."""

from __future__ import annotations

from typing import Any

from fjord.metadata import (
    BrokerRegistration,
    Keys,
    MetadataEvent,
    MetadataImage,
    PartitionState,
    TopicRecord,
)

K = Keys("c")


def image_with(brokers: dict[int, str | None], *extra: MetadataEvent) -> MetadataImage:
    events = [
        MetadataEvent.put(K.broker(b), BrokerRegistration(b, "h", b, rack).to_json(), 1, 1)
        for b, rack in brokers.items()
    ]
    return MetadataImage.empty("c").apply([*events, *extra])


def with_plan(image: MetadataImage, plan: Any) -> MetadataImage:
    """``image`` with a CreateTopics/CreatePartitions plan's records applied."""
    rev = image.revision + 1
    events = [MetadataEvent.put(K.topic(plan.name), plan.record.to_json(), rev, rev)]
    events += [
        MetadataEvent.put(K.partition(plan.name, p), s.to_json(), rev, rev)
        for p, s in plan.partitions.items()
    ]
    return image.apply(events)


def image_of(live: list[int], partitions: dict[tuple[str, int], PartitionState]) -> MetadataImage:
    events = [
        MetadataEvent.put(K.broker(b), BrokerRegistration(b, "h", b, None).to_json(), 1, 1)
        for b in live
    ]
    for topic in sorted({t for t, _ in partitions}):
        count = sum(1 for t, _ in partitions if t == topic)
        rf = len(partitions[(topic, 0)].replicas)
        record = TopicRecord(f"id-{topic}", count, rf, {})
        events.append(MetadataEvent.put(K.topic(topic), record.to_json(), 2, 2))
    events += [
        MetadataEvent.put(K.partition(t, p), s.to_json(), 3, 3) for (t, p), s in partitions.items()
    ]
    return MetadataImage.empty("c").apply(events)


def state(
    replicas: list[int], isr: list[int], leader: int, le: int = 4, pe: int = 9
) -> PartitionState:
    return PartitionState(tuple(replicas), tuple(isr), leader, le, pe)
