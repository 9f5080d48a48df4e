"""The broker's watch over its data directory: failed writes are logged once per change of
condition and counted, and a directory that cannot be written makes the broker hand over
leadership (asyncio shell around the pure :class:`fjord.storage.disk_health.DiskHealth`)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

from fjord.broker import defaults
from fjord.observability import metrics
from fjord.storage.disk_health import DiskCondition, DiskHealth, write_error_of

log = logging.getLogger(__name__)


def probe_data_dir(data_dir: Path) -> OSError | None:
    """Whether ``data_dir`` takes writes again: enough free space
    (``DISK_PROBE_MIN_FREE_BYTES``) and a probe file written, fsynced and removed. Returns the
    error that says no, None when writable. Blocking: run it in a worker thread."""
    try:
        st = os.statvfs(data_dir)
        free = st.f_bavail * st.f_frsize
        if free < defaults.DISK_PROBE_MIN_FREE_BYTES:
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        path = data_dir / defaults.DISK_PROBE_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, bytes(defaults.DISK_PROBE_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)
    except OSError as exc:
        return exc
    return None


class DiskMonitor:
    """Watches one data directory through the writes the broker reports.

    Invariants: each change of condition is logged once (never a traceback per failed write);
    every failed write is counted in ``fjord_broker_log_dir_write_errors_total``; the gauge
    ``fjord_broker_log_dir_writable`` follows the condition; ``on_unwritable`` runs when the
    directory turns unwritable and again on every probe that finds it still unwritable (so
    partitions that became led meanwhile are handed over too); ``on_writable`` runs once when
    a probe finds it writable again.
    """

    def __init__(
        self,
        data_dir: Path,
        on_unwritable: Callable[[DiskCondition], None],
        on_writable: Callable[[], None],
    ) -> None:
        self.data_dir = data_dir
        self.health = DiskHealth()
        self._on_unwritable = on_unwritable
        self._on_writable = on_writable
        metrics.set_log_dir_writable(True)

    @property
    def writable(self) -> bool:
        return self.health.writable

    def report(self, operation: str, exc: BaseException) -> bool:
        """A write for ``operation`` failed with ``exc``. Returns True when it was an OS write
        error (counted, and logged if the condition changed); False for anything else (a bug:
        the caller logs it as before)."""
        error = write_error_of(exc)
        if error is None:
            return False
        metrics.record_log_dir_write_error(operation)
        changed = self.health.on_write_failed(operation, error)
        if changed is not None:
            self._changed(changed)
        return True

    def _changed(self, condition: DiskCondition) -> None:
        if condition.writable:
            metrics.set_log_dir_writable(True)
            log.warning(
                "data directory %s is writable again: following and rejoining the ISR",
                self.data_dir,
            )
            self._on_writable()
            return
        metrics.set_log_dir_writable(False, new_episode=True)
        log.error(
            "data directory %s cannot be written: %s (first met by %s). Handing over "
            "leadership where another in-sync replica can take it, serving reads, and "
            "probing every %.0f s; free space to resume",
            self.data_dir, condition.reason, condition.operation, defaults.DISK_PROBE_INTERVAL_S,
        )
        self._on_unwritable(condition)

    async def run(self) -> None:
        """Probe the directory while it cannot be written (a worker thread does the I/O)."""
        while True:
            await asyncio.sleep(defaults.DISK_PROBE_INTERVAL_S)
            if self.health.writable:
                continue
            error = await asyncio.to_thread(probe_data_dir, self.data_dir)
            if error is not None:
                metrics.record_log_dir_write_error("probe")
            changed = self.health.on_probe(error)
            if changed is not None:
                self._changed(changed)
            elif not self.health.writable:
                self._on_unwritable(self.health.condition)
