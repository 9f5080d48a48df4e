"""A test-only hook that stalls a broker's event loop for a given time, so that tests with real
processes can show what a busy or wedged loop does to the broker's lease
(fjord.broker.lease_keeper). Off unless the broker's environment sets
``FJORD_TESTING_LOOP_STALL_HOOK=1``; then SIGUSR2 makes the loop spin for the seconds written in
``<data-dir>/.fjord-testing-loop-stall-s`` (a CPU-bound spin that holds the GIL between switch
intervals, as a long metadata apply does, not a sleep)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)

#: Environment variable that turns the hook on (value ``1``).
LOOP_STALL_HOOK_ENV = "FJORD_TESTING_LOOP_STALL_HOOK"
#: File in the broker's data dir (hidden: LogManager skips dot entries) holding the seconds.
LOOP_STALL_FILE = ".fjord-testing-loop-stall-s"


def install_loop_stall_hook(loop: asyncio.AbstractEventLoop, data_dir: Path) -> bool:
    """Install the SIGUSR2 handler on ``loop`` when the environment asks for it; True if so."""
    if os.environ.get(LOOP_STALL_HOOK_ENV) != "1":
        return False
    loop.add_signal_handler(signal.SIGUSR2, _stall, data_dir / LOOP_STALL_FILE)
    log.warning("testing hook: SIGUSR2 stalls this process's event loop (%s=1)",
                LOOP_STALL_HOOK_ENV)
    return True


def _stall(seconds_file: Path) -> None:
    seconds = float(seconds_file.read_text())
    log.warning("testing hook: stalling the event loop for %.1f s", seconds)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    log.warning("testing hook: the event loop stall of %.1f s ended", seconds)


def stall_loop(pid: int, data_dir: Path, seconds: float) -> None:
    """Make the broker ``pid`` (data dir ``data_dir``, started with the hook on) stall its
    event loop for ``seconds``; returns at once."""
    (data_dir / LOOP_STALL_FILE).write_text(str(seconds))
    os.kill(pid, signal.SIGUSR2)
