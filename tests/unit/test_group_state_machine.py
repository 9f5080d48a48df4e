"""GroupStateMachine: Kafka's group protocol driven by an injected clock, through the harness
that plays the shell (tests/helpers/group_shell.py: delivers replies, performs appends into an
in-memory log)."""

from __future__ import annotations

import pytest

from fjord.coordinator.group import (
    GroupConfig,
    GroupStateMachine,
    JoinGroupResponse,
    OffsetCommitRequestPartition,
    OffsetCommitResponse,
    RebalanceCompleted,
    RebalanceStarted,
    SyncGroupResponse,
)
from fjord.coordinator.offsets_log import GroupMetadataLoader, OffsetCommitKey
from fjord.errors import InvalidGroupIdError
from fjord.groups.state import GroupState
from tests.helpers.group_shell import DELAY, REBALANCE, SESSION, E, Shell, sub

# --- join, sync, generations -------------------


def test_full_first_rebalance():
    shell = Shell()
    first = shell.reply(shell.join(client="cons"))
    assert first.error is E.MEMBER_ID_REQUIRED and first.member_id == "cons-1"
    assert shell.group.pending_members == ("cons-1",)
    rid = shell.join(member_id="cons-1", client="cons")
    assert shell.reply(rid) is None  # parked for the initial rebalance delay
    assert shell.group.state is GroupState.PREPARING_REBALANCE
    assert shell.group.next_deadline() == DELAY
    shell.advance(DELAY - 1)
    assert shell.reply(rid) is None
    shell.advance(1)
    joined = shell.reply(rid)
    assert joined == JoinGroupResponse(
        E.NONE,
        "cons-1",
        1,
        "consumer",
        "range",
        "cons-1",
        joined.members,
    )
    assert [m.member_id for m in joined.members] == ["cons-1"]
    assert joined.members[0].metadata == sub("t")
    assert shell.group.state is GroupState.COMPLETING_REBALANCE
    shell.hold_appends = True
    srid = shell.sync("cons-1", 1, {"cons-1": b"ASSIGN"})
    assert shell.reply(srid) is None  # waits for the group record to be written
    assert shell.group.state is GroupState.COMPLETING_REBALANCE
    shell.release()
    assert shell.reply(srid) == SyncGroupResponse(E.NONE, "consumer", "range", b"ASSIGN")
    assert shell.group.state is GroupState.STABLE
    assert shell.group.assignment("cons-1") == b"ASSIGN"
    assert any(isinstance(e, RebalanceCompleted) for e in shell.events)
    # The written record restores the group.
    loaded = GroupMetadataLoader().apply_all(shell.log).groups()["g"]
    assert loaded.metadata.generation == 1 and loaded.metadata.members[0].assignment == b"ASSIGN"


def test_followers_wait_for_leader_and_leader_left_out_members_get_empty():
    shell = Shell()
    a = shell.new_member("a")
    ja = shell.last_join
    b = shell.new_member("b")
    jb = shell.last_join
    shell.advance(2 * DELAY)
    ra, rb = shell.reply(ja), shell.reply(jb)
    assert ra.leader_id == a and len(ra.members) == 2 and rb.members == ()
    sb = shell.sync(b, 1)
    assert shell.reply(sb) is None
    shell.sync(a, 1, {a: b"x", "ghost": b"y"})
    assert shell.reply(sb) == SyncGroupResponse(E.NONE, "consumer", "range", b"")
    assert shell.group.members == (a, b)


def test_initial_delay_extends_while_members_arrive():
    shell = Shell()
    shell.new_member("a")
    ja = shell.last_join
    shell.advance(DELAY - 10)
    shell.new_member("b")
    shell.advance(10)  # first delay over, but b arrived: wait another delay
    assert shell.reply(ja) is None
    shell.advance(2 * DELAY)
    assert shell.reply(ja).generation_id == 1 and len(shell.reply(ja).members) == 2


def test_initial_delay_bounded_by_rebalance_timeout():
    shell = Shell()
    shell.new_member("a", rebalance=DELAY + 1000)
    ja = shell.last_join
    shell.advance(DELAY - 1)
    shell.new_member("b", rebalance=DELAY + 1000)
    shell.advance(1)
    shell.new_member("c", rebalance=DELAY + 1000)
    shell.advance(1000)  # remaining was only 1000 ms
    assert shell.reply(ja).generation_id == 1


