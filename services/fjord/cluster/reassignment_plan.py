"""The reassignment planner, pure and shared: target replica lists for a cluster change
(replication factor, brokers added or drained) with the fewest replica moves; see
:func:`plan_reassignment` for the guarantees. The admin client (``fjord topics
--reassign-partitions --generate``) and the operator's autoscaler plan with it; the controller
carries a plan out (:mod:`fjord.controller.reassignment`, the per-partition state machine).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from fjord.errors import InvalidReplicationFactorError
from fjord.topic_partition import TopicPartition


def plan_reassignment(
    current: Mapping[TopicPartition, Sequence[int]],
    brokers: Collection[int],
    *,
    target_rf: int | Mapping[str, int] | None = None,
    drain: Collection[int] = (),
    racks: Mapping[int, str | None] | None = None,
) -> dict[TopicPartition, list[int]]:
    """Target replica lists for the partitions that must change (unchanged ones are omitted).

    ``racks``: each broker's rack (``broker.rack``). When every eligible broker has one and
    there are at least two, the plan is rack-aware (:func:`_plan_rack_aware`, Kafka's rule for
    when racks count, as at topic creation): replicas of a partition on distinct racks while
    racks remain, balance best effort. Otherwise racks are ignored and the guarantees below hold.

    ``current``: every partition's replicas (first = preferred leader). ``brokers``: the
    brokers that may hold replicas (live ones; brokers being added included). ``target_rf``:
    the new replication factor, for all topics (int) or per topic (mapping; topics not named
    keep theirs); None keeps every partition's. ``drain``: brokers to empty (being removed).

    Guarantees (tested with hypothesis): every partition of the result has its replication
    factor of distinct brokers from ``brokers - drain``; replica counts per eligible broker
    differ by at most one; with an unchanged replication factor and nothing drained, the
    number of replicas moved is the fewest that reach balance (max(excess over the ceiling,
    deficit under the floor)); when the replication factor changes, the additions are placed
    by a max flow, so every replica on an eligible broker stays whenever some balanced result
    keeps them all (otherwise a few are moved, by a greedy rebalance); a partition's
    preferred leader stays
    first while it remains a replica, and preferred leaders are then spread greedily (a move of
    leadership only, no data). Raises InvalidReplicationFactorError when a partition needs more
    replicas than there are eligible brokers.
    """
    eligible = sorted(set(brokers) - set(drain))

    def rf_of(key: TopicPartition, replicas: Sequence[int]) -> int:
        if target_rf is None:
            return len(replicas)
        if isinstance(target_rf, int):
            return target_rf
        return target_rf.get(key[0], len(replicas))

    wanted = {key: rf_of(key, replicas) for key, replicas in current.items()}
    for key, rf in wanted.items():
        if rf < 1:
            raise InvalidReplicationFactorError(f"replication factor must be at least 1, got {rf}")
        if rf > len(eligible):
            raise InvalidReplicationFactorError(
                f"{key[0]}-{key[1]} needs {rf} replicas but only {len(eligible)} brokers are "
                "eligible"
            )
    if not current:
        return {}
    if racks is not None:
        known = {b: racks.get(b) for b in eligible}
        if all(r is not None for r in known.values()) and len(set(known.values())) > 1:
            return _plan_rack_aware(
                current, wanted, eligible, {b: str(r) for b, r in known.items()}
            )
    total = sum(wanted.values())
    floor, extra = divmod(total, len(eligible))
    ceiling = floor + (1 if extra else 0)
    eligible_set = set(eligible)

    # 1. Keep the replicas on eligible brokers; a shrinking partition drops the replicas on
    #    the most loaded brokers first (never its preferred leader while others can go).
    assignment: dict[TopicPartition, list[int]] = {
        key: [r for r in replicas if r in eligible_set] for key, replicas in current.items()
    }
    load: Counter[int] = Counter({b: 0 for b in eligible})
    for replicas in assignment.values():
        load.update(replicas)
    for key in sorted(assignment):
        replicas = assignment[key]
        while len(replicas) > wanted[key]:
            droppable = replicas[1:] if len(replicas) > 1 else replicas
            victim = max(droppable, key=lambda b: (load[b], b))
            replicas.remove(victim)
            load[victim] -= 1

    # 2. Fill missing slots. Kept replicas never move here, so the only freedom is where the
    #    additions go: a max flow (partitions -> brokers not yet in them -> sink) first lifts
    #    every broker to the floor, then fills up to the ceiling. Augmenting paths never take
    #    flow back from the sink, so brokers lifted in the first pass stay lifted; if any
    #    balanced completion exists that keeps every kept replica, this finds one.
    _fill_by_flow(assignment, wanted, eligible, load, floor, ceiling)
    for key in sorted(assignment):
        replicas = assignment[key]
        while len(replicas) < wanted[key]:  # only when no balanced completion exists
            choice = min((b for b in eligible if b not in replicas), key=lambda b: (load[b], b))
            replicas.append(choice)
            load[choice] += 1

    # 3. Rebalance: move one replica at a time from a most loaded to a least loaded broker.
    #    Each move lowers the excess over the ceiling or the deficit under the floor (both
    #    while both exist), so the count of moves is the lower bound max(excess, deficit).
    while True:
        high = max(eligible, key=lambda b: (load[b], -b))
        low = min(eligible, key=lambda b: (load[b], b))
        if load[high] - load[low] <= 1:
            break
        # A partition on ``high`` but not on ``low`` exists: high holds more partitions.
        # Prefer one where ``high`` was only added by this plan (re-pointing an addition moves
        # no existing data), then one where it is not the preferred leader.
        candidates = [
            key for key in sorted(assignment)
            if high in assignment[key] and low not in assignment[key]
        ]
        key = min(
            candidates,
            key=lambda k: (high in current[k], assignment[k].index(high) == 0),
        )
        replicas = assignment[key]
        replicas[replicas.index(high)] = low
        load[high] -= 1
        load[low] += 1
    assert ceiling >= max(load.values())

    # 4. Spread preferred leaders: while some broker is preferred leader of two more
    #    partitions than another that is a replica of one of them, swap that one to the front.
    return _spread_leaders(assignment, current, eligible)


def _fill_by_flow(
    assignment: dict[TopicPartition, list[int]],
    wanted: Mapping[TopicPartition, int],
    eligible: list[int],
    load: Counter[int],
    floor: int,
    ceiling: int,
) -> None:
    """Add replicas to partitions below their replication factor (in place, ``load``
    updated), as many as fit without lifting a broker above ``ceiling``, floors first."""
    need = {k: wanted[k] - len(r) for k, r in assignment.items() if wanted[k] > len(r)}
    if not need:
        return
    chosen: set[tuple[TopicPartition, int]] = set()
    by_broker: dict[int, set[TopicPartition]] = {b: set() for b in eligible}
    sent: Counter[TopicPartition] = Counter()
    got: Counter[int] = Counter()
    keys = sorted(need)

    def augment(capacity: Mapping[int, int]) -> bool:
        # BFS over the residual graph: key -> broker (unused pair), broker -> key (undo a pair).
        parent: dict[tuple[str, Any], tuple[str, Any] | None] = {}
        queue: list[tuple[str, Any]] = []
        for start in keys:
            if sent[start] < need[start]:
                parent[("k", start)] = None
                queue.append(("k", start))
        head = 0
        while head < len(queue):
            node = queue[head]
            head += 1
            if node[0] == "k":
                key = node[1]
                for candidate in eligible:
                    nxt = ("b", candidate)
                    if (
                        nxt not in parent
                        and candidate not in assignment[key]
                        and (key, candidate) not in chosen
                    ):
                        parent[nxt] = node
                        queue.append(nxt)
                continue
            broker: int = node[1]
            if got[broker] < capacity[broker]:
                # Found the sink: flip the pairs along the path.
                got[broker] += 1
                current: tuple[str, Any] = node
                while True:
                    previous = parent[current]
                    if previous is None:
                        sent[current[1]] += 1
                        return True
                    if previous[0] == "k":  # a key -> broker edge: use the pair
                        chosen.add((previous[1], current[1]))
                        by_broker[current[1]].add(previous[1])
                    else:  # a broker -> key edge: give the pair up
                        chosen.discard((current[1], previous[1]))
                        by_broker[previous[1]].discard(current[1])
                    current = previous
            for holder in sorted(by_broker[broker]):
                back = ("k", holder)
                if back not in parent:
                    parent[back] = node
                    queue.append(back)
        return False

    for limit in (floor, ceiling):
        capacity = {b: max(0, limit - load[b]) for b in eligible}
        while augment(capacity):
            pass
    for key, broker in sorted(chosen):
        assignment[key].append(broker)
        load[broker] += 1


def rack_limit(replication_factor: int, racks: Mapping[int, str]) -> dict[str, int]:
    """How many replicas of one partition each rack may hold: ``ceil(rf / racks)`` (one each
    while rf <= racks: distinct racks), never more than the rack has brokers; when those
    limits cannot seat rf replicas (small racks), the largest racks take the rest."""
    sizes = Counter(racks.values())
    per_rack = -(-replication_factor // len(sizes))
    limit = {rack: min(per_rack, size) for rack, size in sizes.items()}
    while sum(limit.values()) < replication_factor:
        rack = max(sizes, key=lambda r: (sizes[r] - limit[r], r))
        if sizes[rack] == limit[rack]:
            break  # rf > brokers: refused before this point
        limit[rack] += 1
    return limit


def rack_violations(replicas: Sequence[int], racks: Mapping[int, str]) -> int:
    """Replicas beyond their rack's :func:`rack_limit` (0: the partition is rack-safe)."""
    limit = rack_limit(len(replicas), racks)
    counts = Counter(racks[b] for b in replicas)
    return sum(max(0, n - limit[r]) for r, n in counts.items())


