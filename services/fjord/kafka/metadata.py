"""Kafka's Metadata answer from a metadata image, shared by the brokers' and the group
coordinators' Kafka listeners.

Nodes are named by their Kafka listener: every broker that has one, and every group coordinator
that has one under its own node id (:func:`coordinator_node_id`). Coordinators are listed
because clients keep only nodes the cluster metadata names: librdkafka drops (decommissions) a
node learned from FindCoordinator as soon as a Metadata answer leaves it out. They lead no
partition, so clients send them only group requests and cluster-wide reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kafka.protocol.metadata.metadata import MetadataResponse

from fjord._proto import broker_pb2
from fjord.errors import ErrorCode
from fjord.kafka.codec import topic_uuid
from fjord.kafka.defaults import COORDINATOR_NODE_ID_BASE
from fjord.kafka.dispatch import RequestContext
from fjord.metadata import MetadataImage
from fjord.security.acls import Caller

LISTENER_NOT_FOUND = ErrorCode.LISTENER_NOT_FOUND.code


def coordinator_node_id(coordinator_id: int) -> int:
    """The Kafka node id of group coordinator ``coordinator_id`` (never a broker's id)."""
    return COORDINATOR_NODE_ID_BASE + coordinator_id


def kafka_nodes(image: MetadataImage) -> list[tuple[int, str, int, str | None]]:
    """(node id, host, port, rack) of every broker and coordinator with a Kafka listener, by
    node id."""
    nodes = [
        (b.id, b.kafka_host, b.kafka_port, b.rack)
        for b in image.brokers.values()
        if b.kafka_host is not None and b.kafka_port is not None
    ]
    nodes += [
        (coordinator_node_id(c.id), c.kafka_host, c.kafka_port, None)
        for c in image.coordinators.values()
        if c.kafka_host is not None and c.kafka_port is not None
    ]
    return sorted(nodes)


class KafkaMetadata:
    """Answers Kafka's Metadata request from ``respond`` (the gRPC door's Metadata core over
    the newest image) at any version.

    ``controller_id`` answers the node Kafka clients send CreateTopics & co. to: a Fjord
    controller speaks only gRPC, so a broker names itself (it forwards them, as KRaft brokers
    do) and a coordinator names the lowest-id broker with a Kafka listener.
    """

    def __init__(
        self,
        image: Callable[[], MetadataImage],
        respond: Callable[[broker_pb2.MetadataRequest, Caller], broker_pb2.MetadataResponse],
        controller_id: Callable[[MetadataImage], int],
    ) -> None:
        self._image = image
        self._respond = respond
        self._controller_id = controller_id

    async def metadata(self, request: Any, ctx: RequestContext) -> Any:
        version = ctx.api_version
        names = request.topics
        if names is None or (version == 0 and not names):  # v0: empty list means all
            pb = self._respond(broker_pb2.MetadataRequest(all_topics=True), ctx.caller)
        else:
            pb = self._respond(
                broker_pb2.MetadataRequest(topics=[t.name for t in names if t.name is not None]),
                ctx.caller,
            )
        image = self._image()
        kafka_brokers = {
            b.id for b in image.brokers.values() if b.kafka_host is not None
        }
        cls = MetadataResponse[version]
        nodes = [
            cls.MetadataResponseBroker(node_id=node, host=host, port=port, rack=rack)
            for node, host, port, rack in kafka_nodes(image)
        ]
        topics = []
        for t in pb.topics:
            partitions = []
            for p in t.partitions:
                error = p.error.code
                leader = p.leader
                if error == 0 and leader >= 0 and leader not in kafka_brokers:
                    error = LISTENER_NOT_FOUND
                partitions.append(
                    cls.MetadataResponseTopic.MetadataResponsePartition(
                        error_code=error,
                        partition_index=p.partition,
                        leader_id=leader,
                        leader_epoch=p.leader_epoch,
                        replica_nodes=list(p.replicas),
                        isr_nodes=list(p.isr),
                        offline_replicas=list(p.offline_replicas),
                    )
                )
            topics.append(
                cls.MetadataResponseTopic(
                    error_code=t.error.code,
                    name=t.name,
                    topic_id=topic_uuid(t.topic_id),
                    is_internal=t.internal,
                    partitions=partitions,
                )
            )
        return cls(
            throttle_time_ms=0,
            brokers=nodes,
            cluster_id=pb.cluster_id,
            controller_id=self._controller_id(image),
            topics=topics,
        )


def lowest_kafka_broker(image: MetadataImage) -> int:
    """The lowest id of a broker with a Kafka listener (-1: none)."""
    ids = [b.id for b in image.brokers.values() if b.kafka_host is not None]
    return min(ids, default=-1)
