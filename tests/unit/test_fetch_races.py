"""Consumer fetches racing the log's own changes, as the broker runs them: appends on the event
loop, segment rolls (size and ``segment.ms``), retention, flushes and big reads in worker
threads. No fetch of an offset the log holds may be answered OFFSET_OUT_OF_RANGE, and every
answer starts with the batch that holds the offset asked for.

This is the broker-side search for issue 11's "Spark read task's OFFSET_OUT_OF_RANGE under load
for an offset the log still held" (whose cause was the consumer's, fixed in 639b028): the reads
that decide OFFSET_OUT_OF_RANGE (``Partition.fetch_upper_bound``, which reads the log start and
end without the log's lock, and ``PartitionLog.read``, under it) raced against every writer the
broker has. docs/broker.md ("Reads racing the log") says what was ruled out and why.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path

from fjord._proto import broker_pb2
from fjord.broker import defaults as broker_defaults
from fjord.broker.partition import Partition, PartitionAssignment
from fjord.records import stamp_batch
from fjord.records.header import parse_header
from fjord.storage import LogConfig, PartitionLog
from tests.helpers.replica_manager import (
    Env,
    batch,
    env,
    leader_state,
    one_fetch,
    one_produce,
    produce_request,
    run,
)

__all__ = ["env"]  # the fixture, used by name

TOPIC = "races"
#: Small segments roll every few appends; retention keeps only a few of them.
CONFIG = {"segment.bytes": "2048", "retention.bytes": "8192", "segment.ms": "5"}
#: Records produced in all (each produce is one batch of 1-5 records of ~100 bytes).
TARGET_RECORDS = 1_500
#: Readers stay this far behind the high watermark at most; retention may only delete below
#: the oldest offset a reader may still ask for (the "floor"), so every offset asked for is
#: held by the log when it is asked.
WINDOW = 400


def fetch(offset: int, big: bool) -> broker_pb2.FetchRequest:
    # A fetch whose limits and readable bytes exceed READ_IN_THREAD_THRESHOLD_BYTES is read in
    # a worker thread, concurrently with the event loop's appends; a small one on the loop
    # itself (with this test's 2 KiB segments every fetch is small: read_in_thread() below
    # races the log's own read against the loop instead).
    size = 2 * broker_defaults.READ_IN_THREAD_THRESHOLD_BYTES if big else 64 * 1024
    return broker_pb2.FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=size,
        topics=[
            broker_pb2.FetchTopic(
                name=TOPIC,
                partitions=[
                    broker_pb2.FetchPartition(
                        partition=0,
                        fetch_offset=offset,
                        partition_max_bytes=size,
                        current_leader_epoch=-1,
                    )
                ],
            )
        ],
    )


def test_fetches_racing_rolls_retention_and_flushes_never_miss_a_held_offset(env: Env) -> None:
    manager, cluster, _ = env
    rng = random.Random(11)
    floor = 0  # no reader asks below this; retention never deletes at or above it
    stop = threading.Event()
    problems: list[str] = []
    checked = {"fetches": 0, "thread_reads": 0, "rolls": 0, "deleted": 0}

    maintained = asyncio.Event()

    async def produce() -> None:
        produced = 0
        appends = 0
        while produced < TARGET_RECORDS:
            appends += 1
            if appends % 60 == 0:
                # Give maintenance a full round now and then, so that deletions and rolls
                # happen all along however the machine schedules the worker threads.
                maintained.clear()
                await asyncio.wait_for(maintained.wait(), 10)
            n = rng.randint(1, 5)
            answer = one_produce(
                await manager.produce(produce_request(TOPIC, 0, batch(n, value=b"x" * 100)))
            )
            assert answer.error.code == 0, answer
            produced += n
            await asyncio.sleep(0)

    async def maintain() -> None:
        """The broker's periodic duties, back to back (server.py runs them on timers)."""
        partition = manager.partitions[(TOPIC, 0)]
        plog = partition.log
        rounds = 0
        while not stop.is_set():
            now = int(time.time() * 1000)
            if await asyncio.to_thread(plog.maybe_roll, now):
                checked["rolls"] += 1
            limit = min(partition.high_watermark, floor)
            deleted = await asyncio.to_thread(plog.apply_retention, now, limit)
            if deleted:
                checked["deleted"] += deleted
                manager.on_log_start_moved([(TOPIC, 0)])
            rounds += 1
            if rounds % 5 == 0:  # fsyncs are slow; the offsets they move are none
                await asyncio.to_thread(plog.flush)
            maintained.set()

    def check(offset: int, data: bytes, upper: int, what: str) -> None:
        if not data:
            if offset < upper:
                problems.append(f"{what}: nothing at {offset} below {upper}")
            return
        first = parse_header(data, 0)
        if not first.base_offset <= offset < first.next_offset:
            problems.append(
                f"{what}: asked {offset}, got batch [{first.base_offset}, {first.next_offset})"
            )

    async def read() -> None:
        """A consumer: fetches through the ReplicaManager at offsets in [floor, hw]."""
        partition = manager.partitions[(TOPIC, 0)]
        while not stop.is_set():
            hw = partition.high_watermark
            offset = rng.randint(min(floor, hw), hw)
            out = one_fetch(await manager.fetch(fetch(offset, big=rng.random() < 0.3)))
            checked["fetches"] += 1
            if out.error.code != 0:
                problems.append(
                    f"fetch at {offset} (floor {floor}, hw {hw}, log start "
                    f"{partition.log_start_offset}): error {out.error.code} {out.error.message}"
                )
            else:
                check(offset, out.records, hw, "fetch")
            await asyncio.sleep(0)

    def read_in_thread() -> None:
        """What a big fetch does in its worker thread, without pause: the log's own read
        against the event loop's appends and the maintenance thread's rolls and deletions."""
        partition = manager.partitions[(TOPIC, 0)]
        local = random.Random(12)
        while not stop.is_set():
            hw = partition.high_watermark
            offset = local.randint(min(floor, hw), hw)
            try:
                data = partition.log.read(offset, 4096, hw)
            except Exception as exc:
                problems.append(f"thread read at {offset} (floor {floor}, hw {hw}): {exc!r}")
                continue
            checked["thread_reads"] += 1
            check(offset, data, hw, "thread read")
            time.sleep(0)  # let the event loop have the GIL between reads

    async def scenario() -> None:
        nonlocal floor
        await manager.apply_metadata(cluster.topic(TOPIC, [leader_state()], CONFIG))
        partition = manager.partitions[(TOPIC, 0)]
        reader_thread = threading.Thread(target=read_in_thread, daemon=True)
        reader_thread.start()
        background = [asyncio.ensure_future(c) for c in (maintain(), read(), read())]
        producing = asyncio.ensure_future(produce())
        try:
            while not producing.done():
                floor = max(floor, partition.high_watermark - WINDOW)
                await asyncio.sleep(0.001)
            await producing
        finally:
            stop.set()
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await asyncio.to_thread(reader_thread.join, 10)
        assert not problems, "\n".join(problems[:20])
        # The race was real: segments rolled and were deleted under the readers.
        assert checked["deleted"] >= 5 and partition.log_start_offset > 0, checked
        assert checked["fetches"] > 100 and checked["thread_reads"] > 100, checked

    run(scenario())


