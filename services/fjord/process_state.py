"""What makes a restart in seconds safe, shared by brokers (their data dir) and coordinators
(their ``--state-dir``): an exclusive lock on the directory for the life of the process, and
the incarnation of the last process that used it.

A process registers in etcd under a lease with a random incarnation, new at every start
(Kafka's incarnation id). Started again after a SIGKILL, it finds its previous run's
registration still there until that lease expires. Holding the directory's lock, it reads the
incarnation the previous run recorded: a registration carrying that incarnation belongs to a
process that has stopped using the directory (the kernel drops an ``flock`` when its process
dies), so it may be deleted at once instead of waited out. Another live process with the same
id is never replaced: with another directory it recorded another incarnation, and it cannot
run on the same directory (the lock).
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

from fjord.errors import ConfigError
from fjord.storage.disk_health import describe_os_error, is_out_of_space

log = logging.getLogger(__name__)

#: Hidden file (LogManager ignores dot entries) holding the incarnation of the last process.
INCARNATION_FILE = ".fjord-incarnation"


class StateDirLock:
    """An exclusive ``flock`` on ``<directory>/<file_name>``, held for the life of the process
    (the kernel drops it when the process dies, also by SIGKILL). Two processes never share
    the directory: a second one fails at start with a :class:`ConfigError` naming ``option``
    and the holder's pid. This is what makes the incarnation recorded in the directory a proof
    that a registration carrying it belongs to a process that is gone (see
    :func:`record_incarnation`)."""

    def __init__(self, directory: Path, file_name: str, role: str, option: str) -> None:
        self.path = directory / file_name
        self._role = role
        self._option = option
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(
                f"{self._option}: {self.path.parent} is in use by another {self._role} process "
                f"(pid {holder}); two processes must never share a {self._option} directory"
            ) from exc
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as exc:  # the pid is only for the message above; a full disk may refuse
            if not is_out_of_space(exc):
                os.close(fd)
                raise
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def record_incarnation(directory: Path, incarnation: str) -> str | None:
    """Write ``incarnation`` as the directory's current one and return the previous run's (None:
    first run, or an unreadable file). Only call while holding the :class:`StateDirLock`: then
    a registration carrying the returned incarnation belongs to a process that has stopped
    using this directory, and may be replaced at once."""
    path = directory / INCARNATION_FILE
    try:
        previous: str | None = path.read_text().strip() or None
    except OSError:
        previous = None
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(incarnation)
    except OSError as exc:
        if not is_out_of_space(exc):
            raise
        # A full disk must not keep the process from starting (docs/operations.md, "Disk
        # full"). Still safe: the lock is held, so ``previous`` stopped using this directory;
        # the next start only cannot take this run's registration over at once (it waits for
        # the lease instead).
        tmp.unlink(missing_ok=True)
        log.warning("cannot record this run's incarnation in %s (%s): the next restart "
                    "waits for this run's lease", path, describe_os_error(exc))
        return previous
    os.replace(tmp, path)
    return previous
