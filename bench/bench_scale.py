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
  recovery point), start again, same end condition. With ``--kill-under-writes`` a producer
  keeps writing (spread over every partition) while the broker is killed, so the active
  segments hold unflushed batches past their recovery points;
- **idle CPU** (``--idle-s`` seconds, 0: skipped): once served and nothing is written, each
  broker's CPU time (utime + stime) over that window, in % of one core;
- **memory per broker**: every broker's RSS once served;
- **lease lapses**: per broker, how often it lost its etcd lease over the whole step (its log's
  "lost its etcd lease" lines: each one fenced it, re-registered it and moved its
  leaderships), and how often and for how long at most its event loop went more than a lease
  refresh interval without progress (the keep-alive thread's "made no progress for up to"
  lines; none before the keep-alive ran in a thread).

With ``--replication-factor R`` (default 1) the topic has R replicas per partition; "served"
then also needs every partition's ISR to hold all its replicas (as broker 0's Metadata says),
so a restarted broker counts as recovered once it is back in every ISR.

With ``--brokers N`` (default 1) the cluster has N brokers and the topic's partitions (RF 1)
are spread over them; memory and open files are then broker 0's (about 1/N of the
partitions), restart and recovery are broker 0's (served again = every partition led, broker 0
reporting its own as open), and create -> served waits for the brokers' gauges to add up to the
count.

Run::

    .venv/bin/python bench/bench_scale.py [--counts 1,100,1000,4000] [--records 100000]
        [--brokers 1] [--replication-factor 1] [--idle-s 0] [--kill-under-writes]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
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


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu_percent(pids: list[int], seconds: float) -> list[float]:
    """Each process's CPU over ``seconds`` of wall time, in % of one core."""
    before = [cpu_seconds(pid) for pid in pids]
    start = time.monotonic()
    time.sleep(seconds)  # the measured window itself, not a wait for a condition
    took = time.monotonic() - start
    return [100 * (cpu_seconds(pid) - b) / took for pid, b in zip(pids, before, strict=True)]


def lease_report(cluster: LocalCluster, brokers: int) -> str:
    """Per broker: lease lapses, loop stalls reported by the keep-alive thread and the longest
    (from the brokers' logs, every run of the step)."""
    parts = []
    logs = {p.id: p.log for p in cluster.processes() if p.role == "broker"}
    for broker in range(brokers):
        text = Path(logs[broker]).read_text(errors="replace")
        lapses = text.count("lost its etcd lease")
        stalls = [float(line.split("made no progress for up to ")[1].split(" s")[0])
                  for line in text.splitlines() if "made no progress for up to " in line]
        parts.append(f"broker {broker}: {lapses} lease lapses, {len(stalls)} loop stalls"
                     + (f" (longest {max(stalls):.1f} s)" if stalls else ""))
    return "; ".join(parts)


def served(cluster: LocalCluster, topic: str, count: int, brokers: int = 1) -> bool:
    """Every partition led (the metadata of broker 0 says so), with every replica in its ISR,
    and opened by its leader (the brokers' ``fjord_broker_partitions_led`` gauges add up to
    the count)."""
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
                0 <= p.leader < brokers and len(p.isr) == len(p.replicas) for p in t.partitions
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


def write_until(bootstrap: str, topic: str, count: int, stop: threading.Event) -> None:
    """Produce 100-byte records spread over every partition until ``stop`` (then give up on
    what the killed broker never answered)."""
    with Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5}) as producer:
        producer.partitions_for(topic)
        i = 0
        while not stop.is_set():
            try:
                producer.send(topic, b"x" * 100, partition=i % count)
            except Exception:  # the broker is gone: the point of the exercise
                return
            i += 1


def restart(cluster: LocalCluster, topic: str, count: int, sig: int, brokers: int,
            under_writes: bool = False) -> float:
    writing = threading.Event()
    writer = None
    if under_writes:
        writer = threading.Thread(target=write_until, daemon=True,
                                  args=(cluster.bootstrap_servers, topic, count, writing))
        writer.start()
        time.sleep(5.0)  # the writes the kill interrupts (a duration, not a wait for a state)
    stopping = time.monotonic()
    process = cluster.process("broker", 0)
    process.send_signal(sig)
    process.wait(WAIT_S)  # a clean stop of thousands of partitions may take a while
    cluster.kill("broker", 0, sig)  # already gone: only records it
    stopped = time.monotonic() - stopping
    writing.set()
    if writer is not None:
        writer.join(30)
    print(f"  broker stopped ({signal.Signals(sig).name}"
          f"{', under writes' if under_writes else ''}) in {stopped:.2f} s", flush=True)
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
    parser.add_argument("--replication-factor", type=int, default=1)
    parser.add_argument("--idle-s", type=float, default=0.0,
                        help="measure each broker's idle CPU over this many seconds (0: skip)")
    parser.add_argument("--kill-under-writes", action="store_true",
                        help="SIGKILL the broker while a producer writes to every partition")
    args = parser.parse_args()
    brokers = args.brokers
    rf = args.replication_factor
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
                    admin.create_topics([NewTopic(topic, count, rf, {})])
                    wait_for(lambda c=cluster, n=count: served(c, TOPIC, n, brokers),
                             "partitions served", WAIT_S, interval=0.1)
                    create_s = time.monotonic() - start
                print(f"  {count} partitions: create -> served {create_s:.2f} s", flush=True)
                rss_after, files_after = rss_mib(pid), open_files(pid)
                pids = [cluster.process("broker", b).pid for b in range(brokers)]
                print("  RSS MiB per broker once served: "
                      + ", ".join(f"{rss_mib(p):.0f}" for p in pids)
                      + f" (load {os.getloadavg()[0]:.1f})", flush=True)
                if args.idle_s:
                    idle = idle_cpu_percent(pids, args.idle_s)
                    print(f"  idle CPU over {args.idle_s:.0f} s, % of a core per broker: "
                          + ", ".join(f"{c:.1f}" for c in idle)
                          + f" (load {os.getloadavg()[0]:.1f})", flush=True)
                rate = produce_spread(cluster.bootstrap_servers, topic, count, args.records,
                                      args.buffer_memory)
                load = os.getloadavg()[0]
                print(f"  produce spread {rate:,.0f} rec/s (load {load:.1f})", flush=True)
                restart_s = restart(cluster, topic, count, signal.SIGTERM, brokers)
                print(f"  (load {os.getloadavg()[0]:.1f})", flush=True)
                recovery_s = restart(cluster, topic, count, signal.SIGKILL, brokers,
                                     args.kill_under_writes)
                print(f"  (load {os.getloadavg()[0]:.1f})", flush=True)
                pid = cluster.process("broker", 0).pid
                files_restarted = open_files(pid)
                print(f"  {lease_report(cluster, brokers)}", flush=True)
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
