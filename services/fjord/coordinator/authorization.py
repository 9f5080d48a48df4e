"""The coordinator's ACL checks, in one place for both doors: the gRPC servicer and the Kafka
listener's group handlers reach the :class:`~fjord.coordinator.manager.GroupManager` only
through :meth:`AuthorizedGroups.for_caller`, whose view checks Kafka's rules first:

- JoinGroup, SyncGroup, Heartbeat, LeaveGroup: Read on the group;
- OffsetCommit: Read on the group, and Read on each topic (others TOPIC_AUTHORIZATION_FAILED,
  not written);
- OffsetFetch: Describe on the group; topics the caller may not describe are left out;
- DescribeGroups: Describe on the group; DeleteGroups: Delete on the group;
- ListGroups: every group with Describe on the cluster, else the groups the caller may
  describe (not counted as denials).

A refused group raises GroupAuthorizationError, which each door already answers as the group's
(or every partition's) error code, GROUP_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fjord.coordinator.group import (
    CommittedOffset,
    GroupDescription,
    JoinGroupResponse,
    OffsetCommitRequestPartition,
    SyncGroupResponse,
)
from fjord.coordinator.manager import GroupManager
from fjord.coordinator.transactions import TransactionManager
from fjord.errors import ErrorCode, FjordError
from fjord.metadata import MetadataImage
from fjord.security.acls import NO_AUTHORIZATION, AccessControl, AclOperation, Caller, Resource
from fjord.topic_partition import TopicPartition
from fjord.transactions.state import TxnRecord


def _no_image() -> MetadataImage:
    raise AssertionError("ACLs read while authorization is off")


class AuthorizedGroups:
    """A GroupManager behind Kafka's ACL checks (see the module docstring)."""

    def __init__(
        self,
        manager: GroupManager,
        image: Callable[[], MetadataImage] | None = None,
        access: AccessControl = NO_AUTHORIZATION,
    ) -> None:
        """``image``: where the ACLs are (the coordinator's newest metadata image); needed
        only when ``access`` is enabled."""
        if access.enabled and image is None:
            raise ValueError("authorization needs the metadata image that holds the ACLs")
        self.manager = manager
        self._image: Callable[[], MetadataImage] = image or _no_image
        self.access = access

    def image(self) -> MetadataImage:
        """The metadata image holding the ACLs (only while authorization is on)."""
        return self._image()

    def for_caller(self, caller: Caller) -> CallerGroups:
        return CallerGroups(self, caller)


class CallerGroups:
    """The GroupManager's request methods (same signatures) as one caller may use them."""

    def __init__(self, groups: AuthorizedGroups, caller: Caller) -> None:
        self._manager = groups.manager
        self._image = groups._image
        self._access = groups.access
        self._caller = caller

    def _allows(self, operation: AclOperation, resource: Resource, count: bool = True) -> bool:
        if not self._access.enabled:
            return True
        return self._access.allows(self._image(), self._caller, operation, resource, count=count)

    def _require(self, operation: AclOperation, group_id: str) -> None:
        if self._access.enabled:
            self._access.require(self._image(), self._caller, operation, Resource.group(group_id))

    def pending_txn_partitions(self, group_id: str) -> set[TopicPartition]:
        """Asked with OffsetFetch (its Describe on the group is checked there)."""
        return self._manager.pending_txn_partitions(group_id)

    async def txn_commit_offsets(
        self,
        group_id: str,
        *,
        offsets: Mapping[TopicPartition, OffsetCommitRequestPartition],
        **kwargs: Any,
    ) -> dict[TopicPartition, ErrorCode]:
        """TxnOffsetCommit: Read on the group, Read on each topic (others
        TOPIC_AUTHORIZATION_FAILED, not written)."""
        self._require(AclOperation.READ, group_id)
        denied = {
            tp: ErrorCode.TOPIC_AUTHORIZATION_FAILED for tp in offsets
            if not self._allows(AclOperation.READ, Resource.topic(tp.topic))
        }
        allowed = {tp: o for tp, o in offsets.items() if tp not in denied}
        if not allowed:
            return denied
        return denied | await self._manager.txn_commit_offsets(
            group_id, offsets=allowed, **kwargs
        )

    async def join_group(self, group_id: str, **kwargs: Any) -> JoinGroupResponse:
        self._require(AclOperation.READ, group_id)
        return await self._manager.join_group(group_id, **kwargs)

    async def sync_group(self, group_id: str, **kwargs: Any) -> SyncGroupResponse:
        self._require(AclOperation.READ, group_id)
        return await self._manager.sync_group(group_id, **kwargs)

    def heartbeat(self, group_id: str, **kwargs: Any) -> ErrorCode:
        self._require(AclOperation.READ, group_id)
        return self._manager.heartbeat(group_id, **kwargs)

    def leave_group(
        self, group_id: str, members: Sequence[tuple[str, str | None]]
    ) -> list[ErrorCode]:
        self._require(AclOperation.READ, group_id)
        return self._manager.leave_group(group_id, members)

    async def commit_offsets(
        self,
        group_id: str,
        *,
        offsets: Mapping[TopicPartition, OffsetCommitRequestPartition],
        **kwargs: Any,
    ) -> dict[TopicPartition, ErrorCode]:
        self._require(AclOperation.READ, group_id)
        readable = {
            topic for topic in {tp.topic for tp in offsets}
            if self._allows(AclOperation.READ, Resource.topic(topic))
        }
        errors = {
            tp: ErrorCode.TOPIC_AUTHORIZATION_FAILED for tp in offsets if tp.topic not in readable
        }
        allowed = {tp: o for tp, o in offsets.items() if tp.topic in readable}
        if allowed or not errors:
            errors |= await self._manager.commit_offsets(group_id, offsets=allowed, **kwargs)
        return errors

    def fetch_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition] | None
    ) -> dict[TopicPartition, CommittedOffset]:
        self._require(AclOperation.DESCRIBE, group_id)
        found = self._manager.fetch_offsets(group_id, partitions)
        if not self._access.enabled:
            return found
        visible = {
            topic for topic in {tp.topic for tp in found}
            if self._allows(AclOperation.DESCRIBE, Resource.topic(topic), count=False)
        }
        return {tp: o for tp, o in found.items() if tp.topic in visible}

    def list_groups(
        self, states: Sequence[str] = ()
    ) -> tuple[ErrorCode, list[tuple[str, str, str]]]:
        error, groups = self._manager.list_groups(states)
        if not self._access.enabled or self._allows(
            AclOperation.DESCRIBE, Resource.cluster(), count=False
        ):
            return error, groups
        return error, [
            g for g in groups
            if self._allows(AclOperation.DESCRIBE, Resource.group(g[0]), count=False)
        ]

    def describe_group(self, group_id: str) -> GroupDescription:
        self._require(AclOperation.DESCRIBE, group_id)
        return self._manager.describe_group(group_id)

    async def delete_group(self, group_id: str) -> ErrorCode:
        self._require(AclOperation.DELETE, group_id)
        return await self._manager.delete_group(group_id)


