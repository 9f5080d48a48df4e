"""Kafka's group APIs on a group coordinator, translated onto its GroupManager.

:class:`GroupKafkaHandlers` serves JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
OffsetFetch, DescribeGroups, ListGroups and DeleteGroups by calling the same
:class:`~fjord.coordinator.manager.GroupManager` the gRPC servicer calls, so one group may mix
members that joined over gRPC and over Kafka's protocol: one state machine, one assignment, one
``__consumer_offsets``. Pure translation: no sockets, no clock (the manager owns both). What
every Kafka door shares (the versions, FindCoordinator) is :mod:`fjord.kafka.groups`'.

Kafka's per-version differences handled here: JoinGroup v0-v3 members are admitted without the
MEMBER_ID_REQUIRED round trip (KIP-394 is v4+); v0's rebalance timeout is the session timeout;
LeaveGroup v0-v2 names one member at the top level; OffsetFetch v8+ batches groups; v1 carries
group errors on every partition; protocol names are nullable only from JoinGroup v7 /
SyncGroup v5.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.protocol.admin.groups import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)

from fjord.coordinator.authorization import AuthorizedGroups, CallerGroups
from fjord.coordinator.group import OffsetCommitRequestPartition
from fjord.coordinator.manager import GroupManager
from fjord.errors import ErrorCode, FjordError
from fjord.kafka.dispatch import Api, RequestContext
from fjord.kafka.groups import (
    DELETE_GROUPS_VERSIONS,
    DESCRIBE_GROUPS_VERSIONS,
    HEARTBEAT_VERSIONS,
    JOIN_GROUP_VERSIONS,
    LEAVE_GROUP_VERSIONS,
    LIST_GROUPS_VERSIONS,
    OFFSET_COMMIT_VERSIONS,
    OFFSET_FETCH_VERSIONS,
    SYNC_GROUP_VERSIONS,
)
from fjord.topic_partition import TopicPartition

log = logging.getLogger(__name__)

#: JoinGroup from this version on: a new member first gets MEMBER_ID_REQUIRED (KIP-394).
JOIN_REQUIRES_MEMBER_ID_FROM = 4
#: The only group type Fjord has (Kafka's "classic" protocol; KIP-848's "consumer" is not
#: served).
CLASSIC_GROUP_TYPE = "classic"


def error_of(exc: BaseException) -> ErrorCode:
    """A FjordError's code; anything else is a bug: logged, UNKNOWN_SERVER_ERROR."""
    if isinstance(exc, FjordError):
        return exc.code
    log.error("unexpected error in a Kafka group request", exc_info=exc)
    return ErrorCode.UNKNOWN_SERVER_ERROR


def _name(text: str | None, version: int, nullable_from: int) -> str | None:
    """A protocol type/name for the wire: None stays None only where the field is nullable."""
    if text:
        return text
    return None if version >= nullable_from else ""


