"""The gRPC face of the group coordinator (proto/fjord/v1/coordinator.proto): translates
``fjord.v1.Coordinator`` calls to :class:`~fjord.coordinator.manager.GroupManager` and back.

Thin by design: no protocol logic here. Kafka errors travel inside the responses (a FjordError
raised by the manager becomes the response's ``error``); a gRPC status other than OK only means
a transport failure or a bug.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from grpc import aio

from fjord._proto import common_pb2, coordinator_pb2, coordinator_pb2_grpc
from fjord.coordinator.authorization import (
    AuthorizedGroups,
    AuthorizedTransactions,
    CallerGroups,
)
from fjord.coordinator.group import OffsetCommitRequestPartition
from fjord.coordinator.manager import GroupManager
from fjord.errors import ErrorCode, FjordError, InvalidGroupIdError, InvalidRequestError
from fjord.serving import grpc_caller
from fjord.tls import ClusterActionGuard
from fjord.topic_partition import TopicPartition

log = logging.getLogger(__name__)

T = TypeVar("T")


def error_pb(code: ErrorCode, message: str = "") -> common_pb2.Error:
    return common_pb2.Error(code=code.code, message=message)


def exception_pb(exc: BaseException) -> common_pb2.Error:
    """A FjordError as its code; anything else is a bug: logged, UNKNOWN_SERVER_ERROR."""
    if isinstance(exc, FjordError):
        return error_pb(exc.code, str(exc))
    log.error("unexpected coordinator error", exc_info=exc)
    return error_pb(ErrorCode.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}")


def client_host(context: aio.ServicerContext) -> str:
    """Kafka's ``clientHost`` (``/127.0.0.1``) from gRPC's peer string (``ipv4:127.0.0.1:5``)."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return "/" + rest.rpartition(":")[0]
    if kind == "ipv6":
        host = rest.rpartition(":")[0].replace("%5B", "[").replace("%5D", "]")
        return "/" + host.strip("[]")
    return "/" + peer if peer else ""


def _optional(text: str) -> str | None:
    """proto3 strings have no null: "" means absent (group.instance.id, protocol names)."""
    return text or None


def _check_timeouts(session_timeout_ms: int, rebalance_timeout_ms: int) -> None:
    if session_timeout_ms <= 0:
        raise InvalidRequestError(f"session_timeout_ms must be positive, got {session_timeout_ms}")
    if rebalance_timeout_ms < 0:
        raise InvalidRequestError(
            f"rebalance_timeout_ms must be >= 0 (0: the session timeout), got "
            f"{rebalance_timeout_ms}"
        )