def _plan_rack_aware(
    current: Mapping[TopicPartition, Sequence[int]],
    wanted: Mapping[TopicPartition, int],
    eligible: list[int],
    racks: Mapping[int, str],
) -> dict[TopicPartition, list[int]]:
    """plan_reassignment with racks: every partition ends with at most :func:`rack_limit`
    replicas per rack (distinct racks while rf <= racks); replicas already on eligible
    brokers and within their rack's limit stay; additions go to the least loaded broker of a
    rack the partition may still use; then single moves from a most to a least loaded broker
    while one keeps the racks' limits (best effort: racks of unequal sizes can make an exact
    balance impossible); preferred leaders stay first while replicas and are spread as in
    the rack-unaware plan."""
    eligible_set = set(eligible)
    load: Counter[int] = Counter({b: 0 for b in eligible})
    assignment: dict[TopicPartition, list[int]] = {}
    for key, replicas in current.items():
        assignment[key] = [r for r in replicas if r in eligible_set]
        load.update(assignment[key])

    def rack_count(replicas: Sequence[int], rack: str) -> int:
        return sum(1 for b in replicas if racks[b] == rack)

    # 1. Drop replicas over their rack's limit, then down to the replication factor: from the
    #    fullest rack first, the most loaded broker there, never the preferred leader while
    #    another can go.
    for key in sorted(assignment):
        replicas = assignment[key]
        limit = rack_limit(wanted[key], racks)
        while True:
            over = [b for b in replicas if rack_count(replicas, racks[b]) > limit[racks[b]]]
            if len(replicas) > wanted[key]:
                fullest = max(
                    rack_count(replicas, racks[b]) - limit[racks[b]] for b in replicas
                )
                over = over or [
                    b for b in replicas
                    if rack_count(replicas, racks[b]) - limit[racks[b]] == fullest
                ]
            if not over:
                break
            droppable = [b for b in over if b != replicas[0]] or over
            victim = max(droppable, key=lambda b: (load[b], b))
            replicas.remove(victim)
            load[victim] -= 1

    # 2. Fill: the least loaded broker of a rack the partition may still use.
    for key in sorted(assignment, key=lambda k: (len(assignment[k]) - wanted[k], k)):
        replicas = assignment[key]
        limit = rack_limit(wanted[key], racks)
        while len(replicas) < wanted[key]:
            choices = [
                b for b in eligible
                if b not in replicas and rack_count(replicas, racks[b]) < limit[racks[b]]
            ]
            if not choices:  # cannot happen with rf <= brokers; kept as a plain fallback
                choices = [b for b in eligible if b not in replicas]
            choice = min(choices, key=lambda b: (load[b], rack_count(replicas, racks[b]), b))
            replicas.append(choice)
            load[choice] += 1

    # 3. Rebalance while a move keeps every rack within its limit. Each move lowers the sum
    #    of squared loads, so this ends.
    def move() -> bool:
        by_load = sorted(eligible, key=lambda b: (load[b], b))
        for high in reversed(by_load):
            for low in by_load:
                if load[high] - load[low] <= 1:
                    break
                candidates = []
                for key in sorted(assignment):
                    replicas = assignment[key]
                    if high not in replicas or low in replicas:
                        continue
                    limit = rack_limit(wanted[key], racks)
                    if racks[low] != racks[high] and (
                        rack_count(replicas, racks[low]) >= limit[racks[low]]
                    ):
                        continue
                    candidates.append(key)
                if candidates:
                    key = min(
                        candidates,
                        key=lambda k: (high in current[k], assignment[k].index(high) == 0, k),
                    )
                    replicas = assignment[key]
                    replicas[replicas.index(high)] = low
                    load[high] -= 1
                    load[low] += 1
                    return True
        return False

    while move():
        pass

    # 4. Spread preferred leaders (leadership only: a reorder within the partition).
    return _spread_leaders(assignment, current, eligible)


