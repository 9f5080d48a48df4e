"""fjord.runtime.freeze_startup_objects: once per process, and off when asked (subprocesses:
the freeze is process-wide)."""

from __future__ import annotations

import os
import subprocess
import sys

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
