"""Kafka's ConsumerProtocol: the bytes a consumer puts in JoinGroup (Subscription, the member's
protocol metadata) and the leader puts in SyncGroup (Assignment), byte for byte as Kafka's
``ConsumerProtocolSubscription``/``ConsumerProtocolAssignment`` schemas, so the coordinator stores
and forwards them without caring, and tools that read ``__consumer_offsets`` understand them.

Subscription (version int16 first, then by version)::

    v0  topics: [string]  user_data: nullable bytes
    v1  + owned_partitions: [topic: string, partitions: [int32]]
    v2  + generation_id: int32 (-1 = unknown)
    v3  + rack_id: nullable string

Assignment::

    v0  assigned_partitions: [topic: string, partitions: [int32]]  user_data: nullable bytes
    v1  same fields (v1 only marks that the member may report an error; unused here)

Newer versions than we know are read as the highest known version with the trailing bytes
ignored, as Kafka does (its schemas are forward compatible by appending fields).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fjord.errors import CorruptRecordError
from fjord.groups.wire import Reader, Writer
from fjord.topic_partition import TopicPartition

SUBSCRIPTION_VERSION = 2
ASSIGNMENT_VERSION = 1
_MAX_SUBSCRIPTION_VERSION = 3
_MAX_ASSIGNMENT_VERSION = 1

NO_GENERATION = -1


@dataclass(frozen=True)
class Subscription:
    """A consumer's JoinGroup metadata. ``owned_partitions`` are what it consumes now (needed by
    the sticky assignors); ``generation_id`` is the generation those were assigned in."""

    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: tuple[TopicPartition, ...] = ()
    generation_id: int = NO_GENERATION
    rack_id: str | None = None


@dataclass(frozen=True)
class Assignment:
    """What the leader assigns to one member in SyncGroup."""

    partitions: tuple[TopicPartition, ...] = ()
    user_data: bytes | None = None


def _write_partitions(writer: Writer, partitions: Iterable[TopicPartition]) -> None:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    writer.int32(len(by_topic))
    for topic in sorted(by_topic):
        writer.string(topic)
        numbers = sorted(by_topic[topic])
        writer.int32(len(numbers))
        for number in numbers:
            writer.int32(number)


def _read_partitions(reader: Reader) -> tuple[TopicPartition, ...]:
    out: list[TopicPartition] = []
    for _ in range(reader.array_length()):
        topic = reader.string()
        for _ in range(reader.array_length()):
            out.append(TopicPartition(topic, reader.int32()))
    return tuple(out)


def encode_subscription(sub: Subscription, version: int = SUBSCRIPTION_VERSION) -> bytes:
    """Kafka's Subscription bytes at ``version`` (0..3); fields a version lacks are dropped."""
    if not 0 <= version <= _MAX_SUBSCRIPTION_VERSION:
        raise ValueError(f"unknown Subscription version {version}")
    writer = Writer().int16(version)
    writer.int32(len(sub.topics))
    for topic in sub.topics:
        writer.string(topic)
    writer.bytes_(sub.user_data)
    if version >= 1:
        _write_partitions(writer, sub.owned_partitions)
    if version >= 2:
        writer.int32(sub.generation_id)
    if version >= 3:
        writer.string(sub.rack_id)
    return writer.bytes()


def decode_subscription(data: bytes) -> Subscription:
    """Parse Subscription bytes of any version; CorruptRecordError on malformed input."""
    reader = Reader(data, "consumer protocol subscription")
    version = reader.int16()
    if version < 0:
        raise CorruptRecordError(f"consumer protocol subscription: bad version {version}")
    topics = tuple(reader.string() for _ in range(reader.array_length()))
    user_data = reader.nullable_bytes()
    owned: tuple[TopicPartition, ...] = ()
    generation = NO_GENERATION
    rack: str | None = None
    if version >= 1:
        owned = _read_partitions(reader)
    if version >= 2:
        generation = reader.int32()
    if version >= 3:
        rack = reader.nullable_string()
    if version <= _MAX_SUBSCRIPTION_VERSION and not reader.done():
        raise CorruptRecordError(
            f"consumer protocol subscription v{version}: {reader.remaining()} trailing bytes"
        )
    return Subscription(topics, user_data, owned, generation, rack)


def encode_assignment(assignment: Assignment, version: int = ASSIGNMENT_VERSION) -> bytes:
    """Kafka's Assignment bytes (v0 or v1: same fields)."""
    if not 0 <= version <= _MAX_ASSIGNMENT_VERSION:
        raise ValueError(f"unknown Assignment version {version}")
    writer = Writer().int16(version)
    _write_partitions(writer, assignment.partitions)
    writer.bytes_(assignment.user_data)
    return writer.bytes()


def decode_assignment(data: bytes) -> Assignment:
    """Parse Assignment bytes; empty bytes (a member the leader left out) mean no partitions."""
    if not data:
        return Assignment()
    reader = Reader(data, "consumer protocol assignment")
    version = reader.int16()
    if version < 0:
        raise CorruptRecordError(f"consumer protocol assignment: bad version {version}")
    partitions = _read_partitions(reader)
    user_data = reader.nullable_bytes()
    if version <= _MAX_ASSIGNMENT_VERSION and not reader.done():
        raise CorruptRecordError(
            f"consumer protocol assignment v{version}: {reader.remaining()} trailing bytes"
        )
    return Assignment(partitions, user_data)
