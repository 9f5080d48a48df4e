"""What the batches of an acks=all round look like, and what they cost the brokers (issue 18).

Starts the cluster of ``bench/bench_replication.py`` (3 brokers, 2 controllers, loopback;
topics ``rf1`` and ``rf3`` with ``--partitions`` partitions, ``rf3`` with
``min.insync.replicas=2``) and runs alternating rounds of ``--records`` 100-byte records through
a fresh ``fjord.client.Producer`` each (Kafka's defaults: acks=1 for ``rf1``; acks=all and
idempotent for ``rf3``): ``rf1``; ``rf3``; and, unless ``--no-old-growth``, ``rf3`` again with
the producer's growth rule of before 9499030 (a batch grows only when the partition's window
is full of unanswered batches, not counting the batches queued to leave: the script swaps the
accumulator's ``blocked_behind_window`` for ``window_full`` on that producer), so that both
rules meet the same machine load. Per round: records/s, wall time, the CPU seconds of the
client process and of the three brokers together (``/proc``), the Produce requests and how
many of their batches were at most ``batch.size`` (a normal batch: it holds a window slot for a
whole round trip), and each broker's server-side Produce and Fetch calls (Prometheus).

Run::

    .venv/bin/python bench/replication_batches.py [--records 300000] [--rounds 5]
        [--partitions 3] [--no-old-growth]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_replication import create_rf1_rf3, replication_cluster
from profile_replication import cpu_seconds, own_cpu_seconds

import fjord.client.producer as producer_module
from fjord.cli.perf_cmd import run_produce_perf
from fjord.client import Producer

BATCH_SIZE = 16_384  # the producer's default batch.size
_METHOD = re.compile(r'method="fjord\.v1\.Broker/(Produce|Fetch)"')

#: Payload sizes of every batch sent, one list per Produce request (filled by the wrapper).
_requests: list[list[int]] = []
_build_produce_request = producer_module.build_produce_request


def _recording_build(batches: Any, *args: Any, **kwargs: Any) -> Any:
    batches = list(batches)
    request = _build_produce_request(batches, *args, **kwargs)
    _requests.append([len(b.close()) for b in batches])  # built already: the same bytes
    return request


producer_module.build_produce_request = _recording_build  # type: ignore[assignment]


def rpc_counts(metrics_address: str) -> dict[str, float]:
    """Server-side Produce and Fetch calls handled so far by one broker."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    out: dict[str, float] = {"Produce": 0.0, "Fetch": 0.0}
    for line in text.splitlines():
        if line.startswith("fjord_rpc_server_requests_total"):
            found = _METHOD.search(line)
            if found:
                out[found.group(1)] += float(line.rsplit(" ", 1)[1])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--no-old-growth", action="store_true",
                        help="only rf1 and rf3 with the current growth rule")
    args = parser.parse_args()
    variants = [("rf1", "1", "acks=1 RF 1"), ("rf3", "all", "acks=all RF 3")]
    if not args.no_old_growth:
        variants.append(("rf3", "all", "acks=all RF 3, old growth rule"))
    rates: dict[str, list[float]] = {label: [] for _, _, label in variants}
    broker_cpu: dict[str, list[float]] = {label: [] for _, _, label in variants}
    with replication_cluster("fjord-repl-batches-") as cluster:
        bootstrap = cluster.bootstrap_servers
        create_rf1_rf3(cluster, args.partitions)
        brokers = [p for p in cluster.processes() if p.role == "broker"]
        for round_no in range(args.rounds):
            for topic, acks, label in variants:
                producer = Producer({"bootstrap.servers": bootstrap, "acks": acks,
                                     "enable.idempotence": acks == "all"})
                if label.endswith("old growth rule"):
                    acc = producer._accumulator
                    acc.blocked_behind_window = acc.window_full  # type: ignore[method-assign]
                producer.partitions_for(topic)
                _requests.clear()
                calls_before = [rpc_counts(b.metrics_address or "") for b in brokers]
                cpu_before = sum(cpu_seconds(b.pid) for b in brokers)
                own_before = own_cpu_seconds()
                started = time.perf_counter()
                try:
                    report = run_produce_perf(producer, topic, args.records, 100, -1)
                finally:
                    producer.close()
                wall = time.perf_counter() - started
                spent = sum(cpu_seconds(b.pid) for b in brokers) - cpu_before
                calls = [
                    {m: after[m] - before[m] for m in after}
                    for before, after in zip(
                        calls_before, [rpc_counts(b.metrics_address or "") for b in brokers],
                        strict=True,
                    )
                ]
                sizes = [size for request in _requests for size in request]
                small = sum(1 for size in sizes if size <= BATCH_SIZE + 200)
                rates[label].append(report["records_per_sec"])
                broker_cpu[label].append(spent)
                print(
                    f"round {round_no + 1} {label}: {report['records_per_sec']:,.0f} rec/s, "
                    f"wall {wall:.2f} s, CPU s: client {own_cpu_seconds() - own_before:.2f}, "
                    f"brokers {spent:.2f}; {len(_requests)} Produce requests, {len(sizes)} "
                    f"batches, {small} of them <= batch.size; brokers served Produce "
                    + "/".join(f"{c['Produce']:.0f}" for c in calls) + ", Fetch "
                    + "/".join(f"{c['Fetch']:.0f}" for c in calls)
                    + f"; load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    base = statistics.median(rates["acks=1 RF 1"])
    for label in rates:
        print(f"median {label}: {statistics.median(rates[label]):,.0f} rec/s "
              f"({statistics.median(rates[label]) / base:.0%} of acks=1 RF 1), brokers' CPU "
              f"{statistics.median(broker_cpu[label]):.2f} s per round")
    return 0


if __name__ == "__main__":
    sys.exit(main())
