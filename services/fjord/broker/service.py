"""The gRPC face of the broker: translates ``fjord.v1.Broker`` calls to the ReplicaManager.

Thin by design: no protocol logic here. Kafka errors travel inside the responses; a gRPC status
other than OK only means a transport failure or a bug (logged, UNKNOWN to the caller).
"""

from __future__ import annotations

from collections.abc import Callable

from grpc import aio

from fjord._proto import broker_pb2, broker_pb2_grpc, common_pb2
from fjord.broker.producer_ids import ProducerIdAllocator
from fjord.broker.replica_manager import ReplicaManager
from fjord.cluster.topic_config import describe_broker_config
from fjord.errors import ErrorCode, FjordError, InvalidRequestError
from fjord.groups.defaults import OFFSETS_TOPIC
from fjord.metadata import MetadataImage
from fjord.metadata.coordinator_lookup import OffsetsTopicCreator, locate_group_coordinator
from fjord.metadata.view import MetadataResponder
from fjord.tls import ClusterActionGuard

_CLUSTER_AUTHORIZATION_FAILED = common_pb2.Error(
    code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code,
    message="inter-broker request refused: the caller lacks the cluster service identity",
)


def refused_produce(request: broker_pb2.ProduceRequest) -> broker_pb2.ProduceResponse:
    """CLUSTER_AUTHORIZATION_FAILED for every partition of ``request`` (nothing written)."""
    response = broker_pb2.ProduceResponse()
    for topic in request.topics:
        out = response.topics.add(name=topic.name)
        for p in topic.partitions:
            out.partitions.add(
                partition=p.partition, error=_CLUSTER_AUTHORIZATION_FAILED, base_offset=-1
            )
    return response


class BrokerServicer(broker_pb2_grpc.BrokerServicer):
    """Serves Produce, Fetch, ListOffsets, Metadata, InitProducerId, FindCoordinator and
    DescribeConfigs for one broker (gRPC's method names).

    Invariant: every call answers from the ReplicaManager's state and the newest metadata image
    the broker has applied (``image()``); nothing here caches partition state.
    """

    def __init__(
        self,
        replicas: ReplicaManager,
        image: Callable[[], MetadataImage],
        producer_ids: ProducerIdAllocator | None = None,
        offsets_topic: OffsetsTopicCreator | None = None,
        log_dirs: Callable[[], broker_pb2.DescribeLogDirsResponse] | None = None,
        cluster_action: ClusterActionGuard | None = None,
    ) -> None:
        self._replicas = replicas
        #: Inter-broker requests (a follower's Fetch, a coordinator's __consumer_offsets
        #: append) need the cluster service identity when this guard is enforced.
        self._cluster_action = cluster_action or ClusterActionGuard(enforced=False)
        self._log_dirs = log_dirs
        self._image = image
        self._producer_ids = producer_ids
        self._offsets_topic = offsets_topic
        self._metadata = MetadataResponder()

    async def Produce(
        self, request: broker_pb2.ProduceRequest, context: aio.ServicerContext
    ) -> broker_pb2.ProduceResponse:
        if any(t.name == OFFSETS_TOPIC for t in request.topics) and not (
            self._cluster_action.allows(context, f"Produce to {OFFSETS_TOPIC}")
        ):
            return refused_produce(request)
        return await self._replicas.produce(request)

    async def Fetch(
        self, request: broker_pb2.FetchRequest, context: aio.ServicerContext
    ) -> broker_pb2.FetchResponse:
        if request.replica_id >= 0 and not self._cluster_action.allows(
            context, f"follower Fetch (replica_id {request.replica_id})"
        ):
            return broker_pb2.FetchResponse(error=_CLUSTER_AUTHORIZATION_FAILED)
        return await self._replicas.fetch(request)

    async def ListOffsets(
        self, request: broker_pb2.ListOffsetsRequest, context: aio.ServicerContext
    ) -> broker_pb2.ListOffsetsResponse:
        return self._replicas.list_offsets(request)

    async def Metadata(
        self, request: broker_pb2.MetadataRequest, context: aio.ServicerContext
    ) -> broker_pb2.MetadataResponse:
        return self.metadata(request)

    async def InitProducerId(
        self, request: broker_pb2.InitProducerIdRequest, context: aio.ServicerContext
    ) -> broker_pb2.InitProducerIdResponse:
        return await self.init_producer_id(request)

    async def FindCoordinator(
        self, request: broker_pb2.FindCoordinatorRequest, context: aio.ServicerContext
    ) -> broker_pb2.FindCoordinatorResponse:
        return self.find_coordinator(request)

    async def DescribeConfigs(
        self, request: broker_pb2.DescribeBrokerConfigsRequest, context: aio.ServicerContext
    ) -> broker_pb2.DescribeBrokerConfigsResponse:
        response = broker_pb2.DescribeBrokerConfigsResponse(broker_id=self._replicas.broker_id)
        for entry in describe_broker_config(
            self._replicas.static_config, self._image().cluster_config
        ):
            response.entries.add(name=entry.name, value=entry.value, source=entry.source,
                                 is_default=entry.source == "DEFAULT")  # fmt: skip
        return response

    async def DescribeLogDirs(
        self, request: broker_pb2.DescribeLogDirsRequest, context: aio.ServicerContext
    ) -> broker_pb2.DescribeLogDirsResponse:
        if self._log_dirs is None:
            response = broker_pb2.DescribeLogDirsResponse()
            response.error.code = ErrorCode.UNKNOWN_SERVER_ERROR.code
            response.error.message = "this broker does not describe its log directory"
            return response
        return self._log_dirs()

    # --- shared with the Kafka listener (fjord.broker.kafka_apis) ------------------------------

    def metadata(self, request: broker_pb2.MetadataRequest) -> broker_pb2.MetadataResponse:
        """The Metadata answer from the newest applied image (all-topics answers cached)."""
        return self._metadata.respond(self._image(), request)

    async def init_producer_id(
        self, request: broker_pb2.InitProducerIdRequest
    ) -> broker_pb2.InitProducerIdResponse:
        """A new producer id and epoch 0; transactional ids are refused."""
        response = broker_pb2.InitProducerIdResponse(producer_id=-1, producer_epoch=-1)
        try:
            if request.transactional_id:
                raise InvalidRequestError(
                    "transactional.id is not supported: Fjord has idempotent producers only"
                )
            if self._producer_ids is None:
                raise FjordError(
                    "this broker does not allocate producer ids",
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                )
            response.producer_id = await self._producer_ids.new_producer_id()
            response.producer_epoch = 0
        except FjordError as exc:
            response.error.code = exc.code.code
            response.error.message = str(exc)
        return response

    def find_coordinator(
        self, request: broker_pb2.FindCoordinatorRequest
    ) -> broker_pb2.FindCoordinatorResponse:
        """The coordinator of a group (id and gRPC address); the first lookup while
        ``__consumer_offsets`` does not exist asks the controller to create it."""
        response = broker_pb2.FindCoordinatorResponse(partition=-1)
        image = self._image()
        try:
            found = locate_group_coordinator(image, request.key, request.key_type)
        except FjordError as exc:
            if (
                exc.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
                and self._offsets_topic is not None
                and image.topic(OFFSETS_TOPIC) is None
            ):
                self._offsets_topic.request()  # Kafka's way: created by the first valid lookup
            response.error.code = exc.code.code
            response.error.message = str(exc)
            return response
        response.partition = found.partition
        response.coordinator.id = found.registration.id
        response.coordinator.host = found.registration.host
        response.coordinator.port = found.registration.port
        return response
