"""Where a record's end-to-end time goes at 10,000 records/s (issue 18's p99 target).

The latency run of bench/bench_e2e.py (one broker, one partition, 100-byte values, a producer
paced at ``--rate`` with ``linger.ms`` 5 and a consumer on its own thread, both in this
process), with timestamps taken inside the clients (the sender's and the fetcher's methods
wrapped here, the clients' code unchanged):

- **linger**: send() -> the sender drains the record's batch (the batch opened at its first
  record; ``linger.ms`` is from there, so a record waits between 0 and linger.ms);
- **late**: how long after its ``created + linger.ms`` the batch was drained (the sender's
  timer precision and the loop's scheduling);
- **produce**: drained -> Produce answered (request, broker append, answer);
- **fetched**: drained -> the Fetch answer carrying the record reached the consumer's loop
  (broker append + long-poll wake + the answer's trip; the Fetch answer may come before the
  Produce answer);
- **poll**: the Fetch answer stored -> ``poll()`` returned the record (the consumer thread's
  wake-up across threads).

Printed: p50/p99 of the whole and of each step, and the mean of each step over the records at
or above the p99 (what the tail is made of), plus the garbage collections and the load.

Run::

    .venv/bin/python bench/latency_breakdown.py [--rate 10000] [--seconds 5] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import gc
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_e2e import (
    OP_TIMEOUT_S,
    STAMP,
    gc_pauses,
    keep_after_warmup,
    paced_producer,
    stamped_value,
)

from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.client import fetcher as fetcher_module
from fjord.client import producer as producer_module
from fjord.local.cluster import LocalCluster


def _ns() -> int:
    return time.perf_counter_ns()


class Probes:
    """Timestamps from inside the clients (perf_counter_ns, the same clock as the stamps)."""

    def __init__(self) -> None:
        # (base offset, records, created ns, drained ns, answered ns)
        self.batches: list[tuple[int, int, int, int, int]] = []
        # (first offset of a stored fetch, stored ns), in fetch order
        self.fetches: list[tuple[int, int]] = []

    current: Probes | None = None

    def install(self) -> None:
        """Make this the object the wrapped methods report to (wrapping them the first time)."""
        installed = Probes.current is not None
        Probes.current = self
        if installed:
            return
        original_produce = producer_module._Sender._produce
        original_store = fetcher_module.Fetcher._store_fetch

        async def produce(self: Any, node_id: int, batches: list[Any]) -> None:
            drained = _ns()
            created = [int(b.created_ms * 1e6) for b in batches]
            await original_produce(self, node_id, batches)
            answered = _ns()
            probes = Probes.current
            assert probes is not None
            for batch, made in zip(batches, created, strict=True):
                probes.batches.append((
                    batch.completion.base_offset, batch.record_count, made, drained, answered
                ))

        def store(self: Any, partitions: dict[Any, int], response: Any) -> bool:
            stored = _ns()
            probes = Probes.current
            assert probes is not None
            for offset in partitions.values():
                probes.fetches.append((offset, stored))
            return original_store(self, partitions, response)  # type: ignore[no-any-return]

        producer_module._Sender._produce = produce  # type: ignore[method-assign]
        fetcher_module.Fetcher._store_fetch = store  # type: ignore[method-assign]


def percentile(data: list[float], q: float) -> float:
    data = sorted(data)
    return data[min(len(data) - 1, int(q * len(data)))] if data else float("nan")


def one_run(bootstrap: str, topic: str, rate: int, seconds: float, linger_ms: int) -> str:
    probes = Probes()
    probes.install()
    total = int(rate * seconds)
    rows: list[tuple[int, int, int]] = []  # (offset, sent ns, polled ns)
    tp = TopicPartition(topic, 0)
    consumer = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "latest"})
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": linger_ms})
    pauses: list[tuple[int, float]] = []
    try:
        consumer.assign([tp])
        consumer.position(tp, timeout=30)
        producer.partitions_for(topic)
        stop = threading.Event()

        def consume() -> None:
            deadline = time.monotonic() + seconds + OP_TIMEOUT_S
            while len(rows) < total and time.monotonic() < deadline and not stop.is_set():
                batch = consumer.poll(0.1)
                now = _ns()
                rows.extend((r.offset, STAMP.unpack_from(r.value)[0], now) for r in batch)

        reader = threading.Thread(target=consume, name="e2e-consumer")
        reader.start()

        def send_many(count: int) -> None:
            for _ in range(count):
                producer.send(topic, stamped_value())

        with gc_pauses(pauses):
            asyncio.run(paced_producer(rate, seconds, send_many))
            producer.flush(OP_TIMEOUT_S)
            reader.join(seconds + OP_TIMEOUT_S)
        stop.set()
    finally:
        producer.close(OP_TIMEOUT_S)
        consumer.close()
    rows = keep_after_warmup(rows)
    batches = sorted(probes.batches)
    starts = [b[0] for b in batches]
    fetch_offsets = sorted(probes.fetches)
    steps: dict[str, list[float]] = {k: [] for k in
                                     ("total", "linger", "late", "produce", "fetched", "poll")}
    per_record = []
    for offset, sent, polled in rows:
        i = bisect.bisect_right(starts, offset) - 1
        if i < 0:
            continue
        base, count, created, drained, answered = batches[i]
        if offset >= base + count:
            continue
        j = bisect.bisect_right(fetch_offsets, (offset, 1 << 62)) - 1
        stored = fetch_offsets[j][1] if j >= 0 else polled
        parts = {
            "total": (polled - sent) / 1e6,
            "linger": (drained - sent) / 1e6,
            "late": (drained - created) / 1e6 - linger_ms,
            "produce": (answered - drained) / 1e6,
            "fetched": (stored - drained) / 1e6,
            "poll": (polled - stored) / 1e6,
        }
        per_record.append(parts)
        for k, v in parts.items():
            steps[k].append(v)
    p99 = percentile(steps["total"], 0.99)
    tail = [p for p in per_record if p["total"] >= p99]
    lines = [f"records {len(rows)} of {total}, batches {len(batches)}, "
             f"records/batch {statistics.mean(b[1] for b in batches):.1f}, "
             f"load {os.getloadavg()[0]:.2f}"]
    for k, values in steps.items():
        tail_mean = statistics.mean(p[k] for p in tail) if tail else float("nan")
        lines.append(f"  {k:8s} p50 {percentile(values, 0.5):6.2f}  p99 "
                     f"{percentile(values, 0.99):6.2f}  max {max(values):6.2f}  "
                     f"mean in the p99 tail {tail_mean:6.2f} ms")
    gen = [sum(1 for g, _ in pauses if g == n) for n in range(3)]
    longest = max((ms for _, ms in pauses), default=0.0)
    lines.append(f"  gc: gen0 {gen[0]}, gen1 {gen[1]}, gen2 {gen[2]}, longest {longest:.2f} ms")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--switch-interval-us", type=int, default=0,
                        help="sys.setswitchinterval for this (the clients') process; 0: keep")
    args = parser.parse_args()
    if args.switch_interval_us:
        sys.setswitchinterval(args.switch_interval_us / 1e6)
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        cluster = LocalCluster(Path(tmp), brokers=1)
        cluster.start()
        try:
            bootstrap = str(cluster.bootstrap_servers)
            topics = [f"e2e-{n}" for n in range(args.runs)]
            with AdminClient({"bootstrap.servers": bootstrap}) as admin:
                admin.create_topics([NewTopic(t, 1, 1) for t in topics], timeout=OP_TIMEOUT_S)
            for topic in topics:
                gc.collect()
                print(one_run(bootstrap, topic, args.rate, args.seconds, args.linger_ms),
                      flush=True)
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
