"""Partition assignors (pure functions), Kafka's algorithms under Kafka's names.

Input: the members with their :class:`~fjord.groups.protocol.Subscription` (topics, and for
the sticky assignors the partitions they own now with the generation those came from), and the
partition count of every topic. Output: member id -> sorted list of (topic, partition).

Invariants every assignor keeps (tested with hypothesis):
- a partition is assigned to at most one member, and only to a member subscribed to its topic;
- every partition of a topic someone subscribes to is assigned (``cooperative-sticky`` excepted:
  a partition that must move from a member that still owns it is left out for this round);
- ``roundrobin``/``sticky``: with equal subscriptions, counts differ by at most one;
- ``sticky``/``cooperative-sticky``: no member holds a partition another eligible member with at
  least two fewer partitions could take (Kafka's balance definition), and as many owned
  partitions as that allows stay where they are.

Member order: Kafka's ``MemberInfo`` order - static members first by ``group.instance.id``, then
dynamic ones by member id - so static members get stable assignments across restarts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from fjord.errors import InvalidRequestError
from fjord.groups.protocol import (
    NO_GENERATION,
    Assignment,
    Subscription,
    decode_subscription,
    encode_assignment,
)
from fjord.topic_partition import TopicPartition


@dataclass(frozen=True)
class MemberSubscription:
    """One member as an assignor sees it."""

    member_id: str
    subscription: Subscription
    group_instance_id: str | None = None

    def sort_key(self) -> tuple[int, str, str]:
        """Kafka's ``MemberInfo.compareTo``: static members first, by instance id; then the
        dynamic ones by member id."""
        if self.group_instance_id is not None:
            return (0, self.group_instance_id, self.member_id)
        return (1, "", self.member_id)


MemberAssignments = dict[str, list[TopicPartition]]
Assignor = Callable[[Mapping[str, MemberSubscription], Mapping[str, int]], MemberAssignments]

RANGE = "range"
ROUNDROBIN = "roundrobin"
STICKY = "sticky"
COOPERATIVE_STICKY = "cooperative-sticky"

EAGER = "eager"
COOPERATIVE = "cooperative"


def _ordered(members: Mapping[str, MemberSubscription]) -> list[MemberSubscription]:
    return sorted(members.values(), key=MemberSubscription.sort_key)


def _empty(members: Mapping[str, MemberSubscription]) -> MemberAssignments:
    return {member_id: [] for member_id in members}


def range_assign(
    members: Mapping[str, MemberSubscription], partitions_per_topic: Mapping[str, int]
) -> MemberAssignments:
    """Kafka's RangeAssignor: per topic, the subscribed members in order each take a contiguous
    range; the first ``count % members`` members take one extra partition."""
    result = _empty(members)
    ordered = _ordered(members)
    topics = sorted({t for m in ordered for t in m.subscription.topics})
    for topic in topics:
        count = partitions_per_topic.get(topic)
        if count is None:
            continue
        consumers = [m for m in ordered if topic in m.subscription.topics]
        per_member, extra = divmod(count, len(consumers))
        start = 0
        for index, member in enumerate(consumers):
            length = per_member + (1 if index < extra else 0)
            result[member.member_id].extend(
                TopicPartition(topic, p) for p in range(start, start + length)
            )
            start += length
    return _sorted(result)


def roundrobin_assign(
    members: Mapping[str, MemberSubscription], partitions_per_topic: Mapping[str, int]
) -> MemberAssignments:
    """Kafka's RoundRobinAssignor: all partitions in (topic, partition) order dealt round-robin
    to the members in order, skipping a member not subscribed to the partition's topic."""
    result = _empty(members)
    ordered = _ordered(members)
    if not ordered:
        return result
    topics = sorted({t for m in ordered for t in m.subscription.topics})
    cursor = 0
    for topic in topics:
        for partition in range(partitions_per_topic.get(topic, 0)):
            for step in range(len(ordered)):
                member = ordered[(cursor + step) % len(ordered)]
                if topic in member.subscription.topics:
                    result[member.member_id].append(TopicPartition(topic, partition))
                    cursor = (cursor + step + 1) % len(ordered)
                    break
    return _sorted(result)


