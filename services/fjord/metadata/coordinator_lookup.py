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
from fjord.transactions.defaults import TRANSACTION_STATE_TOPIC
from fjord.transactions.log import transaction_partition

log = logging.getLogger(__name__)

#: FindCoordinator's ``key_type`` for a consumer group (Kafka's CoordinatorType.GROUP).
KEY_TYPE_GROUP = 0
#: FindCoordinator's ``key_type`` for a transactional id (Kafka's CoordinatorType.TRANSACTION):
#: the owner of ``__transaction_state`` partition ``abs(javaStringHashCode(id)) % 50``, which
#: is the owner of the same-numbered ``__consumer_offsets`` partition (``offsets-owners/<p>``).
KEY_TYPE_TRANSACTION = 1


@dataclass(frozen=True)
class GroupCoordinator:
    """The coordinator serving a group and the group's ``__consumer_offsets`` partition."""

    registration: CoordinatorRegistration
    partition: int


def locate_group_coordinator(image: MetadataImage, key: str, key_type: int) -> GroupCoordinator:
    """The live coordinator that owns ``key``'s partition.

    For a group (``key_type`` 0) the partition is :func:`group_partition` of
    ``__consumer_offsets``; for a transactional id (1), :func:`transaction_partition` of
    ``__transaction_state``. Either way its owner is the ``offsets-owners/<p>`` entry (the two
    topics' partition p have one owner), and the owner must have a live registration
    (``coordinators/<id>``). Raises :class:`InvalidRequestError` for another ``key_type``,
    :class:`InvalidGroupIdError` for an empty key, and the retriable
    :class:`CoordinatorNotAvailableError` while a topic, the owner or its registration is
    missing (the topic is being created, no coordinator runs, or one just died and the
    controller has not moved its partitions yet).
    """
    if key_type not in (KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION):
        raise InvalidRequestError(
            f"FindCoordinator key_type {key_type} is not supported: 0 (group) or 1 (transaction)"
        )
    if not key:
        if key_type == KEY_TYPE_TRANSACTION:
            raise InvalidRequestError("the transactional id is empty")
        raise InvalidGroupIdError("the group id is empty")
    offsets = image.topic(OFFSETS_TOPIC)
    if offsets is None:
        raise CoordinatorNotAvailableError(f"{OFFSETS_TOPIC} does not exist yet")
    topic, partition = OFFSETS_TOPIC, group_partition(key, offsets.partitions)
    if key_type == KEY_TYPE_TRANSACTION:
        record = image.topic(TRANSACTION_STATE_TOPIC)
        if record is None:
            raise CoordinatorNotAvailableError(f"{TRANSACTION_STATE_TOPIC} does not exist yet")
        topic, partition = TRANSACTION_STATE_TOPIC, transaction_partition(key, record.partitions)
    owner = image.offsets_owner(partition)
    if owner is None:
        raise CoordinatorNotAvailableError(
            f"{topic}-{partition} has no coordinator yet (is a coordinator running?)"
        )
    registration = image.coordinators.get(owner.coordinator_id)
    if registration is None:
        raise CoordinatorNotAvailableError(
            f"coordinator {owner.coordinator_id} of {topic}-{partition} is not live"
        )
    return GroupCoordinator(registration, partition)


def missing_coordinator_topics(image: MetadataImage, key_type: int) -> bool:
    """Whether a FindCoordinator of ``key_type`` found a coordinator topic missing (then the
    door asks the controller to create it, as Kafka's brokers do)."""
    if image.topic(OFFSETS_TOPIC) is None:
        return True
    return key_type == KEY_TYPE_TRANSACTION and image.topic(TRANSACTION_STATE_TOPIC) is None


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
        #: Set by the first transactional FindCoordinator: ``__transaction_state`` is created
        #: only once someone uses transactions (as Kafka).
        self.transactions_asked = False

    def request(self) -> None:
        """Start creating the missing coordinator topics (``__consumer_offsets``, and
        ``__transaction_state`` once a transactional lookup asked) unless under way."""
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._create_missing())

    async def _create_missing(self) -> None:
        image = self._image()
        for name in (OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC):
            if image.topic(name) is None and (name == OFFSETS_TOPIC or self.transactions_asked):
                await self._create(name)

    async def _create(self, topic: str) -> None:
        active = self._image().controller
        if active is None:
            log.info("no active controller to create %s yet", topic)
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
                    name=topic, num_partitions=-1, replication_factor=-1
                )
            ]
        )
        try:
            response = await stub.CreateTopics(
                request, timeout=OFFSETS_TOPIC_CREATE_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            log.warning(
                "creating %s on controller %s failed: %s", topic, address, exc.code().name
            )
            return
        for result in response.results:
            code = error_code_from_number(result.error.code)
            if code is ErrorCode.NONE:
                log.info(
                    "created %s (%d partitions, replication factor %d)",
                    topic,
                    result.num_partitions,
                    result.replication_factor,
                )
            elif code is not ErrorCode.TOPIC_ALREADY_EXISTS:
                log.warning(
                    "creating %s refused: %s %s", topic, code.name, result.error.message
                )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
