"""__consumer_offsets replay before and after compaction, in process: a partition log of
``--commits`` offset commits over ``--keys`` (group, topic, partition) keys in Kafka's
record format, replayed the way a coordinator taking the partition over replays it (read every
batch from the log start, decode every record, apply it to a GroupMetadataLoader), then cleaned
with fjord.storage.cleaner.clean_log and replayed again.

What this leaves out of a real takeover: the network (the coordinator reads through a consumer
from the partition's leader) and the claim; it measures the part that grows with the history.
Issue 17 asks for 1,000,000 commits of 1,000 keys.

Usage: .venv/bin/python bench/bench_offsets_replay.py [--commits N] [--keys K] [--per-batch B]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_file import cpu_model

from fjord.coordinator.offsets_log import (
    GroupMetadataLoader,
    OffsetCommitKey,
    OffsetCommitValue,
    encode_record,
)
from fjord.records import BatchBuilder, decode_records, read_batches
from fjord.storage import LogConfig, PartitionLog
from fjord.storage.cleaner import clean_log

MIB = 1024 * 1024


def build(directory: Path, commits: int, keys: int, per_batch: int) -> PartitionLog:
    config = LogConfig.from_dict({"segment.bytes": str(16 * MIB), "cleanup.policy": "compact"})
    log = PartitionLog.open(directory, config)
    now = int(time.time() * 1000)
    for start in range(0, commits, per_batch):
        builder = BatchBuilder(batch_size=1 << 30)
        for i in range(start, min(start + per_batch, commits)):
            k = i % keys
            key = OffsetCommitKey(f"group-{k // 10}", "orders", k % 10)
            raw_key, raw_value = encode_record((key, OffsetCommitValue(i, 0, "", now)))
            builder.append(now, raw_key, raw_value)
        log.append(builder.build(), leader_epoch=0)
    log.roll()
    return log


def replay(log: PartitionLog) -> tuple[float, int, int]:
    """Seconds to replay the whole log, records applied, groups loaded."""
    started = time.perf_counter()
    loader = GroupMetadataLoader()
    offset, applied = log.log_start_offset, 0
    while offset < log.log_end_offset:
        data = log.read(offset, 1 * MIB)
        for record in decode_records(data):
            assert record.key is not None
            loader.apply_bytes(record.key, record.value)
            applied += 1
        offset = list(read_batches(data))[-1].next_offset
    groups = loader.groups()
    return time.perf_counter() - started, applied, len(groups)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--per-batch", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        log = build(Path(tmp) / "__consumer_offsets-0", args.commits, args.keys, args.per_batch)
        size_before = log.size_in_bytes
        before, applied_before, groups_before = replay(log)
        started = time.perf_counter()
        stats = clean_log(log, now_ms=int(time.time() * 1000), delete_retention_ms=86_400_000)
        clean_s = time.perf_counter() - started
        assert stats is not None
        size_after = log.size_in_bytes
        after, applied_after, groups_after = replay(log)
        assert groups_after == groups_before
        log.close()
    print(f"machine: {platform.node()} {cpu_model()} {os.cpu_count()} cpus, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{args.commits} commits of {args.keys} keys, {args.per_batch} per batch")
    print(f"  before compaction: {size_before / MIB:.1f} MiB, replay {applied_before} records "
          f"in {before:.2f} s")
    print(f"  clean: {clean_s:.2f} s")
    print(f"  after compaction: {size_after / MIB:.2f} MiB, replay {applied_after} records "
          f"in {after:.3f} s ({before / after:.0f}x faster)")


if __name__ == "__main__":
    main()