def valid_owned_partitions(
    members: Mapping[str, MemberSubscription], partitions_per_topic: Mapping[str, int]
) -> dict[str, list[TopicPartition]]:
    """The owned partitions the sticky assignors honour, by Kafka's rules: the partition still
    exists and the member still subscribes to its topic; a partition claimed by several members
    stays with the claim of the highest generation, and is owned by nobody when the highest
    generation is shared (both claims are then suspect)."""
    claims: dict[TopicPartition, list[tuple[int, str]]] = {}
    for member in members.values():
        sub = member.subscription
        for topic, partition in dict.fromkeys(sub.owned_partitions):
            if topic not in sub.topics or not 0 <= partition < partitions_per_topic.get(topic, 0):
                continue
            claims.setdefault(TopicPartition(topic, partition), []).append(
                (sub.generation_id, member.member_id)
            )
    owned: dict[str, list[TopicPartition]] = {member_id: [] for member_id in members}
    for tp, claimants in claims.items():
        best = max(generation for generation, _ in claimants)
        winners = [member_id for generation, member_id in claimants if generation == best]
        if len(winners) == 1:
            owned[winners[0]].append(tp)
    return owned


def _sticky_target(
    members: Mapping[str, MemberSubscription], partitions_per_topic: Mapping[str, int]
) -> tuple[MemberAssignments, dict[TopicPartition, str]]:
    """Kafka's sticky goal: keep valid owned partitions, hand out the rest to the least loaded
    eligible members, then move partitions from the most to the least loaded eligible member
    while they differ by two or more (preferring to move a partition that was not owned). Returns
    the target and the previous owner of every partition that had a valid one."""
    owned = valid_owned_partitions(members, partitions_per_topic)
    previous_owner = {tp: member_id for member_id, tps in owned.items() for tp in tps}
    subscribed: dict[str, set[str]] = {
        m.member_id: set(m.subscription.topics) for m in members.values()
    }
    eligible: dict[str, list[str]] = {}
    for member_id in sorted(members):
        for topic in subscribed[member_id]:
            if topic in partitions_per_topic:
                eligible.setdefault(topic, []).append(member_id)
    assignment: dict[str, set[TopicPartition]] = {m: set(tps) for m, tps in owned.items()}
    unassigned = [
        TopicPartition(topic, partition)
        for topic in sorted(eligible)
        for partition in range(partitions_per_topic[topic])
        if (topic, partition) not in previous_owner
    ]
    # Partitions with the fewest candidates first, so flexible ones fill the gaps afterwards.
    unassigned.sort(key=lambda tp: (len(eligible[tp[0]]), tp))
    for tp in unassigned:
        target = min(eligible[tp[0]], key=lambda m: (len(assignment[m]), m))
        assignment[target].add(tp)
    _balance(assignment, eligible, previous_owner)
    return {m: sorted(tps) for m, tps in assignment.items()}, previous_owner


def _balance(
    assignment: dict[str, set[TopicPartition]],
    eligible: Mapping[str, list[str]],
    previous_owner: Mapping[TopicPartition, str],
) -> None:
    """Move one partition at a time from the most loaded member that can give one to the least
    loaded eligible member with at least two fewer, until no such move exists. Every move lowers
    the sum of squared counts, so this ends; always taking from a most loaded member is what
    keeps the number of moved owned partitions minimal with equal subscriptions."""
    counts = {m: len(tps) for m, tps in assignment.items()}
    # Per giver, its partitions in the order they should leave: newly placed ones first (moving
    # them costs no stickiness). Built lazily, dropped when the member receives a partition.
    order: dict[str, list[TopicPartition]] = {}
    while True:
        moved = False
        for giver in sorted(assignment, key=lambda m: (-counts[m], m)):
            if giver not in order:
                order[giver] = sorted(
                    assignment[giver], key=lambda tp: (previous_owner.get(tp) == giver, tp)
                )
            for tp in order[giver]:
                if tp not in assignment[giver]:
                    continue
                taker = min(eligible[tp[0]], key=lambda m: (counts[m], m))
                if counts[taker] + 2 <= counts[giver]:
                    assignment[giver].remove(tp)
                    assignment[taker].add(tp)
                    counts[giver] -= 1
                    counts[taker] += 1
                    order.pop(taker, None)
                    moved = True
                    break
            if moved:
                break
        if not moved:
            return


def sticky_assign(
    members: Mapping[str, MemberSubscription], partitions_per_topic: Mapping[str, int]
) -> MemberAssignments:
    """Kafka's StickyAssignor (eager): balanced, and keeps as many owned partitions as it can."""
    target, _ = _sticky_target(members, partitions_per_topic)
    return _sorted({m: target.get(m, []) for m in members})


