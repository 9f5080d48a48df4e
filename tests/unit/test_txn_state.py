"""The transaction coordinator's pure state machine and the ``__transaction_state`` records."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fjord.errors import (
    ConcurrentTransactionsError,
    CorruptRecordError,
    FjordError,
    InvalidProducerIdMappingError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
)
from fjord.topic_partition import TopicPartition
from fjord.transactions.defaults import MAX_PRODUCER_EPOCH
from fjord.transactions.log import (
    TransactionLogLoader,
    decode_key,
    decode_value,
    encode_key,
    encode_record,
    encode_value,
)
from fjord.transactions.state import (
    VALID_PREVIOUS_STATES,
    TransactionMetadata,
    TxnRecord,
    TxnState,
)

MAX_TIMEOUT = 900_000
TP0 = TopicPartition("orders", 0)
TP1 = TopicPartition("orders", 1)


def initialized(now: int = 0, pid: int = 7) -> TransactionMetadata:
    meta = TransactionMetadata.new("tx", pid, 60_000, now)
    result = meta.init_producer_id(now, 60_000, max_timeout_ms=MAX_TIMEOUT)
    assert result.write is not None
    meta.complete(result.write)
    return meta


def apply(meta: TransactionMetadata, record: TxnRecord | None) -> None:
    if record is not None:
        meta.complete(record)


def test_first_init_gives_epoch_zero_and_empty() -> None:
    meta = initialized()
    assert (meta.current.producer_id, meta.current.producer_epoch) == (7, 0)
    assert meta.state is TxnState.EMPTY


def test_full_commit_cycle() -> None:
    meta = initialized()
    apply(meta, meta.add_partitions(10, 7, 0, [TP0]))
    assert meta.state is TxnState.ONGOING and meta.current.txn_start_ms == 10
    assert meta.add_partitions(11, 7, 0, [TP0]) is None  # already in the transaction
    apply(meta, meta.add_partitions(12, 7, 0, [TP1]))
    assert meta.current.partitions == {TP0, TP1} and meta.current.txn_start_ms == 10
    apply(meta, meta.end_transaction(20, 7, 0, commit=True))
    assert meta.state is TxnState.PREPARE_COMMIT
    with pytest.raises(ConcurrentTransactionsError):
        meta.end_transaction(21, 7, 0, commit=True)  # a retry while markers are written
    with pytest.raises(InvalidTxnStateError):
        meta.end_transaction(21, 7, 0, commit=False)
    with pytest.raises(ConcurrentTransactionsError):
        meta.add_partitions(21, 7, 0, [TP0])
    apply(meta, meta.complete_transaction(30))
    assert meta.state is TxnState.COMPLETE_COMMIT and not meta.current.partitions
    assert meta.end_transaction(31, 7, 0, commit=True) is None  # retried commit: NONE
    with pytest.raises(InvalidTxnStateError):
        meta.end_transaction(31, 7, 0, commit=False)


def test_end_without_transaction_is_invalid_state() -> None:
    meta = initialized()
    with pytest.raises(InvalidTxnStateError):
        meta.end_transaction(1, 7, 0, commit=True)


def test_wrong_producer_id_and_epoch() -> None:
    meta = initialized()
    with pytest.raises(InvalidProducerIdMappingError):
        meta.add_partitions(1, 8, 0, [TP0])
    with pytest.raises(ProducerFencedError):
        meta.add_partitions(1, 7, 1, [TP0])
    with pytest.raises(ProducerFencedError):
        meta.end_transaction(1, 7, 3, commit=True)


def test_timeout_validation() -> None:
    meta = TransactionMetadata.new("tx", 7, 60_000, 0)
    for bad in (0, -1, MAX_TIMEOUT + 1):
        with pytest.raises(InvalidTransactionTimeoutError):
            meta.init_producer_id(0, bad, max_timeout_ms=MAX_TIMEOUT)
    assert meta.pending is None


def test_init_during_ongoing_fences_and_aborts_at_bumped_epoch() -> None:
    meta = initialized()
    apply(meta, meta.add_partitions(10, 7, 0, [TP0]))
    result = meta.init_producer_id(20, 60_000, max_timeout_ms=MAX_TIMEOUT)
    assert result.fenced_ongoing and result.write is not None
    assert result.write.state is TxnState.PREPARE_ABORT and result.write.producer_epoch == 1
    assert result.write.partitions == {TP0}  # the markers go to the transaction's partitions
    meta.complete(result.write)
    with pytest.raises(ProducerFencedError):  # the zombie (epoch 0) is fenced
        meta.end_transaction(21, 7, 0, commit=True)
    with pytest.raises(ConcurrentTransactionsError):  # the new producer retries meanwhile
        meta.init_producer_id(21, 60_000, max_timeout_ms=MAX_TIMEOUT)
    apply(meta, meta.complete_transaction(22))
    again = meta.init_producer_id(23, 60_000, max_timeout_ms=MAX_TIMEOUT)
    assert not again.fenced_ongoing and again.producer_epoch == 2
    apply(meta, again.write)
    assert meta.state is TxnState.EMPTY


def test_pending_write_answers_concurrent_and_abandon_restores() -> None:
    meta = initialized()
    record = meta.add_partitions(1, 7, 0, [TP0])
    assert record is not None
    with pytest.raises(ConcurrentTransactionsError):
        meta.init_producer_id(2, 60_000, max_timeout_ms=MAX_TIMEOUT)
    with pytest.raises(ConcurrentTransactionsError):
        meta.add_partitions(2, 7, 0, [TP1])
    meta.abandon(record)
    assert meta.state is TxnState.EMPTY and meta.pending is None


def test_epoch_exhaustion_takes_a_new_producer_id() -> None:
    meta = TransactionMetadata(
        TxnRecord("tx", 7, MAX_PRODUCER_EPOCH - 1, 60_000, TxnState.COMPLETE_COMMIT)
    )
    assert meta.needs_new_producer_id()
    with pytest.raises(ValueError):
        meta.init_producer_id(0, 60_000, max_timeout_ms=MAX_TIMEOUT)
    result = meta.init_producer_id(0, 60_000, max_timeout_ms=MAX_TIMEOUT, new_producer_id=99)
    assert (result.producer_id, result.producer_epoch) == (99, 0)
    apply(meta, result.write)
    assert meta.current.previous_producer_id == 7


def test_kip360_retry_and_stale_expected() -> None:
    meta = initialized()
    bumped = meta.init_producer_id(1, 60_000, max_timeout_ms=MAX_TIMEOUT, expected=(7, 0))
    apply(meta, bumped.write)
    assert bumped.producer_epoch == 1
    # The answer was lost; the client asks again with what it had: the same bump.
    retry = meta.init_producer_id(2, 60_000, max_timeout_ms=MAX_TIMEOUT, expected=(7, 0))
    assert retry.write is None and retry.producer_epoch == 1
    with pytest.raises(InvalidProducerIdMappingError):
        meta.init_producer_id(2, 60_000, max_timeout_ms=MAX_TIMEOUT, expected=(5, 0))
    apply(meta, meta.add_partitions(3, 7, 1, [TP0]))
    # A zombie at the previous epoch may not take the epoch once a transaction started.
    with pytest.raises(ProducerFencedError):
        meta.init_producer_id(4, 60_000, max_timeout_ms=MAX_TIMEOUT, expected=(7, 0))


def test_timed_out_transaction_is_aborted_at_a_bumped_epoch() -> None:
    meta = initialized()
    apply(meta, meta.add_partitions(100, 7, 0, [TP0]))
    assert not meta.timed_out(100 + 59_999)
    assert meta.timed_out(100 + 60_000)
    record = meta.abort_timed_out(100 + 60_000)
    assert record.state is TxnState.PREPARE_ABORT and record.producer_epoch == 1
    meta.complete(record)
    with pytest.raises(ProducerFencedError):
        meta.add_partitions(60_200, 7, 0, [TP0])
    with pytest.raises(InvalidTxnStateError):
        initialized().abort_timed_out(0)


def test_idle_ids_without_a_transaction_expire_as_tombstones() -> None:
    meta = initialized(now=0)
    assert meta.expire(999, expiration_ms=1000) is None  # not idle long enough
    apply(meta, meta.add_partitions(1000, 7, 0, [TP0]))
    assert meta.expire(10_000, expiration_ms=1000) is None  # a transaction runs
    apply(meta, meta.end_transaction(10_000, 7, 0, commit=True))
    apply(meta, meta.complete_transaction(10_001))
    record = meta.expire(11_001, expiration_ms=1000)
    assert record is not None and record.state is TxnState.DEAD
    assert encode_record(record) == (encode_key("tx"), None)  # forgotten: a tombstone
    meta.complete(record)
    loader = TransactionLogLoader()
    loader.apply_bytes(*encode_record(initialized().current))
    loader.apply_bytes(*encode_record(record))
    assert loader.records() == {}


# --- property: random request sequences keep the invariants ----------------------------------

PARTITIONS = [TopicPartition("t", n) for n in range(3)]


class TxnMachine(RuleBasedStateMachine):
    """Random requests from the current producer, zombies and the coordinator, with appends
    that succeed or fail; checks the invariants after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.meta = initialized()
        self.now = 0
        self.next_pid = 100
        self.history: list[tuple[int, int]] = [(7, 0)]
        self.states: list[TxnState] = [TxnState.EMPTY]

    def _write(self, record: TxnRecord | None, ok: bool) -> None:
        if record is None:
            return
        before = self.meta.state
        assert before in VALID_PREVIOUS_STATES[record.state] or (
            before is TxnState.EMPTY and record.state is TxnState.EMPTY
        )
        if ok:
            self.meta.complete(record)
            self.history.append((record.producer_id, record.producer_epoch))
            self.states.append(record.state)
        else:
            self.meta.abandon(record)

    def _attempt(self, call, ok: bool) -> None:  # type: ignore[no-untyped-def]
        try:
            record = call()
        except FjordError as exc:
            assert type(exc) in (
                ConcurrentTransactionsError,
                InvalidTxnStateError,
                ProducerFencedError,
                InvalidProducerIdMappingError,
            )
            return
        self._write(record, ok)

    @rule(dt=st.integers(0, 70_000))
    def tick(self, dt: int) -> None:
        self.now += dt

    @rule(ok=st.booleans())
    def init(self, ok: bool) -> None:
        new_pid = None
        if self.meta.needs_new_producer_id():
            new_pid, self.next_pid = self.next_pid, self.next_pid + 1
        try:
            result = self.meta.init_producer_id(
                self.now, 60_000, max_timeout_ms=MAX_TIMEOUT, new_producer_id=new_pid
            )
        except (ConcurrentTransactionsError, ProducerFencedError):
            return
        self._write(result.write, ok)

    @rule(parts=st.sets(st.sampled_from(PARTITIONS), min_size=1), ok=st.booleans(),
          stale=st.booleans())
    def add(self, parts: set[TopicPartition], ok: bool, stale: bool) -> None:
        cur = self.meta.current
        epoch = cur.producer_epoch - 1 if stale else cur.producer_epoch
        self._attempt(lambda: self.meta.add_partitions(self.now, cur.producer_id, epoch, parts),
                      ok)

    @rule(commit=st.booleans(), ok=st.booleans())
    def end(self, commit: bool, ok: bool) -> None:
        cur = self.meta.current
        self._attempt(
            lambda: self.meta.end_transaction(self.now, cur.producer_id, cur.producer_epoch,
                                              commit),
            ok,
        )

    @precondition(lambda self: self.meta.state in (TxnState.PREPARE_COMMIT,
                                                   TxnState.PREPARE_ABORT))
    @rule(ok=st.booleans())
    def markers_written(self, ok: bool) -> None:
        self._attempt(lambda: self.meta.complete_transaction(self.now), ok)

    @rule(ok=st.booleans())
    def expire(self, ok: bool) -> None:
        if self.meta.timed_out(self.now):
            self._write(self.meta.abort_timed_out(self.now), ok)

    @invariant()
    def partitions_only_while_a_transaction_runs(self) -> None:
        cur = self.meta.current
        if cur.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
            assert not cur.partitions
        else:
            assert cur.partitions

    @invariant()
    def epochs_only_grow_per_producer_id(self) -> None:
        last: dict[int, int] = {}
        for pid, epoch in self.history:
            assert epoch >= last.get(pid, -1)
            last[pid] = epoch

    @invariant()
    def the_log_round_trips(self) -> None:
        cur = self.meta.current
        key, value = encode_record(cur)
        decoded = decode_value(decode_key(key), value)
        assert decoded.state is cur.state and decoded.partitions == cur.partitions
        assert (decoded.producer_id, decoded.producer_epoch) == (
            cur.producer_id,
            cur.producer_epoch,
        )


