"""Properties of the safe rolling-restart planner (fjord.cluster.rolling_restart)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.cluster.rolling_restart import (
    InFlight,
    PartitionIsr,
    RollAction,
    RollObservation,
    blocker_for,
    can_never_stay_available,
    next_roll_step,
)
from fjord.topic_partition import TopicPartition

TP = TopicPartition


@st.composite
def observations(draw: st.DrawFn) -> tuple[RollObservation, list[int]]:
    """A cluster of 1-6 brokers, some down, partitions with any ISR (a subset of the replicas,
    possibly listing down brokers the controller has not removed yet), and brokers to
    restart in some order."""
    n = draw(st.integers(1, 6))
    brokers = list(range(n))
    live = frozenset(draw(st.lists(st.sampled_from(brokers), unique=True)))
    partitions: dict[TopicPartition, PartitionIsr] = {}
    for p in range(draw(st.integers(0, 10))):
        rf = draw(st.integers(1, n))
        replicas = tuple(draw(st.permutations(brokers))[:rf])
        isr = tuple(r for r in replicas if draw(st.booleans())) or replicas[:1]
        min_isr = draw(st.integers(1, rf + 1))
        partitions[TP(f"t{p % 3}", p)] = PartitionIsr(replicas, isr, min_isr)
    to_restart = draw(st.lists(st.sampled_from(brokers), unique=True))
    return RollObservation(partitions, live), to_restart


def live_isr_without(state: PartitionIsr, live: frozenset[int], broker: int) -> int:
    return sum(1 for b in state.isr if b in live and b != broker)


@settings(max_examples=400, deadline=None)
@given(observations())
def test_a_live_broker_goes_down_only_when_every_partition_keeps_min_isr(
    case: tuple[RollObservation, list[int]],
) -> None:
    observation, to_restart = case
    step = next_roll_step(to_restart, observation)
    if step.action is RollAction.DONE:
        assert not to_restart
        return
    assert to_restart
    if step.action is RollAction.RESTART:
        b = step.broker
        assert b in to_restart
        # The caller's order is kept: a down broker goes first (the first down one); else
        # every broker before b was blocked.
        for earlier in to_restart[: to_restart.index(b)]:
            assert earlier in observation.live
            if b in observation.live:
                assert blocker_for(earlier, observation) is not None
        if b in observation.live:
            assert all(x in observation.live for x in to_restart)  # down ones go first
            for state in observation.partitions.values():
                if b in state.isr and not can_never_stay_available(state):
                    assert live_isr_without(state, observation.live, b) >= state.min_isr
        assert step.left_isr == frozenset(
            tp for tp, s in observation.partitions.items() if b in s.isr
        )
        assert step.in_flight == InFlight(b, step.left_isr)
    else:
        # WAIT without a restart in flight: every candidate is live and really blocked, and
        # the reason names the partition and ISR of the first one.
        assert all(b in observation.live for b in to_restart)
        for b in to_restart:
            blocker = blocker_for(b, observation)
            assert blocker is not None
            state = observation.partitions[blocker.partition]
            assert b in state.isr
            assert live_isr_without(state, observation.live, b) < state.min_isr
        assert step.partition is not None
        assert f"{step.partition.topic}-{step.partition.partition}" in step.reason
        assert str(list(step.isr)) in step.reason
        assert step.broker == to_restart[0]


@settings(max_examples=300, deadline=None)
@given(observations(), st.data())
def test_nothing_else_goes_down_while_the_restarted_broker_is_not_back(
    case: tuple[RollObservation, list[int]], data: st.DataObject
) -> None:
    observation, to_restart = case
    brokers = sorted({b for s in observation.partitions.values() for b in s.replicas} | {0})
    b = data.draw(st.sampled_from(brokers))
    left = frozenset(
        data.draw(st.lists(st.sampled_from(sorted(observation.partitions)), unique=True))
        if observation.partitions
        else []
    )
    step = next_roll_step(to_restart, observation, InFlight(b, left))
    still_pending = b in to_restart
    waiting_in_isr = [
        tp for tp in left
        if b in observation.partitions[tp].replicas and b not in observation.partitions[tp].isr
    ]
    back = not still_pending and b in observation.live and not waiting_in_isr
    if step.action is RollAction.RESTART and step.broker != b:
        assert back or (still_pending and b in observation.live)
    if back:
        assert step.back == b
    elif not (still_pending and b in observation.live):
        assert step.action is RollAction.WAIT
        assert step.broker == b
        assert str(b) in step.reason
        if not still_pending and b in observation.live:
            assert step.partition in waiting_in_isr


def test_the_wait_reason_names_partition_isr_and_the_down_broker() -> None:
    observation = RollObservation(
        {
            TP("orders", 0): PartitionIsr((0, 1, 2), (0, 1, 2), 2),
            TP("orders", 1): PartitionIsr((1, 2, 3), (1, 2, 3), 2),
        },
        live=frozenset({1, 2, 3}),
    )
    step = next_roll_step([1, 2], observation)
    assert step.action is RollAction.WAIT
    assert step.partition == TP("orders", 0)
    assert step.isr == (0, 1, 2)
    assert step.reason == (
        "broker 1 must wait: orders-0 would keep 1 in-sync replica(s) of isr [0, 1, 2] without "
        "it, below min.insync.replicas=2; broker 0 down already (brokers [2] are held too)"
    )
    # Broker 3 only shares orders-1, which keeps 1 and 2: it may go.
    assert next_roll_step([1, 2, 3], observation).broker == 3


def test_partitions_that_no_restart_can_keep_writable_do_not_block() -> None:
    observation = RollObservation(
        {
            TP("single", 0): PartitionIsr((1,), (1,), 1),
            TP("strict", 0): PartitionIsr((1, 2), (1, 2), 2),
        },
        live=frozenset({1, 2}),
    )
    step = next_roll_step([1], observation)
    assert step.action is RollAction.RESTART and step.broker == 1
    assert step.unavoidable == (TP("single", 0), TP("strict", 0))


def test_a_restart_that_did_not_happen_is_asked_for_again() -> None:
    observation = RollObservation(
        {TP("t", 0): PartitionIsr((0, 1, 2), (0, 1, 2), 2)}, live=frozenset({0, 1, 2})
    )
    step = next_roll_step([0, 2], observation, InFlight(2, frozenset({TP("t", 0)})))
    assert step.action is RollAction.RESTART and step.broker == 2


def test_done_once_the_last_broker_is_back() -> None:
    observation = RollObservation(
        {TP("t", 0): PartitionIsr((0, 1), (0, 1), 1)}, live=frozenset({0, 1})
    )
    step = next_roll_step([], observation, InFlight(1, frozenset({TP("t", 0)})))
    assert step.action is RollAction.DONE and step.back == 1
    waiting = RollObservation(
        {TP("t", 0): PartitionIsr((0, 1), (0,), 1)}, live=frozenset({0, 1})
    )
    step = next_roll_step([], waiting, InFlight(1, frozenset({TP("t", 0)})))
    assert step.action is RollAction.WAIT
    assert step.reason == "broker 1 was restarted and is not back in the isr of t-0 (isr [0])"


# -- a simulated roll -------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    brokers=st.integers(3, 7),
    partitions=st.integers(1, 24),
    lagging=st.integers(0, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_simulated_roll_never_takes_a_partition_below_min_isr_and_finishes(
    brokers: int, partitions: int, lagging: int, seed: int
) -> None:
    """RF 3, min.insync 2, some followers lagging (out of the ISR) at the start. Each tick the
    roller acts on the planner's step; a restarted broker comes back after a random time and
    rejoins the ISRs one by one; lagging followers catch up at random. Invariant: no partition
    that had min.insync live ISR members ever has fewer because of the roll; every broker gets
    restarted exactly once."""
    rng = random.Random(seed)
    ids = list(range(brokers))
    replicas = {TP("t", p): tuple(rng.sample(ids, 3)) for p in range(partitions)}
    isr = {tp: set(r) for tp, r in replicas.items()}
    for _ in range(lagging):
        tp = rng.choice(sorted(replicas))
        follower = rng.choice(replicas[tp][1:])
        isr[tp].discard(follower)
    live = set(ids)
    todo = list(ids)
    in_flight: InFlight | None = None
    down_until: dict[int, int] = {}
    restarted: list[int] = []
    for tick in range(10_000):
        obs = RollObservation(
            {tp: PartitionIsr(replicas[tp], tuple(sorted(isr[tp])), 2) for tp in replicas},
            frozenset(live),
        )
        for tp, members in isr.items():
            assert len(members & live) >= 2 or len(members) < 2, (tick, tp, members, live)
        step = next_roll_step(todo, obs, in_flight)
        if step.back is not None:
            in_flight = None
        if step.action is RollAction.DONE:
            break
        if step.action is RollAction.RESTART:
            assert step.broker is not None
            assert in_flight is None or in_flight.broker == step.broker
            b = step.broker
            in_flight = step.in_flight
            todo.remove(b)
            restarted.append(b)
            live.discard(b)
            for members in isr.values():  # the controller drops it from every ISR
                if len(members) > 1:
                    members.discard(b)
            down_until[b] = tick + rng.randint(1, 5)
        for b, until in list(down_until.items()):
            if tick >= until:
                live.add(b)
                del down_until[b]
        for tp, members in isr.items():  # followers catch up at random
            for r in replicas[tp]:
                if r in live and r not in members and rng.random() < 0.3:
                    members.add(r)
    else:
        raise AssertionError("the roll did not finish")
    assert sorted(restarted) == ids


def test_the_in_flight_broker_survives_an_operator_restart_through_status() -> None:
    """The operator keeps the broker restarted last in status.rolling.restarting; a restarted
    operator reads it back and keeps waiting for the same ISRs. A malformed value reads as
    nothing in flight (safety does not depend on it: rule 2 counts the broker as down)."""
    from fjord_operator.rolling import in_flight_from_status, in_flight_to_status

    in_flight = InFlight(3, frozenset({TP("orders", 2), TP("a-b.c", 0)}))
    stored = in_flight_to_status(in_flight)
    assert stored == {
        "broker": 3,
        "leftIsr": [{"topic": "a-b.c", "partition": 0}, {"topic": "orders", "partition": 2}],
    }
    assert in_flight_from_status(stored) == in_flight
    assert in_flight_to_status(None) is None
    for malformed in (None, "3", {"broker": "3"}, {"leftIsr": []}):
        assert in_flight_from_status(malformed) is None
    assert in_flight_from_status({"broker": 1, "leftIsr": [{"topic": "t"}, 5]}) == InFlight(1)
