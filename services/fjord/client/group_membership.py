"""A consumer's side of the classic group protocol, as a pure state machine (no I/O, no clock).

:class:`GroupMembership` decides; the consumer's shell
(``fjord.client.consumer_coordinator``) does the JoinGroup/SyncGroup/Heartbeat/LeaveGroup/
OffsetCommit calls it asks for and reports their answers back, with the time as ``now_ms``
(a monotonic millisecond clock the shell injects).

What it decides (Kafka's ``ConsumerCoordinator`` / ``AbstractCoordinator`` rules):

* **Subscription**: a topic list, or a regular expression matched in full against every
  non-internal topic name (``update_metadata`` resolves it); a change of the matching set or a
  growing partition count of a subscribed topic asks for a rejoin.
* **Rebalance protocol**: cooperative when every configured assignor supports it (only
  ``cooperative-sticky``), else eager (Kafka picks the highest protocol all assignors share).
  Eager: :meth:`start_join` revokes everything owned before JoinGroup. Cooperative: nothing is
  revoked before joining; after SyncGroup only the partitions no longer assigned are revoked
  and, if any were, the member rejoins at once (KIP-429), while the others keep being fetched.
* **Errors** (:func:`action_for_error`): REBALANCE_IN_PROGRESS rejoins; ILLEGAL_GENERATION and
  UNKNOWN_MEMBER_ID reset the generation (the latter also the member id) and *lose* the owned
  partitions (Kafka's onPartitionsLost: no commit); NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE
  / transport errors rediscover the coordinator; FENCED_INSTANCE_ID and protocol/config errors
  are fatal and surface to the application (after a fatal heartbeat or commit answer the member
  loses its partitions and stops until ``subscribe`` is called again).
* **Deadlines**: heartbeats every ``heartbeat.interval.ms`` while Stable; auto commit every
  ``auto.commit.interval.ms``; ``max.poll.interval.ms`` after the last ``poll()`` the member
  leaves (a dynamic one sends LeaveGroup; a static one only stops heartbeating) and the next
  ``poll()`` reports :class:`~fjord.errors.MaxPollIntervalExceededError`; metadata (for patterns
  and partition counts) every ``metadata.max.age.ms``.

Invariants (property-tested in ``tests/unit/test_group_membership.py``):

* ``owned`` is empty unless ``state`` is STABLE or a cooperative member is rejoining;
* the generation and member id only change through JoinGroup answers or resets;
* in the cooperative protocol, a partition that stays assigned is never in a revoked set;
* every partition the member gave up is reported exactly once, as revoked or as lost;
* answers carrying a generation other than the current one are ignored (stale).

The instance is not thread-safe: the consumer calls it with its lock held.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from fjord.errors import ErrorCode
from fjord.groups.assignors import (
    COOPERATIVE,
    EAGER,
    REBALANCE_PROTOCOL,
    leader_assignments,
    partition_changes,
)
from fjord.groups.protocol import (
    NO_GENERATION,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_subscription,
)
from fjord.topic_partition import TopicPartition

UNKNOWN_MEMBER_ID = ""
"""The member id of a member that has not joined (or was reset): JoinGroup assigns one."""


class MemberState(Enum):
    """Kafka's ``MemberState``: where this member is in the join protocol."""

    UNJOINED = "unjoined"  # no generation: must join before consuming group partitions
    PREPARING_REBALANCE = "preparing-rebalance"  # JoinGroup sent, not answered yet
    COMPLETING_REBALANCE = "completing-rebalance"  # SyncGroup sent, not answered yet
    STABLE = "stable"  # has a generation and an assignment; heartbeats


class GroupAction(Enum):
    """What the shell does after an answer (or an error) from the coordinator."""

    NONE = "none"  # success: carry on
    SYNC = "sync"  # JoinGroup succeeded: send SyncGroup (the leader with assignments)
    JOIN_AGAIN = "join-again"  # send JoinGroup again now (e.g. MEMBER_ID_REQUIRED)
    REJOIN = "rejoin"  # a rebalance is needed: the next poll() starts one
    RESET = "reset"  # generation (and maybe member id) reset; owned partitions are lost
    REDISCOVER = "rediscover"  # the coordinator moved or is down: FindCoordinator, retry
    RETRY = "retry"  # transient (coordinator loading): back off and retry the same call
    FATAL = "fatal"  # surface the error to the application


