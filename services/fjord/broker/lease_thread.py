"""The broker's lease keep-alive thread: renews the etcd lease from a thread of its own, over a
blocking etcd connection of its own, while the broker's event loop shows progress (the rules:
:class:`~fjord.broker.lease_keeper.LeaseKeeper`). A busy loop no longer costs the broker its
lease; a wedged one still does. What a lost lease makes the broker do stays on its loop
(``on_lease_lost``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from fjord.broker.lease_keeper import (
    EtcdReachable,
    EtcdUnreachable,
    KeeperEvent,
    LeaseKeeper,
    LeaseLost,
    LoopSlow,
    LoopSlowBegan,
    LoopStalled,
)
from fjord.metadata.etcd import BlockingLeaseRefresher
from fjord.metadata.registration import LeaseStatus
from fjord.observability import metrics

log = logging.getLogger(__name__)


class LoopProgress:
    """The monotonic time at which the broker's event loop last ran :meth:`run`'s tick: how the
    keep-alive thread tells a busy loop (ticks late) from a wedged one (no tick at all). One
    float attribute, written by the loop and read by the thread (atomic under the GIL)."""

    def __init__(self) -> None:
        self.at = time.monotonic()

    def stamp(self) -> None:
        """Progress now (also before :meth:`run` has had its first turn)."""
        self.at = time.monotonic()

    async def run(self, tick_s: float) -> None:
        """Stamp every ``tick_s`` for as long as the loop turns (cancel to stop)."""
        while True:
            self.stamp()
            await asyncio.sleep(tick_s)


#: Innermost frames of the loop's stack named in a slow-loop report.
STACK_FRAMES_REPORTED = 6


def where_thread_is(thread_id: int, frames: int = STACK_FRAMES_REPORTED) -> str:
    """The innermost ``frames`` frames of thread ``thread_id``'s stack, innermost first
    ("function (file:line) <- caller (file:line) ..."); "" when it has no Python frame."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return ""
    stack = traceback.extract_stack(frame)[-frames:]
    return " <- ".join(f"{entry.name} ({Path(entry.filename).name}:{entry.lineno})"
                       for entry in reversed(stack))


def lease_status(refresher: BlockingLeaseRefresher, lease_id: int, what: str) -> LeaseStatus:
    """One keep-alive of ``lease_id`` and what etcd's answer means (never raises): as
    :func:`fjord.metadata.registration.refresh_lease_once`, over a blocking connection."""
    try:
        ttl = refresher.refresh(lease_id)
    except Exception as exc:
        log.warning("%s: lease refresh failed: %s", what, exc)
        return LeaseStatus.UNREACHABLE
    return LeaseStatus.GONE if ttl is None or ttl <= 0 else LeaseStatus.HELD


class LeaseKeepAliveThread:
    """Renews the lease :meth:`keep` names, every ``ttl_s / 3`` while ``progress`` is younger
    than ``stall_limit_s``; checks the stamp every ``poll_s``. When etcd says the lease is gone
    it calls ``on_lease_lost(lease_id, away_s)`` on ``loop`` (the broker's) and renews nothing
    until :meth:`keep` names a new lease. Started and stopped from ``loop``."""

    def __init__(
        self,
        etcd_url: str,
        *,
        ttl_s: float,
        stall_limit_s: float,
        progress: LoopProgress,
        loop: asyncio.AbstractEventLoop,
        on_lease_lost: Callable[[int, float | None], None],
        what: str,
        poll_s: float,
    ) -> None:
        self._keeper = LeaseKeeper(ttl_s / 3, stall_limit_s)
        self._refresher = BlockingLeaseRefresher(etcd_url)
        self._progress = progress
        self._loop = loop
        self._on_lease_lost = on_lease_lost
        self._what = what
        self._poll_s = poll_s
        #: The event loop's thread (constructed on it): where it is stuck is reported.
        self._loop_thread_id = threading.get_ident()
        self._slow_where = ""  # where the loop was when the current slow stretch was noticed
        self._lock = threading.Lock()  # guards _next_lease
        self._next_lease: tuple[int | None] | None = None  # a lease handed over by keep()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{what} lease keep-alive",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def keep(self, lease_id: int | None) -> None:
        """Keep ``lease_id`` alive from now on (None: stop renewing); renewed at once."""
        with self._lock:
            self._next_lease = (lease_id,)
        self._wake.set()

    async def stop(self) -> None:
        """Stop renewing and wait for the thread (a renewal in flight is cut short)."""
        self._stopping.set()
        self._wake.set()
        self._refresher.close()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join)

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._step()
                self._wake.wait(self._poll_s)
                self._wake.clear()
        except Exception:  # a bug: say so loudly; the lease then lapses and the broker re-registers
            log.exception("%s: the lease keep-alive thread failed", self._what)

    def _step(self) -> None:
        with self._lock:
            handed, self._next_lease = self._next_lease, None
        if handed is not None:
            self._keeper.lease_registered(handed[0])
        renew, events = self._keeper.poll(time.monotonic(), self._progress.at)
        self._report(events)
        if renew is None or self._stopping.is_set():
            return
        status = lease_status(self._refresher, renew.lease_id, self._what)
        if self._stopping.is_set():  # stop() closed the connection under the renewal
            return
        self._report(self._keeper.answered(renew.lease_id, status, time.monotonic()))

    def _report(self, events: list[KeeperEvent]) -> None:
        what = self._what
        for event in events:
            if isinstance(event, LoopSlowBegan):
                self._slow_where = where_thread_is(self._loop_thread_id)
            elif isinstance(event, LoopSlow):
                metrics.record_event_loop_stall(event.longest_idle_s, event.withheld)
                log.warning(
                    "%s: its event loop made no progress for up to %.1f s; the lease was %s "
                    "meanwhile (the loop was in: %s)", what, event.longest_idle_s,
                    "left to run (past the stall limit)" if event.withheld
                    else "renewed from the keep-alive thread", self._slow_where or "?")
            elif isinstance(event, LoopStalled):
                log.error(
                    "%s: its event loop has made no progress for %.1f s (stall limit %.1f s): "
                    "no more lease renewals until it does, so that a wedged broker is fenced "
                    "(the loop is in: %s)",
                    what, event.idle_s, event.limit_s,
                    where_thread_is(self._loop_thread_id) or "?")
            elif isinstance(event, EtcdUnreachable):
                log.warning(
                    "%s cannot reach etcd: serving on (produce and fetch on the partitions it "
                    "leads and follows); ISR changes wait for etcd", what)
            elif isinstance(event, EtcdReachable):
                log.info("%s reached etcd again after %.1f s without etcd; its lease is still "
                         "held", what, event.away_s)
            elif isinstance(event, LeaseLost):
                with contextlib.suppress(RuntimeError):  # the loop closed: the broker stopped
                    self._loop.call_soon_threadsafe(
                        self._on_lease_lost, event.lease_id, event.away_s)
