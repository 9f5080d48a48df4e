"""FindCoordinator, shared by every door that answers it (a broker's gRPC and Kafka listeners, a
group coordinator's Kafka listener): which group coordinator serves a group.

:func:`locate_group_coordinator` is the pure core (metadata image in, coordinator or typed error
out). :class:`OffsetsTopicCreator` is the shell that asks the active controller to create
``__consumer_offsets`` when the first FindCoordinator finds none, as Kafka's brokers do; it
never makes the RPC wait: FindCoordinator answers COORDINATOR_NOT_AVAILABLE (retriable) at
once and the creation runs in the background.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from fjord._proto import controller_pb2, controller_pb2_grpc
from fjord.errors import (
    CoordinatorNotAvailableError,
    ErrorCode,
    InvalidGroupIdError,
    InvalidRequestError,
    error_code_from_number,
)
from fjord.groups.defaults import OFFSETS_TOPIC, OFFSETS_TOPIC_CREATE_TIMEOUT_S
from fjord.groups.offsets_topic import group_partition
from fjord.metadata import CoordinatorRegistration, MetadataImage
from fjord.tls import open_channel

log = logging.getLogger(__name__)

#: FindCoordinator's ``key_type`` for a consumer group (Kafka's CoordinatorType.GROUP); 1
#: (TRANSACTION) is refused: Fjord has no transactions.
KEY_TYPE_GROUP = 0


@dataclass(frozen=True)
class GroupCoordinator:
    """The coordinator serving a group and the group's ``__consumer_offsets`` partition."""

    registration: CoordinatorRegistration
    partition: int


def locate_group_coordinator(image: MetadataImage, key: str, key_type: int) -> GroupCoordinator:
    """The live coordinator that owns ``key``'s ``__consumer_offsets`` partition.

    The partition is :func:`group_partition` over the topic's partition count; its owner is
    the ``offsets-owners/<p>`` entry, and the owner must have a live registration
    (``coordinators/<id>``). Raises :class:`InvalidRequestError` for a ``key_type`` other than
    0, :class:`InvalidGroupIdError` for an empty group id, and the retriable
    :class:`CoordinatorNotAvailableError` while the topic, the owner or its registration is
    missing (the topic is being created, no coordinator runs, or one just died and the
    controller has not moved its partitions yet).
    """
    if key_type != KEY_TYPE_GROUP:
        raise InvalidRequestError(
            f"FindCoordinator key_type {key_type} is not supported: only 0 (group); "
            "Fjord has no transactions"
        )
    if not key:
        raise InvalidGroupIdError("the group id is empty")
    record = image.topic(OFFSETS_TOPIC)
    if record is None:
        raise CoordinatorNotAvailableError(f"{OFFSETS_TOPIC} does not exist yet")
    partition = group_partition(key, record.partitions)
    owner = image.offsets_owner(partition)
    if owner is None:
        raise CoordinatorNotAvailableError(
            f"{OFFSETS_TOPIC}-{partition} has no coordinator yet (is a coordinator running?)"
        )
    registration = image.coordinators.get(owner.coordinator_id)
    if registration is None:
        raise CoordinatorNotAvailableError(
            f"coordinator {owner.coordinator_id} of {OFFSETS_TOPIC}-{partition} is not live"
        )
    return GroupCoordinator(registration, partition)


class OffsetsTopicCreator:
    """Asks the active controller to create ``__consumer_offsets`` (CreateTopics with -1 for
    partitions and replication factor: the controller applies its ``offsets.topic.*``
    settings).

    Invariant: at most one request is in flight; :meth:`request` never waits for it. Failures
    (no controller yet, a fail-over, a timeout) are logged and retried by the next
    FindCoordinator; TOPIC_ALREADY_EXISTS (another broker was faster) counts as success.
    """

    def __init__(self, image: Callable[[], MetadataImage]) -> None:
        self._image = image
        self._task: asyncio.Task[None] | None = None
        self._channel: grpc.aio.Channel | None = None
        self._address: str | None = None

    def request(self) -> None:
        """Start creating the topic unless that is already under way."""
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._create())

    async def _create(self) -> None:
        active = self._image().controller
        if active is None:
            log.info("no active controller to create %s yet", OFFSETS_TOPIC)
            return
        address = active.registration.address
        if self._channel is None or address != self._address:
            if self._channel is not None:
                await self._channel.close()
            self._channel, self._address = open_channel(address), address
        stub = controller_pb2_grpc.ControllerStub(self._channel)
        request = controller_pb2.CreateTopicsRequest(
            topics=[
                controller_pb2.CreatableTopic(
                    name=OFFSETS_TOPIC, num_partitions=-1, replication_factor=-1
                )
            ]
        )
        try:
            response = await stub.CreateTopics(
                request, timeout=OFFSETS_TOPIC_CREATE_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            log.warning(
                "creating %s on controller %s failed: %s", OFFSETS_TOPIC, address, exc.code().name
            )
            return
        for result in response.results:
            code = error_code_from_number(result.error.code)
            if code is ErrorCode.NONE:
                log.info(
                    "created %s (%d partitions, replication factor %d)",
                    OFFSETS_TOPIC,
                    result.num_partitions,
                    result.replication_factor,
                )
            elif code is not ErrorCode.TOPIC_ALREADY_EXISTS:
                log.warning(
                    "creating %s refused: %s %s", OFFSETS_TOPIC, code.name, result.error.message
                )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
