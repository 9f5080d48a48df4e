"""The idempotent producer's client core against the broker's core, with a hostile network.

A partition leader (a real ProducerStateManager plus a list as its log) serves the real
RecordAccumulator and handle_produce_results, through the harness the fail-over tests share
(tests/helpers/idempotence.py). Hypothesis chooses the
order in which in-flight requests reach the broker (reordering), which responses are lost
(the batch was appended but the producer never hears of it), and transient errors (nothing
appended). Whatever happens, the log holds every record exactly once, in send order, and every
record's future reports the offset where it really is.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.client.accumulator import PartitionResult, ProducerBatch, handle_produce_results
from fjord.config import producer_config
from fjord.errors import ConfigError, ErrorCode, KafkaTimeoutError
from tests.helpers.idempotence import MAX_IN_FLIGHT, TP, IdempotenceHarness

steps = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(1, 12)),
        st.tuples(
            st.just("deliver"),
            st.integers(0, MAX_IN_FLIGHT - 1),
            st.sampled_from(["ok", "ok", "ok", "lost", "error"]),
        ),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(steps, st.sampled_from(["fixed", "grow", "grow and limit"]))
def test_exactly_once_in_order_despite_reordering_and_lost_answers(
    plan: list[tuple[object, ...]], sizes: str
) -> None:
    """``sizes``: "grow": batches opened while the window is full grow past batch.size (up to
    3x); "grow and limit": also the leader refuses batches above 130 bytes (a topic's
    max.message.bytes between batch.size and the grown size), which the producer splits."""
    harness = IdempotenceHarness(
        blocked_batch_size=0 if sizes == "fixed" else 360,
        max_message_bytes=130 if sizes == "grow and limit" else None,
    )
    if sizes == "grow and limit":  # (a grown batch, bound to be refused, waits to leave)
        harness.send(5 * 3)
        harness.drain()
        harness.send(8)
    for step in plan:
        if step[0] == "send":
            harness.send(int(step[1]))  # type: ignore[call-overload]
        else:
            harness.deliver(int(step[1]), str(step[2]))  # type: ignore[call-overload]
        harness.drain()
    harness.settle()
    harness.check()


def test_lost_answer_is_deduplicated_and_later_batches_wait() -> None:
    harness = IdempotenceHarness()
    harness.send(30)
    harness.drain()
    assert len(harness.in_flight) == MAX_IN_FLIGHT
    first_sequences = [r.batches[0].base_sequence for r in harness.in_flight]
    assert first_sequences == sorted(first_sequences) and first_sequences[0] == 0
    harness.deliver(0, "lost")  # appended, answer lost: it is retried
    harness.deliver(0, "ok")  # the second batch lands
    harness.drain()
    # The retry of batch 0 is the lowest unanswered sequence: it goes out again.
    assert any(r.batches[0].base_sequence == 0 for r in harness.in_flight)
    harness.settle()
    harness.check()


def test_failed_batch_bumps_the_epoch_and_sequences_restart() -> None:
    harness = IdempotenceHarness()
    harness.send(12)
    harness.drain()
    batches = harness.in_flight.pop(0).batches
    handle_produce_results(
        harness.acc,
        batches,
        {TP: PartitionResult(ErrorCode.MESSAGE_TOO_LARGE, "too big")},
        harness.now,
        retries=10,
        retry_backoff_ms=0,
        make_timeout_error=KafkaTimeoutError,
        idempotence=harness.idem,
    )
    assert harness.idem.bump_needed
    assert batches[0].completion.done
    failed = {id(f) for _, f in harness.futures if f.done() and f.exception(0) is not None}
    harness.futures = [(v, f) for v, f in harness.futures if id(f) not in failed]
    harness.settle()
    assert harness.idem.producer_epoch == 1
    harness.check()


def _answer_the_oldest_batch(
    harness: IdempotenceHarness, code: ErrorCode, message: str
) -> list[ProducerBatch]:
    """Three records sent as three batches; the oldest is answered with ``code``."""
    harness.send(3)
    harness.drain()
    batches = harness.in_flight.pop(0).batches
    handle_produce_results(
        harness.acc,
        batches,
        {TP: PartitionResult(code, message)},
        harness.now,
        retries=10,
        retry_backoff_ms=0,
        make_timeout_error=KafkaTimeoutError,
        idempotence=harness.idem,
    )
    return batches


def test_unknown_producer_id_for_the_oldest_batch_bumps_and_resends() -> None:
    harness = IdempotenceHarness()
    (batch,) = _answer_the_oldest_batch(harness, ErrorCode.UNKNOWN_PRODUCER_ID, "expired")
    assert harness.idem.bump_needed and not batch.completion.done
    harness.settle()
    harness.check()


def test_out_of_order_for_the_oldest_batch_bumps_and_resends() -> None:
    """Kafka's idempotent producer (KIP-360): a hole before the oldest unacknowledged batch
    bumps the epoch and the batch goes again, nothing fails."""
    harness = IdempotenceHarness()
    (batch,) = _answer_the_oldest_batch(
        harness, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, "expected 1, got 0"
    )
    assert harness.idem.bump_needed and not batch.completion.done
    harness.settle()
    assert harness.idem.producer_epoch == 1
    harness.check()


def test_out_of_order_for_the_oldest_batch_fails_it_when_transactional() -> None:
    """A transactional producer fails the batch (its transaction must abort), as Kafka's."""
    harness = IdempotenceHarness()
    harness.idem.transactional = True
    (batch,) = _answer_the_oldest_batch(
        harness, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, "expected 1, got 0"
    )
    error = batch.completion.error
    assert error is not None and error.code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert harness.idem.bump_needed


