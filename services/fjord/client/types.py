"""The small value types of Fjord's client API (Kafka's names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fjord.topic_partition import TopicPartition

__all__ = ["TopicPartition"]  # re-exported: the client's public name for the shared type

Headers = tuple[tuple[str, bytes | None], ...]


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed. ``offset`` is -1 with ``acks=0`` (nothing is known);
    ``timestamp`` is the broker's append time when the topic uses LogAppendTime."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class ConsumerRecord(NamedTuple):
    """A record as :meth:`Consumer.poll` returns it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp: int

    def trace_context(self) -> Any:
        """The OpenTelemetry context of the span the record was produced in, from its
        ``traceparent`` header (an empty context when it has none or a malformed one): pass
        it as ``context=`` of the consumer's span to continue the producer's trace."""
        from fjord.observability.tracing import extract_from_record_headers

        return extract_from_record_headers(self.headers)


class OffsetAndMetadata(NamedTuple):
    """A committed offset (Kafka's name): the next offset to consume, the committer's metadata
    string, and the leader epoch of the record before it (None when unknown)."""

    offset: int
    metadata: str = ""
    leader_epoch: int | None = None


class ConsumerGroupMetadata(NamedTuple):
    """A group member's identity for ``send_offsets_to_transaction`` (confluent-kafka's
    ``consumer_group_metadata()``): the coordinator checks the generation as for a commit."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


class OffsetAndTimestamp(NamedTuple):
    """Answer of ``offsets_for_times``: the first offset whose timestamp is >= the one asked."""

    offset: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class Node:
    """A broker or controller endpoint."""

    id: int
    host: str
    port: int
    rack: str = ""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition as the cluster metadata describes it (leader -1: no leader now)."""

    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """A topic with its partitions, sorted by partition number."""

    name: str
    topic_id: str
    partitions: tuple[PartitionInfo, ...]
    internal: bool = False


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create. -1 means the cluster default (num.partitions /
    default.replication.factor)."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    config: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One configuration value and where it comes from: TOPIC, CLUSTER_DEFAULT, DEFAULT for a
    topic; CLUSTER_DEFAULT, STATIC_BROKER (its ``--config``), DEFAULT for a broker."""

    name: str
    value: str
    is_default: bool
    source: str


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    """The cluster as the active controller describes it (``coordinators``: the live group
    coordinators)."""

    cluster_id: str
    controller: Node | None
    brokers: tuple[Node, ...]
    controllers: tuple[Node, ...] = ()
    coordinators: tuple[Node, ...] = ()


@dataclass(frozen=True, slots=True)
class ScrubStatus:
    """A broker's scrubber (docs/storage.md, "Scrubbing"): the pass under way and how far it
    got, damage found and repairs done since the broker started."""

    enabled: bool
    pass_number: int
    passes_completed: int
    verified_segments: int
    total_segments: int
    verified_bytes: int
    total_bytes: int
    damage_found: int
    repairs_done: int
    io_max_bytes_per_second: int

    @property
    def progress(self) -> float:
        return 1.0 if self.total_bytes == 0 else self.verified_bytes / self.total_bytes


@dataclass(frozen=True, slots=True)
class LogDirPartition:
    """One partition replica in a broker's data directory. ``damaged_offset`` -1: no known
    damage; ``repair_until_offset`` -1: no repair under way."""

    topic: str
    partition: int
    size_bytes: int
    log_start_offset: int
    log_end_offset: int
    leader: bool
    damaged_offset: int = -1
    damage: str = ""
    repair_until_offset: int = -1
    compacted: bool = False
    cleaner_dirty_ratio: float = 0.0
    """Of a compacted replica: dirty bytes / cleanable bytes at the cleaner's last look."""
    cleaner_first_dirty_offset: int = 0
    """Of a compacted replica: the cleaner checkpoint (offsets below it are compacted)."""


@dataclass(frozen=True, slots=True)
class LogDirDescription:
    """A broker's data directory (Kafka's DescribeLogDirs plus the scrubber)."""

    broker_id: int
    log_dir: str
    writable: bool
    unwritable_reason: str
    scrub: ScrubStatus
    partitions: tuple[LogDirPartition, ...]
