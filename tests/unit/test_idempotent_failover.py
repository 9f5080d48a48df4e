"""The idempotent producer's client core against two broker replicas through leader changes.

Chaos finding 4 (docs/chaos.md): requests held by a deposed leader (its answer waits, or never
comes) while the producer already writes newer batches of the same partition to the new leader.
When the held batches finally fail and are retried, the new leader must still recognise them as
duplicates: it remembers only the last 5 batches per producer (BATCHES_PER_PRODUCER), so the
producer may never have more than 5 batches of a partition outstanding from its oldest
unacknowledged one, whichever brokers they went to.

The model: two replicas, each a real ProducerStateManager plus a list of (header, values) as its
log. The leader appends (with Kafka's checks), the follower copies a prefix of the leader's log
(applying producer state as Partition.append_as_follower does), a fail-over makes the follower
leader with only what it copied and truncates the old leader to that prefix (rebuilding its state
from the log, as Partition.truncate_to does). A request reaches the broker it was sent to: a
broker that no longer leads answers NOT_LEADER_OR_FOLLOWER. acks=all: a request is answered with
success only after the follower copied its batch. The client side is the real RecordAccumulator,
IdempotenceState and handle_produce_results with at most 5 requests in flight PER BROKER, as the
sender does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.broker.producer_state import BATCHES_PER_PRODUCER, ProducerStateManager
from fjord.client.accumulator import (
    IdempotenceState,
    PartitionResult,
    ProducerBatch,
    RecordAccumulator,
    handle_produce_results,
)
from fjord.client.futures import RecordFuture
from fjord.client.types import TopicPartition
from fjord.config import MAX_IN_FLIGHT_FOR_IDEMPOTENCE
from fjord.errors import ConfigError, ErrorCode, FjordError, KafkaTimeoutError
from fjord.records.builder import BatchBuilder
from fjord.records.header import BatchHeader, parse_header
from fjord.records.reader import decode_records

TP = TopicPartition("t", 0)
MAX_IN_FLIGHT = MAX_IN_FLIGHT_FOR_IDEMPOTENCE  # per broker, as the sender counts them


@dataclass
class Replica:
    """One replica of the partition: its log (header with first offset, record values) and
    its idempotence state, kept as the broker keeps it."""

    state: ProducerStateManager = field(default_factory=ProducerStateManager)
    log: list[tuple[BatchHeader, int, list[bytes]]] = field(default_factory=list)

    @property
    def end_offset(self) -> int:
        if not self.log:
            return 0
        _, first, values = self.log[-1]
        return first + len(values)

    def append_as_leader(self, payload: bytes) -> PartitionResult:
        header = parse_header(payload)
        try:
            duplicate = self.state.check_append([header])
        except FjordError as exc:
            return PartitionResult(exc.code, str(exc))
        if duplicate is not None:
            return PartitionResult(ErrorCode.NONE, "", duplicate.first_offset)
        first = self.end_offset
        self.log.append((header, first, [r.value or b"" for r in decode_records(payload)]))
        self.state.record_append([header], first)
        return PartitionResult(ErrorCode.NONE, "", first)

    def copy_from(self, leader: Replica, batches: int) -> None:
        """Follower fetch: copy up to ``batches`` more batches of the leader's log."""
        for header, first, values in leader.log[len(self.log) : len(self.log) + batches]:
            self.log.append((header, first, values))
            self.state.apply_batch(header, first, first + len(values) - 1)

    def truncate_to_batches(self, count: int) -> None:
        """Follower truncation: keep the first ``count`` batches, rebuild the state from them."""
        del self.log[count:]
        self.state = ProducerStateManager()
        for header, first, values in self.log:
            self.state.apply_batch(header, first, first + len(values) - 1)


@dataclass
class Request:
    node: int
    batches: list[ProducerBatch]
    leader_epoch: int = -1  # the leader epoch it was appended in (a change fails the wait)
    appended_at: int = -1  # index in the node's log of the batch it appended, -1: not yet
    final: bool = False  # its answer is decided and queued for the client
    result: PartitionResult | None = None  # the node's answer once it processed the request


