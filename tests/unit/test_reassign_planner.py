"""Properties of the pure reassignment planner (fjord.cluster.reassignment_plan)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.cluster.reassignment_plan import plan_reassignment
from fjord.controller.placement import assign_replicas
from fjord.errors import InvalidReplicationFactorError

Key = tuple[str, int]


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[Key, list[int]], list[int], int, list[int]]:
    """A current assignment on some brokers, the broker set after the change (some added,
    some drained) and a target replication factor that fits."""
    old_brokers = list(range(1, draw(st.integers(1, 6)) + 1))
    rf = draw(st.integers(1, len(old_brokers)))
    partitions = draw(st.integers(1, 12))
    topics = draw(st.integers(1, 3))
    current: dict[Key, list[int]] = {}
    for t in range(topics):
        placed = assign_replicas(
            {b: None for b in old_brokers}, partitions, rf,
            start_index=draw(st.integers(0, len(old_brokers) - 1)),
            replica_shift=draw(st.integers(0, len(old_brokers) - 1)),
        )
        for p, replicas in placed.items():
            if draw(st.booleans()):  # some partitions were moved by hand earlier
                replicas = draw(st.permutations(old_brokers))[: len(replicas)]
            current[(f"t{t}", p)] = list(replicas)
    added = list(range(len(old_brokers) + 1, len(old_brokers) + 1 + draw(st.integers(0, 3))))
    brokers = old_brokers + added
    drain = draw(st.lists(st.sampled_from(brokers), unique=True, max_size=len(brokers) - 1))
    eligible = len(brokers) - len(drain)
    target_rf = draw(st.integers(1, eligible))
    return current, brokers, target_rf, drain


def _final(current: dict[Key, list[int]], plan: dict[Key, list[int]]) -> dict[Key, list[int]]:
    return {key: plan.get(key, replicas) for key, replicas in current.items()}


@settings(max_examples=150, deadline=None)
@given(clusters())
def test_every_partition_gets_rf_distinct_eligible_brokers_balanced(case: tuple) -> None:
    current, brokers, rf, drain = case
    plan = plan_reassignment(current, brokers, target_rf=rf, drain=drain)
    final = _final(current, plan)
    eligible = set(brokers) - set(drain)
    load = Counter({b: 0 for b in eligible})
    for replicas in final.values():
        assert len(replicas) == rf
        assert len(set(replicas)) == rf
        assert set(replicas) <= eligible
        load.update(replicas)
    assert max(load.values()) - min(load.values()) <= 1
    # Planning again from the result changes nothing (the plan is a fixed point).
    assert plan_reassignment(final, sorted(eligible), target_rf=rf) == {}


@settings(max_examples=150, deadline=None)
@given(clusters())
def test_moves_are_the_fewest_that_reach_balance(case: tuple) -> None:
    current, brokers, _, _ = case
    # Same RF, no drain: only brokers added (or a hand-made imbalance). Every added replica is
    # a move; the least possible is max(excess over the ceiling, deficit under the floor).
    plan = plan_reassignment(current, brokers)
    total = sum(len(r) for r in current.values())
    floor, extra = divmod(total, len(brokers))
    ceiling = floor + (1 if extra else 0)
    load = Counter({b: 0 for b in brokers})
    for replicas in current.values():
        load.update(replicas)
    excess = sum(max(0, n - ceiling) for n in load.values())
    deficit = sum(max(0, floor - n) for n in load.values())
    moves = sum(
        len(set(plan[key]) - set(current[key])) for key in plan
    )
    assert moves == max(excess, deficit)


@settings(max_examples=150, deadline=None)
@given(clusters())
def test_drained_brokers_hold_nothing(case: tuple) -> None:
    current, brokers, rf, drain = case
    plan = plan_reassignment(current, brokers, target_rf=rf, drain=drain)
    final = _final(current, plan)
    assert not any(set(r) & set(drain) for r in final.values())
    assert all(len(r) == rf for r in final.values())


def test_growth_keeps_every_replica_when_a_balanced_result_allows_it() -> None:
    """A ring of RF 3 on 6 brokers grown to RF 5: a greedy fill gets stuck and has to move
    existing replicas; the max-flow fill keeps all of them."""
    ring = {("t", p): [(p + i) % 6 + 1 for i in range(3)] for p in range(6)}
    plan = plan_reassignment(ring, range(1, 7), target_rf=5)
    for key, replicas in ring.items():
        assert set(replicas) <= set(plan[key]) and len(plan[key]) == 5
    load = Counter(b for r in plan.values() for b in r)
    assert set(load.values()) == {5}


def test_preferred_leaders_spread_when_growing_rf() -> None:
    current = {("t", p): [1] for p in range(6)}
    plan = plan_reassignment(current, [1, 2, 3], target_rf=3)
    leaders = Counter(replicas[0] for replicas in plan.values())
    assert sorted(leaders.values()) == [2, 2, 2]
    assert all(sorted(r) == [1, 2, 3] for r in plan.values())


def test_shrink_keeps_the_preferred_leader() -> None:
    current = {("t", 0): [2, 1, 3], ("t", 1): [3, 2, 1], ("t", 2): [1, 3, 2]}
    plan = plan_reassignment(current, [1, 2, 3], target_rf=1)
    assert _final(current, plan) == {("t", 0): [2], ("t", 1): [3], ("t", 2): [1]}


def test_balanced_cluster_needs_no_moves() -> None:
    current = assign_replicas({1: None, 2: None, 3: None}, 6, 2, start_index=0, replica_shift=0)
    assert plan_reassignment({("t", p): r for p, r in current.items()}, [1, 2, 3]) == {}


def test_per_topic_rf_leaves_other_topics_alone() -> None:
    current = {("a", 0): [1], ("b", 0): [2]}
    plan = plan_reassignment(current, [1, 2], target_rf={"a": 2})
    assert set(plan) == {("a", 0)} and sorted(plan[("a", 0)]) == [1, 2]


@pytest.mark.parametrize(("rf", "drain"), [(0, ()), (3, ()), (2, (2,))])
def test_impossible_replication_factor_is_refused(rf: int, drain: tuple[int, ...]) -> None:
    with pytest.raises(InvalidReplicationFactorError):
        plan_reassignment({("t", 0): [1]}, [1, 2], target_rf=rf, drain=drain)


# -- racks ----------------------------------------------------------------------------------


@st.composite
def racked_clusters(
    draw: st.DrawFn,
) -> tuple[dict[Key, list[int]], list[int], int, list[int], dict[int, str]]:
    """clusters() with a rack for every broker (2-4 racks, any sizes)."""
    current, brokers, rf, drain = draw(clusters())
    names = [f"zone-{c}" for c in "abcd"[: draw(st.integers(2, 4))]]
    racks = {b: draw(st.sampled_from(names)) for b in brokers}
    eligible = [b for b in brokers if b not in drain]
    # at least two racks among the eligible brokers (else the plan is rack-unaware)
    if len({racks[b] for b in eligible}) < 2 and len(eligible) >= 2:
        racks[eligible[0]] = next(n for n in names if n != racks[eligible[1]])
    return current, brokers, rf, drain, racks


@settings(max_examples=200, deadline=None)
@given(racked_clusters())
def test_rack_aware_plans_put_replicas_on_distinct_racks(
    case: tuple[dict[Key, list[int]], list[int], int, list[int], dict[int, str]],
) -> None:
    from fjord.cluster.reassignment_plan import rack_limit, rack_violations

    current, brokers, rf, drain, racks = case
    eligible = [b for b in brokers if b not in drain]
    plan = plan_reassignment(current, brokers, target_rf=rf, drain=drain, racks=racks)
    final = _final(current, plan)
    eligible_racks = {b: racks[b] for b in eligible}
    aware = len(set(eligible_racks.values())) > 1
    for key, replicas in final.items():
        assert len(replicas) == rf and len(set(replicas)) == rf, (key, replicas)
        assert set(replicas) <= set(eligible), (key, replicas)
        if aware:
            # Within every rack's limit: distinct racks while rf <= racks.
            assert rack_violations(replicas, eligible_racks) == 0, (key, replicas, racks)
            if rf <= len(set(eligible_racks.values())):
                assert len({racks[b] for b in replicas}) == rf, (key, replicas, racks)
    if aware:
        limits = rack_limit(rf, eligible_racks)
        assert sum(limits.values()) >= rf


def test_rack_aware_scale_out_and_drain_keep_distinct_racks() -> None:
    racks = {0: "a", 1: "b", 2: "c", 3: "a", 4: "b", 5: "c"}
    # Three brokers in three zones, RF 3: one replica per zone.
    current = {("t", p): [p % 3, (p + 1) % 3, (p + 2) % 3] for p in range(6)}
    grown = _final(current, plan_reassignment(current, range(6), racks=racks))
    for replicas in grown.values():
        assert sorted(racks[b] for b in replicas) == ["a", "b", "c"]
    held = Counter(b for r in grown.values() for b in r)
    assert set(held) == set(range(6)) and max(held.values()) - min(held.values()) <= 1
    # Draining broker 5 (zone c): its replicas go to broker 2, the other zone-c broker.
    drained = _final(grown, plan_reassignment(grown, range(6), drain={5}, racks=racks))
    for key, replicas in drained.items():
        assert 5 not in replicas
        assert sorted(racks[b] for b in replicas) == ["a", "b", "c"], (key, replicas)
    # Without racks the same drain may put two replicas in one zone; with them never.


def test_a_rack_unaware_plan_is_unchanged_when_a_broker_has_no_rack() -> None:
    current = {("t", p): [p % 3, (p + 1) % 3] for p in range(6)}
    racks: dict[int, str | None] = {0: "a", 1: "b", 2: None, 3: "a"}
    assert plan_reassignment(current, range(4), racks=racks) == plan_reassignment(
        current, range(4)
    )
