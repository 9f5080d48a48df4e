"""Zero copy on the Kafka listener: confluent-kafka consumer MB/s and the broker's CPU per MB
served, with and without ``sendfile``, the same code in the same run.

Two one-broker LocalClusters of this checkout run side by side on loopback: one with
``FJORD_KAFKA_ZERO_COPY=false`` (records copied through Python into each Fetch frame), one with
the default (records of verified segments sent from the segment file with ``sendfile``).
``--compare PATH`` adds a third, zero copy from another checkout's services (e.g. main before a
change to the sendfile path). Each gets the same topics (1 partition) written once by
fjord.client: ``--big-records`` values of 1 MiB and ``--small-records`` values of 100 bytes.

Rounds alternate the brokers; a round is one confluent-kafka consumer reading the whole topic
from offset 0 (assign, consume() until every record is read, ``fetch.queue.backoff.ms`` 10 as in
bench_kafka.ck_consume) with two fetch sizes: librdkafka's defaults (``max.partition.fetch.bytes``
1 MiB: one Fetch per MiB) and ``max.partition.fetch.bytes`` 16 MiB / ``fetch.max.bytes`` 64 MiB.
Per round: MB/s of the values read (the round's wall time includes the consumer's start: the
same for every broker), the broker's CPU time per MB served (utime + stime of its process,
/proc/<pid>/stat, 10 ms ticks), the consumer's own CPU per MB (this process: the Python loop and
librdkafka's threads), the broker's *marginal* CPU per MB (the whole read's CPU minus that of a
read of the first tenth of the records by another consumer just before, per MB of the
difference: without the per-consumer fixed part), the bytes the broker counted as sent with sendfile
(``fjord_kafka_sendfile_bytes_total``: proof of the path taken) and the load average. Zero copy
saves the broker's CPU; MB/s shows it only where the broker, not the consumer, is the limit.

Run::

    .venv/bin/python bench/bench_zero_copy.py [--rounds 3] [--compare /path/to/other/services]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import TopicPartition as CKTopicPartition

from fjord.client import AdminClient, NewTopic, Producer
from fjord.kafka.server import ZERO_COPY_ENV_VAR
from fjord.local.cluster import LocalCluster
from fjord.testing.metrics_probe import scrape_metric

WAIT_S = 300.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SENDFILE_METRIC = "fjord_kafka_sendfile_bytes_total"
FETCH_SIZES: dict[str, dict[str, object]] = {
    "1 MiB per fetch (librdkafka default)": {},
    "16 MiB per fetch": {"max.partition.fetch.bytes": 16 << 20, "fetch.max.bytes": 64 << 20},
}


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def write(bootstrap: str, topic: str, records: int, size: int) -> None:
    value = os.urandom(size)
    config = {"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5,
              "max.request.size": max(1 << 20, size + 4096),
              "batch.size": max(16384, min(size + 1024, 1 << 20))}
    with Producer(config) as producer:
        for _ in range(records):
            producer.send(topic, value)
        producer.flush(WAIT_S)


def start(services: str, data: Path, zero_copy: bool) -> LocalCluster:
    """A one-broker cluster whose processes import ``services`` (zero copy on or off)."""
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", ZERO_COPY_ENV_VAR)}
    os.environ["PYTHONPATH"] = services
    os.environ[ZERO_COPY_ENV_VAR] = "true" if zero_copy else "false"
    try:
        cluster = LocalCluster(data, brokers=1, controllers=1, coordinators=0,
                               unsafe_etcd_no_fsync=True,
                               config={"message.max.bytes": str(4 << 20)})
        cluster.start()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return cluster


@dataclass
class Round:
    mb_per_s: float
    broker_cpu_ms_per_mb: float
    consumer_cpu_ms_per_mb: float
    sendfile_mb: float
    load: float
    #: The broker's CPU per MB beyond what a read of a tenth of the records cost (its
    #: per-consumer fixed part: connection, ApiVersions, Metadata, the last empty fetches).
    marginal_broker_cpu_ms_per_mb: float = 0.0


def consume(kafka: str, topic: str, records: int, extra: Mapping[str, object]) -> tuple[int, float]:
    """Read ``records`` from offset 0 of partition 0: (value bytes read, seconds)."""
    consumer = CKConsumer({"bootstrap.servers": kafka, "group.id": "unused",
                           "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                           "fetch.queue.backoff.ms": 10, **extra})
    try:
        start_s = time.perf_counter()
        consumer.assign([CKTopicPartition(topic, 0, 0)])
        read = value_bytes = 0
        while read < records:
            if time.perf_counter() > start_s + WAIT_S:
                raise RuntimeError(f"read {read} of {records}")
            for message in consumer.consume(min(10_000, records - read), 0.5):
                if message.error() is not None:
                    raise RuntimeError(str(message.error()))
                read += 1
                value_bytes += len(message.value() or b"")
        return value_bytes, time.perf_counter() - start_s
    finally:
        consumer.close()


def measure(cluster: LocalCluster, topic: str, records: int,
            extra: Mapping[str, object]) -> Round:
    """A whole read of ``topic`` and, for the marginal figure, a read of its first tenth."""
    pid = cluster.process("broker", 0).pid
    broker_before = cpu_seconds(pid)
    tenth_bytes, _ = consume(cluster.kafka_bootstrap_servers, topic, records // 10, extra)
    tenth_cpu_s = cpu_seconds(pid) - broker_before
    metrics = cluster.metrics_address("broker", 0)
    sendfile_before = scrape_metric(metrics, SENDFILE_METRIC)
    broker_before, own_before = cpu_seconds(pid), own_cpu_seconds()
    value_bytes, seconds = consume(cluster.kafka_bootstrap_servers, topic, records, extra)
    broker_s, own_s = cpu_seconds(pid) - broker_before, own_cpu_seconds() - own_before
    mb = value_bytes / 1e6
    return Round(mb / seconds, broker_s * 1e3 / mb, own_s * 1e3 / mb,
                 (scrape_metric(metrics, SENDFILE_METRIC) - sendfile_before) / 1e6,
                 os.getloadavg()[0],
                 (broker_s - tenth_cpu_s) * 1e3 / (mb - tenth_bytes / 1e6))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", help="services/ of another checkout, served with zero copy")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--big", type=int, default=1 << 20)
    parser.add_argument("--big-records", type=int, default=200)
    parser.add_argument("--small-records", type=int, default=1_000_000)
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent.parent / "services")
    print(f"start {time.strftime('%H:%M:%S', time.gmtime())} UTC, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    results: dict[tuple[str, str, str], list[Round]] = {}
    workloads = {"1 MiB values": ("zc-big", args.big_records, args.big),
                 "100-byte values": ("zc-small", args.small_records, 100)}
    with tempfile.TemporaryDirectory(prefix="fjord-bench-zc-") as tmp:
        clusters = {"copy": start(here, Path(tmp) / "copy", zero_copy=False),
                    "sendfile": start(here, Path(tmp) / "sendfile", zero_copy=True)}
        if args.compare:
            clusters["sendfile, --compare"] = start(args.compare, Path(tmp) / "compare", True)
        try:
            for cluster in clusters.values():
                with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
                    admin.create_topics([NewTopic(topic, 1, 1, {})
                                         for topic, _, _ in workloads.values()])
                for topic, records, size in workloads.values():
                    write(cluster.bootstrap_servers, topic, records, size)
            for round_no in range(args.rounds):
                for name, (topic, records, _) in workloads.items():
                    for fetch, extra in FETCH_SIZES.items():
                        for label, cluster in clusters.items():
                            result = measure(cluster, topic, records, extra)
                            results.setdefault((name, fetch, label), []).append(result)
                            print(f"round {round_no + 1} {name}, {fetch}, {label}: "
                                  f"{result.mb_per_s:,.1f} MB/s, broker "
                                  f"{result.broker_cpu_ms_per_mb:.2f} CPU ms/MB (marginal "
                                  f"{result.marginal_broker_cpu_ms_per_mb:.2f}), consumer "
                                  f"{result.consumer_cpu_ms_per_mb:.2f} CPU ms/MB, sendfile "
                                  f"{result.sendfile_mb:,.1f} MB, load {result.load:.1f}",
                                  flush=True)
        finally:
            for cluster in clusters.values():
                cluster.stop()
    print(f"end {time.strftime('%H:%M:%S', time.gmtime())} UTC, load {os.getloadavg()[0]:.1f}")
    print("\n| values | fetch size | broker | MB/s | broker CPU ms/MB | marginal | "
          "consumer CPU ms/MB | sendfile MB per round | rounds MB/s | rounds broker ms/MB | "
          "rounds marginal | loads |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|---|---|---|")
    for (name, fetch, label), rounds in results.items():
        def med(attribute: str, rounds: list[Round] = rounds) -> float:
            return statistics.median(getattr(r, attribute) for r in rounds)
        print(f"| {name} | {fetch} | {label} | {med('mb_per_s'):,.1f} | "
              f"{med('broker_cpu_ms_per_mb'):.2f} | {med('marginal_broker_cpu_ms_per_mb'):.2f} | "
              f"{med('consumer_cpu_ms_per_mb'):.2f} | "
              f"{med('sendfile_mb'):,.1f} | "
              f"{', '.join(f'{r.mb_per_s:,.0f}' for r in rounds)} | "
              f"{', '.join(f'{r.broker_cpu_ms_per_mb:.2f}' for r in rounds)} | "
              f"{', '.join(f'{r.marginal_broker_cpu_ms_per_mb:.2f}' for r in rounds)} | "
              f"{', '.join(f'{r.load:.1f}' for r in rounds)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
