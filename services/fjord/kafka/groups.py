"""Kafka's group APIs that every Kafka door shares: their supported versions, FindCoordinator
(brokers and coordinators alike) and a broker's empty ListGroups.

:class:`FindCoordinatorHandler` names the group's coordinator by its Kafka listener and its
Kafka node id (FindCoordinator v4+ batches keys). The group APIs themselves (JoinGroup ...
DeleteGroups) are a coordinator's: :mod:`fjord.coordinator.kafka_groups`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kafka.protocol.admin.groups import ListGroupsResponse
from kafka.protocol.metadata.find_coordinator import FindCoordinatorResponse

from fjord.errors import ErrorCode, FjordError
from fjord.kafka.dispatch import RequestContext
from fjord.kafka.metadata import coordinator_node_id
from fjord.metadata import MetadataImage
from fjord.metadata.coordinator_lookup import (
    KEY_TYPE_TRANSACTION,
    OffsetsTopicCreator,
    locate_group_coordinator,
    missing_coordinator_topics,
)
from fjord.metadata.schema import kafka_endpoint
from fjord.security.acls import (
    NO_AUTHORIZATION,
    AccessControl,
    AclOperation,
    Caller,
    Resource,
    denial_error,
)

# Versions served (each tested with a raw request; clients negotiate within them).
FIND_COORDINATOR_VERSIONS = (0, 6)
JOIN_GROUP_VERSIONS = (0, 9)
SYNC_GROUP_VERSIONS = (0, 5)
HEARTBEAT_VERSIONS = (0, 4)
LEAVE_GROUP_VERSIONS = (0, 5)
OFFSET_COMMIT_VERSIONS = (2, 9)
OFFSET_FETCH_VERSIONS = (1, 9)
DESCRIBE_GROUPS_VERSIONS = (0, 5)
LIST_GROUPS_VERSIONS = (0, 5)
DELETE_GROUPS_VERSIONS = (0, 2)

# --- FindCoordinator (brokers and coordinators) -------------------------------------------------


class FindCoordinatorHandler:
    """FindCoordinator: the coordinator owning the group's ``__consumer_offsets`` partition,
    named by its Kafka listener (:func:`coordinator_node_id`).

    Errors as Kafka's: key type other than group -> INVALID_REQUEST (Fjord has no
    transactions), empty group -> INVALID_GROUP_ID, no live owner yet -> COORDINATOR_NOT_AVAILABLE
    (retriable; the first lookup asks the controller to create ``__consumer_offsets`` when a
    ``creator`` is given); an owner without a Kafka listener -> COORDINATOR_NOT_AVAILABLE.
    """

    def __init__(
        self,
        image: Callable[[], MetadataImage],
        creator: OffsetsTopicCreator | None = None,
        access: AccessControl = NO_AUTHORIZATION,
    ) -> None:
        self._image = image
        self._creator = creator
        self._access = access

    def locate(
        self, key: str, key_type: int, caller: Caller | None = None, listener: str = ""
    ) -> tuple[ErrorCode, str, int, str, int]:
        """(error, message, node id, host, port) for one key, the address of the
        coordinator's door of ``listener`` (the one the request came in on); a group
        ``caller`` may not describe is GROUP_AUTHORIZATION_FAILED."""
        image = self._image()
        if key_type in (0, KEY_TYPE_TRANSACTION) and caller is not None:
            group = Resource.group(key) if key_type == 0 else Resource.transactional_id(key)
            if not self._access.allows(image, caller, AclOperation.DESCRIBE, group):
                denied = denial_error(AclOperation.DESCRIBE, group, caller)
                return denied.code, str(denied), -1, "", -1
        try:
            found = locate_group_coordinator(image, key, key_type)
        except FjordError as exc:
            if (
                exc.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
                and self._creator is not None
                and missing_coordinator_topics(image, key_type)
            ):
                self._creator.transactions_asked |= key_type == KEY_TYPE_TRANSACTION
                self._creator.request()  # Kafka's way: created by the first valid lookup
            return exc.code, str(exc), -1, "", -1
        registration = found.registration
        address = kafka_endpoint(registration, listener)
        if address is None:
            return (
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"coordinator {registration.id} has no Kafka listener"
                + (f" {listener}" if listener else ""),
                -1,
                "",
                -1,
            )
        return (
            ErrorCode.NONE,
            "",
            coordinator_node_id(registration.id),
            address[0],
            address[1],
        )

    async def find_coordinator(self, request: Any, ctx: RequestContext) -> Any:
        version = ctx.api_version
        cls = FindCoordinatorResponse[version]
        key_type = request.key_type if version >= 1 else 0
        if version >= 4:
            coordinators = []
            for key in request.coordinator_keys:
                error, message, node, host, port = self.locate(
                    key, key_type, ctx.caller, ctx.listener
                )
                coordinators.append(
                    cls.Coordinator(
                        key=key,
                        node_id=node,
                        host=host,
                        port=port,
                        error_code=error.code,
                        error_message=message or None,
                    )
                )
            return cls(throttle_time_ms=0, coordinators=coordinators)
        error, message, node, host, port = self.locate(
            request.key, key_type, ctx.caller, ctx.listener
        )
        return cls(
            throttle_time_ms=0,
            error_code=error.code,
            error_message=message or None,
            node_id=node,
            host=host,
            port=port,
        )


async def list_no_groups(request: Any, ctx: RequestContext) -> Any:
    """ListGroups on a broker: Kafka's ListGroups lists the groups the answering node
    coordinates, and a Fjord broker coordinates none (admin clients ask every node of the
    Metadata answer, coordinators included)."""
    return ListGroupsResponse[ctx.api_version](throttle_time_ms=0, error_code=0, groups=[])
