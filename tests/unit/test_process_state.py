"""The state-directory lock and incarnation record brokers (data dir) and coordinators
(--state-dir) share for restarts in seconds (fjord.process_state)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fjord.errors import ConfigError
from fjord.process_state import StateDirLock, record_incarnation


def test_state_dir_lock_is_exclusive_and_names_its_holder(tmp_path: Path) -> None:
    first = StateDirLock(tmp_path, ".lock", "coordinator", "state-dir")
    first.acquire()
    second = StateDirLock(tmp_path, ".lock", "coordinator", "state-dir")
    # flock: another open file conflicts, also in one process
    holder = rf"state-dir: .* in use by another coordinator process \(pid {os.getpid()}\)"
    with pytest.raises(ConfigError, match=holder):
        second.acquire()
    first.release()
    second.acquire()  # free again once released (the kernel also drops it when a process dies)
    second.release()


def test_incarnation_of_the_previous_run(tmp_path: Path) -> None:
    assert record_incarnation(tmp_path, "first") is None
    assert record_incarnation(tmp_path, "second") == "first"
    assert record_incarnation(tmp_path, "third") == "second"
