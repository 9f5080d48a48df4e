"""LogManager opens logs outside its lock (so that the fsyncs of different partitions
overlap): threads asking for the same partition at once all get the one log it opened, and
a failed open lets the next caller try again."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from fjord.errors import StorageError
from fjord.storage import LogManager
from fjord.storage.log import PartitionLog


def test_concurrent_get_or_create_opens_each_partition_once(tmp_path: Path) -> None:
    manager = LogManager(tmp_path)
    results: dict[int, list[PartitionLog]] = {0: [], 1: [], 2: []}
    start = threading.Barrier(24)

    def ask(partition: int) -> None:
        start.wait()
        results[partition].append(manager.get_or_create("t", partition))

    threads = [threading.Thread(target=ask, args=(i % 3,)) for i in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        for partition, logs in results.items():
            assert len(logs) == 8
            assert all(log is logs[0] for log in logs), partition
            assert manager.get("t", partition) is logs[0]
        assert sorted(manager.logs()) == [("t", 0), ("t", 1), ("t", 2)]
    finally:
        manager.close()


def test_a_failed_open_is_tried_again(tmp_path: Path) -> None:
    manager = LogManager(tmp_path)
    bad = tmp_path / "t-0" / "00000000000000000xyz.log"  # a file the log refuses to load
    bad.parent.mkdir()
    bad.write_bytes(b"")
    try:
        with pytest.raises(StorageError):
            manager.get_or_create("t", 0)
        assert manager.get("t", 0) is None
        bad.unlink()
        assert manager.get_or_create("t", 0) is manager.get("t", 0)
    finally:
        manager.close()
