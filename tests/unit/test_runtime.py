"""fjord.runtime: freeze_startup_objects once per process and off when asked, the services'
GIL switch interval, the brokers' malloc thresholds (subprocesses: each is process-wide), the
client I/O threads' timer slack (per thread)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

SCRIPT = """
import gc
from fjord.runtime import freeze_startup_objects
first = freeze_startup_objects()
frozen = gc.get_freeze_count()
second = freeze_startup_objects()
print(first, second, frozen > 1000, gc.get_freeze_count() == frozen)
"""


def _run(env_value: str | None) -> str:
    env = dict(os.environ)
    env.pop("FJORD_GC_FREEZE", None)
    if env_value is not None:
        env["FJORD_GC_FREEZE"] = env_value
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_freezes_once_by_default() -> None:
    assert _run(None) == "True False True True"


def test_off_when_disabled() -> None:
    for value in ("false", " No "):
        assert _run(value) == "False False False True"


SWITCH = """
import sys
from fjord.runtime import shorten_gil_switch_interval
print(round(shorten_gil_switch_interval() * 1e6), round(sys.getswitchinterval() * 1e6))
"""


def _switch_interval(env_value: str | None) -> str:
    env = dict(os.environ)
    env.pop("FJORD_SWITCH_INTERVAL_US", None)
    if env_value is not None:
        env["FJORD_SWITCH_INTERVAL_US"] = env_value
    result = subprocess.run(
        [sys.executable, "-c", SWITCH], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_services_shorten_the_gil_switch_interval() -> None:
    """A service process sets 500 us (default), the value asked, or keeps CPython's 5 ms for 0
    (subprocesses: the interval is process-wide)."""
    assert _switch_interval(None) == "500 500"
    assert _switch_interval("200") == "200 200"
    assert _switch_interval("0") == "5000 5000"


MALLOC = """
import random, sys
from fjord.runtime import keep_large_buffers_in_heap

def minor_faults():
    with open("/proc/self/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])

applied = keep_large_buffers_in_heap()
rng = random.Random(1)
held = []
def churn(count):
    for _ in range(count):
        held.append(bytearray(rng.randrange(256 << 10, 2 << 20)))  # zeroed: every page touched
        if len(held) > 4:
            held.pop(0)
churn(50)  # the heap grows to the working set once
before = minor_faults()
churn(200)
print(applied, minor_faults() - before)
"""


def _churn_faults(env: dict[str, str]) -> tuple[str, int]:
    result = subprocess.run(
        [sys.executable, "-c", MALLOC], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    applied, faults = result.stdout.split()
    return applied, int(faults)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="glibc's malloc only",
)
def test_brokers_keep_large_buffers_in_the_heap() -> None:
    """Buffers of 256 KiB-2 MiB allocated and freed in turn (a broker's record bytes) reuse
    heap memory: a few page faults in 200 rounds instead of one per 4 KiB page of each
    (~13,000 with glibc's defaults here); off when asked or when glibc's own variable is set."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("FJORD_MALLOC_TUNING", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}
    applied, tuned = _churn_faults(env)
    assert applied == "True" and tuned < 1000
    applied, untuned = _churn_faults({**env, "FJORD_MALLOC_TUNING": "false"})
    assert applied == "False" and untuned > 4 * tuned
    applied, _ = _churn_faults({**env, "MALLOC_TRIM_THRESHOLD_": "131072"})
    assert applied == "False"


def _timer_slack_ns() -> int:
    import ctypes

    prctl = ctypes.CDLL(None).prctl
    prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong)
    return int(prctl(30, 0, 0, 0, 0))  # PR_GET_TIMERSLACK: the calling thread's


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's prctl only")
def test_client_io_threads_tighten_their_own_timer_slack() -> None:
    """A client's I/O thread fires its timers within 1 µs of due; the thread that created the
    client (the application's) keeps the kernel's slack."""
    from fjord.client.network import EventLoopThread
    from fjord.runtime import IO_THREAD_TIMER_SLACK_NS

    before = _timer_slack_ns()
    io = EventLoopThread("test-timer-slack")
    try:
        assert io.run(_async_call(_timer_slack_ns), timeout=30) == IO_THREAD_TIMER_SLACK_NS
    finally:
        io.stop()
    assert _timer_slack_ns() == before


async def _async_call(fn):  # type: ignore[no-untyped-def]
    return fn()
