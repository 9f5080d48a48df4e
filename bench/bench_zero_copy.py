"""Zero copy on the Kafka listener: confluent-kafka consumer MB/s with and without ``sendfile``.

Two one-broker LocalClusters run side by side on loopback: one started from ``--before`` (a
checkout of the services before zero copy: records copied through Python into each Fetch
frame), one from this checkout (records of verified segments sent from the segment file with
``loop.sendfile``). Each gets the same topic (1 partition) written once by fjord.client: values
of ``--big`` bytes (1 MiB) and of 100 bytes. Rounds alternate the two brokers; a round is one
confluent-kafka consumer reading the whole topic from offset 0 (bench_kafka.ck_consume: assign,
consume() until every record is read, fetch.queue.backoff.ms 10). The figures are the median
MB/s of the values read, and the broker's CPU time per MB served (utime + stime of its process
over the round, /proc/<pid>/stat): what zero copy saves is the broker's, while the consumer's
own Python loop bounds MB/s.

Run::

    .venv/bin/python bench/bench_zero_copy.py --before /path/to/old/services [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kafka import ck_consume

from fjord.client import AdminClient, NewTopic, Producer
from fjord.local.cluster import LocalCluster

WAIT_S = 300.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def write(bootstrap: str, topic: str, records: int, size: int) -> None:
    value = os.urandom(size)
    config = {"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5,
              "max.request.size": max(1 << 20, size + 4096),
              "batch.size": max(16384, min(size + 1024, 1 << 20))}
    with Producer(config) as producer:
        for _ in range(records):
            producer.send(topic, value)
        producer.flush(WAIT_S)


def start(path: str | None, data: Path) -> LocalCluster:
    """A one-broker cluster whose processes import the services at ``path``."""
    saved = os.environ.get("PYTHONPATH")
    if path is not None:
        os.environ["PYTHONPATH"] = path
    try:
        cluster = LocalCluster(data, brokers=1, controllers=1, coordinators=0,
                               unsafe_etcd_no_fsync=True,
                               config={"message.max.bytes": str(4 << 20)})
        cluster.start()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    return cluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="services/ of the checkout to compare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--big", type=int, default=1 << 20)
    parser.add_argument("--big-records", type=int, default=100)
    parser.add_argument("--small-records", type=int, default=400_000)
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent.parent / "services")
    load_start = os.getloadavg()[0]
    rates: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="fjord-bench-zc-") as tmp:
        clusters = {"before (copy)": start(args.before, Path(tmp) / "a"),
                    "after (sendfile)": start(here, Path(tmp) / "b")}
        try:
            workloads = {"1 MiB values": (args.big_records, args.big),
                         "100-byte values": (args.small_records, 100)}
            for cluster in clusters.values():
                with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
                    for name in workloads:
                        topic = name.split()[0].replace(".", "")
                        admin.create_topics([NewTopic(f"zc-{topic}", 1, 1, {})])
                for name, (records, size) in workloads.items():
                    topic = name.split()[0].replace(".", "")
                    write(cluster.bootstrap_servers, f"zc-{topic}", records, size)
            for round_no in range(args.rounds):
                for name, (records, size) in workloads.items():
                    topic = name.split()[0].replace(".", "")
                    for label, cluster in clusters.items():
                        pid = cluster.process("broker", 0).pid
                        cpu_before = cpu_seconds(pid)
                        rate = ck_consume(cluster.kafka_bootstrap_servers, f"zc-{topic}", 1,
                                          records)
                        cpu_ms_per_mb = (cpu_seconds(pid) - cpu_before) * 1e3 / (
                            records * size / 1e6)
                        mbs = rate * size / 1e6
                        rates.setdefault((name, label), []).append(mbs)
                        cpu.setdefault((name, label), []).append(cpu_ms_per_mb)
                        print(f"round {round_no + 1} {name} {label}: {mbs:,.1f} MB/s "
                              f"({rate:,.0f} rec/s), broker {cpu_ms_per_mb:.2f} CPU ms/MB",
                              flush=True)
        finally:
            for cluster in clusters.values():
                cluster.stop()
    load_end = os.getloadavg()[0]
    print(f"\nload average (1 min) {load_start:.1f} at the start, {load_end:.1f} at the end")
    print("| values | before (copy) MB/s | after (sendfile) MB/s | after/before | "
          "broker CPU ms per MB before / after | rounds MB/s before/after |")
    print("|---|---:|---:|---:|---:|---|")
    for name in ("1 MiB values", "100-byte values"):
        before = rates[(name, "before (copy)")]
        after = rates[(name, "after (sendfile)")]
        ratio = statistics.median(a / b for a, b in zip(after, before, strict=True))
        cpu_b = statistics.median(cpu[(name, "before (copy)")])
        cpu_a = statistics.median(cpu[(name, "after (sendfile)")])
        pairs = ", ".join(f"{b:,.0f}/{a:,.0f}" for b, a in zip(before, after, strict=True))
        print(f"| {name} | {statistics.median(before):,.1f} | {statistics.median(after):,.1f} | "
              f"{ratio:.2f}x | {cpu_b:.2f} / {cpu_a:.2f} | {pairs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
