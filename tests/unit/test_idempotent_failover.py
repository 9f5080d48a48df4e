"""The idempotent producer's client core against two broker replicas through leader changes.

Chaos finding 4 (docs/chaos.md): requests held by a deposed leader (its answer waits, or never
comes) while the producer already writes newer batches of the same partition to the new leader.
When the held batches finally fail and are retried, the new leader must still recognise them as
duplicates: it remembers only the last 5 batches per producer (BATCHES_PER_PRODUCER), so the
producer may never have more than 5 batches of a partition outstanding from its oldest
unacknowledged one, whichever brokers they went to.

The model is tests/helpers/idempotence.py's (shared with the single-leader tests): two
replicas, each a real ProducerStateManager plus a list of (header, values) as its log; the
follower copies a prefix of the leader's log, a fail-over makes it leader with only what it
copied and truncates the old leader to that prefix; acks=all: a success is final only after the
follower copied the batch. The client side is the real RecordAccumulator, IdempotenceState and
handle_produce_results with at most 5 requests in flight PER BROKER, as the sender does.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fjord.broker.producer_state import BATCHES_PER_PRODUCER
from fjord.client.accumulator import (
    IdempotenceState,
    PartitionResult,
    RecordAccumulator,
    handle_produce_results,
)
from fjord.errors import ConfigError, ErrorCode, KafkaTimeoutError
from fjord.records.builder import BatchBuilder
from tests.helpers.idempotence import MAX_IN_FLIGHT, TP, IdempotenceHarness, Replica


def test_held_requests_of_a_deposed_leader_are_recognised_by_the_new_one() -> None:
    """Finding 4, deterministically: 5 batches appended by leader 0 and copied by replica 1,
    their answers held while leadership moves to replica 1. Before the fix the producer sent
    newer batches to replica 1 meanwhile, so the retried oldest batch was older than the 5
    batches replica 1 remembers: OUT_OF_ORDER_SEQUENCE, an epoch bump and duplicates."""
    harness = IdempotenceHarness(replicas=2)
    for _ in range(MAX_IN_FLIGHT):
        harness.send(4)
        harness.drain()
    assert len(harness.in_flight) == MAX_IN_FLIGHT
    for _ in range(MAX_IN_FLIGHT):
        harness.arrive(0)  # in send order
    harness.replicate(1 << 20)  # replica 1 holds all five, the answers are still held
    harness.fail_over()
    for _ in range(4):  # more records while the deposed leader's answers are held
        harness.send(4)
        harness.drain()
        harness.arrive(0)  # anything sent to the new leader arrives there
        harness.replicate(1 << 20)
    # Nothing newer may be outstanding beyond the broker's memory of 5 batches.
    assert len(harness.idem.window[TP]) <= BATCHES_PER_PRODUCER
    harness.settle()
    assert harness.idem.producer_epoch == 0  # no batch failed, no epoch bump
    harness.check()


def test_window_holds_back_new_batches_until_the_oldest_is_answered() -> None:
    harness = IdempotenceHarness(replicas=2)
    for _ in range(MAX_IN_FLIGHT + 2):
        harness.send(4)
        harness.drain()
    assert len(harness.in_flight) == MAX_IN_FLIGHT
    harness.fail_over()  # the client now sends to replica 1: the per-broker limit is free
    harness.drain()
    assert len(harness.in_flight) == MAX_IN_FLIGHT  # but the partition's window is full
    for _ in range(MAX_IN_FLIGHT):
        harness.arrive(0)  # replica 0 is no longer leader: NOT_LEADER for all
    harness.answer(0, lost=False)
    harness.drain()
    # Only the retry of the oldest batch went out (to the new leader), nothing new.
    assert [r.batches[0].base_sequence for r in harness.in_flight if r.node == 1] == [0]
    harness.settle()
    harness.check()


def test_a_later_batch_answered_first_keeps_the_window_from_moving() -> None:
    """Batch 2 answered before batch 1 (another broker's quicker answer): the window still
    starts at batch 1, so no sixth batch goes out."""
    idem = IdempotenceState(max_window=2)
    acc = RecordAccumulator(
        lambda: BatchBuilder(batch_size=60),
        batch_size=60,
        linger_ms=0,
        buffer_memory=1 << 30,
        delivery_timeout_ms=1 << 40,
        clock=lambda: 0,
        idempotence=idem,
    )
    acc.set_producer_id(7, 0)
    drained = []
    for _ in range(3):
        acc.append(TP, 0, None, b"value", (), 0)
        drained += acc.drain([TP], 1 << 20, 0)
    assert len(drained) == 2  # the third waits for room in the window
    first, second = drained
    handle_produce_results(
        acc, [second], {TP: PartitionResult(ErrorCode.NONE, "", 1)}, 0,
        retries=3, retry_backoff_ms=0, make_timeout_error=KafkaTimeoutError, idempotence=idem,
    )  # fmt: skip
    assert acc.drain([TP], 1 << 20, 0) == []  # first is still unanswered
    handle_produce_results(
        acc, [first], {TP: PartitionResult(ErrorCode.NONE, "", 0)}, 0,
        retries=3, retry_backoff_ms=0, make_timeout_error=KafkaTimeoutError, idempotence=idem,
    )  # fmt: skip
    third = acc.drain([TP], 1 << 20, 0)
    assert len(third) == 1 and third[0].base_sequence == 2
    assert list(idem.window[TP]) == [2]


steps = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(1, 10)),
        st.tuples(st.just("arrive"), st.integers(0, 2 * MAX_IN_FLIGHT - 1)),
        st.tuples(st.just("answer"), st.integers(0, 2 * MAX_IN_FLIGHT - 1), st.booleans()),
        st.tuples(st.just("replicate"), st.integers(0, 3)),
        st.tuples(st.just("fail_over")),
    ),
    min_size=1,
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(steps, st.sampled_from(["fixed", "grow", "grow and limit"]))
# Found by a CI-like run: the deposed leader refuses sequence 2 as out of order (sequence 1
# had not reached it), and that answer comes back after sequence 1's retry was acknowledged
# by the new leader; the producer failed record 2 instead of bumping and resending it.
@example(
    plan=[("fail_over",), ("send", 1), ("send", 1), ("send", 1), ("arrive", 1), ("arrive", 0),
          ("replicate", 1), ("arrive", 0), ("fail_over",)],
    sizes="fixed",
)
def test_exactly_once_in_order_through_leader_changes(
    plan: list[tuple[object, ...]], sizes: str
) -> None:
    """Whatever the interleaving of arrivals, held and lost answers, partial replication and
    fail-overs (the new leader keeping only the copied prefix), every record is in the log once,
    in send order, at the offset its future reports, and none fails; ``sizes`` "grow": batches
    opened while the window is full grow past batch.size; "grow and limit": also the leader
    refuses batches above 130 bytes (max.message.bytes below the grown size): they are split."""
    harness = IdempotenceHarness(
        replicas=2, blocked_batch_size=0 if sizes == "fixed" else 360,
        max_message_bytes=130 if sizes == "grow and limit" else None,
    )
    if sizes == "grow and limit":  # (a grown batch, bound to be refused, waits to leave)
        harness.send(5 * 3)
        harness.drain()
        harness.send(8)
    for step in plan:
        kind = step[0]
        if kind == "send":
            harness.send(int(step[1]))  # type: ignore[call-overload]
        elif kind == "arrive":
            harness.arrive(int(step[1]))  # type: ignore[call-overload]
        elif kind == "answer":
            harness.answer(int(step[1]), lost=bool(step[2]))  # type: ignore[call-overload]
        elif kind == "replicate":
            harness.replicate(int(step[1]))  # type: ignore[call-overload]
        else:
            harness.fail_over()
        harness.drain()
    harness.settle()
    harness.check()


def test_a_retry_older_than_the_remembered_batches_is_refused_with_a_clear_error() -> None:
    """The broker's side of the finding: a batch below the 5 remembered ones is refused
    (never appended again) and the error says why."""
    replica = Replica()
    payloads = []
    for sequence in range(BATCHES_PER_PRODUCER + 1):
        builder = BatchBuilder(
            producer_id=42, producer_epoch=0, base_sequence=sequence, batch_size=1 << 10
        )
        builder.append(0, None, f"v{sequence}".encode())
        payloads.append(builder.build())
        assert replica.append_as_leader(payloads[-1]).error_code is ErrorCode.NONE
    assert replica.append_as_leader(payloads[1]).base_offset == 1  # remembered: a duplicate
    result = replica.append_as_leader(payloads[0])
    assert result.error_code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert "older than the 5 batches remembered" in result.message
    assert len(replica.log) == BATCHES_PER_PRODUCER + 1


def test_an_empty_window_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_window"):
        IdempotenceState(max_window=0)
