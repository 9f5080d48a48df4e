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
or above the p99 (what the tail is made of), plus the garbage collections, the gRPC
completions this process's I/O loops handed to each other (grpc.aio has one completion queue
per process: whichever client loop reads its wake-up runs the events and passes those of the
other loop on with ``call_soon_threadsafe``, one more thread hop) and the load.

``--broker-stages`` also times the broker (bench/broker_stages/sitecustomize.py, loaded into
the broker's process only; the broker's code is unchanged) and splits **fetched** into:

- **to broker**: drained -> the broker's Produce handler entered (the client's request, gRPC
  both sides, the broker's loop picking it up);
- **in broker**: Produce entered -> the Fetch that returned the record left its handler (the
  append, the parked fetch woken, its answer built);
- **to consumer**: that Fetch handler returned -> the answer stored by the consumer (the
  answer's serialisation and trip, the consumer's loop picking it up);

and counts the broker's event-loop delays (a 1 ms timer more than 1 ms late) and its garbage
collections during the run, and how many records found the consumer's Fetch parked at the
broker when their Produce arrived (the consumer keeps one Fetch in flight per broker: the
others wait for its next Fetch to arrive), and how long the broker had no Fetch of the
consumer's parked after each answer (the answer left the Fetch handler -> the next Fetch
entered it).

Run::

    .venv/bin/python bench/latency_breakdown.py [--rate 10000] [--seconds 5] [--runs 3] \
        [--broker-stages]
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

STAGES_DIR = Path(__file__).resolve().parent / "broker_stages"
STAGES_ENV_VAR = "FJORD_BENCH_BROKER_STAGES"  # (bench/broker_stages/sitecustomize.py's)


def _ns() -> int:
    return time.perf_counter_ns()


class Probes:
    """Timestamps from inside the clients (perf_counter_ns, the same clock as the stamps)."""

    def __init__(self) -> None:
        # (base offset, records, created ns, drained ns, answered ns)
        self.batches: list[tuple[int, int, int, int, int]] = []
        # (first offset of a stored fetch, stored ns), in fetch order
        self.fetches: list[tuple[int, int]] = []
        #: gRPC completions one client loop passed to another (see the module docstring):
        #: milliseconds from the hand-over to the other loop running it.
        self.hand_overs: list[float] = []

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

        loop_class = asyncio.BaseEventLoop
        original_threadsafe = loop_class.call_soon_threadsafe

        def threadsafe(self: Any, callback: Any, *args: Any, **kwargs: Any) -> Any:
            # grpc.aio's PollerCompletionQueue passes another loop's events on with this.
            probes = Probes.current
            if probes is None or getattr(callback, "__name__", "") != "_handle_callback_wrapper":
                return original_threadsafe(self, callback, *args, **kwargs)
            handed = _ns()

            def timed(*inner: Any) -> Any:
                probes.hand_overs.append((_ns() - handed) / 1e6)
                return callback(*inner)

            return original_threadsafe(self, timed, *args, **kwargs)

        loop_class.call_soon_threadsafe = threadsafe  # type: ignore[method-assign]


def percentile(data: list[float], q: float) -> float:
    data = sorted(data)
    return data[min(len(data) - 1, int(q * len(data)))] if data else float("nan")


# (offset, base offset of its batch, total ms, drained ns, stored ns): what --broker-stages joins
Traced = list[tuple[int, int, float, int, int]]


def one_run(
    bootstrap: str, topic: str, rate: int, seconds: float, linger_ms: int
) -> tuple[str, Traced]:
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
    traced: Traced = []
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
        traced.append((offset, base, parts["total"], drained, stored))
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
    hops = probes.hand_overs
    lines.append(f"  gRPC completions handed from one client loop to the other: {len(hops)}, "
                 f"hand-over -> run p50 {percentile(hops, 0.5):.2f} p99 "
                 f"{percentile(hops, 0.99):.2f} max {max(hops, default=0.0):.2f} ms")
    return "\n".join(lines), traced


def broker_events(prefix: Path) -> list[list[str]]:
    """The broker's recorded events (bench/broker_stages): the file that has produces."""
    for path in sorted(prefix.parent.glob(prefix.name + ".*")):
        events = [line.split() for line in path.read_text().splitlines() if line]
        if any(e[0] == "produce" for e in events):
            return events
    return []


