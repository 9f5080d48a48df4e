"""The transactional producer's side of Kafka's transaction protocol (the Java client's
TransactionManager): the producer's transaction state, the coordinator it talks to, and the
InitTransactions / AddPartitionsToTxn / EndTxn exchanges. Runs on the producer's event loop.

States (confluent-kafka's names in the errors)::

    UNINITIALIZED --init_transactions--> READY --begin_transaction--> IN_TRANSACTION
    IN_TRANSACTION --commit_transaction--> READY
    IN_TRANSACTION | ABORTABLE_ERROR --abort_transaction--> READY
    IN_TRANSACTION --a record failed / the coordinator refused a partition--> ABORTABLE_ERROR
    any --fenced, or the coordinator's INVALID_TXN_STATE / INVALID_PRODUCER_ID_MAPPING--> FATAL

Invariants: a batch is drained for a partition only once the coordinator has added that
partition to the current transaction (:meth:`ClientTransactionManager.may_send`); after an
abort the producer takes a new epoch (InitTransactions with its current id and epoch, KIP-360),
so sequences restart and nothing of the aborted transaction can be mistaken for a duplicate.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from fjord._proto import broker_pb2, common_pb2, coordinator_pb2
from fjord.client.accumulator import IdempotenceState
from fjord.client.network import Network, transport_error
from fjord.client.types import ConsumerGroupMetadata, OffsetAndMetadata
from fjord.errors import (
    ErrorCode,
    FjordError,
    InvalidTxnStateError,
    KafkaTimeoutError,
    TransactionAbortedError,
    TransactionError,
    error_code_from_number,
    error_for_code,
)
from fjord.groups.defaults import OFFSETS_TOPIC
from fjord.groups.offsets_topic import group_partition
from fjord.topic_partition import TopicPartition

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Kafka's client retries AddPartitionsToTxn after CONCURRENT_TRANSACTIONS quickly (20 ms):
#: the previous transaction's markers are usually written within milliseconds.
CONCURRENT_RETRY_BACKOFF_S = 0.02

#: Errors after which the coordinator must be found again.
_REFIND = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})

#: Errors after which the producer cannot go on (confluent-kafka: fatal).
_FATAL = frozenset(
    {
        ErrorCode.PRODUCER_FENCED,
        ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.INVALID_PRODUCER_ID_MAPPING,
        ErrorCode.INVALID_TXN_STATE,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        ErrorCode.INVALID_TRANSACTION_TIMEOUT,
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        ErrorCode.UNSUPPORTED_VERSION,
    }
)


class TxnClientState(enum.Enum):
    UNINITIALIZED = "UNINITIALIZED"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"


class ClientTransactionManager:
    """One transactional producer's transaction state (see the module docstring)."""

    def __init__(
        self,
        transactional_id: str,
        timeout_ms: int,
        network: Network,
        idempotence: IdempotenceState,
        *,
        retry_backoff_ms: int,
        request_timeout_s: float,
        wake_sender: Callable[[], None],
        fail_queued: Callable[[BaseException], None],
    ) -> None:
        """``fail_queued(error)`` fails every batch not sent yet (the transaction cannot
        commit: they would wait for nothing)."""
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self._network = network
        self._idempotence = idempotence
        self._backoff_s = retry_backoff_ms / 1000
        self._request_timeout_s = request_timeout_s
        self._wake_sender = wake_sender
        self._fail_queued = fail_queued
        self.state = TxnClientState.UNINITIALIZED
        self.error: TransactionError | None = None
        self._coordinator: str | None = None
        #: Partitions the coordinator added to the current transaction.
        self.added: set[TopicPartition] = set()
        #: Partitions with records waiting for their AddPartitionsToTxn.
        self._to_add: set[TopicPartition] = set()
        self._adding: asyncio.Task[None] | None = None

    # --- state checks -----------------------------------------------------------------------

    def _fail_if_fatal(self) -> None:
        if self.state is TxnClientState.FATAL_ERROR:
            assert self.error is not None
            raise self.error

    def check_send(self) -> None:
        """Raise unless a record may be sent now (inside a transaction)."""
        self._fail_if_fatal()
        if self.state is TxnClientState.ABORTABLE_ERROR:
            assert self.error is not None
            raise self.error
        if self.state is not TxnClientState.IN_TRANSACTION:
            raise InvalidTxnStateError(
                f"send() needs begin_transaction() first (transaction state {self.state.value})"
            )

    def begin(self) -> None:
        self._fail_if_fatal()
        if self.state is not TxnClientState.READY:
            raise InvalidTxnStateError(
                f"begin_transaction() in state {self.state.value}: "
                + ("call init_transactions() first" if self.state is TxnClientState.UNINITIALIZED
                   else "commit or abort the current transaction first")
            )
        self.added.clear()
        self.state = TxnClientState.IN_TRANSACTION

    def _fatal(self, code: ErrorCode, message: str) -> TransactionError:
        cause = error_for_code(code, message)
        self.error = TransactionError(message, code, fatal=True, cause=cause)
        self.state = TxnClientState.FATAL_ERROR
        log.error("transactional producer %r: fatal error %s", self.transactional_id, message)
        self._fail_queued(self.error)
        return self.error

    def abortable(self, error: BaseException) -> None:
        """A record of the transaction failed: it can only be aborted now."""
        if self.state is not TxnClientState.IN_TRANSACTION:
            return
        code = error.code if isinstance(error, FjordError) else ErrorCode.UNKNOWN_SERVER_ERROR
        if code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH):
            self._fatal(code, f"fenced while producing: {error}")
            return
        self.error = TransactionAbortedError(
            f"a record of the transaction failed ({error}): abort_transaction() and retry",
            code, cause=error,
        )
        self.state = TxnClientState.ABORTABLE_ERROR
        self._fail_queued(self.error)

    # --- the coordinator --------------------------------------------------------------------

    async def _find(self) -> str:
        if self._coordinator is not None:
            return self._coordinator
        request = broker_pb2.FindCoordinatorRequest(key=self.transactional_id, key_type=1)
        errors: list[str] = []
        for address in self._network.candidate_addresses():
            try:
                response = await self._network.broker(address).FindCoordinator(
                    request, timeout=self._request_timeout_s
                )
            except Exception as exc:
                errors.append(str(transport_error(exc, address)))
                continue
            code = error_code_from_number(response.error.code)
            if code is not ErrorCode.NONE:
                raise error_for_code(
                    code, f"FindCoordinator(transaction): {response.error.message}"
                )
            self._coordinator = f"{response.coordinator.host}:{response.coordinator.port}"
            return self._coordinator
        raise FjordError(
            "no broker answered FindCoordinator: " + "; ".join(errors[-3:]),
            ErrorCode.COORDINATOR_NOT_AVAILABLE,
        )

    async def _call(
        self,
        what: str,
        send: Callable[[Any], Awaitable[T]],
        deadline: float,
        *,
        retry_concurrent: bool = True,
    ) -> T:
        """``send(stub)`` to the coordinator until its ``error`` is not retriable; returns the
        response (its error NONE or not retriable). Retries: the coordinator moved or is
        loading, CONCURRENT_TRANSACTIONS, transport errors; KafkaTimeoutError at ``deadline``."""
        last = ""
        while True:
            try:
                address = await self._find()
                try:
                    response = await send(self._network.coordinator(address))
                except Exception as exc:
                    self._coordinator = None
                    raise transport_error(exc, address) from exc
                code = error_code_from_number(response.error.code)  # type: ignore[attr-defined]
                if code is ErrorCode.NONE or not (
                    code.retriable or (code is ErrorCode.CONCURRENT_TRANSACTIONS
                                       and retry_concurrent)
                ):
                    return response
                if code in _REFIND:
                    self._coordinator = None
                last = f"{code.name} {response.error.message}"  # type: ignore[attr-defined]
                backoff = (
                    CONCURRENT_RETRY_BACKOFF_S
                    if code is ErrorCode.CONCURRENT_TRANSACTIONS else self._backoff_s
                )
            except FjordError as exc:
                if not exc.retriable:
                    # Refused outright (e.g. TRANSACTIONAL_ID_AUTHORIZATION_FAILED from
                    # FindCoordinator): the producer cannot go on.
                    raise self._fatal(exc.code, f"{what}: {exc}") from exc
                last = str(exc)
                backoff = self._backoff_s
            if time.monotonic() + backoff >= deadline:
                raise TransactionError(
                    f"{what} timed out (last error: {last})",
                    ErrorCode.REQUEST_TIMED_OUT, retriable=True,
                    cause=KafkaTimeoutError(last),
                )
            await asyncio.sleep(backoff)

    # --- operations -------------------------------------------------------------------------

    async def init(self, timeout_s: float, *, bump: bool = False) -> None:
        """InitTransactions: a producer id and epoch (the previous instance with the same
        ``transactional.id`` is fenced, its open transaction aborted). ``bump``: after an abort,
        with this producer's own id and epoch (a new epoch, same id)."""
        self._fail_if_fatal()
        if not bump and self.state is not TxnClientState.UNINITIALIZED:
            raise InvalidTxnStateError(
                f"init_transactions() in state {self.state.value}: called once per producer"
            )
        idem = self._idempotence
        request = coordinator_pb2.InitTransactionsRequest(
            transactional_id=self.transactional_id,
            transaction_timeout_ms=self.timeout_ms,
            producer_id=idem.producer_id if bump else -1,
            producer_epoch=idem.producer_epoch if bump else -1,
        )
        response = await self._call(
            "init_transactions()",
            lambda stub: stub.InitTransactions(request, timeout=self._request_timeout_s),
            time.monotonic() + timeout_s,
        )
        code = error_code_from_number(response.error.code)
        if code is not ErrorCode.NONE:
            raise self._fatal(code, f"InitProducerId: {code.name} {response.error.message}")
        idem.set_producer_id(response.producer_id, response.producer_epoch)
        log.info(
            "transactional producer %r: producer id %d epoch %d", self.transactional_id,
            response.producer_id, response.producer_epoch,
        )
        self.added.clear()
        self.state = TxnClientState.READY
        self._wake_sender()

    def may_send(self, tp: TopicPartition) -> bool:
        """Whether batches of ``tp`` may be drained; if not, its AddPartitionsToTxn is
        started (the sender is woken when it is answered)."""
        if tp in self.added:
            return True
        if self.state is TxnClientState.IN_TRANSACTION:
            self._to_add.add(tp)
            if self._adding is None or self._adding.done():
                self._adding = asyncio.ensure_future(self._add_partitions())
        return False

    async def _add_partitions(self) -> None:
        idem = self._idempotence
        while self._to_add and self.state is TxnClientState.IN_TRANSACTION:
            wanted = sorted(self._to_add)
            request = coordinator_pb2.AddPartitionsToTxnRequest(
                transactional_id=self.transactional_id,
                producer_id=idem.producer_id,
                producer_epoch=idem.producer_epoch,
                partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in wanted],
            )
            try:
                response = await self._call(
                    "AddPartitionsToTxn",
                    functools.partial(self._add_request, request),
                    time.monotonic() + self._request_timeout_s * 4,
                )
            except FjordError as exc:
                self.abortable(exc)
                break
            code = error_code_from_number(response.error.code)
            if code in _FATAL:
                self._fatal(code, f"AddPartitionsToTxn: {code.name} {response.error.message}")
                break
            if code is not ErrorCode.NONE:
                self.abortable(error_for_code(code, response.error.message))
                break
            failed = None
            for result in response.results:
                tp = TopicPartition(result.partition.topic, result.partition.partition)
                part_code = error_code_from_number(result.error.code)
                if part_code is ErrorCode.NONE:
                    self.added.add(tp)
                    self._to_add.discard(tp)
                elif part_code is not ErrorCode.OPERATION_NOT_ATTEMPTED and failed is None:
                    failed = error_for_code(
                        part_code, f"AddPartitionsToTxn {tp.topic}-{tp.partition}: "
                        f"{result.error.message}",
                    )
            self._wake_sender()
            if failed is not None:
                self.abortable(failed)
                break
        self._wake_sender()

    async def send_offsets(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        group: ConsumerGroupMetadata,
        timeout_s: float,
    ) -> None:
        """AddOffsetsToTxn (the group's ``__consumer_offsets`` partition joins the
        transaction), then TxnOffsetCommit to the group's coordinator: the offsets count only
        if the transaction commits. A refused commit (stale generation, ...) makes the
        transaction abortable."""
        self.check_send()
        deadline = time.monotonic() + timeout_s
        idem = self._idempotence
        add = coordinator_pb2.AddOffsetsToTxnRequest(
            transactional_id=self.transactional_id, producer_id=idem.producer_id,
            producer_epoch=idem.producer_epoch, group_id=group.group_id,
        )
        response = await self._call(
            "send_offsets_to_transaction()",
            lambda stub: stub.AddOffsetsToTxn(add, timeout=self._request_timeout_s),
            deadline,
        )
        code = error_code_from_number(response.error.code)
        if code in _FATAL:
            raise self._fatal(code, f"AddOffsetsToTxn: {code.name} {response.error.message}")
        if code is not ErrorCode.NONE:
            self.abortable(error_for_code(code, response.error.message))
            assert self.error is not None
            raise self.error
        self.added.add(TopicPartition(OFFSETS_TOPIC, group_partition(group.group_id)))
        by_topic: dict[str, list[coordinator_pb2.OffsetCommitPartition]] = {}
        for tp, om in sorted(offsets.items()):
            by_topic.setdefault(tp.topic, []).append(
                coordinator_pb2.OffsetCommitPartition(
                    partition=tp.partition, committed_offset=om.offset,
                    committed_leader_epoch=-1 if om.leader_epoch is None else om.leader_epoch,
                    committed_metadata=om.metadata,
                )
            )
        commit = coordinator_pb2.TxnOffsetCommitRequest(
            transactional_id=self.transactional_id, group_id=group.group_id,
            producer_id=idem.producer_id, producer_epoch=idem.producer_epoch,
            generation_id=group.generation_id, member_id=group.member_id,
            group_instance_id=group.group_instance_id or "",
            topics=[
                coordinator_pb2.OffsetCommitTopic(name=name, partitions=parts)
                for name, parts in by_topic.items()
            ],
        )
        last = ""
        while True:
            failed: ErrorCode | None = None
            try:
                address = await self._network.find_coordinator(group.group_id)
                try:
                    answer = await self._network.coordinator(address).TxnOffsetCommit(
                        commit, timeout=self._request_timeout_s
                    )
                except Exception as exc:
                    raise transport_error(exc, address) from exc
                codes = {error_code_from_number(answer.error.code)} | {
                    error_code_from_number(p.error.code)
                    for t in answer.topics for p in t.partitions
                }
                codes.discard(ErrorCode.NONE)
                if not codes:
                    return
                failed = next(iter(sorted(codes, key=lambda c: c.retriable)))
                last = failed.name
                if not failed.retriable:
                    break
            except FjordError as exc:
                if not exc.retriable:
                    failed = exc.code
                    last = str(exc)
                    break
                last = str(exc)
            if time.monotonic() + self._backoff_s >= deadline:
                raise TransactionError(
                    f"send_offsets_to_transaction() timed out (last error: {last})",
                    ErrorCode.REQUEST_TIMED_OUT, retriable=True,
                )
            await asyncio.sleep(self._backoff_s)
        assert failed is not None
        if failed in _FATAL:
            raise self._fatal(failed, f"TxnOffsetCommit: {last}")
        self.abortable(error_for_code(failed, f"TxnOffsetCommit: {last}"))
        assert self.error is not None
        raise self.error

    def _add_request(
        self, request: coordinator_pb2.AddPartitionsToTxnRequest, stub: Any
    ) -> Awaitable[coordinator_pb2.AddPartitionsToTxnResponse]:
        return stub.AddPartitionsToTxn(
            request, timeout=self._request_timeout_s
        )

    async def end(self, commit: bool, timeout_s: float) -> None:
        """EndTxn after the transaction's records were flushed. Commit needs IN_TRANSACTION
        (an abortable error is raised as such); abort works in IN_TRANSACTION and
        ABORTABLE_ERROR and then takes a new epoch."""
        self._fail_if_fatal()
        if commit and self.state is TxnClientState.ABORTABLE_ERROR:
            assert self.error is not None
            raise self.error
        if self.state not in (TxnClientState.IN_TRANSACTION, TxnClientState.ABORTABLE_ERROR):
            raise InvalidTxnStateError(
                f"{'commit' if commit else 'abort'}_transaction() in state {self.state.value}: "
                "no transaction was begun"
            )
        deadline = time.monotonic() + timeout_s
        self._to_add.clear()
        if self._adding is not None and not self._adding.done():
            self._adding.cancel()
        if self.added:
            idem = self._idempotence
            request = coordinator_pb2.EndTxnRequest(
                transactional_id=self.transactional_id,
                producer_id=idem.producer_id,
                producer_epoch=idem.producer_epoch,
                committed=commit,
            )
            response = await self._call(
                "commit_transaction()" if commit else "abort_transaction()",
                lambda stub: stub.EndTxn(request, timeout=self._request_timeout_s),
                deadline,
            )
            code = error_code_from_number(response.error.code)
            if code is not ErrorCode.NONE:
                raise self._fatal(code, f"EndTxn: {code.name} {response.error.message}")
        self.added.clear()
        self.error = None
        if commit:
            self.state = TxnClientState.READY
            return
        # A new epoch after every abort: sequences restart, batches of the aborted transaction
        # that were never acknowledged cannot collide with the next transaction's.
        await self.init(max(deadline - time.monotonic(), self._request_timeout_s), bump=True)