class GroupKafkaHandlers:
    """Kafka's group APIs of one coordinator, over its :class:`GroupManager`.

    Invariant: every request gets a response at its version, with errors in Kafka's places
    (group-level errors on every partition/member where the version has no group-level
    field); nothing is decided here that the manager or its state machines decide for gRPC.
    """

    def __init__(self, groups: GroupManager | AuthorizedGroups) -> None:
        #: Every request reaches the manager through its caller's ACL-checked view.
        self._groups = (
            groups if isinstance(groups, AuthorizedGroups) else AuthorizedGroups(groups)
        )

    def _as(self, ctx: RequestContext) -> CallerGroups:
        """The manager as this request's caller may use it."""
        return self._groups.for_caller(ctx.caller)

    def apis(self) -> list[Api]:
        return [
            Api(8, *OFFSET_COMMIT_VERSIONS, OffsetCommitRequest, self.offset_commit),
            Api(9, *OFFSET_FETCH_VERSIONS, OffsetFetchRequest, self.offset_fetch),
            Api(11, *JOIN_GROUP_VERSIONS, JoinGroupRequest, self.join_group),
            Api(12, *HEARTBEAT_VERSIONS, HeartbeatRequest, self.heartbeat),
            Api(13, *LEAVE_GROUP_VERSIONS, LeaveGroupRequest, self.leave_group),
            Api(14, *SYNC_GROUP_VERSIONS, SyncGroupRequest, self.sync_group),
            Api(15, *DESCRIBE_GROUPS_VERSIONS, DescribeGroupsRequest, self.describe_groups),
            Api(16, *LIST_GROUPS_VERSIONS, ListGroupsRequest, self.list_groups),
            Api(42, *DELETE_GROUPS_VERSIONS, DeleteGroupsRequest, self.delete_groups),
        ]

    # --- membership -----------------------------------------------------------------------------

    async def join_group(self, request: Any, ctx: RequestContext) -> Any:
        version = ctx.api_version
        cls = JoinGroupResponse[version]

        def answer(
            error: ErrorCode,
            member_id: str,
            generation_id: int = -1,
            protocol_type: str | None = None,
            protocol_name: str | None = None,
            leader: str = "",
            members: list[Any] | None = None,
        ) -> Any:
            return cls(
                throttle_time_ms=0,
                error_code=error.code,
                generation_id=generation_id,
                protocol_type=_name(protocol_type, version, 7),
                protocol_name=_name(protocol_name, version, 7),
                leader=leader,
                skip_assignment=False,
                member_id=member_id,
                members=members or [],
            )

        if not request.protocol_type or not request.protocols:
            return answer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, request.member_id)
        session_timeout_ms = request.session_timeout_ms
        rebalance_timeout_ms = request.rebalance_timeout_ms if version >= 1 else 0
        try:
            response = await self._as(ctx).join_group(
                request.group_id,
                member_id=request.member_id,
                group_instance_id=request.group_instance_id if version >= 5 else None,
                client_id=ctx.client_id or "",
                client_host=ctx.client_host,
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout_ms,
                protocol_type=request.protocol_type,
                protocols=[(p.name, bytes(p.metadata)) for p in request.protocols],
                require_known_member_id=version >= JOIN_REQUIRES_MEMBER_ID_FROM,
            )
        except Exception as exc:
            return answer(error_of(exc), request.member_id)
        return answer(
            response.error,
            response.member_id,
            response.generation_id,
            response.protocol_type,
            response.protocol_name,
            response.leader_id,
            [
                cls.JoinGroupResponseMember(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    metadata=m.metadata,
                )
                for m in response.members
            ],
        )

    async def sync_group(self, request: Any, ctx: RequestContext) -> Any:
        version = ctx.api_version
        cls = SyncGroupResponse[version]

        def answer(
            error: ErrorCode,
            protocol_type: str | None = None,
            protocol_name: str | None = None,
            assignment: bytes = b"",
        ) -> Any:
            return cls(
                throttle_time_ms=0,
                error_code=error.code,
                protocol_type=protocol_type,
                protocol_name=protocol_name,
                assignment=assignment,
            )

        assignments = {a.member_id: bytes(a.assignment) for a in request.assignments}
        if len(assignments) != len(request.assignments):
            return answer(ErrorCode.INVALID_REQUEST)
        try:
            response = await self._as(ctx).sync_group(
                request.group_id,
                member_id=request.member_id,
                generation_id=request.generation_id,
                group_instance_id=request.group_instance_id if version >= 3 else None,
                protocol_type=request.protocol_type if version >= 5 else None,
                protocol_name=request.protocol_name if version >= 5 else None,
                assignments=assignments,
            )
        except Exception as exc:
            return answer(error_of(exc))
        return answer(
            response.error, response.protocol_type, response.protocol_name, response.assignment
        )

    async def heartbeat(self, request: Any, ctx: RequestContext) -> Any:
        try:
            error = self._as(ctx).heartbeat(
                request.group_id,
                member_id=request.member_id,
                generation_id=request.generation_id,
                group_instance_id=request.group_instance_id if ctx.api_version >= 3 else None,
            )
        except Exception as exc:
            error = error_of(exc)
        return HeartbeatResponse[ctx.api_version](throttle_time_ms=0, error_code=error.code)

    async def leave_group(self, request: Any, ctx: RequestContext) -> Any:
        version = ctx.api_version
        cls = LeaveGroupResponse[version]
        if version < 3:
            members: list[tuple[str, str | None]] = [(request.member_id, None)]
        else:
            members = [(m.member_id, m.group_instance_id) for m in request.members]
        if not members:
            return cls(throttle_time_ms=0, error_code=ErrorCode.INVALID_REQUEST.code, members=[])
        try:
            errors = self._as(ctx).leave_group(request.group_id, members)
        except Exception as exc:
            return cls(throttle_time_ms=0, error_code=error_of(exc).code, members=[])
        if version < 3:
            return cls(throttle_time_ms=0, error_code=errors[0].code, members=[])
        return cls(
            throttle_time_ms=0,
            error_code=0,
            members=[
                cls.MemberResponse(
                    member_id=member_id, group_instance_id=instance, error_code=error.code
                )
                for (member_id, instance), error in zip(members, errors, strict=True)
            ],
        )

    # --- offsets --------------------------------------------------------------------------------

    async def offset_commit(self, request: Any, ctx: RequestContext) -> Any:
        version = ctx.api_version
        cls = OffsetCommitResponse[version]
        offsets: dict[TopicPartition, OffsetCommitRequestPartition] = {}
        for topic in request.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition_index)
                offsets[tp] = OffsetCommitRequestPartition(
                    p.committed_offset,
                    p.committed_leader_epoch if version >= 6 else -1,
                    p.committed_metadata or "",
                )
        try:
            errors = await self._as(ctx).commit_offsets(
                request.group_id,
                member_id=request.member_id,
                generation_id=request.generation_id_or_member_epoch,
                group_instance_id=request.group_instance_id if version >= 7 else None,
                offsets=offsets,
            )
        except Exception as exc:
            errors = dict.fromkeys(offsets, error_of(exc))
        by_topic: dict[str, list[Any]] = {}
        part_cls = cls.OffsetCommitResponseTopic.OffsetCommitResponsePartition
        for (name, partition), error in sorted(errors.items()):
            by_topic.setdefault(name, []).append(
                part_cls(partition_index=partition, error_code=error.code)
            )
        return cls(
            throttle_time_ms=0,
            topics=[
                cls.OffsetCommitResponseTopic(name=name, partitions=parts)
                for name, parts in by_topic.items()
            ],
        )

    def _fetch_group(
        self,
        group_id: str,
        wanted: list[TopicPartition] | None,
        ctx: RequestContext,
        require_stable: bool = False,
    ) -> tuple[ErrorCode, dict[str, list[tuple[int, int, int, str, int]]]]:
        """(group error, {topic: [(partition, offset, leader epoch, metadata, error code)]}).
        ``require_stable`` (KIP-447): a partition whose offset an open transaction committed
        is UNSTABLE_OFFSET_COMMIT (offset -1) until that transaction ends."""
        try:
            view = self._as(ctx)
            found = view.fetch_offsets(group_id, wanted)
            unstable = view.pending_txn_partitions(group_id) if require_stable else set()
        except Exception as exc:
            return error_of(exc), {}
        by_topic: dict[str, list[tuple[int, int, int, str, int]]] = {}
        for (name, partition), committed in found.items():
            if TopicPartition(name, partition) in unstable:
                entry = (partition, -1, -1, "", ErrorCode.UNSTABLE_OFFSET_COMMIT.code)
            else:
                entry = (partition, committed.offset, committed.leader_epoch,
                         committed.metadata, 0)
            by_topic.setdefault(name, []).append(entry)
        return ErrorCode.NONE, by_topic

    async def offset_fetch(self, request: Any, ctx: RequestContext) -> Any:
        version = ctx.api_version
        cls = OffsetFetchResponse[version]
        if version >= 8:
            group_cls = cls.OffsetFetchResponseGroup
            topic_cls = group_cls.OffsetFetchResponseTopics
            part_cls = topic_cls.OffsetFetchResponsePartitions
            groups = []
            for group in request.groups:
                wanted = _wanted(group.topics)
                error, by_topic = self._fetch_group(
                    group.group_id, wanted, ctx, bool(request.require_stable)
                )
                groups.append(
                    group_cls(
                        group_id=group.group_id,
                        error_code=error.code,
                        topics=[
                            topic_cls(name=name, partitions=[
                                part_cls(partition_index=p, committed_offset=o,
                                         committed_leader_epoch=e, metadata=m, error_code=err)
                                for p, o, e, m, err in parts
                            ])
                            for name, parts in by_topic.items()
                        ],
                    )
                )
            return cls(throttle_time_ms=0, groups=groups)
        topic_cls = cls.OffsetFetchResponseTopic
        part_cls = topic_cls.OffsetFetchResponsePartition
        wanted = _wanted(request.topics)
        error, by_topic = self._fetch_group(
            request.group_id, wanted, ctx, version >= 7 and bool(request.require_stable)
        )
        if error is not ErrorCode.NONE and version < 2 and wanted:
            # v1 has no group-level error: every partition asked for carries it.
            by_topic = {}
            for tp in wanted:
                by_topic.setdefault(tp.topic, []).append((tp.partition, -1, -1, "", 0))
        partition_error = error.code if version < 2 else 0
        return cls(
            throttle_time_ms=0,
            error_code=error.code,
            topics=[
                topic_cls(name=name, partitions=[
                    part_cls(partition_index=p, committed_offset=o, committed_leader_epoch=e,
                             metadata=m, error_code=partition_error or err)
                    for p, o, e, m, err in parts
                ])
                for name, parts in by_topic.items()
            ],
        )

    # --- group administration -------------------------------------------------------------------

    async def describe_groups(self, request: Any, ctx: RequestContext) -> Any:
        cls = DescribeGroupsResponse[ctx.api_version]
        group_cls = cls.DescribedGroup
        member_cls = group_cls.DescribedGroupMember
        out = []
        for group_id in request.groups:
            try:
                d = self._as(ctx).describe_group(group_id)
            except Exception as exc:
                out.append(group_cls(error_code=error_of(exc).code, group_id=group_id,
                                     group_state="", protocol_type="", protocol_data="",
                                     members=[]))
                continue
            out.append(
                group_cls(
                    error_code=0,
                    group_id=group_id,
                    group_state=d.state.value,
                    protocol_type=d.protocol_type,
                    protocol_data=d.protocol,
                    members=[
                        member_cls(
                            member_id=m.member_id,
                            group_instance_id=m.group_instance_id,
                            client_id=m.client_id,
                            client_host=m.client_host,
                            member_metadata=m.metadata,
                            member_assignment=m.assignment,
                        )
                        for m in d.members
                    ],
                )
            )
        return cls(throttle_time_ms=0, groups=out)

    async def list_groups(self, request: Any, ctx: RequestContext) -> Any:
        version = ctx.api_version
        cls = ListGroupsResponse[version]
        types = [t.lower() for t in (request.types_filter or ())] if version >= 5 else []
        if types and CLASSIC_GROUP_TYPE not in types:
            return cls(throttle_time_ms=0, error_code=0, groups=[])
        states = list(request.states_filter or ()) if version >= 4 else []
        error, groups = self._as(ctx).list_groups(states)
        return cls(
            throttle_time_ms=0,
            error_code=error.code,
            groups=[
                cls.ListedGroup(
                    group_id=group_id,
                    protocol_type=protocol_type,
                    group_state=state,
                    group_type=CLASSIC_GROUP_TYPE,
                )
                for group_id, protocol_type, state in groups
            ],
        )

    async def delete_groups(self, request: Any, ctx: RequestContext) -> Any:
        cls = DeleteGroupsResponse[ctx.api_version]
        results = []
        for group_id in request.groups_names:
            try:
                error = await self._as(ctx).delete_group(group_id)
            except Exception as exc:
                error = error_of(exc)
            results.append(cls.DeletableGroupResult(group_id=group_id, error_code=error.code))
        return cls(throttle_time_ms=0, results=results)


def _wanted(topics: Any) -> list[TopicPartition] | None:
    """OffsetFetch's partitions asked for; None (all committed) when ``topics`` is null."""
    if topics is None:
        return None
    return [TopicPartition(t.name, p) for t in topics for p in t.partition_indexes]
