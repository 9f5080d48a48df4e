"""The chaos harness's pure core: fault plans, the delivery ledger and the verdict.

The verdict is what the chaos proof rests on, so it is checked against worlds built with a
known truth: every lost, duplicated, reordered or misplaced record must be reported, and a
clean world must pass.
"""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.testing.chaos import (
    GAP_S,
    KILL_DOWN_S,
    Acked,
    DeliveryLedger,
    Failed,
    FaultKind,
    Outcome,
    ReadRecord,
    RecordId,
    Timeline,
    decode_value,
    encode_value,
    etcd_outage_plan,
    fast_restart_plan,
    key_name,
    longest_gap,
    plan_faults,
    skipped_records,
    verify_delivery,
)

# --- plans -------------------------------------------------------------------------------------


@given(
    seed=st.integers(0, 2**32),
    brokers=st.integers(1, 5),
    partitions=st.integers(1, 12),
    kills=st.integers(0, 15),
)
def test_plan_has_the_required_faults_and_is_replayable(
    seed: int, brokers: int, partitions: int, kills: int
) -> None:
    plan = plan_faults(seed, brokers, partitions, kills)
    assert plan == plan_faults(seed, brokers, partitions, kills)  # same seed, same plan
    required = plan.steps[: plan.required]
    kinds = [s.kind for s in required]
    assert kinds.count(FaultKind.KILL_BROKER) == kills
    assert kinds.count(FaultKind.FREEZE_BROKER) == 1
    assert kinds.count(FaultKind.KILL_CONTROLLER) == 1
    if kills:
        assert kinds[0] is FaultKind.KILL_BROKER  # the cluster is under load before the rest
    assert all(s.kind is FaultKind.KILL_BROKER for s in plan.steps[plan.required :])
    for step in plan.steps:
        assert GAP_S[0] <= step.gap_s <= GAP_S[1]
        if step.kind is FaultKind.KILL_BROKER:
            assert (step.broker >= 0) != (step.leader_of >= 0)
            assert step.broker < brokers and step.leader_of < partitions
            assert KILL_DOWN_S[0] <= step.down_s <= KILL_DOWN_S[1]
        elif step.kind is FaultKind.FREEZE_BROKER:
            assert 0 <= step.broker < brokers
    assert f"seed {seed}" in plan.describe()


def test_plans_differ_between_seeds_and_bad_arguments_are_refused() -> None:
    assert plan_faults(1, 3, 6) != plan_faults(2, 3, 6)
    with pytest.raises(ValueError):
        plan_faults(1, 0, 6)
    with pytest.raises(ValueError):
        plan_faults(1, 3, 0)


# --- values and the ledger ---------------------------------------------------------------------


@given(index=st.integers(0, 99), seq=st.integers(0, 10**12))
def test_values_round_trip(index: int, seq: int) -> None:
    assert decode_value(encode_value(key_name(index), seq)) == (key_name(index), seq)


@pytest.mark.parametrize("bad", [None, b"", b"k01", b"k01:", b":5", b"k01:-3", b"k01:x", b"\xff:1"])
def test_malformed_values_are_refused(bad: bytes | None) -> None:
    with pytest.raises(ValueError):
        decode_value(bad)


def test_ledger_counts_and_refuses_impossible_histories() -> None:
    ledger = DeliveryLedger()
    ledger.sent(("k00", 1))
    ledger.sent(("k00", 2))
    ledger.sent(("k01", 1))
    ledger.settle(("k00", 1), Acked(0, 0))
    ledger.settle(("k01", 1), Failed("boom"))
    assert ledger.counts() == (3, 1, 1)
    assert ledger.outcomes() == {("k00", 1): Acked(0, 0), ("k00", 2): None,
                                 ("k01", 1): Failed("boom")}
    with pytest.raises(ValueError, match="sent twice"):
        ledger.sent(("k00", 1))
    with pytest.raises(ValueError, match="never sent"):
        ledger.settle(("k09", 1), Acked(0, 1))
    with pytest.raises(ValueError, match="second outcome"):
        ledger.settle(("k00", 1), Acked(0, 1))


