"""The Kafka APIs a group coordinator's listener serves.

A coordinator is a node of its own in Kafka's view (see :mod:`fjord.kafka.metadata`): clients
send it the group APIs after FindCoordinator, and, because it is listed in Metadata, also the
requests a client sends to "any node": ApiVersions, Metadata, FindCoordinator, ListGroups (admin
clients ask every node), the admin APIs (kafka-python's admin client sends them to the least
loaded node; the topic-changing ones are forwarded to the controller, as brokers do) and
InitProducerId (librdkafka refuses idempotence when the
node it is connected to lacks it; forwarded to a broker, which allocates the id).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.protocol.producer.transaction import InitProducerIdRequest

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.coordinator.authorization import AuthorizedGroups, AuthorizedTransactions
from fjord.coordinator.kafka_groups import GroupKafkaHandlers
from fjord.coordinator.kafka_transactions import TransactionKafkaHandlers
from fjord.errors import ErrorCode
from fjord.kafka.admin import BrokerAdminHandlers, ControllerForwarder
from fjord.kafka.defaults import ADMIN_FORWARD_TIMEOUT_S
from fjord.kafka.dispatch import Api, KafkaDispatcher, RequestContext
from fjord.kafka.groups import FIND_COORDINATOR_VERSIONS, FindCoordinatorHandler
from fjord.kafka.metadata import KafkaMetadata, coordinator_node_id, lowest_kafka_broker
from fjord.kafka.producer_ids import (
    INIT_PRODUCER_ID_VERSIONS,
    init_producer_id_pb,
    init_producer_id_response,
)
from fjord.metadata import MetadataImage
from fjord.metadata.coordinator_lookup import OffsetsTopicCreator
from fjord.metadata.view import MetadataResponder, hide_undescribable_topics
from fjord.security.acls import NO_AUTHORIZATION, AccessControl, Caller

#: Metadata versions a coordinator serves (the brokers' range).
METADATA_VERSIONS = (0, 12)


log = logging.getLogger(__name__)


class ProducerIdForwarder:
    """InitProducerId on a coordinator: asked of the live brokers in turn (over gRPC) until one
    answers; none answering is COORDINATOR_NOT_AVAILABLE, which idempotent producers retry."""

    def __init__(
        self,
        image: Callable[[], MetadataImage],
        broker_stub: Callable[[str], broker_pb2_grpc.BrokerStub],
        access: AccessControl = NO_AUTHORIZATION,
    ) -> None:
        self._image = image
        self._broker_stub = broker_stub
        self._access = access
        self._next = 0

    async def init_producer_id(self, request: Any, ctx: RequestContext) -> Any:
        pb = init_producer_id_pb(request)
        if not pb.transactional_id and not self._access.allows_idempotent_producer(
            self._image(), ctx.caller
        ):
            # Checked here: the broker sees this coordinator's service identity, not the client.
            refused = broker_pb2.InitProducerIdResponse(producer_id=-1, producer_epoch=-1)
            refused.error.code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code
            refused.error.message = (
                f"{ctx.caller.principal} is not authorized to IdempotentWrite the cluster"
            )
            return init_producer_id_response(refused, ctx.api_version)
        brokers = [b.address for _, b in sorted(self._image().brokers.items())]
        for i in range(len(brokers)):
            address = brokers[(self._next + i) % len(brokers)]
            try:
                answer = await self._broker_stub(address).InitProducerId(
                    pb, timeout=ADMIN_FORWARD_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as exc:
                log.info("InitProducerId to broker %s failed: %s", address, exc.code().name)
                continue
            self._next += i + 1
            return init_producer_id_response(answer, ctx.api_version)
        failed = broker_pb2.InitProducerIdResponse(producer_id=-1, producer_epoch=-1)
        failed.error.code = ErrorCode.COORDINATOR_NOT_AVAILABLE.code
        return init_producer_id_response(failed, ctx.api_version)


class CoordinatorKafkaApis:
    """Every API a coordinator serves over Kafka's protocol, with its tested versions, and the
    clients they use (controller forwarding, ``__consumer_offsets`` creation), closed by
    :meth:`close`."""

    def __init__(
        self,
        coordinator_id: int,
        groups: AuthorizedGroups,
        image: Callable[[], MetadataImage],
        broker_stub: Callable[[str], broker_pb2_grpc.BrokerStub],
        transactions: AuthorizedTransactions | None = None,
    ) -> None:
        access = groups.access
        self._forwarder = ControllerForwarder(image)
        self._offsets_topic = OffsetsTopicCreator(image)
        responder = MetadataResponder()

        def respond(
            request: broker_pb2.MetadataRequest, caller: Caller
        ) -> broker_pb2.MetadataResponse:
            current = image()
            answer = responder.respond(current, request)
            return hide_undescribable_topics(access, current, caller, request, answer)

        metadata = KafkaMetadata(image, respond, lowest_kafka_broker)
        admin = BrokerAdminHandlers(
            coordinator_node_id(coordinator_id), None, image, {}, self._forwarder, access
        )
        producer_ids = ProducerIdForwarder(image, broker_stub, access)
        txn_handlers = (
            None if transactions is None else TransactionKafkaHandlers(transactions, groups)
        )

        async def init_producer_id(request: Any, ctx: RequestContext) -> Any:
            # With a transactional id: this coordinator's transaction coordinator; without,
            # a broker allocates an idempotent producer's id.
            if request.transactional_id and txn_handlers is not None:
                return await txn_handlers.init_producer_id(request, ctx)
            return await producer_ids.init_producer_id(request, ctx)

        finder = FindCoordinatorHandler(image, self._offsets_topic, access)
        self.apis = [
            Api(3, *METADATA_VERSIONS, MetadataRequest, metadata.metadata),
            Api(10, *FIND_COORDINATOR_VERSIONS, FindCoordinatorRequest, finder.find_coordinator),
            Api(
                22, *INIT_PRODUCER_ID_VERSIONS, InitProducerIdRequest, init_producer_id
            ),
            *(txn_handlers.apis() if txn_handlers is not None else ()),
            *admin.cluster_apis(),
            *GroupKafkaHandlers(groups).apis(),
        ]

    def dispatcher(self) -> KafkaDispatcher:
        return KafkaDispatcher(self.apis)

    async def close(self) -> None:
        await self._forwarder.close()
        await self._offsets_topic.close()
