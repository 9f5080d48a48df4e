"""One partition replica as the broker sees it: leadership, epochs, high watermark, produce checks.

Pure: no sockets, threads or clocks of its own. The log is fjord.storage's PartitionLog, whose
methods run synchronously on the caller's thread: this class calls them from the broker's event
loop (the broker reads large fetches and flushes logs in worker threads, which the log's lock
allows).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from fjord.broker.defaults import PRODUCER_ID_EXPIRATION_MS
from fjord.broker.isr import IsrTracker
from fjord.broker.producer_state import (
    CompletedTxn,
    Duplicate,
    ProducerStateManager,
    delete_snapshots,
    load_producer_state,
)
from fjord.errors import (
    CorruptRecordError,
    FencedLeaderEpochError,
    InvalidRecordError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    StorageError,
    UnknownLeaderEpochError,
)
from fjord.records.control import ControlRecord, read_control_batch
from fjord.records.header import BatchHeader, Compression, parse_header
from fjord.storage import AppendInfo, PartitionLog

_log = logging.getLogger(__name__)

#: A request's leader epoch when the client does not know it (no fencing check).
NO_EPOCH = -1


@dataclass(frozen=True, slots=True)
class PartitionAssignment:
    """A partition's state as the controller published it (etcd ``topics/<name>/<p>``)."""

    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    partition_epoch: int = 0


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    """The result of a leader append: the log's AppendInfo (first_offset, last_offset,
    record_count, valid_bytes, log_append_time, ...) and whether the high watermark moved
    (delayed produces and fetches may complete)."""

    info: AppendInfo
    high_watermark_advanced: bool
    duplicate: bool = False  # an idempotent retry: nothing appended, info has original offsets


def check_leader_epoch(current_leader_epoch: int, known_leader_epoch: int) -> None:
    """Kafka's epoch fencing for requests that name the leader epoch they expect.

    -1 means the client does not know (no check). An older epoch than ours: the client talks to a
    leader it should have forgotten (FENCED_LEADER_EPOCH). A newer one: our metadata lags behind
    the client's (UNKNOWN_LEADER_EPOCH). Both are retriable after a metadata refresh.
    """
    if current_leader_epoch in (NO_EPOCH, known_leader_epoch):
        return
    if current_leader_epoch < known_leader_epoch:
        raise FencedLeaderEpochError(
            f"request leader epoch {current_leader_epoch} is older than the current "
            f"{known_leader_epoch}"
        )
    raise UnknownLeaderEpochError(
        f"request leader epoch {current_leader_epoch} is newer than this broker's "
        f"{known_leader_epoch}"
    )


