"""One harness for the idempotent producer's client core against the broker's core: the real
RecordAccumulator, IdempotenceState and handle_produce_results on the client side; on the broker
side one or two replicas of one partition, each a real ProducerStateManager plus its log.

The leader appends with Kafka's checks (a duplicate gets its original offset); a follower copies
a prefix of the leader's log (applying producer state as Partition.append_as_follower does); a
fail-over makes the follower leader with only what it copied and truncates the old leader to
that prefix (rebuilding its state from the log, as Partition.truncate_to does). A request
reaches the broker it was sent to: a broker that no longer leads answers NOT_LEADER_OR_FOLLOWER.
acks=all: with two replicas a success is final only once the follower copied the batch; with
one it is final at once. The sender keeps at most 5 requests in flight per broker.

Two ways to drive the network, both on the same state:

- :meth:`IdempotenceHarness.deliver` (one replica): a request reaches the leader and its answer
  comes back at once, or is lost after the append, or the request fails before it.
- :meth:`~IdempotenceHarness.arrive`, :meth:`~IdempotenceHarness.replicate`,
  :meth:`~IdempotenceHarness.answer`, :meth:`~IdempotenceHarness.fail_over`: each step apart,
  answers queued per broker in the order they became final (one connection per broker).

:meth:`~IdempotenceHarness.check`: every record once, in send order, in the leader's log, at the
offset its future reports, and never more outstanding batches than a broker remembers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
from fjord.errors import ErrorCode, FjordError, KafkaTimeoutError
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

    @property
    def values(self) -> list[bytes]:
        """The record values of the log, in offset order."""
        return [v for _, _, values in self.log for v in values]

    def append_as_leader(
        self, payload: bytes, max_message_bytes: int | None = None
    ) -> PartitionResult:
        """As Partition.append_as_leader: the sequence checks first (a duplicate gets its
        offset), then the log's size limit (``max_message_bytes``: MESSAGE_TOO_LARGE)."""
        header = parse_header(payload)
        try:
            duplicate = self.state.check_append([header])
        except FjordError as exc:
            return PartitionResult(exc.code, str(exc))
        if duplicate is not None:
            return PartitionResult(ErrorCode.NONE, "", duplicate.first_offset)
        if max_message_bytes is not None and len(payload) > max_message_bytes:
            return PartitionResult(ErrorCode.MESSAGE_TOO_LARGE, "above max.message.bytes")
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


