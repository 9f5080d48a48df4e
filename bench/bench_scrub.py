"""Scrubber benchmark: how fast stored batches are verified (CRC-32C, framing, offsets) when
unthrottled, and how closely the throttle holds ``log.scrubber.io.max.bytes.per.second``.

Builds a partition log of ``--mib`` MiB in 16 KiB batches (64 MiB segments), closes and reopens
it (segments loaded from disk, as after a restart), then:
  * verify: every closed segment through check_batches in 1 MiB chunks (page cache), MiB/s;
  * throttled: the broker's Scrubber.verify over the same segments at ``--rate`` MiB/s; the
    effective rate must be within 10% of the setting.

Usage: .venv/bin/python bench/bench_scrub.py [--dir DIR] [--mib N] [--rate MIB_PER_S]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_file import cpu_model

from fjord.broker.replica_manager import ReplicaManager
from fjord.broker.scrubber import Scrubber
from fjord.cluster.scrubber_config import ScrubberSettings
from fjord.storage import LogConfig, LogManager, PartitionLog
from fjord.storage.scrub import SegmentRef, check_batches
from fjord.storage.testing import make_batch_of_size

MIB = 1024 * 1024


def build(directory: Path, mib: int) -> None:
    config = LogConfig.from_dict({"segment.bytes": 64 * MIB})
    log = PartitionLog.open(directory / "bench-0", config, now_ms=0)
    batch = make_batch_of_size(16 * 1024)
    for _ in range(mib * 64):
        log.append(batch, 0, now_ms=0)
    log.roll(now_ms=0)
    log.close()


def verify_all(log: PartitionLog) -> tuple[int, float]:
    total = 0
    start = time.perf_counter()
    for segment in log.closed_segments():
        pos, expected = 0, segment.base_offset
        while pos < segment.size:
            data = segment.read(pos, min(pos + MIB, segment.size))
            check = check_batches(data, expected, final=pos + len(data) >= segment.size)
            assert check.damage is None
            pos += check.valid_bytes
            expected = check.next_offset
        total += segment.size
    return total, time.perf_counter() - start


async def throttled(directory: Path, rate: int) -> tuple[int, float]:
    logs = LogManager(directory)
    try:
        replicas = ReplicaManager(0, logs)
        scrubber = Scrubber(replicas, ScrubberSettings(io_max_bytes_per_second=rate))
        plog = logs.get("bench", 0)
        assert plog is not None
        total = 0
        start = time.perf_counter()
        for segment in plog.closed_segments():
            ref = SegmentRef("bench", 0, segment.base_offset, segment.size)
            assert await scrubber.verify(ref, plog, segment)
            total += segment.size
        return total, time.perf_counter() - start
    finally:
        logs.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rate", type=int, default=32, help="throttled run, MiB/s")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        build(directory, args.mib)
        log = PartitionLog.open(directory / "bench-0", LogConfig(), now_ms=0)
        verify_all(log)  # warm the page cache
        total, seconds = verify_all(log)
        log.close()
        done, took = asyncio.run(throttled(directory, args.rate * MIB))
    print(f"machine: {cpu_model()} ({platform.machine()}), python {platform.python_version()}")
    print(f"verify, unthrottled (page cache): {total / MIB:.0f} MiB in {seconds:.2f} s = "
          f"{total / MIB / seconds:.0f} MiB/s")
    effective = done / MIB / took
    print(f"throttled at {args.rate} MiB/s: {done / MIB:.0f} MiB in {took:.2f} s = "
          f"{effective:.1f} MiB/s ({effective / args.rate:.0%} of the setting)")
    return 0 if abs(effective / args.rate - 1) <= 0.10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