def _spread_leaders(
    assignment: dict[TopicPartition, list[int]],
    current: Mapping[TopicPartition, Sequence[int]],
    eligible: Collection[int],
) -> dict[TopicPartition, list[int]]:
    """Step 4 of both planners: while some broker is preferred leader of two more partitions
    than another that is a replica of one of them, swap that one to the front (a reorder within
    the partition, never a move). Returns the partitions whose replica list changed against
    ``current``."""
    brokers = list(eligible)
    leaders: Counter[int] = Counter({b: 0 for b in brokers})
    leaders.update(replicas[0] for replicas in assignment.values() if replicas)
    for _ in range(len(assignment) * len(brokers)):
        moved = False
        for high in sorted(brokers, key=lambda b: (-leaders[b], b)):
            for key in sorted(assignment):
                replicas = assignment[key]
                if len(replicas) < 2 or replicas[0] != high:
                    continue
                follower = min(replicas[1:], key=lambda b: (leaders[b], b))
                if leaders[high] - leaders[follower] > 1:
                    replicas.remove(follower)
                    replicas.insert(0, follower)
                    leaders[high] -= 1
                    leaders[follower] += 1
                    moved = True
                    break
            if moved:
                break
        if not moved:
            break
    return {
        key: replicas
        for key, replicas in assignment.items()
        if list(current[key]) != replicas
    }
