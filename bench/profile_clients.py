"""Profile the clients' hot paths with py-spy: where the time of one record goes.

Starts a one-broker LocalCluster, then runs the workload of bench/bench_e2e.py (100-byte values,
no key, one partition, ``acks=1``, other settings default) in a child process under
``py-spy record`` (every thread of the child, idle samples dropped), while a second py-spy
attaches to the broker process for the same span:

- ``produce``: ``Producer.send`` of ``--records`` records, then ``flush()``;
- ``consume``: ``Consumer.poll`` until the records written by ``produce`` are all read, three
  times over (a seek to 0 between passes).

Each profile is written as collapsed stacks (``<out>/<workload>-client.txt`` and
``<workload>-broker.txt``, Brendan Gregg's format, one line per stack with its sample count);
the script prints, for each, the functions with the most samples *inclusive* and *self*, so the
summary can be read without a flame-graph viewer (any collapsed-stack viewer, e.g.
speedscope or flamegraph.pl, draws the files).

Run::

    .venv/bin/python bench/profile_clients.py [--records 300000] [--rate 250] [--out /tmp/prof]

py-spy (the ``bench`` extra) reads the other process's memory: it needs ptrace rights (root,
or ``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VALUE = b"x" * 100
TOPIC = "profile"
CONSUME_PASSES = 3


def child_produce(bootstrap: str, records: int) -> None:
    from fjord.client import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1"})
    try:
        producer.partitions_for(TOPIC)
        start = time.perf_counter()
        send = producer.send
        for _ in range(records):
            send(TOPIC, VALUE)
        producer.flush(120)
        elapsed = time.perf_counter() - start
    finally:
        producer.close(60)
    print(f"produce: {records / elapsed:,.0f} records/s ({elapsed * 1e6 / records:.2f} us/record)")


def child_consume(bootstrap: str, records: int) -> None:
    from fjord.client import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"})
    received = 0
    elapsed = 0.0
    try:
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        for _ in range(CONSUME_PASSES):  # (one pass is too short for enough samples)
            consumer.seek(tp, 0)
            consumer.position(tp, timeout=30)
            got = 0
            deadline = time.monotonic() + 120
            start = time.perf_counter()
            while got < records and time.monotonic() < deadline:
                got += len(consumer.poll(1.0))
            elapsed += time.perf_counter() - start
            received += got
    finally:
        consumer.close()
    per_record = elapsed * 1e6 / max(received, 1)
    print(f"consume: {received / elapsed:,.0f} records/s ({per_record:.2f} us/record)")


def _function(frame: str) -> str:
    """``name (file:line)`` -> ``name (file)``: samples summed over a function's lines."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rpartition(':')[0] or where.rstrip(')')})"


def summarize(path: Path, top: int) -> str:
    """Samples per thread, and the functions with the most samples, inclusive and self (summed
    over their lines), from collapsed stacks; start-up (imports) left out."""
    threads: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or "importlib" in stack:
            continue
        count = int(count_text)
        total += count
        thread, *frames = stack.split(";")
        threads[thread] += count
        for frame in {_function(f) for f in frames}:
            inclusive[frame] += count
        if frames:
            own[_function(frames[-1])] += count
    lines = [f"{path.name}: {total} samples (imports left out)", "  threads:"]
    for thread, count in threads.most_common():
        lines.append(f"    {100 * count / max(total, 1):5.1f}%  {thread}")
    for title, counter in (("inclusive", inclusive), ("self", own)):
        lines.append(f"  top {top} {title}:")
        for frame, count in counter.most_common(top):
            lines.append(f"    {100 * count / max(total, 1):5.1f}%  {frame}")
    return "\n".join(lines)


def profile(
    workload: str, bootstrap: str, broker_pid: int, records: int, rate: int, out: Path
) -> None:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    client_out = out / f"{workload}-client.txt"
    broker_out = out / f"{workload}-broker.txt"
    common = ["--rate", str(rate), "--format", "raw", "--threads", "--nonblocking"]
    broker = subprocess.Popen(
        [py_spy, "record", "--pid", str(broker_pid), "-o", str(broker_out), *common],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        subprocess.run(
            [py_spy, "record", "-o", str(client_out), *common, "--",
             sys.executable, __file__, "--child", workload, bootstrap, str(records)],
            check=True,
        )  # fmt: skip
    finally:
        broker.send_signal(2)  # py-spy writes its output on SIGINT
        broker.wait(30)
    print(summarize(client_out, 40))
    print(summarize(broker_out, 30))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        workload, bootstrap, records = sys.argv[2], sys.argv[3], int(sys.argv[4])
        {"produce": child_produce, "consume": child_consume}[workload](bootstrap, records)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--out", type=Path, default=None, help="directory for the profiles")
    args = parser.parse_args()

    from fjord.client import AdminClient, NewTopic
    from fjord.local.cluster import LocalCluster

    out = args.out or Path(tempfile.mkdtemp(prefix="fjord-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"load average (1 min) {os.getloadavg()[0]:.1f}; profiles in {out}")
    with (
        tempfile.TemporaryDirectory(prefix="profile-cluster-") as tmp,
        LocalCluster(Path(tmp), brokers=1) as cluster,
    ):
        bootstrap = str(cluster.bootstrap_servers)
        with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            admin.create_topics([NewTopic(TOPIC, 1, 1)], timeout=60)
        broker_pid = cluster.process("broker", 0).pid
        for workload in ("produce", "consume"):
            profile(workload, bootstrap, broker_pid, args.records, args.rate, out)
    print(f"load average (1 min) {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
