"""Kafka's Metadata answer from a metadata image, shared by the brokers' and the group
coordinators' Kafka listeners.

Nodes are named by their Kafka listener: every broker that has one, and every group coordinator
that has one under its own node id (:func:`coordinator_node_id`); a process with several Kafka
doors is named by the door of the listener the request came in on (Kafka's listener names), and
a partition whose leader lacks that listener answers LISTENER_NOT_FOUND. Coordinators are listed
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
from fjord.metadata.schema import kafka_endpoint
from fjord.security.acls import Caller

LISTENER_NOT_FOUND = ErrorCode.LISTENER_NOT_FOUND.code


def coordinator_node_id(coordinator_id: int) -> int:
    """The Kafka node id of group coordinator ``coordinator_id`` (never a broker's id)."""
    return COORDINATOR_NODE_ID_BASE + coordinator_id


def kafka_nodes(
    image: MetadataImage, listener: str = ""
) -> list[tuple[int, str, int, str | None]]:
    """(node id, host, port, rack) of every broker and coordinator with a Kafka door of
    ``listener`` (see fjord.metadata.schema.kafka_endpoint; "": each one's first), by node
    id."""
    nodes = []
    for b in image.brokers.values():
        address = kafka_endpoint(b, listener)
        if address is not None:
            nodes.append((b.id, address[0], address[1], b.rack))
    for c in image.coordinators.values():
        address = kafka_endpoint(c, listener)
        if address is not None:
            nodes.append((coordinator_node_id(c.id), address[0], address[1], None))
    return sorted(nodes)


def kafka_broker_ids(image: MetadataImage, listener: str = "") -> set[int]:
    """Ids of the brokers with a Kafka door of ``listener``."""
    return {b.id for b in image.brokers.values() if kafka_endpoint(b, listener) is not None}


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
        controller_id: Callable[[MetadataImage, str], int],
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
        kafka_brokers = kafka_broker_ids(image, ctx.listener)
        cls = MetadataResponse[version]
        nodes = [
            cls.MetadataResponseBroker(node_id=node, host=host, port=port, rack=rack)
            for node, host, port, rack in kafka_nodes(image, ctx.listener)
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
            controller_id=self._controller_id(image, ctx.listener),
            topics=topics,
        )


def lowest_kafka_broker(image: MetadataImage, listener: str = "") -> int:
    """The lowest id of a broker with a Kafka door of ``listener`` (-1: none)."""
    return min(kafka_broker_ids(image, listener), default=-1)
