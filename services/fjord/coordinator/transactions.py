"""The transaction coordinator's shell: owned ``__transaction_state`` partitions, one
:class:`~fjord.transactions.state.TransactionMetadata` per transactional id, state writes,
transaction markers, completion after a takeover and the timeout sweep. No gRPC and no etcd
here: the servicer translates requests into these calls and the server decides which
partitions are owned (those of ``offsets-owners/<p>``, with ``__consumer_offsets``), claims and
replays them.

See docs/transactions.md ("The transaction coordinator").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from fjord.coordinator.manager import Appender, wall_clock_ms
from fjord.coordinator.ownership import PartitionOwnership
from fjord.errors import (
    ConcurrentTransactionsError,
    ErrorCode,
    FjordError,
    InvalidGroupIdError,
    InvalidRequestError,
    error_for_code,
)
from fjord.groups.defaults import OFFSETS_TOPIC
from fjord.groups.offsets_topic import group_partition
from fjord.observability.metrics import record_transaction_end
from fjord.topic_partition import TopicPartition
from fjord.transactions.defaults import (
    TRANSACTION_MAX_TIMEOUT_MS,
    TRANSACTION_STATE_TOPIC,
    TRANSACTIONAL_ID_EXPIRATION_MS,
)
from fjord.transactions.log import encode_record, transaction_partition
from fjord.transactions.state import TransactionMetadata, TxnRecord, TxnState

log = logging.getLogger(__name__)

#: Seconds between two rounds of WriteTxnMarkers for the partitions that failed (no leader,
#: not enough replicas, a timeout).
MARKER_RETRY_BACKOFF_S = 0.2

#: Marker errors after which a partition needs no marker any more: written, or the partition
#: has a newer epoch of the producer (the marker is stale: Kafka's coordinator treats it as
#: done), or the topic is gone.
_MARKER_DONE = frozenset(
    {ErrorCode.NONE, ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
)


class MarkerWriter(Protocol):
    """Sends WriteTxnMarkers to the leaders of ``partitions``; answers each partition's error
    (transport failures as retriable codes, never an exception)."""

    async def __call__(
        self,
        producer_id: int,
        producer_epoch: int,
        committed: bool,
        coordinator_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]: ...


@dataclass(eq=False)
class _TxnPartition:
    """An owned ``__transaction_state`` partition at one coordinator epoch."""

    number: int
    epoch: int
    loaded: bool = False
    txns: dict[str, TransactionMetadata] = field(default_factory=dict)


class TransactionManager(PartitionOwnership[_TxnPartition]):
    """Every transactional id this coordinator serves, by ``__transaction_state`` partition.

    Invariants:
    - a transactional id is served only while its partition is owned and loaded; otherwise
      NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS / COORDINATOR_NOT_AVAILABLE;
    - a state change is answered only after its record is appended (acks=all) at the
      partition's coordinator epoch; a failed append leaves the state as it was;
    - every transaction in PrepareCommit/PrepareAbort has one completion task that writes its
      markers to every partition (retrying until each is written or needs none), then writes
      CompleteCommit/CompleteAbort; the task ends when the partition is lost (the next owner
      does the same after its replay);
    - an append refused as fenced drops the partition, and it is not owned again at that
      epoch or an older one.
    """

    internal_topic = TRANSACTION_STATE_TOPIC

    def __init__(
        self,
        appender: Appender,
        markers: MarkerWriter,
        new_producer_id: Callable[[], Awaitable[int]],
        complete_offsets: Callable[[int, int, int, bool], Awaitable[None]] | None = None,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        max_timeout_ms: int = TRANSACTION_MAX_TIMEOUT_MS,
        expiration_ms: int = TRANSACTIONAL_ID_EXPIRATION_MS,
        partition_exists: Callable[[str, int], bool] | None = None,
    ) -> None:
        super().__init__()
        self._appender = appender
        self._markers = markers
        self._new_producer_id = new_producer_id
        #: (``__consumer_offsets`` partition, producer id, epoch, committed): tells the group
        #: coordinator owning that partition that the transaction ended (raises to retry).
        self._complete_offsets = complete_offsets
        self._clock = clock
        self.max_timeout_ms = max_timeout_ms
        self.expiration_ms = expiration_ms
        self._partition_exists = partition_exists
        self._completions: dict[str, asyncio.Task[None]] = {}
        #: Why a transactional id's prepared abort was started by the coordinator itself
        #: ("timeout", "fenced"), for the outcome metric; absent: the producer's EndTxn.
        self._abort_reasons: dict[str, str] = {}
        self.active = False

    # --- ownership ---------------------------------------------------------------------------

    def _new_partition(self, number: int, epoch: int) -> _TxnPartition:
        return _TxnPartition(number, epoch)

    def install(self, number: int, epoch: int, records: Mapping[str, TxnRecord]) -> bool:
        """Serve partition ``number`` from its replay; transactions left in PrepareCommit or
        PrepareAbort by the previous owner are completed (markers written again)."""
        part = self._partitions.get(number)
        if part is None or part.epoch != epoch or part.loaded:
            return False
        for tid, record in records.items():
            part.txns[tid] = TransactionMetadata(record)
        part.loaded = True
        unfinished = [m for m in part.txns.values() if m.state in _PREPARE_STATES]
        for meta in unfinished:
            self._start_completion(part, meta)
        log.info(
            "serving __transaction_state partition %d (epoch %d): %d transactional ids, %d "
            "transactions to complete",
            number, epoch, len(records), len(unfinished),
        )
        return True

    def _release(self, part: _TxnPartition) -> None:
        """Cancel the completions (marker writing) of ``part``'s transactions."""
        for tid in part.txns:
            task = self._completions.pop(tid, None)
            if task is not None:
                task.cancel()
        part.txns.clear()

    async def close(self) -> None:
        self.active = False
        self.drop_all()
        tasks = list(self._completions.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _partition_for(self, transactional_id: str) -> _TxnPartition:
        if not transactional_id:
            raise InvalidRequestError("the transactional id is empty")
        if not self.active:
            raise error_for_code(
                ErrorCode.COORDINATOR_NOT_AVAILABLE, "the coordinator is not registered"
            )
        number = transaction_partition(transactional_id)
        part = self._partitions.get(number)
        if part is None:
            raise error_for_code(
                ErrorCode.NOT_COORDINATOR,
                f"transactional id {transactional_id!r} lives in {TRANSACTION_STATE_TOPIC} "
                f"partition {number}, which this coordinator does not own",
            )
        if not part.loaded:
            raise error_for_code(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                f"{TRANSACTION_STATE_TOPIC} partition {number} is still loading",
            )
        return part

    # --- writes -----------------------------------------------------------------------------

    async def _write(
        self, part: _TxnPartition, meta: TransactionMetadata, record: TxnRecord
    ) -> None:
        """Append ``record`` (the pending transition of ``meta``) and make it current."""
        future = self._appender.submit(part.number, part.epoch, [encode_record(record)])
        try:
            await asyncio.shield(future)
        except FjordError as exc:
            meta.abandon(record)
            if exc.code is ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                self.fence(part.number, part.epoch)
                raise error_for_code(
                    ErrorCode.NOT_COORDINATOR, "a newer coordinator owns this transactional id"
                ) from exc
            log.warning(
                "%s-%d: writing %s for %r failed: %s",
                TRANSACTION_STATE_TOPIC, part.number, record.state.kafka_name,
                record.transactional_id, exc,
            )
            # Kafka: a failed state write is COORDINATOR_NOT_AVAILABLE (retriable) to clients.
            raise error_for_code(
                ErrorCode.COORDINATOR_NOT_AVAILABLE, f"the state write failed: {exc.code.name}"
            ) from exc
        except BaseException:
            meta.abandon(record)
            raise
        if not self._owns(part) or part.txns.get(record.transactional_id) is not meta:
            raise error_for_code(
                ErrorCode.NOT_COORDINATOR, "this coordinator lost the transactional id"
            )
        meta.complete(record)

    # --- requests ---------------------------------------------------------------------------

    async def init_producer_id(
        self,
        transactional_id: str,
        timeout_ms: int,
        producer_id: int = -1,
        producer_epoch: int = -1,
    ) -> tuple[int, int]:
        """InitProducerId with a transactional id: (producer id, epoch), or a typed error
        (CONCURRENT_TRANSACTIONS while a previous transaction is being completed or aborted
        for this call: retry)."""
        part = self._partition_for(transactional_id)
        meta = part.txns.get(transactional_id)
        new_pid = None
        if meta is None or meta.needs_new_producer_id() or meta.state is TxnState.DEAD:
            new_pid = await self._new_producer_id()
            part = self._partition_for(transactional_id)  # ownership may have changed
            meta = part.txns.get(transactional_id)
            if meta is None:
                meta = TransactionMetadata.new(
                    transactional_id, new_pid, timeout_ms, self._clock()
                )
                part.txns[transactional_id] = meta
        expected = None if producer_id < 0 else (producer_id, producer_epoch)
        result = meta.init_producer_id(
            self._clock(),
            timeout_ms,
            max_timeout_ms=self.max_timeout_ms,
            expected=expected,
            new_producer_id=new_pid,
        )
        if result.write is not None:
            await self._write(part, meta, result.write)
        if result.fenced_ongoing:
            log.info(
                "transactional id %r: fenced epoch %d, aborting its ongoing transaction",
                transactional_id, meta.current.last_producer_epoch,
            )
            self._abort_reasons[transactional_id] = "fenced"
            self._start_completion(part, meta)
            raise ConcurrentTransactionsError(
                f"transactional id {transactional_id!r}: aborting the previous producer's "
                "transaction; retry"
            )
        return result.producer_id, result.producer_epoch

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn: {partition: error}. Unknown partitions fail the whole request
        (UNKNOWN_TOPIC_OR_PARTITION for them, OPERATION_NOT_ATTEMPTED for the others), as
        Kafka does; request-wide errors are raised."""
        wanted = list(dict.fromkeys(partitions))
        part = self._partition_for(transactional_id)
        unknown = [
            tp for tp in wanted
            if self._partition_exists is not None and not self._partition_exists(*tp)
        ]
        if unknown:
            return {
                tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if tp in unknown else ErrorCode.OPERATION_NOT_ATTEMPTED
                for tp in wanted
            }
        meta = part.txns.get(transactional_id)
        if meta is None:
            raise error_for_code(
                ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                f"transactional id {transactional_id!r} is unknown: call InitProducerId first",
            )
        record = meta.add_partitions(self._clock(), producer_id, producer_epoch, wanted)
        if record is not None:
            await self._write(part, meta, record)
        return dict.fromkeys(wanted, ErrorCode.NONE)

    async def add_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> None:
        """AddOffsetsToTxn: the group's ``__consumer_offsets`` partition joins the
        transaction (its pending offsets are completed with it)."""
        if not group_id:
            raise InvalidGroupIdError("the group id is empty")
        tp = TopicPartition(OFFSETS_TOPIC, group_partition(group_id))
        errors = await self.add_partitions(transactional_id, producer_id, producer_epoch, [tp])
        code = errors.get(tp, ErrorCode.NONE)
        if code is not ErrorCode.NONE:
            raise error_for_code(code, f"adding {OFFSETS_TOPIC}-{tp.partition}")

    async def end_transaction(
        self, transactional_id: str, producer_id: int, producer_epoch: int, committed: bool
    ) -> None:
        """EndTxn: answered once PrepareCommit/PrepareAbort is written; the markers and the
        completion follow in the background."""
        part = self._partition_for(transactional_id)
        meta = part.txns.get(transactional_id)
        if meta is None:
            raise error_for_code(
                ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                f"transactional id {transactional_id!r} is unknown: call InitProducerId first",
            )
        record = meta.end_transaction(self._clock(), producer_id, producer_epoch, committed)
        if record is None:
            return
        await self._write(part, meta, record)
        self._start_completion(part, meta)

    def describe(self, transactional_id: str) -> TxnRecord | None:
        """The current state of a served transactional id (None: unknown)."""
        meta = self._partition_for(transactional_id).txns.get(transactional_id)
        return None if meta is None else meta.current

    def list_transactions(self) -> tuple[ErrorCode, list[TxnRecord]]:
        """Every transactional id of the loaded partitions (Kafka's ListTransactions); the
        error is COORDINATOR_LOAD_IN_PROGRESS while an owned partition is still loading."""
        if not self.active:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, []
        records = [
            meta.current
            for part in self._partitions.values() if part.loaded
            for meta in part.txns.values()
        ]
        loading = any(not part.loaded for part in self._partitions.values())
        error = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if loading else ErrorCode.NONE
        return error, sorted(records, key=lambda r: r.transactional_id)

    # --- completion -------------------------------------------------------------------------

    def _start_completion(self, part: _TxnPartition, meta: TransactionMetadata) -> None:
        tid = meta.transactional_id
        running = self._completions.get(tid)
        if running is not None and not running.done():
            return
        task = asyncio.ensure_future(self._complete(part, meta))
        task.set_name(f"transaction {tid!r} completion")
        self._completions[tid] = task

        def forget(t: asyncio.Task[None]) -> None:
            if self._completions.get(tid) is t:
                del self._completions[tid]

        task.add_done_callback(forget)

    async def _complete(self, part: _TxnPartition, meta: TransactionMetadata) -> None:
        """Write the markers of ``meta``'s prepared transaction to every partition, then its
        Complete state; retries while the partition is owned."""
        record = meta.current
        committed = record.state is TxnState.PREPARE_COMMIT
        remaining = set(record.partitions)
        started = time.monotonic()
        while remaining:
            if not self._owns(part):
                return
            try:
                results = await self._markers(
                    record.producer_id, record.producer_epoch, committed, part.epoch, remaining
                )
            except Exception:
                log.exception("WriteTxnMarkers for %r failed", record.transactional_id)
                results = {}
            for tp, code in results.items():
                if code in _MARKER_DONE:
                    remaining.discard(tp)
                elif code is ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                    log.error(
                        "markers of %r on %s: a newer transaction coordinator wrote there; "
                        "giving the transaction up", record.transactional_id, tp,
                    )
                    self.fence(part.number, part.epoch)
                    return
            if remaining:
                log.debug(
                    "markers of %r: %d partitions left (%s)", record.transactional_id,
                    len(remaining), {tp: results.get(tp) for tp in remaining},
                )
                await asyncio.sleep(MARKER_RETRY_BACKOFF_S)
        offsets_partitions = sorted(
            tp.partition for tp in record.partitions if tp.topic == OFFSETS_TOPIC
        )
        while offsets_partitions and self._complete_offsets is not None:
            if not self._owns(part):
                return
            number = offsets_partitions[0]
            try:
                await self._complete_offsets(
                    number, record.producer_id, record.producer_epoch, committed
                )
                offsets_partitions.pop(0)
            except Exception as exc:
                log.info(
                    "completing the offsets of %r in %s-%d: %s; retrying",
                    record.transactional_id, OFFSETS_TOPIC, number, exc,
                )
                await asyncio.sleep(MARKER_RETRY_BACKOFF_S)
        while self._owns(part) and meta.state in _PREPARE_STATES:
            try:
                await self._write(part, meta, meta.complete_transaction(self._clock()))
            except FjordError as exc:
                if exc.code is ErrorCode.NOT_COORDINATOR:
                    return
                await asyncio.sleep(MARKER_RETRY_BACKOFF_S)
        if meta.state not in _PREPARE_STATES:
            reason = self._abort_reasons.pop(record.transactional_id, "abort")
            record_transaction_end("commit" if committed else reason, time.monotonic() - started)
            log.debug(
                "transaction of %r %s", record.transactional_id,
                "committed" if committed else "aborted",
            )

    # --- timeouts ---------------------------------------------------------------------------

    async def abort_timed_out(self) -> int:
        """Abort every ongoing transaction older than its timeout (at a bumped epoch, which
        fences its producer); returns how many were started."""
        now = self._clock()
        started = 0
        for part in list(self._partitions.values()):
            if not part.loaded:
                continue
            for meta in list(part.txns.values()):
                if not meta.timed_out(now):
                    continue
                record = meta.abort_timed_out(now)
                log.info(
                    "transactional id %r: transaction timed out after %d ms; aborting",
                    meta.transactional_id, record.timeout_ms,
                )
                try:
                    await self._write(part, meta, record)
                except FjordError as exc:
                    log.warning("aborting %r failed: %s", meta.transactional_id, exc)
                    continue
                self._abort_reasons[meta.transactional_id] = "timeout"
                self._start_completion(part, meta)
                started += 1
        return started


    async def expire_transactional_ids(self) -> int:
        """``transactional.id.expiration.ms``: forget ids without a transaction that were not
        used for that long (a tombstone in ``__transaction_state``); returns how many."""
        now = self._clock()
        expired = 0
        for part in list(self._partitions.values()):
            if not part.loaded:
                continue
            for tid, meta in list(part.txns.items()):
                record = meta.expire(now, self.expiration_ms)
                if record is None:
                    continue
                try:
                    await self._write(part, meta, record)
                except FjordError as exc:
                    log.warning("expiring transactional id %r failed: %s", tid, exc)
                    continue
                if part.txns.get(tid) is meta and meta.state is TxnState.DEAD:
                    del part.txns[tid]
                    expired += 1
        if expired:
            log.info("expired %d transactional ids", expired)
        return expired


_PREPARE_STATES = frozenset({TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT})