async def _guard(build_error: Callable[[common_pb2.Error], T], body: Awaitable[T]) -> T:
    try:
        return await body
    except FjordError as exc:
        return build_error(exception_pb(exc))
    except Exception as exc:  # a bug: the client gets a typed error, the log gets the trace
        return build_error(exception_pb(exc))


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServicer):
    """Serves ``fjord.v1.Coordinator`` from one :class:`GroupManager`.

    Invariant: every call is answered with a response message (never a gRPC error status for a
    Kafka error): group-level errors in ``error``, per-partition / per-member / per-group ones
    in their entries.
    """

    def __init__(
        self,
        groups: GroupManager | AuthorizedGroups,
        transactions: AuthorizedTransactions | None = None,
        cluster_action: ClusterActionGuard | None = None,
        coordinator_id: int = -1,
    ) -> None:
        #: Every request reaches the manager through its caller's ACL-checked view.
        self._groups = (
            groups if isinstance(groups, AuthorizedGroups) else AuthorizedGroups(groups)
        )
        self._transactions = transactions
        self._cluster_action = cluster_action or ClusterActionGuard(enforced=False)
        self._coordinator_id = coordinator_id

    # --- transactions (Kafka's ACLs: Write on the TransactionalId; AddPartitionsToTxn also
    # Write on each topic) ----------------------------------------------------------------------

    def _txn(self) -> AuthorizedTransactions:
        if self._transactions is None:
            raise FjordError("this coordinator serves no transactions",
                             ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return self._transactions

    async def InitTransactions(
        self, request: coordinator_pb2.InitTransactionsRequest, context: aio.ServicerContext
    ) -> coordinator_pb2.InitTransactionsResponse:
        async def body() -> coordinator_pb2.InitTransactionsResponse:
            pid, epoch = await self._txn().init_producer_id(
                grpc_caller(context),
                request.transactional_id,
                request.transaction_timeout_ms,
                request.producer_id,
                request.producer_epoch,
            )
            return coordinator_pb2.InitTransactionsResponse(
                error=error_pb(ErrorCode.NONE), producer_id=pid, producer_epoch=epoch
            )

        return await _guard(
            lambda e: coordinator_pb2.InitTransactionsResponse(
                error=e, producer_id=-1, producer_epoch=-1
            ),
            body(),
        )

    async def AddPartitionsToTxn(
        self, request: coordinator_pb2.AddPartitionsToTxnRequest, context: aio.ServicerContext
    ) -> coordinator_pb2.AddPartitionsToTxnResponse:
        async def body() -> coordinator_pb2.AddPartitionsToTxnResponse:
            wanted = [TopicPartition(p.topic, p.partition) for p in request.partitions]
            errors = await self._txn().add_partitions(
                grpc_caller(context), request.transactional_id, request.producer_id,
                request.producer_epoch, wanted,
            )
            return coordinator_pb2.AddPartitionsToTxnResponse(
                error=error_pb(ErrorCode.NONE),
                results=[
                    coordinator_pb2.AddPartitionsToTxnResult(
                        partition=common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition),
                        error=error_pb(code),
                    )
                    for tp, code in errors.items()
                ],
            )

        return await _guard(
            lambda e: coordinator_pb2.AddPartitionsToTxnResponse(error=e), body()
        )

    async def EndTxn(
        self, request: coordinator_pb2.EndTxnRequest, context: aio.ServicerContext
    ) -> coordinator_pb2.EndTxnResponse:
        async def body() -> coordinator_pb2.EndTxnResponse:
            await self._txn().end_transaction(
                grpc_caller(context),
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.committed,
            )
            return coordinator_pb2.EndTxnResponse(error=error_pb(ErrorCode.NONE))

        return await _guard(lambda e: coordinator_pb2.EndTxnResponse(error=e), body())

    async def AddOffsetsToTxn(
        self, request: coordinator_pb2.AddOffsetsToTxnRequest, context: aio.ServicerContext
    ) -> coordinator_pb2.AddOffsetsToTxnResponse:
        async def body() -> coordinator_pb2.AddOffsetsToTxnResponse:
            await self._txn().add_offsets(
                grpc_caller(context),
                request.transactional_id, request.producer_id, request.producer_epoch,
                request.group_id,
            )
            return coordinator_pb2.AddOffsetsToTxnResponse(error=error_pb(ErrorCode.NONE))

        return await _guard(lambda e: coordinator_pb2.AddOffsetsToTxnResponse(error=e), body())

    async def TxnOffsetCommit(
        self, request: coordinator_pb2.TxnOffsetCommitRequest, context: aio.ServicerContext
    ) -> coordinator_pb2.OffsetCommitResponse:
        async def body() -> coordinator_pb2.OffsetCommitResponse:
            if not request.group_id:
                raise InvalidGroupIdError("group id must be a non-empty string")
            self._txn().require_writer(grpc_caller(context), request.transactional_id)
            offsets = _requested_offsets(request.topics)
            errors = await self._as(context).txn_commit_offsets(
                request.group_id,
                producer_id=request.producer_id,
                member_id=request.member_id,
                generation_id=request.generation_id,
                group_instance_id=_optional(request.group_instance_id),
                offsets=offsets,
            )
            return _offset_commit_response(errors)

        return await _guard(lambda e: coordinator_pb2.OffsetCommitResponse(error=e), body())

    async def ListTransactions(
        self, request: coordinator_pb2.ListTransactionsRequest, context: aio.ServicerContext
    ) -> coordinator_pb2.ListTransactionsResponse:
        async def body() -> coordinator_pb2.ListTransactionsResponse:
            error, records = self._txn().list_transactions(grpc_caller(context))
            states = set(request.states_filter)
            pids = set(request.producer_id_filter)
            return coordinator_pb2.ListTransactionsResponse(
                error=error_pb(error),
                transactions=[
                    coordinator_pb2.TransactionDescription(
                        transactional_id=r.transactional_id,
                        state=r.state.kafka_name,
                        producer_id=r.producer_id,
                        producer_epoch=r.producer_epoch,
                        transaction_timeout_ms=r.timeout_ms,
                        transaction_start_time_ms=r.txn_start_ms,
                        partitions=[
                            common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition)
                            for tp in sorted(r.partitions)
                        ],
                        coordinator_id=self._coordinator_id,
                    )
                    for r in records
                    if (not states or r.state.kafka_name in states)
                    and (not pids or r.producer_id in pids)
                    and r.producer_epoch >= 0
                ],
            )

        return await _guard(
            lambda e: coordinator_pb2.ListTransactionsResponse(error=e), body()
        )

    async def CompleteTxnOffsets(
        self, request: coordinator_pb2.CompleteTxnOffsetsRequest, context: aio.ServicerContext
    ) -> coordinator_pb2.CompleteTxnOffsetsResponse:
        async def body() -> coordinator_pb2.CompleteTxnOffsetsResponse:
            if not self._cluster_action.allows(context, "CompleteTxnOffsets"):
                raise FjordError(
                    "only the cluster's service identity completes transactional offsets",
                    ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                )
            await self._groups.manager.complete_txn_offsets(
                request.partition, request.producer_id, request.committed
            )
            return coordinator_pb2.CompleteTxnOffsetsResponse(error=error_pb(ErrorCode.NONE))

        return await _guard(
            lambda e: coordinator_pb2.CompleteTxnOffsetsResponse(error=e), body()
        )

    def _as(self, context: aio.ServicerContext) -> CallerGroups:
        """The manager as this call's caller may use it."""
        return self._groups.for_caller(grpc_caller(context))

    async def JoinGroup(
        self, request: coordinator_pb2.JoinGroupRequest, context: aio.ServicerContext
    ) -> coordinator_pb2.JoinGroupResponse:
        async def body() -> coordinator_pb2.JoinGroupResponse:
            if not request.group_id:
                raise InvalidGroupIdError("group id must be a non-empty string")
            _check_timeouts(request.session_timeout_ms, request.rebalance_timeout_ms)
            if not request.protocol_type or not request.protocols:
                return coordinator_pb2.JoinGroupResponse(
                    error=error_pb(
                        ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                        "a JoinGroup needs a protocol type and at least one protocol",
                    ),
                    member_id=request.member_id,
                    generation_id=-1,
                )
            response = await self._as(context).join_group(
                request.group_id,
                member_id=request.member_id,
                group_instance_id=_optional(request.group_instance_id),
                client_id=request.client_id,
                client_host=client_host(context),
                session_timeout_ms=request.session_timeout_ms,
                rebalance_timeout_ms=request.rebalance_timeout_ms,
                protocol_type=request.protocol_type,
                protocols=[(p.name, p.metadata) for p in request.protocols],
            )
            return coordinator_pb2.JoinGroupResponse(
                error=error_pb(response.error),
                generation_id=response.generation_id,
                protocol_type=response.protocol_type or "",
                protocol_name=response.protocol_name or "",
                leader=response.leader_id,
                member_id=response.member_id,
                members=[
                    coordinator_pb2.JoinGroupMember(
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id or "",
                        metadata=m.metadata,
                    )
                    for m in response.members
                ],
            )

        return await _guard(
            lambda e: coordinator_pb2.JoinGroupResponse(
                error=e, member_id=request.member_id, generation_id=-1
            ),
            body(),
        )

    async def SyncGroup(
        self, request: coordinator_pb2.SyncGroupRequest, context: aio.ServicerContext
    ) -> coordinator_pb2.SyncGroupResponse:
        async def body() -> coordinator_pb2.SyncGroupResponse:
            assignments: dict[str, bytes] = {}
            for item in request.assignments:
                if item.member_id in assignments:
                    raise InvalidRequestError(f"member {item.member_id!r} assigned twice")
                assignments[item.member_id] = item.assignment
            response = await self._as(context).sync_group(
                request.group_id,
                member_id=request.member_id,
                generation_id=request.generation_id,
                group_instance_id=_optional(request.group_instance_id),
                protocol_type=_optional(request.protocol_type),
                protocol_name=_optional(request.protocol_name),
                assignments=assignments,
            )
            return coordinator_pb2.SyncGroupResponse(
                error=error_pb(response.error),
                protocol_type=response.protocol_type or "",
                protocol_name=response.protocol_name or "",
                assignment=response.assignment,
            )

        return await _guard(lambda e: coordinator_pb2.SyncGroupResponse(error=e), body())

    async def Heartbeat(
        self, request: coordinator_pb2.HeartbeatRequest, context: aio.ServicerContext
    ) -> coordinator_pb2.HeartbeatResponse:
        async def body() -> coordinator_pb2.HeartbeatResponse:
            error = self._as(context).heartbeat(
                request.group_id,
                member_id=request.member_id,
                generation_id=request.generation_id,
                group_instance_id=_optional(request.group_instance_id),
            )
            return coordinator_pb2.HeartbeatResponse(error=error_pb(error))

        return await _guard(lambda e: coordinator_pb2.HeartbeatResponse(error=e), body())

    async def LeaveGroup(
        self, request: coordinator_pb2.LeaveGroupRequest, context: aio.ServicerContext
    ) -> coordinator_pb2.LeaveGroupResponse:
        async def body() -> coordinator_pb2.LeaveGroupResponse:
            if not request.members:
                raise InvalidRequestError("LeaveGroup names no member")
            members = [(m.member_id, _optional(m.group_instance_id)) for m in request.members]
            errors = self._as(context).leave_group(request.group_id, members)
            return coordinator_pb2.LeaveGroupResponse(
                error=error_pb(ErrorCode.NONE),
                members=[
                    coordinator_pb2.MemberResponse(
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id,
                        error=error_pb(error),
                    )
                    for m, error in zip(request.members, errors, strict=True)
                ],
            )

        return await _guard(lambda e: coordinator_pb2.LeaveGroupResponse(error=e), body())

    async def OffsetCommit(
        self, request: coordinator_pb2.OffsetCommitRequest, context: aio.ServicerContext
    ) -> coordinator_pb2.OffsetCommitResponse:
        async def body() -> coordinator_pb2.OffsetCommitResponse:
            offsets = _requested_offsets(request.topics)
            errors = await self._as(context).commit_offsets(
                request.group_id,
                member_id=request.member_id,
                generation_id=request.generation_id,
                group_instance_id=_optional(request.group_instance_id),
                offsets=offsets,
            )
            return _offset_commit_response(errors)

        return await _guard(lambda e: coordinator_pb2.OffsetCommitResponse(error=e), body())

    async def OffsetFetch(
        self, request: coordinator_pb2.OffsetFetchRequest, context: aio.ServicerContext
    ) -> coordinator_pb2.OffsetFetchResponse:
        async def body() -> coordinator_pb2.OffsetFetchResponse:
            wanted = [
                TopicPartition(t.name, p) for t in request.topics for p in t.partitions
            ] or None
            view = self._as(context)
            found = view.fetch_offsets(request.group_id, wanted)
            unstable = (
                view.pending_txn_partitions(request.group_id) if request.require_stable
                else set()
            )
            by_topic: dict[str, list[coordinator_pb2.OffsetFetchPartitionResponse]] = {}
            for (topic_name, partition), committed in found.items():
                if TopicPartition(topic_name, partition) in unstable:
                    answer = coordinator_pb2.OffsetFetchPartitionResponse(
                        partition=partition, committed_offset=-1, committed_leader_epoch=-1,
                        error=error_pb(ErrorCode.UNSTABLE_OFFSET_COMMIT,
                                       "an open transaction committed this offset"),
                    )
                else:
                    answer = coordinator_pb2.OffsetFetchPartitionResponse(
                        partition=partition,
                        committed_offset=committed.offset,
                        committed_leader_epoch=committed.leader_epoch,
                        metadata=committed.metadata,
                        error=error_pb(ErrorCode.NONE),
                    )
                by_topic.setdefault(topic_name, []).append(answer)
            return coordinator_pb2.OffsetFetchResponse(
                error=error_pb(ErrorCode.NONE),
                topics=[
                    coordinator_pb2.OffsetFetchTopicResponse(name=name, partitions=parts)
                    for name, parts in by_topic.items()
                ],
            )

        return await _guard(lambda e: coordinator_pb2.OffsetFetchResponse(error=e), body())

    async def ListGroups(
        self, request: coordinator_pb2.ListGroupsRequest, context: aio.ServicerContext
    ) -> coordinator_pb2.ListGroupsResponse:
        error, groups = self._as(context).list_groups(list(request.states_filter))
        return coordinator_pb2.ListGroupsResponse(
            error=error_pb(error),
            groups=[
                coordinator_pb2.ListedGroup(group_id=g, protocol_type=t, group_state=s)
                for g, t, s in groups
            ],
        )

    async def DescribeGroups(
        self, request: coordinator_pb2.DescribeGroupsRequest, context: aio.ServicerContext
    ) -> coordinator_pb2.DescribeGroupsResponse:
        out = []
        for group_id in request.group_ids:
            try:
                description = self._as(context).describe_group(group_id)
            except Exception as exc:
                out.append(
                    coordinator_pb2.DescribedGroup(error=exception_pb(exc), group_id=group_id)
                )
                continue
            out.append(
                coordinator_pb2.DescribedGroup(
                    error=error_pb(ErrorCode.NONE),
                    group_id=group_id,
                    group_state=description.state.value,
                    protocol_type=description.protocol_type,
                    protocol_data=description.protocol,
                    members=[
                        coordinator_pb2.DescribedGroupMember(
                            member_id=m.member_id,
                            group_instance_id=m.group_instance_id or "",
                            client_id=m.client_id,
                            client_host=m.client_host,
                            member_metadata=m.metadata,
                            member_assignment=m.assignment,
                        )
                        for m in description.members
                    ],
                )
            )
        return coordinator_pb2.DescribeGroupsResponse(groups=out)

    async def DeleteGroups(
        self, request: coordinator_pb2.DeleteGroupsRequest, context: aio.ServicerContext
    ) -> coordinator_pb2.DeleteGroupsResponse:
        results = []
        for group_id in request.group_ids:
            try:
                error = error_pb(await self._as(context).delete_group(group_id))
            except Exception as exc:
                error = exception_pb(exc)
            results.append(coordinator_pb2.DeletableGroupResult(group_id=group_id, error=error))
        return coordinator_pb2.DeleteGroupsResponse(results=results)


