"""The transaction coordinator's state of one ``transactional.id`` (Kafka's TransactionMetadata
and the decisions of its TransactionCoordinator), pure: no I/O, no clock (``now_ms`` is passed).

A request that changes the state does not change it at once: it *prepares* a
:class:`TxnRecord` (the value the shell must append to ``__transaction_state``), which becomes
the pending transition; the shell appends it and then calls :meth:`TransactionMetadata.complete`
(or :meth:`TransactionMetadata.abandon` when the append failed). While a transition is pending
every other request is answered CONCURRENT_TRANSACTIONS, so one transactional id has at most
one state write in flight and the log holds its states in the order they were taken.

States and the states each one may follow (Kafka's ``TransactionState.validPreviousStates``)::

    Empty              <- Empty, CompleteCommit, CompleteAbort
    Ongoing            <- Ongoing, Empty, CompleteCommit, CompleteAbort
    PrepareCommit      <- Ongoing
    PrepareAbort       <- Ongoing, PrepareEpochFence
    CompleteCommit     <- PrepareCommit
    CompleteAbort      <- PrepareAbort
    Dead               <- Empty, CompleteCommit, CompleteAbort
    PrepareEpochFence  <- Ongoing

PrepareEpochFence is never written: Fjord, as Kafka, fences an ongoing transaction's producer by
preparing its abort at the next epoch directly (``PrepareAbort`` with ``epoch + 1``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum

from fjord.errors import (
    ConcurrentTransactionsError,
    InvalidProducerIdMappingError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerFencedError,
)
from fjord.topic_partition import TopicPartition
from fjord.transactions.defaults import MAX_PRODUCER_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID


class TxnState(Enum):
    """Kafka's transaction states; the value is the byte stored in ``__transaction_state``."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        return "".join(word.capitalize() for word in self.name.split("_"))


_COMPLETE = frozenset({TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})
_PREPARE = frozenset({TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT})

#: Kafka's ``validPreviousStates``.
VALID_PREVIOUS_STATES: dict[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: frozenset({TxnState.EMPTY}) | _COMPLETE,
    TxnState.ONGOING: frozenset({TxnState.ONGOING, TxnState.EMPTY}) | _COMPLETE,
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING}),
    TxnState.PREPARE_ABORT: frozenset({TxnState.ONGOING, TxnState.PREPARE_EPOCH_FENCE}),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
    TxnState.DEAD: frozenset({TxnState.EMPTY}) | _COMPLETE,
    TxnState.PREPARE_EPOCH_FENCE: frozenset({TxnState.ONGOING}),
}


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka: an epoch at ``Short.MAX_VALUE - 1`` cannot be bumped for a client any more (one
    step is kept for the coordinator's own fencing bump); the next InitProducerId takes a new
    producer id."""
    return epoch >= MAX_PRODUCER_EPOCH - 1


@dataclass(frozen=True)
class TxnRecord:
    """One transactional id's state: what ``__transaction_state`` stores for it (the key is
    ``transactional_id``) plus ``last_producer_epoch``, which is kept in memory only (as in
    Kafka) to recognise a client's retry of an InitProducerId whose answer was lost.

    ``partitions`` is empty in Empty, CompleteCommit, CompleteAbort and Dead; it holds the
    transaction's partitions (``__consumer_offsets`` ones included) in the other states.
    ``txn_start_ms`` is -1 when no transaction runs."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition] = frozenset()
    txn_start_ms: int = -1
    last_update_ms: int = -1
    previous_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True)
class InitResult:
    """What InitProducerId decided. ``write`` is the record to append first (None: answer at
    once). ``fenced_ongoing``: the write aborts the previous producer's ongoing transaction
    (PrepareAbort at a bumped epoch); once written the client is answered
    CONCURRENT_TRANSACTIONS and retries after the abort completed. Otherwise, once ``write``
    (if any) is appended, the answer is ``producer_id``/``producer_epoch``."""

    write: TxnRecord | None
    producer_id: int
    producer_epoch: int
    fenced_ongoing: bool = False


