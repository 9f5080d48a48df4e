"""The consumer group state machine (Kafka's classic group protocol), pure: no I/O, no clock.

One :class:`GroupStateMachine` per group. Every method takes the current time (``now_ms``) from
the shell, and returns *effects* instead of performing them:

- :class:`Reply`: deliver a response to the request the shell tagged with ``request_id`` (a
  JoinGroup may be answered much later, when the join phase completes, and a SyncGroup when the
  leader's assignment has been written);
- :class:`AppendRecords`: append these ``__consumer_offsets`` records (acks=all) and then call
  :meth:`GroupStateMachine.append_completed` with the same ``append_id`` and the outcome;
- :class:`RebalanceStarted` / :class:`RebalanceCompleted`: for metrics and logs.

The shell also calls :meth:`GroupStateMachine.poll_timeouts` whenever
:meth:`GroupStateMachine.next_deadline` has passed (session timeouts, the join phase's rebalance
timeout and initial delay, the sync phase's timeout).

States (Kafka's)::

    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance
    CompletingRebalance --leader's assignment written--> Stable
    Stable | CompletingRebalance --join of new/changed member, leave, expiry--> PreparingRebalance
    PreparingRebalance --nobody left--> Empty;  Empty --delete / offsets expired--> Dead

Invariants (tested with hypothesis over random operation sequences):
- ``generation_id`` never decreases; it grows by one at the end of every join phase;
- in Stable and CompletingRebalance the group has members and a leader that is one of them;
  in Empty and Dead it has none;
- a Stable group's assignment covers exactly its members (one entry each);
- an offset commit by a member is accepted only with the current generation, and simple commits
  (generation < 0) only while the group is Empty;
- every request the shell handed in gets exactly one Reply (possibly later);
- every state change that must survive a coordinator failover is emitted as an AppendRecords
  before it is answered.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from fjord.coordinator import defaults
from fjord.coordinator.offsets_log import (
    NO_TIMESTAMP,
    GroupMetadataKey,
    GroupMetadataValue,
    LogRecord,
    MemberRecord,
    OffsetCommitKey,
    OffsetCommitValue,
    offsets_to_expire,
)
from fjord.errors import ErrorCode, FjordError, InvalidGroupIdError
from fjord.groups.defaults import CONSUMER_PROTOCOL_TYPE
from fjord.groups.protocol import decode_subscription
from fjord.groups.state import GroupState
from fjord.topic_partition import TopicPartition

UNKNOWN_MEMBER_ID = ""
NO_GENERATION = -1


@dataclass(frozen=True)
class GroupConfig:
    """The coordinator settings a group obeys (Kafka's broker settings; defaults in
    :mod:`fjord.coordinator.defaults`)."""

    min_session_timeout_ms: int = defaults.GROUP_MIN_SESSION_TIMEOUT_MS
    max_session_timeout_ms: int = defaults.GROUP_MAX_SESSION_TIMEOUT_MS
    initial_rebalance_delay_ms: int = defaults.GROUP_INITIAL_REBALANCE_DELAY_MS
    max_size: int = defaults.GROUP_MAX_SIZE
    new_member_join_timeout_ms: int = defaults.NEW_MEMBER_JOIN_TIMEOUT_MS
    offset_metadata_max_bytes: int = defaults.OFFSET_METADATA_MAX_BYTES
    offsets_retention_ms: int = defaults.OFFSETS_RETENTION_MS


# --- responses ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class JoinedMember:
    """One member in the leader's JoinGroup response: what the leader's assignor needs."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True)
class JoinGroupResponse:
    error: ErrorCode
    member_id: str
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    #: Every member and its metadata for the chosen protocol: only in the leader's response.
    members: tuple[JoinedMember, ...] = ()


@dataclass(frozen=True)
class SyncGroupResponse:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True)
class OffsetCommitResponse:
    errors: dict[TopicPartition, ErrorCode]


@dataclass(frozen=True)
class OffsetCommitRequestPartition:
    """One partition of an OffsetCommit request."""

    offset: int
    leader_epoch: int = -1
    metadata: str = ""


@dataclass(frozen=True)
class CommittedOffset:
    """OffsetFetch's answer for one partition; offset -1 when nothing is committed (Kafka)."""

    offset: int
    leader_epoch: int = -1
    metadata: str = ""


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupDescription:
    """DescribeGroups: protocol and member metadata/assignments only when Stable (Kafka)."""

    group_id: str
    state: GroupState
    protocol_type: str
    protocol: str
    members: tuple[MemberDescription, ...]


# --- effects ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """Deliver ``response`` to the request the shell tagged ``request_id``."""

    request_id: int
    response: JoinGroupResponse | SyncGroupResponse | OffsetCommitResponse


@dataclass(frozen=True)
class AppendRecords:
    """Append ``records`` to the group's ``__consumer_offsets`` partition (acks=all), then call
    :meth:`GroupStateMachine.append_completed` with ``append_id`` and the error (NONE if ok)."""

    append_id: int
    records: tuple[LogRecord, ...]


@dataclass(frozen=True)
class RebalanceStarted:
    generation_id: int
    reason: str


@dataclass(frozen=True)
class RebalanceCompleted:
    generation_id: int
    members: int


Effect = Reply | AppendRecords | RebalanceStarted | RebalanceCompleted


# --- members ------------------------------------------------------------------------------------


