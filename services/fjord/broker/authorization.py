"""The broker's ACL checks, in one place for both doors: the gRPC servicer and the Kafka
listener's handlers hand their (translated) requests to the servicer's shared methods, which
ask :class:`BrokerAuthorization` before the cores run.

Kafka's rules: Produce needs Write on each topic, a consumer Fetch Read, ListOffsets Describe,
Metadata Describe (topics the caller may not describe are left out of an all-topics answer and
answered TOPIC_AUTHORIZATION_FAILED when named), a follower Fetch ClusterAction on the cluster,
InitProducerId IdempotentWrite on the cluster (or Write on some topic: Kafka 3's KIP-679),
FindCoordinator Describe on the group. A refused topic is answered per partition and never
reaches the core; the other topics of the request are served as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fjord._proto import broker_pb2, common_pb2
from fjord.errors import ErrorCode
from fjord.metadata import MetadataImage
from fjord.metadata.view import hide_undescribable_topics
from fjord.records.header import has_transactional_batch
from fjord.security.acls import (
    NO_AUTHORIZATION,
    AccessControl,
    AclOperation,
    Caller,
    Resource,
)

TOPIC_DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED


def _denied(caller: Caller, operation: AclOperation, topic: str) -> common_pb2.Error:
    return common_pb2.Error(
        code=TOPIC_DENIED.code,
        message=f"{caller.principal} is not authorized to {operation.java_name} topic {topic}",
    )


class BrokerAuthorization:
    """ACL checks of one broker over its newest metadata image (the ACLs it has applied)."""

    def __init__(
        self, image: Callable[[], MetadataImage], access: AccessControl = NO_AUTHORIZATION
    ) -> None:
        self._image = image
        self.access = access

    @property
    def enabled(self) -> bool:
        return self.access.enabled

    def allows(self, caller: Caller, operation: AclOperation, resource: Resource,
               *, count: bool = True) -> bool:
        return self.access.allows(self._image(), caller, operation, resource, count=count)

    def require(self, caller: Caller, operation: AclOperation, resource: Resource) -> None:
        self.access.require(self._image(), caller, operation, resource)

    def split_topics(
        self, caller: Caller, operation: AclOperation, request: Any
    ) -> tuple[Any, list[Any]]:
        """(``request`` with only the topics ``caller`` may ``operation``, the refused topic
        entries). ``request`` is any request whose ``topics`` have a ``name``; the original is
        returned unchanged when nothing is refused."""
        if not self.enabled:
            return request, []  # the hot path without authorization: nothing to build
        refused = [
            t for t in request.topics
            if not self.allows(caller, operation, Resource.topic(t.name))
        ]
        if not refused:
            return request, []
        allowed = type(request)()
        allowed.CopyFrom(request)
        del allowed.topics[:]
        refused_names = {t.name for t in refused}
        allowed.topics.extend(t for t in request.topics if t.name not in refused_names)
        return allowed, refused

    def refuse_produce(
        self, caller: Caller, refused: list[broker_pb2.ProduceTopic],
        response: broker_pb2.ProduceResponse,
    ) -> None:
        for topic in refused:
            out = response.topics.add(name=topic.name)
            for p in topic.partitions:
                out.partitions.add(
                    partition=p.partition, error=_denied(caller, AclOperation.WRITE, topic.name),
                    base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
                )

    def refuse_transactional_produce(
        self, caller: Caller, request: broker_pb2.ProduceRequest
    ) -> bool:
        """Whether ``request`` carries transactional records its TransactionalId does not let
        ``caller`` write (a missing id never does; counted as a denial when asked)."""
        if not any(has_transactional_batch(p.records)
                   for t in request.topics for p in t.partitions):
            return False
        return not request.transactional_id or not self.allows(
            caller, AclOperation.WRITE, Resource.transactional_id(request.transactional_id)
        )

    @staticmethod
    def refused_produce(
        request: broker_pb2.ProduceRequest, code: ErrorCode, message: str
    ) -> broker_pb2.ProduceResponse:
        """The answer refusing every partition of ``request`` with ``code``."""
        response = broker_pb2.ProduceResponse()
        error = common_pb2.Error(code=code.code, message=message)
        for topic in request.topics:
            out = response.topics.add(name=topic.name)
            for p in topic.partitions:
                out.partitions.add(partition=p.partition, error=error, base_offset=-1,
                                   log_append_time_ms=-1, log_start_offset=-1)
        return response

    def refuse_fetch(
        self, caller: Caller, refused: list[broker_pb2.FetchTopic],
        response: broker_pb2.FetchResponse,
    ) -> None:
        for topic in refused:
            out = response.topics.add(name=topic.name)
            for p in topic.partitions:
                out.partitions.add(
                    partition=p.partition, error=_denied(caller, AclOperation.READ, topic.name),
                    high_watermark=-1, last_stable_offset=-1, log_start_offset=-1,
                    leader_id=-1, leader_epoch=-1,
                )

    def refuse_list_offsets(
        self, caller: Caller, refused: list[broker_pb2.ListOffsetsTopic],
        response: broker_pb2.ListOffsetsResponse,
    ) -> None:
        for topic in refused:
            out = response.topics.add(name=topic.name)
            for p in topic.partitions:
                out.partitions.add(
                    partition=p.partition,
                    error=_denied(caller, AclOperation.DESCRIBE, topic.name),
                    timestamp=-1, offset=-1, leader_epoch=-1,
                )

    def filter_metadata(
        self, caller: Caller, request: broker_pb2.MetadataRequest,
        response: broker_pb2.MetadataResponse,
    ) -> broker_pb2.MetadataResponse:
        return hide_undescribable_topics(self.access, self._image(), caller, request, response)

    def allows_idempotent_producer(self, caller: Caller) -> bool:
        return self.access.allows_idempotent_producer(self._image(), caller)
