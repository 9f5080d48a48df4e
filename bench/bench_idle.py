"""Idle cost: CPU each broker burns with N partitions x RF 3 and nothing written (issue 18).

One LocalCluster (3 brokers, 1 controller, no coordinator, etcd without fsync). Topics of
``--step`` partitions each (replication factor 3) are created until the cluster holds each count
of ``--counts`` in turn; after each count is reached the run waits until every broker reports
every partition with a leader and the brokers lead them all (every partition opened),
lets ``--settle`` seconds pass, then samples each process's CPU
time (utime + stime from /proc/<pid>/stat) over ``--window`` seconds. The figure is the share of
one core each broker used in that window (100% = one core busy), with the controller beside it.

Run::

    .venv/bin/python bench/bench_idle.py [--counts 0,100,1000,4100] [--window 20]

The script prints a Markdown table; the figures with the machine's load go in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from fjord.client import AdminClient, NewTopic
from fjord.local.cluster import LocalCluster
from fjord.testing.metrics_probe import scrape_metric
from fjord.testing.waiting import wait_for

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def sample(pids: dict[str, int], window_s: float) -> dict[str, float]:
    """Share of one core each process used over ``window_s`` seconds."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    start = time.monotonic()
    time.sleep(window_s)  # the measurement window itself, not a wait for a condition
    elapsed = time.monotonic() - start
    return {name: (cpu_seconds(pid) - before[name]) / elapsed for name, pid in pids.items()}


def all_open(cluster: LocalCluster, topics: list[str], count: int) -> bool:
    """Every broker knows every partition of ``topics`` with a leader, and the brokers have
    opened all of them (the partitions they lead add up to ``count``: each broker sets that
    gauge once a metadata change is fully applied, its followed partitions opened too)."""
    led = sum(scrape_metric(cluster.metrics_address("broker", i), "fjord_broker_partitions_led")
              for i in cluster.broker_addresses)
    if led < count:
        return False
    for broker_id in cluster.broker_addresses:
        response = cluster.broker_metadata(broker_id)
        if response is None:
            return False
        known = {t.name: t for t in response.topics if t.error.code == 0}
        for name in topics:
            topic = known.get(name)
            if topic is None or any(p.leader < 0 for p in topic.partitions):
                return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="0,100,1000,4100")
    parser.add_argument("--step", type=int, default=100, help="partitions per topic")
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--hold", type=float, default=0.0,
                        help="keep the cluster up this many seconds after the last sample "
                        "(to profile it, e.g. with py-spy)")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    config = {"max.broker.partitions": str(max(counts) + 100)}
    rows = []
    with tempfile.TemporaryDirectory(prefix="fjord-bench-idle-") as tmp:
        cluster = LocalCluster(Path(tmp), brokers=3, controllers=1, coordinators=0,
                               unsafe_etcd_no_fsync=True, config=config)
        with cluster, AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
            pids = {f"broker {i}": cluster.process("broker", i).pid
                    for i in cluster.broker_addresses}
            pids.update({f"controller {i}": cluster.process("controller", i).pid
                         for i in cluster.controller_addresses})
            topics: list[str] = []
            have = 0
            for count in counts:
                while have < count:
                    size = min(args.step, count - have)
                    name = f"idle-{len(topics)}"
                    admin.create_topics([NewTopic(name, size, 3)])
                    topics.append(name)
                    have += size
                wait_for(lambda n=count: all_open(cluster, topics, n),
                         f"{count} partitions with leaders on every broker",
                         timeout=600, interval=1.0)
                time.sleep(args.settle)  # let creation work (opens, first fetches) finish
                load = os.getloadavg()[0]
                shares = sample(pids, args.window)
                rows.append((count, shares, load))
                print(count, {k: f"{v:.1%}" for k, v in shares.items()}, f"load {load:.1f}",
                      flush=True)
            if args.hold:
                print("holding; pids:", pids, flush=True)
                time.sleep(args.hold)  # a window for profiling, not a wait for a condition
    names = list(rows[0][1])
    print("| partitions x RF 3 | " + " | ".join(names) + " | load (1 min) |")
    print("|---:|" + "---:|" * len(names) + "---:|")
    for count, shares, load in rows:
        print(f"| {count:,} | " + " | ".join(f"{shares[n]:.1%}" for n in names)
              + f" | {load:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
