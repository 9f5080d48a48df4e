"""Where the time of acks=all with replication factor 3 goes: CPU per process and a broker
profile, beside acks=1 with replication factor 1 (issue 18).

Starts the cluster of ``bench/bench_replication.py`` (3 brokers, 2 controllers, loopback; topics
``rf1`` and ``rf3`` with ``--partitions`` partitions, ``rf3`` with ``min.insync.replicas=2``)
and runs alternating rounds of ``--records`` 100-byte records through a fresh
``fjord.client.Producer`` (acks=1 for ``rf1``, acks=all and idempotent for ``rf3``, other
settings default unless ``--set key=value`` overrides them for ``rf3``). For each round it
prints records/s, the wall time, and the CPU seconds (user + system, from ``/proc``) that the
client process and each broker and controller spent in it: a configuration whose wall time is
well above its busiest process's CPU is waiting (round trips), one whose CPU adds up to the
machine's cores is bound by work.

With ``--latency N``, before the rounds: N records sent one at a time (each waited for, so
nothing else is in flight and ``linger.ms`` is 0) in three configurations: acks=1 into ``rf1``,
acks=1 into ``rf3`` (the leader answers after its own append) and acks=all into ``rf3``; the
difference of the last two medians is what waiting for both followers adds to one batch (the
leader's wake of the parked follower fetches, their answers, the followers' appends and next
fetches, the high watermark and the delayed produce's completion).

With ``--py-spy OUT`` a ``py-spy record`` (raw collapsed stacks, ``--gil``: only the thread
holding the GIL is sampled, so idle threads do not count) runs on broker 0 during the
``rf3`` rounds and the functions with the most samples are printed.

Run::

    .venv/bin/python bench/profile_replication.py [--records 50000] [--rounds 3]
        [--set blocked.batch.size=16384] [--py-spy /tmp/repl]
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_replication import create_rf1_rf3, replication_cluster

from fjord.cli.perf_cmd import run_produce_perf
from fjord.client import Producer

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (every thread)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def minor_faults(pid: int) -> int:
    """Minor page faults of process ``pid`` so far (fresh memory touched the first time)."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set takes key=value, got {pair!r}")
        out[key] = value
    return out


def sequential_latency(bootstrap: str, topic: str, acks: str, count: int) -> list[float]:
    """Milliseconds from send() to acknowledgement of ``count`` records sent one at a time."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 0,
                         "enable.idempotence": acks == "all"})
    out = []
    try:
        producer.send(topic, b"w" * 100).result(30)  # metadata, producer id, connections
        for _ in range(count):
            started = time.perf_counter()
            producer.send(topic, b"x" * 100, partition=0).result(30)
            out.append((time.perf_counter() - started) * 1000)
    finally:
        producer.close()
    return sorted(out)


def summarize(path: Path, top: int = 25) -> None:
    """Print the functions with the most samples (self and inclusive) of a raw py-spy file."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = [f.split(" (")[0] + " " + f.rsplit("/", 1)[-1].rstrip(")")
                  for f in stack.split(";")[1:]]
        total += n
        for frame in set(frames):
            inclusive[frame] += n
        if frames:
            own[frames[-1]] += n
    print(f"broker 0 under py-spy: {total} samples")
    for title, counter in (("inclusive", inclusive), ("self", own)):
        print(f"-- {title}")
        for frame, n in counter.most_common(top):
            print(f"{n / max(total, 1):6.1%}  {frame}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a producer setting for the acks=all rounds")
    parser.add_argument("--latency", type=int, default=0, metavar="N",
                        help="first, N records one at a time in three configurations")
    parser.add_argument("--py-spy", metavar="OUT", help="profile broker 0 into OUT-broker0.txt")
    args = parser.parse_args()
    overrides = parse_overrides(args.set)
    with replication_cluster("fjord-prof-repl-") as cluster:
        bootstrap = cluster.bootstrap_servers
        create_rf1_rf3(cluster, args.partitions)
        servers = [p for p in cluster.processes() if p.role in ("broker", "controller")]
        if args.latency:
            for topic, acks in (("rf1", "1"), ("rf3", "1"), ("rf3", "all")):
                ms = sequential_latency(bootstrap, topic, acks, args.latency)
                print(f"one at a time, {topic} acks={acks}: p50 {ms[len(ms) // 2]:.2f} ms, "
                      f"p90 {ms[len(ms) * 9 // 10]:.2f} ms; load {os.getloadavg()[0]:.1f}",
                      flush=True)
        spy: subprocess.Popen[bytes] | None = None
        out: Path | None = None
        if args.py_spy:
            if shutil.which("py-spy") is None:
                raise SystemExit("py-spy is not installed (the bench extra)")
            broker0 = next(p for p in servers if p.role == "broker" and p.id == 0)
            out = Path(f"{args.py_spy}-broker0.txt")
        for round_no in range(args.rounds):
            for topic, acks in (("rf1", "1"), ("rf3", "all")):
                config: dict[str, object] = {"bootstrap.servers": bootstrap, "acks": acks,
                                             "enable.idempotence": acks == "all"}
                if acks == "all":
                    config.update(overrides)
                producer = Producer(config)
                producer.partitions_for(topic)
                if out is not None and acks == "all" and spy is None:
                    spy = subprocess.Popen(
                        ["py-spy", "record", "-p", str(broker0.pid), "-r", "250", "--gil",
                         *(["--native"] if os.environ.get("PYSPY_NATIVE") else []),
                         "-f", "raw", "-o", str(out)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    )
                    time.sleep(1.0)  # attached before the round starts
                before = {p.pid: cpu_seconds(p.pid) for p in servers}
                faults_before = {p.pid: minor_faults(p.pid) for p in servers}
                own_before = own_cpu_seconds()
                started = time.perf_counter()
                try:
                    report = run_produce_perf(producer, topic, args.records,
                                              args.record_size, -1)
                finally:
                    producer.close()
                wall = time.perf_counter() - started
                spent = {p.pid: cpu_seconds(p.pid) - before[p.pid] for p in servers}
                faults = sum(minor_faults(p.pid) - faults_before[p.pid] for p in servers
                             if p.role == "broker")
                print(
                    f"round {round_no + 1} {topic} acks={acks}: "
                    f"{report['records_per_sec']:,.0f} rec/s, wall {wall:.2f} s, CPU s: "
                    f"client {own_cpu_seconds() - own_before:.2f}, "
                    + ", ".join(f"{p.role} {p.id} {spent[p.pid]:.2f}" for p in servers)
                    + f"; brokers' minor page faults {faults:,}"
                    + f"; p50 {report['latency_ms']['p50']} ms; load "
                    f"{os.getloadavg()[0]:.1f}",
                    flush=True,
                )
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
    if out is not None and out.exists():
        summarize(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
