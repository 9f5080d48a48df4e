"""What read_committed costs a consumer: fjord.client's CompletedFetch/FetchBuffer (the code
``poll()`` runs) over the same fetched bytes, read_uncommitted against read_committed, in process
on one core (no broker: the broker's share, the LSO and the aborted list, is a lookup per fetch).

Workload: transactions of ``--batches-per-txn`` batches of ``--records-per-batch`` records
(8-byte keys, 100-byte values) from four producers in turn, each ended by a marker; every
``--abort-every``-th transaction aborted. read_committed drops the aborted records and never
returns a marker; read_uncommitted returns every data record. The figure is records returned
per second and bytes of fetched log per second.

Run: ``.venv/bin/python bench/bench_read_committed.py [--transactions N] [--rounds R]
[--write-results]``; ``--write-results`` rewrites the "read_committed consumer" section of
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import cpu_model, write_section

from fjord.client.fetcher import CompletedFetch, FetchBuffer
from fjord.client.types import TopicPartition
from fjord.records import BatchBuilder, stamp_batch
from fjord.records.control import build_control_batch
from fjord.records.speedups import IMPLEMENTATION

TP = TopicPartition("bench", 0)
PRODUCERS = 4


def make_log(transactions: int, batches_per_txn: int, records_per_batch: int,
             abort_every: int) -> tuple[bytes, list[tuple[int, int]], int, int]:
    """(log bytes, aborted (producer id, first offset), records, committed records)."""
    value = os.urandom(50).hex().encode()
    parts: list[bytes] = []
    aborted: list[tuple[int, int]] = []
    offset = 0
    sequences = [0] * PRODUCERS
    committed = 0
    open_first: dict[int, int] = {}
    for txn in range(transactions):
        pid = txn % PRODUCERS
        for _ in range(batches_per_txn):
            builder = BatchBuilder(producer_id=pid, producer_epoch=0,
                                   base_sequence=sequences[pid], is_transactional=True,
                                   batch_size=1 << 20)
            for i in range(records_per_batch):
                builder.append(1_700_000_000_000, b"%08d" % i, value)
            batch = bytearray(builder.build())
            stamp_batch(batch, 0, offset, 0)
            parts.append(bytes(batch))
            open_first.setdefault(pid, offset)
            offset += records_per_batch
            sequences[pid] += records_per_batch
        abort = txn % abort_every == abort_every - 1
        marker = bytearray(build_control_batch(pid, 0, committed=not abort, coordinator_epoch=0,
                                               timestamp_ms=1_700_000_000_000))
        stamp_batch(marker, 0, offset, 0)
        parts.append(bytes(marker))
        first = open_first.pop(pid)
        if abort:
            aborted.append((pid, first))
        else:
            committed += batches_per_txn * records_per_batch
        offset += 1
    records = transactions * batches_per_txn * records_per_batch
    return b"".join(parts), aborted, records, committed


def consume(data: bytes, aborted: list[tuple[int, int]] | None) -> int:
    buffer = FetchBuffer()
    buffer.add(CompletedFetch(TP, 0, data, 1 << 40, aborted))
    positions = {TP: 0}
    count = 0
    while True:
        out, _ = buffer.collect(positions, set(), 500)
        if not out:
            return count
        count += len(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transactions", type=int, default=400)
    parser.add_argument("--batches-per-txn", type=int, default=5)
    parser.add_argument("--records-per-batch", type=int, default=100)
    parser.add_argument("--abort-every", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    data, aborted, records, committed = make_log(
        args.transactions, args.batches_per_txn, args.records_per_batch, args.abort_every
    )
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, listed in (("read_uncommitted", None), ("read_committed", aborted)):
            started = time.perf_counter()
            got = consume(data, listed)
            elapsed = time.perf_counter() - started
            assert got == (records if listed is None else committed), (name, got)
            best[name] = min(best.get(name, elapsed), elapsed)
    load = os.getloadavg()[0]
    rows = []
    for name in ("read_uncommitted", "read_committed"):
        returned = records if name == "read_uncommitted" else committed
        seconds = best[name]
        rows.append(f"| {name} | {returned:,} | {returned / seconds:,.0f} | "
                    f"{len(data) / seconds / 1e6:.1f} |")
    ratio = best["read_uncommitted"] / best["read_committed"]
    command = ("`.venv/bin/python bench/bench_read_committed.py "
               f"--transactions {args.transactions} --rounds {args.rounds} --write-results`")
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = "\n".join([
        f"{command}, {now}; machine: {os.cpu_count()} CPUs, {cpu_model()}, Python "
        f"{platform.python_version()}, records implementation: {IMPLEMENTATION}; "
        f"load average {load:.1f} when it ran (shared machine); "
        "best of the rounds; one core; the consumer's filter only (CompletedFetch/FetchBuffer "
        "over one fetched buffer, no broker).",
        "",
        f"Log: {args.transactions} transactions of {args.batches_per_txn} batches x "
        f"{args.records_per_batch} records (8-byte keys, 100-byte values) from {PRODUCERS} "
        f"producers, each ended by a marker, every {args.abort_every}th aborted; "
        f"{len(data) / 1e6:.1f} MB, {records:,} data records, {committed:,} committed.",
        "",
        "| isolation | records returned | records/s | fetched log MB/s |",
        "|---|---:|---:|---:|",
        *rows,
        "",
        f"read_committed reads the same log in {1 / ratio:.2f}x the time of read_uncommitted "
        "(it skips the aborted batches without decoding them, and decodes each marker).",
    ])
    print(body)
    if args.write_results:
        write_section("## read_committed consumer (issue 17)", body)


if __name__ == "__main__":
    main()