class AuthorizedTransactions:
    """A TransactionManager behind Kafka's ACL checks, for both doors: Write on the
    TransactionalId for every transactional request; AddPartitionsToTxn also Write on each
    topic (the others TOPIC_AUTHORIZATION_FAILED, the rest OPERATION_NOT_ATTEMPTED, nothing
    added); AddOffsetsToTxn also Read on the group."""

    def __init__(
        self,
        manager: TransactionManager,
        image: Callable[[], MetadataImage] | None = None,
        access: AccessControl = NO_AUTHORIZATION,
    ) -> None:
        if access.enabled and image is None:
            raise ValueError("authorization needs the metadata image that holds the ACLs")
        self.manager = manager
        self._image: Callable[[], MetadataImage] = image or _no_image
        self.access = access

    def _require(self, caller: Caller, operation: AclOperation, resource: Resource) -> None:
        if self.access.enabled:
            self.access.require(self._image(), caller, operation, resource)

    def _writer(self, caller: Caller, transactional_id: str) -> TransactionManager:
        self._require(caller, AclOperation.WRITE, Resource.transactional_id(transactional_id))
        return self.manager

    async def init_producer_id(
        self, caller: Caller, transactional_id: str, timeout_ms: int,
        producer_id: int = -1, producer_epoch: int = -1,
    ) -> tuple[int, int]:
        return await self._writer(caller, transactional_id).init_producer_id(
            transactional_id, timeout_ms, producer_id, producer_epoch
        )

    async def add_partitions(
        self, caller: Caller, transactional_id: str, producer_id: int, producer_epoch: int,
        partitions: Sequence[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        manager = self._writer(caller, transactional_id)
        if self.access.enabled:
            image = self._image()
            denied = [
                tp for tp in partitions
                if not self.access.allows(image, caller, AclOperation.WRITE,
                                          Resource.topic(tp.topic))
            ]
            if denied:
                return {
                    tp: ErrorCode.TOPIC_AUTHORIZATION_FAILED if tp in denied
                    else ErrorCode.OPERATION_NOT_ATTEMPTED
                    for tp in partitions
                }
        return await manager.add_partitions(
            transactional_id, producer_id, producer_epoch, partitions
        )

    async def add_offsets(
        self, caller: Caller, transactional_id: str, producer_id: int, producer_epoch: int,
        group_id: str,
    ) -> None:
        manager = self._writer(caller, transactional_id)
        self._require(caller, AclOperation.READ, Resource.group(group_id))
        await manager.add_offsets(transactional_id, producer_id, producer_epoch, group_id)

    async def end_transaction(
        self, caller: Caller, transactional_id: str, producer_id: int, producer_epoch: int,
        committed: bool,
    ) -> None:
        await self._writer(caller, transactional_id).end_transaction(
            transactional_id, producer_id, producer_epoch, committed
        )

    def list_transactions(self, caller: Caller) -> tuple[ErrorCode, list[TxnRecord]]:
        """ListTransactions: the ids the caller may Describe (others left out, not denied)."""
        error, records = self.manager.list_transactions()
        if self.access.enabled:
            image = self._image()
            records = [
                r for r in records
                if self.access.allows(image, caller, AclOperation.DESCRIBE,
                                      Resource.transactional_id(r.transactional_id),
                                      count=False)
            ]
        return error, records

    def describe(self, caller: Caller, transactional_id: str) -> TxnRecord:
        """DescribeTransactions of one id: Describe on it; TRANSACTIONAL_ID_NOT_FOUND when
        this coordinator serves its partition but does not know it."""
        self._require(caller, AclOperation.DESCRIBE, Resource.transactional_id(transactional_id))
        record = self.manager.describe(transactional_id)
        if record is None or record.producer_epoch < 0:
            raise FjordError(f"transactional id {transactional_id!r} is unknown",
                             ErrorCode.TRANSACTIONAL_ID_NOT_FOUND)
        return record

    def require_writer(self, caller: Caller, transactional_id: str) -> None:
        """TxnOffsetCommit's TransactionalId check (the group checks are the group's)."""
        self._writer(caller, transactional_id)
