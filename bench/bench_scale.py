"""How a broker's costs grow with its partitions (issue 18's scale curve).

One LocalCluster (1 broker, 1 controller, no coordinator, etcd without fsync) per step; for
each count of ``--counts`` a fresh cluster gets one topic of that many partitions (RF 1), and:

- **create -> served**: from the CreateTopics call until the broker has opened every partition
  (its ``fjord_broker_partitions_led`` gauge reaches the count: set once a metadata change is
  fully applied) and its Metadata shows them all with a leader;
- **memory**: the broker's resident set (VmRSS) before the topic and once it is served; the
  difference divided by the count;
- **open files**: entries in /proc/<broker>/fd once served (before: in brackets);
- **produce**: ``--records`` 100-byte records with acks=1 spread round-robin over every
  partition by fjord.client's Producer (explicit partition, linger.ms 5, ``buffer.memory``
  the default unless ``--buffer-memory``), records/s. buffer.memory bounds the batches
  open at once (docs/clients.md: batch.size each, 2 KiB each once it is 3/4 full with
  more than 1,024 partitions open);
- **restart**: SIGTERM, start again, until every partition is led and served again
  (the broker answers Metadata with every partition led, its gauge says all are open);
- **recovery**: SIGKILL (no clean-shutdown marker: every partition's log is recovered past its
  recovery point), start again, same end condition.

With ``--brokers N`` (default 1) the cluster has N brokers and the topic's partitions (RF 1)
are spread over them; memory and open files are then broker 0's (about 1/N of the
partitions), restart and recovery are broker 0's (served again = every partition led, broker 0
reporting its own as open), and create -> served waits for the brokers' gauges to add up to the
count.

Run::

    .venv/bin/python bench/bench_scale.py [--counts 1,100,1000,4000] [--records 100000]
        [--brokers 1]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from fjord.client import AdminClient, NewTopic, Producer
from fjord.local.cluster import LocalCluster
from fjord.testing.metrics_probe import scrape_metric
from fjord.testing.waiting import wait_for

WAIT_S = 600.0
TOPIC = "scale"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def served(cluster: LocalCluster, topic: str, count: int, brokers: int = 1) -> bool:
    """Every partition led (the metadata of broker 0 says so) and opened by its leader (the
    brokers' ``fjord_broker_partitions_led`` gauges add up to the count)."""
    led = 0.0
    for broker in range(brokers):
        try:
            led += scrape_metric(cluster.metrics_address("broker", broker),
                                 "fjord_broker_partitions_led")
        except OSError:
            return False
    if led < count:
        return False
    response = cluster.broker_metadata(0)
    if response is None:
        return False
    for t in response.topics:
        if t.name == topic:
            return len(t.partitions) == count and all(
                0 <= p.leader < brokers for p in t.partitions
            )
    return False


def produce_spread(
    bootstrap: str, topic: str, count: int, records: int, buffer_memory: int = 0
) -> float:
    value = b"x" * 100
    config: dict[str, object] = {"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5}
    if buffer_memory:
        config["buffer.memory"] = buffer_memory
    with Producer(config) as producer:
        producer.partitions_for(topic)
        start = time.perf_counter()
        for i in range(records):
            producer.send(topic, value, partition=i % count)
        producer.flush(WAIT_S)
        return records / (time.perf_counter() - start)


def restart(cluster: LocalCluster, topic: str, count: int, sig: int, brokers: int) -> float:
    stopping = time.monotonic()
    process = cluster.process("broker", 0)
    process.send_signal(sig)
    process.wait(WAIT_S)  # a clean stop of thousands of partitions may take a while
    cluster.kill("broker", 0, sig)  # already gone: only records it
    stopped = time.monotonic() - stopping
    print(f"  broker stopped ({signal.Signals(sig).name}) in {stopped:.2f} s", flush=True)
    start = time.monotonic()
    cluster.start_broker(0, wait=False)  # its own wait gives up after 30 s; ours measures
    wait_for(lambda: served(cluster, topic, count, brokers), f"{count} partitions served again",
             WAIT_S, interval=0.1)
    took = time.monotonic() - start
    print(f"  served again {took:.2f} s after the start", flush=True)
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="1,100,1000,4000")
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--buffer-memory", type=int, default=0,
                        help="the producer's buffer.memory (0: the default, 32 MiB)")
    args = parser.parse_args()
    brokers = args.brokers
    rows = []
    for count in (int(c) for c in args.counts.split(",")):
        with tempfile.TemporaryDirectory(prefix="fjord-bench-scale-") as tmp:
            cluster = LocalCluster(Path(tmp), brokers=brokers, controllers=1, coordinators=0,
                                   unsafe_etcd_no_fsync=True,
                                   config={"max.broker.partitions": str(max(count, 1000)),
                                           # one CreateTopics of `count` partitions
                                           "max.records.per.user.op": str(
                                               max(count + 100, 10_000))})
            with cluster:
                pid = cluster.process("broker", 0).pid
                rss_before, files_before = rss_mib(pid), open_files(pid)
                topic = TOPIC
                with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
                    start = time.monotonic()
                    admin.create_topics([NewTopic(topic, count, 1, {})])
                    wait_for(lambda c=cluster, n=count: served(c, TOPIC, n, brokers),
                             "partitions served", WAIT_S, interval=0.1)
                    create_s = time.monotonic() - start
                print(f"  {count} partitions: create -> served {create_s:.2f} s", flush=True)
                rss_after, files_after = rss_mib(pid), open_files(pid)
                rate = produce_spread(cluster.bootstrap_servers, topic, count, args.records,
                                      args.buffer_memory)
                load = os.getloadavg()[0]
                print(f"  produce spread {rate:,.0f} rec/s (load {load:.1f})", flush=True)
                restart_s = restart(cluster, topic, count, signal.SIGTERM, brokers)
                recovery_s = restart(cluster, topic, count, signal.SIGKILL, brokers)
                pid = cluster.process("broker", 0).pid
                files_restarted = open_files(pid)
            row = (count, create_s, rss_before, rss_after, files_before, files_after, rate,
                   restart_s, recovery_s, files_restarted, load)
            rows.append(row)
            print(row, flush=True)
    print("| partitions | create -> served s | RSS MiB before -> after | KiB per partition | "
          "open files before -> after (after restart) | produce rec/s spread | restart s | "
          "recovery after SIGKILL s | load (1 min) |")
    print("|---:|---:|---|---:|---|---:|---:|---:|---:|")
    for (count, create_s, rb, ra, fb, fa, rate, rs, rec, fr, load) in rows:
        per = (ra - rb) * 1024 / count
        print(f"| {count:,} | {create_s:.2f} | {rb:.0f} -> {ra:.0f} | {per:,.0f} | {fb} -> {fa} "
              f"({fr}) | {rate:,.0f} | {rs:.2f} | {rec:.2f} | {load:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
