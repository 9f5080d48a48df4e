"""Replication benchmark: what acks=all with replication factor 3 costs, and how long writes stop
when a leader dies.

One LocalCluster (3 brokers, 2 controllers, every process on loopback on this machine) runs
both measurements:

- **Throughput and latency.** Two topics with ``--partitions`` partitions each (default 3, so
  every broker leads one): ``rf1`` (replication factor 1) written with ``acks=1`` and ``rf3``
  (replication factor 3, ``min.insync.replicas=2``) written with ``acks=all`` and the
  idempotent producer (Kafka's default for acks=all; acks=1 cannot be idempotent). Each round sends
  ``--records`` records of ``--record-size`` bytes (no key) as fast as the producer takes them,
  then flushes; records/s and latency from ``send()`` to acknowledgement come from the same
  code as ``fjord perf produce`` (:func:`fjord.cli.perf_cmd.run_produce_perf`), after the
  producer has fetched the topic's metadata (since 2026-11-26 02:45 UTC). The two
  configurations alternate round by round, so both see the same machine load; the table gives
  the median round. Target (issue 18): acks=all/RF 3 keeps at least 75% of the acks=1/RF 1
  records/s.
- **Fail-over.** A topic ``failover`` with one partition, replication factor 3,
  ``min.insync.replicas=2``; a producer (``acks=all``) paced at ``--failover-rate`` records/s.
  The partition's leader is killed with SIGKILL; the figure is the time from the kill until
  the first acknowledgement of a record sent after the kill. Then the broker is restarted and
  the run waits until it is back in the ISR before the next kill (``--failovers`` times).
  Target: the broker lease TTL + 1 s (the controller learns of the death when the lease expires).

Run::

    .venv/bin/python bench/bench_replication.py [--records 100000] [--rounds 3]
        [--failovers 3] [--write-results]

``--write-results`` refreshes this script's block inside the "replication" section of
bench/RESULTS.md (between its markers), leaving anything else in that section alone.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_file import RESULTS, cpu_model

from fjord.cli.perf_cmd import run_produce_perf
from fjord.client import AdminClient, NewTopic, Producer
from fjord.local.cluster import LocalCluster
from fjord.testing.chaos_cluster import partition_states
from fjord.testing.waiting import seconds_until

SECTION = "## replication"
BLOCK_START = "<!-- bench_replication.py: start -->"
BLOCK_END = "<!-- bench_replication.py: end -->"
HEAL_TIMEOUT_S = 60.0  # bound on a restarted broker rejoining every ISR
FAILOVER_TIMEOUT_S = 60.0  # bound on waiting for writes to resume after a kill
TARGET_RATIO = 0.75  # acks=all RF 3 records/s >= this x acks=1 RF 1 records/s
TARGET_FAILOVER_SLACK_S = 1.0  # writes resume within the broker lease TTL + this


@dataclass
class ProduceFigures:
    label: str
    rates: list[float]
    p99s: list[float]
    p50s: list[float]

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)

    @property
    def p99(self) -> float:
        return statistics.median(self.p99s)

    @property
    def p50(self) -> float:
        return statistics.median(self.p50s)


def create_topic(bootstrap: str, name: str, partitions: int, rf: int, config: dict[str, str]
                 ) -> None:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(name, partitions, rf, config)])


def fully_replicated(cluster: LocalCluster, topic: str, partitions: int) -> bool:
    for broker_id in cluster.broker_addresses:
        states = partition_states(cluster, topic, [broker_id])
        if states is None or len(states) != partitions:
            return False
        if any(s.leader < 0 or set(s.isr) != set(s.replicas) for s in states.values()):
            return False
    return True


def wait_replicated(cluster: LocalCluster, topic: str, partitions: int) -> float:
    took = seconds_until(lambda: fully_replicated(cluster, topic, partitions), HEAL_TIMEOUT_S)
    if took is None:
        raise RuntimeError(f"{topic}: not fully replicated within {HEAL_TIMEOUT_S} s")
    return took


@contextmanager
def replication_cluster(prefix: str) -> Iterator[LocalCluster]:
    """The cluster of the replication benchmarks (this one, profile_replication.py,
    replication_batches.py): 3 brokers and 2 controllers on loopback, etcd without fsync, in a
    temporary directory named ``prefix...`` that goes with it."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp, LocalCluster(
        Path(tmp), brokers=3, unsafe_etcd_no_fsync=True
    ) as cluster:
        yield cluster