def _requested_offsets(
    topics: Iterable[coordinator_pb2.OffsetCommitTopic],
) -> dict[TopicPartition, OffsetCommitRequestPartition]:
    """The offsets an OffsetCommit or TxnOffsetCommit names, by partition; a partition named
    twice is INVALID_REQUEST (nothing is committed)."""
    offsets: dict[TopicPartition, OffsetCommitRequestPartition] = {}
    for topic in topics:
        for p in topic.partitions:
            tp = TopicPartition(topic.name, p.partition)
            if tp in offsets:
                raise InvalidRequestError(f"{topic.name}-{p.partition} committed twice")
            offsets[tp] = OffsetCommitRequestPartition(
                p.committed_offset, p.committed_leader_epoch, p.committed_metadata
            )
    return offsets


def _offset_commit_response(
    errors: dict[TopicPartition, ErrorCode],
) -> coordinator_pb2.OffsetCommitResponse:
    by_topic: dict[str, list[coordinator_pb2.OffsetCommitPartitionResponse]] = {}
    for (topic_name, partition), error in sorted(errors.items()):
        by_topic.setdefault(topic_name, []).append(
            coordinator_pb2.OffsetCommitPartitionResponse(
                partition=partition, error=error_pb(error)
            )
        )
    return coordinator_pb2.OffsetCommitResponse(
        error=error_pb(ErrorCode.NONE),
        topics=[
            coordinator_pb2.OffsetCommitTopicResponse(name=name, partitions=parts)
            for name, parts in by_topic.items()
        ],
    )