class Partition:
    """One local replica of a topic partition.

    Invariants:
    - ``log_start_offset <= high_watermark <= log_end_offset``.
    - While this broker leads, the high watermark never moves backwards within a leader epoch and
      equals the minimum log end offset over the ISR (this replica counting its own log end
      offset, followers what their last fetch proved they hold). With an ISR of one (replication
      factor 1) it is the log end offset.
    - A follower's high watermark is the leader's, as last reported, capped at its own log end.
    - Only the leader appends (``append_as_leader``); consumers read only below the high watermark,
      followers up to the log end offset. A follower appends only what it fetched from the leader
      (``append_as_follower``, keeping the leader's offsets and epochs).
    - The ISR that counts for the high watermark is the tracker's maximal ISR (committed ISR plus
      a pending expansion; a pending shrink counts only once committed), see
      :class:`fjord.broker.isr.IsrTracker`.
    - ``stale_partition_epoch`` >= 0: the controller refused our AlterPartition for a stale
      epoch, or a follower fetched with a newer leader epoch than ours; this replica does not
      act as leader (no appends, no ISR changes) until metadata with a newer partition epoch
      arrives. It is the partition epoch the refused request carried, never an older one than
      the metadata shows (a refusal that crossed an update does not fence: nothing newer
      might ever come).
    - When this broker becomes leader, its leader epoch is recorded in the epoch cache at its
      log end offset (Kafka's maybeAssignEpochStartOffset), so its latest epoch is never older
      than a follower's and the divergence check always has an answer.
    """

    __slots__ = (
        "_high_watermark",
        "_isr",
        "assignment",
        "broker_id",
        "compression",
        "leader_epoch_start_offset",
        "log",
        "max_timestamp_difference_ms",
        "min_insync_replicas",
        "on_leadership_change",
        "partition",
        "producer_state",
        "stale_partition_epoch",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        broker_id: int,
        log: PartitionLog,
        assignment: PartitionAssignment,
        *,
        min_insync_replicas: int,
        compression: Compression | None = None,
        max_timestamp_difference_ms: int | None = None,
        initial_high_watermark: int | None = None,
        now_ms: int = 0,
        producer_state: ProducerStateManager | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.broker_id = broker_id
        self.log = log
        self.min_insync_replicas = min_insync_replicas
        #: The topic's compression.type as a codec (None: ``producer``): the produce path
        #: rewrites batches in another codec before append_as_leader (fjord.records.recompress).
        self.compression = compression
        #: message.timestamp.difference.max.ms to enforce before an append (None: not checked).
        self.max_timestamp_difference_ms = max_timestamp_difference_ms
        self.assignment = assignment
        #: Called when an assignment with another leader or leader epoch is applied (the
        #: replica manager counts such changes: fjord.broker.fetcher skips recomputing every
        #: follower target when none happened).
        self.on_leadership_change: Callable[[], None] | None = None
        # Idempotence state: the newest snapshot plus a header scan of the log after it.
        self.producer_state = producer_state or load_partition_state(log)
        self.stale_partition_epoch = -1
        self.leader_epoch_start_offset = int(log.log_end_offset)
        self._isr = IsrTracker(assignment.leader, assignment.replicas, assignment.isr, now_ms)
        # A new leader does not know how far the followers got: start from the checkpointed high
        # watermark (capped at the log end) or the log start, and move up as they fetch.
        start = int(log.log_start_offset)
        hw = start if initial_high_watermark is None else initial_high_watermark
        self._high_watermark = max(start, min(hw, int(log.log_end_offset)))
        if self.is_leader:
            self._assign_leader_epoch_start()
        self._recompute_high_watermark()

    # --- state ----------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.assignment.leader == self.broker_id

    @property
    def leader_epoch(self) -> int:
        return self.assignment.leader_epoch

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def last_stable_offset(self) -> int:
        """Kafka's LSO: no read_committed consumer sees at or past it (min of the first offset
        of an open or not yet replicated transaction and the high watermark), never below the
        log start (retention may delete the start of a transaction left open)."""
        return max(self.log_start_offset,
                   self.producer_state.last_stable_offset(self._high_watermark))

    @property
    def log_start_offset(self) -> int:
        return int(self.log.log_start_offset)

    @property
    def log_end_offset(self) -> int:
        return int(self.log.log_end_offset)

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The ISR the high watermark is computed over (see :class:`IsrTracker`)."""
        return self._isr.maximal_isr if self.is_leader else self.assignment.isr

    @property
    def isr_change_pending(self) -> bool:
        return self._isr.pending is not None

    def update_assignment(self, assignment: PartitionAssignment, now_ms: int = 0) -> bool:
        """Apply a newer controller decision. Returns True when the high watermark advanced.

        A change of leader epoch forgets follower progress (they must prove it again to the new
        leader); an ISR change alone keeps it. A newer partition epoch lifts a stale-epoch fence.
        """
        old = self.assignment
        self.assignment = assignment
        if assignment.partition_epoch > self.stale_partition_epoch or (
            assignment.leader_epoch != old.leader_epoch
        ):
            self.stale_partition_epoch = -1
        if assignment.leader_epoch != old.leader_epoch or assignment.leader != old.leader:
            self._isr = IsrTracker(assignment.leader, assignment.replicas, assignment.isr, now_ms)
            self.leader_epoch_start_offset = self.log_end_offset
            if self.is_leader:
                self._assign_leader_epoch_start()
            if self.on_leadership_change is not None:
                self.on_leadership_change()
        else:
            self._isr.on_committed(
                assignment.replicas, assignment.isr, assignment.partition_epoch, now_ms
            )
        return self._recompute_high_watermark()

    def _assign_leader_epoch_start(self) -> None:
        if self.assignment.leader_epoch > self.log.epoch_cache.latest_epoch:
            self.log.epoch_cache.assign(self.assignment.leader_epoch, self.log_end_offset)

    def update_config(
        self,
        *,
        min_insync_replicas: int,
        compression: Compression | None = None,
        max_timestamp_difference_ms: int | None = None,
    ) -> None:
        self.min_insync_replicas = min_insync_replicas
        self.compression = compression
        self.max_timestamp_difference_ms = max_timestamp_difference_ms

    # --- checks -----------------------------------------------------------------------------------

    def check_leader(self, current_leader_epoch: int = NO_EPOCH) -> None:
        """Raise unless this broker leads the partition in the epoch the request expects."""
        check_leader_epoch(current_leader_epoch, self.assignment.leader_epoch)
        if not self.is_leader:
            raise NotLeaderOrFollowerError(
                f"broker {self.broker_id} is not the leader of {self.topic}-{self.partition} "
                f"(leader is {self.assignment.leader}, epoch {self.assignment.leader_epoch})"
            )
        if self.stale_partition_epoch >= 0:
            raise NotLeaderOrFollowerError(
                f"broker {self.broker_id} was refused an ISR change of {self.topic}-"
                f"{self.partition} for a stale epoch and waits for newer metadata"
            )

    def fetch_upper_bound(self, fetch_offset: int, replica_id: int) -> int:
        """The first offset a fetch at ``fetch_offset`` may not see; raises when out of range.

        Consumers see up to the high watermark, followers up to the log end offset. An offset
        outside [log start, log end] is OFFSET_OUT_OF_RANGE (the consumer then applies its
        auto.offset.reset policy).
        """
        start = self.log_start_offset
        end = self.log_end_offset
        if fetch_offset < start or fetch_offset > end:
            raise OffsetOutOfRangeError(
                f"fetch offset {fetch_offset} is outside [{start}, {end}] for "
                f"{self.topic}-{self.partition}"
            )
        return end if replica_id >= 0 else self._high_watermark

    # --- produce ------------------------------------------------------------------------------

    def check_produce(self, acks: int) -> None:
        """Raise unless this broker may append now with ``acks`` (leadership, ISR size)."""
        self.check_leader()
        if acks == -1 and len(self.assignment.isr) < self.min_insync_replicas:
            raise NotEnoughReplicasError(
                f"{self.topic}-{self.partition} has {len(self.assignment.isr)} in-sync replicas, "
                f"fewer than min.insync.replicas={self.min_insync_replicas}"
            )

    def append_as_leader(self, records: bytes, acks: int) -> AppendOutcome:
        """Append a produce payload in the current leader epoch.

        Raises the leadership/ISR errors of :meth:`check_produce`, and the log's validation
        errors: PartitionLog.append checks every batch's header, length and CRC-32C
        (fjord.records.header.validate_batch, in the same pass that stamps offsets) and its size
        against max.message.bytes (CorruptRecordError, RecordTooLargeError, InvalidRecordError).
        Nothing is appended when it raises; records are never decoded.
        """
        self.check_produce(acks)
        headers = _headers_if_parsable(records)
        if headers and any(h.is_control for h in headers):
            raise InvalidRecordError(
                "clients may not write control batches: transaction markers are written by "
                "the partition leader on the transaction coordinator's WriteTxnMarkers"
            )
        if headers:
            # Idempotence: a retried duplicate gets its original offsets, a gap or a stale
            # producer epoch is refused (fjord.broker.producer_state), before any write.
            duplicate = self.producer_state.check_append(headers)
            if duplicate is not None:
                return AppendOutcome(_duplicate_info(duplicate, self.log_start_offset), False, True)
        info = self.log.append(records, self.assignment.leader_epoch)
        if headers:
            self.producer_state.record_append(headers, info.first_offset)
        return AppendOutcome(info, self._recompute_high_watermark())

    def append_marker(self, batch: bytes) -> AppendOutcome:
        """Append one transaction marker (a control batch from
        :func:`fjord.records.control.build_control_batch`) as the leader, for WriteTxnMarkers.

        Raises the leadership/ISR errors of :meth:`check_produce` with acks=all (a marker is
        only useful once replicated), InvalidProducerEpochError / CoordinatorFencedError from
        :meth:`ProducerStateManager.check_marker`, and the log's errors; nothing is appended
        then. The completed transaction, when aborted, is recorded in the log's ``.txnindex``.
        """
        self.check_produce(-1)
        header = parse_header(batch)
        marker = read_control_batch(batch)
        self.producer_state.check_marker(header, marker)
        info = self.log.append(batch, self.assignment.leader_epoch)
        done = self.producer_state.apply_batch(header, info.first_offset, info.last_offset, marker)
        if done is not None:
            self._on_completed(done)
        return AppendOutcome(info, self._recompute_high_watermark())

    def _on_completed(self, done: CompletedTxn) -> None:
        if done.aborted:
            self.log.add_aborted_txn(
                done.producer_id,
                done.first_offset,
                done.last_offset,
                self.producer_state.stable_offset_after(done),
            )

    def aborted_transactions(self, fetch_offset: int, upper: int) -> list[tuple[int, int]]:
        """``(producer id, first offset)`` of the aborted transactions that overlap
        ``[fetch_offset, upper)``, what a read_committed fetch returns beside the records."""
        return self.log.aborted_transactions(fetch_offset, upper)

    # --- replication seam -------------------------------------------------------------------------

    def diverging_epoch(self, last_fetched_epoch: int, fetch_offset: int) -> tuple[int, int] | None:
        """Kafka's divergence check on a follower fetch: ``(epoch, end offset)`` the follower
        must truncate to when its last fetched epoch ends earlier in the leader's log than its
        fetch offset (or is unknown to the leader); None when its log is a prefix of ours.
        ``last_fetched_epoch`` -1 (an empty follower log) never diverges."""
        if last_fetched_epoch < 0:
            return None
        epoch, end_offset = self.log.end_offset_for_epoch(last_fetched_epoch)
        if epoch < last_fetched_epoch or end_offset < fetch_offset:
            return epoch, end_offset
        return None

    def record_follower_fetch(self, replica_id: int, fetch_offset: int, now_ms: int = 0) -> bool:
        """A follower fetching at ``fetch_offset`` proves it holds everything below it.

        Returns True when the high watermark advanced (delayed produces and fetches may complete).
        Fetch offsets from brokers that are not replicas are ignored, and so are offsets past
        our log end (a follower cannot hold what we never had).
        """
        if not self.is_leader or replica_id == self.broker_id:
            return False
        offset = min(fetch_offset, self.log_end_offset)
        if not self._isr.on_fetch(replica_id, offset, self.log_end_offset, now_ms):
            return False
        return self._recompute_high_watermark()

    def refresh_follower_fetch(
        self, replica_id: int, fetch_offset: int, leader_epoch: int, now_ms: int
    ) -> bool:
        """A follower's fetch session did not name this partition: the follower is still at
        ``fetch_offset``, where its last fetch of it (which passed every check, in this leader
        epoch) left it. Counts as that fetch again for its caught-up time (the ISR), nothing
        else: the high watermark cannot move, the follower's offset being the one recorded.
        Returns False when it proves nothing (not leading in ``leader_epoch``, or another
        offset recorded: the partition changed, and the session answers it on its own)."""
        if not self.is_leader or leader_epoch != self.leader_epoch:
            return False
        state = self._isr.followers.get(replica_id)
        if state is None or state.log_end_offset != fetch_offset:
            return False
        state.on_fetch(fetch_offset, self.log_end_offset, now_ms)
        return True

    # --- ISR changes (leader) ---------------------------------------------------------------

    def propose_isr_shrink(self, now_ms: int, lag_max_ms: int) -> tuple[int, ...] | None:
        """The new ISR to ask the controller for when followers lag by more than
        ``lag_max_ms`` (replica.lag.time.max.ms); None when nothing is due. Marks it pending."""
        if not self.is_leader or self.stale_partition_epoch >= 0:
            return None
        return self._isr.propose_shrink(now_ms, lag_max_ms, self.assignment.partition_epoch)

    def propose_isr_expansion(self, replica_id: int) -> tuple[int, ...] | None:
        """The new ISR with ``replica_id`` once that follower caught up to the high watermark
        (and the start of this leader epoch); None otherwise. Marks it pending (and it counts
        for the high watermark at once: maximal ISR)."""
        if not self.is_leader or self.stale_partition_epoch >= 0:
            return None
        return self._isr.propose_expansion(
            replica_id,
            self._high_watermark,
            self.leader_epoch_start_offset,
            self.assignment.partition_epoch,
        )

    def on_newer_leader_epoch(self, leader_epoch: int) -> bool:
        """A replica of this partition named ``leader_epoch``, newer than ours (a follower
        fetched with it): another leader has been elected and our metadata lags (etcd away, or
        its watch behind). Stop acting as leader until newer metadata arrives, exactly as after
        a stale-epoch refusal. Returns True when this fenced a leader that was acting."""
        if not self.is_leader or leader_epoch <= self.assignment.leader_epoch:
            return False
        if self.stale_partition_epoch >= 0:
            return False
        self.stale_partition_epoch = self.assignment.partition_epoch
        return True

    def on_isr_change_failed(
        self, *, stale_epoch: bool, sent_partition_epoch: int | None = None
    ) -> bool:
        """The AlterPartition sent with ``sent_partition_epoch`` (None: the current one) failed.

        ``stale_epoch``: the controller refused it because the epochs it carried are old, so
        stop acting as leader until metadata NEWER than what the request was based on comes
        (Kafka's rule). When the metadata already moved past ``sent_partition_epoch`` (the
        refusal crossed an update), the refusal says nothing about the current state: no
        fence, and a pending change made since is left alone; the leader proposes again at
        once from the new state. Returns True when the high watermark moved (never: a refused
        expansion only lowers the maximal ISR, and the high watermark never moves back)."""
        sent = self.assignment.partition_epoch if sent_partition_epoch is None else (
            sent_partition_epoch
        )
        if sent < self.assignment.partition_epoch:
            return False  # settled by newer metadata already (see IsrTracker.on_committed)
        self._isr.clear_pending(based_on_partition_epoch=sent)
        if stale_epoch:
            self.stale_partition_epoch = sent
        return self._recompute_high_watermark()

    # --- follower ---------------------------------------------------------------------------

    def append_as_follower(self, records: bytes, leader_high_watermark: int) -> int:
        """Append batches fetched from the leader (their offsets and epochs kept), then adopt
        the leader's high watermark capped at the new log end. Returns the bytes appended."""
        if self.is_leader:
            raise NotLeaderOrFollowerError(
                f"broker {self.broker_id} leads {self.topic}-{self.partition}: it does not "
                "append as a follower"
            )
        if records:
            self.log.append_as_follower(records)
            for h, marker in _iter_batches_with_markers(records):
                done = self.producer_state.apply_batch(h, h.base_offset, h.last_offset, marker)
                if done is not None:
                    self._on_completed(done)
        self.update_follower_high_watermark(leader_high_watermark)
        return len(records)

    def truncate_to(self, offset: int) -> None:
        """A follower drops everything at or after ``offset`` (divergence from the leader).
        The epoch cache loses entries at or past the new log end even when nothing is removed
        (an epoch this broker assigned as leader but never wrote in)."""
        if self.is_leader:
            raise InvalidRecordError(
                f"{self.topic}-{self.partition}: the leader never truncates its log"
            )
        self.log.truncate_to(offset)
        self.log.epoch_cache.truncate_from_end(self.log_end_offset)
        self.producer_state = load_partition_state(self.log, self.producer_state.expiration_ms)
        self._high_watermark = max(
            self.log_start_offset, min(self._high_watermark, self.log_end_offset)
        )

    def restart_at_leader_log_start(self, leader_log_start: int) -> None:
        """A follower whose log ends below the leader's log start (retention ran on the leader
        while it was away) drops its log and continues empty from the leader's log start."""
        if self.is_leader:
            raise InvalidRecordError(
                f"{self.topic}-{self.partition}: the leader never truncates its log"
            )
        self.log.truncate_fully_and_start_at(leader_log_start)
        delete_snapshots(self.log.directory)
        self.producer_state = load_partition_state(self.log, self.producer_state.expiration_ms)
        self._high_watermark = leader_log_start

    def follow_leader_log_start(self, leader_log_start: int) -> bool:
        """A follower moves its log start up with the leader's (never past its own log end),
        as Kafka's followers do, so retention and DeleteRecords hold on every replica."""
        if self.is_leader or leader_log_start <= self.log_start_offset:
            return False
        self.log.delete_records(min(leader_log_start, self.log_end_offset))
        self._high_watermark = max(self._high_watermark, self.log_start_offset)
        return True

    def update_follower_high_watermark(self, leader_high_watermark: int) -> bool:
        """On a follower: adopt the leader's high watermark, capped at the local log end."""
        if self.is_leader:
            return False
        new = max(self.log_start_offset, min(leader_high_watermark, self.log_end_offset))
        advanced = new > self._high_watermark
        self._high_watermark = new
        if advanced:
            self.producer_state.on_high_watermark(new)
        return advanced

    def follower_end_offset(self, replica_id: int) -> int | None:
        return self._isr.follower_end_offset(replica_id)

    def _recompute_high_watermark(self) -> bool:
        end = self.log_end_offset
        start = self.log_start_offset
        if not self.is_leader:
            # Never above what the local log holds (it may have been truncated).
            self._high_watermark = max(start, min(self._high_watermark, end))
            return False
        if self.stale_partition_epoch >= 0:
            return False  # a possibly deposed leader commits nothing more
        candidate = self._isr.high_watermark_candidate(end, start)
        if candidate > self._high_watermark:
            self._high_watermark = candidate
            self.producer_state.on_high_watermark(candidate)
            return True
        if self._high_watermark > end:  # truncated below it (only happens across epochs)
            self._high_watermark = end
        return False


def load_partition_state(
    log: PartitionLog, expiration_ms: int = PRODUCER_ID_EXPIRATION_MS
) -> ProducerStateManager:
    """The producer state of ``log`` (snapshot + replay), re-adding to the ``.txnindex`` every
    aborted transaction the replay meets (a no-op for entries already there): the index is
    rebuilt from the log for everything after the snapshot."""

    def restore(txn: CompletedTxn, lso: int) -> None:
        try:
            log.add_aborted_txn(txn.producer_id, txn.first_offset, txn.last_offset, lso)
        except StorageError as exc:  # never keep a partition from opening: say so instead
            _log.error("%s: aborted transaction %s not restored in the .txnindex: %s",
                       log.directory, txn, exc)

    return load_producer_state(log, expiration_ms, on_aborted=restore)


def _iter_headers(records: bytes) -> Iterator[BatchHeader]:
    view = memoryview(records)
    pos = 0
    while pos < len(view):
        header = parse_header(view, pos)
        yield header
        pos += header.size


def _iter_batches_with_markers(
    records: bytes,
) -> Iterator[tuple[BatchHeader, ControlRecord | None]]:
    """Each batch's header with its marker when it is a control batch (validated bytes)."""
    view = memoryview(records)
    pos = 0
    while pos < len(view):
        header = parse_header(view, pos)
        yield header, read_control_batch(view, pos) if header.is_control else None
        pos += header.size


def _headers_if_parsable(records: bytes) -> list[BatchHeader] | None:
    """The batch headers of a produce payload, or None when malformed (the log's own
    validation then reports the precise error). Header fields only: cheap."""
    try:
        return list(_iter_headers(records))
    except CorruptRecordError:
        return None


def _duplicate_info(duplicate: Duplicate, log_start_offset: int) -> AppendInfo:
    """What a duplicate append answers: the original batch's offsets, nothing appended."""
    first, last = duplicate.first_offset, duplicate.last_offset
    return AppendInfo(first, last, -1, first, -1, log_start_offset, 0, 0, 0)
