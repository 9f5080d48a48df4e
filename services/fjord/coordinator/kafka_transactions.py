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

from kafka.protocol.admin.transactions import (
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
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
from fjord.coordinator.manager import wall_clock_ms
from fjord.errors import ErrorCode, FjordError
from fjord.kafka.dispatch import Api, RequestContext
from fjord.kafka.transactions import LIST_TRANSACTIONS_VERSIONS
from fjord.topic_partition import TopicPartition
from fjord.transactions.state import TxnState

ADD_PARTITIONS_TO_TXN_VERSIONS = (0, 3)
ADD_OFFSETS_TO_TXN_VERSIONS = (0, 3)
END_TXN_VERSIONS = (0, 3)
TXN_OFFSET_COMMIT_VERSIONS = (0, 3)
DESCRIBE_TRANSACTIONS_VERSIONS = (0, 0)


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
            Api(65, *DESCRIBE_TRANSACTIONS_VERSIONS, DescribeTransactionsRequest,
                self.describe_transactions),
            Api(66, *LIST_TRANSACTIONS_VERSIONS, ListTransactionsRequest,
                self.list_transactions),
        ]

    async def describe_transactions(self, request: Any, ctx: RequestContext) -> Any:
        cls = DescribeTransactionsResponse[ctx.api_version]
        state_cls = cls.TransactionState
        states = []
        for tid in request.transactional_ids or []:
            try:
                record = self._transactions.describe(ctx.caller, tid)
            except Exception as exc:
                states.append(state_cls(
                    error_code=_error(exc).code, transactional_id=tid, transaction_state="",
                    transaction_timeout_ms=0, transaction_start_time_ms=-1, producer_id=-1,
                    producer_epoch=-1, topics=[],
                ))
                continue
            by_topic: dict[str, list[int]] = {}
            for tp in sorted(record.partitions):
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            states.append(state_cls(
                error_code=0, transactional_id=tid,
                transaction_state=record.state.kafka_name,
                transaction_timeout_ms=record.timeout_ms,
                transaction_start_time_ms=record.txn_start_ms,
                producer_id=record.producer_id, producer_epoch=record.producer_epoch,
                topics=[state_cls.TopicData(topic=t, partitions=ps)
                        for t, ps in by_topic.items()],
            ))
        return cls(throttle_time_ms=0, transaction_states=states)

    async def list_transactions(self, request: Any, ctx: RequestContext) -> Any:
        """Kafka's ListTransactions: this coordinator's transactional ids, filtered by state
        (Kafka's names), producer id and (v1) minimum running time in ms."""
        cls = ListTransactionsResponse[ctx.api_version]
        wanted_states = set(request.state_filters or [])
        known = {state.kafka_name for state in TxnState}
        unknown = sorted(wanted_states - known)
        pids = set(request.producer_id_filters or [])
        min_duration = request.duration_filter if ctx.api_version >= 1 else -1
        error, records = self._transactions.list_transactions(ctx.caller)
        now = wall_clock_ms()
        chosen = [
            r for r in records
            if (not wanted_states or r.state.kafka_name in wanted_states)
            and (not pids or r.producer_id in pids)
            and (min_duration is None or min_duration < 0
                 or (r.txn_start_ms >= 0 and now - r.txn_start_ms >= min_duration))
        ]
        return cls(
            throttle_time_ms=0, error_code=error.code, unknown_state_filters=unknown,
            transaction_states=[
                cls.TransactionState(transactional_id=r.transactional_id,
                                     producer_id=r.producer_id,
                                     transaction_state=r.state.kafka_name)
                for r in chosen
            ],
        )

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
