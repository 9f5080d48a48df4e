"""The gRPC face of the broker: translates ``fjord.v1.Broker`` calls to the ReplicaManager.

Thin by design: no protocol logic here. Kafka errors travel inside the responses; a gRPC status
other than OK only means a transport failure or a bug (logged, UNKNOWN to the caller).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import grpc
from grpc import aio

from fjord._proto import broker_pb2, broker_pb2_grpc, common_pb2
from fjord.broker.authorization import BrokerAuthorization
from fjord.broker.fetch_wire import (
    DetachedFetchResponse,
    DetachedRecords,
    serialize_fetch_response,
)
from fjord.broker.producer_ids import ProducerIdAllocator
from fjord.broker.replica_manager import ProduceInput, RegionMarker, ReplicaManager
from fjord.cluster.dynamic_config import describe_default_broker_config
from fjord.cluster.topic_config import describe_broker_config
from fjord.errors import ErrorCode, FjordError
from fjord.groups.defaults import OFFSETS_TOPIC
from fjord.kafka.server import MAX_IN_FLIGHT_PRODUCE
from fjord.metadata import MetadataImage
from fjord.metadata.coordinator_lookup import (
    KEY_TYPE_TRANSACTION,
    OffsetsTopicCreator,
    locate_group_coordinator,
    missing_coordinator_topics,
)
from fjord.metadata.view import MetadataResponder, brokers_by_sasl_door
from fjord.observability.metrics import open_stream, record_rpc
from fjord.rpc_streams import OpenStreams, answer_in_order, send_stream_headers
from fjord.security.acls import NO_AUTHORIZATION, AccessControl, AclOperation, Caller, Resource
from fjord.security.sasl_sessions import SASL_SESSION_PRINCIPAL
from fjord.serving import grpc_caller
from fjord.tls import ClusterActionGuard
from fjord.transactions.defaults import TRANSACTION_STATE_TOPIC

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")

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


def refused_txn_markers(
    request: broker_pb2.WriteTxnMarkersRequest,
) -> broker_pb2.WriteTxnMarkersResponse:
    """CLUSTER_AUTHORIZATION_FAILED for every partition of every marker (nothing written)."""
    response = broker_pb2.WriteTxnMarkersResponse()
    for marker in request.markers:
        result = response.markers.add(producer_id=marker.producer_id)
        for tp in marker.partitions:
            result.partitions.add(topic=tp.topic, partition=tp.partition,
                                  error=_CLUSTER_AUTHORIZATION_FAILED)
    return response


class BrokerServicer(broker_pb2_grpc.BrokerServicer):
    """Serves Produce, Fetch, ListOffsets, Metadata, InitProducerId, FindCoordinator,
    DescribeConfigs, DescribeLogDirs and DeleteRecords for one broker (gRPC's method names).

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
        access: AccessControl = NO_AUTHORIZATION,
    ) -> None:
        self._replicas = replicas
        #: The ACL checks of both doors (this servicer's and the Kafka listener's handlers,
        #: which call the shared methods below with their caller).
        self.authorization = BrokerAuthorization(image, access)
        #: Inter-broker requests (a follower's Fetch, a coordinator's __consumer_offsets
        #: append) need the cluster service identity when this guard is enforced.
        self._cluster_action = cluster_action or ClusterActionGuard(enforced=False)
        self._log_dirs = log_dirs
        self._image = image
        self._producer_ids = producer_ids
        self._offsets_topic = offsets_topic
        self._metadata = MetadataResponder()
        #: ProduceStream/FetchStream calls being served (the broker ends them when it stops).
        self.open_streams = OpenStreams()

    async def Produce(
        self, request: broker_pb2.ProduceRequest, context: aio.ServicerContext
    ) -> broker_pb2.ProduceResponse:
        return await self.produce_from(grpc_caller(context), request)

    async def Fetch(
        self, request: broker_pb2.FetchRequest, context: aio.ServicerContext
    ) -> broker_pb2.FetchResponse | DetachedFetchResponse:
        """A fetch over gRPC; a follower's answer keeps its records apart from protobuf
        (fetch_wire.DetachedRecords), joined in once as gRPC serialises it
        (:func:`add_broker_service` registers that serializer)."""
        return await self.fetch_from(grpc_caller(context), request)

    async def produce_from(
        self, caller: Caller, request: broker_pb2.ProduceRequest
    ) -> broker_pb2.ProduceResponse:
        """A Produce as the gRPC method and the direct door (fjord.broker.direct_door) serve
        it: appending to a coordinator's internal topic needs the cluster service identity
        (where the cluster guard is enforced), then :meth:`produce`."""
        if any(t.name in (OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC) for t in request.topics) and not (
            self.cluster_action_allows(caller, "Produce to a coordinator's internal topic")
        ):
            return refused_produce(request)
        return await self.produce(caller, request)

    async def fetch_from(
        self, caller: Caller, request: broker_pb2.FetchRequest
    ) -> broker_pb2.FetchResponse | DetachedFetchResponse:
        """A Fetch as the gRPC method and the direct door serve it: a consumer's through
        :meth:`fetch`; a follower's needs the cluster service identity (where the cluster
        guard is enforced) and its answer keeps the records apart from protobuf
        (serialize_fetch_response joins them in once)."""
        if request.replica_id < 0:
            return await self.fetch(caller, request)
        if not self.cluster_action_allows(
            caller, f"follower Fetch (replica_id {request.replica_id})"
        ):
            return broker_pb2.FetchResponse(error=_CLUSTER_AUTHORIZATION_FAILED)
        detached = DetachedRecords()
        return detached.attach_to(await self.fetch(caller, request, detached=detached))

    async def ProduceStream(
        self, requests: AsyncIterator[broker_pb2.ProduceRequest], context: aio.ServicerContext
    ) -> AsyncIterator[broker_pb2.ProduceResponse]:
        """Produce requests on one stream (fjord.rpc_streams): each checked and appended as
        a unary Produce is, in arrival order, up to MAX_IN_FLIGHT_PRODUCE awaiting acks."""
        async for answer in self._serve_stream(
            requests, context, PRODUCE_STREAM_METHOD,
            counted_requests(PRODUCE_METHOD, lambda r: self.Produce(r, context)),
            MAX_IN_FLIGHT_PRODUCE,
        ):
            yield answer

    async def FetchStream(
        self, requests: AsyncIterator[broker_pb2.FetchRequest], context: aio.ServicerContext
    ) -> AsyncIterator[broker_pb2.FetchResponse | DetachedFetchResponse]:
        """Fetch requests on one stream (fjord.rpc_streams), each served as a unary Fetch
        is, one after the other."""
        async for answer in self._serve_stream(
            requests, context, FETCH_STREAM_METHOD,
            counted_requests(FETCH_METHOD, lambda r: self.Fetch(r, context)), 1,
        ):
            yield answer

    async def _serve_stream(
        self,
        requests: AsyncIterator[Req],
        context: aio.ServicerContext,
        stream_method: str,
        handle: Callable[[Req], Awaitable[Resp]],
        in_flight: int,
    ) -> AsyncIterator[Resp]:
        """One stream served: tracked for the broker's stop and in fjord_broker_open_streams,
        headers first, then ``handle``'s answers in request order."""
        with self.open_streams.serving(), open_stream(stream_method):
            await send_stream_headers(context)
            async for answer in answer_in_order(requests, handle, in_flight):
                yield answer

    async def WriteTxnMarkers(
        self, request: broker_pb2.WriteTxnMarkersRequest, context: aio.ServicerContext
    ) -> broker_pb2.WriteTxnMarkersResponse:
        if not self._cluster_action.allows(context, "WriteTxnMarkers"):
            return refused_txn_markers(request)
        return await self.write_txn_markers(grpc_caller(context), request)

    async def ListOffsets(
        self, request: broker_pb2.ListOffsetsRequest, context: aio.ServicerContext
    ) -> broker_pb2.ListOffsetsResponse:
        return self.list_offsets(grpc_caller(context), request)

    async def Metadata(
        self, request: broker_pb2.MetadataRequest, context: aio.ServicerContext
    ) -> broker_pb2.MetadataResponse:
        return self.metadata(request, grpc_caller(context))

    async def InitProducerId(
        self, request: broker_pb2.InitProducerIdRequest, context: aio.ServicerContext
    ) -> broker_pb2.InitProducerIdResponse:
        return await self.init_producer_id(request, grpc_caller(context))

    async def FindCoordinator(
        self, request: broker_pb2.FindCoordinatorRequest, context: aio.ServicerContext
    ) -> broker_pb2.FindCoordinatorResponse:
        return self.find_coordinator(request, grpc_caller(context))

    async def DescribeConfigs(
        self, request: broker_pb2.DescribeBrokerConfigsRequest, context: aio.ServicerContext
    ) -> broker_pb2.DescribeBrokerConfigsResponse:
        response = broker_pb2.DescribeBrokerConfigsResponse(broker_id=self._replicas.broker_id)
        caller = grpc_caller(context)
        if not self.authorization.allows(caller, AclOperation.DESCRIBE_CONFIGS,
                                         Resource.cluster()):
            # The message has no error field: an unauthorized caller sees no entries.
            return response
        image = self._image()
        entries = (
            describe_default_broker_config(image.cluster_config) if request.default
            else describe_broker_config(self._replicas.static_config, image.cluster_config,
                                        image.broker_config(self._replicas.broker_id))
        )
        for entry in entries:
            response.entries.add(name=entry.name, value=entry.value, source=entry.source,
                                 is_default=entry.source == "DEFAULT")  # fmt: skip
        return response

    async def DescribeLogDirs(
        self, request: broker_pb2.DescribeLogDirsRequest, context: aio.ServicerContext
    ) -> broker_pb2.DescribeLogDirsResponse:
        if not self.authorization.allows(grpc_caller(context), AclOperation.DESCRIBE,
                                         Resource.cluster()):
            return broker_pb2.DescribeLogDirsResponse(error=common_pb2.Error(
                code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code,
                message="not authorized to Describe the cluster",
            ))
        if self._log_dirs is None:
            response = broker_pb2.DescribeLogDirsResponse()
            response.error.code = ErrorCode.UNKNOWN_SERVER_ERROR.code
            response.error.message = "this broker does not describe its log directory"
            return response
        return self._log_dirs()

    async def DeleteRecords(
        self, request: broker_pb2.DeleteRecordsRequest, context: aio.ServicerContext
    ) -> broker_pb2.DeleteRecordsResponse:
        return self.delete_records(grpc_caller(context), request)

    # --- shared with the Kafka listener (fjord.broker.kafka_apis): every ACL check is here ---

    def cluster_action_allows(self, caller: Caller, what: str) -> bool:
        """The service-identity rule of inter-broker requests (for every door): where the
        cluster guard is enforced (mutual TLS), only the cluster's service identity passes."""
        if not self._cluster_action.enforced or caller.principal.is_service:
            return True
        self._cluster_action.refused += 1
        log.warning("refused %s from %s (%s): not the cluster service identity "
                    "(CLUSTER_AUTHORIZATION_FAILED)", what, caller.principal, caller.host)
        return False

    def delete_records(
        self, caller: Caller, request: broker_pb2.DeleteRecordsRequest
    ) -> broker_pb2.DeleteRecordsResponse:
        """Kafka's DeleteRecords on this leader, per partition: Delete on the topic, then
        ReplicaManager.delete_records (OFFSET_OUT_OF_RANGE above the high watermark, nothing
        changed). Each partition is answered on its own, as Kafka does."""
        response = broker_pb2.DeleteRecordsResponse()
        for topic in request.topics:
            out = response.topics.add(name=topic.name)
            for p in topic.partitions:
                result = out.partitions.add(partition=p.partition, low_watermark=-1)
                try:
                    self.authorization.require(caller, AclOperation.DELETE,
                                               Resource.topic(topic.name))
                    result.low_watermark = self._replicas.delete_records(
                        topic.name, p.partition, p.offset
                    )
                except FjordError as exc:
                    result.error.code = exc.code.code
                    result.error.message = str(exc)
        return response

    async def produce(
        self, caller: Caller, request: broker_pb2.ProduceRequest | ProduceInput
    ) -> broker_pb2.ProduceResponse:
        """Append what ``caller`` may write (Write on the topic); refused topics are answered
        TOPIC_AUTHORIZATION_FAILED and nothing of them is appended. Transactional records
        also need Write on the request's TransactionalId (Kafka's rule): without it every
        partition is TRANSACTIONAL_ID_AUTHORIZATION_FAILED and nothing is appended.

        ``request`` may be any :class:`ProduceInput` (the Kafka listener's view of a Kafka
        request, whose records never go through protobuf) only while authorization is off
        (:attr:`produce_needs_protobuf` False); the checks split and copy protobuf requests."""
        gate = self.authorization
        if not gate.enabled:
            return await self._replicas.produce(request)
        if not isinstance(request, broker_pb2.ProduceRequest):
            raise TypeError("a produce request with authorization on must be protobuf's")
        if gate.refuse_transactional_produce(caller, request):
            return gate.refused_produce(
                request, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                f"{caller.principal} is not authorized to Write transactional id "
                f"{request.transactional_id!r}",
            )
        allowed, refused = gate.split_topics(caller, AclOperation.WRITE, request)
        response = (
            await self._replicas.produce(allowed) if allowed.topics or not refused
            else broker_pb2.ProduceResponse()
        )
        gate.refuse_produce(caller, refused, response)
        return response

    @property
    def produce_needs_protobuf(self) -> bool:
        """Whether :meth:`produce` needs a protobuf request (authorization is on)."""
        return bool(self.authorization.enabled)

    async def fetch(
        self, caller: Caller, request: broker_pb2.FetchRequest, *, open_session: bool = False,
        region_marker: RegionMarker | None = None, detached: DetachedRecords | None = None,
    ) -> broker_pb2.FetchResponse:
        """A follower's fetch needs ClusterAction on the cluster, a consumer's Read on each
        topic (refused topics: TOPIC_AUTHORIZATION_FAILED, nothing read). ``open_session``:
        a consumer's fetch with session epoch 0 opens a fetch session (Kafka's numbering; the
        Kafka listener's), else it is sessionless (fjord.client's gRPC fetches).
        ``region_marker``: zero copy; ``detached``: a follower's records kept out of the
        answer (both: see ReplicaManager.fetch)."""
        gate = self.authorization
        if request.replica_id >= 0:
            if not gate.allows(caller, AclOperation.CLUSTER_ACTION, Resource.cluster()):
                return broker_pb2.FetchResponse(error=common_pb2.Error(
                    code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code,
                    message=f"{caller.principal} is not authorized to ClusterAction the cluster",
                ))
            return await self._replicas.fetch(request, detached=detached)
        allowed, refused = gate.split_topics(caller, AclOperation.READ, request)
        response = (
            await self._replicas.fetch(
                allowed, open_session=open_session, region_marker=region_marker
            )
            if allowed.topics or not refused or request.session_epoch > 0
            else broker_pb2.FetchResponse()
        )
        gate.refuse_fetch(caller, refused, response)
        return response

    async def write_txn_markers(
        self, caller: Caller, request: broker_pb2.WriteTxnMarkersRequest
    ) -> broker_pb2.WriteTxnMarkersResponse:
        """Kafka's WriteTxnMarkers: ClusterAction on the cluster (the transaction coordinator,
        which runs as the cluster's service identity), else CLUSTER_AUTHORIZATION_FAILED for
        every partition and nothing written."""
        if not self.authorization.allows(caller, AclOperation.CLUSTER_ACTION, Resource.cluster()):
            return refused_txn_markers(request)
        return await self._replicas.write_txn_markers(request)

    def list_offsets(
        self, caller: Caller, request: broker_pb2.ListOffsetsRequest
    ) -> broker_pb2.ListOffsetsResponse:
        """Offsets of the topics ``caller`` may describe (others TOPIC_AUTHORIZATION_FAILED)."""
        gate = self.authorization
        allowed, refused = gate.split_topics(caller, AclOperation.DESCRIBE, request)
        response = (
            self._replicas.list_offsets(allowed) if allowed.topics or not refused
            else broker_pb2.ListOffsetsResponse()
        )
        gate.refuse_list_offsets(caller, refused, response)
        return response

    def metadata(
        self, request: broker_pb2.MetadataRequest, caller: Caller
    ) -> broker_pb2.MetadataResponse:
        """The Metadata answer from the newest applied image (all-topics answers cached),
        without the topics ``caller`` may not describe."""
        image = self._image()
        response = self._metadata.respond(image, request)
        response = self.authorization.filter_metadata(caller, request, response)
        if SASL_SESSION_PRINCIPAL.get() is not None:
            # Came in through the SASL gRPC door: point the client at the brokers' doors
            # (Kafka's answer per listener name); the mTLS addresses would refuse it.
            response = brokers_by_sasl_door(response, image)
        return response

    async def init_producer_id(
        self, request: broker_pb2.InitProducerIdRequest, caller: Caller
    ) -> broker_pb2.InitProducerIdResponse:
        """A new producer id and epoch 0 for a caller with IdempotentWrite on the cluster (or
        Write on some topic); a transactional id is answered NOT_COORDINATOR (its transaction
        coordinator serves it)."""
        response = broker_pb2.InitProducerIdResponse(producer_id=-1, producer_epoch=-1)
        if not request.transactional_id and not (
            self.authorization.allows_idempotent_producer(caller)
        ):
            response.error.code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code
            response.error.message = (
                f"{caller.principal} is not authorized to IdempotentWrite the cluster"
            )
            return response
        try:
            if request.transactional_id:
                raise FjordError(
                    "a transactional producer's InitProducerId goes to its transaction "
                    "coordinator (FindCoordinator key_type 1)",
                    ErrorCode.NOT_COORDINATOR,
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
        self, request: broker_pb2.FindCoordinatorRequest, caller: Caller
    ) -> broker_pb2.FindCoordinatorResponse:
        """The coordinator of a group (id and gRPC address) for a caller with Describe on the
        group; the first lookup while ``__consumer_offsets`` does not exist asks the controller
        to create it."""
        response = broker_pb2.FindCoordinatorResponse(partition=-1)
        image = self._image()
        try:
            if request.key_type == 0:
                self.authorization.require(caller, AclOperation.DESCRIBE,
                                           Resource.group(request.key))
            elif request.key_type == KEY_TYPE_TRANSACTION:
                self.authorization.require(caller, AclOperation.DESCRIBE,
                                           Resource.transactional_id(request.key))
            found = locate_group_coordinator(image, request.key, request.key_type)
        except FjordError as exc:
            if (
                exc.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
                and self._offsets_topic is not None
                and missing_coordinator_topics(image, request.key_type)
            ):
                self._offsets_topic.transactions_asked |= request.key_type == KEY_TYPE_TRANSACTION
                self._offsets_topic.request()  # Kafka's way: created by the first valid lookup
            response.error.code = exc.code.code
            response.error.message = str(exc)
            return response
        response.partition = found.partition
        response.coordinator.id = found.registration.id
        registration = found.registration
        if SASL_SESSION_PRINCIPAL.get() is not None:
            # Asked through the SASL gRPC door: the coordinator's door (its mTLS port would
            # refuse this client); none is COORDINATOR_NOT_AVAILABLE, as Kafka without the
            # client's listener on the coordinator.
            if registration.sasl_host is None or not registration.sasl_port:
                response.error.code = ErrorCode.COORDINATOR_NOT_AVAILABLE.code
                response.error.message = (
                    f"coordinator {registration.id} has no SASL gRPC door (--sasl-listen)"
                )
                return response
            response.coordinator.host = registration.sasl_host
            response.coordinator.port = registration.sasl_port
            return response
        response.coordinator.host = registration.host
        response.coordinator.port = registration.port
        return response


