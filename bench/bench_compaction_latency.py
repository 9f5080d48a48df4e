"""Produce latency while the log cleaner runs, against the same broker idle: one broker
(``fjord local``-style LocalCluster), a compacted topic filled with ``--mib`` MiB of updates to
``--keys`` keys while ``min.compaction.lag.ms`` holds the cleaner back, then sequential acks=1
produces of 100-byte records to another topic, timed one by one: first with the cleaner idle,
then right after ``min.compaction.lag.ms`` is set to 0, until the broker's
``fjord_broker_cleaner_cleans_total{outcome="cleaned"}`` says the clean is over.

The clean runs in a worker thread of the broker process, so what it costs the event loop is
the GIL it holds while it decodes. Usage: .venv/bin/python bench/bench_compaction_latency.py
[--mib N] [--keys K]
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

from fjord.client import AdminClient, NewTopic, Producer
from fjord.local import LocalCluster
from fjord.testing.metrics_probe import scrape_metric

MIB = 1024 * 1024
CLEANED = 'fjord_broker_cleaner_cleans_total{outcome="cleaned"}'


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed_sends(producer: Producer, topic: str, until) -> list[float]:
    latencies = []
    while not until(len(latencies)):
        started = time.perf_counter()
        producer.send(topic, value=b"p" * 100, partition=0).result(30)
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=48)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--idle-sends", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp), brokers=1, controllers=1, coordinators=0,
                               cluster_id="bench-compaction", unsafe_etcd_no_fsync=True,
                               config={"log.cleaner.backoff.ms": "100"})
        cluster.start()
        try:
            bootstrap = cluster.bootstrap_servers
            metrics = cluster.metrics_address("broker", 0)
            with AdminClient({"bootstrap.servers": bootstrap}) as admin:
                admin.create_topics([
                    NewTopic("table", 1, 1, {"cleanup.policy": "compact",
                                             "segment.bytes": str(4 * MIB),
                                             "min.compaction.lag.ms": "3600000"}),
                    NewTopic("probe", 1, 1, {}),
                ])
                value = os.urandom(100)
                with Producer({"bootstrap.servers": bootstrap, "acks": "1",
                               "linger.ms": 5}) as producer:
                    sent, i = 0, 0
                    while sent < args.mib * MIB:
                        producer.send("table", key=b"key-%06d" % (i % args.keys), value=value,
                                      partition=0)
                        sent += 120
                        i += 1
                    producer.flush(120)
                with Producer({"bootstrap.servers": bootstrap, "acks": "1",
                               "linger.ms": 0}) as producer:
                    idle = timed_sends(producer, "probe", lambda n: n >= args.idle_sends)
                    before = scrape_metric(metrics, CLEANED)
                    admin.alter_configs({"table": {"min.compaction.lag.ms": "0"}})
                    started = time.perf_counter()
                    during = timed_sends(
                        producer, "probe",
                        lambda n: n % 20 == 0 and scrape_metric(metrics, CLEANED) > before)
                    clean_s = time.perf_counter() - started
        finally:
            cluster.stop()
    print(f"machine: {platform.node()} {cpu_model()} {os.cpu_count()} cpus, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"compacted topic: {args.mib} MiB of updates to {args.keys} keys, 4 MiB segments; "
          f"clean observed within {clean_s:.1f} s")
    for name, values in (("idle", idle), ("during the clean", during)):
        print(f"  {name}: {len(values)} sends, p50 {statistics.median(values):.2f} ms, "
              f"p99 {percentile(values, 0.99):.2f} ms, max {max(values):.2f} ms")


if __name__ == "__main__":
    main()
