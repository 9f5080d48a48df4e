"""One partition replica as the broker sees it: leadership, epochs, high watermark, produce checks.

Pure: no sockets, threads or clocks of its own. The log is fjord.storage's PartitionLog, whose
methods run synchronously on the caller's thread (the broker's event loop).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fjord.errors import (
    FencedLeaderEpochError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    UnknownLeaderEpochError,
)
from fjord.storage import AppendInfo, PartitionLog

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
      followers up to the log end offset.
    """

    __slots__ = (
        "_follower_end_offsets",
        "_high_watermark",
        "assignment",
        "broker_id",
        "log",
        "min_insync_replicas",
        "partition",
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
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.broker_id = broker_id
        self.log = log
        self.min_insync_replicas = min_insync_replicas
        self._follower_end_offsets: dict[int, int] = {}
        self.assignment = assignment
        # A new leader does not know how far the followers got: start from what its own log
        # proves is safe (everything, when it is alone in the ISR) and move up as they fetch.
        self._high_watermark = log.log_start_offset
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
    def log_start_offset(self) -> int:
        return int(self.log.log_start_offset)

    @property
    def log_end_offset(self) -> int:
        return int(self.log.log_end_offset)

    def update_assignment(self, assignment: PartitionAssignment) -> bool:
        """Apply a newer controller decision. Returns True when the high watermark advanced.

        A change of leader epoch forgets follower progress (they must prove it again to the new
        leader); an ISR change alone keeps it.
        """
        old = self.assignment
        self.assignment = assignment
        if assignment.leader_epoch != old.leader_epoch:
            self._follower_end_offsets.clear()
        return self._recompute_high_watermark()

    def update_config(self, *, min_insync_replicas: int) -> None:
        self.min_insync_replicas = min_insync_replicas

    # --- checks -----------------------------------------------------------------------------------

    def check_leader(self, current_leader_epoch: int = NO_EPOCH) -> None:
        """Raise unless this broker leads the partition in the epoch the request expects."""
        check_leader_epoch(current_leader_epoch, self.assignment.leader_epoch)
        if not self.is_leader:
            raise NotLeaderOrFollowerError(
                f"broker {self.broker_id} is not the leader of {self.topic}-{self.partition} "
                f"(leader is {self.assignment.leader}, epoch {self.assignment.leader_epoch})"
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
        info = self.log.append(records, self.assignment.leader_epoch)
        return AppendOutcome(info, self._recompute_high_watermark())

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

    def record_follower_fetch(self, replica_id: int, fetch_offset: int) -> bool:
        """A follower fetching at ``fetch_offset`` proves it holds everything below it.

        Returns True when the high watermark advanced (delayed produces and fetches may complete).
        Fetch offsets from brokers that are not replicas are ignored.
        """
        if replica_id not in self.assignment.replicas or replica_id == self.broker_id:
            return False
        if fetch_offset > self._follower_end_offsets.get(replica_id, -1):
            self._follower_end_offsets[replica_id] = fetch_offset
        return self._recompute_high_watermark()

    def update_follower_high_watermark(self, leader_high_watermark: int) -> bool:
        """On a follower: adopt the leader's high watermark, capped at the local log end."""
        if self.is_leader:
            return False
        new = max(self.log_start_offset, min(leader_high_watermark, self.log_end_offset))
        advanced = new > self._high_watermark
        self._high_watermark = new
        return advanced

    def follower_end_offset(self, replica_id: int) -> int | None:
        return self._follower_end_offsets.get(replica_id)

    def _recompute_high_watermark(self) -> bool:
        end = self.log_end_offset
        start = self.log_start_offset
        if not self.is_leader:
            # Never above what the local log holds (it may have been truncated).
            self._high_watermark = max(start, min(self._high_watermark, end))
            return False
        candidate = end
        for replica in _isr_without(self.assignment.isr, self.broker_id):
            candidate = min(candidate, self._follower_end_offsets.get(replica, start))
        candidate = max(candidate, start)
        if candidate > self._high_watermark:
            self._high_watermark = candidate
            return True
        if self._high_watermark > end:  # truncated below it (only happens across epochs)
            self._high_watermark = end
        return False


def _isr_without(isr: Sequence[int], broker_id: int) -> list[int]:
    return [r for r in isr if r != broker_id]
