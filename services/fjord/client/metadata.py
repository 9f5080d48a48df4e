"""The client's view of the cluster (brokers, partition leaders, active controller): pure.

Built from a broker's Metadata response; the shell (``fjord.client.network``) fetches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fjord._proto import broker_pb2
from fjord.client.types import Node, PartitionInfo, TopicDescription, TopicPartition
from fjord.direct_client import door_address
from fjord.errors import ErrorCode, FjordError, error_code_from_number, error_for_code


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """One Metadata answer.

    Invariants: ``topics`` holds only topics the broker answered without error, each with its
    partitions sorted by number; ``topic_errors`` holds the others (e.g. unknown topics);
    ``leaders`` maps every partition with a live leader to that leader's broker id;
    ``direct_doors`` maps the gRPC address of every broker that opens a direct door
    (fjord.direct_frames) to the door's ``host:port``.
    """

    cluster_id: str
    brokers: dict[int, Node]
    controller: Node | None
    topics: dict[str, TopicDescription]
    topic_errors: dict[str, tuple[ErrorCode, str]]
    version: int
    leaders: dict[TopicPartition, int] = field(default_factory=dict)
    direct_doors: dict[str, str] = field(default_factory=dict)

    def partition_count(self, topic: str) -> int | None:
        description = self.topics.get(topic)
        return len(description.partitions) if description else None

    def leader_of(self, tp: TopicPartition) -> Node | None:
        leader = self.leaders.get(tp)
        return self.brokers.get(leader) if leader is not None else None

    def leader_epoch_of(self, tp: TopicPartition) -> int:
        description = self.topics.get(tp.topic)
        if description is None or not 0 <= tp.partition < len(description.partitions):
            return -1
        return description.partitions[tp.partition].leader_epoch


EMPTY_SNAPSHOT = ClusterSnapshot("", {}, None, {}, {}, -1)


def snapshot_from_response(response: broker_pb2.MetadataResponse) -> ClusterSnapshot:
    """Translate a Metadata response (merging nothing: the caller replaces or merges)."""
    brokers = {b.id: Node(b.id, b.host, b.port, b.rack) for b in response.brokers}
    direct_doors = {
        brokers[b.id].address: door
        for b in response.brokers
        if (door := door_address(b.direct_host, b.direct_port)) is not None
    }
    controller = None
    if response.HasField("controller") and response.controller.port:
        c = response.controller
        controller = Node(c.id, c.host, c.port)
    topics: dict[str, TopicDescription] = {}
    errors: dict[str, tuple[ErrorCode, str]] = {}
    leaders: dict[TopicPartition, int] = {}
    for t in response.topics:
        code = error_code_from_number(t.error.code) if t.HasField("error") else ErrorCode.NONE
        if code is not ErrorCode.NONE:
            errors[t.name] = (code, t.error.message)
            continue
        partitions = tuple(
            sorted(
                (
                    PartitionInfo(
                        p.partition,
                        p.leader,
                        p.leader_epoch,
                        tuple(p.replicas),
                        tuple(p.isr),
                        tuple(p.offline_replicas),
                    )
                    for p in t.partitions
                ),
                key=lambda p: p.partition,
            )
        )
        topics[t.name] = TopicDescription(t.name, t.topic_id, partitions, t.internal)
        for p in partitions:
            if p.leader >= 0 and p.leader in brokers:
                leaders[TopicPartition(t.name, p.partition)] = p.leader
    return ClusterSnapshot(
        response.cluster_id, brokers, controller, topics, errors, response.metadata_version,
        leaders, direct_doors,
    )


def merge_snapshots(
    old: ClusterSnapshot, new: ClusterSnapshot, replace_all: bool
) -> ClusterSnapshot:
    """``new`` answered for some topics only (unless ``replace_all``): keep ``old``'s other
    topics, but take brokers (and their direct doors) and controller from ``new`` and drop
    leaders that left."""
    if replace_all:
        return new
    topics = {**old.topics, **new.topics}
    for name in new.topic_errors:
        topics.pop(name, None)
    errors = {k: v for k, v in old.topic_errors.items() if k not in new.topics}
    errors.update(new.topic_errors)
    leaders = {
        tp: leader
        for tp, leader in old.leaders.items()
        if tp.topic not in new.topics and tp.topic not in new.topic_errors and leader in new.brokers
    }
    leaders.update(new.leaders)
    return ClusterSnapshot(
        new.cluster_id, new.brokers, new.controller, topics, errors, new.version, leaders,
        new.direct_doors,
    )


def topic_error(topic: str, code: ErrorCode, message: str = "") -> FjordError:
    """The typed error for a topic-level error code, its message naming the topic once."""
    if not message:
        message = f"topic {topic!r}: {code.name}"
    elif topic not in message:
        message = f"topic {topic!r}: {message}"
    return error_for_code(code, message)
