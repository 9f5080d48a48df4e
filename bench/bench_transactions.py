"""Transactional producer against idempotent producer, same cluster, same run (issue 17's
target: the transactional one at >= 70% of the idempotent one's records/s).

A LocalCluster (3 brokers, 1 coordinator); one topic of ``--partitions`` partitions (RF 3,
acks=all for both). Rounds alternate: ``--seconds`` of the idempotent producer sending
``--size``-byte records as fast as it can (futures collected, flushed at the end), then the
same with ``transactional.id``, ``begin_transaction()`` ... ``commit_transaction()`` every
``--commit-ms`` (100 ms). Records/s counts acknowledged (committed) records only. The machine's
load is printed beside the figures. Usage: .venv/bin/python bench/bench_transactions.py
[--rounds N] [--seconds S]
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

TOPIC = "bench-txn"


def run_idempotent(bootstrap: str, seconds: float, value: bytes, partitions: int) -> float:
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as producer:
        producer.send(TOPIC, value, partition=0).result(60)  # producer id, metadata
        started = time.perf_counter()
        sent = 0
        while time.perf_counter() - started < seconds:
            producer.send(TOPIC, value, partition=sent % partitions)
            sent += 1
        producer.flush(120)
        return sent / (time.perf_counter() - started)


def run_transactional(
    bootstrap: str, seconds: float, value: bytes, partitions: int, commit_ms: int, tid: str
) -> tuple[float, int]:
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                   "transactional.id": tid}) as producer:
        producer.init_transactions(60)
        producer.begin_transaction()
        producer.send(TOPIC, value, partition=0)
        producer.commit_transaction(60)
        started = time.perf_counter()
        sent = commits = 0
        while time.perf_counter() - started < seconds:
            producer.begin_transaction()
            window_end = time.perf_counter() + commit_ms / 1000
            while time.perf_counter() < window_end:
                producer.send(TOPIC, value, partition=sent % partitions)
                sent += 1
            producer.commit_transaction(60)
            commits += 1
        return sent / (time.perf_counter() - started), commits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--commit-ms", type=int, default=100)
    args = parser.parse_args()
    value = os.urandom(args.size)
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp), brokers=3, coordinators=1, cluster_id="bench-txn",
                               unsafe_etcd_no_fsync=True)
        cluster.start()
        try:
            bootstrap = cluster.bootstrap_servers
            with AdminClient({"bootstrap.servers": bootstrap}) as admin:
                admin.create_topics([NewTopic(TOPIC, args.partitions, 3)])
            idempotent, transactional = [], []
            for r in range(args.rounds):
                idempotent.append(run_idempotent(bootstrap, args.seconds, value, args.partitions))
                rate, commits = run_transactional(
                    bootstrap, args.seconds, value, args.partitions, args.commit_ms, f"bench-{r}"
                )
                transactional.append(rate)
                print(f"round {r + 1}: idempotent {idempotent[-1]:,.0f} rec/s, transactional "
                      f"{rate:,.0f} rec/s ({commits} commits), load {os.getloadavg()[0]:.1f}",
                      flush=True)
        finally:
            cluster.stop()
    idem, txn = statistics.median(idempotent), statistics.median(transactional)
    print(f"machine: {platform.machine()} {cpu_model()}, {os.cpu_count()} cpus")
    print(f"median idempotent {idem:,.0f} rec/s, transactional (commit every {args.commit_ms} "
          f"ms) {txn:,.0f} rec/s: {txn / idem:.0%} (target >= 70%)")


if __name__ == "__main__":
    main()