def test_new_leader_behind_the_old_high_watermark_answers_empty_not_out_of_range(
    tmp_path: Path,
) -> None:
    """A consumer planned its range from the old leader's high watermark (10); the new leader
    (in the ISR, so it holds every offset below 10) still has the high watermark it learned as
    a follower (6). Offsets in [6, 10] are answered with nothing until the followers prove
    their progress, never OFFSET_OUT_OF_RANGE; then they are read."""
    plog = PartitionLog.open(tmp_path / "t-0", LogConfig())
    part = Partition(
        "t", 0, 2, plog, PartitionAssignment(1, 5, (1, 2), (1, 2)), min_insync_replicas=1
    )
    raw = bytearray(batch(10))
    stamp_batch(raw, 0, 0, 5)
    part.append_as_follower(bytes(raw), 6)  # the leader's high watermark at that fetch
    assert (part.high_watermark, part.log_end_offset) == (6, 10)
    part.update_assignment(PartitionAssignment(2, 6, (1, 2), (1, 2), partition_epoch=1))
    assert part.is_leader and part.high_watermark == 6
    for offset in range(6, 11):
        assert part.fetch_upper_bound(offset, -1) == 6  # below it: nothing visible yet
    part.record_follower_fetch(1, 10, 0)  # the other replica proves it holds [0, 10)
    assert part.high_watermark == 10
    assert part.fetch_upper_bound(8, -1) == 10
    assert parse_header(part.log.read(8, 1 << 20, 10), 0).base_offset == 0