class TwoReplicaHarness:
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
        self.replicas = [Replica(), Replica()]
        self.leader = 0
        self.leader_epoch = 0
        self.in_flight: list[Request] = []
        self.outbox: list[list[Request]] = [[], []]  # final answers per broker, in order
        self.futures: list[tuple[bytes, RecordFuture]] = []
        self.sent = 0
        self.outstanding_peak = 0

    @property
    def follower(self) -> int:
        return 1 - self.leader

    def send(self, count: int) -> None:
        for _ in range(count):
            value = f"record-{self.sent:05d}".encode()
            self.sent += 1
            future, _ = self.acc.append(TP, 0, None, value, (), self.now)
            assert future is not None
            self.futures.append((value, future))

    def drain(self) -> None:
        """The sender: requests go to the leader the client knows (the current one)."""
        self.now += 1
        if not self.in_flight and self.idem.bump_needed:
            assert self.acc.bump_epoch_if_needed()
        while sum(r.node == self.leader for r in self.in_flight) < MAX_IN_FLIGHT:
            batches = self.acc.drain([TP], 1 << 20, self.now)
            if not batches:
                break
            assert len(batches) == 1  # one batch per partition per request
            self.in_flight.append(Request(self.leader, batches))
        window = self.idem.window.get(TP, ())
        self.outstanding_peak = max(self.outstanding_peak, len(window))

    def arrive(self, index: int) -> None:
        """The request reaches its broker, which appends (or refuses) and, with acks=all,
        waits for the follower before its success is final."""
        pending = [r for r in self.in_flight if r.result is None]
        if not pending:
            return
        request = pending[index % len(pending)]
        if request.node != self.leader:
            request.result = PartitionResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved")
        else:
            request.leader_epoch = self.leader_epoch
            replica = self.replicas[request.node]
            before = len(replica.log)
            request.result = replica.append_as_leader(request.batches[0].close())
            if len(replica.log) > before:
                request.appended_at = before
            elif request.result.error_code is ErrorCode.NONE:  # a recognised duplicate
                request.appended_at = next(
                    i
                    for i, (_, first, _) in enumerate(replica.log)
                    if first == request.result.base_offset
                )
        self._finalize()

    def _finalize(self) -> None:
        """Queue the answers that became final, per broker in the order they did (one
        connection per broker delivers them in that order): an error at once; a success once
        the follower copied the batch (acks=all); a waiting append whose leader was deposed
        fails with NOT_LEADER_OR_FOLLOWER, as the broker answers it."""
        for request in self.in_flight:
            result = request.result
            if result is None or request.final:
                continue
            if result.error_code is ErrorCode.NONE:
                if request.node != self.leader or request.leader_epoch != self.leader_epoch:
                    request.result = PartitionResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved")
                elif len(self.replicas[self.follower].log) <= request.appended_at:
                    continue  # acks=all: still waiting for the follower
            request.final = True
            self.outbox[request.node].append(request)

    def answer(self, index: int, lost: bool) -> None:
        """The next final answer of one broker reaches the client (``lost``: a transport
        error instead)."""
        heads = [queue for queue in self.outbox if queue]
        if not heads:
            return
        request = heads[index % len(heads)].pop(0)
        self.in_flight.remove(request)
        assert request.result is not None
        outcome: dict[TopicPartition, PartitionResult] | BaseException = {TP: request.result}
        if lost:
            outcome = FjordError("lost", ErrorCode.NETWORK_EXCEPTION)
        handle_produce_results(
            self.acc,
            request.batches,
            outcome,
            self.now,
            retries=1 << 30,
            retry_backoff_ms=0,
            make_timeout_error=KafkaTimeoutError,
            idempotence=self.idem,
        )

    def replicate(self, batches: int) -> None:
        self.replicas[self.follower].copy_from(self.replicas[self.leader], batches)
        self._finalize()

    def fail_over(self) -> None:
        """The follower becomes leader with what it copied; the old leader truncates to it."""
        new_leader = self.follower
        kept = len(self.replicas[new_leader].log)
        self.replicas[self.leader].truncate_to_batches(kept)
        self.leader = new_leader
        self.leader_epoch += 1
        self._finalize()

    def settle(self) -> None:
        """A calm network: the follower keeps up, every request arrives and is answered."""
        for _ in range(20 * self.sent + 100):
            self.drain()
            if not self.in_flight:
                if not self.acc.has_pending():
                    return
                continue
            self.arrive(0)
            self.replicate(1 << 20)
            self.answer(0, lost=False)
        raise AssertionError("the producer did not settle")

    def check(self) -> None:
        """Every record once, in send order, in the leader's log, at the offset it was given;
        nothing failed (every error here is retriable and there is no delivery timeout)."""
        log = [v for _, _, values in self.replicas[self.leader].log for v in values]
        values = [v for v, _ in self.futures]
        assert log == values
        for position, (value, future) in enumerate(self.futures):
            assert future.result(0).offset == position, value
        assert self.outstanding_peak <= BATCHES_PER_PRODUCER


def test_held_requests_of_a_deposed_leader_are_recognised_by_the_new_one() -> None:
    """Finding 4, deterministically: 5 batches appended by leader 0 and copied by replica 1,
    their answers held while leadership moves to replica 1. Before the fix the producer sent
    newer batches to replica 1 meanwhile, so the retried oldest batch was older than the 5
    batches replica 1 remembers: OUT_OF_ORDER_SEQUENCE, an epoch bump and duplicates."""
    harness = TwoReplicaHarness()
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
    harness = TwoReplicaHarness()
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
@given(steps)
def test_exactly_once_in_order_through_leader_changes(plan: list[tuple[object, ...]]) -> None:
    """Whatever the interleaving of arrivals, held and lost answers, partial replication and
    fail-overs (the new leader keeping only the copied prefix), every record is in the log once,
    in send order, at the offset its future reports, and none fails."""
    harness = TwoReplicaHarness()
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