_REDISCOVER = {
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.REQUEST_TIMED_OUT,
}
_RESET = {ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID}


def action_for_error(code: ErrorCode) -> GroupAction:
    """Kafka's handling of a group error code, common to every group request."""
    if code is ErrorCode.NONE:
        return GroupAction.NONE
    if code is ErrorCode.REBALANCE_IN_PROGRESS:
        return GroupAction.REJOIN
    if code in _RESET:
        return GroupAction.RESET
    if code in _REDISCOVER:
        return GroupAction.REDISCOVER
    if code is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
        return GroupAction.RETRY
    if code is ErrorCode.MEMBER_ID_REQUIRED:
        return GroupAction.JOIN_AGAIN
    if code.retriable:  # e.g. a broker without metadata yet answering FindCoordinator
        return GroupAction.REDISCOVER
    return GroupAction.FATAL


def rebalance_protocol(strategies: Sequence[str]) -> str:
    """The protocol every configured assignor supports: cooperative only if all of them do."""
    if strategies and all(REBALANCE_PROTOCOL[s] == COOPERATIVE for s in strategies):
        return COOPERATIVE
    return EAGER


def topics_matching(pattern: re.Pattern[str], topics: Iterable[str]) -> frozenset[str]:
    """Topics whose whole name matches ``pattern`` (Java's ``Matcher.matches``), internal topics
    (names starting with ``__``) excluded as Kafka's ``exclude.internal.topics`` does."""
    return frozenset(t for t in topics if not t.startswith("__") and pattern.fullmatch(t))


@dataclass(frozen=True)
class JoinRequest:
    """The fields of the JoinGroup request the shell sends."""

    member_id: str
    group_instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    reason: str


@dataclass(frozen=True)
class Rebalanced:
    """A completed rebalance, for the thread that calls ``poll()``: revoke ``revoked`` (commit
    first when auto commit is on, then ``on_revoke``), assign ``added`` (positions from the
    committed offsets, then ``on_assign``). ``assignment`` is the whole new assignment;
    ``rejoin``: the cooperative protocol revoked something, so join again right after."""

    generation: int
    assignment: tuple[TopicPartition, ...]
    revoked: tuple[TopicPartition, ...]
    added: tuple[TopicPartition, ...]
    rejoin: bool


@dataclass(frozen=True)
class MembershipConfig:
    """The consumer properties the membership obeys (defaults live in ``fjord.config``)."""

    group_id: str
    group_instance_id: str | None
    strategies: tuple[str, ...]
    session_timeout_ms: int
    heartbeat_interval_ms: int
    max_poll_interval_ms: int
    auto_commit_interval_ms: int | None  # None: enable.auto.commit is off
    metadata_max_age_ms: int
    retry_backoff_ms: int


