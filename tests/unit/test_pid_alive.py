"""``pid_alive``: what ``fjord local status`` and ``up`` (restarting what died) believe.

A killed multi-threaded process (every broker: gRPC threads) shows its leader as a zombie while
its other threads still exit, and only the last thread's exit closes its listening sockets. A
check that calls such a process dead lets ``up`` find the port "in use" by nobody (the CI failure
of test_local_first_hour). A leader that called pthread_exit while another thread runs shows the
same zombie state for as long as we like, so the case is tested without a race.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

from fjord.local.cluster import pid_alive

_LEADER_EXITS = (
    "import ctypes, threading, time\n"
    "threading.Thread(target=time.sleep, args=(60,)).start()\n"
    "ctypes.CDLL(None).pthread_exit(None)\n"
)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0]


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not {what} after {timeout} s"
        time.sleep(0.01)


def test_zombie_leader_with_a_running_thread_is_alive() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _LEADER_EXITS])
    try:
        _wait_for(lambda: _state(proc.pid) == "Z", "a zombie leader")
        assert pid_alive(proc.pid)  # its other thread still runs
    finally:
        proc.kill()
    _wait_for(lambda: not pid_alive(proc.pid), "dead once killed")  # unreaped zombie: dead
    proc.wait(10)
    assert not pid_alive(proc.pid)  # reaped: gone


def test_live_process_is_alive_and_exited_child_is_not() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        assert pid_alive(proc.pid)
    finally:
        proc.stdin.close()  # it exits; nobody reaps it until wait() below
    _wait_for(lambda: not pid_alive(proc.pid), "dead after exiting")
    proc.wait(10)
