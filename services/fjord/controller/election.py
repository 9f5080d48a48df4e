"""Leader election and ISR changes, pure (Kafka's KRaft controller rules).

All functions take a :class:`PartitionState` and return a new one (or the same object when
nothing changes), keeping its invariants: ``isr`` is a subset of ``replicas``; ``leader`` is in
``isr`` or -1; ``leader_epoch`` grows by one exactly when the leader changes (including to and
from -1); ``partition_epoch`` grows by one on every change.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from fjord.errors import (
    ElectionNotNeededError,
    EligibleLeadersNotAvailableError,
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidRequestError,
    InvalidUpdateVersionError,
    NotLeaderOrFollowerError,
    PreferredLeaderNotAvailableError,
)
from fjord.metadata import NO_LEADER, PartitionState


def initial_state(replicas: Sequence[int]) -> PartitionState:
    """A new partition: every replica in the ISR, the first (preferred) one leads, epochs 0."""
    return PartitionState(tuple(replicas), tuple(replicas), replicas[0], 0, 0)


def _changed(state: PartitionState, leader: int, isr: tuple[int, ...]) -> PartitionState:
    if leader == state.leader and isr == state.isr:
        return state
    return replace(
        state,
        leader=leader,
        isr=isr,
        leader_epoch=state.leader_epoch + (1 if leader != state.leader else 0),
        partition_epoch=state.partition_epoch + 1,
    )


def on_liveness_change(
    state: PartitionState, live: Collection[int], unclean_allowed: bool = False
) -> PartitionState:
    """The state after brokers came or went (``live``: the registered brokers).

    Dead brokers leave the ISR, except the last member, which stays so that it can lead again
    when it returns (nothing else has its data). A live leader keeps leading; otherwise the
    first replica (preferred order) in the live ISR leads. With no live ISR member the
    partition goes offline (-1), unless unclean election is allowed and a replica is live: then
    it leads alone (data loss accepted by configuration).
    """
    live_isr = tuple(r for r in state.isr if r in live)
    isr = live_isr or state.isr
    if state.leader in live and state.leader in isr:
        return _changed(state, state.leader, isr)
    candidates = [r for r in state.replicas if r in live_isr]
    if candidates:
        return _changed(state, candidates[0], isr)
    if unclean_allowed:
        live_replicas = [r for r in state.replicas if r in live]
        if live_replicas:
            return _changed(state, live_replicas[0], (live_replicas[0],))
    return _changed(state, NO_LEADER, isr)


def _check_leader_request(
    state: PartitionState, broker_id: int, leader_epoch: int, partition_epoch: int
) -> None:
    """The fencing of a leader's request (AlterPartition): it must come from the current leader
    in the current leader and partition epochs."""
    if broker_id != state.leader:
        raise NotLeaderOrFollowerError(f"broker {broker_id} is not the leader ({state.leader})")
    if leader_epoch != state.leader_epoch:
        raise FencedLeaderEpochError(
            f"leader epoch {leader_epoch} is not the current {state.leader_epoch}"
        )
    if partition_epoch != state.partition_epoch:
        raise InvalidUpdateVersionError(
            f"partition epoch {partition_epoch} is not the current {state.partition_epoch}"
        )


def alter_isr(
    state: PartitionState,
    broker_id: int,
    leader_epoch: int,
    partition_epoch: int,
    new_isr: Sequence[int],
    live: Collection[int],
) -> PartitionState:
    """Apply a leader's AlterPartition request (fenced by its leader and partition epochs).

    Raises NotLeaderOrFollowerError (not the leader), FencedLeaderEpochError (other leader
    epoch), InvalidUpdateVersionError (other partition epoch), InvalidRequestError (ISR without
    the leader, duplicates or non-replicas), IneligibleReplicaError (a new member not live).
    """
    _check_leader_request(state, broker_id, leader_epoch, partition_epoch)
    isr = tuple(new_isr)
    if len(set(isr)) != len(isr) or state.leader not in isr:
        raise InvalidRequestError("the new ISR must contain the leader once and no duplicates")
    outside = [r for r in isr if r not in state.replicas]
    if outside:
        raise InvalidRequestError(f"brokers {outside} are not replicas of this partition")
    ineligible = [r for r in isr if r not in state.isr and r not in live]
    if ineligible:
        raise IneligibleReplicaError(f"brokers {ineligible} are not live")
    return _changed(state, state.leader, isr)


def resign_leadership(
    state: PartitionState,
    broker_id: int,
    leader_epoch: int,
    partition_epoch: int,
    live: Collection[int],
) -> PartitionState:
    """A leader gives up leadership because it cannot serve safely (its data directory cannot
    be written, or its copy holds a damaged batch): the first live ISR member in preferred
    order leads, and the resigning broker leaves the ISR (it rejoins once it has caught up
    again, and preferred election may then hand leadership back).

    Fenced like :func:`alter_isr` (NotLeaderOrFollowerError, FencedLeaderEpochError,
    InvalidUpdateVersionError). Raises EligibleLeadersNotAvailableError when no other live ISR
    member exists: the partition keeps its leader rather than go offline.
    """
    _check_leader_request(state, broker_id, leader_epoch, partition_epoch)
    others = [r for r in state.replicas if r in state.isr and r != broker_id and r in live]
    if not others:
        raise EligibleLeadersNotAvailableError(
            f"no other live in-sync replica can take over from broker {broker_id} "
            f"(ISR {list(state.isr)})"
        )
    return _changed(state, others[0], tuple(r for r in state.isr if r != broker_id))


def preferred_leader(state: PartitionState) -> int:
    """The preferred replica: the first of the replica list (during a reassignment the list
    starts with the target replicas, so it is the target's first)."""
    return state.replicas[0]


def elect_preferred(state: PartitionState, live: Collection[int]) -> PartitionState:
    """Move leadership to the preferred replica (Kafka's preferred election).

    Raises ElectionNotNeededError when it already leads and PreferredLeaderNotAvailableError
    when it is not live or not in the ISR (leadership never goes to a replica that may lack
    acknowledged records).
    """
    preferred = preferred_leader(state)
    if state.leader == preferred:
        raise ElectionNotNeededError(f"preferred replica {preferred} already leads")
    if preferred not in live or preferred not in state.isr:
        raise PreferredLeaderNotAvailableError(
            f"preferred replica {preferred} is "
            + ("not live" if preferred not in live else "not in the ISR")
        )
    return _changed(state, preferred, state.isr)


def elect_unclean(state: PartitionState, live: Collection[int]) -> PartitionState:
    """An explicit unclean election (ElectLeaders with UNCLEAN): for a partition without a live
    leader, the first live ISR member leads, or else the first live replica (alone in the ISR:
    records only the old ISR had are lost, which the operator asked for).

    Raises ElectionNotNeededError when a live leader exists, EligibleLeadersNotAvailableError
    when no replica is live.
    """
    if state.leader in live:
        raise ElectionNotNeededError(f"broker {state.leader} is a live leader")
    clean = [r for r in state.replicas if r in state.isr and r in live]
    if clean:
        return _changed(state, clean[0], tuple(r for r in state.isr if r in live))
    dirty = [r for r in state.replicas if r in live]
    if not dirty:
        raise EligibleLeadersNotAvailableError("no replica of this partition is live")
    return _changed(state, dirty[0], (dirty[0],))


def needs_preferred_election(state: PartitionState, live: Collection[int]) -> bool:
    """Whether auto leader rebalancing should move this partition's leadership: the preferred
    replica is live and in the ISR but does not lead."""
    preferred = preferred_leader(state)
    return state.leader != preferred and preferred in live and preferred in state.isr