class GroupMembership:
    """One consumer's membership in its group.

    State: ``member_id`` ("" before the first JoinGroup answer), ``generation`` (-1 when none),
    ``state`` (:class:`MemberState`), ``protocol`` (the assignor the group chose), ``leader_id``,
    ``owned`` (partitions the group gave this member and it has not given up), the subscription
    (``subscribed_topics`` resolved; ``pattern`` when subscribed by pattern), ``rejoin_needed``
    with its reason, and the deadlines of the next heartbeat, auto commit, metadata refresh and
    of ``max.poll.interval.ms``. See the module docstring for the rules and invariants.
    """

    def __init__(self, config: MembershipConfig, now_ms: int) -> None:
        for name in config.strategies:
            if name not in REBALANCE_PROTOCOL:
                raise ValueError(f"unknown assignor {name!r}")
        self.config = config
        self.protocol_kind = rebalance_protocol(config.strategies)
        self.member_id = UNKNOWN_MEMBER_ID
        self.generation = NO_GENERATION
        self.state = MemberState.UNJOINED
        self.protocol: str | None = None
        self.leader_id = ""
        self.owned: frozenset[TopicPartition] = frozenset()
        # The last assignment, kept across an eager revocation so that the eager sticky
        # assignor can still see what this member had (Kafka sends it as sticky user data).
        self._previous: tuple[TopicPartition, ...] = ()
        self.pattern: re.Pattern[str] | None = None
        self.subscribed_topics: frozenset[str] = frozenset()
        self._requested_topics: frozenset[str] = frozenset()
        self.rejoin_needed = False
        self.rejoin_reason = ""
        # Partition counts of the subscribed topics when the member last joined: a growth
        # asks for a rebalance (new partitions need an owner).
        self._joined_counts: dict[str, int] = {}
        self._leader_topics: frozenset[str] = frozenset()
        self.last_poll_ms = now_ms
        self.poll_expired = False
        self._next_heartbeat_ms: int | None = None
        self._last_heartbeat_ok_ms = now_ms
        self._next_auto_commit_ms = (
            now_ms + config.auto_commit_interval_ms
            if config.auto_commit_interval_ms is not None
            else None
        )
        #: Auto commits started so far, each an interval after the previous one, whether or not
        #: it had an offset to send (what a caller waits on to know that some ran).
        self.auto_commits_started = 0
        self._next_metadata_ms = now_ms
        self._lost: tuple[TopicPartition, ...] = ()

    # -- subscription -----------------------------------------------------------------------

    @property
    def subscribed(self) -> bool:
        return self.pattern is not None or bool(self._requested_topics)

    @property
    def is_leader(self) -> bool:
        return bool(self.member_id) and self.member_id == self.leader_id

    @property
    def is_static(self) -> bool:
        return self.config.group_instance_id is not None

    def subscribe(self, topics: Iterable[str]) -> None:
        """Subscribe to exactly these topics (replacing a pattern); rejoin if they changed."""
        wanted = frozenset(topics)
        changed = self.pattern is not None or wanted != self.subscribed_topics
        self.pattern = None
        self._requested_topics = wanted
        self.subscribed_topics = wanted
        if changed or self.state is MemberState.UNJOINED:
            self.request_rejoin("subscription changed")

    def subscribe_pattern(self, pattern: re.Pattern[str], now_ms: int) -> None:
        """Subscribe to every topic matching ``pattern``; the matching set is resolved by the
        next :meth:`update_metadata` (due at once)."""
        self.pattern = pattern
        self._requested_topics = frozenset()
        self.subscribed_topics = frozenset()
        self._next_metadata_ms = now_ms
        self.request_rejoin("subscription changed")

    def unsubscribe(self) -> tuple[tuple[TopicPartition, ...], bool]:
        """Give everything up: (partitions to revoke, whether to send LeaveGroup). The member
        id is reset so that a later subscribe joins as a new member."""
        revoked = tuple(sorted(self.owned))
        leave = self._should_leave()
        self.pattern = None
        self._requested_topics = frozenset()
        self.subscribed_topics = frozenset()
        self._reset(reset_member_id=True)
        self.rejoin_needed = False
        return revoked, leave

    def _should_leave(self) -> bool:
        # Kafka's maybeLeaveGroup: only a dynamic member with an id leaves; a static member is
        # left to expire by session timeout so that a restart gets its partitions back.
        return not self.is_static and self.member_id != UNKNOWN_MEMBER_ID

    def metadata_due(self, now_ms: int) -> bool:
        return self.subscribed and now_ms >= self._next_metadata_ms

    def update_metadata(
        self, now_ms: int, partition_counts: Mapping[str, int], all_topics: bool
    ) -> bool:
        """Take a metadata answer (``partition_counts``: topic -> count; ``all_topics``: it
        lists every topic, as a pattern needs). Resolves the pattern, and asks for a rejoin
        (returns True) when the subscribed set changed or a subscribed topic (the leader: any
        topic of the group) has more partitions than when the member joined."""
        self._next_metadata_ms = now_ms + self.config.metadata_max_age_ms
        if self.pattern is not None and all_topics:
            matching = topics_matching(self.pattern, partition_counts)
            if matching != self.subscribed_topics:
                self.subscribed_topics = matching
                self.request_rejoin("the topics matching the subscribed pattern changed")
                return True
        if self.state is not MemberState.STABLE:
            return False
        watched = self.subscribed_topics | (self._leader_topics if self.is_leader else frozenset())
        for topic in sorted(watched):
            count = partition_counts.get(topic)
            known = self._joined_counts.get(topic)
            if count is not None and (known is None or count > known):
                self._joined_counts[topic] = count
                if known is not None or topic in self.subscribed_topics:
                    self.request_rejoin(f"topic {topic!r} now has {count} partitions")
                    return True
        return False

    def topics_to_watch(self) -> frozenset[str]:
        """Topics whose metadata the member refreshes (the leader also watches the topics
        other members subscribe to)."""
        return self.subscribed_topics | (self._leader_topics if self.is_leader else frozenset())

    # -- joining ----------------------------------------------------------------------------

    def request_rejoin(self, reason: str) -> None:
        self.rejoin_needed = True
        self.rejoin_reason = reason

    def should_start_join(self) -> bool:
        """A rebalance is wanted and none is in flight (the shell asks from ``poll()``)."""
        return (
            self.rejoin_needed
            and self.subscribed
            and self.state in (MemberState.UNJOINED, MemberState.STABLE)
        )

    def start_join(self) -> tuple[TopicPartition, ...]:
        """Enter PREPARING_REBALANCE; returns the partitions to revoke *before* JoinGroup
        (eager: all owned; cooperative: none)."""
        revoked: tuple[TopicPartition, ...] = ()
        if self.protocol_kind == EAGER:
            revoked = tuple(sorted(self.owned))
            if self.owned:
                self._previous = revoked
            self.owned = frozenset()
        self.state = MemberState.PREPARING_REBALANCE
        self.rejoin_needed = False
        self._next_heartbeat_ms = None
        return revoked

    def join_request(self) -> JoinRequest:
        """The JoinGroup request: one protocol per configured assignor, in preference order,
        each with this member's Subscription (owned partitions and their generation)."""
        owned = tuple(sorted(self.owned)) if self.owned else self._previous
        subscription = encode_subscription(
            Subscription(
                tuple(sorted(self.subscribed_topics)),
                None,
                owned,
                self.generation if self.owned else NO_GENERATION,
            )
        )
        return JoinRequest(
            self.member_id,
            self.config.group_instance_id,
            self.config.session_timeout_ms,
            self.config.max_poll_interval_ms,
            tuple((name, subscription) for name in self.config.strategies),
            self.rejoin_reason,
        )

    def join_completed(
        self,
        error: ErrorCode,
        *,
        member_id: str,
        generation: int,
        protocol: str,
        leader_id: str,
        members: Sequence[tuple[str, str | None, bytes]] = (),
    ) -> GroupAction:
        """The JoinGroup answer. On success the member has a generation and goes on to
        SyncGroup (:meth:`assignments_to_send` for the leader); MEMBER_ID_REQUIRED keeps the
        given member id and joins again. Other errors: see :func:`action_for_error`."""
        if self.state is not MemberState.PREPARING_REBALANCE:
            return GroupAction.NONE  # stale (unsubscribed/closed meanwhile)
        action = action_for_error(error)
        if action is GroupAction.NONE:
            if protocol not in self.config.strategies:
                self._back_to_unjoined()
                return GroupAction.FATAL
            self.member_id = member_id
            self.generation = generation
            self.protocol = protocol
            self.leader_id = leader_id
            self._leader_topics = frozenset()
            if self.is_leader:
                topics: set[str] = set()
                for _, _, metadata in members:
                    topics.update(decode_subscription(metadata).topics)
                self._leader_topics = frozenset(topics)
            self.state = MemberState.COMPLETING_REBALANCE
            return GroupAction.SYNC
        if action is GroupAction.JOIN_AGAIN:
            self.member_id = member_id
            return action
        if action is GroupAction.REJOIN:
            return GroupAction.JOIN_AGAIN
        if action is GroupAction.RESET:
            # Lost partitions are collected by the caller through take_lost().
            self._lost_on_reset(reset_member_id=error is ErrorCode.UNKNOWN_MEMBER_ID)
            return action
        self._back_to_unjoined()
        return action

    def assignments_to_send(
        self, members: Sequence[tuple[str, str | None, bytes]], partition_counts: Mapping[str, int]
    ) -> dict[str, bytes]:
        """The leader's SyncGroup assignments: run the chosen assignor over the members of the
        JoinGroup answer (member id, instance id, Subscription bytes)."""
        assert self.protocol is not None
        self._joined_counts.update(
            {t: c for t, c in partition_counts.items() if t in self._leader_topics}
        )
        return leader_assignments(self.protocol, members, partition_counts)

    def sync_completed(
        self, error: ErrorCode, assignment: bytes, partition_counts: Mapping[str, int]
    ) -> GroupAction | Rebalanced:
        """The SyncGroup answer: on success the new assignment as a :class:`Rebalanced` (the
        member is STABLE); else the action for the error."""
        if self.state is not MemberState.COMPLETING_REBALANCE:
            return GroupAction.NONE
        action = action_for_error(error)
        if action is not GroupAction.NONE:
            if action is GroupAction.REJOIN:
                self.state = MemberState.PREPARING_REBALANCE
                return GroupAction.JOIN_AGAIN
            if action is GroupAction.RESET:
                self._lost_on_reset(reset_member_id=error is ErrorCode.UNKNOWN_MEMBER_ID)
                return action
            self._back_to_unjoined()
            return action
        assigned = tuple(sorted(set(decode_assignment(assignment).partitions)))
        assert self.protocol is not None
        changes = partition_changes(self.owned, assigned, self.protocol_kind)
        self.owned = frozenset(assigned)
        self._previous = assigned
        self.state = MemberState.STABLE
        self._joined_counts.update(
            {t: c for t, c in partition_counts.items() if t in self.subscribed_topics}
        )
        revoked = changes.revoked if self.protocol_kind == COOPERATIVE else ()
        if changes.rejoin:
            self.request_rejoin("partitions were revoked (cooperative rebalance)")
        # A subscription that changed while the join was in flight needs another round.
        if any(t not in self.subscribed_topics for t, _ in assigned):
            self.request_rejoin("the assignment holds topics no longer subscribed")
        return Rebalanced(self.generation, assigned, revoked, changes.added, changes.rejoin)

    def stable_started(self, now_ms: int) -> None:
        """The shell applied the assignment: heartbeats start now."""
        self._next_heartbeat_ms = now_ms
        self._last_heartbeat_ok_ms = now_ms

    # -- resets and lost partitions ---------------------------------------------------------

    def _lost_on_reset(self, reset_member_id: bool) -> None:
        self._lost = tuple(sorted(set(self._lost) | self.owned))
        self._reset(reset_member_id)
        self.request_rejoin("the member was reset")

    def take_lost(self) -> tuple[TopicPartition, ...]:
        """Partitions lost by a reset since the last call (report them with on_revoke, without
        committing: another member may own them already)."""
        lost, self._lost = self._lost, ()
        return lost

    def _reset(self, reset_member_id: bool) -> None:
        self.generation = NO_GENERATION
        if reset_member_id:
            self.member_id = UNKNOWN_MEMBER_ID
        self.owned = frozenset()
        self._previous = ()
        self.protocol = None
        self.leader_id = ""
        self.state = MemberState.UNJOINED
        self._next_heartbeat_ms = None

    def _back_to_unjoined(self) -> None:
        # A failed join/sync that is not a reset: keep id and generation, join again later.
        if self.state is not MemberState.STABLE:
            self.state = MemberState.UNJOINED if not self.owned else MemberState.STABLE
        self.request_rejoin(self.rejoin_reason or "the previous join attempt failed")
        if self.state is MemberState.STABLE and self._next_heartbeat_ms is None:
            self._next_heartbeat_ms = self._last_heartbeat_ok_ms

    # -- heartbeats -------------------------------------------------------------------------

    def heartbeat_due(self, now_ms: int) -> bool:
        return (
            self.state is MemberState.STABLE
            and self._next_heartbeat_ms is not None
            and now_ms >= self._next_heartbeat_ms
        )

    def heartbeat_sent(self, now_ms: int) -> int:
        """Schedule the next heartbeat; returns the generation the heartbeat carries."""
        self._next_heartbeat_ms = now_ms + self.config.heartbeat_interval_ms
        return self.generation

    def heartbeat_completed(self, error: ErrorCode, generation: int, now_ms: int) -> GroupAction:
        """A Heartbeat answer for ``generation`` (ignored when stale)."""
        if generation != self.generation or self.state is not MemberState.STABLE:
            return GroupAction.NONE
        action = action_for_error(error)
        if action is GroupAction.NONE:
            self._last_heartbeat_ok_ms = now_ms
        elif action is GroupAction.REJOIN:
            self._last_heartbeat_ok_ms = now_ms
            self.request_rejoin("the group is rebalancing")
        elif action is GroupAction.RESET:
            self._lost_on_reset(reset_member_id=error is ErrorCode.UNKNOWN_MEMBER_ID)
        elif action in (GroupAction.REDISCOVER, GroupAction.RETRY):
            self._next_heartbeat_ms = now_ms + self.config.retry_backoff_ms
        else:
            self._fatal()
        return action

    def _fatal(self) -> None:
        # FENCED_INSTANCE_ID (another process took this group.instance.id) and other fatal
        # answers: the partitions are lost and the member stops (no heartbeats, no automatic
        # rejoin) until the application subscribes again.
        self._lost = tuple(sorted(set(self._lost) | self.owned))
        self._reset(reset_member_id=True)
        self.rejoin_needed = False

    def commit_failed(self, error: ErrorCode, generation: int) -> GroupAction:
        """An OffsetCommit answer's group error for ``generation`` (ignored when stale)."""
        if generation != self.generation:
            return GroupAction.NONE
        action = action_for_error(error)
        if action is GroupAction.RESET:
            self._lost_on_reset(reset_member_id=error is ErrorCode.UNKNOWN_MEMBER_ID)
        elif action is GroupAction.REJOIN and self.state is MemberState.STABLE:
            self.request_rejoin("the group is rebalancing")
        elif action is GroupAction.FATAL:
            self._fatal()
        return action

    def session_expired(self, now_ms: int) -> bool:
        """No successful heartbeat for ``session.timeout.ms``: the coordinator has surely
        removed this member (the shell rediscovers the coordinator)."""
        return (
            self.state is MemberState.STABLE
            and now_ms - self._last_heartbeat_ok_ms >= self.config.session_timeout_ms
        )

    # -- poll interval ----------------------------------------------------------------------

    def poll_called(self, now_ms: int) -> bool:
        """The application called ``poll()``. Returns True (once) when the previous poll came
        too late and the member left the group: the shell raises
        MaxPollIntervalExceededError; the following poll rejoins."""
        self.last_poll_ms = now_ms
        expired, self.poll_expired = self.poll_expired, False
        return expired

    def still_polling(self, now_ms: int) -> None:
        """The application is inside ``poll()`` (waiting for records): that counts as polling."""
        if not self.poll_expired:
            self.last_poll_ms = now_ms

    def poll_deadline_ms(self) -> int:
        return self.last_poll_ms + self.config.max_poll_interval_ms

    def check_poll_interval(self, now_ms: int) -> bool | None:
        """Background check: None while in time (or not a member); else the member leaves the
        group (partitions lost, generation reset) and the result says whether to send
        LeaveGroup (False for a static member, which the coordinator expires instead)."""
        if self.state is MemberState.UNJOINED and not self.owned:
            return None
        if self.poll_expired or now_ms < self.poll_deadline_ms():
            return None
        leave = self._should_leave()
        self._lost_on_reset(reset_member_id=True)
        self.rejoin_reason = "the previous poll() came later than max.poll.interval.ms"
        self.poll_expired = True
        return leave

    # -- auto commit ------------------------------------------------------------------------

    def auto_commit_due(self, now_ms: int) -> bool:
        return self._next_auto_commit_ms is not None and now_ms >= self._next_auto_commit_ms

    def auto_commit_scheduled(self, now_ms: int) -> None:
        """An auto commit was started (or was not needed): the next one is an interval away."""
        interval = self.config.auto_commit_interval_ms
        if interval is not None:
            self._next_auto_commit_ms = now_ms + interval
            self.auto_commits_started += 1

    # -- timers -----------------------------------------------------------------------------

    def next_deadline_ms(self) -> int | None:
        """The earliest time something is due (heartbeat, auto commit, metadata, session or
        poll interval): the shell's background task sleeps until then or until woken."""
        deadlines: list[int] = []
        if self.state is MemberState.STABLE and self._next_heartbeat_ms is not None:
            deadlines.append(self._next_heartbeat_ms)
            deadlines.append(self._last_heartbeat_ok_ms + self.config.session_timeout_ms)
        if self._next_auto_commit_ms is not None and self.owned:
            deadlines.append(self._next_auto_commit_ms)
        if self.subscribed:
            deadlines.append(self._next_metadata_ms)
        if self.state is not MemberState.UNJOINED or self.owned:
            deadlines.append(self.poll_deadline_ms())
        return min(deadlines) if deadlines else None


__all__ = [
    "UNKNOWN_MEMBER_ID",
    "GroupAction",
    "GroupMembership",
    "JoinRequest",
    "MemberState",
    "MembershipConfig",
    "Rebalanced",
    "action_for_error",
    "rebalance_protocol",
    "topics_matching",
]
