"""Leader-side ISR bookkeeping of one partition: follower progress, Kafka's "maximal ISR",
shrink and expansion decisions. Pure: no sockets, threads or clocks (``now_ms`` is passed in).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: A follower's log end offset before it has fetched from this leader (Kafka's UnknownOffset).
UNKNOWN_OFFSET = -1


@dataclass(slots=True)
class FollowerState:
    """What the leader knows about one follower, from its fetches in the current leader epoch.

    ``log_end_offset`` is the follower's last fetch offset (it proves the follower holds every
    offset below it), UNKNOWN_OFFSET until it fetches. ``last_caught_up_ms`` is Kafka's
    lastCaughtUpTimeMs: the last time the follower was known to hold everything the leader held.

    Invariant: ``last_caught_up_ms`` never decreases; ``log_end_offset`` is the latest fetch
    offset (fetches of one follower are sequential, so a lower one means it truncated).
    """

    log_end_offset: int = UNKNOWN_OFFSET
    last_caught_up_ms: int = 0
    last_fetch_ms: int = -1
    last_fetch_leader_end_offset: int = UNKNOWN_OFFSET

    def on_fetch(self, fetch_offset: int, leader_end_offset: int, now_ms: int) -> None:
        """Kafka's rule (Replica.updateFetchStateOrThrow): a fetch at or past the leader's log end
        means caught up now; a fetch at or past what the leader held at the previous fetch means
        the follower was caught up at the time of that previous fetch."""
        if fetch_offset >= leader_end_offset:
            self.last_caught_up_ms = max(self.last_caught_up_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_end_offset and self.last_fetch_ms >= 0:
            self.last_caught_up_ms = max(self.last_caught_up_ms, self.last_fetch_ms)
        self.log_end_offset = fetch_offset  # lower after a truncation: Kafka takes it too
        self.last_fetch_ms = now_ms
        self.last_fetch_leader_end_offset = leader_end_offset


@dataclass(frozen=True, slots=True)
class PendingIsrChange:
    """An AlterPartition this leader sent and the controller has not answered yet.

    ``based_on_partition_epoch`` is the partition epoch the request was fenced with: once the
    metadata (or the answer) carries a newer partition epoch, the change is settled.
    """

    new_isr: tuple[int, ...]
    based_on_partition_epoch: int

    def is_expansion_of(self, committed: Iterable[int]) -> bool:
        return set(self.new_isr) > set(committed)


class IsrTracker:
    """The ISR as the leader of one partition sees it, within one leader epoch.

    Invariants:
    - ``committed`` is the ISR the controller last published; ``pending`` is at most one
      AlterPartition in flight (Kafka sends one at a time per partition).
    - ``maximal_isr`` = committed + pending.new_isr (a union): an expansion counts for the high
      watermark at once, a shrink only once the controller has committed it (so a leader that
      is deposed while shrinking never advanced the high watermark past what the old ISR holds).
    - The leader itself is always in ``committed`` and ``maximal_isr``.
    """

    __slots__ = ("committed", "followers", "leader_id", "pending", "replicas")

    def __init__(
        self,
        leader_id: int,
        replicas: Iterable[int],
        committed_isr: Iterable[int],
        now_ms: int,
    ) -> None:
        self.leader_id = leader_id
        self.replicas = tuple(replicas)
        self.committed = tuple(committed_isr)
        self.pending: PendingIsrChange | None = None
        # Kafka resets lastCaughtUpTime to "now" for every follower when a leader takes over:
        # a follower must have been given a chance to fetch before it can be called lagging.
        self.followers: dict[int, FollowerState] = {
            r: FollowerState(last_caught_up_ms=now_ms) for r in self.replicas if r != leader_id
        }

    # --- views ------------------------------------------------------------------------------

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        if self.pending is None:
            return self.committed
        extra = tuple(r for r in self.pending.new_isr if r not in self.committed)
        return self.committed + extra

    def follower_end_offset(self, replica_id: int) -> int | None:
        state = self.followers.get(replica_id)
        if state is None or state.log_end_offset == UNKNOWN_OFFSET:
            return None
        return state.log_end_offset

    def high_watermark_candidate(self, leader_end_offset: int, log_start_offset: int) -> int:
        """The minimum log end offset over the maximal ISR (an unknown follower counts as the
        log start: it has proven nothing yet)."""
        candidate = leader_end_offset
        for replica in self.maximal_isr:
            if replica == self.leader_id:
                continue
            end = self.follower_end_offset(replica)
            candidate = min(candidate, log_start_offset if end is None else end)
        return max(candidate, log_start_offset)

    # --- updates ----------------------------------------------------------------------------

    def on_fetch(
        self, replica_id: int, fetch_offset: int, leader_end_offset: int, now_ms: int
    ) -> bool:
        """Record a follower fetch; False when ``replica_id`` is not a follower of ours."""
        state = self.followers.get(replica_id)
        if state is None:
            return False
        state.on_fetch(fetch_offset, leader_end_offset, now_ms)
        return True

    def on_committed(
        self,
        replicas: Iterable[int],
        committed_isr: Iterable[int],
        partition_epoch: int,
        now_ms: int,
    ) -> None:
        """The controller published a new ISR/replica set in the same leader epoch."""
        self.replicas = tuple(replicas)
        self.committed = tuple(committed_isr)
        if self.pending is not None and partition_epoch > self.pending.based_on_partition_epoch:
            self.pending = None
        for r in self.replicas:
            if r != self.leader_id and r not in self.followers:
                self.followers[r] = FollowerState(last_caught_up_ms=now_ms)
        for r in list(self.followers):
            if r not in self.replicas:
                del self.followers[r]

    def clear_pending(self, based_on_partition_epoch: int | None = None) -> None:
        """The AlterPartition failed (or was refused): nothing is in flight any more. With
        ``based_on_partition_epoch``, only a pending change fenced with that partition epoch is
        cleared (an answer to an older request must not drop a newer one)."""
        if self.pending is None:
            return
        if (
            based_on_partition_epoch is None
            or self.pending.based_on_partition_epoch == based_on_partition_epoch
        ):
            self.pending = None

    # --- decisions --------------------------------------------------------------------------

    def lagging_followers(self, now_ms: int, lag_max_ms: int) -> list[int]:
        """Members of the committed ISR that have not caught up for longer than ``lag_max_ms``."""
        out = []
        for replica in self.committed:
            state = self.followers.get(replica)
            if state is not None and now_ms - state.last_caught_up_ms > lag_max_ms:
                out.append(replica)
        return out

    def propose_shrink(
        self, now_ms: int, lag_max_ms: int, partition_epoch: int
    ) -> tuple[int, ...] | None:
        """The ISR without the lagging followers, marked pending; None when no change is due or
        another change is in flight."""
        if self.pending is not None:
            return None
        lagging = self.lagging_followers(now_ms, lag_max_ms)
        if not lagging:
            return None
        new_isr = tuple(r for r in self.committed if r not in lagging)
        self.pending = PendingIsrChange(new_isr, partition_epoch)
        return new_isr

    def propose_expansion(
        self,
        replica_id: int,
        high_watermark: int,
        leader_epoch_start_offset: int,
        partition_epoch: int,
    ) -> tuple[int, ...] | None:
        """The ISR plus ``replica_id`` when that follower has caught up (its log end at or past
        the high watermark and the start of the current leader epoch), marked pending."""
        if self.pending is not None or replica_id in self.committed:
            return None
        end = self.follower_end_offset(replica_id)
        if end is None or end < high_watermark or end < leader_epoch_start_offset:
            return None
        new_isr = (*self.committed, replica_id)
        self.pending = PendingIsrChange(new_isr, partition_epoch)
        return new_isr