TestTxnMachine = TxnMachine.TestCase
TestTxnMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


# --- __transaction_state records ------------------------------------------------------------


@given(
    tid=st.text(min_size=1, max_size=20),
    pid=st.integers(0, 2**62),
    epoch=st.integers(0, MAX_PRODUCER_EPOCH),
    state=st.sampled_from([s for s in TxnState if s is not TxnState.PREPARE_EPOCH_FENCE]),
    parts=st.frozensets(st.builds(TopicPartition, st.text(min_size=1, max_size=8),
                                  st.integers(0, 1000)), max_size=6),
)
def test_value_round_trip(
    tid: str, pid: int, epoch: int, state: TxnState, parts: frozenset[TopicPartition]
) -> None:
    record = TxnRecord(tid, pid, epoch, 60_000, state, parts, 5, 6)
    assert decode_key(encode_key(tid)) == tid
    assert decode_value(tid, encode_value(record)) == record


def test_value_v0_layout_is_kafkas() -> None:
    record = TxnRecord("tx", 1, 2, 3, TxnState.ONGOING, frozenset({TP0}), 5, 4)
    expected = (
        struct.pack(">hqhib", 0, 1, 2, 3, 1)
        + struct.pack(">ih", 1, 6) + b"orders" + struct.pack(">ii", 1, 0)
        + struct.pack(">qq", 4, 5)
    )
    assert encode_value(record) == expected
    assert encode_key("tx") == struct.pack(">hh", 0, 2) + b"tx"


