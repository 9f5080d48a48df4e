"""The consumer's pure group membership core (fjord.client.group_membership): joins, syncs,
eager and cooperative revocation, error handling, deadlines, patterns; with hypothesis for the
revoke/assign bookkeeping over random sequences."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.client.group_membership import (
    UNKNOWN_MEMBER_ID,
    GroupAction,
    GroupMembership,
    MembershipConfig,
    MemberState,
    Rebalanced,
    action_for_error,
    rebalance_protocol,
    topics_matching,
)
from fjord.coordinator.group import (
    AppendRecords,
    Effect,
    GroupConfig,
    GroupStateMachine,
    JoinGroupResponse,
    Reply,
    SyncGroupResponse,
)
from fjord.errors import ErrorCode
from fjord.groups.protocol import (
    Assignment,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)

HEARTBEAT_MS = 3_000
SESSION_MS = 45_000
MAX_POLL_MS = 300_000
AUTO_COMMIT_MS = 5_000
METADATA_MS = 300_000


def config(
    strategies: tuple[str, ...] = ("range",),
    instance_id: str | None = None,
    auto_commit_ms: int | None = AUTO_COMMIT_MS,
) -> MembershipConfig:
    return MembershipConfig(
        group_id="g",
        group_instance_id=instance_id,
        strategies=strategies,
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        max_poll_interval_ms=MAX_POLL_MS,
        auto_commit_interval_ms=auto_commit_ms,
        metadata_max_age_ms=METADATA_MS,
        retry_backoff_ms=100,
    )


def assignment_bytes(*tps: tuple[str, int]) -> bytes:
    return encode_assignment(Assignment(tuple(tps)))


def joined(
    m: GroupMembership,
    assigned: tuple[tuple[str, int], ...],
    generation: int = 1,
    member_id: str = "m-1",
    leader: str = "m-0",
    counts: dict[str, int] | None = None,
) -> Rebalanced:
    """Drive one whole rebalance (start_join, JoinGroup ok, SyncGroup ok) as a follower."""
    m.start_join()
    protocol = m.config.strategies[0]
    action = m.join_completed(
        ErrorCode.NONE,
        member_id=member_id,
        generation=generation,
        protocol=protocol,
        leader_id=leader,
    )
    assert action is GroupAction.SYNC
    result = m.sync_completed(
        ErrorCode.NONE, assignment_bytes(*assigned), {"t": 8} if counts is None else counts
    )
    assert isinstance(result, Rebalanced)
    m.stable_started(0)
    return result


# -- small pure functions -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "action"),
    [
        (ErrorCode.NONE, GroupAction.NONE),
        (ErrorCode.REBALANCE_IN_PROGRESS, GroupAction.REJOIN),
        (ErrorCode.ILLEGAL_GENERATION, GroupAction.RESET),
        (ErrorCode.UNKNOWN_MEMBER_ID, GroupAction.RESET),
        (ErrorCode.NOT_COORDINATOR, GroupAction.REDISCOVER),
        (ErrorCode.COORDINATOR_NOT_AVAILABLE, GroupAction.REDISCOVER),
        (ErrorCode.NETWORK_EXCEPTION, GroupAction.REDISCOVER),
        (ErrorCode.REQUEST_TIMED_OUT, GroupAction.REDISCOVER),
        (ErrorCode.LEADER_NOT_AVAILABLE, GroupAction.REDISCOVER),
        (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, GroupAction.RETRY),
        (ErrorCode.MEMBER_ID_REQUIRED, GroupAction.JOIN_AGAIN),
        (ErrorCode.FENCED_INSTANCE_ID, GroupAction.FATAL),
        (ErrorCode.INCONSISTENT_GROUP_PROTOCOL, GroupAction.FATAL),
        (ErrorCode.INVALID_SESSION_TIMEOUT, GroupAction.FATAL),
        (ErrorCode.GROUP_MAX_SIZE_REACHED, GroupAction.FATAL),
    ],
)
def test_action_for_error(code: ErrorCode, action: GroupAction) -> None:
    assert action_for_error(code) is action


def test_rebalance_protocol_is_cooperative_only_when_every_assignor_is() -> None:
    assert rebalance_protocol(("cooperative-sticky",)) == "cooperative"
    assert rebalance_protocol(("range", "cooperative-sticky")) == "eager"
    assert rebalance_protocol(("sticky",)) == "eager"
    assert rebalance_protocol(()) == "eager"


def test_topics_matching_is_a_full_match_without_internal_topics() -> None:
    pattern = re.compile(r"orders.*")
    topics = ["orders", "orders-eu", "old-orders", "__consumer_offsets", "ord"]
    assert topics_matching(pattern, topics) == {"orders", "orders-eu"}
    assert topics_matching(re.compile("__.*"), topics) == frozenset()


def test_unknown_assignor_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown assignor"):
        GroupMembership(config(("fair",)), 0)


# -- joining --------------------------------------------------------------------------------------


def test_first_join_gets_a_member_id_then_joins_and_syncs_as_leader() -> None:
    m = GroupMembership(config(("range", "roundrobin")), 0)
    assert not m.should_start_join()  # nothing subscribed
    m.subscribe(["t", "u"])
    assert m.should_start_join()
    assert m.start_join() == ()
    assert m.state is MemberState.PREPARING_REBALANCE
    assert not m.should_start_join()  # one join at a time
    request = m.join_request()
    assert request.member_id == UNKNOWN_MEMBER_ID
    assert request.rebalance_timeout_ms == MAX_POLL_MS
    assert request.session_timeout_ms == SESSION_MS
    assert [name for name, _ in request.protocols] == ["range", "roundrobin"]
    sub = decode_subscription(request.protocols[0][1])
    assert sub.topics == ("t", "u") and sub.owned_partitions == () and sub.generation_id == -1

    action = m.join_completed(
        ErrorCode.MEMBER_ID_REQUIRED, member_id="c-1", generation=-1, protocol="", leader_id=""
    )
    assert action is GroupAction.JOIN_AGAIN
    assert m.join_request().member_id == "c-1"

    other = encode_subscription(Subscription(("t", "v")))
    mine = m.join_request().protocols[0][1]
    members = [("c-1", None, mine), ("c-2", None, other)]
    action = m.join_completed(
        ErrorCode.NONE,
        member_id="c-1",
        generation=4,
        protocol="range",
        leader_id="c-1",
        members=members,
    )
    assert action is GroupAction.SYNC and m.is_leader and m.generation == 4
    assert m.state is MemberState.COMPLETING_REBALANCE
    assert m.topics_to_watch() == {"t", "u", "v"}  # the leader watches every member's topics
    sent = m.assignments_to_send(members, {"t": 2, "u": 1, "v": 1})
    assert {k: decode_assignment(v).partitions for k, v in sent.items()} == {
        "c-1": (("t", 0), ("u", 0)),
        "c-2": (("t", 1), ("v", 0)),
    }
    result = m.sync_completed(ErrorCode.NONE, sent["c-1"], {"t": 2, "u": 1})
    assert result == Rebalanced(4, (("t", 0), ("u", 0)), (), (("t", 0), ("u", 0)), False)
    assert m.state is MemberState.STABLE and m.owned == {("t", 0), ("u", 0)}
    assert not m.rejoin_needed


def test_eager_revokes_everything_before_joining_and_remembers_it_for_sticky() -> None:
    m = GroupMembership(config(("sticky",)), 0)
    m.subscribe(["t"])
    joined(m, (("t", 0), ("t", 1)))
    m.request_rejoin("test")
    assert m.start_join() == (("t", 0), ("t", 1))
    assert m.owned == frozenset()
    # The eager sticky assignor still sees what this member had, with its generation unknown.
    sub = decode_subscription(m.join_request().protocols[0][1])
    assert sub.owned_partitions == (("t", 0), ("t", 1))
    result = m.sync_completed(ErrorCode.NONE, assignment_bytes(("t", 1)), {})
    assert result is GroupAction.NONE  # no SyncGroup was sent in this join: stale, ignored
    m.join_completed(
        ErrorCode.NONE, member_id="m-1", generation=2, protocol="sticky", leader_id="x"
    )
    result = m.sync_completed(ErrorCode.NONE, assignment_bytes(("t", 1), ("t", 2)), {})
    assert isinstance(result, Rebalanced)
    assert result.revoked == () and result.added == (("t", 1), ("t", 2)) and not result.rejoin


def test_cooperative_keeps_what_stays_revokes_the_rest_and_rejoins() -> None:
    m = GroupMembership(config(("cooperative-sticky",)), 0)
    m.subscribe(["t"])
    joined(m, (("t", 0), ("t", 1), ("t", 2)))
    m.request_rejoin("a member joined")
    assert m.start_join() == ()  # nothing revoked before joining
    sub = decode_subscription(m.join_request().protocols[0][1])
    assert sub.owned_partitions == (("t", 0), ("t", 1), ("t", 2)) and sub.generation_id == 1
    m.join_completed(
        ErrorCode.NONE,
        member_id="m-1",
        generation=2,
        protocol="cooperative-sticky",
        leader_id="x",
    )
    result = m.sync_completed(ErrorCode.NONE, assignment_bytes(("t", 0), ("t", 1)), {})
    assert isinstance(result, Rebalanced)
    assert result.revoked == (("t", 2),) and result.added == () and result.rejoin
    assert m.rejoin_needed and m.should_start_join()
    # The follow-up round adds what another member gave up.
    m.start_join()
    m.join_completed(
        ErrorCode.NONE,
        member_id="m-1",
        generation=3,
        protocol="cooperative-sticky",
        leader_id="x",
    )
    result = m.sync_completed(ErrorCode.NONE, assignment_bytes(("t", 0), ("t", 1), ("t", 5)), {})
    assert isinstance(result, Rebalanced)
    assert result.revoked == () and result.added == (("t", 5),) and not result.rejoin


def test_join_errors() -> None:
    m = GroupMembership(config(), 0)
    m.subscribe(["t"])
    m.start_join()
    kwargs: dict[str, Any] = {"member_id": "", "generation": -1, "protocol": "", "leader_id": ""}
    assert m.join_completed(ErrorCode.REBALANCE_IN_PROGRESS, **kwargs) is GroupAction.JOIN_AGAIN
    assert m.join_completed(ErrorCode.NOT_COORDINATOR, **kwargs) is GroupAction.REDISCOVER
    assert m.state is MemberState.UNJOINED and m.should_start_join()
    m.start_join()
    assert m.join_completed(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, **kwargs) is GroupAction.FATAL
    m.start_join()
    # A protocol this member did not offer is a fatal inconsistency.
    assert (
        m.join_completed(ErrorCode.NONE, member_id="a", generation=1, protocol="x", leader_id="a")
        is GroupAction.FATAL
    )
    m.start_join()
    assert m.join_completed(ErrorCode.UNKNOWN_MEMBER_ID, **kwargs) is GroupAction.RESET
    assert m.member_id == UNKNOWN_MEMBER_ID and m.state is MemberState.UNJOINED
    # Answers when no join is in flight are stale.
    assert m.join_completed(ErrorCode.NONE, **kwargs) is GroupAction.NONE


def test_sync_errors() -> None:
    m = GroupMembership(config(("cooperative-sticky",)), 0)
    m.subscribe(["t"])
    joined(m, (("t", 0),))
    m.request_rejoin("x")
    m.start_join()
    ok: dict[str, Any] = {
        "member_id": "m-1",
        "generation": 2,
        "protocol": "cooperative-sticky",
        "leader_id": "x",
    }
    m.join_completed(ErrorCode.NONE, **ok)
    assert m.sync_completed(ErrorCode.REBALANCE_IN_PROGRESS, b"", {}) is GroupAction.JOIN_AGAIN
    assert m.state is MemberState.PREPARING_REBALANCE
    m.join_completed(ErrorCode.NONE, **ok)
    assert m.sync_completed(ErrorCode.ILLEGAL_GENERATION, b"", {}) is GroupAction.RESET
    assert m.take_lost() == (("t", 0),) and m.take_lost() == ()
    assert m.member_id == "m-1" and m.generation == -1  # ILLEGAL_GENERATION keeps the id


# -- heartbeats -------------------------------------------------------------------------------


def test_heartbeat_schedule_and_errors() -> None:
    m = GroupMembership(config(), 0)
    m.subscribe(["t"])
    assert not m.heartbeat_due(10**9)  # not a member yet
    joined(m, (("t", 0), ("t", 1)))
    assert m.heartbeat_due(0)
    generation = m.heartbeat_sent(0)
    assert not m.heartbeat_due(HEARTBEAT_MS - 1) and m.heartbeat_due(HEARTBEAT_MS)
    assert m.heartbeat_completed(ErrorCode.NONE, generation, 10) is GroupAction.NONE
    assert m.heartbeat_completed(ErrorCode.REBALANCE_IN_PROGRESS, generation, 20) is (
        GroupAction.REJOIN
    )
    assert m.rejoin_needed and m.state is MemberState.STABLE  # poll() starts the join
    # A stale answer (other generation) changes nothing.
    assert m.heartbeat_completed(ErrorCode.UNKNOWN_MEMBER_ID, 99, 30) is GroupAction.NONE
    assert m.owned
    assert m.heartbeat_completed(ErrorCode.NOT_COORDINATOR, generation, 40) is (
        GroupAction.REDISCOVER
    )
    assert m.heartbeat_due(140) and not m.heartbeat_due(139)  # retried after the backoff
    assert m.heartbeat_completed(ErrorCode.UNKNOWN_MEMBER_ID, generation, 50) is (GroupAction.RESET)
    assert m.take_lost() == (("t", 0), ("t", 1))
    assert m.member_id == UNKNOWN_MEMBER_ID and m.generation == -1 and not m.owned
    assert not m.heartbeat_due(10**9)


def test_session_expiry_without_successful_heartbeats() -> None:
    m = GroupMembership(config(), 0)
    m.subscribe(["t"])
    joined(m, (("t", 0),))
    assert not m.session_expired(SESSION_MS - 1)
    assert m.session_expired(SESSION_MS)
    m.heartbeat_completed(ErrorCode.NONE, m.generation, SESSION_MS)
    assert not m.session_expired(SESSION_MS + 1)


def test_commit_failures_fence_the_member() -> None:
    m = GroupMembership(config(), 0)
    m.subscribe(["t"])
    joined(m, (("t", 0),))
    assert m.commit_failed(ErrorCode.ILLEGAL_GENERATION, m.generation - 1) is GroupAction.NONE
    assert m.commit_failed(ErrorCode.REBALANCE_IN_PROGRESS, m.generation) is GroupAction.REJOIN
    assert m.rejoin_needed
    assert m.commit_failed(ErrorCode.ILLEGAL_GENERATION, m.generation) is GroupAction.RESET
    assert m.take_lost() == (("t", 0),)


# -- poll interval, auto commit, metadata -------------------------------------------------------


@pytest.mark.parametrize(("instance_id", "leave"), [(None, True), ("static-1", False)])
def test_max_poll_interval(instance_id: str | None, leave: bool) -> None:
    m = GroupMembership(config(instance_id=instance_id), 0)
    m.subscribe(["t"])
    assert m.check_poll_interval(10**9) is None  # not a member: nothing to enforce
    joined(m, (("t", 0),))
    m.poll_called(1_000)
    assert m.check_poll_interval(1_000 + MAX_POLL_MS - 1) is None
    assert m.check_poll_interval(1_000 + MAX_POLL_MS) is leave
    assert m.check_poll_interval(1_000 + MAX_POLL_MS + 5) is None  # only once
    assert m.take_lost() == (("t", 0),)
    assert m.member_id == UNKNOWN_MEMBER_ID and m.state is MemberState.UNJOINED
    assert m.poll_called(2_000_000) is True  # this poll reports the error
    assert m.poll_called(2_000_001) is False
    assert m.should_start_join()  # ... and the following one rejoins


def test_waiting_inside_poll_counts_as_polling() -> None:
    m = GroupMembership(config(), 0)
    m.subscribe(["t"])
    joined(m, (("t", 0),))
    m.poll_called(0)
    m.still_polling(MAX_POLL_MS - 1)  # a long poll() with no records yet
    assert m.check_poll_interval(MAX_POLL_MS) is None
    assert m.check_poll_interval(2 * MAX_POLL_MS - 1) is True


def test_auto_commit_deadlines() -> None:
    m = GroupMembership(config(), 0)
    assert not m.auto_commit_due(AUTO_COMMIT_MS - 1) and m.auto_commit_due(AUTO_COMMIT_MS)
    assert m.auto_commits_started == 0
    m.auto_commit_scheduled(AUTO_COMMIT_MS + 7)
    assert m.auto_commits_started == 1
    assert not m.auto_commit_due(2 * AUTO_COMMIT_MS + 6)
    assert m.auto_commit_due(2 * AUTO_COMMIT_MS + 7)
    off = GroupMembership(config(auto_commit_ms=None), 0)
    assert not off.auto_commit_due(10**12)


def test_next_deadline_is_the_earliest_duty() -> None:
    m = GroupMembership(config(), 0)
    assert m.next_deadline_ms() is None  # idle: nothing subscribed, nothing owned
    m.subscribe(["t"])
    assert m.next_deadline_ms() == 0  # metadata first
    m.update_metadata(0, {"t": 2}, all_topics=False)
    joined(m, (("t", 0),))
    assert m.next_deadline_ms() == 0  # the first heartbeat at once
    m.heartbeat_sent(0)
    assert m.next_deadline_ms() == HEARTBEAT_MS


def test_pattern_resolution_and_partition_growth_ask_for_rejoin() -> None:
    m = GroupMembership(config(), 0)
    m.subscribe_pattern(re.compile(r"o.*"), 0)
    assert m.metadata_due(0) and m.subscribed
    assert m.update_metadata(0, {"orders": 2, "x": 1, "__o": 1}, all_topics=True)
    assert m.subscribed_topics == {"orders"}
    assert not m.metadata_due(METADATA_MS - 1) and m.metadata_due(METADATA_MS)
    joined(m, (("orders", 0), ("orders", 1)), counts={"orders": 2})
    m.update_metadata(1, {"orders": 2}, all_topics=True)
    assert not m.rejoin_needed
    assert m.update_metadata(2, {"orders": 2, "old": 3}, all_topics=True)  # a new match
    assert m.subscribed_topics == {"orders", "old"} and m.rejoin_needed


def test_partition_count_growth_asks_for_rejoin() -> None:
    m = GroupMembership(config(), 0)
    m.subscribe(["t"])
    joined(m, (("t", 0),))  # joined() reports t with 8 partitions
    assert not m.update_metadata(0, {"t": 8}, all_topics=False)
    assert m.update_metadata(0, {"t": 9}, all_topics=False)
    assert "9 partitions" in m.rejoin_reason


def test_subscription_changes_and_unsubscribe() -> None:
    m = GroupMembership(config(), 0)
    m.subscribe(["t"])
    joined(m, (("t", 0),))
    m.subscribe(["t"])
    assert not m.rejoin_needed  # same topics: nothing to do
    m.subscribe(["t", "u"])
    assert m.rejoin_needed
    assert m.unsubscribe() == ((("t", 0),), True)
    assert not m.subscribed and not m.should_start_join() and m.member_id == UNKNOWN_MEMBER_ID
    static = GroupMembership(config(instance_id="i-1"), 0)
    static.subscribe(["t"])
    joined(static, (("t", 0),))
    assert static.unsubscribe() == ((("t", 0),), False)  # static members do not send LeaveGroup


# -- properties ---------------------------------------------------------------------------------

PARTITIONS = [("t", p) for p in range(6)]
assignments = st.lists(st.sampled_from(PARTITIONS), unique=True, max_size=6).map(
    lambda tps: tuple(sorted(tps))
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("rebalance"), assignments),
        st.tuples(st.just("reset"), st.sampled_from(["heartbeat", "sync", "poll"])),
        st.tuples(st.just("heartbeat-rebalancing"), st.none()),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(strategy=st.sampled_from(["range", "sticky", "cooperative-sticky"]), ops=operations)
def test_revoke_and_assign_bookkeeping(strategy: str, ops: list[tuple[str, object]]) -> None:
    """Whatever happens, the partitions the application holds (added minus revoked minus
    lost, as the shell applies them) are exactly the member's ``owned``; nothing is revoked
    that was not held; with the cooperative protocol a partition that stays assigned is never
    revoked, and nothing is revoked before joining."""
    m = GroupMembership(config((strategy,)), 0)
    m.subscribe(["t"])
    held: set[tuple[str, int]] = set()
    generation = 0
    now = 0

    def give_up(tps: tuple[tuple[str, int], ...]) -> None:
        assert set(tps) <= held, "gave up something not held"
        held.difference_update(tps)

    for kind, arg in ops:
        now += 1_000
        if kind == "rebalance":
            assert isinstance(arg, tuple)
            if m.should_start_join():
                before = set(m.owned)
                revoked = m.start_join()
                if strategy == "cooperative-sticky":
                    assert revoked == ()
                else:
                    assert set(revoked) == before
                give_up(revoked)
            if m.state is not MemberState.PREPARING_REBALANCE:
                continue
            generation += 1
            assert (
                m.join_completed(
                    ErrorCode.NONE,
                    member_id="m",
                    generation=generation,
                    protocol=strategy,
                    leader_id="other",
                )
                is GroupAction.SYNC
            )
            owned_before = set(m.owned)
            result = m.sync_completed(ErrorCode.NONE, assignment_bytes(*arg), {"t": 6})
            assert isinstance(result, Rebalanced)
            assert set(result.assignment) == set(arg) == set(m.owned)
            if strategy == "cooperative-sticky":
                assert not set(result.revoked) & set(arg), "revoked a partition that stays"
                assert set(result.revoked) == owned_before - set(arg)
                assert result.rejoin == bool(result.revoked)
            give_up(result.revoked)
            assert not set(result.added) & held, "added a partition already held"
            held.update(result.added)
            m.stable_started(now)
        elif kind == "reset":
            if arg == "heartbeat" and m.state is MemberState.STABLE:
                m.heartbeat_completed(ErrorCode.UNKNOWN_MEMBER_ID, m.generation, now)
            elif arg == "sync" and m.state is MemberState.STABLE:
                m.commit_failed(ErrorCode.ILLEGAL_GENERATION, m.generation)
            elif arg == "poll":
                m.check_poll_interval(m.poll_deadline_ms())
                m.poll_called(now)
            give_up(m.take_lost())
        else:
            if m.state is MemberState.STABLE:
                m.heartbeat_completed(ErrorCode.REBALANCE_IN_PROGRESS, m.generation, now)
                assert m.should_start_join()
        assert held == set(m.owned)
        if m.state is MemberState.UNJOINED:
            assert not m.owned


# -- configuration (fjord.config) -----------------------------------------------------------


def test_group_properties_defaults_and_validation() -> None:
    from fjord.config import consumer_config
    from fjord.errors import ConfigError

    base = {"bootstrap.servers": "localhost:9092"}
    cfg = consumer_config({**base, "group.id": "g"})
    assert cfg["enable.auto.commit"] is True and cfg["auto.commit.interval.ms"] == 5000
    assert cfg["enable.auto.offset.store"] is True
    assert (cfg["session.timeout.ms"], cfg["heartbeat.interval.ms"]) == (45000, 3000)
    assert cfg["max.poll.interval.ms"] == 300000
    assert cfg["partition.assignment.strategy"] == ("range", "cooperative-sticky")
    assert consumer_config(base)["enable.auto.commit"] is False  # no group: nothing to commit
    kafka_names = "org.apache.kafka.clients.consumer.CooperativeStickyAssignor, RoundRobinAssignor"
    assert consumer_config({**base, "partition.assignment.strategy": kafka_names})[
        "partition.assignment.strategy"
    ] == ("cooperative-sticky", "roundrobin")
    bad: list[tuple[dict[str, Any], str]] = [
        ({"enable.auto.commit": True}, "enable.auto.commit"),
        ({"group.instance.id": "i"}, "group.instance.id"),
        ({"group.id": ""}, "group.id"),
        ({"group.id": "g", "heartbeat.interval.ms": 45000}, "heartbeat.interval.ms"),
        ({"group.id": "g", "partition.assignment.strategy": "fair"}, "partition.assignment"),
        ({"group.id": "g", "partition.assignment.strategy": " , "}, "partition.assignment"),
        ({"group.id": "g", "max.poll.interval.ms": 0}, "max.poll.interval.ms"),
        ({"group.id": "g", "enable.auto.offset.store": "maybe"}, "enable.auto.offset.store"),
    ]
    for extra, key in bad:
        with pytest.raises(ConfigError, match=re.escape(key)):
            consumer_config({**base, **extra})


# -- members against the real coordinator state machine -------------------------------------


class _Simulation:
    """Members (each a GroupMembership plus the partitions its application holds) against the
    coordinator's pure GroupStateMachine, in one process: requests are answered through the
    machine's Reply effects, appends complete at once, and each member applies its rebalances
    only when it "polls", as the consumer does."""

    TOPIC_PARTITIONS = 6

    def __init__(self, strategy: str) -> None:
        self.strategy = strategy
        self.now = 0
        self.group = GroupStateMachine("g", GroupConfig(initial_rebalance_delay_ms=0), now_ms=0)
        self.members: list[GroupMembership] = []
        self.held: list[set[tuple[str, int]]] = []
        self.pending: list[list[Rebalanced]] = []
        self.alive: list[bool] = []
        self.requests: dict[int, tuple[int, str]] = {}  # request id -> (member, kind)
        self.next_request = 0

    def add_member(self) -> None:
        m = GroupMembership(config((self.strategy,), auto_commit_ms=None), self.now)
        m.subscribe(["t"])
        self.members.append(m)
        self.held.append(set())
        self.pending.append([])
        self.alive.append(True)

    def _request(self, index: int, kind: str) -> int:
        self.next_request += 1
        self.requests[self.next_request] = (index, kind)
        return self.next_request

    def _handle(self, effects: list[Effect]) -> None:
        queue = list(effects)
        while queue:
            effect = queue.pop(0)
            if isinstance(effect, AppendRecords):
                queue.extend(
                    self.group.append_completed(effect.append_id, ErrorCode.NONE, self.now)
                )
            elif isinstance(effect, Reply):
                index, _ = self.requests.pop(effect.request_id)
                if not self.alive[index]:
                    continue
                if isinstance(effect.response, JoinGroupResponse):
                    queue.extend(self._joined(index, effect.response))
                else:
                    assert isinstance(effect.response, SyncGroupResponse)
                    self._synced(index, effect.response)

    def _send_join(self, index: int) -> list[Effect]:
        m = self.members[index]
        join = m.join_request()
        return self.group.join_group(
            self._request(index, "join"),
            self.now,
            member_id=join.member_id,
            group_instance_id=None,
            client_id="c",
            client_host="h",
            session_timeout_ms=join.session_timeout_ms,
            rebalance_timeout_ms=join.rebalance_timeout_ms,
            protocol_type="consumer",
            protocols=join.protocols,
        )

    def _joined(self, index: int, response: JoinGroupResponse) -> list[Effect]:
        m = self.members[index]
        members = [(j.member_id, j.group_instance_id, j.metadata) for j in response.members]
        action = m.join_completed(
            response.error,
            member_id=response.member_id,
            generation=response.generation_id,
            protocol=response.protocol_name or "",
            leader_id=response.leader_id,
            members=members,
        )
        if action is GroupAction.JOIN_AGAIN:
            return self._send_join(index)
        if action is not GroupAction.SYNC:
            return []
        assignments = (
            m.assignments_to_send(members, {"t": self.TOPIC_PARTITIONS}) if m.is_leader else None
        )
        return self.group.sync_group(
            self._request(index, "sync"),
            self.now,
            member_id=m.member_id,
            generation_id=m.generation,
            assignments=assignments,
        )

    def _synced(self, index: int, response: SyncGroupResponse) -> None:
        m = self.members[index]
        result = m.sync_completed(response.error, response.assignment, {"t": self.TOPIC_PARTITIONS})
        if isinstance(result, Rebalanced):
            m.stable_started(self.now)
            self.pending[index].append(result)
        self.held[index].difference_update(m.take_lost())

    def poll(self, index: int) -> None:
        """The member's poll(): apply rebalances, start a join when one is needed."""
        if not self.alive[index]:
            return
        m = self.members[index]
        for result in self.pending[index]:
            assert set(result.revoked) <= self.held[index]
            self.held[index].difference_update(result.revoked)
            self.held[index].update(result.added)
        self.pending[index].clear()
        self.held[index].difference_update(m.take_lost())
        if m.state is MemberState.STABLE:
            generation = m.heartbeat_sent(self.now)
            error = self.group.heartbeat(self.now, member_id=m.member_id, generation_id=generation)
            m.heartbeat_completed(error, generation, self.now)
            self.held[index].difference_update(m.take_lost())
        if m.should_start_join():
            self.held[index].difference_update(m.start_join())
            self._handle(self._send_join(index))

    def leave(self, index: int) -> None:
        if not self.alive[index]:
            return
        m = self.members[index]
        member_id = m.member_id
        self.held[index].clear()  # on_revoke(owned) at close
        m.unsubscribe()
        self.alive[index] = False
        if member_id:
            _, effects = self.group.leave_group(self.now, [(member_id, None)])
            self._handle(effects)

    def tick(self, ms: int) -> None:
        self.now += ms
        self._handle(self.group.poll_timeouts(self.now))

    def check_disjoint(self) -> None:
        seen: set[tuple[str, int]] = set()
        for index, held in enumerate(self.held):
            if self.alive[index]:
                assert not (held & seen), f"partitions {held & seen} held by two members"
                seen |= held


