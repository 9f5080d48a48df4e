"""One record at a time into a replicated topic, on a settled cluster: the latency of acks=1 and
acks=all, and how many Fetch requests the brokers served per record (issue 18).

Starts the cluster of ``bench/bench_replication.py`` (3 brokers, 2 controllers, loopback; topic
``rf3``: ``--partitions`` partitions, replication factor 3, ``min.insync.replicas=2``). For each
phase (acks=1, acks=all, then both again) a fresh ``fjord.client.Producer`` (``linger.ms`` 0;
idempotent for acks=all) sends one record, waits ``--settle-s`` (the followers' fetches go back
to their long polls, any start-up work ends), then sends ``--records`` records one after the
other, each waited for. Per phase: p50 and p90 from ``send()`` to the acknowledgement, and the
Fetch requests the three brokers served meanwhile per record (Prometheus
``fjord_rpc_server_requests_total``; a request on a FetchStream counts as a Fetch), which shows
how many replication round trips a record takes (idle long polls add a few per second).

Unlike ``profile_replication.py --latency``, whose one-record phases start right after the
topics were created, every phase here starts on a cluster that has been quiet for a moment.

Run::

    .venv/bin/python bench/replication_one_record.py [--records 500] [--settle-s 1.5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_replication import create_topic, replication_cluster, wait_replicated
from prometheus_client.parser import text_string_to_metric_families

from fjord.client import Producer
from fjord.local.cluster import LocalCluster

FETCH = "fjord.v1.Broker/Fetch"


def fetches_served(cluster: LocalCluster, brokers: int) -> float:
    total = 0.0
    for broker in range(brokers):
        address = cluster.metrics_address("broker", broker)
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        total += sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "fjord_rpc_server_requests_total"
            and sample.labels.get("method") == FETCH
        )
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=500)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--settle-s", type=float, default=1.5)
    args = parser.parse_args()
    with replication_cluster("fjord-one-record-") as cluster:
        create_topic(cluster.bootstrap_servers, "rf3", args.partitions, 3,
                     {"min.insync.replicas": "2"})
        wait_replicated(cluster, "rf3", args.partitions)
        for acks in ("1", "all", "1", "all"):
            config = {"bootstrap.servers": cluster.bootstrap_servers, "acks": acks,
                      "linger.ms": 0, "enable.idempotence": acks == "all"}
            with Producer(config) as producer:
                producer.partitions_for("rf3")
                producer.send("rf3", value=b"x" * 100).result(10)
                time.sleep(args.settle_s)  # a benchmark's settling pause, not a test's wait
                before = fetches_served(cluster, 3)
                waits = []
                for _ in range(args.records):
                    sent = time.perf_counter()
                    producer.send("rf3", value=b"x" * 100).result(10)
                    waits.append(time.perf_counter() - sent)
                after = fetches_served(cluster, 3)
            waits.sort()
            print(f"acks={acks}: p50 {1000 * waits[len(waits) // 2]:.2f} ms, "
                  f"p90 {1000 * waits[len(waits) * 9 // 10]:.2f} ms; "
                  f"{(after - before) / args.records:.2f} Fetch requests served per record; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