def create_rf1_rf3(cluster: LocalCluster, partitions: int) -> None:
    """Topics ``rf1`` (replication factor 1) and ``rf3`` (3, ``min.insync.replicas=2``) with
    ``partitions`` partitions each; returns once every replica of both is in its ISR."""
    bootstrap = cluster.bootstrap_servers
    create_topic(bootstrap, "rf1", partitions, 1, {})
    create_topic(bootstrap, "rf3", partitions, 3, {"min.insync.replicas": "2"})
    wait_replicated(cluster, "rf1", partitions)
    wait_replicated(cluster, "rf3", partitions)


def bench_throughput(cluster: LocalCluster, args: argparse.Namespace) -> list[ProduceFigures]:
    bootstrap = cluster.bootstrap_servers
    create_rf1_rf3(cluster, args.partitions)
    runs = {
        "rf1": ProduceFigures("acks=1, replication factor 1", [], [], []),
        "rf3": ProduceFigures("acks=all (idempotent), replication factor 3, "
                              "min.insync.replicas=2", [], [], []),
    }
    for round_no in range(args.rounds):
        for topic, acks in (("rf1", "1"), ("rf3", "all")):
            # Kafka's producer defaults: idempotence is on with acks=all and off with acks=1.
            producer = Producer({"bootstrap.servers": bootstrap, "acks": acks,
                                 "enable.idempotence": acks == "all"})
            try:
                # The topic's metadata first (as bench/profile_replication.py): the rounds
                # measure records/s, not the first metadata request, which weighed up to a
                # tenth of a 50,000-record round. InitProducerId stays inside (idempotence's).
                producer.partitions_for(topic)
                report = run_produce_perf(producer, topic, args.records, args.record_size, -1)
            finally:
                producer.close()
            figures = runs[topic]
            figures.rates.append(report["records_per_sec"])
            figures.p99s.append(report["latency_ms"]["p99"])
            figures.p50s.append(report["latency_ms"]["p50"])
            print(f"round {round_no + 1} {topic} acks={acks}: {report['records_per_sec']:,.0f} "
                  f"rec/s, p50 {report['latency_ms']['p50']} ms, p99 "
                  f"{report['latency_ms']['p99']} ms", flush=True)
    return list(runs.values())


def bench_failover(cluster: LocalCluster, args: argparse.Namespace) -> list[float]:
    """Seconds from each leader SIGKILL to the first acknowledgement of a record sent after it."""
    bootstrap = cluster.bootstrap_servers
    topic = "failover"
    create_topic(bootstrap, topic, 1, 3, {"min.insync.replicas": "2"})
    wait_replicated(cluster, topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1,
                         "request.timeout.ms": 5000, "delivery.timeout.ms": 120000})
    lock = threading.Lock()
    acks: list[tuple[float, float]] = []  # (sent at, acknowledged at), perf_counter seconds
    errors: list[BaseException] = []
    stop = threading.Event()

    def on_done(sent_at: float, future: Any) -> None:
        error = future.exception()
        with lock:
            if error is not None:
                errors.append(error)
            else:
                acks.append((sent_at, time.perf_counter()))

    def write() -> None:
        interval = 1.0 / args.failover_rate
        due = time.perf_counter()
        i = 0
        while not stop.is_set():
            pause = due - time.perf_counter()
            if pause > 0:
                stop.wait(pause)
                continue
            due = max(due, time.perf_counter() - 1.0) + interval
            sent_at = time.perf_counter()
            future = producer.send(topic, value=b"%d" % i)
            i += 1
            future.add_done_callback(lambda f, s=sent_at: on_done(s, f))

    writer = threading.Thread(target=write, name="failover-writer", daemon=True)
    writer.start()
    gaps: list[float] = []
    try:
        for n in range(args.failovers):
            seconds_until(lambda: bool(acks), 30.0)  # writes flow before the kill
            states = partition_states(cluster, topic, cluster.broker_addresses) or {}
            leader = states[0].leader if 0 in states else -1
            if leader < 0:
                raise RuntimeError(f"failover topic has no leader: {states}")
            killed_at = time.perf_counter()
            cluster.kill("broker", leader, signal.SIGKILL)

            def resumed(k: float = killed_at) -> bool:
                with lock:
                    return any(sent >= k for sent, _ in acks[-2000:])

            if seconds_until(resumed, FAILOVER_TIMEOUT_S) is None:
                raise RuntimeError(f"writes did not resume within {FAILOVER_TIMEOUT_S} s")
            with lock:
                first = min(done for sent, done in acks if sent >= killed_at)
            gaps.append(first - killed_at)
            print(f"fail-over {n + 1}: leader {leader} killed, writes resumed after "
                  f"{gaps[-1]:.2f} s", flush=True)
            cluster.start_broker(leader)
            healed = wait_replicated(cluster, topic, 1)
            print(f"  broker {leader} back in the ISR {healed:.1f} s after its restart",
                  flush=True)
    finally:
        stop.set()
        writer.join(10)
        producer.close(timeout=30)
    if errors:
        print(f"{len(errors)} records failed during the fail-overs, first: {errors[0]!r}")
    return gaps




