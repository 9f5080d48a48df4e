"""Random sequences of JoinGroup/SyncGroup/Heartbeat/LeaveGroup/OffsetCommit, static restarts,
append completions and failures, and time advances keep the group's invariants; the log the
group writes replays (loader, then ``GroupStateMachine.load``) to the same group."""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fjord.coordinator.group import (
    GroupConfig,
    GroupStateMachine,
    JoinGroupResponse,
    OffsetCommitResponse,
    SyncGroupResponse,
)
from fjord.coordinator.offsets_log import GroupMetadataLoader
from fjord.errors import ErrorCode as E
from fjord.groups.state import GroupState
from tests.helpers.group_shell import DELAY, Shell, sub

PROTOCOLS = [
    [("range", sub("t"))],
    [("roundrobin", sub("t")), ("range", sub("t"))],
    [("range", sub("t", "u"))],
]

# Each step: a kind (whole-group steps listed several times so sequences reach Stable often)
# and the arguments every kind draws from: member index, generation offset, partition, flag,
# milliseconds.
KINDS = [
    "join_new",
    "join_new",
    "rejoin",
    "sync",
    "heartbeat",
    "leave",
    "commit",
    "commit",
    "simple_commit",
    "advance",
    "advance",
    "release",
    "hold",
    "expire",
    "sync_leader",
    "sync_leader",
    "sync_leader",
    "sync_all",
    "rejoin_all",
    "rejoin_all",
    "rejoin_all",
    "settle",
    "settle",
    "settle",
]
ops = st.lists(
    st.tuples(
        st.sampled_from(KINDS),
        st.integers(0, 9),
        st.integers(-1, 0),
        st.integers(0, 2),
        st.booleans(),
        st.sampled_from([1, 500, 3_000, 6_000, 11_000, 31_000]),
    ),
    max_size=30,
)