def test_ledger_is_safe_across_threads() -> None:
    ledger = DeliveryLedger()

    def work(key: str) -> None:
        for seq in range(2000):
            ledger.sent((key, seq))
            ledger.settle((key, seq), Acked(0, seq) if seq % 3 else Failed("x"))

    threads = [threading.Thread(target=work, args=(key_name(i),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ledger.counts() == (8000, 4 * 1333, 4 * 667)


# --- the verdict against worlds with a known truth ---------------------------------------------

# Each record's fate: acknowledged (one copy, or two when a retry duplicated it), failed or
# pending with or without a copy in the log, or failed/pending and absent.
FATES = ["acked", "acked-dup", "failed-present", "failed-absent", "pending-present",
         "pending-absent"]


def build_world(
    seed: int, keys: int, per_key: int, partitions: int
) -> tuple[dict[RecordId, Outcome | None], list[ReadRecord], dict[str, list[RecordId]]]:
    """A log written the way a producer would: each key's records in order in its partition,
    keys interleaved at random; returns (ledger outcomes, what a reader reads, truth by fate)."""
    rng = random.Random(seed)
    queues = {key_name(k): [(key_name(k), s) for s in range(1, per_key + 1)]
              for k in range(keys)}
    partition_of = {key_name(k): rng.randrange(partitions) for k in range(keys)}
    next_offset = [0] * partitions
    outcomes: dict[RecordId, Outcome | None] = {}
    log: list[ReadRecord] = []
    truth: dict[str, list[RecordId]] = {fate: [] for fate in FATES}
    while any(queues.values()):
        key = rng.choice([k for k, q in queues.items() if q])
        record = queues[key].pop(0)
        fate = rng.choice(FATES)
        truth[fate].append(record)
        partition = partition_of[key]
        copies = {"acked-dup": 2}.get(fate, 0 if fate.endswith("absent") else 1)
        first_offset = next_offset[partition]
        for _ in range(copies):
            log.append(ReadRecord(partition, next_offset[partition], encode_value(*record)))
            next_offset[partition] += 1
        if fate.startswith("acked"):
            outcomes[record] = Acked(partition, first_offset)
        elif fate.startswith("failed"):
            outcomes[record] = Failed("NOT_ENOUGH_REPLICAS")
        else:
            outcomes[record] = None
    rng.shuffle(log)  # the reader interleaves partitions arbitrarily
    return outcomes, log, truth


worlds = st.tuples(st.integers(0, 2**32), st.integers(1, 6), st.integers(1, 30),
                   st.integers(1, 4))


@settings(max_examples=60, deadline=None)
@given(world=worlds)
def test_a_clean_world_passes_with_exact_counts(world: tuple[int, int, int, int]) -> None:
    outcomes, log, truth = build_world(*world)
    report = verify_delivery(outcomes, log)
    acked = len(truth["acked"]) + len(truth["acked-dup"])
    assert report.sent == len(outcomes)
    assert report.acknowledged == acked
    assert report.failed == len(truth["failed-present"]) + len(truth["failed-absent"])
    assert report.pending == len(truth["pending-present"]) + len(truth["pending-absent"])
    assert report.read == len(log)
    assert report.lost == () and report.misplaced == () and report.order_violations == ()
    assert report.foreign == ()
    assert dict(report.duplicated) == {r: 2 for r in truth["acked-dup"]}
    assert report.unacked_present == len(truth["failed-present"]) + len(truth["pending-present"])
    assert sum(report.failure_reasons.values()) == report.failed
    if report.failed:
        assert "failures by reason" in report.summary()
    assert report.ok(require_no_duplicates=False)
    assert report.ok(require_no_duplicates=True) == (not truth["acked-dup"])


@settings(max_examples=60, deadline=None)
@given(world=worlds, pick=st.randoms(use_true_random=False))
def test_a_dropped_acknowledged_record_is_lost(
    world: tuple[int, int, int, int], pick: random.Random
) -> None:
    outcomes, log, truth = build_world(*world)
    if not truth["acked"]:
        return
    victim = pick.choice(truth["acked"])
    log = [r for r in log if decode_value(r.value) != victim]
    report = verify_delivery(outcomes, log)
    assert report.lost == (victim,)
    assert not report.ok(require_no_duplicates=False)
    assert "lost 1," in report.summary()


@settings(max_examples=60, deadline=None)
@given(world=worlds, pick=st.randoms(use_true_random=False))
def test_swapped_records_of_a_key_break_the_order(
    world: tuple[int, int, int, int], pick: random.Random
) -> None:
    outcomes, log, _ = build_world(*world)
    by_key: dict[str, list[ReadRecord]] = {}
    for r in sorted(log, key=lambda r: (r.partition, r.offset)):
        key, seq = decode_value(r.value)
        if seq not in {decode_value(x.value)[1] for x in by_key.get(key, [])}:
            by_key.setdefault(key, []).append(r)
    candidates = [rs for rs in by_key.values() if len(rs) >= 2]
    if not candidates:
        return
    records = pick.choice(candidates)
    a, b = pick.sample(records, 2)
    # Swap the values at two positions of one key: now a larger seq comes first.
    swapped = {a: ReadRecord(a.partition, a.offset, b.value),
               b: ReadRecord(b.partition, b.offset, a.value)}
    report = verify_delivery(outcomes, [swapped.get(r, r) for r in log])
    assert report.order_violations
    assert not report.ok(require_no_duplicates=False)


@settings(max_examples=40, deadline=None)
@given(world=worlds, pick=st.randoms(use_true_random=False))
def test_an_acknowledged_offset_holding_another_record_is_misplaced(
    world: tuple[int, int, int, int], pick: random.Random
) -> None:
    outcomes, log, truth = build_world(*world)
    if not truth["acked"]:
        return
    victim = pick.choice(truth["acked"])
    acked = outcomes[victim]
    assert isinstance(acked, Acked)
    outcomes[victim] = Acked(acked.partition, acked.offset + 10_000)
    report = verify_delivery(outcomes, log)
    assert [m[0] for m in report.misplaced] == [victim]
    assert not report.ok(require_no_duplicates=False)


def test_foreign_and_unknown_records_are_reported() -> None:
    outcomes: dict[RecordId, Outcome | None] = {("k00", 1): Acked(0, 0)}
    log = [ReadRecord(0, 0, b"k00:1"), ReadRecord(0, 1, b"garbage"), ReadRecord(0, 2, b"k05:9"),
           ReadRecord(0, 3, None)]
    report = verify_delivery(outcomes, log)
    assert [r.offset for r in report.foreign] == [1, 2, 3]
    assert not report.ok(require_no_duplicates=False)


def test_timeline_renders_in_order() -> None:
    timeline = Timeline()
    timeline.add(0.5, "SIGKILL broker 1")
    timeline.add(7.25, "broker 1 restarted")
    assert timeline.render().splitlines() == ["     0.50 s  SIGKILL broker 1",
                                              "     7.25 s  broker 1 restarted"]


# --- scenarios: etcd outage, fast restart ------------------------------------------------------


def test_scenario_plans() -> None:
    outage = etcd_outage_plan(60)
    assert outage.required == 1 and outage.steps[0].kind is FaultKind.ETCD_OUTAGE
    assert outage.steps[0].down_s == 60 and "60 s" in outage.describe()
    with pytest.raises(ValueError):
        etcd_outage_plan(0)
    restarts = fast_restart_plan(7, partitions=6, restarts=4)
    assert restarts == fast_restart_plan(7, partitions=6, restarts=4)
    assert restarts.required == len(restarts.steps) == 4
    assert all(s.kind is FaultKind.RESTART_BROKER and 0 <= s.leader_of < 6
               for s in restarts.steps)
    with pytest.raises(ValueError):
        fast_restart_plan(7, partitions=6, restarts=0)


def test_longest_gap() -> None:
    assert longest_gap([], 10.0, 14.0) == 4.0  # nothing at all: the whole window
    assert longest_gap([1.0, 11.0, 11.5, 13.0, 20.0], 10.0, 14.0) == 1.5
    assert longest_gap([10.5, 13.9], 10.0, 14.0) == pytest.approx(3.4)
    with pytest.raises(ValueError):
        longest_gap([1.0], 2.0, 1.0)


@given(times=st.lists(st.floats(0, 100), max_size=50), start=st.floats(0, 50),
       length=st.floats(0, 50))
def test_longest_gap_bounds(times: list[float], start: float, length: float) -> None:
    gap = longest_gap(times, start, start + length)
    assert 0 <= gap <= length + 1e-9
    if not any(start <= t <= start + length for t in times):
        assert gap == pytest.approx(length)


def test_skipped_records() -> None:
    log = [(0, o) for o in range(5)] + [(1, o) for o in range(3)]
    returned = [(0, 0), (0, 1), (0, 3), (1, 0), (1, 1), (1, 2)]
    # Partition 0's position passed offset 2 without returning it; offset 4 is not passed yet.
    assert skipped_records(returned, {0: 4, 1: 3}, log) == [(0, 2)]
    assert skipped_records(returned, {0: 2, 1: 3}, log) == []
    assert skipped_records([], {}, log) == []


def test_corruption_plan_is_seeded_and_checked() -> None:
    from fjord.testing.chaos import FaultKind, corruption_plan

    plan = corruption_plan(3, partitions=4, corruptions=2)
    assert plan == corruption_plan(3, partitions=4, corruptions=2)
    assert plan.required == 2
    assert all(s.kind is FaultKind.CORRUPT_SEGMENT and 0 <= s.leader_of < 4 for s in plan.steps)
    assert "flip a byte" in plan.describe()
    with pytest.raises(ValueError):
        corruption_plan(3, partitions=4, corruptions=0)