def cooperative_sticky_assign(
    members: Mapping[str, MemberSubscription], partitions_per_topic: Mapping[str, int]
) -> MemberAssignments:
    """Kafka's CooperativeStickyAssignor: the sticky target, minus every partition that must
    move away from a member that still owns it. That member sees the partition missing, revokes
    it and rejoins; in the follow-up rebalance the partition is unowned and gets assigned."""
    target, previous_owner = _sticky_target(members, partitions_per_topic)
    result: MemberAssignments = {}
    for member_id in members:
        result[member_id] = [
            tp for tp in target.get(member_id, []) if previous_owner.get(tp, member_id) == member_id
        ]
    return _sorted(result)


def _sorted(result: MemberAssignments) -> MemberAssignments:
    return {member_id: sorted(tps) for member_id, tps in result.items()}


ASSIGNORS: dict[str, Assignor] = {
    RANGE: range_assign,
    ROUNDROBIN: roundrobin_assign,
    STICKY: sticky_assign,
    COOPERATIVE_STICKY: cooperative_sticky_assign,
}

#: Which rebalance protocol each assignor needs (Kafka's ``supportedProtocols``).
REBALANCE_PROTOCOL = {
    RANGE: EAGER,
    ROUNDROBIN: EAGER,
    STICKY: EAGER,
    COOPERATIVE_STICKY: COOPERATIVE,
}


def assign(
    name: str,
    members: Mapping[str, MemberSubscription],
    partitions_per_topic: Mapping[str, int],
) -> MemberAssignments:
    """Run the assignor called ``name`` (the leader does this with the JoinGroup member list)."""
    try:
        assignor = ASSIGNORS[name]
    except KeyError:
        raise InvalidRequestError(
            f"unknown partition.assignment.strategy {name!r}; known: {sorted(ASSIGNORS)}"
        ) from None
    if not members:
        return {}
    return assignor(members, partitions_per_topic)


@dataclass(frozen=True)
class PartitionChanges:
    """What a consumer does with a new assignment: revoke these (commit, then stop), then add
    these (start fetching). ``rejoin`` is True when the cooperative protocol needs a follow-up
    rebalance because partitions were revoked (so others can receive them)."""

    revoked: tuple[TopicPartition, ...]
    added: tuple[TopicPartition, ...]
    rejoin: bool


def partition_changes(
    owned: Iterable[TopicPartition], assigned: Iterable[TopicPartition], protocol: str
) -> PartitionChanges:
    """The consumer-side step after SyncGroup. Eager (range/roundrobin/sticky): everything owned
    was already revoked before JoinGroup, so all of ``assigned`` is added. Cooperative: revoke
    only what is owned but no longer assigned, add only what is new, keep the rest consuming."""
    owned_set, assigned_set = set(owned), set(assigned)
    if protocol == EAGER:
        return PartitionChanges(tuple(sorted(owned_set)), tuple(sorted(assigned_set)), False)
    if protocol != COOPERATIVE:
        raise InvalidRequestError(f"unknown rebalance protocol {protocol!r}")
    revoked = tuple(sorted(owned_set - assigned_set))
    return PartitionChanges(revoked, tuple(sorted(assigned_set - owned_set)), bool(revoked))


def members_from_metadata(
    members: Iterable[tuple[str, str | None, Subscription]],
) -> dict[str, MemberSubscription]:
    """Build the assignor input from (member id, group.instance.id, decoded subscription)."""
    return {
        member_id: MemberSubscription(member_id, subscription, instance_id)
        for member_id, instance_id, subscription in members
    }


def leader_assignments(
    name: str,
    members: Iterable[tuple[str, str | None, bytes]],
    partitions_per_topic: Mapping[str, int],
) -> dict[str, bytes]:
    """The group leader's whole step: decode each member's Subscription bytes (from its
    JoinGroup response: member id, group.instance.id, metadata), run assignor ``name`` and
    encode each member's Assignment bytes for SyncGroup. Topics missing from
    ``partitions_per_topic`` (unknown to the metadata) are left unassigned."""
    decoded = members_from_metadata(
        (member_id, instance_id, decode_subscription(metadata))
        for member_id, instance_id, metadata in members
    )
    result = assign(name, decoded, partitions_per_topic)
    return {m: encode_assignment(Assignment(tuple(tps))) for m, tps in result.items()}


__all__ = [
    "ASSIGNORS",
    "COOPERATIVE",
    "COOPERATIVE_STICKY",
    "EAGER",
    "NO_GENERATION",
    "RANGE",
    "REBALANCE_PROTOCOL",
    "ROUNDROBIN",
    "STICKY",
    "MemberSubscription",
    "PartitionChanges",
    "assign",
    "cooperative_sticky_assign",
    "leader_assignments",
    "members_from_metadata",
    "partition_changes",
    "range_assign",
    "roundrobin_assign",
    "sticky_assign",
    "valid_owned_partitions",
]