def test_value_v1_flexible_with_previous_producer_id() -> None:
    body = (
        struct.pack(">hqhib", 1, 11, 2, 3, 2)
        + bytes([2, 7]) + b"orders" + bytes([3]) + struct.pack(">ii", 0, 1) + bytes([0])
        + struct.pack(">qq", 4, 5)
        + bytes([1, 0, 8]) + struct.pack(">q", 10)
    )
    record = decode_value("tx", body)
    assert record.state is TxnState.PREPARE_COMMIT
    assert record.partitions == {TP0, TP1}
    assert record.previous_producer_id == 10


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00\x05", struct.pack(">hqhib", 0, 1, 2, 3, 9), struct.pack(">hqhib", 0, 1, 2, 3, 0)
     + struct.pack(">i", 1000)],
)
def test_corrupt_values_are_typed(data: bytes) -> None:
    with pytest.raises(CorruptRecordError):
        decode_value("tx", data)


def test_loader_last_record_wins_and_tombstone_forgets() -> None:
    loader = TransactionLogLoader()
    a = TxnRecord("a", 1, 0, 60_000, TxnState.EMPTY)
    loader.apply_bytes(*encode_record(a))
    loader.apply_bytes(*encode_record(TxnRecord("a", 1, 0, 60_000, TxnState.ONGOING,
                                                 frozenset({TP0}), 1, 1)))
    loader.apply_bytes(*encode_record(TxnRecord("b", 2, 0, 60_000, TxnState.EMPTY)))
    loader.apply_bytes(encode_key("b"), None)
    records = loader.records()
    assert list(records) == ["a"] and records["a"].state is TxnState.ONGOING

