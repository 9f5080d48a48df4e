"""The transaction APIs of a coordinator's Kafka listener: InitProducerId with a
``transactional_id`` (22), AddPartitionsToTxn (24), AddOffsetsToTxn (25), EndTxn (26) and
TxnOffsetCommit (28). Each only translates Kafka's messages (kafka-python's classes from Kafka's
JSON specs) to :class:`~fjord.coordinator.authorization.AuthorizedTransactions` and the group
manager, the same cores the gRPC door uses.

Versions: AddPartitionsToTxn 0-3 (v4+ is Kafka's broker-to-coordinator verification),
AddOffsetsToTxn 0-3, EndTxn 0-3 and TxnOffsetCommit 0-3 (v4+/v5 belong to Kafka's
transactions v2, KIP-890, which Fjord does not implement).
"""

from __future__ import annotations

from typing import Any

from kafka.protocol.producer.transaction import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)

from fjord.coordinator.authorization import AuthorizedGroups, AuthorizedTransactions
from fjord.coordinator.group import OffsetCommitRequestPartition
from fjord.errors import ErrorCode, FjordError
from fjord.kafka.dispatch import Api, RequestContext
from fjord.topic_partition import TopicPartition

ADD_PARTITIONS_TO_TXN_VERSIONS = (0, 3)
ADD_OFFSETS_TO_TXN_VERSIONS = (0, 3)
END_TXN_VERSIONS = (0, 3)
TXN_OFFSET_COMMIT_VERSIONS = (0, 3)


def _error(exc: BaseException) -> ErrorCode:
    return exc.code if isinstance(exc, FjordError) else ErrorCode.UNKNOWN_SERVER_ERROR


class TransactionKafkaHandlers:
    """Kafka's transaction APIs over one coordinator's cores."""

    def __init__(self, transactions: AuthorizedTransactions, groups: AuthorizedGroups) -> None:
        self._transactions = transactions
        self._groups = groups

    def apis(self) -> list[Api]:
        return [
            Api(24, *ADD_PARTITIONS_TO_TXN_VERSIONS, AddPartitionsToTxnRequest,
                self.add_partitions_to_txn),
            Api(25, *ADD_OFFSETS_TO_TXN_VERSIONS, AddOffsetsToTxnRequest,
                self.add_offsets_to_txn),
            Api(26, *END_TXN_VERSIONS, EndTxnRequest, self.end_txn),
            Api(28, *TXN_OFFSET_COMMIT_VERSIONS, TxnOffsetCommitRequest,
                self.txn_offset_commit),
        ]

    async def init_producer_id(self, request: Any, ctx: RequestContext) -> Any:
        """InitProducerId with a transactional id (the door sends the others to a broker)."""
        version = ctx.api_version
        pid, epoch, error = -1, -1, ErrorCode.NONE
        try:
            pid, epoch = await self._transactions.init_producer_id(
                ctx.caller,
                request.transactional_id,
                request.transaction_timeout_ms,
                request.producer_id if version >= 3 else -1,
                request.producer_epoch if version >= 3 else -1,
            )
        except Exception as exc:
            error = _error(exc)
        return InitProducerIdResponse[version](
            throttle_time_ms=0, error_code=error.code, producer_id=pid, producer_epoch=epoch
        )

    async def add_partitions_to_txn(self, request: Any, ctx: RequestContext) -> Any:
        cls = AddPartitionsToTxnResponse[ctx.api_version]
        wanted = [
            TopicPartition(topic.name, p)
            for topic in request.v3_and_below_topics
            for p in topic.partitions
        ]
        try:
            errors = await self._transactions.add_partitions(
                ctx.caller,
                request.v3_and_below_transactional_id,
                request.v3_and_below_producer_id,
                request.v3_and_below_producer_epoch,
                wanted,
            )
        except Exception as exc:
            errors = dict.fromkeys(wanted, _error(exc))
        topic_cls = cls.AddPartitionsToTxnTopicResult
        part_cls = topic_cls.AddPartitionsToTxnPartitionResult
        by_topic: dict[str, list[Any]] = {}
        for (name, partition), code in errors.items():
            by_topic.setdefault(name, []).append(
                part_cls(partition_index=partition, partition_error_code=code.code)
            )
        return cls(
            throttle_time_ms=0,
            results_by_topic_v3_and_below=[
                topic_cls(name=name, results_by_partition=parts)
                for name, parts in by_topic.items()
            ],
        )

    async def add_offsets_to_txn(self, request: Any, ctx: RequestContext) -> Any:
        error = ErrorCode.NONE
        try:
            await self._transactions.add_offsets(
                ctx.caller, request.transactional_id, request.producer_id,
                request.producer_epoch, request.group_id,
            )
        except Exception as exc:
            error = _error(exc)
        return AddOffsetsToTxnResponse[ctx.api_version](throttle_time_ms=0, error_code=error.code)

    async def end_txn(self, request: Any, ctx: RequestContext) -> Any:
        error = ErrorCode.NONE
        try:
            await self._transactions.end_transaction(
                ctx.caller, request.transactional_id, request.producer_id,
                request.producer_epoch, request.committed,
            )
        except Exception as exc:
            error = _error(exc)
        return EndTxnResponse[ctx.api_version](throttle_time_ms=0, error_code=error.code)

    async def txn_offset_commit(self, request: Any, ctx: RequestContext) -> Any:
        version = ctx.api_version
        cls = TxnOffsetCommitResponse[version]
        offsets: dict[TopicPartition, OffsetCommitRequestPartition] = {}
        for topic in request.topics:
            for p in topic.partitions:
                offsets[TopicPartition(topic.name, p.partition_index)] = (
                    OffsetCommitRequestPartition(
                        p.committed_offset,
                        p.committed_leader_epoch if version >= 2 else -1,
                        p.committed_metadata or "",
                    )
                )
        try:
            self._transactions.require_writer(ctx.caller, request.transactional_id)
            errors = await self._groups.for_caller(ctx.caller).txn_commit_offsets(
                request.group_id,
                producer_id=request.producer_id,
                member_id=request.member_id if version >= 3 else "",
                generation_id=request.generation_id if version >= 3 else -1,
                group_instance_id=(request.group_instance_id or None) if version >= 3 else None,
                offsets=offsets,
            )
        except Exception as exc:
            errors = dict.fromkeys(offsets, _error(exc))
        topic_cls = cls.TxnOffsetCommitResponseTopic
        part_cls = topic_cls.TxnOffsetCommitResponsePartition
        by_topic: dict[str, list[Any]] = {}
        for (name, partition), code in sorted(errors.items()):
            by_topic.setdefault(name, []).append(
                part_cls(partition_index=partition, error_code=code.code)
            )
        return cls(
            throttle_time_ms=0,
            topics=[topic_cls(name=name, partitions=parts) for name, parts in by_topic.items()],
        )
