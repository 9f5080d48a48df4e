"""Process-wide tuning of the CPython runtime that Fjord's services and clients share.

:func:`freeze_startup_objects` keeps the cyclic garbage collector from pausing every thread of
a process for tens of milliseconds; :func:`shorten_gil_switch_interval` (services only) keeps
gRPC's poller thread from waiting milliseconds for the GIL at every RPC event.
"""

from __future__ import annotations

import gc
import os
import sys
import threading

GC_FREEZE_ENV_VAR = "FJORD_GC_FREEZE"
"""Set to ``false`` (or ``0``/``no``) to keep Fjord from freezing the start-up objects out of
Python's cyclic garbage collector (:func:`freeze_startup_objects`); the default is to freeze."""

SWITCH_INTERVAL_ENV_VAR = "FJORD_SWITCH_INTERVAL_US"
"""The GIL switch interval a service process sets, in microseconds
(:func:`shorten_gil_switch_interval`; default :data:`SERVICE_SWITCH_INTERVAL_US`, 0 keeps
CPython's 5000)."""

SERVICE_SWITCH_INTERVAL_US = 500

_lock = threading.Lock()
_frozen = False


def gc_freeze_enabled() -> bool:
    return os.environ.get(GC_FREEZE_ENV_VAR, "true").strip().lower() not in ("false", "0", "no")


def freeze_startup_objects() -> bool:
    """Once per process: collect garbage, then ``gc.freeze()``; True when this call froze.

    Why: CPython's cyclic collector walks every tracked object in a full (generation 2)
    collection, holding the GIL. A Fjord process holds ~10^5 such objects after importing
    grpc, protobuf, prometheus_client and OpenTelemetry, so one full collection stopped every
    thread of a client process for 20-85 ms on the 2-core development machine: alone more
    than the 10 ms p99 end-to-end latency target (``bench/bench_e2e.py``). Frozen objects are
    left out of every later collection; objects created afterwards are collected as usual, and
    reference counting still frees everything that is not in a cycle. The cost: a cycle that
    is alive at the freeze and becomes garbage later is never freed (start-up objects:
    bounded, and gone with the process).

    Called by a service's entry point before it starts serving and by the first client
    (:class:`fjord.client.network.EventLoopThread`) of a process. ``FJORD_GC_FREEZE=false``
    turns it off.
    """
    global _frozen
    if not gc_freeze_enabled():
        return False
    with _lock:
        if _frozen:
            return False
        _frozen = True
    gc.collect()
    gc.freeze()
    return True


def shorten_gil_switch_interval() -> float:
    """For a service's own process (broker, coordinator): ``sys.setswitchinterval`` to
    ``FJORD_SWITCH_INTERVAL_US`` microseconds (default 500; 0 keeps CPython's 5 ms). Returns the
    interval in force, in seconds.

    Why: grpc.aio delivers every RPC event (a request arrived, an answer was sent) from its own
    poller thread to the event loop. While the loop's thread is busy, that poller waits for the
    GIL until the holder gives it up, at the latest after the switch interval: 5 ms by default,
    paid at each event of a busy broker. An acks=all write waits for several such events on
    two brokers (append, follower fetch answered, follower append, its next fetch, the answer),
    so with replication factor 3 a round trip took tens of milliseconds on a loaded 2-core
    machine, and the idempotent producer (at most 5 batches of a partition unanswered) was held
    to 5 batches per round trip. A shorter interval costs the loop's thread a few more GIL
    hand-overs per second. Clients do not call this: it is process-wide, and the process is the
    application's (the producer yields the GIL once per batch instead).
    """
    text = os.environ.get(SWITCH_INTERVAL_ENV_VAR, "").strip()
    micros = int(text) if text else SERVICE_SWITCH_INTERVAL_US
    if micros > 0:
        sys.setswitchinterval(micros / 1_000_000)
    return sys.getswitchinterval()
