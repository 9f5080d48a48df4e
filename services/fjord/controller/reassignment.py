"""Partition reassignment, pure: the per-partition state machine.

State machine (Kafka's KIP-455 procedure, on :class:`PartitionState`):

1. :func:`start_reassignment`: ``replicas`` becomes target + (old replicas not in the target),
   ``adding_replicas`` = target - old, ``removing_replicas`` = old - target. The new replicas
   are now assigned, so their brokers create the log and start fetching from the leader.
2. The leader adds each new replica to the ISR when it has caught up (AlterPartition).
3. :func:`complete_reassignment`, once every target replica is in the ISR: ``replicas`` = target,
   the ISR keeps only target replicas, and if the leader is not a target replica the first live
   target replica of the ISR leads (leader epoch bumped). Brokers of removed replicas delete
   their logs.

:func:`cancel_reassignment` goes back to the old replicas (Kafka's cancel: the adding replicas
are dropped, the removing ones stay). Every step keeps :class:`PartitionState`'s invariants and
bumps ``partition_epoch`` (``leader_epoch`` only when the leader changes).

The planner that computes target replica lists for a cluster change is shared with the admin
client and the operator: :func:`fjord.cluster.reassignment_plan.plan_reassignment`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from fjord.errors import (
    InvalidReplicaAssignmentError,
    NoReassignmentInProgressError,
)
from fjord.metadata import NO_LEADER, PartitionState


def validate_target(target: Sequence[int], live: Collection[int]) -> tuple[int, ...]:
    """A target replica list: non-empty, no duplicates, every broker live (registered)."""
    replicas = tuple(target)
    if not replicas:
        raise InvalidReplicaAssignmentError("the target replica list is empty")
    if len(set(replicas)) != len(replicas):
        raise InvalidReplicaAssignmentError(f"the target replicas {list(replicas)} repeat a broker")
    unknown = sorted(r for r in replicas if r not in live)
    if unknown:
        raise InvalidReplicaAssignmentError(f"target brokers {unknown} are not live")
    return replicas


def original_replicas(state: PartitionState) -> tuple[int, ...]:
    """The replicas before the running reassignment (all replicas when none runs), in the
    order they had (removing replicas keep their relative order)."""
    return tuple(r for r in state.replicas if r not in state.adding_replicas)


def start_reassignment(
    state: PartitionState, target: Sequence[int], live: Collection[int]
) -> PartitionState:
    """Step 1: record the target. A reassignment already running is replaced (Kafka's rule:
    the new target counts from the original replicas). A target equal to the current replicas
    with no reassignment running changes nothing except the order (the preferred leader), which
    is applied at once. Raises InvalidReplicaAssignmentError for a bad target."""
    new_target = validate_target(target, live)
    original = original_replicas(state)
    adding = tuple(r for r in new_target if r not in original)
    removing = tuple(r for r in original if r not in new_target)
    replicas = new_target + removing
    isr = tuple(r for r in state.isr if r in replicas)
    leader = state.leader
    if leader != NO_LEADER and leader not in isr:
        # Only when a replaced reassignment drops an adding replica that had become leader.
        leader = next((r for r in replicas if r in isr and r in live), NO_LEADER)
    if not isr:
        isr = replicas[:1]
    if (replicas, isr, adding, removing, leader) == (
        state.replicas,
        state.isr,
        state.adding_replicas,
        state.removing_replicas,
        state.leader,
    ):
        return state
    return replace(
        state,
        replicas=replicas,
        isr=isr,
        leader=leader,
        adding_replicas=adding,
        removing_replicas=removing,
        leader_epoch=state.leader_epoch + (1 if leader != state.leader else 0),
        partition_epoch=state.partition_epoch + 1,
    )


def cancel_reassignment(state: PartitionState, live: Collection[int]) -> PartitionState:
    """Go back to the original replicas: adding replicas leave replicas and ISR. Raises
    NoReassignmentInProgressError when none runs. A leader that was an adding replica hands
    over to the first live original replica of the ISR (-1 when there is none)."""
    if not state.reassigning:
        raise NoReassignmentInProgressError("no reassignment in progress for this partition")
    replicas = original_replicas(state)
    isr = tuple(r for r in state.isr if r in replicas)
    leader = state.leader
    if leader not in isr:
        leader = next((r for r in replicas if r in isr and r in live), NO_LEADER)
    if not isr:
        # Keep the ISR non-empty (the last member's data is the best there is); no leader.
        isr = replicas[:1]
    return replace(
        state,
        replicas=replicas,
        isr=isr,
        leader=leader,
        adding_replicas=(),
        removing_replicas=(),
        leader_epoch=state.leader_epoch + (1 if leader != state.leader else 0),
        partition_epoch=state.partition_epoch + 1,
    )


def can_complete(state: PartitionState, live: Collection[int]) -> bool:
    """Whether :func:`complete_reassignment` may run: a reassignment runs, every target
    replica is in the ISR, and some target replica of the ISR is live to lead."""
    if not state.reassigning:
        return False
    target = state.target_replicas
    return all(r in state.isr for r in target) and any(r in live for r in target)


def complete_reassignment(state: PartitionState, live: Collection[int]) -> PartitionState:
    """Step 3: drop the removing replicas. The caller checked :func:`can_complete`; otherwise
    the state is returned unchanged. The leader keeps leading if it is a target replica,
    otherwise the first live target replica (preferred order) takes over."""
    if not can_complete(state, live):
        return state
    target = state.target_replicas
    isr = tuple(r for r in state.isr if r in target)
    leader = state.leader
    if leader not in target or leader not in live:
        leader = next(r for r in target if r in isr and r in live)
    return replace(
        state,
        replicas=target,
        isr=isr,
        leader=leader,
        adding_replicas=(),
        removing_replicas=(),
        leader_epoch=state.leader_epoch + (1 if leader != state.leader else 0),
        partition_epoch=state.partition_epoch + 1,
    )