def check_invariants(shell: Shell, last_generation: int) -> None:
    group = shell.group
    assert group.generation_id >= last_generation
    if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
        assert group.members and group.leader_id in group.members
    if group.state in (GroupState.EMPTY, GroupState.DEAD):
        assert group.members == ()
    if group.members:
        assert group.leader_id in group.members
    if group.state is GroupState.STABLE and not shell.held:
        # What was written is what the group is: members, generation, assignments.
        loaded = GroupMetadataLoader().apply_all(shell.log).groups()["g"]
        meta = loaded.metadata
        assert meta is not None and meta.generation == group.generation_id
        assert {m.member_id: m.assignment for m in meta.members} == {
            m: group.assignment(m) for m in group.members
        }
        reloaded = GroupStateMachine.load("g", meta, loaded.offsets, now_ms=shell.now)
        assert reloaded.state is GroupState.STABLE and set(reloaded.members) == set(group.members)
        assert reloaded.leader_id == group.leader_id
        assert reloaded.offsets == group.offsets


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 3), st.booleans(), ops)
def test_random_operation_sequences_keep_invariants(start_members, static, sequence):
    shell = Shell(GroupConfig(initial_rebalance_delay_ms=DELAY))
    known: list[str] = []
    generation_of: dict[str, int] = {}
    commit_valid: dict[int, bool] = {}
    requests: list[int] = []
    last_generation = 0
    # Most sequences start from a Stable group of a few members (static or dynamic).
    joins = []
    for i in range(start_members):
        instance = f"i{i}" if static else None
        rid = shell.join(client=f"c{i}", instance=instance)
        first = shell.reply(rid)
        requests.append(rid)
        if first is not None:  # MEMBER_ID_REQUIRED
            rid = shell.join(member_id=first.member_id, client=f"c{i}")
            requests.append(rid)
        joins.append(rid)
    if start_members:
        shell.advance(2 * DELAY)
        leader = shell.group.leader_id
        assignments = {m: m.encode() for m in shell.group.members}
        for member in shell.group.members:
            requests.append(
                shell.sync(
                    member,
                    1,
                    assignments if member == leader else None,
                    shell.group.member_instance_id(member),
                )
            )
        assert shell.group.state is GroupState.STABLE
        known.extend(shell.group.members)

    def pick(index: int) -> str:
        return known[index % len(known)] if known else "nobody"

    for op in sequence:
        kind = op[0]
        group = shell.group
        _, index, generation_offset, partition, flag, ms = op
        if kind == "join_new":
            client, static, proto = index % 4, flag, partition
            rid = shell.join(
                client=f"c{client}",
                instance=f"i{client}" if static else None,
                protocols=PROTOCOLS[proto],
            )
            requests.append(rid)
            reply = shell.reply(rid)
            if reply is not None and reply.member_id:
                known.append(reply.member_id)
                if reply.error is E.MEMBER_ID_REQUIRED and generation_offset == 0:
                    requests.append(
                        shell.join(
                            member_id=reply.member_id,
                            client=f"c{client}",
                            protocols=PROTOCOLS[proto],
                        )
                    )
            for mid in group.members:
                if mid not in known:
                    known.append(mid)
        elif kind == "rejoin":
            member = pick(index)
            rid = shell.join(
                member_id=member,
                client="c",
                protocols=PROTOCOLS[partition],
                instance=group.member_instance_id(member) if member in group.members else None,
            )
            requests.append(rid)
        elif kind == "sync":
            member = pick(index)
            generation = group.generation_id + generation_offset
            assignments = {m: m.encode() for m in group.members}
            instance = group.member_instance_id(member) if member in group.members else None
            requests.append(shell.sync(member, generation, assignments, instance))
        elif kind == "heartbeat":
            member = pick(index)
            instance = group.member_instance_id(member) if member in group.members else None
            error = group.heartbeat(
                shell.now,
                member_id=member,
                generation_id=group.generation_id + generation_offset,
                group_instance_id=instance,
            )
            if generation_offset != 0:
                assert error is not E.NONE
        elif kind == "leave":
            _errors, effects = group.leave_group(shell.now, [(pick(index), None)])
            shell.run(effects)
        elif kind == "commit":
            member = pick(index)
            generation = group.generation_id + generation_offset
            valid = (
                member in group.members
                and generation == group.generation_id
                and group.state in (GroupState.STABLE, GroupState.PREPARING_REBALANCE)
            )
            instance = group.member_instance_id(member) if member in group.members else None
            rid = shell.commit(member, generation, {("t", partition): len(requests)}, instance)
            commit_valid[rid] = valid
            requests.append(rid)
        elif kind == "simple_commit":
            rid = shell.commit("", -1, {("t", partition): len(requests)})
            commit_valid[rid] = group.state is GroupState.EMPTY
            requests.append(rid)
        elif kind == "advance":
            shell.advance(ms)
        elif kind == "release":
            shell.release(None if flag else E.NOT_ENOUGH_REPLICAS)
        elif kind == "hold":
            shell.hold_appends = flag
        elif kind == "expire" and flag and partition == 2:  # rare: it kills an Empty group
            shell.run(group.expire_offsets(shell.now))
        elif kind == "sync_leader" and group.leader_id is not None:
            leader = group.leader_id
            requests.append(
                shell.sync(
                    leader,
                    group.generation_id,
                    {m: m.encode() for m in group.members},
                    group.member_instance_id(leader),
                )
            )
        elif kind == "sync_all":
            for member in group.members:
                requests.append(
                    shell.sync(
                        member,
                        group.generation_id,
                        {m: m.encode() for m in group.members},
                        group.member_instance_id(member),
                    )
                )
        elif kind == "rejoin_all":
            for member in [*group.members, *group.pending_members]:
                instance = group.member_instance_id(member) if member in group.members else None
                requests.append(shell.join(member_id=member, client="c", instance=instance))
        elif kind == "settle":  # the usual end of a rebalance: rejoins, leader syncs, written
            if group.state is GroupState.PREPARING_REBALANCE:
                for member in group.members:
                    requests.append(
                        shell.join(
                            member_id=member, client="c", instance=group.member_instance_id(member)
                        )
                    )
            for _ in range(3):  # the initial delay may be extended by late joiners
                shell.advance(DELAY)
                if group.state is not GroupState.PREPARING_REBALANCE:
                    break
            if group.state is GroupState.COMPLETING_REBALANCE and group.leader_id is not None:
                requests.append(
                    shell.sync(
                        group.leader_id,
                        group.generation_id,
                        {m: m.encode() for m in group.members},
                        group.member_instance_id(group.leader_id),
                    )
                )
            shell.release()

        for rid, reply in shell.replies.items():
            if isinstance(reply, OffsetCommitResponse) and E.NONE in reply.errors.values():
                assert commit_valid.get(rid), "a stale or non-member commit was accepted"
            if isinstance(reply, JoinGroupResponse) and reply.error is E.NONE:
                generation_of[reply.member_id] = reply.generation_id
            if isinstance(reply, SyncGroupResponse) and reply.error is E.NONE:
                assert reply.protocol_name is not None
        check_invariants(shell, last_generation)
        last_generation = shell.group.generation_id
        event(f"reached {shell.group.state.value}")

    accepted = sum(
        1
        for rid in commit_valid
        if rid in shell.replies and E.NONE in shell.replies[rid].errors.values()
    )
    event(f"generation >= 2: {shell.group.generation_id >= 2}; commits accepted: {accepted > 0}")

    # Drain: write everything, then let every session and phase time out. Every request the
    # shell handed in must have been answered exactly once by then.
    shell.hold_appends = False
    shell.release()
    for _ in range(4):
        shell.advance(2_000_000)
        shell.release()
    assert set(requests) <= set(shell.replies)
    assert shell.group.state in (GroupState.EMPTY, GroupState.DEAD)
    loaded = GroupMetadataLoader().apply_all(shell.log).groups().get("g")
    if shell.group.state is GroupState.DEAD:
        assert loaded is None or (loaded.metadata is None and not loaded.offsets)
    elif loaded is None:  # never written: nothing ever happened that must survive
        assert shell.group.offsets == {} and shell.group.generation_id == 0
    else:
        assert loaded.offsets == shell.group.offsets
        if loaded.metadata is not None:
            assert loaded.metadata.generation == shell.group.generation_id
            assert loaded.metadata.members == ()
