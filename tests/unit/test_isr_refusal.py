"""A leader's AlterPartition after a refusal (chaos finding "partition does not heal").

Kafka's rules, checked against the ReplicaManager (real logs in a temp dir) and the controller's
own pure core (``fjord.controller.election.alter_isr``): a stale-epoch refusal fences the leader
only until metadata NEWER than the refused request arrives; a refusal that crossed an update (the
metadata already shows a newer partition epoch) or that carries the newer committed state does
not fence at all, and the leader proposes again at once; a controller whose view lags behind the
leader's is retried, not obeyed; an expansion is proposed again once the follower is caught up,
however many refusals came before. The property test plays random interleavings of proposals,
controller decisions, controller-made ISR changes, watch deliveries and answers, and checks that
once every message has arrived the leader is not fenced and converges to the full ISR.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.broker.partition import PartitionAssignment
from fjord.broker.replica_manager import IsrChangeRequest, ReplicaManager
from fjord.controller.election import alter_isr
from fjord.errors import ErrorCode, FjordError
from fjord.metadata import PartitionState
from fjord.storage import LogManager
from tests.helpers.replica_manager import (
    BROKER,
    Clock,
    Cluster,
    batch,
    fetch_request,
    one_produce,
    produce_request,
    run,
)

LAG_MS = 1_000
REPLICAS = (BROKER, 2, 3)

Env = tuple[ReplicaManager, Cluster, Clock]


def _manager(logs: LogManager, clock: Clock) -> ReplicaManager:
    return ReplicaManager(BROKER, logs, {"replica.lag.time.max.ms": str(LAG_MS)}, clock_ms=clock)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    clock = Clock()
    logs = LogManager(tmp_path / "data")
    yield _manager(logs, clock), Cluster(), clock
    logs.close()


def state(isr: tuple[int, ...], partition_epoch: int, leader_epoch: int = 0) -> PartitionState:
    return PartitionState(REPLICAS, isr, BROKER, leader_epoch, partition_epoch)


def assignment(s: PartitionState) -> PartitionAssignment:
    return PartitionAssignment(s.leader, s.leader_epoch, s.replicas, s.isr, s.partition_epoch)


def caught_up_fetch(manager: ReplicaManager, replica: int) -> object:
    part = manager.partitions[("t", 0)]
    request = fetch_request("t", 0, part.log_end_offset, replica_id=replica)
    request.topics[0].partitions[0].last_fetched_epoch = -1
    return manager.fetch(request)


async def produce_ok(manager: ReplicaManager) -> bool:
    out = one_produce(await manager.produce(produce_request("t", 0, batch(1))))
    return out.error.code == 0


def test_refusal_that_crossed_a_newer_update_does_not_fence(env: Env) -> None:
    manager, cluster, clock = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [state((BROKER, 2, 3), 0)]))
        await caught_up_fetch(manager, 3)
        clock.now = 5 * LAG_MS  # follower 2 lags
        assert manager.check_isr_lag() == 1
        (shrink,) = manager.take_isr_requests()
        assert (shrink.new_isr, shrink.partition_epoch) == ((BROKER,), 0)
        # Meanwhile the controller changed the ISR itself (partition epoch 1) and the watch
        # delivered it before the refusal of our request (based on epoch 0) came back.
        await manager.apply_metadata(cluster.topic("t", [state((BROKER, 3), 1)]))
        manager.on_isr_change_result(shrink, ErrorCode.INVALID_UPDATE_VERSION.code, None)
        part = manager.partitions[("t", 0)]
        assert part.stale_partition_epoch == -1
        assert await produce_ok(manager)
        # It proposes again at once, from the new state.
        clock.now = 10 * LAG_MS
        assert manager.check_isr_lag() == 1
        (again,) = manager.take_isr_requests()
        assert (again.new_isr, again.partition_epoch) == ((BROKER,), 1)

    run(scenario())


def test_late_refusal_leaves_a_newer_pending_change_alone(env: Env) -> None:
    manager, cluster, clock = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [state((BROKER, 2, 3), 0)]))
        clock.now = 5 * LAG_MS
        assert manager.check_isr_lag() == 1
        (old,) = manager.take_isr_requests()
        await manager.apply_metadata(cluster.topic("t", [state((BROKER, 2), 1)]))
        assert manager.check_isr_lag() == 1  # a new shrink based on epoch 1 is in flight
        (new,) = manager.take_isr_requests()
        assert new.partition_epoch == 1
        manager.on_isr_change_result(old, ErrorCode.INVALID_UPDATE_VERSION.code, None)
        part = manager.partitions[("t", 0)]
        assert part.isr_change_pending and part.stale_partition_epoch == -1
        assert manager.check_isr_lag() == 0  # still one change in flight at a time

    run(scenario())


def test_refusal_carrying_the_newer_committed_state_is_adopted(env: Env) -> None:
    manager, cluster, clock = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [state((BROKER, 2, 3), 0)]))
        clock.now = 5 * LAG_MS
        assert manager.check_isr_lag() == 1
        (shrink,) = manager.take_isr_requests()
        newer = state((BROKER, 2), 4)  # the watch has not delivered it yet
        manager.on_isr_change_result(
            shrink, ErrorCode.INVALID_UPDATE_VERSION.code, assignment(newer)
        )
        part = manager.partitions[("t", 0)]
        assert part.stale_partition_epoch == -1
        assert part.assignment.partition_epoch == 4 and part.assignment.isr == (BROKER, 2)
        assert await produce_ok(manager)
        assert manager.check_isr_lag() == 1
        (again,) = manager.take_isr_requests()
        assert (again.new_isr, again.partition_epoch) == ((BROKER,), 4)
        # The watch then delivers the same state: nothing changes, nothing breaks.
        await manager.apply_metadata(cluster.topic("t", [newer]))
        assert part.isr_change_pending and part.stale_partition_epoch == -1

    run(scenario())


def test_refusal_from_a_lagging_controller_is_retried_not_obeyed(env: Env) -> None:
    manager, cluster, clock = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [state((BROKER, 2, 3), 7)]))
        clock.now = 5 * LAG_MS
        assert manager.check_isr_lag() == 1
        (shrink,) = manager.take_isr_requests()
        behind = state((BROKER, 2, 3), 6)  # e.g. a new controller whose watch is behind
        manager.on_isr_change_result(
            shrink, ErrorCode.INVALID_UPDATE_VERSION.code, assignment(behind)
        )
        part = manager.partitions[("t", 0)]
        assert part.stale_partition_epoch == -1 and part.assignment.partition_epoch == 7
        assert await produce_ok(manager)
        assert manager.check_isr_lag() == 1  # proposed again, same epoch

    run(scenario())


def test_refusal_from_a_controller_that_missed_our_election_is_retried(env: Env) -> None:
    manager, cluster, clock = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [state((BROKER, 2, 3), 5, 2)]))
        clock.now = 5 * LAG_MS
        assert manager.check_isr_lag() == 1
        (shrink,) = manager.take_isr_requests()
        # The controller's image still shows the previous leader (epoch 1, partition epoch 4).
        behind = PartitionAssignment(2, 1, REPLICAS, (2, BROKER, 3), 4)
        manager.on_isr_change_result(shrink, ErrorCode.NOT_LEADER_OR_FOLLOWER.code, behind)
        part = manager.partitions[("t", 0)]
        assert part.stale_partition_epoch == -1 and part.is_leader
        assert await produce_ok(manager)

    run(scenario())


def test_genuinely_stale_leader_waits_for_metadata_newer_than_its_request(env: Env) -> None:
    manager, cluster, clock = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [state((BROKER, 2, 3), 2)]))
        clock.now = 5 * LAG_MS
        assert manager.check_isr_lag() == 1
        (shrink,) = manager.take_isr_requests()
        manager.on_isr_change_result(shrink, ErrorCode.INVALID_UPDATE_VERSION.code, None)
        part = manager.partitions[("t", 0)]
        assert part.stale_partition_epoch == 2
        assert not await produce_ok(manager)
        assert manager.check_isr_lag() == 0
        # A config-only re-delivery of the same partition epoch does not lift the fence.
        await manager.apply_metadata(cluster.topic("t", [state((BROKER, 2, 3), 2)]))
        assert part.stale_partition_epoch == 2
        await manager.apply_metadata(cluster.topic("t", [state((BROKER, 2), 3)]))
        assert part.stale_partition_epoch == -1 and await produce_ok(manager)

    run(scenario())


def test_expansion_is_proposed_again_after_any_number_of_refusals(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [state((BROKER, 2), 0)]))
        for epoch in range(1, 6):
            await caught_up_fetch(manager, 3)
            (expand,) = manager.take_isr_requests()
            assert expand.new_isr == (BROKER, 2, 3)
            # Refused because the controller moved on; the update crosses the refusal.
            manager.on_isr_change_result(
                expand, ErrorCode.INVALID_UPDATE_VERSION.code, assignment(state((BROKER, 2), epoch))
            )
            await manager.apply_metadata(cluster.topic("t", [state((BROKER, 2), epoch)]))
        await caught_up_fetch(manager, 3)
        (expand,) = manager.take_isr_requests()
        assert expand.partition_epoch == 5
        manager.on_isr_change_result(expand, 0, assignment(state((BROKER, 2, 3), 6)))
        assert manager.partitions[("t", 0)].assignment.isr == (BROKER, 2, 3)

    run(scenario())


# --- property: every interleaving heals ------------------------------------------------------

ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("fetch"), st.sampled_from([2, 3])),
        st.tuples(st.just("lag"), st.just(0)),
        st.tuples(st.just("send"), st.booleans()),  # True: the call fails on the way
        st.tuples(st.just("controller_drops"), st.sampled_from([2, 3])),
        st.tuples(st.just("watch"), st.just(0)),
        st.tuples(st.just("answer"), st.just(0)),
    ),
    max_size=40,
)


class Model:
    """The controller (its pure core), the watch stream and the answers in flight."""

    def __init__(self, manager: ReplicaManager, cluster: Cluster, clock: Clock) -> None:
        self.manager = manager
        self.cluster = cluster
        self.clock = clock
        self.controller = state(REPLICAS, 0)
        self.watch: deque[PartitionState] = deque()
        self.answers: deque[tuple[IsrChangeRequest, int, PartitionAssignment | None]] = deque()

    async def deliver_watch(self) -> None:
        s = self.watch.popleft()
        await self.manager.apply_metadata(self.cluster.topic("t", [s]))

    def deliver_answer(self) -> None:
        self.manager.on_isr_change_result(*self.answers.popleft())

    def send(self, fail: bool) -> None:
        for request in self.manager.take_isr_requests():
            if fail:
                self.answers.append((request, ErrorCode.UNKNOWN_SERVER_ERROR.code, None))
                continue
            try:
                new = alter_isr(
                    self.controller,
                    BROKER,
                    request.leader_epoch,
                    request.partition_epoch,
                    list(request.new_isr),
                    set(REPLICAS),
                )
            except FjordError as exc:
                answer = assignment(self.controller)
                self.answers.append((request, exc.code.code, answer))
                continue
            if new is not self.controller:
                self.controller = new
                self.watch.append(new)
            self.answers.append((request, 0, assignment(new)))

    def controller_drops(self, replica: int) -> None:
        if replica in self.controller.isr:
            isr = tuple(r for r in self.controller.isr if r != replica)
            self.controller = PartitionState(
                REPLICAS, isr, BROKER, 0, self.controller.partition_epoch + 1
            )
            self.watch.append(self.controller)


@settings(max_examples=120, deadline=None)
@given(actions=ACTIONS)
def test_every_interleaving_heals(actions: list[tuple[str, object]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        clock = Clock()
        logs = LogManager(Path(tmp) / "data")
        try:
            run(_play(_manager(logs, clock), clock, actions))
        finally:
            logs.close()


async def _play(manager: ReplicaManager, clock: Clock, actions: list[tuple[str, object]]) -> None:
    model = Model(manager, Cluster(), clock)
    await manager.apply_metadata(model.cluster.topic("t", [model.controller]))
    for action, arg in actions:
        if action == "fetch":
            assert isinstance(arg, int)
            await caught_up_fetch(manager, arg)
        elif action == "lag":
            clock.now += 2 * LAG_MS
            manager.check_isr_lag()
        elif action == "send":
            model.send(bool(arg))
        elif action == "controller_drops":
            assert isinstance(arg, int)
            model.controller_drops(arg)
        elif action == "watch" and model.watch:
            await model.deliver_watch()
        elif action == "answer" and model.answers:
            model.deliver_answer()
    # Everything in flight arrives (answers first: the worst case for a crossing refusal).
    while model.answers or model.watch:
        if model.answers:
            model.deliver_answer()
        else:
            await model.deliver_watch()
    part = manager.partitions[("t", 0)]
    assert part.assignment.partition_epoch == model.controller.partition_epoch
    assert part.assignment.isr == model.controller.isr
    assert part.stale_partition_epoch == -1, "a leader with current metadata stays fenced"
    assert await produce_ok(manager)
    # Liveness: with both followers caught up, the ISR becomes full within a few rounds.
    for _ in range(len(REPLICAS) + 2):
        if model.controller.isr == REPLICAS and part.assignment.isr == REPLICAS:
            break
        for replica in (2, 3):
            await caught_up_fetch(manager, replica)
        model.send(False)
        while model.answers or model.watch:
            if model.answers:
                model.deliver_answer()
            else:
                await model.deliver_watch()
    assert set(part.assignment.isr) == set(REPLICAS)
    assert set(model.controller.isr) == set(REPLICAS)
    await asyncio.sleep(0)