def broker_stages(topic: str, traced: Traced, events: list[list[str]]) -> str:
    """The fetched step split at the broker's handlers (see the module docstring)."""
    produced = {int(e[2]): (int(e[3]), int(e[4])) for e in events
                if e[0] == "produce" and e[1] == topic}
    # (fetch offset, handler entered, handler returned) of the consumer's fetches with records
    fetches = sorted((int(e[2]), int(e[3]), int(e[4])) for e in events
                     if e[0] == "fetch" and e[1] == topic)
    starts = [f[0] for f in fetches]
    # One Fetch in flight per broker: when a record's Produce arrived, was a Fetch parked there?
    # (Else the record waited for the consumer's next Fetch to arrive.)
    parked_before: list[float] = []
    steps: dict[str, list[float]] = {"to broker": [], "in broker": [], "to consumer": []}
    tail: dict[str, list[float]] = {k: [] for k in steps}
    p99 = percentile([t[2] for t in traced], 0.99)
    for offset, base, total, drained, stored in traced:
        handled = produced.get(base)
        j = bisect.bisect_right(starts, offset) - 1
        if handled is None or j < 0:
            continue
        entered, answered = handled[0], fetches[j][2]
        parked_before.append((entered - fetches[j][1]) / 1e6)
        parts = {"to broker": (entered - drained) / 1e6, "in broker": (answered - entered) / 1e6,
                 "to consumer": (stored - answered) / 1e6}
        for k, v in parts.items():
            steps[k].append(v)
            if total >= p99:
                tail[k].append(v)
    if produced:
        first = min(v[0] for v in produced.values())
        last = max(v[1] for v in produced.values())
    else:
        first = last = 0
    late = [int(e[2]) / 1e6 for e in events if e[0] == "late" and first <= int(e[1]) <= last]
    collections = [int(e[2]) / 1e6 for e in events if e[0] == "gc" and first <= int(e[1]) <= last]
    lines = [f"  broker ({len(steps['to broker'])} records joined):"]
    for k, values in steps.items():
        if values:
            tail_mean = statistics.mean(tail[k]) if tail[k] else float("nan")
            lines.append(f"  {k:11s} p50 {percentile(values, 0.5):6.2f}  p99 "
                         f"{percentile(values, 0.99):6.2f}  max {max(values):6.2f}  mean in the "
                         f"p99 tail {tail_mean:6.2f} ms")
    if parked_before:
        arrived_after = sorted(-ms for ms in parked_before if ms < 0)
        lines.append(
            f"  a Fetch was parked when the Produce arrived for "
            f"{100 * (1 - len(arrived_after) / len(parked_before)):.1f}% of the records "
            f"(parked for p50 {percentile(parked_before, 0.5):.2f} ms); the others waited for "
            f"the next Fetch p50 {percentile(arrived_after, 0.5):.2f} max "
            f"{max(arrived_after, default=0.0):.2f} ms")
    # The window with no Fetch parked: a Fetch's answer left its handler -> the consumer's
    # next Fetch entered (consecutive fetches of this topic that returned records).
    gaps = [(fetches[k + 1][1] - fetches[k][2]) / 1e6 for k in range(len(fetches) - 1)
            if fetches[k + 1][0] > fetches[k][0]]
    if gaps:
        lines.append(f"  no Fetch parked between an answer and the next Fetch: p50 "
                     f"{percentile(gaps, 0.5):.2f} p99 {percentile(gaps, 0.99):.2f} max "
                     f"{max(gaps):.2f} ms ({len(gaps)} answers)")
    lines.append(f"  broker loop: {len(late)} timers > 1 ms late, longest "
                 f"{max(late, default=0.0):.2f} ms; gc > 0.1 ms: {len(collections)}, longest "
                 f"{max(collections, default=0.0):.2f} ms")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--switch-interval-us", type=int, default=0,
                        help="sys.setswitchinterval for this (the clients') process; 0: keep")
    parser.add_argument("--broker-stages", action="store_true",
                        help="also time the broker's handlers (bench/broker_stages)")
    args = parser.parse_args()
    if args.switch_interval_us:
        sys.setswitchinterval(args.switch_interval_us / 1e6)
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        prefix = Path(tmp) / "broker-stages"
        if args.broker_stages:
            # Inherited by the cluster's processes only (this one has started already).
            os.environ[STAGES_ENV_VAR] = str(prefix)
            os.environ["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(STAGES_DIR), os.environ.get("PYTHONPATH", "")) if p
            )
        cluster = LocalCluster(Path(tmp), brokers=1)
        cluster.start()
        runs: list[tuple[str, Traced]] = []
        try:
            bootstrap = str(cluster.bootstrap_servers)
            topics = [f"e2e-{n}" for n in range(args.runs)]
            with AdminClient({"bootstrap.servers": bootstrap}) as admin:
                admin.create_topics([NewTopic(t, 1, 1) for t in topics], timeout=OP_TIMEOUT_S)
            for topic in topics:
                gc.collect()
                text, traced = one_run(bootstrap, topic, args.rate, args.seconds, args.linger_ms)
                runs.append((topic, traced))
                print(text, flush=True)
        finally:
            cluster.stop()  # the broker writes its stages at exit
        if args.broker_stages:
            events = broker_events(prefix)
            for topic, traced in runs:
                print(f"{topic}:\n{broker_stages(topic, traced, events)}", flush=True)


if __name__ == "__main__":
    main()
