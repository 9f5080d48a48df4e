"""Process-wide tuning of the CPython runtime that Fjord's services and clients share.

:func:`freeze_startup_objects` keeps the cyclic garbage collector from pausing every thread of
a process for tens of milliseconds; :func:`shorten_gil_switch_interval` (services only) keeps
gRPC's poller thread from waiting milliseconds for the GIL at every RPC event;
:func:`keep_large_buffers_in_heap` (brokers) keeps glibc from handing every large buffer back to
the kernel and faulting it in again.
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform
import sys
import threading
from typing import Any

GC_FREEZE_ENV_VAR = "FJORD_GC_FREEZE"
"""Set to ``false`` (or ``0``/``no``) to keep Fjord from freezing the start-up objects out of
Python's cyclic garbage collector (:func:`freeze_startup_objects`); the default is to freeze."""

SWITCH_INTERVAL_ENV_VAR = "FJORD_SWITCH_INTERVAL_US"
"""The GIL switch interval a service process sets, in microseconds
(:func:`shorten_gil_switch_interval`; default :data:`SERVICE_SWITCH_INTERVAL_US`, 0 keeps
CPython's 5000)."""

SERVICE_SWITCH_INTERVAL_US = 500

MALLOC_TUNING_ENV_VAR = "FJORD_MALLOC_TUNING"
"""Set to ``false`` (or ``0``/``no``) to keep a broker from changing glibc's malloc thresholds
(:func:`keep_large_buffers_in_heap`); the default is to change them."""

#: Allocations up to this size come from the heap, not from their own mmap (glibc's
#: M_MMAP_THRESHOLD; its own default starts at 128 KiB).
MMAP_THRESHOLD_BYTES = 8 << 20
#: Freed memory at the top of the heap is returned to the kernel only beyond this (glibc's
#: M_TRIM_THRESHOLD): what a broker may keep of the buffers it no longer uses.
TRIM_THRESHOLD_BYTES = 64 << 20
_M_TRIM_THRESHOLD = -1  # glibc's <malloc.h> parameter numbers
_M_MMAP_THRESHOLD = -3

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


def _libc_function(name: str, *argtypes: Any) -> Any:
    """The C library's ``name`` (returning int, taking ``argtypes``), or None where this
    process's C library has none."""
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


def keep_large_buffers_in_heap() -> bool:
    """For a broker's own process: glibc's malloc serves buffers up to
    :data:`MMAP_THRESHOLD_BYTES` from the heap and keeps up to :data:`TRIM_THRESHOLD_BYTES` of
    freed heap instead of returning it to the kernel. True when set; False off glibc, when
    ``FJORD_MALLOC_TUNING=false``, or when the environment already sets glibc's own
    ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` (the operator's choice stands).

    Why: a broker moves records as bytes objects of up to a few hundred KiB each (a Produce
    payload, the copies gRPC and protobuf make of it, a fetch answer), allocated and freed
    by the thousand per second. glibc gives each allocation above its mmap threshold (128 KiB
    at first, then raised to the largest size freed) its own mapping, and trims the heap's
    free top back to the kernel; either way the next buffer is fresh memory that the kernel
    zeroes and faults in page by page. Under acks=all with replication factor 3 and 512 KiB
    batches that was 15,000-27,000 minor page faults across the 3 brokers per 100,000
    records (ten times the bytes moved, in 4 KiB pages); with these thresholds 1,000-10,000
    (bench/profile_replication.py, docs/performance.md; the brokers' CPU per round fell in
    one A/B run and did not measurably in another, at load 13-20). The cost: up to 64 MiB of
    freed memory stays with the process.
    """
    if os.environ.get(MALLOC_TUNING_ENV_VAR, "true").strip().lower() in ("false", "0", "no"):
        return False
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = _libc_function("mallopt", ctypes.c_int, ctypes.c_int)
    if mallopt is None:
        return False
    # mallopt returns 1 on success, 0 on error.
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )


#: The timer slack (Linux ``PR_SET_TIMERSLACK``, nanoseconds) of a client's I/O thread.
IO_THREAD_TIMER_SLACK_NS = 1_000
_PR_SET_TIMERSLACK = 29  # <linux/prctl.h>


def tighten_thread_timer_slack(slack_ns: int = IO_THREAD_TIMER_SLACK_NS) -> bool:
    """For the calling thread only: let the kernel fire its timers (sleeps, ``epoll_wait``
    timeouts) within ``slack_ns`` of when they are due instead of its default 50 µs. True when
    set; False off Linux or when the call is refused.

    Why: a producer's I/O thread sleeps the last fraction of a millisecond before a batch's
    ``linger.ms`` ends (``fjord.client.producer.linger_wait``); with the default slack a
    0.7 ms ``time.sleep`` overshot by 94 µs at the median on the development machine, with
    1 µs by 35 µs, and every batch left that much later. Called by each client's I/O thread
    (:class:`fjord.client.network.EventLoopThread`) for itself: the slack is per thread, so
    the application's threads keep the kernel's default (timers that can wait coalesced).
    """
    if not sys.platform.startswith("linux"):
        return False
    prctl = _libc_function("prctl", ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong,
                           ctypes.c_ulong, ctypes.c_ulong)
    if prctl is None:
        return False
    return prctl(_PR_SET_TIMERSLACK, slack_ns, 0, 0, 0) == 0