#: The Broker service's full name (its methods' paths start with it).
BROKER_SERVICE = "fjord.v1.Broker"


#: The unary methods a stream's requests are counted under in the RPC metrics (the stream
#: itself is one RPC of its own name to the interceptors; see :func:`counted_requests`).
PRODUCE_METHOD = "fjord.v1.Broker/Produce"
FETCH_METHOD = "fjord.v1.Broker/Fetch"
PRODUCE_STREAM_METHOD = "fjord.v1.Broker/ProduceStream"
FETCH_STREAM_METHOD = "fjord.v1.Broker/FetchStream"


def counted_requests(
    method: str, handle: Callable[[Req], Awaitable[Resp]]
) -> Callable[[Req], Coroutine[Any, Any, Resp]]:
    """``handle`` with one ``fjord_rpc_server_*`` sample per request under ``method``, so a
    request that came on a stream (or through the direct door, fjord.broker.direct_door)
    counts as the unary call it replaces (no span: such requests carry no trace context of
    their own)."""

    async def counted(request: Req) -> Resp:
        start = time.perf_counter()
        code = "UNKNOWN"
        try:
            answer = await handle(request)
            code = "OK"
            return answer
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        finally:
            record_rpc("server", "broker", method, code, time.perf_counter() - start)

    return counted


