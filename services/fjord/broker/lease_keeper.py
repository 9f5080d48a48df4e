"""When the broker's lease keep-alive renews, and what each renewal's answer means: the pure core
of the keep-alive thread (:mod:`fjord.broker.lease_thread`). No I/O and no clock: every time
comes in as an argument.

Why a thread at all: the keep-alive used to run on the broker's event loop, and a refresh needs
several turns of that loop (the timer, the gRPC stream's send, its answer). At 3 x 10,000
partitions x RF 3 a restarted broker's loop was busy ~78% of the time with turns of seconds,
the refresh starved, the lease lapsed, and the broker was fenced and re-registered, moving
every partition it led twice more. Kafka's broker heartbeats from a thread of its own
(BrokerLifecycleManager's event queue) for the same reason.

Why not renew unconditionally from the thread: a broker whose loop is wedged (a deadlock, a
call that never returns) serves nothing, yet a thread of its own would keep its registration
and leaderships alive forever. So the thread renews only while the loop shows progress: the
loop stamps :class:`~fjord.broker.lease_thread.LoopProgress` every tick, and a loop whose last
stamp is older than ``stall_limit_s`` gets no renewal.

Bounds (``I`` = refresh interval, ``T`` = lease TTL, ``L`` = ``stall_limit_s``):

- A loop that stalls for less than ``L`` never costs the lease: every renewal due meanwhile is
  sent (while etcd answers). On its own the stall may last up to ``L + T - I`` (the last
  renewal before the limit still holds the lease for ``T``; the first poll after the loop
  moves again renews at once).
- A loop that made its last progress at ``p`` gets no renewal sent after ``p + L``: etcd
  revokes the lease, and the controller moves the broker's leaderships, by ``p + L + T``
  (plus at most one request timeout for a renewal sent just before ``p + L``), against
  ``T`` after a process dies. The default ``L`` is ``T`` (docs/broker.md): a wedged loop is
  fenced within ``2 T`` (18 s by default), and no stall shorter than a whole TTL costs a
  busy broker its lease (before, a stall of ``T - I`` could).

What happens once the lease is gone (fence, re-register, wait for the metadata to catch up,
unfence) stays on the broker's loop; this core only says so (:class:`LeaseLost`). An etcd that
cannot be reached fences nothing (docs/replication.md, "etcd outages"): only etcd saying the
lease is gone does.
"""

from __future__ import annotations

from dataclasses import dataclass

from fjord.metadata.registration import LeaseStatus


@dataclass(frozen=True)
class Renew:
    """Send a keep-alive for ``lease_id`` now and pass the answer to
    :meth:`LeaseKeeper.answered`."""

    lease_id: int


@dataclass(frozen=True)
class LoopStalled:
    """The loop made no progress for ``idle_s`` (past the stall limit): renewals stop until it
    moves again."""

    idle_s: float
    limit_s: float


@dataclass(frozen=True)
class LoopSlowBegan:
    """The loop has gone ``idle_s`` (more than a refresh interval) without progress: the first
    poll of a slow stretch (the shell notes where the loop is stuck)."""

    idle_s: float


@dataclass(frozen=True)
class LoopSlow:
    """The loop went ``longest_idle_s`` without progress (more than a refresh interval) and has
    moved again; ``withheld``: renewals stopped meanwhile (it passed the stall limit)."""

    longest_idle_s: float
    withheld: bool


@dataclass(frozen=True)
class EtcdUnreachable:
    """A keep-alive got no answer from etcd (the first of a run of them)."""


@dataclass(frozen=True)
class EtcdReachable:
    """etcd answered again and the lease is still held, after ``away_s`` without an answer."""

    away_s: float


@dataclass(frozen=True)
class LeaseLost:
    """etcd says ``lease_id`` expired or was revoked (``away_s``: seconds without etcd before
    that answer, None if etcd answered throughout). The broker fences itself and registers
    anew (on its loop); no renewal is sent until :meth:`LeaseKeeper.lease_registered`."""

    lease_id: int
    away_s: float | None


KeeperEvent = (
    LoopSlowBegan | LoopStalled | LoopSlow | EtcdUnreachable | EtcdReachable | LeaseLost
)


class LeaseKeeper:
    """Decides when the keep-alive thread renews the broker's lease.

    Invariants: no :class:`Renew` is issued while the loop's last progress is more than
    ``stall_limit_s`` old, nor for any lease but the one last registered, nor after etcd said
    that lease is gone; while the loop progresses within the limit, renewals are issued every
    ``interval_s`` (the first poll after a stall that withheld one renews at once); an answer
    about a lease that is no longer the current one changes nothing.
    """

    def __init__(self, interval_s: float, stall_limit_s: float) -> None:
        if interval_s <= 0 or stall_limit_s <= 0:
            raise ValueError(
                f"interval and stall limit must be > 0, got {interval_s}, {stall_limit_s}")
        self.interval_s = interval_s
        self.stall_limit_s = stall_limit_s
        #: The lease being kept (None: none registered, or etcd said it is gone).
        self.lease_id: int | None = None
        self._last_sent: float | None = None  # when the last renewal of lease_id was issued
        self._withholding = False
        self._slow_longest: float | None = None  # longest idle of the current slow episode
        self._unreachable_since: float | None = None

    @property
    def withholding(self) -> bool:
        """True while renewals stop because the loop passed the stall limit."""
        return self._withholding

    def lease_registered(self, lease_id: int | None) -> None:
        """The broker registered under ``lease_id`` (None: it gave its lease up): keep that one
        from now on; the first poll renews it."""
        self.lease_id = lease_id
        self._last_sent = None
        self._unreachable_since = None

    def poll(self, now: float, loop_progress_at: float) -> tuple[Renew | None, list[KeeperEvent]]:
        """What to do at ``now`` given the loop's last progress stamp: a renewal or none, and
        what to report."""
        events: list[KeeperEvent] = []
        idle = max(0.0, now - loop_progress_at)
        if idle > self.interval_s:
            if self._slow_longest is None:
                events.append(LoopSlowBegan(idle))
            self._slow_longest = max(self._slow_longest or 0.0, idle)
        elif self._slow_longest is not None:
            events.append(LoopSlow(self._slow_longest, self._withholding))
            self._slow_longest = None
        if idle > self.stall_limit_s:
            if not self._withholding:
                self._withholding = True
                events.append(LoopStalled(idle, self.stall_limit_s))
            return None, events
        resumed = self._withholding
        self._withholding = False
        if self.lease_id is None:
            return None, events
        if resumed or self._last_sent is None or now - self._last_sent >= self.interval_s:
            self._last_sent = now
            return Renew(self.lease_id), events
        return None, events

    def answered(self, lease_id: int, status: LeaseStatus, now: float) -> list[KeeperEvent]:
        """etcd's answer to the renewal of ``lease_id`` (``now``: when it came)."""
        if lease_id != self.lease_id:
            return []  # the broker registered anew meanwhile: about a lease no longer kept
        if status is LeaseStatus.UNREACHABLE:
            if self._unreachable_since is None:
                self._unreachable_since = now
                return [EtcdUnreachable()]
            return []
        away = None if self._unreachable_since is None else now - self._unreachable_since
        self._unreachable_since = None
        if status is LeaseStatus.HELD:
            return [] if away is None else [EtcdReachable(away)]
        self.lease_id = None
        self._last_sent = None
        return [LeaseLost(lease_id, away)]