@settings(max_examples=60, deadline=None)
@given(
    strategy=st.sampled_from(["range", "roundrobin", "sticky", "cooperative-sticky"]),
    script=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.just(0)),
            st.tuples(st.just("poll"), st.integers(0, 4)),
            st.tuples(st.just("leave"), st.integers(0, 4)),
            st.tuples(st.just("tick"), st.integers(1, 500)),
        ),
        max_size=30,
    ),
)
def test_members_against_the_coordinator_never_share_a_partition(
    strategy: str, script: list[tuple[str, int]]
) -> None:
    """Any interleaving of joins, polls, leaves and time: no partition is ever held by two
    live members at once (eager: revoke before joining; cooperative: a moved partition is handed
    out only after its owner revoked it); once everybody polls, the group settles with every
    partition held by exactly one member, balanced within one, as the member's ``owned``."""
    sim = _Simulation(strategy)
    sim.add_member()
    for kind, arg in script:
        if kind == "add" and len(sim.members) < 5:
            sim.add_member()
        elif kind == "poll" and arg < len(sim.members):
            sim.poll(arg)
        elif kind == "leave" and arg < len(sim.members) and sum(sim.alive) > 1:
            sim.leave(arg)
        elif kind == "tick":
            sim.tick(arg)
        sim.check_disjoint()
    for _ in range(40):  # everybody polls until the group is stable
        for index in range(len(sim.members)):
            sim.poll(index)
            sim.check_disjoint()
        sim.tick(10)
    live = [i for i, alive in enumerate(sim.alive) if alive]
    counts = [len(sim.held[i]) for i in live]
    assert set().union(*(sim.held[i] for i in live)) == {("t", p) for p in range(6)}
    assert sum(counts) == 6 and max(counts) - min(counts) <= 1
    for i in live:
        assert sim.held[i] == set(sim.members[i].owned)


def test_a_fenced_static_member_stops_until_it_subscribes_again() -> None:
    m = GroupMembership(config(instance_id="i-1"), 0)
    m.subscribe(["t"])
    joined(m, (("t", 0),))
    generation = m.heartbeat_sent(0)
    assert m.heartbeat_completed(ErrorCode.FENCED_INSTANCE_ID, generation, 1) is (GroupAction.FATAL)
    assert m.take_lost() == (("t", 0),)
    assert m.state is MemberState.UNJOINED and not m.should_start_join()
    assert not m.heartbeat_due(10**9)
    m.subscribe(["t"])
    assert m.should_start_join()
    joined(m, (("t", 0),), generation=5)
    assert m.commit_failed(ErrorCode.FENCED_INSTANCE_ID, 5) is GroupAction.FATAL
    assert m.take_lost() == (("t", 0),) and not m.should_start_join()
