"""TLS against plaintext (issue 16): produce and consume through the same clients, in the same
run, against two private one-broker LocalClusters on loopback: one plaintext, one
``--secure`` (mutual TLS on every listener and towards etcd).

Per round, for each cluster in turn (plaintext first, then TLS, so load drift hits both
alike), fresh topics (``--partitions`` partitions, replication factor 1), and:

- **fjord.client Producer** over gRPC: ``--records`` values of ``--value-size`` bytes,
  ``acks=1``, ``linger.ms=5``, from the first ``send()`` until ``flush()`` returns;
- **fjord.client Consumer** over gRPC: ``assign()`` every partition from offset 0, ``poll()``
  until every record is read;
- **confluent-kafka** produce() and consumer over the Kafka listener (``KAFKA://`` or
  ``SSL://`` with ``security.protocol=SSL`` and a client certificate), the same records.

Each figure is records per second, the median of ``--rounds`` rounds. Every read checks the
count. Target: TLS at least 80% of plaintext records/s, for each client and direction, judged
on the median of the rounds' TLS/plaintext ratios (each round measures both back to back, so
load that changes between rounds moves both alike).

Run::

    .venv/bin/python bench/bench_tls.py [--records 100000] [--rounds 3] [--write-results]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kafka import ck_consume, ck_produce
from results_file import cpu_model, write_section

from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.local.cluster import LocalCluster

SECTION = "## tls (issue 16)"
WAIT_S = 300.0
LINGER_MS = 5
TARGET = 0.80
TABLE_HEAD = (
    "| client | plaintext rec/s | TLS rec/s | ratio of medians | median of round ratios "
    "| rounds plaintext / TLS |\n|---|---:|---:|---:|---:|---|"
)


def fjord_produce(config: dict[str, Any], topic: str, records: int, value: bytes) -> float:
    with Producer({**config, "acks": 1, "linger.ms": LINGER_MS}) as producer:
        producer.partitions_for(topic)  # connected, metadata known before the clock
        send = producer.send
        start = time.perf_counter()
        futures = [send(topic, value) for _ in range(records)]
        producer.flush(WAIT_S)
        elapsed = time.perf_counter() - start
        failed = sum(1 for f in futures if f.exception(0) is not None)
    if failed:
        raise RuntimeError(f"fjord.client produce: {failed} failed")
    return records / elapsed


def fjord_consume(config: dict[str, Any], topic: str, partitions: int, records: int) -> float:
    with Consumer({**config, "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        read, start = 0, time.perf_counter()
        while read < records:
            if time.perf_counter() - start > WAIT_S:
                raise RuntimeError(f"fjord.client consumer read {read} of {records}")
            read += len(consumer.poll(0.5))
        elapsed = time.perf_counter() - start
    if read != records:
        raise RuntimeError(f"fjord.client consumer read {read}, expected {records}")
    return records / elapsed


KINDS = {
    "fj_p": "fjord.client Producer (gRPC)",
    "fj_c": "fjord.client Consumer (gRPC)",
    "ck_p": "confluent-kafka produce() (Kafka listener)",
    "ck_c": "confluent-kafka consumer (Kafka listener)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    value = os.urandom(args.value_size)
    load_start = os.getloadavg()[0]
    figures: dict[tuple[str, str], list[float]] = {
        (mode, kind): [] for mode in ("plaintext", "tls") for kind in KINDS
    }
    with contextlib.ExitStack() as stack:
        clusters: dict[str, LocalCluster] = {}
        for mode in ("plaintext", "tls"):
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-tls-")))
            clusters[mode] = stack.enter_context(LocalCluster(
                base, brokers=1, controllers=1, coordinators=0, unsafe_etcd_no_fsync=True,
                secure=mode == "tls",
            ))
        for round_no in range(args.rounds):
            for mode, cluster in clusters.items():
                grpc = {"bootstrap.servers": cluster.bootstrap_servers, **cluster.client_config}
                kafka = cluster.kafka_bootstrap_servers
                with AdminClient(grpc) as admin:
                    fj_topic, ck_topic = (f"bench-tls-{uuid.uuid4().hex[:8]}" for _ in range(2))
                    admin.create_topics([NewTopic(fj_topic, args.partitions, 1),
                                         NewTopic(ck_topic, args.partitions, 1)])
                n, parts = args.records, args.partitions
                figures[(mode, "fj_p")].append(fjord_produce(grpc, fj_topic, n, value))
                figures[(mode, "fj_c")].append(fjord_consume(grpc, fj_topic, parts, n))
                figures[(mode, "ck_p")].append(
                    ck_produce(kafka, ck_topic, n, value, security=cluster.client_config))
                figures[(mode, "ck_c")].append(
                    ck_consume(kafka, ck_topic, parts, n, security=cluster.client_config))
                print(f"round {round_no + 1} {mode}: " + ", ".join(
                    f"{k} {figures[(mode, k)][-1]:,.0f}" for k in KINDS), flush=True)
    load_end = os.getloadavg()[0]
    median = {key: statistics.median(v) for key, v in figures.items()}
    rows, verdicts = [], []
    for kind, name in KINDS.items():
        plain, tls = median[("plaintext", kind)], median[("tls", kind)]
        # Each round measures plaintext and TLS back to back: the median of the per-round
        # ratios is less moved by load that changes between rounds than the ratio of medians.
        ratio = statistics.median(
            t / p for p, t in zip(figures[("plaintext", kind)], figures[("tls", kind)], strict=True)
        )
        rows.append(
            f"| {name} | {plain:,.0f} | {tls:,.0f} | {tls / plain:.0%} | {ratio:.0%} | "
            + ", ".join(f"{x:,.0f}" for x in figures[("plaintext", kind)]) + " / "
            + ", ".join(f"{x:,.0f}" for x in figures[("tls", kind)]) + " |"
        )
        verdicts.append(f"- {name}: TLS {ratio:.0%} of plaintext, median of the rounds' ratios "
                        f"(target >= {TARGET:.0%}): "
                        + ("met" if ratio >= TARGET else "MISSED"))
    command = "`.venv/bin/python bench/bench_tls.py " + " ".join(sys.argv[1:]) + "`"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    table = "\n".join(rows)
    body = f"""Command: {command}, {now}; machine: {os.cpu_count()} CPUs ({cpu_model()}), Python \
{platform.python_version()}, {platform.system()} {platform.release()}; load average (1 min) \
{load_start:.1f} at the start, {load_end:.1f} at the end (shared with other work). Two one-broker \
clusters on loopback, plaintext and `--secure` (TLS 1.3, EC P-256 certificates, client \
certificates required); {args.records:,} values of {args.value_size} bytes into \
{args.partitions} partitions per figure, acks=1, linger.ms {LINGER_MS}; median of \
{args.rounds} rounds, plaintext and TLS interleaved. Method: the docstring of bench/bench_tls.py.

{TABLE_HEAD}
{table}

""" + "\n".join(verdicts) + "\n"
    print(body)
    if args.write_results:
        write_section(SECTION, body)


if __name__ == "__main__":
    main()
