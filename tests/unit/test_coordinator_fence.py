"""Coordinator-epoch fencing of ``__consumer_offsets`` appends: the pure decision
(:class:`CoordinatorEpochFence`), the broker's ReplicaManager applying it to Produce, the
producer carrying the epoch batch by batch. The coordinator's GroupManager reacting to a
fenced append is in test_coordinator_manager.py, the real-process zombie (SIGSTOP past the
lease) in tests/integration/test_coordinator_service.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord._proto import broker_pb2
from fjord.broker.coordinator_fence import CoordinatorEpochFence
from fjord.client.accumulator import RecordAccumulator
from fjord.client.producer import build_produce_request
from fjord.client.types import TopicPartition
from fjord.errors import CoordinatorFencedError, ErrorCode, FjordError, InvalidTopicError
from fjord.groups.defaults import OFFSETS_TOPIC
from fjord.metadata import OffsetsOwner
from fjord.records import BatchBuilder, decode_records
from tests.helpers.replica_manager import (
    Env,
    batch,
    env,
    fetch_request,
    leader_state,
    one_fetch,
    one_produce,
    produce_request,
    run,
)

__all__ = ["env"]  # the fixture, used by name


# --- the pure decision ----------------------------------------------------------------------


def test_older_epoch_than_metadata_or_seen_is_refused() -> None:
    fence = CoordinatorEpochFence()
    fence.admit(3, 4, known_epoch=4)
    with pytest.raises(CoordinatorFencedError) as stale:
        fence.admit(3, 3, known_epoch=4)
    assert stale.value.code is ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert not stale.value.retriable
    assert "epoch 3" in str(stale.value) and "epoch 4" in str(stale.value)
    # The new owner's epoch arrives before the leader's metadata shows it: learned from the
    # append, and the old owner is refused even though the metadata still names it.
    fence.admit(3, 5, known_epoch=4)
    with pytest.raises(CoordinatorFencedError):
        fence.admit(3, 4, known_epoch=4)
    assert fence.newest(3) == 5
    fence.admit(7, 1, known_epoch=None)  # partitions are independent
    assert fence.newest(7) == 1
    fence.forget(3)
    assert fence.newest(3) is None


def test_an_append_without_a_coordinator_epoch_is_refused() -> None:
    fence = CoordinatorEpochFence()
    for epoch in (0, -1):
        with pytest.raises(InvalidTopicError, match="__consumer_offsets: only its coordinator"):
            fence.admit(0, epoch, known_epoch=None)
    assert fence.newest(0) is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(-1, 8), st.one_of(st.none(), st.integers(1, 8))),
        max_size=40,
    )
)
def test_admitted_epochs_never_go_back(
    appends: list[tuple[int, int, int | None]],
) -> None:
    """Whatever order appends and metadata arrive in, each partition admits a non-decreasing
    sequence of epochs, none below the metadata of its moment, and refuses exactly the
    appends below the newest admitted or known epoch."""
    fence = CoordinatorEpochFence()
    admitted: dict[int, list[int]] = {}
    for partition, epoch, known in appends:
        floor = max([*admitted.get(partition, []), known or 0])
        try:
            fence.admit(partition, epoch, known)
        except FjordError as exc:
            assert epoch <= 0 or epoch < floor
            assert exc.code is (
                ErrorCode.INVALID_TOPIC_EXCEPTION
                if epoch <= 0
                else ErrorCode.TRANSACTION_COORDINATOR_FENCED
            )
            continue
        assert epoch > 0 and epoch >= floor
        admitted.setdefault(partition, []).append(epoch)
    for epochs in admitted.values():
        assert epochs == sorted(epochs)


# --- the broker's ReplicaManager ------------------------------------------------------------


def test_leader_refuses_a_zombie_coordinators_append(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        cluster.topic(OFFSETS_TOPIC, [leader_state(), leader_state()])
        owner = cluster.keys.offsets_owner(1)
        await manager.apply_metadata(cluster.change([(owner, OffsetsOwner(1, 2).to_json())]))

        def produce(epoch: int) -> broker_pb2.ProduceRequest:
            return produce_request(OFFSETS_TOPIC, 1, batch(1), coordinator_epoch=epoch)

        first = one_produce(await manager.produce(produce(2)))
        assert (first.error.code, first.base_offset) == (0, 0)
        # The controller moves the partition (epoch 3); the new owner writes, then the old
        # owner's late append comes in: refused, nothing written.
        await manager.apply_metadata(cluster.change([(owner, OffsetsOwner(2, 3).to_json())]))
        assert one_produce(await manager.produce(produce(3))).base_offset == 1
        late = one_produce(await manager.produce(produce(2)))
        assert late.error.code == ErrorCode.TRANSACTION_COORDINATOR_FENCED.code
        assert late.base_offset == -1 and "epoch 2" in late.error.message
        # A plain producer may not write the topic at all; other partitions are independent.
        plain = one_produce(await manager.produce(produce(0)))
        assert plain.error.code == ErrorCode.INVALID_TOPIC_EXCEPTION.code
        other = produce_request(OFFSETS_TOPIC, 0, batch(1), coordinator_epoch=1)
        assert one_produce(await manager.produce(other)).error.code == 0
        fetched = one_fetch(await manager.fetch(fetch_request(OFFSETS_TOPIC, 1, 0)))
        assert [r.offset for r in decode_records(fetched.records)] == [0, 1]

    run(scenario())


def test_leader_learns_a_newer_epoch_before_its_metadata_does(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        cluster.topic(OFFSETS_TOPIC, [leader_state()])
        owner = cluster.keys.offsets_owner(0)
        await manager.apply_metadata(cluster.change([(owner, OffsetsOwner(1, 1).to_json())]))
        newer = produce_request(OFFSETS_TOPIC, 0, batch(1), coordinator_epoch=2)
        assert one_produce(await manager.produce(newer)).error.code == 0
        stale = produce_request(OFFSETS_TOPIC, 0, batch(1), coordinator_epoch=1)
        refused = one_produce(await manager.produce(stale))
        assert refused.error.code == ErrorCode.TRANSACTION_COORDINATOR_FENCED.code

    run(scenario())


def test_user_topics_are_not_fenced(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state()]))
        for epoch in (0, 5, 1):
            answer = one_produce(
                await manager.produce(produce_request("t", 0, batch(1), coordinator_epoch=epoch))
            )
            assert answer.error.code == 0

    run(scenario())


# --- the producer carries the epoch -----------------------------------------------------------


def test_producer_batches_and_requests_carry_one_coordinator_epoch() -> None:
    tp = TopicPartition(OFFSETS_TOPIC, 4)
    acc = RecordAccumulator(
        lambda: BatchBuilder(batch_size=1 << 20),
        batch_size=1 << 20,
        linger_ms=0,
        buffer_memory=1 << 24,
        delivery_timeout_ms=60_000,
    )
    for epoch in (3, 3, 4, 4):
        acc.append(tp, 1, b"k", b"v", (), 0, coordinator_epoch=epoch)
    first = acc.drain([tp], 1 << 20, 10)
    assert [(b.coordinator_epoch, b.record_count) for b in first] == [(3, 2)]
    request = build_produce_request(first, -1, 1000)
    assert request.topics[0].partitions[0].coordinator_epoch == 3
    second = acc.drain([tp], 1 << 20, 10)
    assert [(b.coordinator_epoch, b.record_count) for b in second] == [(4, 2)]
    with pytest.raises(ValueError, match="different coordinator epochs"):
        build_produce_request([*first, *second], -1, 1000)


def test_a_claim_admits_the_epoch_and_appends_nothing(env: Env) -> None:
    """A new owner claims its partition before replaying it (a produce with its epoch and no
    records): from then on the older owner is refused even if the leader's metadata lags, and
    the answer is the log end the replay must reach."""
    manager, cluster, _ = env

    async def scenario() -> None:
        cluster.topic(OFFSETS_TOPIC, [leader_state()])
        owner = cluster.keys.offsets_owner(0)
        await manager.apply_metadata(cluster.change([(owner, OffsetsOwner(1, 1).to_json())]))
        written = produce_request(OFFSETS_TOPIC, 0, batch(3), coordinator_epoch=1)
        assert one_produce(await manager.produce(written)).error.code == 0
        claim = one_produce(
            await manager.produce(produce_request(OFFSETS_TOPIC, 0, b"", coordinator_epoch=2))
        )
        assert (claim.error.code, claim.base_offset) == (0, 3)
        assert manager.partitions[(OFFSETS_TOPIC, 0)].log_end_offset == 3  # nothing written
        late = one_produce(await manager.produce(written))
        assert late.error.code == ErrorCode.TRANSACTION_COORDINATOR_FENCED.code
        for epoch, code in ((1, ErrorCode.TRANSACTION_COORDINATOR_FENCED), (0, None)):
            stale = one_produce(
                await manager.produce(
                    produce_request(OFFSETS_TOPIC, 0, b"", coordinator_epoch=epoch)
                )
            )
            expected = code or ErrorCode.INVALID_TOPIC_EXCEPTION
            assert (stale.error.code, stale.base_offset) == (expected.code, -1)

    run(scenario())


def test_a_claim_on_a_follower_is_not_leader(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic(OFFSETS_TOPIC, [leader_state((2, 1), leader=2)]))
        claim = one_produce(
            await manager.produce(produce_request(OFFSETS_TOPIC, 0, b"", coordinator_epoch=5))
        )
        assert claim.error.code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code
        assert manager.coordinator_fence.newest(0) is None

    run(scenario())