# --- configuration (Kafka's rules) --------------------------------------------------------------

BOOT = {"bootstrap.servers": "localhost:9092"}


def test_idempotence_is_on_by_default_with_acks_all() -> None:
    config = producer_config(BOOT)
    assert config["enable.idempotence"] is True
    assert config["acks"] == -1


@pytest.mark.parametrize(
    ("key", "value"),
    [("acks", "1"), ("acks", "0"), ("retries", 0), ("max.in.flight.requests.per.connection", 6)],
)
def test_explicit_idempotence_with_a_conflict_names_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        producer_config({**BOOT, "enable.idempotence": "true", key: value})


@pytest.mark.parametrize(
    ("key", "value"),
    [("acks", "1"), ("retries", 0), ("max.in.flight.requests.per.connection", 6)],
)
def test_default_idempotence_yields_to_a_conflicting_choice(key: str, value: object) -> None:
    config = producer_config({**BOOT, key: value})
    assert config["enable.idempotence"] is False
    assert producer_config({**BOOT, "enable.idempotence": False})["enable.idempotence"] is False


def test_a_grown_batch_refused_as_too_large_is_split_and_the_batches_after_it_retried() -> None:
    """A topic whose max.message.bytes is below the grown size: the grown batch comes back
    MESSAGE_TOO_LARGE while batches after it are in flight (they get OUT_OF_ORDER, not being
    next); it is split into batch.size batches with its sequences, and every record lands
    once, in order."""
    harness = IdempotenceHarness(blocked_batch_size=360, max_message_bytes=200)

    def deliver(batch: object, fate: str = "ok") -> str:
        at = next(i for i, r in enumerate(harness.in_flight) if r.batches[0] is batch)
        request = harness.in_flight[at]
        harness.deliver(at, fate)
        assert request.result is not None
        return request.result.error_code.name

    harness.send(15)
    harness.drain()
    first = [r.batches[0] for r in harness.in_flight]
    assert len(first) == MAX_IN_FLIGHT
    harness.send(12)  # opened while the window is full: one grown batch
    grown = harness.acc.open_batch(TP)
    assert grown is not None and grown.record_count == 12
    for batch in first[:3]:
        assert deliver(batch) == "NONE"
    harness.send(9)
    harness.drain()  # the grown batch and two after it are in flight now
    later = [r.batches[0] for r in harness.in_flight if r.batches[0] not in (*first, grown)]
    assert any(r.batches[0] is grown for r in harness.in_flight) and len(later) == 2
    for batch in first[3:]:
        assert deliver(batch) == "NONE"
    assert deliver(later[1]) == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    assert deliver(grown) == "MESSAGE_TOO_LARGE"
    assert deliver(later[0]) == "OUT_OF_ORDER_SEQUENCE_NUMBER"
    assert harness.splits == 1 and not harness.idem.bump_needed
    harness.settle()
    harness.check()
    assert max(h.size for h, _, _ in harness.replicas[0].log) <= 200
    assert harness.idem.producer_epoch == 0  # no hole: no epoch bump