def test_new_member_triggers_rebalance_and_rebalance_in_progress_on_heartbeat():
    shell = Shell()
    (a, b), _leader, gen = shell.stable_group(2)
    c = shell.new_member("c")
    jc = shell.last_join
    assert shell.group.state is GroupState.PREPARING_REBALANCE
    assert (
        shell.group.heartbeat(shell.now, member_id=a, generation_id=gen) is E.REBALANCE_IN_PROGRESS
    )
    # Offsets may still be committed with the old generation while preparing (revocation).
    assert shell.reply(shell.commit(a, gen, {("t", 0): 5})).errors == {("t", 0): E.NONE}
    ja, jb = shell.join(member_id=a, client="c0"), shell.join(member_id=b, client="c1")
    for rid in (ja, jb, jc):
        assert shell.reply(rid).generation_id == gen + 1
    assert shell.group.state is GroupState.COMPLETING_REBALANCE
    assert shell.group.heartbeat(shell.now, member_id=c, generation_id=gen + 1) is E.NONE
    assert shell.group.heartbeat(shell.now, member_id=a, generation_id=gen) is E.ILLEGAL_GENERATION


def test_member_that_does_not_rejoin_within_rebalance_timeout_is_removed():
    shell = Shell()
    (a, b), _, gen = shell.stable_group(2, rebalance=20_000)
    ja = shell.join(
        member_id=a, client="c0", protocols=[("range", sub("t", "u"))], rebalance=20_000
    )
    assert shell.group.state is GroupState.PREPARING_REBALANCE
    assert shell.group.rebalance_timeout_ms == 20_000
    # b keeps heartbeating (max.poll.interval.ms exceeded: it never polls, never rejoins).
    for _ in range(3):
        shell.advance(6_000)
        assert shell.group.heartbeat(shell.now, member_id=b, generation_id=gen) in (
            E.REBALANCE_IN_PROGRESS,
            E.UNKNOWN_MEMBER_ID,
        )
    shell.advance(2_000)
    response = shell.reply(ja)
    assert response.generation_id == gen + 1 and [m.member_id for m in response.members] == [a]
    assert shell.group.members == (a,)
    assert shell.group.heartbeat(shell.now, member_id=b, generation_id=gen) is E.UNKNOWN_MEMBER_ID


def test_rebalance_timeout_is_the_largest_members():
    shell = Shell()
    shell.new_member("a", rebalance=5_000)
    shell.new_member("b", rebalance=50_000)
    assert shell.group.rebalance_timeout_ms == 50_000


def test_session_expiry_in_stable_triggers_rebalance():
    shell = Shell()
    (a, b), _, gen = shell.stable_group(2)
    shell.advance(SESSION - 1)
    assert shell.group.heartbeat(shell.now, member_id=a, generation_id=gen) is E.NONE
    shell.advance(1)  # b expired
    assert b not in shell.group.members
    assert shell.group.state is GroupState.PREPARING_REBALANCE
    ja = shell.join(member_id=a, client="c0")
    assert shell.reply(ja).generation_id == gen + 1  # a alone: completes at once


def test_sync_phase_timeout_removes_members_that_never_sync():
    shell = Shell()
    a = shell.new_member("a")
    b = shell.new_member("b")
    shell.advance(2 * DELAY)
    shell.sync(a, 1, {a: b"1", b: b"2"})
    assert shell.group.state is GroupState.STABLE
    # b got its JoinGroup answer but never sends SyncGroup: it misses its session first.
    shell.advance(SESSION - 1)
    assert shell.group.heartbeat(shell.now, member_id=a, generation_id=1) is E.NONE
    shell.advance(1)
    assert shell.group.members == (a,) and shell.group.state is GroupState.PREPARING_REBALANCE


