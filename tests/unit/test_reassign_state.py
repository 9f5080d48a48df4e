"""The reassignment state machine (pure): start, ISR growth, completion, cancel; the planner
functions the controller runs (AlterPartitionReassignments, reconcile after a fail-over); the
partition state's JSON; the CLI's reassignment file parser."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.cli.topics_cmd import parse_reassignment_json
from fjord.controller.election import alter_isr, on_liveness_change
from fjord.controller.planner import (
    ReassignmentRequest,
    list_reassignments,
    plan_alter_reassignments,
    plan_reconcile,
)
from fjord.controller.reassignment import (
    can_complete,
    cancel_reassignment,
    complete_reassignment,
    start_reassignment,
)
from fjord.errors import (
    InvalidReplicaAssignmentError,
    InvalidRequestError,
    NoReassignmentInProgressError,
    UnknownTopicOrPartitionError,
)
from fjord.metadata import NO_LEADER, PartitionState
from tests.helpers.metadata_images import image_of, state

ALL = {1, 2, 3, 4, 5}


def test_start_records_union_adding_and_removing() -> None:
    s = start_reassignment(state([1, 2, 3], [1, 2, 3], 1), [4, 5, 1], ALL)
    assert s.replicas == (4, 5, 1, 2, 3)
    assert s.adding_replicas == (4, 5) and s.removing_replicas == (2, 3)
    assert s.target_replicas == (4, 5, 1)
    assert s.isr == (1, 2, 3) and s.leader == 1
    assert (s.leader_epoch, s.partition_epoch) == (4, 10)
    assert s.reassigning and not can_complete(s, ALL)


def test_full_procedure_moves_leadership_to_target_and_drops_old_replicas() -> None:
    s = start_reassignment(state([1, 2], [1, 2], 1), [3, 4], ALL)
    # The leader adds the new replicas to the ISR as they catch up (AlterPartition).
    s = alter_isr(s, 1, s.leader_epoch, s.partition_epoch, [1, 2, 3], ALL)
    assert not can_complete(s, ALL)
    s = alter_isr(s, 1, s.leader_epoch, s.partition_epoch, [1, 2, 3, 4], ALL)
    assert can_complete(s, ALL)
    done = complete_reassignment(s, ALL)
    assert done.replicas == (3, 4) and done.isr == (3, 4)
    assert done.leader == 3 and done.leader_epoch == s.leader_epoch + 1
    assert not done.reassigning and done.partition_epoch == s.partition_epoch + 1


def test_completion_keeps_a_leader_that_stays_and_waits_for_a_live_target() -> None:
    s = start_reassignment(state([1, 2], [1, 2], 2), [2, 3], ALL)
    s = alter_isr(s, 2, s.leader_epoch, s.partition_epoch, [1, 2, 3], ALL)
    done = complete_reassignment(s, ALL)
    assert (done.replicas, done.isr, done.leader, done.leader_epoch) == ((2, 3), (2, 3), 2, 4)
    # No live target replica: nothing happens yet.
    assert not can_complete(s, {1})
    assert complete_reassignment(s, {1}) is s


def test_reorder_only_changes_preferred_leader_at_once_via_planner() -> None:
    image = image_of([1, 2, 3], {("t", 0): state([1, 2, 3], [1, 2, 3], 1)})
    changes, records, outcomes = plan_alter_reassignments(
        image, [ReassignmentRequest("t", 0, (3, 1, 2))]
    )
    new = changes[("t", 0)]
    assert new.replicas == (3, 1, 2) and not new.reassigning and new.leader == 1
    assert records == {} and outcomes[0].error is None


def test_shrink_completes_at_once_and_updates_replication_factor() -> None:
    image = image_of(
        [1, 2, 3],
        {("t", 0): state([1, 2, 3], [1, 2, 3], 1), ("t", 1): state([2, 3, 1], [2, 3, 1], 2)},
    )
    changes, records, _ = plan_alter_reassignments(
        image, [ReassignmentRequest("t", 0, (2,)), ReassignmentRequest("t", 1, (2,))]
    )
    assert changes[("t", 0)] == PartitionState((2,), (2,), 2, 5, 10)
    assert changes[("t", 1)].replicas == (2,) and changes[("t", 1)].leader == 2
    assert records["t"].replication_factor == 1


def test_growth_updates_replication_factor_only_when_all_partitions_agree() -> None:
    image = image_of(
        [1, 2, 3],
        {("t", 0): state([1], [1], 1), ("t", 1): state([2], [2], 2)},
    )
    _, records, _ = plan_alter_reassignments(image, [ReassignmentRequest("t", 0, (1, 2, 3))])
    assert records == {}  # partition 1 still has one replica: the topic RF stays 1
    both = [ReassignmentRequest("t", 0, (1, 2, 3)), ReassignmentRequest("t", 1, (2, 3, 1))]
    changes, records, _ = plan_alter_reassignments(image, both)
    assert records["t"].replication_factor == 3
    assert changes[("t", 0)].adding_replicas == (2, 3)


def test_alter_reassignments_errors_per_partition() -> None:
    image = image_of([1, 2], {("t", 0): state([1], [1], 1)})
    _, _, outcomes = plan_alter_reassignments(
        image,
        [
            ReassignmentRequest("t", 0, (1, 1)),
            ReassignmentRequest("t", 9, (1,)),
            ReassignmentRequest("u", 0, None),
        ],
    )
    kinds = [type(o.error) for o in outcomes]
    assert kinds == [
        InvalidReplicaAssignmentError,
        UnknownTopicOrPartitionError,
        UnknownTopicOrPartitionError,
    ]
    for target in [(), (3,)]:
        _, _, out = plan_alter_reassignments(image, [ReassignmentRequest("t", 0, target)])
        assert isinstance(out[0].error, InvalidReplicaAssignmentError)
    _, _, out = plan_alter_reassignments(image, [ReassignmentRequest("t", 0, None)])
    assert isinstance(out[0].error, NoReassignmentInProgressError)
    twice = [ReassignmentRequest("t", 0, (2,)), ReassignmentRequest("t", 0, (1,))]
    changes, _, out = plan_alter_reassignments(image, twice)
    assert changes == {} and all(isinstance(o.error, InvalidRequestError) for o in out)


def test_cancel_restores_original_replicas() -> None:
    original = state([1, 2], [1, 2], 1)
    s = start_reassignment(original, [3, 4], ALL)
    s = alter_isr(s, 1, s.leader_epoch, s.partition_epoch, [1, 2, 3], ALL)
    back = cancel_reassignment(s, ALL)
    assert (back.replicas, back.isr, back.leader) == ((1, 2), (1, 2), 1)
    assert not back.reassigning
    with pytest.raises(NoReassignmentInProgressError):
        cancel_reassignment(back, ALL)


def test_new_target_replaces_a_running_reassignment() -> None:
    s = start_reassignment(state([1, 2], [1, 2], 1), [3, 4], ALL)
    s2 = start_reassignment(s, [1, 5], ALL)
    assert s2.replicas == (1, 5, 2) and s2.adding_replicas == (5,)
    assert s2.removing_replicas == (2,)


def test_reconcile_resumes_reassignment_after_failover() -> None:
    """A new controller sees a reassignment whose targets joined the ISR while no controller
    was active: its first reconcile completes it."""
    s = start_reassignment(state([1, 2], [1, 2], 1), [2, 3], ALL)
    s = alter_isr(s, 1, s.leader_epoch, s.partition_epoch, [1, 2, 3], ALL)
    image = image_of([1, 2, 3], {("t", 0): s, ("t", 1): state([1], [1], 1)})
    assert [r.adding_replicas for r in list_reassignments(image)] == [(3,)]
    changes = plan_reconcile(image)
    assert set(changes) == {("t", 0)}
    done = changes[("t", 0)]
    assert done.replicas == (2, 3) and done.leader == 2 and not done.reassigning


def test_reconcile_combines_liveness_and_completion() -> None:
    s = start_reassignment(state([1, 2], [1, 2], 1), [2, 3], ALL)
    s = alter_isr(s, 1, s.leader_epoch, s.partition_epoch, [1, 2, 3], ALL)
    image = image_of([2, 3], {("t", 0): s})  # broker 1 died
    done = plan_reconcile(image)[("t", 0)]
    assert (done.replicas, done.isr, done.leader) == ((2, 3), (2, 3), 2)


def test_partition_state_json_round_trip_with_and_without_reassignment() -> None:
    s = start_reassignment(state([1, 2], [1, 2], 1), [2, 3], ALL)
    assert PartitionState.from_json(s.to_json()) == s
    plain = state([1], [1], 1)
    assert b"adding" not in plain.to_json()
    assert PartitionState.from_json(plain.to_json()) == plain


@st.composite
def steps(draw: st.DrawFn) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["start", "grow", "live", "complete", "cancel"]))
        if kind == "start":
            out.append((kind, draw(st.permutations(sorted(ALL))).__getitem__(
                slice(0, draw(st.integers(1, 4))))))
        elif kind == "live":
            out.append((kind, draw(st.sets(st.sampled_from(sorted(ALL)), min_size=1))))
        else:
            out.append((kind, None))
    return out


@settings(max_examples=300, deadline=None)
@given(steps())
def test_any_sequence_keeps_partition_invariants(sequence: list[tuple[str, object]]) -> None:
    s = state([1, 2, 3], [1, 2, 3], 1)
    live: set[int] = set(ALL)
    for kind, arg in sequence:
        old = s
        if kind == "start":
            with contextlib.suppress(InvalidReplicaAssignmentError):
                s = start_reassignment(s, arg, live)  # type: ignore[arg-type]
        elif kind == "grow" and s.leader != NO_LEADER:
            missing = [r for r in s.replicas if r not in s.isr and r in live]
            if missing:
                s = alter_isr(s, s.leader, s.leader_epoch, s.partition_epoch,
                              [*s.isr, missing[0]], live)
        elif kind == "live":
            live = set(arg)  # type: ignore[call-overload]
            s = on_liveness_change(s, live)
        elif kind == "complete":
            s = complete_reassignment(s, live)
        elif kind == "cancel" and s.reassigning:
            s = cancel_reassignment(s, live)
        assert s.isr and set(s.isr) <= set(s.replicas)
        assert len(set(s.replicas)) == len(s.replicas)
        assert s.leader == NO_LEADER or s.leader in s.isr
        assert set(s.adding_replicas) <= set(s.replicas)
        assert set(s.removing_replicas) <= set(s.replicas)
        assert not set(s.adding_replicas) & set(s.removing_replicas)
        assert s.leader_epoch == old.leader_epoch + (s.leader != old.leader)
        assert s.partition_epoch == old.partition_epoch + (s != old)
        if not s.reassigning:
            assert s.target_replicas == s.replicas


def test_parse_reassignment_json() -> None:
    text = '{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[3,1]}]}'
    assert parse_reassignment_json(text) == {("t", 0): [3, 1]}


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "{}",
        '{"partitions": []}',
        '{"partitions": [1]}',
        '{"partitions": [{"topic": "", "partition": 0, "replicas": [1]}]}',
        '{"partitions": [{"topic": "t", "partition": -1, "replicas": [1]}]}',
        '{"partitions": [{"topic": "t", "partition": 0, "replicas": ["1"]}]}',
        '{"partitions": [{"topic": "t", "partition": 0, "replicas": [1]},'
        ' {"topic": "t", "partition": 0, "replicas": [2]}]}',
    ],
)
def test_parse_reassignment_json_refusals(text: str) -> None:
    with pytest.raises(InvalidReplicaAssignmentError):
        parse_reassignment_json(text)