def render(args: argparse.Namespace, throughput: list[ProduceFigures], gaps: list[float],
           lease_ttl_s: int, load: tuple[float, float]) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = (f".venv/bin/python bench/bench_replication.py --records {args.records} "
               f"--rounds {args.rounds} --failovers {args.failovers} --write-results")
    lines = [
        BLOCK_START,
        f"Command: `{command}`, {now}; machine: {os.cpu_count()} CPUs ({cpu_model()}), Python "
        f"{platform.python_version()}, {platform.system()} {platform.release()}; load average "
        f"(1 min) {load[0]:.1f} at the start, {load[1]:.1f} at the end (the machine is shared "
        "with other work). One LocalCluster: 3 brokers, 2 controllers, all on loopback; "
        f"{args.partitions} partitions per topic, {args.record_size}-byte values, no keys, "
        "producer defaults otherwise (linger.ms 5, batch.size 16384, max.in.flight 5, "
        "blocked.batch.size 524288). Median "
        f"of {args.rounds} alternating rounds of {args.records:,} records. Method: the script's "
        "docstring.",
        "",
        "| configuration | records/s | p50 ms | p99 ms | rounds (records/s) |",
        "|---|---:|---:|---:|---|",
    ]
    for f in throughput:
        lines.append(f"| {f.label} | {f.rate:,.0f} | {f.p50:.1f} | {f.p99:.1f} | "
                     + ", ".join(f"{r:,.0f}" for r in f.rates) + " |")
    lines.append("")
    rf1, rf3 = throughput
    ratio = rf3.rate / rf1.rate if rf1.rate else 0.0
    verdict = "met" if ratio >= TARGET_RATIO else "MISSED"
    lines.append(f"- acks=all RF 3 / acks=1 RF 1: {ratio:.0%} of the records/s (target >= "
                 f"{TARGET_RATIO:.0%}): {verdict}")
    target = lease_ttl_s + TARGET_FAILOVER_SLACK_S
    if gaps:
        worst = max(gaps)
        verdict = "met" if worst <= target else "MISSED"
        lines.append(
            "- leader SIGKILL -> first acknowledged write sent after it: "
            + ", ".join(f"{g:.2f} s" for g in gaps)
            + f" (median {statistics.median(gaps):.2f} s; target <= broker lease TTL "
            f"{lease_ttl_s} s + {TARGET_FAILOVER_SLACK_S:.0f} s = {target:.0f} s): {verdict}"
        )
    lines.append(BLOCK_END)
    return "\n".join(lines)


def write_block(block: str, path: Path = RESULTS) -> None:
    """Put ``block`` in the replication section: replace our previous block (between the
    markers) or append it to the section, creating the section if needed. Other lines of the
    section (other engineers' figures) are kept."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    ours = re.compile(re.escape(BLOCK_START) + r".*?" + re.escape(BLOCK_END), re.S)
    if ours.search(text):
        text = ours.sub(lambda _m: block, text)
    else:
        section = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
        match = section.search(text)
        if match:
            body = match.group(0).rstrip("\n")
            text = text[: match.start()] + body + "\n\n" + block + "\n\n" + text[match.end():]
        else:
            text = text.rstrip("\n") + f"\n\n{SECTION}\n\n{block}\n"
    path.write_text(text.rstrip("\n") + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--failover-rate", type=int, default=500, help="records/s")
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    with replication_cluster("fjord-bench-repl-") as cluster:
        throughput = bench_throughput(cluster, args)
        gaps = bench_failover(cluster, args) if args.failovers > 0 else []
        lease_ttl_s = cluster.broker_lease_ttl_s
    block = render(args, throughput, gaps, lease_ttl_s, (load_start, os.getloadavg()[0]))
    print(block)
    if args.write_results:
        write_block(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