def test_sync_timeout_while_members_keep_heartbeating():
    shell = Shell()
    a = shell.new_member("a")
    b = shell.new_member("b")
    shell.advance(2 * DELAY)
    shell.hold_appends = True
    shell.sync(a, 1, {a: b"1", b: b"2"})  # leader's record held: group stays Completing
    for _ in range(REBALANCE // 5_000):
        shell.advance(5_000)
        shell.group.heartbeat(shell.now, member_id=a, generation_id=1)
        shell.group.heartbeat(shell.now, member_id=b, generation_id=1)
    assert a in shell.group.members
    assert b not in shell.group.members  # b never sent SyncGroup within the rebalance timeout
    assert shell.group.state is GroupState.PREPARING_REBALANCE


def test_join_errors():
    shell = Shell()
    assert shell.reply(shell.join(session=1)).error is E.INVALID_SESSION_TIMEOUT
    assert shell.reply(shell.join(protocol_type="")).error is E.INCONSISTENT_GROUP_PROTOCOL
    assert shell.reply(shell.join(protocols=[("x", b"")], member_id="nobody")).error is (
        E.UNKNOWN_MEMBER_ID
    )
    (_a, _), _, _ = shell.stable_group(2)
    assert shell.reply(shell.join(protocol_type="connect")).error is E.INCONSISTENT_GROUP_PROTOCOL
    assert shell.reply(shell.join(protocols=[("roundrobin", b"")])).error is (
        E.INCONSISTENT_GROUP_PROTOCOL
    )
    with pytest.raises(InvalidGroupIdError):
        GroupStateMachine("")


def test_group_max_size():
    shell = Shell(GroupConfig(initial_rebalance_delay_ms=DELAY, max_size=1))
    shell.new_member("a")
    assert shell.reply(shell.join(client="b")).error is E.GROUP_MAX_SIZE_REACHED


def test_protocol_vote():
    shell = Shell()
    shell.new_member("a", protocols=[("range", b"1"), ("roundrobin", b"2")])
    ja = shell.last_join
    shell.new_member("b", protocols=[("roundrobin", b"3"), ("range", b"4")])
    shell.new_member("c", protocols=[("roundrobin", b"5"), ("sticky", b"6"), ("range", b"7")])
    shell.advance(2 * DELAY)
    response = shell.reply(ja)
    assert response.protocol_name == "roundrobin"
    assert [m.metadata for m in response.members] == [b"2", b"3", b"5"]


def test_sync_errors():
    shell = Shell()
    (a, _b), _leader, gen = shell.stable_group(2)
    assert shell.reply(shell.sync(a, gen + 5)).error is E.ILLEGAL_GENERATION
    assert shell.reply(shell.sync("ghost", gen)).error is E.UNKNOWN_MEMBER_ID
    rid = next(shell._ids)
    shell.run(shell.group.sync_group(rid, 0, member_id=a, generation_id=gen, protocol_name="x"))
    assert shell.reply(rid).error is E.INCONSISTENT_GROUP_PROTOCOL
    assert shell.reply(shell.sync(a, gen)).assignment == f"A-{a}".encode()  # Stable: at once
    shell.new_member("z")
    assert shell.reply(shell.sync(a, gen)).error is E.REBALANCE_IN_PROGRESS


def test_rebalance_during_sync_answers_parked_syncs():
    shell = Shell()
    a = shell.new_member("a")
    b = shell.new_member("b")
    shell.advance(2 * DELAY)
    sb = shell.sync(b, 1)
    shell.new_member("c")  # a new member arrives before the leader synced
    assert shell.reply(sb).error is E.REBALANCE_IN_PROGRESS
    assert shell.group.state is GroupState.PREPARING_REBALANCE
    del a


def test_failed_assignment_write_rebalances():
    shell = Shell()
    a = shell.new_member("a")
    b = shell.new_member("b")
    shell.advance(2 * DELAY)
    sb = shell.sync(b, 1)
    shell.fail_appends = E.NOT_ENOUGH_REPLICAS
    sa = shell.sync(a, 1, {a: b"1", b: b"2"})
    assert shell.reply(sa).error is E.COORDINATOR_NOT_AVAILABLE
    assert shell.reply(sb).error is E.COORDINATOR_NOT_AVAILABLE
    assert shell.group.state is GroupState.PREPARING_REBALANCE


def test_retried_join_in_completing_rebalance_gets_same_generation():
    shell = Shell()
    a = shell.new_member("a")
    shell.advance(2 * DELAY)
    again = shell.reply(shell.join(member_id=a, client="a"))
    assert again.generation_id == 1 and again.leader_id == a and len(again.members) == 1


def test_stable_rejoin_rules():
    shell = Shell()
    (a, b), leader, gen = shell.stable_group(2)
    follower = b if leader == a else a
    # A follower rejoining with the same metadata just gets the current generation.
    same = shell.reply(shell.join(member_id=follower, client="c1"))
    assert same.generation_id == gen and same.members == ()
    assert shell.group.state is GroupState.STABLE
    # The leader rejoining triggers a rebalance (it wants to reassign).
    shell.join(member_id=leader, client="c0")
    assert shell.group.state is GroupState.PREPARING_REBALANCE


def test_superseded_join_is_answered():
    shell = Shell()
    (a, b), _, gen = shell.stable_group(2)
    first = shell.join(member_id=a, client="c0", protocols=[("range", sub("t", "x"))])
    second = shell.join(member_id=a, client="c0", protocols=[("range", sub("t", "x"))])
    assert shell.reply(first).error is E.REBALANCE_IN_PROGRESS
    shell.join(member_id=b, client="c1")
    assert shell.reply(second).generation_id == gen + 1


# --- leave, pending members -------------------


def test_leave_and_last_member_leaving_empties_group():
    shell = Shell()
    (a, b), _, gen = shell.stable_group(2)
    errors, effects = shell.group.leave_group(shell.now, [(b, None), ("ghost", None)])
    shell.run(effects)
    assert errors == [E.NONE, E.UNKNOWN_MEMBER_ID]
    assert shell.group.state is GroupState.PREPARING_REBALANCE
    errors, effects = shell.group.leave_group(shell.now, [(a, None)])
    shell.run(effects)
    assert shell.group.state is GroupState.EMPTY and shell.group.generation_id == gen + 1
    assert shell.group.describe().members == ()
    assert any(isinstance(e, RebalanceStarted) for e in shell.events)


def test_leave_while_preparing_completes_join():
    shell = Shell()
    (a, b), _, gen = shell.stable_group(2)
    ja = shell.join(member_id=a, client="c0", protocols=[("range", sub("u"))])
    assert shell.reply(ja) is None
    shell.run(shell.group.leave_group(shell.now, [(b, None)])[1])
    assert shell.reply(ja).generation_id == gen + 1


def test_pending_member_expires_and_can_leave():
    shell = Shell()
    first = shell.reply(shell.join(client="a"))
    shell.advance(SESSION)
    assert shell.group.pending_members == ()
    assert shell.reply(shell.join(member_id=first.member_id)).error is E.UNKNOWN_MEMBER_ID
    second = shell.reply(shell.join(client="b"))
    errors, _ = shell.group.leave_group(shell.now, [(second.member_id, None)])
    assert errors == [E.NONE] and shell.group.pending_members == ()


def test_new_member_that_vanishes_mid_join_is_dropped():
    shell = Shell()
    (a, b), _, gen = shell.stable_group(2)
    shell.new_member("slow")  # parked; its client then disappears
    ja, jb = shell.join(member_id=a, client="c0"), shell.join(member_id=b, client="c1")
    # All members joined, so the join completes without waiting for the slow one's timeout.
    assert shell.reply(ja).generation_id == gen + 1 and len(shell.group.members) == 3
    del jb


# --- static membership (KIP-345) -------------------


def static_group(shell, protocols=None):
    a = shell.reply(shell.join(client="a", instance="inst-a", protocols=protocols))
    b = shell.reply(shell.join(client="b", instance="inst-b", protocols=protocols))
    assert a is None and b is None  # static members join at once, no MEMBER_ID_REQUIRED
    shell.advance(2 * DELAY)
    ids = list(shell.group.members)
    leader = shell.group.leader_id
    shell.sync(leader, 1, {m: f"A-{m}".encode() for m in ids})
    assert shell.group.state is GroupState.STABLE
    return ids, leader


def test_static_member_restart_keeps_assignment_without_rebalance():
    shell = Shell()
    (a, b), leader = static_group(shell)
    follower = b if leader == a else a
    instance = shell.group.member_instance_id(follower)
    rid = shell.join(client="b", instance=instance)
    response = shell.reply(rid)
    assert response.error is E.NONE and response.generation_id == 1
    assert response.member_id != follower and response.leader_id == leader
    assert shell.group.state is GroupState.STABLE and shell.group.generation_id == 1
    sync = shell.reply(shell.sync(response.member_id, 1, instance=instance))
    assert sync.assignment == f"A-{follower}".encode()
    # The old member id is fenced.
    assert (
        shell.group.heartbeat(
            shell.now, member_id=follower, generation_id=1, group_instance_id=instance
        )
        is E.FENCED_INSTANCE_ID
    )
    assert shell.reply(shell.commit(follower, 1, {("t", 0): 1}, instance)).errors == {
        ("t", 0): E.FENCED_INSTANCE_ID
    }
    # And the replacement was written before it was answered.
    loaded = GroupMetadataLoader().apply_all(shell.log).groups()["g"].metadata
    assert response.member_id in [m.member_id for m in loaded.members]


def test_static_leader_restart_gets_old_leader_id_and_no_rebalance():
    shell = Shell()
    (_a, _b), leader = static_group(shell)
    instance = shell.group.member_instance_id(leader)
    response = shell.reply(shell.join(client="a", instance=instance))
    assert response.leader_id == leader != response.member_id
    assert response.members == () and shell.group.state is GroupState.STABLE
    assert shell.group.leader_id == response.member_id


def test_static_replacement_write_failure_reverts():
    shell = Shell()
    (a, _b), _leader = static_group(shell)
    shell.fail_appends = E.NOT_LEADER_OR_FOLLOWER
    instance = shell.group.member_instance_id(a)
    response = shell.reply(shell.join(client="a", instance=instance))
    assert response.error is E.NOT_COORDINATOR
    assert shell.group.static_member(instance) == a
    assert (
        shell.group.heartbeat(shell.now, member_id=a, generation_id=1, group_instance_id=instance)
        is E.NONE
    )


def test_static_member_with_new_protocol_triggers_rebalance():
    shell = Shell()
    (a, b), _ = static_group(shell, protocols=[("roundrobin", b"r"), ("range", b"g")])
    assert shell.group.protocol_name == "roundrobin"
    inst_a = shell.group.member_instance_id(a)
    # A protocol the others lack: refused, nothing changes.
    rejected = shell.reply(shell.join(client="a", instance=inst_a, protocols=[("sticky", b"")]))
    assert rejected.error is E.INCONSISTENT_GROUP_PROTOCOL
    assert shell.group.static_member(inst_a) == a and shell.group.state is GroupState.STABLE
    # Same vote (roundrobin still wins): replaced without a rebalance.
    same = shell.reply(
        shell.join(client="a", instance=inst_a, protocols=[("roundrobin", b"r2"), ("range", b"g2")])
    )
    assert same.error is E.NONE and shell.group.state is GroupState.STABLE
    # Restart supporting only range: the vote changes, so the group rebalances.
    rid = shell.join(client="a", instance=inst_a, protocols=[("range", b"g3")])
    assert shell.reply(rid) is None and shell.group.state is GroupState.PREPARING_REBALANCE
    b_rejoin = shell.join(
        member_id=b,
        client="b",
        instance=shell.group.member_instance_id(b),
        protocols=[("roundrobin", b"r"), ("range", b"g")],
    )
    assert shell.reply(rid).protocol_name == "range" == shell.reply(b_rejoin).protocol_name


def test_static_member_replaced_while_completing_and_parked_requests_fenced():
    shell = Shell()
    ja = shell.join(client="a", instance="inst-a")
    jb = shell.join(client="b", instance="inst-b")
    shell.advance(2 * DELAY)
    leader, follower = shell.reply(ja).member_id, shell.reply(jb).member_id
    assert shell.group.leader_id == leader
    parked = shell.sync(follower, 1)  # waits for the leader's assignment
    restart = shell.join(client="b", instance="inst-b")  # b restarted meanwhile
    assert shell.reply(parked).error is E.FENCED_INSTANCE_ID
    # The leader may already be assigning to the old id: the group starts over.
    assert shell.group.state is GroupState.PREPARING_REBALANCE
    assert shell.reply(shell.sync(leader, 1)).error is E.REBALANCE_IN_PROGRESS
    shell.join(member_id=leader, client="a", instance="inst-a")
    response = shell.reply(restart)
    assert response.generation_id == 2 and response.member_id != follower


def test_static_leave_and_fencing():
    shell = Shell()
    (a, _b), _ = static_group(shell)
    inst_a = shell.group.member_instance_id(a)
    errors, _ = shell.group.leave_group(shell.now, [("wrong-id", inst_a), ("", "nope")])
    assert errors == [E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID]
    errors, effects = shell.group.leave_group(shell.now, [("", inst_a)])
    shell.run(effects)
    assert errors == [E.NONE] and a not in shell.group.members


# --- offsets -------------------


def test_offset_commit_fencing_and_fetch():
    shell = Shell()
    (a, _b), _, gen = shell.stable_group(2)
    assert shell.reply(shell.commit(a, gen - 1, {("t", 0): 3})).errors[("t", 0)] is (
        E.ILLEGAL_GENERATION
    )
    assert shell.reply(shell.commit("ghost", gen, {("t", 0): 3})).errors[("t", 0)] is (
        E.UNKNOWN_MEMBER_ID
    )
    assert shell.reply(shell.commit("", -1, {("t", 0): 3})).errors[("t", 0)] is (
        E.UNKNOWN_MEMBER_ID
    )
    assert shell.group.fetch_offsets([("t", 0)])[("t", 0)].offset == -1
    shell.hold_appends = True
    rid = shell.commit(
        a, gen, {("t", 0): 7, ("t", 1): OffsetCommitRequestPartition(8, 2, "x" * 5000)}
    )
    assert shell.reply(rid) is None
    assert shell.group.fetch_offsets([("t", 0)])[("t", 0)].offset == -1  # not written yet
    shell.release()
    assert shell.reply(rid) == OffsetCommitResponse(
        {("t", 0): E.NONE, ("t", 1): E.OFFSET_METADATA_TOO_LARGE}
    )
    assert shell.group.fetch_offsets()[("t", 0)].offset == 7
    assert shell.log[-1][0] == OffsetCommitKey("g", "t", 0)
    shell.fail_appends = E.REQUEST_TIMED_OUT
    shell.hold_appends = False
    rid = shell.commit(a, gen, {("t", 0): 9})
    assert shell.reply(rid).errors == {("t", 0): E.COORDINATOR_NOT_AVAILABLE}
    assert shell.group.fetch_offsets()[("t", 0)].offset == 7
    assert shell.reply(shell.commit(a, gen, {("t", 0): -5})).errors == {
        ("t", 0): E.INVALID_COMMIT_OFFSET_SIZE
    }


def test_commit_during_completing_rebalance_and_simple_commits_on_empty_group():
    shell = Shell()
    a = shell.new_member("a")
    shell.advance(2 * DELAY)
    assert shell.reply(shell.commit(a, 1, {("t", 0): 1})).errors[("t", 0)] is (
        E.REBALANCE_IN_PROGRESS
    )
    shell.run(shell.group.leave_group(shell.now, [(a, None)])[1])
    assert shell.group.state is GroupState.EMPTY
    assert shell.reply(shell.commit(a, 1, {("t", 0): 1})).errors[("t", 0)] is E.UNKNOWN_MEMBER_ID
    assert shell.reply(shell.commit("", -1, {("t", 0): 42})).errors[("t", 0)] is E.NONE
    assert shell.group.fetch_offsets([("t", 0)])[("t", 0)].offset == 42


def test_describe_delete_and_dead_group():
    shell = Shell()
    (a, b), _, gen = shell.stable_group(2)
    description = shell.group.describe()
    assert description.state is GroupState.STABLE and description.protocol == "range"
    assert {m.member_id: m.assignment for m in description.members} == {
        a: f"A-{a}".encode(),
        b: f"A-{b}".encode(),
    }
    assert shell.group.delete(shell.now)[0] is E.NON_EMPTY_GROUP
    shell.commit(a, gen, {("t", 0): 1})
    shell.run(shell.group.leave_group(shell.now, [(a, None), (b, None)])[1])
    error, effects = shell.group.delete(shell.now)
    shell.run(effects)
    assert error is E.NONE and shell.group.state is GroupState.DEAD
    assert GroupMetadataLoader().apply_all(shell.log).groups() == {}
    assert shell.group.delete(shell.now)[0] is E.GROUP_ID_NOT_FOUND
    assert shell.reply(shell.join()).error is E.COORDINATOR_NOT_AVAILABLE
    assert shell.reply(shell.sync(a, gen)).error is E.COORDINATOR_NOT_AVAILABLE
    assert shell.group.heartbeat(0, member_id=a, generation_id=gen) is (E.COORDINATOR_NOT_AVAILABLE)
    assert shell.reply(shell.commit("", -1, {("t", 0): 1})).errors[("t", 0)] is (
        E.COORDINATOR_NOT_AVAILABLE
    )
    assert shell.group.leave_group(0, [(a, None)])[0] == [E.COORDINATOR_NOT_AVAILABLE]


def test_offsets_expire_after_group_is_empty_for_retention():
    retention = 60_000
    shell = Shell(GroupConfig(initial_rebalance_delay_ms=DELAY, offsets_retention_ms=retention))
    (a, b), _, gen = shell.stable_group(2)
    shell.commit(a, gen, {("t", 0): 1})
    shell.run(shell.group.expire_offsets(shell.now + 10 * retention))
    assert ("t", 0) in shell.group.offsets  # active consumer group subscribed to t: kept
    shell.run(shell.group.leave_group(shell.now, [(a, None), (b, None)])[1])
    empty_since = shell.now
    shell.run(shell.group.expire_offsets(empty_since + retention - 1))
    assert ("t", 0) in shell.group.offsets
    shell.run(shell.group.expire_offsets(empty_since + retention))
    assert shell.group.offsets == {} and shell.group.state is GroupState.DEAD
    assert GroupMetadataLoader().apply_all(shell.log).groups() == {}


# --- loading -------------------


def test_load_restores_stable_group_and_members_keep_their_assignment():
    shell = Shell()
    (a, b), leader, gen = shell.stable_group(2)
    shell.commit(a, gen, {("t", 0): 11})
    loaded = GroupMetadataLoader().apply_all(shell.log).groups()["g"]
    group = GroupStateMachine.load(
        "g",
        loaded.metadata,
        loaded.offsets,
        now_ms=shell.now,
        config=GroupConfig(initial_rebalance_delay_ms=DELAY),
    )
    assert group.state is GroupState.STABLE and group.generation_id == gen
    assert group.leader_id == leader and set(group.members) == {a, b}
    assert group.assignment(a) == f"A-{a}".encode()
    assert group.fetch_offsets([("t", 0)])[("t", 0)].offset == 11
    assert group.heartbeat(shell.now, member_id=b, generation_id=gen) is E.NONE
    assert group.subscribed_topics == frozenset({"t"})
    empty = GroupStateMachine.load("h", None, {}, now_ms=0)
    assert empty.state is GroupState.EMPTY and empty.generation_id == 0


def test_group_errors_map_to_typed_exceptions():
    from fjord import errors

    pairs = {
        E.ILLEGAL_GENERATION: errors.IllegalGenerationError,
        E.UNKNOWN_MEMBER_ID: errors.UnknownMemberIdError,
        E.REBALANCE_IN_PROGRESS: errors.RebalanceInProgressError,
        E.MEMBER_ID_REQUIRED: errors.MemberIdRequiredError,
        E.FENCED_INSTANCE_ID: errors.FencedInstanceIdError,
        E.INCONSISTENT_GROUP_PROTOCOL: errors.InconsistentGroupProtocolError,
        E.INVALID_SESSION_TIMEOUT: errors.InvalidSessionTimeoutError,
        E.NON_EMPTY_GROUP: errors.NonEmptyGroupError,
        E.GROUP_ID_NOT_FOUND: errors.GroupIdNotFoundError,
        E.OFFSET_METADATA_TOO_LARGE: errors.OffsetMetadataTooLargeError,
        E.COORDINATOR_NOT_AVAILABLE: errors.CoordinatorNotAvailableError,
        E.GROUP_MAX_SIZE_REACHED: errors.GroupMaxSizeReachedError,
    }
    for code, cls in pairs.items():
        error = errors.error_for_code(code, "detail")
        assert type(error) is cls and error.code is code and str(error) == "detail"
        assert errors.error_code_from_number(code.code) is code
