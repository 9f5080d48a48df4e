"""Incremental fetch sessions (KIP-227): the pure core (fjord.broker.fetch_session) and the
leader's ReplicaManager answering session fetches over real logs.

The property both check: after every successful fetch, what the fetcher holds for each of its
partitions (the last answer it got for it) equals what a full fetch would answer now, although
incremental fetches name only changed partitions and answer only partitions with news; and any
failure (eviction, a wrong epoch, a lost answer) costs one full fetch, never a wrong view.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fjord._proto import broker_pb2
from fjord.broker.fetch_session import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    NO_SESSION,
    FetchSessionCache,
    FetchSessionError,
    FetchSessionHandler,
    has_news,
)
from fjord.broker.replica_manager import ReplicaManager
from fjord.errors import ErrorCode
from fjord.metadata import BrokerRegistration, PartitionState
from fjord.storage import LogManager
from tests.helpers.replica_manager import (
    BROKER,
    Clock,
    Cluster,
    batch,
    leader_state,
    run,
    until_parked,
)

KEYS = [("t", n) for n in range(5)]


# --- the pure core -------------------------------------------------------------------------


class Leader:
    """A leader as the shell uses the cache: partition states change (and are touched), a
    fetch looks at requested + dirty partitions (all of them when full) and answers news."""

    def __init__(self, cache: FetchSessionCache[Any, int]) -> None:
        self.cache = cache
        self.state = dict.fromkeys(KEYS, 0)

    def change(self, key: Any) -> None:
        self.state[key] += 1
        self.cache.touch(key)

    def fetch(self, session_id: int, epoch: int, to_send: dict[Any, int],
              forgotten: tuple[Any, ...]) -> tuple[int, int, dict[Any, int]]:
        """(error code, session id, answered partitions -> state)."""
        try:
            ctx = self.cache.new_context(session_id, epoch, to_send, forgotten, now=0.0)
        except FetchSessionError as exc:
            return exc.code.code, NO_SESSION, {}
        session = ctx.session
        if session is None:
            return 0, NO_SESSION, {k: self.state[k] for k in to_send}
        look = set(session.partitions) if ctx.full else set(to_send) | session.dirty
        session.dirty = set()
        answer = {}
        for key in look:
            cached = session.partitions.get(key)
            if cached is None:
                continue
            if ctx.full or has_news(cached, self.state[key], False):
                answer[key] = self.state[key]
            cached.sent_state = self.state[key]
        return 0, session.session_id, answer


step = st.one_of(
    st.tuples(st.just("change"), st.sampled_from(KEYS)),
    st.tuples(st.just("want"), st.dictionaries(st.sampled_from(KEYS), st.integers(0, 3))),
    st.tuples(st.just("fetch"), st.just(None)),
    st.tuples(st.just("evict"), st.just(None)),
    st.tuples(st.just("lose_answer"), st.just(None)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=40), st.booleans())
def test_incremental_view_always_equals_the_full_view(steps: list[Any], tiny: bool) -> None:
    cache: FetchSessionCache[Any, int] = FetchSessionCache(max_sessions=1 if tiny else 10)
    leader = Leader(cache)
    handler: FetchSessionHandler[Any, int] = FetchSessionHandler()
    wanted: dict[Any, int] = dict.fromkeys(KEYS, 0)
    view: dict[Any, int] = {}
    for kind, arg in steps:
        if kind == "change":
            leader.change(arg)
        elif kind == "want":
            wanted = arg
        elif kind == "evict":
            for session in cache.sessions():
                cache.remove(session.session_id)
            # a stranger's session may take the only slot
            cache.new_context(NO_SESSION, INITIAL_EPOCH, {}, (), now=0.0)
        else:
            plan = handler.build(wanted)
            code, session_id, answer = leader.fetch(
                plan.session_id, plan.epoch, plan.to_send, plan.forgotten
            )
            if kind == "lose_answer":
                handler.reset()  # the call failed after the leader handled it
                continue
            if not handler.on_response(plan, code, session_id):
                assert code in (ErrorCode.FETCH_SESSION_ID_NOT_FOUND.code,
                                ErrorCode.INVALID_FETCH_SESSION_EPOCH.code)
                assert handler.session_id == NO_SESSION
                continue
            assert set(answer) <= set(wanted)
            if plan.full:
                assert set(answer) == set(wanted)
                view = {}
            view.update(answer)
            for key in list(view):
                if key not in wanted:
                    del view[key]
            assert view == {k: leader.state[k] for k in wanted}
            session = cache.get(handler.session_id)
            if session is not None:
                assert set(session.partitions) == set(wanted)


def test_errors_and_epochs() -> None:
    cache: FetchSessionCache[Any, int] = FetchSessionCache(max_sessions=2, new_id=iter(
        [7, 7, 8, 9]).__next__)
    ctx = cache.new_context(NO_SESSION, INITIAL_EPOCH, {KEYS[0]: 1}, (), now=0.0)
    assert ctx.full and ctx.session_id == 7
    with pytest.raises(FetchSessionError) as wrong:
        cache.new_context(7, 5, {}, (), now=0.0)
    assert wrong.value.code is ErrorCode.INVALID_FETCH_SESSION_EPOCH
    with pytest.raises(FetchSessionError) as unknown:
        cache.new_context(99, 1, {}, (), now=0.0)
    assert unknown.value.code is ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert not cache.new_context(7, 1, {}, (), now=0.0).full  # epoch 1 continues it
    # An id already taken is drawn again; the least recently used session makes room.
    assert cache.new_context(NO_SESSION, INITIAL_EPOCH, {}, (), now=0.0).session_id == 8
    assert cache.new_context(NO_SESSION, INITIAL_EPOCH, {}, (), now=0.0).session_id == 9
    assert cache.get(7) is None and len(cache) == 2
    # FINAL closes a session and answers without one.
    ctx = cache.new_context(8, FINAL_EPOCH, {KEYS[1]: 0}, (), now=0.0)
    assert ctx.session is None and ctx.full and cache.get(8) is None


def test_one_session_per_owner_and_no_session_without_slots() -> None:
    cache: FetchSessionCache[Any, int] = FetchSessionCache()
    first = cache.new_context(NO_SESSION, INITIAL_EPOCH, {KEYS[0]: 0}, (), 0.0, owner="r2")
    second = cache.new_context(NO_SESSION, INITIAL_EPOCH, {KEYS[0]: 0}, (), 0.0, owner="r2")
    assert cache.get(first.session_id) is None and cache.get(second.session_id) is not None
    cache.touch(KEYS[0])
    assert second.session is not None and second.session.dirty == {KEYS[0]}
    none = FetchSessionCache[Any, int](max_sessions=0)
    assert none.new_context(NO_SESSION, INITIAL_EPOCH, {}, (), 0.0).session is None


def test_handler_without_sessions_always_fetches_everything() -> None:
    handler: FetchSessionHandler[Any, int] = FetchSessionHandler(use_sessions=False)
    plan = handler.build({KEYS[0]: 1})
    assert plan.epoch == FINAL_EPOCH and plan.to_send == {KEYS[0]: 1}
    assert handler.on_response(plan, 0, 5)
    assert handler.build({KEYS[0]: 1}).to_send == {KEYS[0]: 1}


# --- the leader's ReplicaManager -----------------------------------------------------------

PARTITIONS = 4


def session_request(plan: Any, max_bytes: int = 1 << 20) -> broker_pb2.FetchRequest:
    request = broker_pb2.FetchRequest(
        replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=max_bytes,
        session_id=plan.session_id, session_epoch=plan.epoch,
    )
    for (topic, number), offset in sorted(plan.to_send.items()):
        request.topics.add(name=topic).partitions.add(
            partition=number, fetch_offset=offset, partition_max_bytes=1 << 20,
            current_leader_epoch=-1,
        )
    for topic, number in plan.forgotten:
        request.forgotten.add(name=topic, partitions=[number])
    return request


def answers(response: broker_pb2.FetchResponse) -> dict[tuple[str, int], tuple[Any, ...]]:
    return {
        (t.name, p.partition): (p.error.code, p.high_watermark, p.log_start_offset,
                                p.leader_id, p.leader_epoch, bytes(p.records))
        for t in response.topics
        for p in t.partitions
    }


manager_step = st.one_of(
    st.tuples(st.just("produce"), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("position"), st.integers(0, PARTITIONS - 1), st.integers(0, 6)),
    st.tuples(st.just("drop"), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("delete_records"), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("fetch")),
    st.tuples(st.just("evict")),
)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(manager_step, min_size=1, max_size=25))
def test_replica_manager_session_answers_equal_full_answers(
    tmp_path_factory: pytest.TempPathFactory, steps: list[Any]
) -> None:
    """A consumer-style session against a real leader: after every fetch, the partitions it
    holds (answers applied in turn) equal a sessionless full fetch of the same positions."""
    logs = LogManager(tmp_path_factory.mktemp("session") / "data")
    manager = ReplicaManager(BROKER, logs)
    cluster = Cluster()

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state()] * PARTITIONS))
        handler: FetchSessionHandler[Any, int] = FetchSessionHandler()
        positions = {("t", n): 0 for n in range(PARTITIONS)}
        view: dict[Any, tuple[Any, ...]] = {}
        for kind, *args in steps:
            if kind == "produce":
                request = broker_pb2.ProduceRequest(acks=1, timeout_ms=1000)
                request.topics.add(name="t").partitions.add(partition=args[0], records=batch(2))
                await manager.produce(request)
            elif kind == "position":
                positions[("t", args[0])] = args[1]
            elif kind == "drop":
                positions.pop(("t", args[0]), None)
            elif kind == "delete_records":
                part = manager.partitions[("t", args[0])]
                if part.high_watermark > part.log_start_offset:
                    manager.delete_records("t", args[0], part.log_start_offset + 1)
            elif kind == "evict":
                for session in manager._fetch_sessions.sessions():
                    manager._fetch_sessions.remove(session.session_id)
            else:
                plan = handler.build(positions)
                response = await manager.fetch(session_request(plan), open_session=True)
                if not handler.on_response(plan, response.error.code, response.session_id):
                    continue
                got = answers(response)
                assert set(got) <= set(positions)
                view = got if plan.full else {**view, **got}
                view = {k: v for k, v in view.items() if k in positions}
                full = broker_pb2.FetchRequest(
                    replica_id=-1, max_wait_ms=0, max_bytes=1 << 20,
                    session_epoch=FINAL_EPOCH,
                )
                for (topic, number), offset in sorted(positions.items()):
                    full.topics.add(name=topic).partitions.add(
                        partition=number, fetch_offset=offset, partition_max_bytes=1 << 20,
                        current_leader_epoch=-1,
                    )
                expected = answers(await manager.fetch(full))
                # Records are news only once: a full fetch repeats them, the session does not
                # (the fetcher moves its position). Compare the states, and the records the
                # session sent with the full fetch's.
                for key, full_answer in expected.items():
                    assert view[key][:5] == full_answer[:5], key
                    if key in got and got[key][5]:
                        assert got[key][5] == full_answer[5]
                    elif full_answer[5]:
                        # not sent again: it was sent before at this same position
                        assert view[key][5] == full_answer[5]

    try:
        run(scenario())
    finally:
        logs.close()


def test_idle_follower_session_keeps_the_follower_in_the_isr(tmp_path: Any) -> None:
    """A follower whose incremental fetches name nothing (idle) still counts as caught up on
    every partition of its session (the leader refreshes that every third of
    replica.lag.time.max.ms); once it stops fetching, the ISR check drops it."""
    logs = LogManager(tmp_path / "data")
    clock = Clock()
    lag_ms = 3_000
    manager = ReplicaManager(BROKER, logs, {"replica.lag.time.max.ms": str(lag_ms)},
                             clock_ms=clock)
    cluster = Cluster()
    states = [PartitionState((BROKER, 2), (BROKER, 2), BROKER, 0, 0)] * PARTITIONS

    def follower_request(plan: Any) -> broker_pb2.FetchRequest:
        request = session_request(plan)
        request.replica_id = 2
        for topic in request.topics:
            for p in topic.partitions:
                p.current_leader_epoch = 0
        return request

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", states))
        handler: FetchSessionHandler[Any, int] = FetchSessionHandler()
        positions = {("t", n): 0 for n in range(PARTITIONS)}
        for _ in range(12):  # 12 fetches, 1 s apart: 4 x replica.lag.time.max.ms
            plan = handler.build(positions)
            response = await manager.fetch(follower_request(plan))
            assert handler.on_response(plan, response.error.code, response.session_id)
            assert plan.full or answers(response) == {}  # idle: nothing named, nothing news
            clock.now += 1_000
            assert manager.check_isr_lag() == 0
        clock.now += lag_ms + 1  # it stopped fetching
        assert manager.check_isr_lag() == PARTITIONS

    try:
        run(scenario())
    finally:
        logs.close()


def test_follower_fetch_that_advances_the_high_watermark_parks_after_one_pass(
    tmp_path: Any,
) -> None:
    """A follower's session fetch that moves the high watermark (its offset is past the last
    append) and has nothing new to read parks after its first pass: the high watermark it
    moved is already in that pass's answer, so its own touch does not send it round again.
    An append then wakes it (one more pass) and it is answered with the records and the new
    high watermark; a consumer session holding the partition is still touched by the
    advance."""
    logs = LogManager(tmp_path / "data")
    manager = ReplicaManager(BROKER, logs)
    cluster = Cluster()
    passes: list[int] = []
    fetch_once = manager._fetch_once

    async def counting_fetch_once(*args: Any, **kwargs: Any) -> Any:
        passes.append(1)
        return await fetch_once(*args, **kwargs)

    manager._fetch_once = counting_fetch_once  # type: ignore[method-assign]

    def follower_request(plan: Any, max_wait_ms: int) -> broker_pb2.FetchRequest:
        request = session_request(plan)
        request.replica_id = 2
        request.max_wait_ms = max_wait_ms
        request.min_bytes = 1
        for topic in request.topics:
            for p in topic.partitions:
                p.current_leader_epoch = 0
        return request

    async def produce() -> None:
        request = broker_pb2.ProduceRequest(acks=1, timeout_ms=1000)
        request.topics.add(name="t").partitions.add(partition=0, records=batch(2))
        await manager.produce(request)

    async def scenario() -> None:
        await manager.apply_metadata(
            cluster.topic("t", [PartitionState((BROKER, 2), (BROKER, 2), BROKER, 0, 0)])
        )
        await produce()  # offsets 0-1; the high watermark waits for the follower
        consumer: FetchSessionHandler[Any, int] = FetchSessionHandler()
        consumer_plan = consumer.build({("t", 0): 0})
        opened = await manager.fetch(session_request(consumer_plan), open_session=True)
        assert consumer.on_response(consumer_plan, opened.error.code, opened.session_id)
        handler: FetchSessionHandler[Any, int] = FetchSessionHandler()
        plan = handler.build({("t", 0): 0})
        first = await manager.fetch(follower_request(plan, 0))
        assert handler.on_response(plan, first.error.code, first.session_id)
        assert answers(first)[("t", 0)][1] == 0 and answers(first)[("t", 0)][5]  # hw 0, data
        passes.clear()
        plan = handler.build({("t", 0): 2})  # it holds 0-1 now: the high watermark moves to 2
        waiting = asyncio.ensure_future(manager.fetch(follower_request(plan, 10_000)))
        await until_parked(manager, fetches=1)
        assert manager.partitions[("t", 0)].high_watermark == 2
        assert len(passes) == 1  # parked after one pass (two before the change)
        consumer_session = next(s for s in manager._fetch_sessions.sessions()
                                if s.session_id == opened.session_id)
        assert ("t", 0) in consumer_session.dirty  # the other session still learns of it
        await produce()  # offsets 2-3: wakes the parked fetch
        answered = await asyncio.wait_for(waiting, 10)
        assert handler.on_response(plan, answered.error.code, answered.session_id)
        got = answers(answered)[("t", 0)]
        assert got[1] == 2 and got[5]  # the moved high watermark and the new records
        assert len(passes) == 2

    try:
        run(scenario())
    finally:
        logs.close()


def test_a_high_watermark_moved_by_one_follower_does_not_wake_the_others_parked_fetch(
    tmp_path: Any,
) -> None:
    """Two followers, both caught up and parked. The second follower's fetch moves the high
    watermark: the first follower's parked fetch is not woken for it (it waits for bytes and
    a high watermark alone does not answer it; woken, it ran a pass that answered nothing);
    its session is marked, and the next append answers it with the records and the moved
    high watermark."""
    logs = LogManager(tmp_path / "data")
    manager = ReplicaManager(BROKER, logs)
    cluster = Cluster()
    passes: dict[int, int] = {2: 0, 3: 0}
    fetch_once = manager._fetch_once

    async def counting_fetch_once(request: Any, *args: Any, **kwargs: Any) -> Any:
        passes[request.replica_id] += 1
        return await fetch_once(request, *args, **kwargs)

    manager._fetch_once = counting_fetch_once  # type: ignore[method-assign]
    handlers: dict[int, FetchSessionHandler[Any, int]] = {
        2: FetchSessionHandler(), 3: FetchSessionHandler()
    }

    async def follower_fetch(replica: int, offset: int, max_wait_ms: int) -> Any:
        plan = handlers[replica].build({("t", 0): offset})
        request = session_request(plan)
        request.replica_id = replica
        request.max_wait_ms = max_wait_ms
        request.min_bytes = 1
        request.topics[0].partitions[0].current_leader_epoch = 0
        response = await manager.fetch(request)
        assert handlers[replica].on_response(plan, response.error.code, response.session_id)
        return answers(response).get(("t", 0))

    async def produce() -> None:
        request = broker_pb2.ProduceRequest(acks=1, timeout_ms=1000)
        request.topics.add(name="t").partitions.add(partition=0, records=batch(2))
        await manager.produce(request)

    async def scenario() -> None:
        replicas = (BROKER, 2, 3)
        await manager.apply_metadata(
            cluster.topic("t", [PartitionState(replicas, replicas, BROKER, 0, 0)])
        )
        partition = manager.partitions[("t", 0)]
        await produce()  # offsets 0-1
        for replica in (2, 3):
            got = await follower_fetch(replica, 0, 0)
            assert got is not None and got[5]  # the records
        third = asyncio.ensure_future(follower_fetch(3, 2, 10_000))
        await until_parked(manager, fetches=1)
        assert partition.high_watermark == 0  # follower 2 has not confirmed 0-1 yet
        before = passes[3]
        second = asyncio.ensure_future(follower_fetch(2, 2, 10_000))
        await until_parked(manager, fetches=2)
        assert partition.high_watermark == 2  # moved by follower 2's fetch
        assert passes[3] == before  # follower 3's parked fetch was not woken for it
        session_3 = next(s for s in manager._fetch_sessions.sessions() if s.owner == ("replica", 3))
        assert ("t", 0) in session_3.dirty
        await produce()  # offsets 2-3: both wake
        for waiting in (third, second):
            got = await asyncio.wait_for(waiting, 10)
            assert got is not None and got[1] == 2 and got[5]

    try:
        run(scenario())
    finally:
        logs.close()


#: Every partition led here with broker 2 a replica out of the ISR (leader epoch 0).
FOLLOWER_STATES = [PartitionState((BROKER, 2), (BROKER,), BROKER, 0, 0)] * PARTITIONS


def follower_leader(
    tmp_path: Any, registered: bool
) -> tuple[LogManager, Clock, ReplicaManager, Cluster]:
    """The leader of FOLLOWER_STATES' partitions (replica.lag.time.max.ms 10 s, fetch backoff
    100 ms) in a cluster where broker 2 is registered or not yet."""
    logs = LogManager(tmp_path / "data")
    clock = Clock()
    manager = ReplicaManager(BROKER, logs, {"replica.lag.time.max.ms": "10000",
                                            "replica.fetch.backoff.ms": "100"}, clock_ms=clock)
    cluster = Cluster()
    if registered:
        cluster.change([(cluster.keys.broker(2), BrokerRegistration(2, "h", 2).to_json())])
    return logs, clock, manager, cluster


def follower_request(plan: Any, replica_epoch: int | None = None) -> broker_pb2.FetchRequest:
    """A session fetch of ``plan`` from follower 2 at leader epoch 0, carrying
    ``replica_epoch`` (its broker epoch; None: the field left unset)."""
    request = session_request(plan)
    request.replica_id = 2
    if replica_epoch is not None:
        request.replica_epoch = replica_epoch
    for topic in request.topics:
        for p in topic.partitions:
            p.current_leader_epoch = 0
    return request


def test_a_restarted_follower_rejoins_the_isr_once_its_registration_is_known(
    tmp_path: Any,
) -> None:
    """A restarted follower fetches before the leader's metadata shows its new registration:
    those fetches are served but count for nothing (KIP-903). Once the leader learns the
    registration, the follower's next incremental fetch, which names no partition (idle, its
    offsets did not move), brings the ISR expansion of every partition, not the session's
    next full pass (2 x replica.lag.time.max.ms later)."""
    logs, clock, manager, cluster = follower_leader(tmp_path, registered=True)

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", FOLLOWER_STATES))
        old_epoch = cluster.image.broker_epoch(2)
        assert old_epoch is not None
        new_epoch = cluster.revision + 1  # its next registration, not yet seen here
        handler: FetchSessionHandler[Any, int] = FetchSessionHandler()
        positions = {("t", n): 0 for n in range(PARTITIONS)}
        plan = handler.build(positions)
        response = await manager.fetch(follower_request(plan, new_epoch))
        assert plan.full and handler.on_response(plan, response.error.code, response.session_id)
        assert manager.take_isr_requests() == []  # an unknown incarnation proves nothing
        image = cluster.change([(cluster.keys.broker(2), BrokerRegistration(2, "h", 2).to_json())])
        assert image.broker_epoch(2) == new_epoch
        await manager.apply_metadata(image)
        clock.now += 1_000
        plan = handler.build(positions)
        assert not plan.full and plan.to_send == {}
        response = await manager.fetch(follower_request(plan, new_epoch))
        assert handler.on_response(plan, response.error.code, response.session_id)
        requested = manager.take_isr_requests()
        assert sorted(r.partition for r in requested) == list(range(PARTITIONS))
        assert all(tuple(r.new_isr) == (BROKER, 2) for r in requested)

    try:
        run(scenario())
    finally:
        logs.close()


def test_a_refused_expansion_is_proposed_again_on_an_idle_session(tmp_path: Any) -> None:
    """The controller refuses an ISR expansion (the restarted follower is not live in its view
    yet): the leader proposes it again on the follower's next incremental fetch, though that
    fetch names no partition, instead of at the session's next full pass."""
    logs, _clock, manager, cluster = follower_leader(tmp_path, registered=False)

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", FOLLOWER_STATES))
        handler: FetchSessionHandler[Any, int] = FetchSessionHandler()
        positions = {("t", n): 0 for n in range(PARTITIONS)}
        plan = handler.build(positions)
        response = await manager.fetch(follower_request(plan))
        assert handler.on_response(plan, response.error.code, response.session_id)
        proposed = manager.take_isr_requests()
        assert len(proposed) == PARTITIONS
        for request in proposed:
            manager.on_isr_change_result(request, ErrorCode.INELIGIBLE_REPLICA.code, None)
        plan = handler.build(positions)
        assert not plan.full and plan.to_send == {}
        refetch = follower_request(plan)
        refetch.min_bytes, refetch.max_wait_ms = 1, 500  # parked: looked at after the backoff
        response = await manager.fetch(refetch)
        assert handler.on_response(plan, response.error.code, response.session_id)
        again = manager.take_isr_requests()
        assert sorted(r.partition for r in again) == list(range(PARTITIONS))

    try:
        run(scenario())
    finally:
        logs.close()


