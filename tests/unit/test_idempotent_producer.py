"""The idempotent producer's client core against the broker's core, with a hostile network.

A simulated partition leader (fjord.broker.producer_state.ProducerStateManager plus a list as
its log) serves the real RecordAccumulator and handle_produce_results. Hypothesis chooses the
order in which in-flight requests reach the broker (reordering), which responses are lost
(the batch was appended but the producer never hears of it), and transient errors (nothing
appended). Whatever happens, the log holds every record exactly once, in send order, and every
record's future reports the offset where it really is.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.broker.producer_state import ProducerStateManager
from fjord.client.accumulator import (
    IdempotenceState,
    PartitionResult,
    ProducerBatch,
    RecordAccumulator,
    handle_produce_results,
)
from fjord.client.futures import RecordFuture
from fjord.client.types import TopicPartition
from fjord.config import producer_config
from fjord.errors import ConfigError, ErrorCode, FjordError, KafkaTimeoutError
from fjord.records.builder import BatchBuilder
from fjord.records.header import parse_header
from fjord.records.reader import decode_records

TP = TopicPartition("t", 0)
MAX_IN_FLIGHT = 5


@dataclass
class SimulatedLeader:
    """One partition leader: idempotence checks, then an append to ``log`` (record values)."""

    state: ProducerStateManager = field(default_factory=ProducerStateManager)
    log: list[bytes] = field(default_factory=list)

    def produce(self, payload: bytes) -> PartitionResult:
        header = parse_header(payload)
        try:
            duplicate = self.state.check_append([header])
        except FjordError as exc:
            return PartitionResult(exc.code, str(exc))
        if duplicate is not None:
            return PartitionResult(ErrorCode.NONE, "", duplicate.first_offset)
        first = len(self.log)
        self.log.extend(r.value or b"" for r in decode_records(payload))
        self.state.record_append([header], first)
        return PartitionResult(ErrorCode.NONE, "", first)


class Harness:
    def __init__(self) -> None:
        self.now = 0
        self.idem = IdempotenceState()
        self.acc = RecordAccumulator(
            lambda: BatchBuilder(batch_size=120),
            batch_size=120,
            linger_ms=0,
            buffer_memory=1 << 30,
            delivery_timeout_ms=1 << 40,
            clock=lambda: self.now,
            idempotence=self.idem,
        )
        self.acc.set_producer_id(42, 0)
        self.leader = SimulatedLeader()
        self.in_flight: list[list[ProducerBatch]] = []
        self.futures: list[tuple[bytes, RecordFuture]] = []
        self.sent = 0

    def send(self, count: int) -> None:
        for _ in range(count):
            value = f"record-{self.sent:05d}".encode()
            self.sent += 1
            future, _ = self.acc.append(TP, 0, None, value, (), self.now)
            assert future is not None
            self.futures.append((value, future))

    def drain(self) -> None:
        self.now += 1
        if not self.in_flight and self.idem.bump_needed:
            assert self.acc.bump_epoch_if_needed()
        while len(self.in_flight) < MAX_IN_FLIGHT:
            batches = self.acc.drain([TP], 1 << 20, self.now)
            if not batches:
                return
            assert len(batches) == 1  # one batch per partition per request
            self.in_flight.append(batches)

    def deliver(self, index: int, fate: str) -> None:
        """The broker receives request ``index``: it answers ("ok"), its answer is lost after
        the append ("lost"), or it fails before appending ("error", retriable)."""
        if not self.in_flight:
            return
        batches = self.in_flight.pop(index % len(self.in_flight))
        results: dict[TopicPartition, PartitionResult] | BaseException
        if fate == "error":
            results = {TP: PartitionResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved")}
        else:
            result = self.leader.produce(batches[0].close())
            if fate == "ok":
                results = {TP: result}
            else:  # appended (or refused), but the answer never arrives
                results = FjordError("lost", ErrorCode.NETWORK_EXCEPTION)
        handle_produce_results(
            self.acc,
            batches,
            results,
            self.now,
            retries=1 << 30,
            retry_backoff_ms=0,
            make_timeout_error=KafkaTimeoutError,
            idempotence=self.idem,
        )

    def settle(self) -> None:
        """A calm network until every record is answered."""
        for _ in range(10 * self.sent + 100):
            self.drain()
            if not self.in_flight:
                if not self.acc.has_pending():
                    return
                continue
            self.deliver(0, "ok")
        raise AssertionError("the producer did not settle")

    def check(self) -> None:
        values = [v for v, _ in self.futures]
        assert self.leader.log == values  # exactly once, in send order
        for position, (value, future) in enumerate(self.futures):
            metadata = future.result(0)
            assert metadata.offset == position, value


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
@given(steps)
def test_exactly_once_in_order_despite_reordering_and_lost_answers(
    plan: list[tuple[object, ...]],
) -> None:
    harness = Harness()
    for step in plan:
        if step[0] == "send":
            harness.send(int(step[1]))  # type: ignore[call-overload]
        else:
            harness.deliver(int(step[1]), str(step[2]))  # type: ignore[call-overload]
        harness.drain()
    harness.settle()
    harness.check()


def test_lost_answer_is_deduplicated_and_later_batches_wait() -> None:
    harness = Harness()
    harness.send(30)
    harness.drain()
    assert len(harness.in_flight) == MAX_IN_FLIGHT
    first_sequences = [b[0].base_sequence for b in harness.in_flight]
    assert first_sequences == sorted(first_sequences) and first_sequences[0] == 0
    harness.deliver(0, "lost")  # appended, answer lost: it is retried
    harness.deliver(0, "ok")  # the second batch lands
    harness.drain()
    # The retry of batch 0 is the lowest unanswered sequence: it goes out again.
    assert any(b[0].base_sequence == 0 for b in harness.in_flight)
    harness.settle()
    harness.check()


def test_failed_batch_bumps_the_epoch_and_sequences_restart() -> None:
    harness = Harness()
    harness.send(12)
    harness.drain()
    batches = harness.in_flight.pop(0)
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


def test_unknown_producer_id_for_the_oldest_batch_bumps_and_resends() -> None:
    harness = Harness()
    harness.send(3)
    harness.drain()
    batches = harness.in_flight.pop(0)
    handle_produce_results(
        harness.acc,
        batches,
        {TP: PartitionResult(ErrorCode.UNKNOWN_PRODUCER_ID, "expired")},
        harness.now,
        retries=10,
        retry_backoff_ms=0,
        make_timeout_error=KafkaTimeoutError,
        idempotence=harness.idem,
    )
    assert harness.idem.bump_needed and not batches[0].completion.done
    harness.settle()
    harness.check()


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
