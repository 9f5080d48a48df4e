"""The operator's pure decisions: broker scaling driven to completion against a simulated
cluster (hypothesis), topic reconciliation, and autoscaling from sample sequences."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord_operator.decisions import (
    POD_REVISION_LABEL,
    AutoscalingPolicy,
    ClusterObservation,
    IngressSample,
    ScalingDecision,
    ScalingPhase,
    TopicObservation,
    autoscaling_policy,
    bound_samples,
    decide_autoscale,
    decide_scaling,
    decide_topic,
    prune_samples,
    rate_between,
    replication_factors,
    roll_targets,
    samples_from_status,
    samples_to_status,
    topic_spec_problems,
)
from fjord_operator.settings import MAX_AUTOSCALING_SAMPLES

CHART = Path(__file__).resolve().parents[2] / "charts" / "fjord"

Assignment = dict[tuple[str, int], list[int]]


def placed(topics: Mapping[str, tuple[int, int]], brokers: int) -> Assignment:
    """Round-robin placement of topics {name: (partitions, rf)} over brokers 0..brokers-1."""
    out: Assignment = {}
    for start, (name, (partitions, rf)) in enumerate(sorted(topics.items())):
        for p in range(partitions):
            out[(name, p)] = [(start + p + i) % brokers for i in range(rf)]
    return out


class SimulatedCluster:
    """Kubernetes + Fjord as the decisions see them: brokers register once their pod exists
    (after ``register_delay`` observations), reassignments complete one observation after
    they were submitted. The ``phase`` is what status would record."""

    def __init__(self, brokers: int, assignment: Assignment, register_delay: int = 1) -> None:
        self.statefulset = brokers
        self.registered = set(range(brokers))
        self.assignment = {k: list(v) for k, v in assignment.items()}
        self.pending: dict[tuple[str, int], list[int]] = {}
        self.phase = ScalingPhase.STABLE
        self.register_delay = register_delay
        self.waited = 0
        self.shrunk_while_holding = False

    def observe(self, desired: int) -> ClusterObservation:
        current = dict(self.assignment)
        current.update(self.pending)
        return ClusterObservation(
            desired=desired,
            statefulset_replicas=self.statefulset,
            registered=frozenset(self.registered),
            assignment=current,
            reassigning=frozenset(self.pending),
            previous_phase=self.phase,
        )

    def apply(self, decision: ScalingDecision) -> None:
        # Reassignments submitted last time complete now (the new replicas caught up).
        self.assignment.update(self.pending)
        self.pending = {}
        if decision.statefulset_replicas < self.statefulset:
            going = set(range(decision.statefulset_replicas, self.statefulset))
            if any(going & set(r) for r in self.assignment.values()):
                self.shrunk_while_holding = True
            self.registered -= going
        self.statefulset = decision.statefulset_replicas
        # New pods register after a delay.
        wanted = set(range(self.statefulset))
        if wanted - self.registered:
            self.waited += 1
            if self.waited >= self.register_delay:
                self.registered |= wanted
                self.waited = 0
        self.pending = {k: list(v) for k, v in decision.reassign.items()}
        self.phase = decision.phase

    def drive(self, desired: int, limit: int = 50) -> list[ScalingDecision]:
        steps = []
        for _ in range(limit):
            decision = decide_scaling(self.observe(desired))
            steps.append(decision)
            if decision.done or decision.refused:
                return steps
            self.apply(decision)
        raise AssertionError(f"no convergence in {limit} steps: {[d.reason for d in steps]}")


def loads(assignment: Assignment, brokers: Sequence[int]) -> Counter[int]:
    counts: Counter[int] = Counter({b: 0 for b in brokers})
    for replicas in assignment.values():
        counts.update(replicas)
    return counts


topics_strategy = st.dictionaries(
    st.sampled_from(["a", "b", "c", "__consumer_offsets"]),
    st.tuples(st.integers(1, 8), st.integers(1, 3)),
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(topics=topics_strategy, start=st.integers(3, 5), grow=st.integers(1, 3))
def test_scale_out_converges_balanced_and_keeps_replication(
    topics: dict[str, tuple[int, int]], start: int, grow: int
) -> None:
    before = placed(topics, start)
    sim = SimulatedCluster(start, before, register_delay=2)
    desired = start + grow
    steps = sim.drive(desired)
    assert steps[0].reason == "ScalingOut" and steps[0].statefulset_replicas == desired
    assert steps[-1].done and steps[-1].phase is ScalingPhase.STABLE
    assert sim.statefulset == desired
    # Reassignment was only planned once every new broker had registered.
    for step in steps:
        if step.reassign:
            assert all(b in sim.registered for r in step.reassign.values() for b in r)
    for key, replicas in sim.assignment.items():
        assert len(replicas) == len(before[key]) == len(set(replicas))
    if before:
        counts = loads(sim.assignment, range(desired))
        assert max(counts.values()) - min(counts.values()) <= 1


@settings(max_examples=60, deadline=None)
@given(topics=topics_strategy, start=st.integers(4, 6), shrink=st.integers(1, 3))
def test_scale_in_drains_before_shrinking_or_refuses(
    topics: dict[str, tuple[int, int]], start: int, shrink: int
) -> None:
    before = placed(topics, start)
    sim = SimulatedCluster(start, before)
    desired = start - shrink
    steps = sim.drive(desired)
    needs = max((rf for _, rf in topics.values()), default=0)
    if needs > desired:
        assert steps[-1].refused
        assert steps[-1].reason == "ScaleInWouldBreakReplication"
        assert sim.statefulset == start and sim.assignment == before  # nothing changed
        return
    assert steps[-1].done
    assert sim.statefulset == desired
    assert not sim.shrunk_while_holding
    for key, replicas in sim.assignment.items():
        assert len(replicas) == len(before[key])
        assert all(b < desired for b in replicas)
    phases = [s.phase for s in steps]
    if any(b >= desired for r in before.values() for b in r):
        assert ScalingPhase.DRAINING in phases
    # Shrunk after draining; a broker left idle by the drain may then get a rebalance.
    assert ScalingPhase.SHRINKING in phases and phases[-1] is ScalingPhase.STABLE
    shrink_at = phases.index(ScalingPhase.SHRINKING)
    assert set(phases[shrink_at + 1 : -1]) <= {ScalingPhase.REBALANCING}


def test_scale_3_5_3_walks_the_documented_phases() -> None:
    before = placed({"orders": (6, 3), "__consumer_offsets": (10, 3)}, 3)
    sim = SimulatedCluster(3, before, register_delay=1)
    out = sim.drive(5)
    assert [d.phase for d in out] == [
        ScalingPhase.WAITING_FOR_BROKERS,
        ScalingPhase.REBALANCING,
        ScalingPhase.REBALANCING,
        ScalingPhase.STABLE,
    ]
    assert {b for r in sim.assignment.values() for b in r} == {0, 1, 2, 3, 4}
    back = sim.drive(3)
    assert [d.phase for d in back] == [
        ScalingPhase.DRAINING,
        ScalingPhase.DRAINING,
        ScalingPhase.SHRINKING,
        ScalingPhase.STABLE,
    ]
    assert {b for r in sim.assignment.values() for b in r} == {0, 1, 2}


def test_decisions_are_idempotent_for_a_restarted_operator() -> None:
    """The same observation gives the same decision: an operator restarted between two steps
    (or a timer racing a change handler) never takes a different or double step."""
    sim = SimulatedCluster(5, placed({"t": (8, 3)}, 5))
    for _ in range(6):
        obs = sim.observe(3)
        first, again = decide_scaling(obs), decide_scaling(obs)
        assert first == again
        if first.done:
            break
        sim.apply(first)


def test_unreachable_cluster_changes_nothing_but_scale_out() -> None:
    obs = ClusterObservation(desired=3, statefulset_replicas=5, registered=None)
    decision = decide_scaling(obs)
    assert (decision.reason, decision.statefulset_replicas, decision.reassign) == (
        "ClusterUnreachable",
        5,
        {},
    )
    assert not decision.done
    new = decide_scaling(ClusterObservation(desired=3, statefulset_replicas=None, registered=None))
    assert (new.reason, new.statefulset_replicas) == ("Creating", 3)


def test_scale_in_waits_for_running_reassignments_and_missing_brokers() -> None:
    assignment = placed({"t": (4, 2)}, 4)
    moving = decide_scaling(
        ClusterObservation(
            desired=3,
            statefulset_replicas=4,
            registered=frozenset(range(4)),
            assignment=assignment,
            reassigning=frozenset({("t", 0)}),
        )
    )
    assert (moving.phase, moving.reassign, moving.statefulset_replicas) == (
        ScalingPhase.DRAINING,
        {},
        4,
    )
    missing = decide_scaling(
        ClusterObservation(
            desired=3,
            statefulset_replicas=4,
            registered=frozenset({0, 1, 3}),
            assignment=assignment,
        )
    )
    assert missing.reason == "WaitingForBrokers" and "[2]" in missing.message


def test_refusal_names_the_topic() -> None:
    decision = decide_scaling(
        ClusterObservation(
            desired=2,
            statefulset_replicas=3,
            registered=frozenset(range(3)),
            assignment=placed({"payments": (3, 3), "logs": (2, 1)}, 3),
        )
    )
    assert decision.refused and decision.statefulset_replicas == 3
    assert "'payments'" in decision.message and "replication factor 3" in decision.message
    assert replication_factors({("x", 0): [1], ("x", 1): [1, 2]}) == {"x": 2}


# -- topics ---------------------------------------------------------------------------------------


def observed(partitions: int = 3, rf: int = 1, **config: str) -> TopicObservation:
    return TopicObservation(partitions, rf, config, "id-1")


def test_topic_created_when_absent() -> None:
    decision = decide_topic(3, 2, {"retention.ms": "1"}, None)
    assert decision.create and decision.partitions == 3 and decision.changes_anything
    assert decision.config_changes == {"retention.ms": "1"}


def test_topic_in_sync_changes_nothing() -> None:
    decision = decide_topic(3, 1, {"retention.ms": "1"}, observed(**{"retention.ms": "1"}))
    assert not decision.changes_anything and decision.error is None


def test_topic_grows_and_config_drift_is_set_back() -> None:
    actual = observed(3, 1, **{"retention.ms": "5", "cleanup.policy": "compact"})
    decision = decide_topic(6, 1, {"retention.ms": "1"}, actual)
    assert decision.grow_to == 6
    assert decision.config_changes == {"retention.ms": "1", "cleanup.policy": None}


def test_partition_decrease_is_refused_but_other_changes_apply() -> None:
    decision = decide_topic(2, 1, {"retention.ms": "1"}, observed(4))
    assert decision.error is not None and decision.error[0] == "PartitionDecreaseRefused"
    assert decision.grow_to is None
    assert decision.config_changes == {"retention.ms": "1"}


def test_replication_factor_change() -> None:
    assert decide_topic(3, 3, {}, observed(3, 1)).replication_factor == 3
    assert decide_topic(3, 1, {}, observed(3, 1)).replication_factor is None


def test_autoscaled_partitions_are_not_a_decrease() -> None:
    policy = AutoscalingPolicy(2, 8, 1000, 60)
    assert decide_topic(3, 1, {}, observed(6), policy).error is None
    # Beyond maxPartitions, the spec is below reality: refused.
    assert decide_topic(3, 1, {}, observed(9), policy).error is not None
    # minPartitions above spec.partitions lifts the floor.
    assert decide_topic(3, 1, {}, observed(3), AutoscalingPolicy(5, 8, 1, 0)).grow_to == 5


def test_topic_spec_problems_and_policy() -> None:
    spec = {
        "partitions": 9,
        "autoscaling": {"enabled": True, "minPartitions": 4, "maxPartitions": 3},
    }
    problems = topic_spec_problems(spec)
    assert any("minPartitions 4 exceeds maxPartitions 3" in p for p in problems)
    assert any("spec.partitions 9 exceeds" in p for p in problems)
    assert autoscaling_policy({"partitions": 3}) is None
    assert autoscaling_policy({"partitions": 3, "autoscaling": {"enabled": False}}) is None
    policy = autoscaling_policy(
        {"partitions": 3, "autoscaling": {"enabled": True, "maxPartitions": 12}}
    )
    assert policy == AutoscalingPolicy(3, 12, 1, 300.0)


# -- autoscaling ----------------------------------------------------------------------------------

POLICY = AutoscalingPolicy(
    min_partitions=1,
    max_partitions=10,
    target_bytes_per_second_per_partition=100,
    stabilization_window_s=60,
)


def samples(rate_per_s: Sequence[float], every_s: float = 10.0) -> list[IngressSample]:
    """Samples every ``every_s`` seconds; rate i applies between sample i and i+1."""
    out = [IngressSample(0.0, 0.0)]
    for rate in rate_per_s:
        last = out[-1]
        out.append(IngressSample(last.time_s + every_s, last.total_bytes + rate * every_s))
    return out


def test_sustained_ingress_over_the_window_grows() -> None:
    seq = samples([450] * 6)  # 60 s at 450 B/s over 2 partitions = 225 B/s each
    assert decide_autoscale(seq, 2, POLICY, now_s=60) == 5  # ceil(450 / 100)


def test_a_spike_inside_the_window_does_not_grow() -> None:
    seq = samples([450, 450, 50, 450, 450, 450])
    assert decide_autoscale(seq, 2, POLICY, now_s=60) is None


def test_a_window_not_yet_covered_does_not_grow() -> None:
    assert decide_autoscale(samples([900] * 5), 2, POLICY, now_s=50) is None
    assert decide_autoscale(samples([]), 2, POLICY, now_s=60) is None


def test_growth_is_capped_and_never_shrinks() -> None:
    assert decide_autoscale(samples([10_000] * 6), 2, POLICY, now_s=60) == 10
    assert decide_autoscale(samples([10_000] * 6), 10, POLICY, now_s=60) is None
    assert decide_autoscale(samples([0] * 6), 8, POLICY, now_s=60) is None
    # Just above target: at least one more partition.
    assert decide_autoscale(samples([201] * 6), 2, POLICY, now_s=60) == 3


def test_zero_window_needs_two_samples() -> None:
    policy = AutoscalingPolicy(1, 10, 100, 0)
    assert decide_autoscale(samples([]), 1, policy, now_s=0) is None
    assert decide_autoscale(samples([300]), 1, policy, now_s=10) == 3


def test_prune_keeps_one_sample_before_the_window_and_drops_a_reset_counter() -> None:
    seq = samples([100] * 10)  # t = 0..100
    kept = prune_samples(seq, now_s=100, window_s=30)
    assert [x.time_s for x in kept] == [70.0, 80.0, 90.0, 100.0]
    reset = [*seq, IngressSample(110.0, 5.0), IngressSample(120.0, 10.0)]
    assert [x.time_s for x in prune_samples(reset, now_s=120, window_s=300)] == [110.0, 120.0]


@settings(max_examples=200, deadline=None)
@given(
    rates=st.lists(st.floats(0, 5000, allow_nan=False), min_size=0, max_size=12),
    partitions=st.integers(1, 12),
)
def test_autoscale_properties(rates: list[float], partitions: int) -> None:
    seq = samples(rates)
    now = seq[-1].time_s
    grow = decide_autoscale(seq, partitions, POLICY, now)
    if grow is None:
        return
    assert partitions < grow <= POLICY.max_partitions
    window = prune_samples(seq, now, POLICY.stabilization_window_s)
    assert window[0].time_s <= now - POLICY.stabilization_window_s
    # Every rate in the window was above target per partition.
    in_window = rates[int(window[0].time_s // 10) :]
    assert min(in_window) / partitions > POLICY.target_bytes_per_second_per_partition


@pytest.mark.parametrize("bad", [ScalingPhase.REFUSED, ScalingPhase.DRAINING])
def test_a_stale_phase_after_the_spec_went_back_up_settles(bad: ScalingPhase) -> None:
    """A scale-in interrupted by raising the spec again ends Ready, brokers untouched."""
    assignment = placed({"t": (4, 2)}, 4)
    decision = decide_scaling(
        ClusterObservation(
            desired=4,
            statefulset_replicas=4,
            registered=frozenset(range(4)),
            assignment=assignment,
            previous_phase=bad,
        )
    )
    assert decision.done and decision.statefulset_replicas == 4 and not decision.reassign


def test_topic_bytes_in_sums_the_brokers_counters() -> None:
    from fjord_operator.decisions import topic_bytes_in

    page = """# HELP fjord_broker_bytes_in Record batch bytes appended