def test_a_follower_that_registers_after_its_first_fetch_rejoins_the_isr_at_once(
    tmp_path: Any,
) -> None:
    """A restarted broker's fetcher starts before its registration: its first fetch carries
    no broker epoch (-1) and counts for nothing. Its next fetch, incremental and naming no
    partition (idle), carries its registered epoch: the leader looks at every partition of
    the session again and proposes the ISR expansions (before: at the next full pass)."""
    logs, clock, manager, cluster = follower_leader(tmp_path, registered=True)

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", FOLLOWER_STATES))
        registered = cluster.image.broker_epoch(2)
        assert registered is not None
        handler: FetchSessionHandler[Any, int] = FetchSessionHandler()
        positions = {("t", n): 0 for n in range(PARTITIONS)}
        plan = handler.build(positions)
        response = await manager.fetch(follower_request(plan, -1))
        assert plan.full and handler.on_response(plan, response.error.code, response.session_id)
        assert manager.take_isr_requests() == []
        clock.now += 1_000
        plan = handler.build(positions)
        assert not plan.full and plan.to_send == {}
        response = await manager.fetch(follower_request(plan, registered))
        assert handler.on_response(plan, response.error.code, response.session_id)
        assert sorted(r.partition for r in manager.take_isr_requests()) == list(range(PARTITIONS))

    try:
        run(scenario())
    finally:
        logs.close()