@dataclass
class _Member:
    """A member as the coordinator tracks it. ``join_request`` / ``sync_request`` are the ids of
    requests parked until the join / sync phase completes (Kafka's callbacks)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    last_heartbeat_ms: int
    assignment: bytes = b""
    join_request: int | None = None
    sync_request: int | None = None
    is_new: bool = False

    def metadata(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        raise FjordError(f"member {self.member_id} does not support protocol {protocol}")

    def session_deadline(self, new_member_join_timeout_ms: int) -> int | None:
        """When this member expires if nothing is heard from it (Kafka's shouldKeepAlive):
        a member parked in JoinGroup is kept alive (the rebalance timeout bounds it) unless it
        is brand new; one parked in SyncGroup is kept alive (the sync timeout bounds it)."""
        if self.join_request is not None:
            return self.last_heartbeat_ms + new_member_join_timeout_ms if self.is_new else None
        if self.sync_request is not None:
            return None
        return self.last_heartbeat_ms + self.session_timeout_ms


@dataclass
class _PendingAppend:
    kind: str  # "sync", "static", "commit", "other"
    generation_id: int = NO_GENERATION
    request_id: int | None = None
    assignments: dict[str, bytes] = field(default_factory=dict)
    offsets: dict[TopicPartition, OffsetCommitValue] = field(default_factory=dict)
    errors: dict[TopicPartition, ErrorCode] = field(default_factory=dict)
    static_old_member: _Member | None = None
    static_new_member_id: str = ""
    static_leader_id: str = ""


# Kafka's mapping of append errors to what group clients understand (GroupMetadataManager).
_APPEND_ERROR_MAP = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.FENCED_LEADER_EPOCH: ErrorCode.NOT_COORDINATOR,
    # A newer coordinator owns the partition (this one's epoch is fenced): clients find it.
    ErrorCode.TRANSACTION_COORDINATOR_FENCED: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.UNKNOWN_SERVER_ERROR,
    ErrorCode.INVALID_FETCH_SIZE: ErrorCode.UNKNOWN_SERVER_ERROR,
}


def map_append_error(error: ErrorCode) -> ErrorCode:
    """What a group client is told when appending to ``__consumer_offsets`` failed."""
    return _APPEND_ERROR_MAP.get(error, error)


def _new_member_id(client_id: str) -> str:
    return f"{client_id}-{uuid.uuid4()}"


class GroupStateMachine:
    """One consumer group: membership, generations, assignments and committed offsets.

    See the module docstring for states, effects and invariants. ``member_id_factory`` makes new
    member ids from a client id (Kafka: ``clientId-UUID``); tests inject a deterministic one.
    """

    def __init__(
        self,
        group_id: str,
        config: GroupConfig | None = None,
        *,
        now_ms: int = 0,
        member_id_factory: Callable[[str], str] = _new_member_id,
    ) -> None:
        if not group_id:
            raise InvalidGroupIdError("group id must be a non-empty string")
        self.group_id = group_id
        self.config = config or GroupConfig()
        self._new_member_id = member_id_factory
        self.state = GroupState.EMPTY
        self.state_timestamp_ms = now_ms
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.subscribed_topics: frozenset[str] | None = None
        self._members: dict[str, _Member] = {}
        self._static_members: dict[str, str] = {}  # group.instance.id -> member id
        self._pending_members: dict[str, int] = {}  # member id -> expiry (MEMBER_ID_REQUIRED)
        self._offsets: dict[TopicPartition, OffsetCommitValue] = {}
        # Join phase: deadline, and Kafka's InitialDelayedJoin bookkeeping.
        self._join_deadline: int | None = None
        self._initial_delay_remaining_ms: int | None = None
        self._new_member_added = False
        # Sync phase: members that have not sent SyncGroup yet, and the phase's deadline.
        self._pending_sync: set[str] = set()
        self._sync_deadline: int | None = None
        self._sync_append_in_flight = False
        self._appends: dict[int, _PendingAppend] = {}
        self._next_append_id = 1

    # --- loading ------------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        group_id: str,
        metadata: GroupMetadataValue | None,
        offsets: Mapping[TopicPartition, OffsetCommitValue],
        now_ms: int,
        config: GroupConfig | None = None,
        *,
        member_id_factory: Callable[[str], str] = _new_member_id,
    ) -> GroupStateMachine:
        """Rebuild a group from a ``__consumer_offsets`` replay (coordinator takeover): Stable
        with its stored members and assignments, or Empty. Members get a fresh session."""
        group = cls(group_id, config, now_ms=now_ms, member_id_factory=member_id_factory)
        group._offsets = dict(offsets)
        if metadata is None:
            return group
        group.generation_id = metadata.generation
        group.protocol_type = metadata.protocol_type or None
        group.protocol_name = metadata.protocol
        if metadata.current_state_timestamp != NO_TIMESTAMP:
            group.state_timestamp_ms = metadata.current_state_timestamp
        for record in metadata.members:
            protocol = metadata.protocol or ""
            group._members[record.member_id] = _Member(
                record.member_id,
                record.group_instance_id,
                record.client_id,
                record.client_host,
                record.rebalance_timeout_ms,
                record.session_timeout_ms,
                metadata.protocol_type,
                ((protocol, record.subscription),),
                now_ms,
                assignment=record.assignment,
            )
            if record.group_instance_id is not None:
                group._static_members[record.group_instance_id] = record.member_id
        if group._members:
            group.state = GroupState.STABLE
            group.state_timestamp_ms = now_ms
            group.leader_id = (
                metadata.leader if metadata.leader in group._members else next(iter(group._members))
            )
            group.subscribed_topics = group._compute_subscribed_topics()
        return group

    # --- read-only views ------------------------------------------------------------------------

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(self._members)

    @property
    def pending_members(self) -> tuple[str, ...]:
        return tuple(self._pending_members)

    def assignment(self, member_id: str) -> bytes:
        return self._members[member_id].assignment

    def member_instance_id(self, member_id: str) -> str | None:
        return self._members[member_id].group_instance_id

    def static_member(self, group_instance_id: str) -> str | None:
        return self._static_members.get(group_instance_id)

    @property
    def offsets(self) -> dict[TopicPartition, OffsetCommitValue]:
        return dict(self._offsets)

    @property
    def rebalance_timeout_ms(self) -> int:
        """The group's rebalance timeout: the largest of its members' (``max.poll.interval.ms``)."""
        return max((m.rebalance_timeout_ms for m in self._members.values()), default=0)

    def group_metadata_value(self) -> GroupMetadataValue:
        """The group metadata record for the current generation (what a replay restores)."""
        members: tuple[MemberRecord, ...] = ()
        if (
            self.state
            in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.PREPARING_REBALANCE)
            and self.protocol_name is not None
        ):
            members = tuple(self._member_record(m) for m in self._members.values())
        return GroupMetadataValue(
            self.protocol_type or "",
            self.generation_id,
            self.protocol_name,
            self.leader_id,
            self.state_timestamp_ms,
            members,
        )

    def _member_record(self, member: _Member, assignment: bytes | None = None) -> MemberRecord:
        protocol = self.protocol_name or ""
        subscription = next((md for name, md in member.protocols if name == protocol), b"")
        return MemberRecord(
            member.member_id,
            member.group_instance_id,
            member.client_id,
            member.client_host,
            member.rebalance_timeout_ms,
            member.session_timeout_ms,
            subscription,
            member.assignment if assignment is None else assignment,
        )

    # --- JoinGroup ------------------------------------------------------------------------------

    def join_group(
        self,
        request_id: int,
        now_ms: int,
        *,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        require_known_member_id: bool = True,
    ) -> list[Effect]:
        """Kafka's JoinGroup. A rebalance timeout <= 0 means "same as the session timeout"
        (JoinGroup v0). The reply may come in these effects or in later ones."""
        effects: list[Effect] = []
        protocols = tuple((str(name), bytes(md)) for name, md in protocols)

        def fail(error: ErrorCode, mid: str = member_id) -> list[Effect]:
            effects.append(Reply(request_id, JoinGroupResponse(error, mid)))
            return effects

        if not (
            self.config.min_session_timeout_ms
            <= session_timeout_ms
            <= self.config.max_session_timeout_ms
        ):
            return fail(ErrorCode.INVALID_SESSION_TIMEOUT)
        if rebalance_timeout_ms <= 0:
            rebalance_timeout_ms = session_timeout_ms
        if self.state is GroupState.DEAD:
            return fail(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if not self._supports_protocols(protocol_type, protocols):
            return fail(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)

        if member_id == UNKNOWN_MEMBER_ID:
            if group_instance_id is not None and group_instance_id in self._static_members:
                new_id = self._new_member_id(client_id)
                self._replace_static_member(
                    effects,
                    request_id,
                    now_ms,
                    group_instance_id,
                    new_id,
                    protocols,
                    rebalance_timeout_ms,
                    session_timeout_ms,
                )
                return effects
            if len(self._members) + len(self._pending_members) >= self.config.max_size:
                return fail(ErrorCode.GROUP_MAX_SIZE_REACHED)
            new_id = self._new_member_id(client_id)
            if group_instance_id is None and require_known_member_id:
                # KIP-394: make the client come back with its id before it counts as a member, so
                # a client that keeps timing out cannot pile up ghost members.
                self._pending_members[new_id] = now_ms + session_timeout_ms
                return fail(ErrorCode.MEMBER_ID_REQUIRED, new_id)
            self._add_member_and_rebalance(
                effects,
                request_id,
                now_ms,
                new_id,
                group_instance_id,
                client_id,
                client_host,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocol_type,
                protocols,
            )
            return effects

        # A known (or pending) member id.
        if member_id in self._pending_members:
            del self._pending_members[member_id]
            self._add_member_and_rebalance(
                effects,
                request_id,
                now_ms,
                member_id,
                group_instance_id,
                client_id,
                client_host,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocol_type,
                protocols,
            )
            return effects
        error = self._validate_member(member_id, group_instance_id, None)
        if error is not ErrorCode.NONE:
            return fail(error)
        if self.state is GroupState.EMPTY:
            return fail(ErrorCode.UNKNOWN_MEMBER_ID)
        member = self._members[member_id]
        member.last_heartbeat_ms = now_ms
        if self.state is GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(
                effects,
                request_id,
                now_ms,
                member,
                protocols,
                rebalance_timeout_ms,
                session_timeout_ms,
                "member rejoined",
            )
        elif self.state is GroupState.COMPLETING_REBALANCE:
            if member.protocols == protocols:
                # A retried JoinGroup whose answer was lost: answer again, same generation.
                self._supersede_join(effects, member)
                effects.append(Reply(request_id, self._join_response(member, leader_view=True)))
            else:
                self._update_member_and_rebalance(
                    effects,
                    request_id,
                    now_ms,
                    member,
                    protocols,
                    rebalance_timeout_ms,
                    session_timeout_ms,
                    f"member {member_id} changed its metadata",
                )
        else:  # Stable
            if member_id == self.leader_id or member.protocols != protocols:
                # The leader rejoins to make a new assignment (e.g. the topics' metadata changed);
                # a changed subscription needs a new assignment too.
                self._update_member_and_rebalance(
                    effects,
                    request_id,
                    now_ms,
                    member,
                    protocols,
                    rebalance_timeout_ms,
                    session_timeout_ms,
                    f"member {member_id} (leader or changed) rejoined",
                )
            else:
                effects.append(Reply(request_id, self._join_response(member, leader_view=False)))
        return effects

    def _supports_protocols(
        self, protocol_type: str, protocols: tuple[tuple[str, bytes], ...]
    ) -> bool:
        if not protocol_type or not protocols:
            return False
        if not self._members:
            return True
        return protocol_type == self.protocol_type and bool(
            self._candidate_protocols() & {name for name, _ in protocols}
        )

    def _candidate_protocols(self) -> set[str]:
        members = list(self._members.values())
        candidates = {name for name, _ in members[0].protocols}
        for member in members[1:]:
            candidates &= {name for name, _ in member.protocols}
        return candidates

    def select_protocol(self) -> str:
        """Kafka's vote: each member votes for its most preferred protocol that all members
        support; the most votes wins (ties go to the protocol first in the leader's order)."""
        candidates = self._candidate_protocols()
        votes: dict[str, int] = {}
        for member in self._members.values():
            choice = next(name for name, _ in member.protocols if name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        leader = self._members.get(self.leader_id or "") or next(iter(self._members.values()))
        order = [name for name, _ in leader.protocols]
        return max(votes, key=lambda name: (votes[name], -order.index(name)))

    def _add_member_and_rebalance(
        self,
        effects: list[Effect],
        request_id: int,
        now_ms: int,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: tuple[tuple[str, bytes], ...],
    ) -> None:
        member = _Member(
            member_id,
            group_instance_id,
            client_id,
            client_host,
            rebalance_timeout_ms,
            session_timeout_ms,
            protocol_type,
            protocols,
            now_ms,
            join_request=request_id,
            is_new=True,
        )
        if not self._members:
            self.protocol_type = protocol_type
        self._members[member_id] = member
        if self.leader_id is None:
            self.leader_id = member_id
        if group_instance_id is not None:
            self._static_members[group_instance_id] = member_id
        if (
            self.state is GroupState.PREPARING_REBALANCE
            and self._initial_delay_remaining_ms is not None
        ):
            self._new_member_added = True
        self._maybe_prepare_rebalance(effects, now_ms, f"member {member_id} joined")
        self._maybe_complete_join(effects, now_ms)

    def _update_member_and_rebalance(
        self,
        effects: list[Effect],
        request_id: int,
        now_ms: int,
        member: _Member,
        protocols: tuple[tuple[str, bytes], ...],
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        reason: str,
    ) -> None:
        self._supersede_join(effects, member)
        member.protocols = protocols
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        member.join_request = request_id
        self._maybe_prepare_rebalance(effects, now_ms, reason)
        self._maybe_complete_join(effects, now_ms)

    def _supersede_join(self, effects: list[Effect], member: _Member) -> None:
        # A newer JoinGroup from the same member replaces a parked one; the old call still gets
        # an answer so the shell never leaks a pending RPC.
        if member.join_request is not None:
            effects.append(
                Reply(
                    member.join_request,
                    JoinGroupResponse(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id),
                )
            )
            member.join_request = None

    def _replace_static_member(
        self,
        effects: list[Effect],
        request_id: int,
        now_ms: int,
        instance_id: str,
        new_member_id: str,
        protocols: tuple[tuple[str, bytes], ...],
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
    ) -> None:
        """KIP-345: a known ``group.instance.id`` joined without a member id (a restarted static
        member). It takes over the old member's place and assignment; the old member id is
        fenced. In Stable with an unchanged protocol choice there is no rebalance: the group
        record is rewritten and the member gets the current generation (with the old leader id,
        so that a rejoining leader does not run a pointless assignment - Kafka's rule)."""
        old_member_id = self._static_members[instance_id]
        old = self._members.pop(old_member_id)
        old_snapshot = replace(old)
        leader_before = self.leader_id or ""
        for parked in (old.join_request, old.sync_request):
            if parked is not None:
                response: JoinGroupResponse | SyncGroupResponse
                if parked == old.join_request:
                    response = JoinGroupResponse(ErrorCode.FENCED_INSTANCE_ID, old_member_id)
                else:
                    response = SyncGroupResponse(ErrorCode.FENCED_INSTANCE_ID)
                effects.append(Reply(parked, response))
        member = replace(
            old,
            member_id=new_member_id,
            protocols=protocols,
            rebalance_timeout_ms=rebalance_timeout_ms,
            session_timeout_ms=session_timeout_ms,
            last_heartbeat_ms=now_ms,
            join_request=request_id,
            sync_request=None,
        )
        self._members[new_member_id] = member
        self._static_members[instance_id] = new_member_id
        if self.leader_id == old_member_id:
            self.leader_id = new_member_id
        if old_member_id in self._pending_sync:
            self._pending_sync.discard(old_member_id)
            self._pending_sync.add(new_member_id)

        if self.state is GroupState.STABLE:
            if self.select_protocol() == self.protocol_name:
                record = self.group_metadata_value()
                self._append(
                    effects,
                    ((GroupMetadataKey(self.group_id), record),),
                    _PendingAppend(
                        "static",
                        self.generation_id,
                        request_id,
                        static_old_member=old_snapshot,
                        static_new_member_id=new_member_id,
                        static_leader_id=leader_before,
                    ),
                )
            else:
                self._prepare_rebalance(
                    effects, now_ms, f"static member {instance_id} rejoined with other protocols"
                )
        elif self.state is GroupState.COMPLETING_REBALANCE:
            # The leader may already hold the old member id in its assignment: start over.
            self._prepare_rebalance(effects, now_ms, f"static member {instance_id} replaced")
        else:  # PreparingRebalance: it simply takes part in the join phase.
            self._maybe_complete_join(effects, now_ms)

    def _join_response(self, member: _Member, *, leader_view: bool) -> JoinGroupResponse:
        assert self.protocol_name is not None
        members: tuple[JoinedMember, ...] = ()
        if leader_view and member.member_id == self.leader_id:
            members = tuple(
                JoinedMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
                for m in self._members.values()
            )
        return JoinGroupResponse(
            ErrorCode.NONE,
            member.member_id,
            self.generation_id,
            self.protocol_type,
            self.protocol_name,
            self.leader_id or "",
            members,
        )

    # --- rebalance phases -----------------------------------------------------------------------

    def _transition(self, state: GroupState, now_ms: int) -> None:
        self.state = state
        self.state_timestamp_ms = now_ms

    def _maybe_prepare_rebalance(self, effects: list[Effect], now_ms: int, reason: str) -> None:
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY):
            self._prepare_rebalance(effects, now_ms, reason)

    def _prepare_rebalance(self, effects: list[Effect], now_ms: int, reason: str) -> None:
        if self.state is GroupState.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_error(effects, ErrorCode.REBALANCE_IN_PROGRESS)
        self._pending_sync.clear()
        self._sync_deadline = None
        if self.state is GroupState.EMPTY:
            delay = self.config.initial_rebalance_delay_ms
            self._join_deadline = now_ms + delay
            self._initial_delay_remaining_ms = max(self.rebalance_timeout_ms - delay, 0)
            self._new_member_added = False
        else:
            self._join_deadline = now_ms + self.rebalance_timeout_ms
            self._initial_delay_remaining_ms = None
        self._transition(GroupState.PREPARING_REBALANCE, now_ms)
        effects.append(RebalanceStarted(self.generation_id, reason))
        # Kafka's tryCompleteElseWatch: a group whose members have all left completes at once.
        self._maybe_complete_join(effects, now_ms)

    def _reset_and_propagate_assignment_error(
        self, effects: list[Effect], error: ErrorCode
    ) -> None:
        for member in self._members.values():
            member.assignment = b""
            if member.sync_request is not None:
                effects.append(Reply(member.sync_request, SyncGroupResponse(error)))
                member.sync_request = None

    def _all_members_joined(self) -> bool:
        return not self._pending_members and all(
            m.join_request is not None for m in self._members.values()
        )

    def _maybe_complete_join(self, effects: list[Effect], now_ms: int) -> None:
        # Kafka's InitialDelayedJoin never completes early: it waits for more members.
        if (
            self.state is GroupState.PREPARING_REBALANCE
            and self._initial_delay_remaining_ms is None
            and self._all_members_joined()
        ):
            self._complete_join(effects, now_ms)

    def _complete_join(self, effects: list[Effect], now_ms: int) -> None:
        """End of the join phase: drop members that did not rejoin in time, bump the generation,
        pick the protocol and answer every parked JoinGroup (the leader gets the member list)."""
        for member in [m for m in self._members.values() if m.join_request is None]:
            self._remove_member(effects, member)
        self._join_deadline = None
        self._initial_delay_remaining_ms = None
        self.generation_id += 1
        if not self._members:
            self.protocol_name = None
            self.subscribed_topics = None
            self._transition(GroupState.EMPTY, now_ms)
            self._append(
                effects,
                ((GroupMetadataKey(self.group_id), self.group_metadata_value()),),
                _PendingAppend("other"),
            )
            effects.append(RebalanceCompleted(self.generation_id, 0))
            return
        self.protocol_name = self.select_protocol()
        self.subscribed_topics = self._compute_subscribed_topics()
        self._transition(GroupState.COMPLETING_REBALANCE, now_ms)
        for member in self._members.values():
            assert member.join_request is not None
            effects.append(
                Reply(member.join_request, self._join_response(member, leader_view=True))
            )
            member.join_request = None
            member.is_new = False
            member.last_heartbeat_ms = now_ms
        self._pending_sync = set(self._members)
        self._sync_deadline = now_ms + self.rebalance_timeout_ms
        self._sync_append_in_flight = False

    def _compute_subscribed_topics(self) -> frozenset[str] | None:
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self._members.values():
            try:
                topics.update(decode_subscription(member.metadata(self.protocol_name)).topics)
            except FjordError:
                return None  # not Kafka's consumer protocol bytes: we cannot know the topics
        return frozenset(topics)

    # --- SyncGroup ------------------------------------------------------------------------------

    def sync_group(
        self,
        request_id: int,
        now_ms: int,
        *,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
        assignments: Mapping[str, bytes] | None = None,
    ) -> list[Effect]:
        """Kafka's SyncGroup: followers wait for the leader's assignment; the leader's is written
        to the log first, then everybody is answered and the group is Stable."""
        effects: list[Effect] = []

        def reply(response: SyncGroupResponse) -> list[Effect]:
            effects.append(Reply(request_id, response))
            return effects

        if self.state is GroupState.DEAD:
            return reply(SyncGroupResponse(ErrorCode.COORDINATOR_NOT_AVAILABLE))
        error = self._validate_member(member_id, group_instance_id, generation_id)
        if error is not ErrorCode.NONE:
            return reply(SyncGroupResponse(error))
        if (protocol_type is not None and protocol_type != self.protocol_type) or (
            protocol_name is not None and protocol_name != self.protocol_name
        ):
            return reply(SyncGroupResponse(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
        if self.state is GroupState.EMPTY:
            return reply(SyncGroupResponse(ErrorCode.UNKNOWN_MEMBER_ID))
        if self.state is GroupState.PREPARING_REBALANCE:
            return reply(SyncGroupResponse(ErrorCode.REBALANCE_IN_PROGRESS))
        member = self._members[member_id]
        member.last_heartbeat_ms = now_ms
        self._pending_sync.discard(member_id)
        if not self._pending_sync:
            self._sync_deadline = None
        if self.state is GroupState.STABLE:
            return reply(
                SyncGroupResponse(
                    ErrorCode.NONE, self.protocol_type, self.protocol_name, member.assignment
                )
            )
        # CompletingRebalance: park the request until the assignment is written.
        if member.sync_request is not None:
            effects.append(
                Reply(member.sync_request, SyncGroupResponse(ErrorCode.REBALANCE_IN_PROGRESS))
            )
        member.sync_request = request_id
        if member_id == self.leader_id and not self._sync_append_in_flight:
            given = dict(assignments or {})
            # Members the leader left out get an empty assignment (Kafka); unknown ids are dropped.
            full = {mid: bytes(given.get(mid, b"")) for mid in self._members}
            record = replace(
                self.group_metadata_value(),
                members=tuple(
                    self._member_record(m, full[m.member_id]) for m in self._members.values()
                ),
            )
            self._sync_append_in_flight = True
            self._append(
                effects,
                ((GroupMetadataKey(self.group_id), record),),
                _PendingAppend("sync", self.generation_id, assignments=full),
            )
        return effects

    # --- Heartbeat and LeaveGroup ---------------------------------------------------------------

    def heartbeat(
        self,
        now_ms: int,
        *,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None = None,
    ) -> ErrorCode:
        """Kafka's Heartbeat: REBALANCE_IN_PROGRESS tells the member to rejoin."""
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = self._validate_member(member_id, group_instance_id, generation_id)
        if error is not ErrorCode.NONE:
            return error
        if self.state is GroupState.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._members[member_id].last_heartbeat_ms = now_ms
        if self.state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave_group(
        self, now_ms: int, members: Sequence[tuple[str, str | None]]
    ) -> tuple[list[ErrorCode], list[Effect]]:
        """Kafka's LeaveGroup (v3+: a batch of (member id, group.instance.id)); one error per
        member in request order."""
        effects: list[Effect] = []
        errors: list[ErrorCode] = []
        if self.state is GroupState.DEAD:
            return [ErrorCode.COORDINATOR_NOT_AVAILABLE] * len(members), effects
        for member_id, instance_id in members:
            if instance_id is not None:
                current = self._static_members.get(instance_id)
                if current is None:
                    errors.append(ErrorCode.UNKNOWN_MEMBER_ID)
                elif member_id != UNKNOWN_MEMBER_ID and member_id != current:
                    errors.append(ErrorCode.FENCED_INSTANCE_ID)
                else:
                    errors.append(ErrorCode.NONE)
                    self._remove_member_and_update_group(
                        effects, now_ms, self._members[current], f"static member {instance_id} left"
                    )
            elif member_id in self._pending_members:
                errors.append(ErrorCode.NONE)
                del self._pending_members[member_id]
                self._maybe_complete_join(effects, now_ms)
            elif member_id in self._members:
                errors.append(ErrorCode.NONE)
                self._remove_member_and_update_group(
                    effects, now_ms, self._members[member_id], f"member {member_id} left"
                )
            else:
                errors.append(ErrorCode.UNKNOWN_MEMBER_ID)
        return errors, effects

    def _validate_member(
        self, member_id: str, group_instance_id: str | None, generation_id: int | None
    ) -> ErrorCode:
        """Kafka's validateCurrentMember: fenced static instance, unknown member, generation."""
        if group_instance_id is not None:
            current = self._static_members.get(group_instance_id)
            if current is not None and current != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        member = self._members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group_instance_id is not None and member.group_instance_id not in (
            None,
            group_instance_id,
        ):
            return ErrorCode.FENCED_INSTANCE_ID
        if generation_id is not None and generation_id != self.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    def _remove_member(self, effects: list[Effect], member: _Member) -> None:
        """Forget a member; its parked requests are answered UNKNOWN_MEMBER_ID."""
        if member.join_request is not None:
            effects.append(
                Reply(
                    member.join_request,
                    JoinGroupResponse(ErrorCode.UNKNOWN_MEMBER_ID, member.member_id),
                )
            )
        if member.sync_request is not None:
            effects.append(
                Reply(member.sync_request, SyncGroupResponse(ErrorCode.UNKNOWN_MEMBER_ID))
            )
        del self._members[member.member_id]
        if member.group_instance_id is not None and (
            self._static_members.get(member.group_instance_id) == member.member_id
        ):
            del self._static_members[member.group_instance_id]
        self._pending_sync.discard(member.member_id)
        if self.leader_id == member.member_id:
            # Prefer a member that is already rejoining, so the next leader can assign.
            joined = [m.member_id for m in self._members.values() if m.join_request is not None]
            candidates = joined or list(self._members)
            self.leader_id = candidates[0] if candidates else None

    def _remove_member_and_update_group(
        self, effects: list[Effect], now_ms: int, member: _Member, reason: str
    ) -> None:
        self._remove_member(effects, member)
        if self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(effects, now_ms, reason)
        elif self.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(effects, now_ms)

    # --- time -----------------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """The earliest time at which :meth:`poll_timeouts` has something to do (None: never)."""
        deadlines = [d for d in (self._join_deadline, self._sync_deadline) if d is not None]
        deadlines.extend(self._pending_members.values())
        for member in self._members.values():
            deadline = member.session_deadline(self.config.new_member_join_timeout_ms)
            if deadline is not None:
                deadlines.append(deadline)
        return min(deadlines, default=None)

    def poll_timeouts(self, now_ms: int) -> list[Effect]:
        """Fire every timeout due at ``now_ms``, earliest first: member sessions, pending member
        ids, the join phase (initial delay, rebalance timeout) and the sync phase."""
        effects: list[Effect] = []
        # Each round handles one expiry; each expiry removes a member, pending id or deadline, so
        # the number of rounds is bounded by members + pending + 2 per phase change.
        for _ in range(4 * (len(self._members) + len(self._pending_members)) + 16):
            if self.state is GroupState.DEAD:
                break
            deadline = self.next_deadline()
            if deadline is None or deadline > now_ms:
                break
            self._fire_one(effects, now_ms, deadline)
        return effects

    def _fire_one(self, effects: list[Effect], now_ms: int, deadline: int) -> None:
        for member in list(self._members.values()):
            if member.session_deadline(self.config.new_member_join_timeout_ms) == deadline:
                self._remove_member_and_update_group(
                    effects, now_ms, member, f"member {member.member_id} session expired"
                )
                return
        for member_id, expiry in list(self._pending_members.items()):
            if expiry == deadline:
                del self._pending_members[member_id]
                self._maybe_complete_join(effects, now_ms)
                return
        if self._join_deadline == deadline:
            remaining = self._initial_delay_remaining_ms
            if remaining is not None and self._new_member_added and remaining > 0:
                # Kafka's InitialDelayedJoin: a member arrived during the delay, wait once more.
                delay = min(self.config.initial_rebalance_delay_ms, remaining)
                self._initial_delay_remaining_ms = max(remaining - delay, 0)
                self._new_member_added = False
                self._join_deadline = deadline + delay
            else:
                self._complete_join(effects, now_ms)
            return
        if self._sync_deadline == deadline:
            # Members that never sent SyncGroup within the rebalance timeout are dropped.
            self._sync_deadline = None
            late = [
                self._members[mid] for mid in sorted(self._pending_sync) if mid in self._members
            ]
            self._pending_sync.clear()
            for member in late:
                self._remove_member(effects, member)
            if late and self.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
                self._prepare_rebalance(effects, now_ms, "members did not sync in time")
                self._maybe_complete_join(effects, now_ms)
            return
        raise AssertionError(f"deadline {deadline} matched nothing")  # pragma: no cover

    # --- appends ----------------------------------------------------------------------------------

    def _append(
        self, effects: list[Effect], records: tuple[LogRecord, ...], pending: _PendingAppend
    ) -> int:
        append_id = self._next_append_id
        self._next_append_id += 1
        self._appends[append_id] = pending
        effects.append(AppendRecords(append_id, records))
        return append_id

    def append_completed(self, append_id: int, error: ErrorCode, now_ms: int) -> list[Effect]:
        """The shell's report that :class:`AppendRecords` ``append_id`` was written (``error``
        NONE) or failed. Answers the requests that waited for it."""
        effects: list[Effect] = []
        pending = self._appends.pop(append_id, None)
        if pending is None:
            return effects
        error = map_append_error(error)
        if pending.kind == "sync":
            self._complete_sync(effects, now_ms, pending, error)
        elif pending.kind == "static":
            self._complete_static(effects, now_ms, pending, error)
        elif pending.kind == "commit":
            self._complete_commit(effects, pending, error)
        return effects

    def _complete_sync(
        self, effects: list[Effect], now_ms: int, pending: _PendingAppend, error: ErrorCode
    ) -> None:
        if (
            self.state is not GroupState.COMPLETING_REBALANCE
            or pending.generation_id != self.generation_id
        ):
            return  # a rebalance overtook this assignment; its members were answered already
        self._sync_append_in_flight = False
        if error is not ErrorCode.NONE:
            self._reset_and_propagate_assignment_error(effects, error)
            self._prepare_rebalance(effects, now_ms, f"writing the assignment failed: {error.name}")
            self._maybe_complete_join(effects, now_ms)
            return
        for member in self._members.values():
            member.assignment = pending.assignments.get(member.member_id, b"")
            if member.sync_request is not None:
                effects.append(
                    Reply(
                        member.sync_request,
                        SyncGroupResponse(
                            ErrorCode.NONE,
                            self.protocol_type,
                            self.protocol_name,
                            member.assignment,
                        ),
                    )
                )
                member.sync_request = None
                member.last_heartbeat_ms = now_ms
        self._transition(GroupState.STABLE, now_ms)
        effects.append(RebalanceCompleted(self.generation_id, len(self._members)))

    def _complete_static(
        self, effects: list[Effect], now_ms: int, pending: _PendingAppend, error: ErrorCode
    ) -> None:
        new_id = pending.static_new_member_id
        member = self._members.get(new_id)
        if (
            member is None
            or member.join_request != pending.request_id
            or self.state is not GroupState.STABLE
        ):
            # Removed, or a rebalance started meanwhile: the join phase answers this request
            # (the group record is rewritten when that rebalance completes).
            return
        if error is not ErrorCode.NONE:
            old = pending.static_old_member
            assert old is not None and old.group_instance_id is not None
            del self._members[new_id]
            self._members[old.member_id] = replace(
                old, join_request=None, sync_request=None, last_heartbeat_ms=now_ms
            )
            self._static_members[old.group_instance_id] = old.member_id
            if self.leader_id == new_id:
                self.leader_id = old.member_id
            assert pending.request_id is not None
            effects.append(Reply(pending.request_id, JoinGroupResponse(error, new_id)))
            return
        member.join_request = None
        member.is_new = False
        member.last_heartbeat_ms = now_ms
        assert pending.request_id is not None
        effects.append(
            Reply(
                pending.request_id,
                JoinGroupResponse(
                    ErrorCode.NONE,
                    new_id,
                    self.generation_id,
                    self.protocol_type,
                    self.protocol_name,
                    pending.static_leader_id,
                ),
            )
        )

    # --- offsets ----------------------------------------------------------------------------------

    def commit_offsets(
        self,
        request_id: int,
        now_ms: int,
        *,
        member_id: str,
        generation_id: int,
        offsets: Mapping[TopicPartition, OffsetCommitRequestPartition],
        group_instance_id: str | None = None,
    ) -> list[Effect]:
        """Kafka's OffsetCommit. Members commit with their generation (fenced otherwise); a
        commit with generation < 0 and no member id (admin tools, ``assign()`` consumers) is
        accepted only while the group is Empty. Offsets count once their records are written."""
        effects: list[Effect] = []

        def reply_all(error: ErrorCode) -> list[Effect]:
            effects.append(Reply(request_id, OffsetCommitResponse({tp: error for tp in offsets})))
            return effects

        if self.state is GroupState.DEAD:
            return reply_all(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        simple = generation_id < 0 and member_id == UNKNOWN_MEMBER_ID and group_instance_id is None
        if simple:
            if self.state is not GroupState.EMPTY:
                # While the group has members, only they may commit.
                return reply_all(ErrorCode.UNKNOWN_MEMBER_ID)
        else:
            error = self._validate_member(member_id, group_instance_id, generation_id)
            if error is not ErrorCode.NONE:
                return reply_all(error)
            if self.state is GroupState.COMPLETING_REBALANCE:
                return reply_all(ErrorCode.REBALANCE_IN_PROGRESS)
            if self.state is GroupState.EMPTY:
                return reply_all(ErrorCode.UNKNOWN_MEMBER_ID)
            # Stable, or PreparingRebalance: members commit what they consumed before they rejoin.
            self._members[member_id].last_heartbeat_ms = now_ms
        errors: dict[TopicPartition, ErrorCode] = {}
        accepted: dict[TopicPartition, OffsetCommitValue] = {}
        for tp, request in offsets.items():
            if len(request.metadata.encode("utf-8")) > self.config.offset_metadata_max_bytes:
                errors[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            elif request.offset < 0:
                errors[tp] = ErrorCode.INVALID_COMMIT_OFFSET_SIZE
            else:
                accepted[tp] = OffsetCommitValue(
                    request.offset, request.leader_epoch, request.metadata, now_ms
                )
        if not accepted:
            effects.append(Reply(request_id, OffsetCommitResponse(errors)))
            return effects
        records: tuple[LogRecord, ...] = tuple(
            (OffsetCommitKey(self.group_id, tp[0], tp[1]), value) for tp, value in accepted.items()
        )
        self._append(
            effects,
            records,
            _PendingAppend(
                "commit", self.generation_id, request_id, offsets=accepted, errors=errors
            ),
        )
        return effects

    def check_txn_commit(
        self, member_id: str, generation_id: int, group_instance_id: str | None
    ) -> ErrorCode:
        """Kafka's TxnOffsetCommit check: a member's generation must be current (a commit
        with generation < 0 and no member id is not checked, as Kafka's older clients send)."""
        if self.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and member_id == UNKNOWN_MEMBER_ID:
            return ErrorCode.NONE
        return self._validate_member(member_id, group_instance_id, generation_id)

    def materialize_txn_offsets(
        self, request_id: int, now_ms: int, offsets: Mapping[TopicPartition, OffsetCommitValue]
    ) -> list[Effect]:
        """The transaction that committed ``offsets`` (TxnOffsetCommit) committed: append them
        as ordinary commits and count them once written, whatever the group's state (they were
        checked when committed). Replies an OffsetCommitResponse."""
        effects: list[Effect] = []
        if self.state is GroupState.DEAD:
            effects.append(Reply(request_id, OffsetCommitResponse(
                dict.fromkeys(offsets, ErrorCode.COORDINATOR_NOT_AVAILABLE))))
            return effects
        accepted = dict(offsets)
        records: tuple[LogRecord, ...] = tuple(
            (OffsetCommitKey(self.group_id, tp[0], tp[1]), value) for tp, value in accepted.items()
        )
        self._append(
            effects,
            records,
            _PendingAppend("commit", self.generation_id, request_id, offsets=accepted),
        )
        return effects

    def _complete_commit(
        self, effects: list[Effect], pending: _PendingAppend, error: ErrorCode
    ) -> None:
        errors = dict(pending.errors)
        for tp, value in pending.offsets.items():
            errors[tp] = error
            if error is ErrorCode.NONE and self.state is not GroupState.DEAD:
                self._offsets[tp] = value
        assert pending.request_id is not None
        effects.append(Reply(pending.request_id, OffsetCommitResponse(errors)))

    def fetch_offsets(
        self, partitions: Sequence[TopicPartition] | None = None
    ) -> dict[TopicPartition, CommittedOffset]:
        """Kafka's OffsetFetch: the committed offset of each partition asked for (-1 when none);
        all committed partitions when ``partitions`` is None."""
        wanted = sorted(self._offsets) if partitions is None else list(partitions)
        result = {}
        for tp in wanted:
            value = self._offsets.get(tp)
            result[tp] = (
                CommittedOffset(-1)
                if value is None
                else CommittedOffset(value.offset, value.leader_epoch, value.metadata)
            )
        return result

    def expire_offsets(self, now_ms: int) -> list[Effect]:
        """Drop offsets past ``offsets.retention.minutes`` (see
        :func:`~fjord.coordinator.offsets_log.offsets_to_expire`) and write their tombstones; an
        Empty group left without offsets dies (and its group record is deleted too)."""
        effects: list[Effect] = []
        if self.state is GroupState.DEAD:
            return effects
        expired = offsets_to_expire(
            self._offsets,
            now_ms=now_ms,
            retention_ms=self.config.offsets_retention_ms,
            group_is_empty=self.state is GroupState.EMPTY,
            protocol_type=self.protocol_type,
            empty_since_ms=self.state_timestamp_ms,
            subscribed_topics=self.subscribed_topics,
        )
        records: list[LogRecord] = []
        for tp in expired:
            del self._offsets[tp]
            records.append((OffsetCommitKey(self.group_id, tp[0], tp[1]), None))
        if self.state is GroupState.EMPTY and not self._offsets and not self._pending_commits():
            self._transition(GroupState.DEAD, now_ms)
            records.append((GroupMetadataKey(self.group_id), None))
        if records:
            self._append(effects, tuple(records), _PendingAppend("other"))
        return effects

    def _pending_commits(self) -> bool:
        return any(p.kind == "commit" for p in self._appends.values())

    # --- admin ------------------------------------------------------------------------------------

    def describe(self) -> GroupDescription:
        """Kafka's DescribeGroups view of this group."""
        stable = self.state is GroupState.STABLE
        members = tuple(
            MemberDescription(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata(self.protocol_name) if stable and self.protocol_name else b"",
                m.assignment if stable else b"",
            )
            for m in self._members.values()
        )
        return GroupDescription(
            self.group_id,
            self.state,
            self.protocol_type or "",
            (self.protocol_name or "") if stable else "",
            members,
        )

    def delete(self, now_ms: int) -> tuple[ErrorCode, list[Effect]]:
        """Kafka's DeleteGroups: only an Empty group (NON_EMPTY_GROUP otherwise); tombstones for
        the group record and every committed offset; the group is Dead afterwards."""
        effects: list[Effect] = []
        if self.state is GroupState.DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND, effects
        if self.state is not GroupState.EMPTY:
            return ErrorCode.NON_EMPTY_GROUP, effects
        records: list[LogRecord] = [
            (OffsetCommitKey(self.group_id, tp[0], tp[1]), None) for tp in sorted(self._offsets)
        ]
        records.append((GroupMetadataKey(self.group_id), None))
        self._offsets.clear()
        self._pending_members.clear()
        self._transition(GroupState.DEAD, now_ms)
        self._append(effects, tuple(records), _PendingAppend("other"))
        return ErrorCode.NONE, effects
