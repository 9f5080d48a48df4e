"""The broker's Kafka-protocol handlers: each translates one Kafka request to the same cores the
gRPC servicer calls (ReplicaManager for Produce/Fetch/ListOffsets, the servicer's shared methods
for Metadata and InitProducerId) and translates the answer back. No protocol logic here.

RecordBatch bytes pass through untouched both ways: Produce hands the request's ``records`` to
the append path as they arrived, Fetch returns the log's bytes as read (or their file region,
for sendfile). Produce and Fetch are decoded and encoded by fjord.kafka.fastpath (hand-written,
checked against kafka-python's classes by property tests), every other API by kafka-python.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kafka.protocol.admin.groups import ListGroupsRequest
from kafka.protocol.admin.topics import (
    DeleteRecordsRequest,
)
from kafka.protocol.admin.transactions import ListTransactionsRequest
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.consumer.offsets import (
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
)
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.protocol.producer.produce import ProduceRequest
from kafka.protocol.producer.transaction import (
    InitProducerIdRequest,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)

from fjord._proto import broker_pb2, common_pb2
from fjord.broker.fetch_session import FINAL_EPOCH, NO_SESSION
from fjord.broker.replica_manager import ReplicaManager
from fjord.broker.service import BrokerServicer, refused_txn_markers
from fjord.kafka.admin import (
    BrokerAdminHandlers,
)
from fjord.kafka.dispatch import Api, KafkaDispatcher, RequestContext
from fjord.kafka.fastpath import (
    FETCH_VERSIONS,
    PRODUCE_VERSIONS,
    EncodedResponse,
    FetchResponseWriter,
    ProduceResponseWriter,
    decode_fetch_request,
    decode_produce_request,
)
from fjord.kafka.groups import (
    FIND_COORDINATOR_VERSIONS,
    LIST_GROUPS_VERSIONS,
    FindCoordinatorHandler,
    list_no_groups,
)
from fjord.kafka.metadata import KafkaMetadata
from fjord.kafka.producer_ids import (
    INIT_PRODUCER_ID_VERSIONS,
    init_producer_id_pb,
    init_producer_id_response,
)
from fjord.kafka.transactions import LIST_TRANSACTIONS_VERSIONS, list_no_transactions
from fjord.kafka.zerocopy import FileBackedResponse
from fjord.metadata import MetadataImage
from fjord.metadata.schema import kafka_endpoint
from fjord.observability import metrics
from fjord.storage.region import FileRegion

#: Kafka's "no session" fetch session id.
NO_FETCH_SESSION = NO_SESSION


class _ProducePartition:
    __slots__ = ("partition", "records")

    #: Kafka clients never send the group coordinator's fence (Fjord's own coordinators
    #: append to __consumer_offsets over gRPC): 0, protobuf's default.
    coordinator_epoch = 0

    def __init__(self, partition: int, records: bytes) -> None:
        self.partition = partition
        self.records = records


class _ProduceTopic:
    __slots__ = ("name", "partitions")

    def __init__(self, name: str, partitions: list[_ProducePartition]) -> None:
        self.name = name
        self.partitions = partitions


class KafkaProduceInput:
    """A decoded Kafka Produce request as the append path reads it
    (fjord.broker.replica_manager.ProduceInput): the request's record bytes as decoded,
    without a protobuf copy."""

    __slots__ = ("acks", "timeout_ms", "topics")

    def __init__(self, request: Any) -> None:
        self.acks: int = request.acks
        self.timeout_ms: int = request.timeout_ms
        self.topics = [
            _ProduceTopic(topic.name, [_ProducePartition(p.index, p.records or b"")
                                       for p in topic.partition_data])
            for topic in request.topic_data
        ]


class BrokerKafkaHandlers:
    """Kafka API handlers of one broker.

    Invariant: answers come from the ReplicaManager's state and the newest applied metadata
    image, exactly as the gRPC servicer's; brokers are named by their Kafka listener address
    (a broker without one is left out of Metadata, and partitions it leads carry
    LISTENER_NOT_FOUND, as in Kafka).
    """

    def __init__(
        self,
        broker_id: int,
        replicas: ReplicaManager,
        servicer: BrokerServicer,
        image: Callable[[], MetadataImage],
        admin: BrokerAdminHandlers,
        groups: FindCoordinatorHandler,
    ) -> None:
        self._broker_id = broker_id
        self._replicas = replicas
        self._servicer = servicer
        self._image = image
        self._admin = admin
        self._metadata = KafkaMetadata(image, servicer.metadata, self._controller_id)
        self._groups = groups

    def apis(self) -> list[Api]:
        """Every API this broker serves over Kafka's protocol, with its tested versions."""
        admin, groups = self._admin, self._groups
        return [
            Api(0, *PRODUCE_VERSIONS, ProduceRequest, self.produce,
                decoder=decode_produce_request),
            Api(1, *FETCH_VERSIONS, FetchRequest, self.fetch, decoder=decode_fetch_request),
            Api(2, 1, 8, ListOffsetsRequest, self.list_offsets),
            Api(3, 0, 12, MetadataRequest, self._metadata.metadata),
            Api(10, *FIND_COORDINATOR_VERSIONS, FindCoordinatorRequest, groups.find_coordinator),
            Api(16, *LIST_GROUPS_VERSIONS, ListGroupsRequest, list_no_groups),
            Api(21, 0, 2, DeleteRecordsRequest, admin.delete_records),
            Api(22, *INIT_PRODUCER_ID_VERSIONS, InitProducerIdRequest, self.init_producer_id),
            Api(23, 2, 4, OffsetForLeaderEpochRequest, admin.offset_for_leader_epoch),
            Api(27, 1, 1, WriteTxnMarkersRequest, self.write_txn_markers),
            Api(66, *LIST_TRANSACTIONS_VERSIONS, ListTransactionsRequest, list_no_transactions),
            *admin.cluster_apis(),
        ]

    def dispatcher(self) -> KafkaDispatcher:
        return KafkaDispatcher(self.apis())

    def _controller_id(self, image: MetadataImage, listener: str) -> int:
        """This broker: it forwards the controller's requests (see KafkaMetadata)."""
        broker = image.brokers.get(self._broker_id)
        if broker is None or kafka_endpoint(broker, listener) is None:
            return -1
        return self._broker_id

    # --- Produce --------------------------------------------------------------------------------

    async def produce(self, request: Any, ctx: RequestContext) -> Any:
        if self._servicer.produce_needs_protobuf:
            pb = broker_pb2.ProduceRequest(
                acks=request.acks,
                timeout_ms=request.timeout_ms,
                transactional_id=request.transactional_id or "",
            )
            for topic in request.topic_data:
                pb_topic = pb.topics.add(name=topic.name)
                for p in topic.partition_data:
                    pb_topic.partitions.add(partition=p.index, records=p.records or b"")
            answer = await self._servicer.produce(ctx.caller, pb)
        else:
            # Without authorization the records go to the append path as decoded, not
            # through protobuf (each protobuf set and read of a bytes field copies it).
            answer = await self._servicer.produce(ctx.caller, KafkaProduceInput(request))
        if request.acks == 0:
            return None
        out = ProduceResponseWriter(ctx.api_version, 0, len(answer.topics))
        for t in answer.topics:
            out.topic(t.name, len(t.partitions))
            for p in t.partitions:
                code = p.error.code
                out.partition(p.partition, code, p.base_offset, p.log_append_time_ms,
                              p.log_start_offset if code == 0 else -1,
                              p.error.message or None)
            out.end_topic()
        return out.finish()

    # --- Fetch ----------------------------------------------------------------------------------

    async def fetch(self, request: Any, ctx: RequestContext) -> Any:
        version = ctx.api_version
        # Kafka clients fetch as consumers: replication between Fjord brokers is gRPC only.
        # From v7 on, the client's fetch session (KIP-227) is honoured: epoch 0 opens one,
        # -1 fetches without, N continues it (only changed partitions sent, only news
        # answered); before v7 every fetch is full and sessionless.
        pb = broker_pb2.FetchRequest(
            replica_id=-1,
            max_wait_ms=request.max_wait_ms,
            min_bytes=request.min_bytes,
            max_bytes=request.max_bytes,
            isolation_level=request.isolation_level,
            session_id=request.session_id if version >= 7 else NO_FETCH_SESSION,
            session_epoch=request.session_epoch if version >= 7 else FINAL_EPOCH,
        )
        if version >= 7:
            for forgotten in request.forgotten_topics_data or ():
                pb.forgotten.add(name=forgotten.topic, partitions=forgotten.partitions)
        for topic in request.topics:
            pb_topic = pb.topics.add(name=topic.topic)
            for p in topic.partitions:
                pb_topic.partitions.add(
                    partition=p.partition,
                    fetch_offset=p.fetch_offset,
                    partition_max_bytes=p.partition_max_bytes,
                    current_leader_epoch=p.current_leader_epoch if version >= 9 else -1,
                    last_fetched_epoch=-1,
                )
        # Zero copy on plaintext doors: records of verified segments stay in their files
        # (markers here), the listener sendfiles them (fjord.kafka.zerocopy).
        file_backed = (
            FileBackedResponse(None) if ctx.zero_copy else None
        )
        answer = await self._servicer.fetch(
            ctx.caller, pb, open_session=True,
            region_marker=None if file_backed is None else file_backed.add,
        )
        regions = file_backed.regions if file_backed is not None else {}
        try:
            response = self._fetch_response(version, answer, regions,
                                            read_committed=request.isolation_level == 1)
        except BaseException:
            for region in regions.values():
                region.close()
            raise
        return response

    @staticmethod
    def _fetch_response(
        version: int, answer: broker_pb2.FetchResponse, regions: dict[bytes, FileRegion],
        read_committed: bool,
    ) -> EncodedResponse:
        """The Kafka Fetch response of ``answer``: records whose bytes are a key of
        ``regions`` (zero copy's markers) go as that file region, the rest as bytes."""
        top_error = answer.error.code
        out = FetchResponseWriter(version, 0, top_error if version >= 7 else 0,
                                  answer.session_id, len(answer.topics))
        copied = 0
        for t in answer.topics:
            out.topic(t.name, len(t.partitions))
            for p in t.partitions:
                records: bytes | FileRegion = p.records
                if p.records:
                    region = regions.get(p.records)
                    if region is None:
                        copied += len(p.records)  # zero copy off, or a segment not verified
                    else:
                        records = region
                out.partition(
                    p.partition, p.error.code or top_error, p.high_watermark,
                    p.last_stable_offset, p.log_start_offset,
                    # Kafka's clients expect null unless read_committed (v4+).
                    [(a.producer_id, a.first_offset) for a in p.aborted_transactions]
                    if read_committed else None,
                    -1, records, p.leader_id, p.leader_epoch,
                )
            out.end_topic()
        if copied:
            metrics.record_fetch_record_bytes("copied", copied)
        return out.finish()

    # --- ListOffsets ----------------------------------------------------------------------------

    async def list_offsets(self, request: Any, ctx: RequestContext) -> Any:
        version = ctx.api_version
        pb = broker_pb2.ListOffsetsRequest(
            replica_id=request.replica_id,
            isolation_level=request.isolation_level if version >= 2 else 0,
        )
        for topic in request.topics:
            pb_topic = pb.topics.add(name=topic.name)
            for p in topic.partitions:
                pb_topic.partitions.add(
                    partition=p.partition_index,
                    timestamp=p.timestamp,
                    current_leader_epoch=p.current_leader_epoch if version >= 4 else -1,
                )
        answer = self._servicer.list_offsets(ctx.caller, pb)
        cls = ListOffsetsResponse[version]
        topic_cls = cls.ListOffsetsTopicResponse
        part_cls = topic_cls.ListOffsetsPartitionResponse
        return cls(
            throttle_time_ms=0,
            topics=[
                topic_cls(
                    name=t.name,
                    partitions=[
                        part_cls(
                            partition_index=p.partition,
                            error_code=p.error.code,
                            timestamp=p.timestamp,
                            offset=p.offset,
                            leader_epoch=p.leader_epoch,
                        )
                        for p in t.partitions
                    ],
                )
                for t in answer.topics
            ],
        )

    # --- WriteTxnMarkers ------------------------------------------------------------------------

    async def write_txn_markers(self, request: Any, ctx: RequestContext) -> Any:
        """Kafka's WriteTxnMarkers (API 27) for the service identity (and ClusterAction on the
        cluster), the same rule as the gRPC door's; answered once the markers are replicated."""
        pb = broker_pb2.WriteTxnMarkersRequest()
        for m in request.markers:
            pb.markers.add(
                producer_id=m.producer_id,
                producer_epoch=m.producer_epoch,
                committed=m.transaction_result,
                coordinator_epoch=m.coordinator_epoch,
                partitions=[
                    common_pb2.TopicPartition(topic=t.name, partition=index)
                    for t in m.topics
                    for index in t.partition_indexes
                ],
            )
        if self._servicer.cluster_action_allows(ctx.caller, "Kafka WriteTxnMarkers"):
            answer = await self._servicer.write_txn_markers(ctx.caller, pb)
        else:
            answer = refused_txn_markers(pb)
        cls = WriteTxnMarkersResponse[ctx.api_version]
        result_cls = cls.WritableTxnMarkerResult
        topic_cls = result_cls.WritableTxnMarkerTopicResult
        part_cls = topic_cls.WritableTxnMarkerPartitionResult
        markers = []
        for result in answer.markers:
            by_topic: dict[str, list[Any]] = {}
            for p in result.partitions:
                by_topic.setdefault(p.topic, []).append(
                    part_cls(partition_index=p.partition, error_code=p.error.code)
                )
            markers.append(result_cls(
                producer_id=result.producer_id,
                topics=[topic_cls(name=name, partitions=parts) for name, parts in by_topic.items()],
            ))
        return cls(markers=markers)

    # --- InitProducerId -------------------------------------------------------------------------

    async def init_producer_id(self, request: Any, ctx: RequestContext) -> Any:
        answer = await self._servicer.init_producer_id(init_producer_id_pb(request), ctx.caller)
        return init_producer_id_response(answer, ctx.api_version)
