"""Log compaction benchmark: fjord.storage.cleaner.clean_log throughput (MB/s of segments
cleaned) on a log of many updates to few keys, one clean of all its closed segments.

No target in issue 17 beyond measuring it; Kafka's cleaner does a few hundred MB/s per thread
in Java. The clean is two passes (offset map over the dirty section, then rewrite), both
decoding every record in Python; figures are per byte of closed segments before the clean.

Usage: .venv/bin/python bench/bench_compaction.py [--mib N] [--keys K] [--value-bytes V]
       [--records-per-batch R] [--codec none|lz4] [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_file import cpu_model

from fjord.records import BatchBuilder, compression_by_name
from fjord.storage import LogConfig, PartitionLog
from fjord.storage.cleaner import clean_log

MIB = 1024 * 1024


def build_log(directory: Path, mib: int, keys: int, value_bytes: int, per_batch: int,
              codec: str) -> PartitionLog:
    config = LogConfig.from_dict({"segment.bytes": str(16 * MIB), "cleanup.policy": "compact"})
    log = PartitionLog.open(directory, config)
    value = os.urandom(value_bytes)
    i = 0
    while log.size_in_bytes < mib * MIB:
        builder = BatchBuilder(compression=compression_by_name(codec), batch_size=1 << 30)
        for _ in range(per_batch):
            builder.append(1_700_000_000_000 + i, b"key-%06d" % (i % keys), value)
            i += 1
        log.append(builder.build(), leader_epoch=0)
    log.roll()
    return log


def one_round(mib: int, keys: int, value_bytes: int, per_batch: int, codec: str) -> dict:
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        log = build_log(Path(tmp) / "t-0", mib, keys, value_bytes, per_batch, codec)
        before = sum(s.size for s in log.segments[:-1])
        started = time.perf_counter()
        stats = clean_log(log, now_ms=int(time.time() * 1000), delete_retention_ms=86_400_000)
        seconds = time.perf_counter() - started
        assert stats is not None and stats.bytes_read == before
        after = sum(s.size for s in log.segments[:-1])
        log.close()
    return {"mb_s": before / seconds / 1e6, "seconds": seconds, "before": before, "after": after,
            "records": stats.records_read, "kept": stats.records_kept}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--records-per-batch", type=int, default=100)
    parser.add_argument("--codec", default="none")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rounds = [one_round(args.mib, args.keys, args.value_bytes, args.records_per_batch,
                        args.codec) for _ in range(args.rounds)]
    print(f"machine: {platform.node()} {cpu_model()} {os.cpu_count()} cpus, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"log: {args.mib} MiB, {args.keys} keys, {args.value_bytes}-byte values, "
          f"{args.records_per_batch} records/batch, codec {args.codec}")
    for r in rounds:
        print(f"  clean {r['before'] / MIB:.1f} MiB -> {r['after'] / MIB:.2f} MiB "
              f"({r['kept']} of {r['records']} records) in {r['seconds']:.2f} s: "
              f"{r['mb_s']:.1f} MB/s, {r['records'] / r['seconds'] / 1000:.0f}k records/s")
    print(f"median: {statistics.median(r['mb_s'] for r in rounds):.1f} MB/s")


if __name__ == "__main__":
    main()
