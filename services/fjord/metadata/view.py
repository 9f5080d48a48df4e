"""The answer to a Metadata request, built from a :class:`MetadataImage`: a broker's gRPC
Metadata, and through the Kafka listener of brokers and coordinators alike.

Pure: image in, protobuf out. The all-topics answer is cached per image revision by the caller
(:class:`MetadataResponder`), because clients ask for it on every refresh.
"""

from __future__ import annotations

from fjord._proto import broker_pb2, common_pb2
from fjord.errors import ErrorCode
from fjord.metadata import BrokerRegistration, MetadataImage, PartitionState
from fjord.security.acls import AccessControl, AclOperation, Caller, Resource
from fjord.topic_names import is_internal_topic, topic_name_problem


def _error(code: ErrorCode, message: str) -> common_pb2.Error:
    return common_pb2.Error(code=code.code, message=message)


def partition_metadata(
    partition: int, state: PartitionState, live_brokers: frozenset[int] | set[int]
) -> common_pb2.PartitionMetadata:
    """One partition as clients see it; LEADER_NOT_AVAILABLE while it has no live leader."""
    meta = common_pb2.PartitionMetadata(
        partition=partition,
        leader=state.leader,
        leader_epoch=state.leader_epoch,
        replicas=state.replicas,
        isr=state.isr,
        partition_epoch=state.partition_epoch,
        offline_replicas=[r for r in state.replicas if r not in live_brokers],
    )
    if state.leader < 0 or state.leader not in live_brokers:
        meta.leader = -1
        meta.error.CopyFrom(
            _error(ErrorCode.LEADER_NOT_AVAILABLE, f"partition {partition} has no live leader")
        )
    return meta


def topic_metadata(
    image: MetadataImage, name: str, live_brokers: frozenset[int] | set[int]
) -> common_pb2.TopicMetadata:
    """A topic with its partitions, or an error: INVALID_TOPIC_EXCEPTION for a name that
    breaks Kafka's rules (:mod:`fjord.topic_names`), UNKNOWN_TOPIC_OR_PARTITION for a legal name
    of a topic that does not exist."""
    out = common_pb2.TopicMetadata(name=name, internal=is_internal_topic(name))
    problem = topic_name_problem(name)
    if problem is not None:
        out.error.CopyFrom(_error(ErrorCode.INVALID_TOPIC_EXCEPTION, problem))
        return out
    record = image.topic(name)
    if record is None:
        out.error.CopyFrom(
            _error(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        )
        return out
    out.topic_id = record.topic_id
    for partition, state in sorted(image.partitions(name).items()):
        out.partitions.append(partition_metadata(partition, state, live_brokers))
    return out


def broker_info(broker_id: int, registration: BrokerRegistration) -> common_pb2.BrokerInfo:
    """A broker as Metadata names it: its gRPC address, rack and, when it opens one, its direct
    door (fjord.direct_frames; ``direct_host``/``direct_port`` stay ""/0 without one)."""
    info = common_pb2.BrokerInfo(id=broker_id, host=registration.host, port=registration.port,
                                 rack=registration.rack or "")
    if registration.direct_host is not None and registration.direct_port:
        info.direct_host, info.direct_port = registration.direct_host, registration.direct_port
    return info


def build_metadata_response(
    image: MetadataImage, request: broker_pb2.MetadataRequest
) -> broker_pb2.MetadataResponse:
    """The full Metadata answer. Auto-creation is not supported (see fjord.cluster.defaults:
    AUTO_CREATE_TOPICS_ENABLE): unknown topics are reported as unknown, whatever
    ``allow_auto_topic_creation`` says."""
    response = broker_pb2.MetadataResponse(
        cluster_id=image.cluster_id, metadata_version=image.revision
    )
    live = set(image.brokers)
    for broker_id, reg in sorted(image.brokers.items()):
        response.brokers.append(broker_info(broker_id, reg))
    active = image.controller
    if active is not None:
        response.controller.CopyFrom(
            common_pb2.ControllerInfo(
                id=active.registration.id,
                host=active.registration.host,
                port=active.registration.port,
                epoch=active.epoch,
            )
        )
    names = sorted(image.topics) if request.all_topics else list(dict.fromkeys(request.topics))
    for name in names:
        response.topics.append(topic_metadata(image, name, live))
    return response


class MetadataResponder:
    """Answers Metadata requests, caching the all-topics answer for the current image.

    Invariant: a cached answer is only served for the image (revision and cluster) it was built
    from, and is never mutated after it is built (gRPC only serializes it).
    """

    def __init__(self) -> None:
        self._cached_key: tuple[str, int] | None = None
        self._cached: broker_pb2.MetadataResponse | None = None

    def respond(
        self, image: MetadataImage, request: broker_pb2.MetadataRequest
    ) -> broker_pb2.MetadataResponse:
        if not request.all_topics:
            return build_metadata_response(image, request)
        key = (image.cluster_id, image.revision)
        if self._cached is None or self._cached_key != key:
            self._cached = build_metadata_response(image, request)
            self._cached_key = key
        return self._cached


def hide_undescribable_topics(
    access: AccessControl,
    image: MetadataImage,
    caller: Caller,
    request: broker_pb2.MetadataRequest,
    response: broker_pb2.MetadataResponse,
) -> broker_pb2.MetadataResponse:
    """``response`` without the topics ``caller`` may not Describe, as Kafka answers Metadata:
    left out of an all-topics answer (not counted as denials), TOPIC_AUTHORIZATION_FAILED
    when named. A new message when anything changes (cached answers are never mutated)."""
    if not access.enabled:
        return response
    keep: list[common_pb2.TopicMetadata] = []
    changed = False
    for topic in response.topics:
        if access.allows(image, caller, AclOperation.DESCRIBE, Resource.topic(topic.name),
                         count=not request.all_topics):
            keep.append(topic)
            continue
        changed = True
        if not request.all_topics:
            keep.append(common_pb2.TopicMetadata(name=topic.name, error=common_pb2.Error(
                code=ErrorCode.TOPIC_AUTHORIZATION_FAILED.code,
                message=f"{caller.principal} is not authorized to Describe topic {topic.name}",
            )))
    if not changed:
        return response
    out = broker_pb2.MetadataResponse()
    out.CopyFrom(response)
    del out.topics[:]
    out.topics.extend(keep)
    return out


def brokers_by_sasl_door(
    response: broker_pb2.MetadataResponse, image: MetadataImage
) -> broker_pb2.MetadataResponse:
    """A copy of ``response`` (which may be a cached answer, so never changed in place) whose
    brokers and controller are named by their SASL gRPC doors; brokers without a door are left
    out, as Kafka leaves out brokers without the listener the client came in through, and a
    controller without one is left unset. No broker is named with its direct door: that door
    has no identity, and a client that came in through SASL keeps authenticating."""
    out = broker_pb2.MetadataResponse()
    out.CopyFrom(response)
    del out.brokers[:]
    for broker in response.brokers:
        registration = image.brokers.get(broker.id)
        if registration is None or registration.sasl_host is None or not registration.sasl_port:
            continue
        out.brokers.add(id=broker.id, host=registration.sasl_host,
                        port=registration.sasl_port, rack=broker.rack)
    active = image.controller
    if out.HasField("controller"):
        door = active.registration if active is not None else None
        if door is None or door.id != out.controller.id or door.sasl_host is None \
                or not door.sasl_port:
            out.ClearField("controller")  # no door to name: as no active controller
        else:
            out.controller.host, out.controller.port = door.sasl_host, door.sasl_port
    return out