class TransactionMetadata:
    """The state of one transactional id and its pending transition.

    Invariants:
    - ``current`` only changes through :meth:`complete` of the pending transition, which must
      be a valid successor (:data:`VALID_PREVIOUS_STATES`);
    - at most one transition is pending; while one is, every request raises
      ConcurrentTransactionsError;
    - for one producer id, the epoch never decreases; a new producer id (with epoch 0) is
      taken only when the epoch is exhausted (or for a new transactional id);
    - a request carrying another producer id than the mapped one raises
      InvalidProducerIdMappingError; another epoch, ProducerFencedError (a zombie).
    """

    def __init__(self, current: TxnRecord) -> None:
        self.current = current
        self.pending: TxnRecord | None = None

    @classmethod
    def new(
        cls, transactional_id: str, producer_id: int, timeout_ms: int, now_ms: int
    ) -> TransactionMetadata:
        """A transactional id seen for the first time, before its first write: Empty at epoch
        -1 (the InitProducerId that created it bumps it to 0)."""
        return cls(
            TxnRecord(
                transactional_id,
                producer_id,
                NO_PRODUCER_EPOCH,
                timeout_ms,
                TxnState.EMPTY,
                last_update_ms=now_ms,
            )
        )

    @property
    def transactional_id(self) -> str:
        return self.current.transactional_id

    @property
    def state(self) -> TxnState:
        return self.current.state

    # --- the pending transition ------------------------------------------------------------

    def _prepare(self, record: TxnRecord) -> TxnRecord:
        if self.pending is not None:
            raise ConcurrentTransactionsError(
                f"transactional id {self.transactional_id!r}: a state change is in flight"
            )
        if self.current.state not in VALID_PREVIOUS_STATES[record.state]:
            raise InvalidTxnStateError(
                f"transactional id {self.transactional_id!r}: cannot go from "
                f"{self.current.state.kafka_name} to {record.state.kafka_name}"
            )
        self.pending = record
        return record

    def complete(self, record: TxnRecord) -> None:
        """The pending ``record`` was appended: it is the state now."""
        if self.pending is None or self.pending is not record:
            raise InvalidTxnStateError(
                f"transactional id {self.transactional_id!r}: completing a transition that "
                "is not the pending one"
            )
        self.current = record
        self.pending = None

    def abandon(self, record: TxnRecord) -> None:
        """The append of the pending ``record`` failed: nothing changed."""
        if self.pending is record:
            self.pending = None

    def _check_not_pending(self) -> None:
        if self.pending is not None:
            raise ConcurrentTransactionsError(
                f"transactional id {self.transactional_id!r}: a state change is in flight"
            )

    def _check_producer(self, producer_id: int, producer_epoch: int) -> None:
        cur = self.current
        if producer_id != cur.producer_id:
            raise InvalidProducerIdMappingError(
                f"transactional id {cur.transactional_id!r} maps to producer id "
                f"{cur.producer_id}, not {producer_id}"
            )
        if producer_epoch != cur.producer_epoch:
            raise ProducerFencedError(
                f"producer {producer_id} epoch {producer_epoch} of transactional id "
                f"{cur.transactional_id!r} is fenced (the current epoch is {cur.producer_epoch})"
            )

    # --- requests ---------------------------------------------------------------------------

    def needs_new_producer_id(self) -> bool:
        """Whether the next successful InitProducerId must take a new producer id (the epoch
        is exhausted): the shell allocates one before calling :meth:`init_producer_id`."""
        return self.current.state is not TxnState.ONGOING and is_epoch_exhausted(
            self.current.producer_epoch
        )

    def init_producer_id(
        self,
        now_ms: int,
        timeout_ms: int,
        *,
        max_timeout_ms: int,
        expected: tuple[int, int] | None = None,
        new_producer_id: int | None = None,
    ) -> InitResult:
        """InitProducerId for this transactional id (Kafka's handleInitProducerId).

        ``expected`` is the (producer id, epoch) a client that already had one sends (KIP-360);
        ``new_producer_id`` must be given when :meth:`needs_new_producer_id`."""
        check_transaction_timeout(timeout_ms, max_timeout_ms)
        self._check_not_pending()
        cur = self.current
        if expected is not None and expected != (NO_PRODUCER_ID, NO_PRODUCER_EPOCH):
            pid, epoch = expected
            if (pid, epoch) == (cur.previous_producer_id, cur.last_producer_epoch) or (
                pid == cur.producer_id
                and epoch == cur.last_producer_epoch
                and cur.last_producer_epoch != NO_PRODUCER_EPOCH
            ):
                # A retry of a bump whose answer was lost: the bump already happened. Only
                # while nothing happened since (Empty): otherwise a zombie would get the epoch.
                if cur.state is not TxnState.EMPTY:
                    raise ProducerFencedError(
                        f"producer {pid} epoch {epoch} of transactional id "
                        f"{cur.transactional_id!r} is fenced (the current epoch is "
                        f"{cur.producer_epoch})"
                    )
                return InitResult(None, cur.producer_id, cur.producer_epoch)
            if pid not in (cur.producer_id, cur.previous_producer_id):
                raise InvalidProducerIdMappingError(
                    f"transactional id {cur.transactional_id!r} maps to producer id "
                    f"{cur.producer_id}, not {pid}"
                )
            elif epoch != cur.producer_epoch:
                raise ProducerFencedError(
                    f"producer {pid} epoch {epoch} of transactional id "
                    f"{cur.transactional_id!r} is fenced (the current epoch is "
                    f"{cur.producer_epoch})"
                )
        if cur.state in _PREPARE or cur.state is TxnState.PREPARE_EPOCH_FENCE:
            raise ConcurrentTransactionsError(
                f"transactional id {cur.transactional_id!r}: the previous transaction is "
                f"completing ({cur.state.kafka_name})"
            )
        if cur.state is TxnState.ONGOING:
            # Fence the previous producer and abort its transaction at the bumped epoch.
            write = self._prepare(self._fenced_abort(now_ms))
            return InitResult(write, write.producer_id, write.producer_epoch, fenced_ongoing=True)
        # Empty, CompleteCommit, CompleteAbort, Dead (a forgotten id starts over).
        if is_epoch_exhausted(cur.producer_epoch):
            if new_producer_id is None:
                raise ValueError("the epoch is exhausted: a new producer id is needed")
            record = TxnRecord(
                cur.transactional_id,
                new_producer_id,
                0,
                timeout_ms,
                TxnState.EMPTY,
                last_update_ms=now_ms,
                previous_producer_id=cur.producer_id,
                last_producer_epoch=NO_PRODUCER_EPOCH,
            )
        else:
            record = replace(
                cur,
                producer_epoch=cur.producer_epoch + 1,
                last_producer_epoch=cur.producer_epoch,
                timeout_ms=timeout_ms,
                state=TxnState.EMPTY,
                partitions=frozenset(),
                txn_start_ms=-1,
                last_update_ms=now_ms,
            )
        if cur.state is TxnState.DEAD:
            self.current = replace(cur, state=TxnState.EMPTY)  # Dead -> Empty: a fresh start
        write = self._prepare(record)
        return InitResult(write, write.producer_id, write.producer_epoch)

    def _fenced_abort(self, now_ms: int) -> TxnRecord:
        """PrepareAbort of the ongoing transaction at the next epoch (the same one when it is
        exhausted: the next InitProducerId then takes a new producer id)."""
        cur = self.current
        epoch = cur.producer_epoch if cur.producer_epoch >= MAX_PRODUCER_EPOCH else (
            cur.producer_epoch + 1
        )
        return replace(
            cur,
            producer_epoch=epoch,
            last_producer_epoch=cur.producer_epoch,
            state=TxnState.PREPARE_ABORT,
            last_update_ms=now_ms,
        )

    def add_partitions(
        self,
        now_ms: int,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> TxnRecord | None:
        """AddPartitionsToTxn (and AddOffsetsToTxn with the group's ``__consumer_offsets``
        partition). Returns the record to append, or None when every partition is in the
        ongoing transaction already (answer NONE at once)."""
        self._check_producer(producer_id, producer_epoch)
        self._check_not_pending()
        cur = self.current
        wanted = frozenset(partitions)
        if cur.state in _PREPARE:
            raise ConcurrentTransactionsError(
                f"transactional id {cur.transactional_id!r}: the previous transaction is "
                f"completing ({cur.state.kafka_name})"
            )
        if cur.state is TxnState.ONGOING and wanted <= cur.partitions:
            return None
        if cur.state not in VALID_PREVIOUS_STATES[TxnState.ONGOING]:
            raise InvalidTxnStateError(
                f"transactional id {cur.transactional_id!r}: cannot add partitions in state "
                f"{cur.state.kafka_name}"
            )
        start = cur.txn_start_ms if cur.state is TxnState.ONGOING else now_ms
        return self._prepare(
            replace(
                cur,
                state=TxnState.ONGOING,
                partitions=cur.partitions | wanted,
                txn_start_ms=start,
                last_update_ms=now_ms,
            )
        )

    def end_transaction(
        self, now_ms: int, producer_id: int, producer_epoch: int, commit: bool
    ) -> TxnRecord | None:
        """EndTxn (Kafka's handleEndTransaction from a client). Returns the PrepareCommit /
        PrepareAbort record to append (then the markers go out), or None when the same end
        has completed already (a retry: answer NONE)."""
        self._check_producer(producer_id, producer_epoch)
        self._check_not_pending()
        cur = self.current
        wanted = "commit" if commit else "abort"
        if cur.state is TxnState.ONGOING:
            target = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
            return self._prepare(replace(cur, state=target, last_update_ms=now_ms))
        done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        under_way = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        if cur.state is done:
            return None
        if cur.state is under_way:
            raise ConcurrentTransactionsError(
                f"transactional id {cur.transactional_id!r}: the {wanted} is completing"
            )
        raise InvalidTxnStateError(
            f"transactional id {cur.transactional_id!r}: cannot {wanted} in state "
            f"{cur.state.kafka_name}"
        )

    def complete_transaction(self, now_ms: int) -> TxnRecord:
        """After every marker of a PrepareCommit/PrepareAbort is written: the CompleteCommit /
        CompleteAbort record to append (partitions cleared)."""
        cur = self.current
        if cur.state not in _PREPARE:
            raise InvalidTxnStateError(
                f"transactional id {cur.transactional_id!r}: nothing to complete in state "
                f"{cur.state.kafka_name}"
            )
        target = (
            TxnState.COMPLETE_COMMIT
            if cur.state is TxnState.PREPARE_COMMIT
            else TxnState.COMPLETE_ABORT
        )
        return self._prepare(
            replace(cur, state=target, partitions=frozenset(), last_update_ms=now_ms)
        )

    def expire(self, now_ms: int, expiration_ms: int) -> TxnRecord | None:
        """``transactional.id.expiration.ms``: an id with no transaction (Empty, Complete*)
        not used for that long is forgotten: the Dead record to write (the shell writes it
        as a tombstone), or None when it is not expirable now."""
        if self.pending is not None or not _expirable(self.current, now_ms, expiration_ms):
            return None
        return self._prepare(replace(self.current, state=TxnState.DEAD, last_update_ms=now_ms))

    def timed_out(self, now_ms: int) -> bool:
        """An ongoing transaction older than its timeout (the coordinator aborts it)."""
        cur = self.current
        return (
            self.pending is None
            and cur.state is TxnState.ONGOING
            and cur.txn_start_ms >= 0
            and now_ms >= cur.txn_start_ms + cur.timeout_ms
        )

    def abort_timed_out(self, now_ms: int) -> TxnRecord:
        """The coordinator aborts a timed-out transaction: PrepareAbort at the next epoch, so
        the silent producer is fenced if it comes back (Kafka's behaviour)."""
        if not self.timed_out(now_ms):
            raise InvalidTxnStateError(
                f"transactional id {self.transactional_id!r} has no timed-out transaction"
            )
        return self._prepare(self._fenced_abort(now_ms))


def _expirable(record: TxnRecord, now_ms: int, expiration_ms: int) -> bool:
    return (
        record.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
        and record.last_update_ms >= 0
        and now_ms - record.last_update_ms >= expiration_ms
    )


def check_transaction_timeout(timeout_ms: int, max_timeout_ms: int) -> None:
    if timeout_ms <= 0 or timeout_ms > max_timeout_ms:
        raise InvalidTransactionTimeoutError(
            f"transaction.timeout.ms={timeout_ms} must be in (0, {max_timeout_ms}] "
            "(transaction.max.timeout.ms)"
        )