class IdempotenceHarness:
    def __init__(
        self,
        replicas: int = 1,
        blocked_batch_size: int = 0,
        max_message_bytes: int | None = None,
    ) -> None:
        """``blocked_batch_size`` above 120 (the batch size): batches opened while the window
        is full grow up to it (RecordAccumulator's growing while blocked).
        ``max_message_bytes``: the leader refuses larger batches with MESSAGE_TOO_LARGE (the
        producer splits them)."""
        self.max_message_bytes = max_message_bytes
        self.splits = 0  # batches split after MESSAGE_TOO_LARGE
        self.held_peak = 0  # most batches the leader held from the oldest unanswered one on
        assert replicas in (1, 2)
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
            sized_builder=lambda size: BatchBuilder(batch_size=size),
            blocked_batch_size=blocked_batch_size,
        )
        self.acc.set_producer_id(42, 0)
        self.replicas = [Replica() for _ in range(replicas)]
        self.leader = 0
        self.leader_epoch = 0
        self.in_flight: list[Request] = []
        self.outbox: list[list[Request]] = [[] for _ in range(replicas)]  # final answers, in order
        self.futures: list[tuple[bytes, RecordFuture]] = []
        self.sent = 0
        self.outstanding_peak = 0

    @property
    def follower(self) -> int | None:
        return 1 - self.leader if len(self.replicas) == 2 else None

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

    # -- one step at a time ----------------------------------------------------------------

    def arrive(self, index: int) -> None:
        """A request not yet processed reaches its broker, which appends (or refuses) and, with
        acks=all, waits for the follower before its success is final."""
        pending = [r for r in self.in_flight if r.result is None]
        if pending:
            self._process(pending[index % len(pending)])
            self._finalize()

    def _process(self, request: Request) -> None:
        if request.node != self.leader:
            request.result = PartitionResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved")
            return
        request.leader_epoch = self.leader_epoch
        replica = self.replicas[request.node]
        before = len(replica.log)
        request.result = replica.append_as_leader(
            request.batches[0].close(), self.max_message_bytes
        )
        pending = self.idem.unacked.get(TP)
        if pending:
            # The broker must still remember the oldest unanswered batch when it comes again.
            held = sum(
                1
                for header, _, _ in replica.log
                if header.producer_epoch == self.idem.producer_epoch
                and header.base_sequence >= pending[0]
            )
            self.held_peak = max(self.held_peak, held)
        if len(replica.log) > before:
            request.appended_at = before
        elif request.result.error_code is ErrorCode.NONE:  # a recognised duplicate
            request.appended_at = next(
                i
                for i, (_, first, _) in enumerate(replica.log)
                if first == request.result.base_offset
            )

    def _finalize(self) -> None:
        """Queue the answers that became final, per broker in the order they did (one
        connection per broker delivers them in that order): an error at once; a success once
        the follower (if any) copied the batch (acks=all); a waiting append whose leader was
        deposed fails with NOT_LEADER_OR_FOLLOWER, as the broker answers it."""
        follower = self.follower
        for request in self.in_flight:
            result = request.result
            if result is None or request.final:
                continue
            if result.error_code is ErrorCode.NONE:
                if request.node != self.leader or request.leader_epoch != self.leader_epoch:
                    request.result = PartitionResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved")
                elif follower is not None and (
                    len(self.replicas[follower].log) <= request.appended_at
                ):
                    continue  # acks=all: still waiting for the follower
            request.final = True
            self.outbox[request.node].append(request)

    def answer(self, index: int, lost: bool) -> None:
        """The next final answer of one broker reaches the client (``lost``: a transport
        error instead)."""
        heads = [queue for queue in self.outbox if queue]
        if heads:
            self._answer(heads[index % len(heads)][0], lost)

    def _answer(self, request: Request, lost: bool) -> None:
        self.outbox[request.node].remove(request)
        self.in_flight.remove(request)
        assert request.result is not None
        outcome: dict[TopicPartition, PartitionResult] | BaseException = {TP: request.result}
        if lost:
            outcome = FjordError("lost", ErrorCode.NETWORK_EXCEPTION)
        self.splits += handle_produce_results(
            self.acc,
            request.batches,
            outcome,
            self.now,
            retries=1 << 30,
            retry_backoff_ms=0,
            make_timeout_error=KafkaTimeoutError,
            idempotence=self.idem,
        ).split

    def replicate(self, batches: int) -> None:
        follower = self.follower
        if follower is not None:
            self.replicas[follower].copy_from(self.replicas[self.leader], batches)
            self._finalize()

    def fail_over(self) -> None:
        """The follower becomes leader with what it copied; the old leader truncates to it."""
        new_leader = self.follower
        assert new_leader is not None, "a fail-over needs two replicas"
        kept = len(self.replicas[new_leader].log)
        self.replicas[self.leader].truncate_to_batches(kept)
        self.leader = new_leader
        self.leader_epoch += 1
        self._finalize()

    # -- a request and its answer at once (one replica) ----------------------------------------

    def deliver(self, index: int, fate: str) -> None:
        """In-flight request ``index`` reaches the leader and is answered at once: its answer
        arrives ("ok"), is lost after the append ("lost"), or the request fails before it is
        appended ("error", retriable)."""
        assert self.follower is None, "deliver() answers at once: one replica only"
        if not self.in_flight:
            return
        request = self.in_flight[index % len(self.in_flight)]
        if fate == "error":
            request.result = PartitionResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved")
        else:
            self._process(request)
        request.final = True
        self.outbox[request.node].append(request)
        self._answer(request, lost=fate == "lost")

    # -- the end -----------------------------------------------------------------------------

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
        nothing failed that the test did not remove from ``futures``; never more batches of
        the partition outstanding than a broker remembers (the window, unless a split
        replaced a batch by several; the batches the leader held from the oldest unanswered
        one on, always); no batch above ``max_message_bytes`` in the log."""
        values = [v for v, _ in self.futures]
        assert self.replicas[self.leader].values == values  # exactly once, in send order
        for position, (value, future) in enumerate(self.futures):
            assert future.result(0).offset == position, value
        if not self.splits:
            assert self.outstanding_peak <= BATCHES_PER_PRODUCER
        assert self.held_peak <= BATCHES_PER_PRODUCER
        if self.max_message_bytes is not None:
            assert all(h.size <= self.max_message_bytes for h, _, _ in self.replicas[0].log)
