"""The Spark sink's exactly-once mode, end to end: the orders -> shipments job (which writes with
``exactlyOnce`` and reads with read_committed) in its own driver process, SIGKILLed in the middle
of a micro-batch (one write task has committed its transaction, another holds one open with
records sent) and run again from its checkpoint. Under read_committed its output holds every
order exactly once and none of the killed attempt's uncommitted records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from fjord.client import Consumer, TopicPartition
from fjord.errors import FjordError
from fjord.testing.waiting import wait_for
from fjord_spark import defaults
from fjord_spark.options import parse_writer_options
from fjord_spark.source import (
    FjordCommitMessage,
    WriteTask,
    committed_batches,
    write_exactly_once,
)
from tests.helpers.spark import SPARK_WAIT_S, order, read_all, send_orders

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
COMMITTED = {"isolation.level": "read_committed"}


def keys(records: list) -> Counter[str]:  # type: ignore[type-arg]
    return Counter((r.key or b"").decode() for r in records)


def batches_committed(bootstrap: str, checkpoint: Path, write_task: int, topic: str) -> int:
    """The exactly-once sink's marker of a write task of the job's query: how many batches it
    committed (its transactional id holds the query id from the checkpoint's metadata)."""
    metadata = checkpoint / "orders-shipments" / "metadata"
    if not metadata.exists():
        return 0
    query_id = json.loads(metadata.read_text().splitlines()[0])["id"]
    group = f"{defaults.TRANSACTIONAL_ID_PREFIX}-{query_id}-{write_task}"
    settings = {"bootstrap.servers": bootstrap, "group.id": group, **COMMITTED}
    with Consumer(settings) as reader:
        tp = TopicPartition(topic, 0)
        return reader.committed([tp])[tp] or 0


def start_driver(args: list[str]) -> subprocess.Popen[bytes]:
    """The job's driver in a new session, so the whole of it (Python, its JVM, the JVM's Python
    workers) can be SIGKILLed at once, as a crashed driver host would be."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark.eos_driver", *args],
        cwd=REPO,
        env=env,
        start_new_session=True,
    )


@pytest.mark.timeout(900)
def test_driver_killed_mid_batch_output_exactly_once_under_read_committed(
    bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    orders, shipments, dead = new_topic(2), new_topic(2), new_topic(1)
    # Partition 0: o-0..o-4 (its write task commits); partition 1: o-5..o-9, its task hangs at
    # o-8 with the rows before it (o-5..o-7) sent in its open transaction; o-9 is a dead letter.
    first = [order(f"o-{i}", "SKU-BOOK") for i in range(5)]
    second = [order(f"o-{i}", "SKU-PHONE") for i in range(5, 9)] + [("o-9", "{broken")]
    send_orders(bootstrap, orders, first, partition=0)
    send_orders(bootstrap, orders, second, partition=1)
    flag = tmp_path / "hung"
    checkpoint = tmp_path / "checkpoint"
    args = [bootstrap, orders, shipments, dead, str(checkpoint), str(flag), "o-8"]

    driver = start_driver(args)
    try:

        def mid_batch() -> bool:
            assert driver.poll() is None, "the driver ended before it hung"
            if not flag.exists():
                return False
            sent = keys(read_all(bootstrap, shipments))
            if not all(f"o-{i}" in sent for i in range(5)) or "o-5" not in sent:
                return False
            return batches_committed(bootstrap, checkpoint, write_task=0, topic=shipments) == 1

        wait_for(mid_batch, "a committed write task and an open transaction", SPARK_WAIT_S)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(60)
    killed_committed = keys(read_all(bootstrap, shipments, **COMMITTED))
    assert "o-5" not in killed_committed  # the open transaction is not visible

    rerun = start_driver(args)
    try:
        assert rerun.wait(SPARK_WAIT_S) == 0
    finally:
        if rerun.poll() is None:
            os.killpg(rerun.pid, signal.SIGKILL)

    expected = {f"o-{i}": 1 for i in range(9)}
    shipped = read_all(bootstrap, shipments, **COMMITTED)
    assert keys(shipped) == expected  # every order once, across the kill
    assert {json.loads(r.value or b"")["order_id"] for r in shipped} == set(expected)
    assert keys(read_all(bootstrap, dead, **COMMITTED)) == {"o-9": 1}
    # The killed attempt's records are in the log (read_uncommitted sees them twice), aborted.
    assert keys(read_all(bootstrap, shipments))["o-5"] == 2


def rows(*keys: str) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"key": [k.encode() for k in keys], "value": [f"v-{k}".encode() for k in keys]}
    )


def test_write_task_attempts_fence_each_other_and_a_committed_batch_is_skipped(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """Without Spark: the write task itself. A second attempt of a partition's task that starts
    while the first still sends fences it (the first fails, its records aborted) and commits
    once; a third attempt of the same batch finds the marker and writes nothing; the next batch
    is written."""
    topic = new_topic(1)
    options = parse_writer_options(
        {"bootstrap.servers": bootstrap, "topic": topic, "exactlyOnce": "true"}
    )
    task = WriteTask(query_id=uuid.uuid4().hex, batch_id=0, partition=3)
    second: list[FjordCommitMessage] = []

    def zombie_rows() -> Iterator[pa.RecordBatch]:
        yield rows("a", "b")
        # A retry of the same task starts meanwhile: it fences this attempt and commits.
        second.append(write_exactly_once(options, iter([rows("a", "b", "c")]), task))
        yield rows("c")

    with pytest.raises(FjordError):
        write_exactly_once(options, zombie_rows(), task)
    assert second == [FjordCommitMessage(3)]
    again = write_exactly_once(options, iter([rows("a", "b", "c")]), task)
    assert again == FjordCommitMessage(0, skipped=True)
    next_batch = WriteTask(task.query_id, batch_id=1, partition=3)
    assert write_exactly_once(options, iter([rows("d")]), next_batch) == FjordCommitMessage(1)

    assert keys(read_all(bootstrap, topic, **COMMITTED)) == {"a": 1, "b": 1, "c": 1, "d": 1}
    # The zombie's "a" reaches the log (aborted) only if its batch left before the fence; a
    # fenced producer may also drop it unsent. Either way read_committed saw "a" once (above).
    assert keys(read_all(bootstrap, topic))["a"] in (1, 2)
    # commit_transaction() returns once the commit is decided; the marker's offset is applied
    # by the group coordinator after that (a new attempt's init_transactions waits for it).
    wait_for(
        lambda: batches_committed_of(bootstrap, options, task, topic) == 2,
        "the marker of batch 1",
        SPARK_WAIT_S,
    )


def batches_committed_of(bootstrap: str, options: Any, task: WriteTask, topic: str) -> int:
    return committed_batches(
        options, task.transactional_id(options.transactional_id_prefix), TopicPartition(topic, 0)
    )
