"""Process-wide tuning of the CPython runtime that Fjord's services and clients share.

Only one thing for now: :func:`freeze_startup_objects`, which keeps the cyclic garbage
collector from pausing every thread of a process for tens of milliseconds.
"""

from __future__ import annotations

import gc
import os
import threading

GC_FREEZE_ENV_VAR = "FJORD_GC_FREEZE"
"""Set to ``false`` (or ``0``/``no``) to keep Fjord from freezing the start-up objects out of
Python's cyclic garbage collector (:func:`freeze_startup_objects`); the default is to freeze."""

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