# TYPE fjord_broker_bytes_in counter
fjord_broker_bytes_in_total{topic="orders"} 1500.0
fjord_broker_bytes_in_created{topic="orders"} 1.7e9
fjord_broker_bytes_in_total{topic="orders-2"} 99.0
"""
    other = 'fjord_broker_bytes_in_total{topic="orders"} 500.0\n'
    assert topic_bytes_in([page, other], "orders") == 2000.0
    assert topic_bytes_in([page], "absent") == 0.0
    assert topic_bytes_in([], "orders") == 0.0


def test_a_lost_phase_still_rebalances_onto_idle_brokers() -> None:
    """The status patch of a step was lost (phase Stable), but brokers 3 and 4 of the spec hold
    nothing: the state alone shows the scale-out is unfinished."""
    assignment = placed({"t": (6, 2)}, 3)
    obs = ClusterObservation(
        desired=5,
        statefulset_replicas=5,
        registered=frozenset(range(5)),
        assignment=assignment,
        previous_phase=ScalingPhase.STABLE,
    )
    decision = decide_scaling(obs)
    assert decision.phase is ScalingPhase.REBALANCING
    moved_to = {b for r in decision.reassign.values() for b in r}
    assert {3, 4} <= moved_to
    # Few replicas (fewer than brokers): an empty broker is normal, nothing moves.
    small = ClusterObservation(
        desired=5,
        statefulset_replicas=5,
        registered=frozenset(range(5)),
        assignment={("t", 0): [0, 1]},
    )
    assert decide_scaling(small).done


@settings(max_examples=40, deadline=None)
@given(topics=topics_strategy, brokers=st.integers(3, 6))
def test_a_balanced_cluster_is_left_alone(topics: dict[str, tuple[int, int]], brokers: int) -> None:
    """After any rebalance, the operator moves no data by itself (no churn)."""
    from fjord.cluster.reassignment_plan import plan_reassignment

    assignment = placed(topics, brokers)
    assignment.update(plan_reassignment(assignment, range(brokers)) if assignment else {})
    decision = decide_scaling(
        ClusterObservation(
            desired=brokers,
            statefulset_replicas=brokers,
            registered=frozenset(range(brokers)),
            assignment=assignment,
        )
    )
    assert decision.done and not decision.reassign


# -- the autoscaling window in status: bounded, and read back by a restarted operator ----------


def test_bound_samples_merges_the_oldest_keeping_coverage_and_the_lowest_rate() -> None:
    seq = samples([500, 100, 900, 400, 700, 300, 800])  # t = 0..70
    bounded = bound_samples(seq, max_samples=4)
    assert len(bounded) == 4
    assert (bounded[0], bounded[-1]) == (seq[0], seq[-1])
    rates = [r for a, b in itertools.pairwise(bounded) if (r := rate_between(a, b))]
    assert min(rates) == 100
    assert bound_samples(seq) == seq  # under the bound: untouched
    with pytest.raises(ValueError):
        bound_samples(seq, max_samples=2)


@settings(max_examples=200, deadline=None)
@given(
    rates=st.lists(st.floats(0, 5000, allow_nan=False), min_size=0, max_size=40),
    partitions=st.integers(1, 12),
    bound=st.integers(3, 12),
)
def test_a_bounded_window_never_grows_when_the_full_one_would_not(
    rates: list[float], partitions: int, bound: int
) -> None:
    seq = samples(rates)
    now = seq[-1].time_s
    policy = AutoscalingPolicy(1, 20, 100, 60)
    full = decide_autoscale(seq, partitions, policy, now)
    window = prune_samples(seq, now, policy.stabilization_window_s)
    bounded = decide_autoscale(bound_samples(window, bound), partitions, policy, now)
    if full is None:
        assert bounded is None
    else:
        assert bounded is None or bounded <= full


def test_status_round_trip_and_what_starts_a_new_window() -> None:
    seq = [*samples([100, 200]), IngressSample(30.0, 5000.0, min_rate=50.0)]
    status = {"autoscaling": samples_to_status("metrics", seq)}
    assert samples_from_status(status, "metrics") == seq
    assert status["autoscaling"]["samples"][-1] == {"time": 30.0, "bytes": 5000.0, "minRate": 50.0}
    assert samples_from_status(status, "records") == []  # another source: a new window
    assert samples_from_status(None, "metrics") == []
    assert samples_from_status({"autoscaling": "x"}, "metrics") == []
    for bad in (
        [{"time": "soon", "bytes": 1}],
        [{"time": 1.0}],
        [{"time": True, "bytes": 1}],
        [{"time": 1.0, "bytes": 1, "minRate": "fast"}],
        ["1,2"],
    ):
        assert (
            samples_from_status({"autoscaling": {"source": "metrics", "samples": bad}}, "metrics")
            == []
        )
    many = samples([100] * (MAX_AUTOSCALING_SAMPLES + 40))
    assert len(samples_to_status("records", many)["samples"]) == MAX_AUTOSCALING_SAMPLES  # type: ignore[arg-type]


def test_the_crd_bounds_the_samples_as_the_operator_does() -> None:
    import yaml

    crd = yaml.safe_load((CHART / "crds" / "fjordtopics.yaml").read_text())
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    samples_schema = status["properties"]["autoscaling"]["properties"]["samples"]
    assert samples_schema["maxItems"] == MAX_AUTOSCALING_SAMPLES


# -- rolling restarts ---------------------------------------------------------------------------


def _sts(revision: str | None, generation: int = 2, observed: int = 2) -> dict[str, Any]:
    status: dict[str, Any] = {"observedGeneration": observed}
    if revision is not None:
        status["updateRevision"] = revision
    return {"metadata": {"generation": generation}, "status": status}


def _pod(ordinal: int, revision: str, ready: bool = True, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": f"fjord-broker-{ordinal}",
        "labels": {POD_REVISION_LABEL: revision},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-11-25T23:00:00Z"
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {"metadata": meta, "status": {"conditions": [condition]}}


def test_roll_targets_are_pods_of_an_older_revision_and_not_serving_ones_count_down() -> None:
    pods = [
        _pod(2, "old"),
        _pod(0, "new"),
        _pod(1, "old", deleting=True),
        _pod(4, "old"),  # beyond the replicas (a scale-in): not rolled
    ]
    targets = roll_targets(_sts("new"), pods, replicas=4)
    assert targets.to_restart == (1, 2)
    assert targets.not_serving == frozenset({1, 3})  # terminating, and pod 3 missing
    assert targets.settled and targets.update_revision == "new"
    unready = roll_targets(_sts("new"), [_pod(0, "new", ready=False)], replicas=1)
    assert unready.to_restart == () and unready.not_serving == frozenset({0})


def test_nothing_is_rolled_before_the_statefulset_controller_saw_the_template() -> None:
    stale = roll_targets(_sts("old", generation=3, observed=2), [_pod(0, "older")], replicas=1)
    assert not stale.settled and stale.to_restart == ()
    unknown = roll_targets(_sts(None), [_pod(0, "x")], replicas=1)
    assert not unknown.settled and unknown.to_restart == ()


def test_scale_out_moves_and_drains_keep_replicas_on_distinct_racks() -> None:
    racks: dict[int, str | None] = {0: "a", 1: "b", 2: "c", 3: "a", 4: "b", 5: "c"}
    assignment = {("t", p): [p % 3, (p + 1) % 3, (p + 2) % 3] for p in range(6)}
    out = decide_scaling(
        ClusterObservation(
            desired=6, statefulset_replicas=6, registered=frozenset(range(6)),
            assignment=assignment, previous_phase=ScalingPhase.WAITING_FOR_BROKERS, racks=racks,
        )
    )
    assert out.phase is ScalingPhase.REBALANCING and out.reassign
    grown = {**assignment, **out.reassign}
    assert {b for r in grown.values() for b in r} == set(range(6))
    for replicas in grown.values():
        assert sorted(str(racks[b]) for b in replicas) == ["a", "b", "c"]
    drain = decide_scaling(
        ClusterObservation(
            desired=5, statefulset_replicas=6, registered=frozenset(range(6)),
            assignment=grown, racks=racks,
        )
    )
    assert drain.phase is ScalingPhase.DRAINING
    drained = {**grown, **drain.reassign}
    for replicas in drained.values():
        assert 5 not in replicas
        assert sorted(str(racks[b]) for b in replicas) == ["a", "b", "c"]


def test_rack_annotations_come_from_the_nodes_label() -> None:
    from fjord_operator.decisions import rack_annotations

    def pod(ordinal: int, node: str | None, rack: str | None = None, gone: bool = False) -> Any:
        meta: dict[str, Any] = {"name": f"fjord-broker-{ordinal}"}
        if rack is not None:
            meta["annotations"] = {"fjord.io/rack": rack}
        if gone:
            meta["deletionTimestamp"] = "2026-11-25T23:00:00Z"
        return {"metadata": meta, "spec": {"nodeName": node} if node else {}}

    zone = "topology.kubernetes.io/zone"
    nodes = {"n1": {zone: "eu-1a"}, "n2": {zone: "eu-1b"}, "n3": {"other": "x"}}
    plan = rack_annotations(
        [pod(0, "n1"), pod(1, "n2", rack="eu-1b"), pod(2, None), pod(3, "n3"),
         pod(4, "n1", gone=True), pod(5, "n2", rack="stale")],
        nodes, zone, "fjord.io/rack",
    )
    assert plan.patches == {"fjord-broker-0": "eu-1a", "fjord-broker-5": "eu-1b"}
    assert plan.racks == {0: "eu-1a", 1: "eu-1b", 5: "eu-1b"}
    assert plan.missing == (f"node n3 of pod fjord-broker-3 has no label {zone}",)


# -- autoscaling on time lag -----------------------------------------------------------------


def test_time_lag_autoscaler_tells_how_many_consumers_would_catch_up_and_grows() -> None:
    from fjord_operator.decisions import GroupLagSample, TimeLagPolicy, decide_time_lag

    policy = AutoscalingPolicy(2, 12, 10**9, 60)
    target = TimeLagPolicy("billing", 30)
    # 2 members consume 100 records/s (50 each); producers write 300/s; backlog 6000 records.
    samples = [
        GroupLagSample(1000 + t, 100 * t, 4000 + 300 * t, 90.0 + t, 2) for t in range(0, 61, 20)
    ]
    verdict = decide_time_lag(samples, 4, policy, target, now_s=1060)
    # needed = 300 + 16000 / 30 = 833.3 records/s = 16.7 consumers at 50/s each -> 17, capped 12.
    assert verdict.consumers_to_catch_up == 17 and verdict.grow_to == 12
    assert verdict.consumers == 2 and verdict.time_lag_s == 150.0
    # Not above the target for the whole window (one sample below): no growth, but the count.
    dipped = [*samples[:2], GroupLagSample(1040, 4000, 16000, 10.0, 2), samples[3]]
    calm = decide_time_lag(dipped, 4, policy, target, now_s=1060)
    assert calm.grow_to is None and calm.consumers_to_catch_up == 17
    # The window not covered yet (operator just started measuring): no growth.
    assert decide_time_lag(samples[2:], 4, policy, target, now_s=1060).grow_to is None
    # Enough partitions already: the status says how many consumers, nothing grows.
    roomy = decide_time_lag(samples, 20, AutoscalingPolicy(2, 30, 10**9, 60), target, 1060)
    assert roomy.grow_to is None and "17 consumers would catch up" in roomy.reason
    # A stuck group (nothing consumed): more partitions would not help; unknown count.
    stuck = [GroupLagSample(1000 + t, 0, 300 * t, 500.0, 2) for t in range(0, 61, 20)]
    verdict = decide_time_lag(stuck, 4, policy, target, now_s=1060)
    assert verdict.grow_to is None and verdict.consumers_to_catch_up is None
    # A Spark query reports with no members: counted as one reader.
    spark = [GroupLagSample(1000 + t, 100 * t, 3000 + 100 * t, 100.0, 0) for t in (0, 60)]
    assert decide_time_lag(spark, 1, policy, target, now_s=1060).consumers_to_catch_up == 2
    assert decide_time_lag([], 4, policy, target, now_s=1060).consumers_to_catch_up is None


def test_time_lag_samples_round_trip_through_the_status() -> None:
    from fjord_operator.decisions import (
        GroupLagSample,
        TimeLagPolicy,
        decide_time_lag,
        lag_samples_from_status,
        lag_samples_to_status,
        time_lag_policy,
    )

    target = TimeLagPolicy("g", 10)
    samples = [GroupLagSample(1.5, 10, 20, 3.25, 1), GroupLagSample(2.5, 12, 30, None, 1)]
    verdict = decide_time_lag(samples, 1, AutoscalingPolicy(1, 2, 1, 0), target, 2.5)
    status = {"autoscaling": {"timeLag": lag_samples_to_status(target, samples, verdict)}}
    assert lag_samples_from_status(status, target) == samples
    assert lag_samples_from_status(status, TimeLagPolicy("other", 10)) == []
    assert lag_samples_from_status({"autoscaling": {"timeLag": {"group": "g", "samples": [1]}}},
                                   target) == []
    spec = {"partitions": 1, "autoscaling": {"enabled": True, "maxPartitions": 4,
                                             "timeLag": {"group": "g", "targetSeconds": 10}}}
    assert time_lag_policy(spec) == target
    assert time_lag_policy({"autoscaling": {"enabled": False, "timeLag": {"group": "g"}}}) is None