def add_broker_service(
    servicer: BrokerServicer, server: aio.Server, *, streams: bool = True
) -> None:
    """Serve ``servicer`` on ``server`` as the generated ``add_BrokerServicer_to_server``
    does, except that Fetch answers are serialised by
    :func:`fjord.broker.fetch_wire.serialize_fetch_response` (a follower's answer arrives as
    a DetachedFetchResponse), and without ProduceStream/FetchStream unless ``streams``
    (a SASL door checks a session when a call starts: a stream would outlive the session,
    so there the clients' requests stay unary calls, after one UNIMPLEMENTED)."""
    methods: dict[str, grpc.RpcMethodHandler] = {}

    class Capture:
        def add_generic_rpc_handlers(self, _handlers: object) -> None:
            pass  # rebuilt below from the registered methods

        def add_registered_method_handlers(
            self, _service: str, handlers: dict[str, grpc.RpcMethodHandler]
        ) -> None:
            methods.update(handlers)

    broker_pb2_grpc.add_BrokerServicer_to_server(servicer, Capture())
    fetch = methods["Fetch"]
    methods["Fetch"] = grpc.unary_unary_rpc_method_handler(
        fetch.unary_unary,
        request_deserializer=fetch.request_deserializer,
        response_serializer=serialize_fetch_response,
    )
    fetch_stream = methods["FetchStream"]
    methods["FetchStream"] = grpc.stream_stream_rpc_method_handler(
        fetch_stream.stream_stream,
        request_deserializer=fetch_stream.request_deserializer,
        response_serializer=serialize_fetch_response,
    )
    if not streams:
        del methods["ProduceStream"], methods["FetchStream"]
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(BROKER_SERVICE, methods),)
    )
    server.add_registered_method_handlers(BROKER_SERVICE, methods)
