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
