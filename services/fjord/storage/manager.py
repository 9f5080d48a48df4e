"""Every partition log of one broker data directory."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fjord.errors import FjordError, InvalidTopicError, StorageError
from fjord.storage import defaults
from fjord.storage.config import LogConfig
from fjord.storage.disk_health import describe_os_error
from fjord.storage.log import PartitionLog
from fjord.topic_partition import TopicPartition

log = logging.getLogger(__name__)

TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


#: Files the broker keeps next to the partition directories (Kafka's
#: ``replication-offset-checkpoint``, see fjord.broker.replication_checkpoint).
BROKER_CHECKPOINT_PREFIX = "replication-offset-checkpoint"


def parse_partition_dir_name(name: str) -> TopicPartition | None:
    """``("orders", 3)`` for ``orders-3``; None when the name does not have that shape."""
    topic, sep, number = name.rpartition("-")
    if not sep or not number.isdigit() or not TOPIC_NAME.match(topic) or topic in (".", ".."):
        return None
    return TopicPartition(topic, int(number))


class LogManager:
    """The partition logs of one data directory, loaded (and recovered) at construction.

    On-disk layout: ``<data_dir>/<topic>-<partition>/`` per partition (see
    :class:`PartitionLog`), ``<data_dir>/.lock`` held with ``flock`` while a manager uses the
    directory (a second broker on the same directory fails fast), and transient
    ``<topic>-<partition>.deleted`` directories during a delete (finished at the next start).
    Hidden entries (starting with '.') are ignored.

    Invariants: one :class:`PartitionLog` per partition directory; a directory that cannot be
    loaded makes construction raise :class:`StorageError` naming it (never silently dropped).
    """

    def __init__(
        self, data_dir: str | os.PathLike[str], default_config: LogConfig | None = None
    ) -> None:
        self.data_dir = Path(data_dir)
        self.default_config = default_config or LogConfig()
        self._logs: dict[TopicPartition, PartitionLog] = {}
        self._lock = threading.Lock()
        #: Partitions some thread is opening (get_or_create opens outside the lock); waiters
        #: for one of them wait on ``_opened``.
        self._opening: set[TopicPartition] = set()
        self._opened = threading.Condition(self._lock)
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(
                self.data_dir / defaults.DATA_DIR_LOCK, os.O_RDWR | os.O_CREAT, 0o644
            )
        except OSError as e:
            raise StorageError(f"cannot use data directory {self.data_dir}: {e}") from e
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise StorageError(
                f"data directory {self.data_dir} is in use by another process"
            ) from None
        try:
            self._load_all()
        except BaseException:
            self.close()
            raise

    def _load_all(self) -> None:
        """Open every partition directory, ``defaults.LOAD_THREADS`` at a time: opening a log
        after a restart is mostly waiting for fsyncs (the recovery checkpoint, the directory
        once the clean-shutdown marker is gone), which overlap across threads; one at a time,
        a broker with thousands of partitions waits for them in turn."""
        found: list[tuple[TopicPartition, Path]] = []
        for entry in sorted(self.data_dir.iterdir()):
            if entry.name.startswith("."):
                continue
            if entry.name.endswith(defaults.DELETED_SUFFIX):
                shutil.rmtree(entry, ignore_errors=True)
                continue
            if not entry.is_dir():
                if entry.name.startswith(BROKER_CHECKPOINT_PREFIX):
                    continue  # the broker's replication-offset-checkpoint (and its temp file)
                raise StorageError(f"unexpected file {entry} in data directory {self.data_dir}")
            key = parse_partition_dir_name(entry.name)
            if key is None:
                raise StorageError(
                    f"directory {entry} is not named <topic>-<partition>: cannot load it"
                )
            found.append((key, entry))

        def open_one(item: tuple[TopicPartition, Path]) -> tuple[TopicPartition, PartitionLog]:
            key, entry = item
            try:
                return key, PartitionLog.open(entry, self.default_config)
            except FjordError as e:
                raise StorageError(f"cannot load partition directory {entry}: {e}") from e

        started = time.monotonic()
        unclean = 0
        with ThreadPoolExecutor(max_workers=defaults.LOAD_THREADS,
                                thread_name_prefix="fjord-log-load") as pool:
            futures = [pool.submit(open_one, item) for item in found]
            failure: BaseException | None = None
            for future in futures:  # every open finishes (or fails) before this returns
                try:
                    key, opened = future.result()
                except BaseException as exc:
                    failure = failure or exc
                    continue
                self._logs[key] = opened
                report = opened.recovery
                if report is not None and not report.clean_shutdown:
                    unclean += 1
                    if report.truncated_bytes or report.deleted_segments:
                        log.warning("recovered %s after an unclean shutdown: %s",
                                    opened.directory, report)
        if failure is not None:
            raise failure
        if found:
            # One line for the whole directory (Kafka's "Loaded N logs"), not one per log: a
            # crash of a broker with thousands of partitions wrote thousands of lines here.
            log.info("loaded %d partition logs from %s in %.1f s (%d recovered after an unclean "
                     "shutdown)", len(found), self.data_dir, time.monotonic() - started, unclean)

    def get_or_create(
        self, topic: str, partition: int, config: LogConfig | None = None
    ) -> PartitionLog:
        """The log of ``topic``-``partition``, created when absent. A given ``config`` replaces
        the log's current one (topic configs arrive from the metadata after startup)."""
        if not TOPIC_NAME.match(topic) or topic in (".", ".."):
            raise InvalidTopicError(f"invalid topic name {topic!r}")
        if partition < 0:
            raise InvalidTopicError(f"invalid partition {partition} of topic {topic!r}")
        key = TopicPartition(topic, partition)
        with self._lock:
            while True:
                existing = self._logs.get(key)
                if existing is not None:
                    if config is not None:
                        existing.config = config
                    return existing
                if key not in self._opening:
                    self._opening.add(key)  # ours to open; others wait for it
                    break
                self._opened.wait()
        # Opened outside the lock: opens of different partitions (their fsyncs) overlap.
        try:
            created = PartitionLog.open(
                self.data_dir / partition_dir_name(topic, partition),
                config or self.default_config,
            )
        except BaseException:
            with self._lock:
                self._opening.discard(key)
                self._opened.notify_all()
            raise
        with self._lock:
            self._logs[key] = created
            self._opening.discard(key)
            self._opened.notify_all()
        return created

    def get(self, topic: str, partition: int) -> PartitionLog | None:
        return self._logs.get(TopicPartition(topic, partition))

    def delete(self, topic: str, partition: int) -> bool:
        """Close and delete the partition's log and its directory; returns whether it existed.
        The directory is first renamed to ``*.deleted`` so a crash mid-delete cannot resurrect
        a partial log. Does blocking file I/O: call it from a worker thread in a service."""
        with self._lock:
            existing = self._logs.pop(TopicPartition(topic, partition), None)
        if existing is None:
            return False
        existing.abandon()
        directory = existing.directory
        doomed = directory.with_name(directory.name + defaults.DELETED_SUFFIX)
        os.replace(directory, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        return True

    def logs(self) -> dict[TopicPartition, PartitionLog]:
        """A snapshot of every loaded log by ``(topic, partition)``."""
        with self._lock:
            return dict(self._logs)

    def logs_needing_flush(self, now_ms: int | None = None) -> list[PartitionLog]:
        return [log_ for log_ in self.logs().values() if log_.needs_flush(now_ms)]

    def apply_retention(self, now_ms: int | None = None) -> int:
        """Run retention and time-based rolling on every log; returns segments deleted."""
        deleted = 0
        for partition_log in self.logs().values():
            partition_log.maybe_roll(now_ms)
            deleted += partition_log.apply_retention(now_ms)
        return deleted

    def close(self) -> None:
        """Close every log cleanly (flush, checkpoints, clean-shutdown markers) and unlock."""
        with self._lock:
            logs, self._logs = list(self._logs.values()), {}
        unclosed: list[tuple[PartitionLog, OSError]] = []

        def close_one(partition_log: PartitionLog) -> None:
            try:
                partition_log.close()
            except OSError as e:  # a full disk: this log is recovered at the next start
                partition_log.abandon()
                unclosed.append((partition_log, e))

        # Several at a time, as at start: each close waits for fsyncs (flush, checkpoint,
        # clean-shutdown marker), which overlap across threads.
        with ThreadPoolExecutor(max_workers=defaults.LOAD_THREADS,
                                thread_name_prefix="fjord-log-close") as pool:
            for future in [pool.submit(close_one, partition_log) for partition_log in logs]:
                future.result()
        if unclosed:
            log.warning(
                "%d partition logs in %s could not be closed cleanly (%s, first %s): they are "
                "recovered from their last recovery point at the next start",
                len(unclosed), self.data_dir, describe_os_error(unclosed[0][1]),
                unclosed[0][0].directory.name,
            )
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
