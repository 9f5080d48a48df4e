"""Streaming read throughput of the fjord Spark source, beside an in-memory Python source.

What it measures: a ``spark.readStream.format("fjord")`` query with ``Trigger.AvailableNow``
into the ``noop`` sink reads every record of a topic (``--records`` records with a 10-byte key
and a ``--value-size`` value, in ``--partitions`` partitions, on a private local cluster of
3 brokers) in ``local[2]``; rows/s = records / wall time from ``start()`` to termination.
The baseline is a trivial Python streaming data source (``memory-baseline``, defined here)
that, in the same session, yields the same rows (same key/value sizes, same partitioning)
from memory as Arrow batches built the same way (``records_to_batch``), with no network and
no RecordBatch decoding: the ratio shows what fetching and decoding cost on top of Spark's
own per-query and per-row overhead. The target is a ratio of at least 70%.

Each round runs both queries once (fjord first); a warm-up round of 1/10 of the records runs
first (JVM and Python worker start). The best round of each is reported.

    .venv/bin/python bench/bench_spark.py [--records 200000] [--rounds 3] [--write-results]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

import fjord_spark
from fjord.client import AdminClient, ConsumerRecord, NewTopic, Producer
from fjord.local.cluster import LocalCluster
from fjord_spark.arrow import arrow_schema, reader_schema, records_to_batch

TARGET_RATIO = 0.70
ARROW_BATCH_ROWS = 20_000


class MemoryStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets {"p": n} over ``partitions`` partitions of ``records`` rows in all."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.records = int(options["records"])
        self.partitions_count = int(options["partitions"])
        self.value_size = int(options["valuesize"])  # Spark lower-cases option names
        self.schema = arrow_schema(schema)

    def _sizes(self) -> dict[str, int]:
        base, extra = divmod(self.records, self.partitions_count)
        return {str(p): base + (p < extra) for p in range(self.partitions_count)}

    def initialOffset(self) -> dict[str, int]:
        return {str(p): 0 for p in range(self.partitions_count)}

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        return self._sizes()

    def prepareForTriggerAvailableNow(self) -> None:
        return None

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        # Plain InputPartition (a class of this script would not unpickle in the workers).
        return [InputPartition((int(p), start[p], end[p])) for p in end if end[p] > start[p]]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        number, begin, end = partition.value
        value = b"x" * self.value_size
        now = int(time.time() * 1000)
        new = tuple.__new__
        for first in range(begin, end, ARROW_BATCH_ROWS):
            last = min(first + ARROW_BATCH_ROWS, end)
            rows = [
                new(ConsumerRecord, ("bench", number, o, b"k%09d" % o, value, (), now))
                for o in range(first, last)
            ]
            yield records_to_batch(rows, self.schema, 0)


class MemoryDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "memory-baseline"

    def schema(self) -> StructType:
        return reader_schema(False)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MemoryStreamReader(dict(self.options), schema)


def timed_query(spark: Any, fmt: str, options: dict[str, str], checkpoint: str) -> float:
    reader = spark.readStream.format(fmt)
    for key, value in options.items():
        reader = reader.option(key, value)
    start = time.monotonic()
    query = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    if not query.awaitTermination(1800):
        query.stop()
        raise RuntimeError(f"{fmt} query did not finish in 30 min")
    if query.exception() is not None:
        raise RuntimeError(f"{fmt} query failed: {query.exception()}")
    return time.monotonic() - start


def produce(bootstrap: str, topic: str, records: int, value_size: int) -> None:
    value = b"x" * value_size
    config = {"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 5, "batch.size": 262144}
    with Producer(config) as producer:
        for i in range(records):
            producer.send(topic, value=value, key=b"k%09d" % i)
        producer.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        cluster = LocalCluster(os.path.join(tmp, "cluster"), brokers=3, unsafe_etcd_no_fsync=True)
        cluster.start()
        spark = None
        try:
            bootstrap = cluster.bootstrap_servers
            with AdminClient({"bootstrap.servers": bootstrap}) as admin:
                admin.create_topics(
                    [
                        NewTopic("warmup", args.partitions, 1),
                        NewTopic("bench", args.partitions, 1),
                    ]
                )
            warmup = max(args.records // 10, 1)
            produce(bootstrap, "warmup", warmup, args.value_size)
            produce(bootstrap, "bench", args.records, args.value_size)
            spark = fjord_spark.create_session(
                "bench-spark",
                "local[2]",
                {
                    "spark.ui.enabled": "false",
                    "spark.ui.showConsoleProgress": "false",
                    "spark.python.authenticate.socketTimeout": "120s",
                },
            )
            spark.sparkContext.setLogLevel("ERROR")
            spark.dataSource.register(MemoryDataSource)

            def fjord_options(topic: str) -> dict[str, str]:
                return {
                    "bootstrap.servers": bootstrap,
                    "subscribe": topic,
                    "startingOffsets": "earliest",
                }

            def memory_options(records: int) -> dict[str, str]:
                return {
                    "records": str(records),
                    "partitions": str(args.partitions),
                    "valueSize": str(args.value_size),
                }

            run = 0

            def checkpoint() -> str:
                nonlocal run
                run += 1
                return os.path.join(tmp, f"checkpoint-{run}")

            timed_query(spark, "fjord", fjord_options("warmup"), checkpoint())
            timed_query(spark, "memory-baseline", memory_options(warmup), checkpoint())
            fjord_rates, memory_rates = [], []
            for _ in range(args.rounds):
                seconds = timed_query(spark, "fjord", fjord_options("bench"), checkpoint())
                fjord_rates.append(args.records / seconds)
                seconds = timed_query(
                    spark, "memory-baseline", memory_options(args.records), checkpoint()
                )
                memory_rates.append(args.records / seconds)
        finally:
            if spark is not None:
                spark.stop()
            cluster.stop()
    best_fjord, best_memory = max(fjord_rates), max(memory_rates)
    ratio = best_fjord / best_memory
    verdict = "met" if ratio >= TARGET_RATIO else "MISSED"
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = "\n".join(
        [
            f"Command: `.venv/bin/python bench/bench_spark.py --records {args.records} "
            f"--rounds {args.rounds} --write-results`, {when}; machine: {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}, Spark local[2]; load average (1 min) "
            f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (the machine is "
            "shared with other work). Streaming read with Trigger.AvailableNow into the noop "
            f"sink, {args.records:,} records ({args.value_size}-byte values, 10-byte keys) in "
            f"{args.partitions} partitions; best of {args.rounds} rounds. Method: the script's "
            "docstring.",
            "",
            "| source | rows/s (best) | rounds rows/s |",
            "|---|---:|---:|",
            f"| fjord (3 local brokers) | {best_fjord:,.0f} | "
            + ", ".join(f"{r:,.0f}" for r in fjord_rates)
            + " |",
            f"| in-memory Python source (baseline) | {best_memory:,.0f} | "
            + ", ".join(f"{r:,.0f}" for r in memory_rates)
            + " |",
            "",
            f"- fjord / baseline: {ratio:.0%} (target >= {TARGET_RATIO:.0%}): {verdict}",
        ]
    )
    print(body)
    if args.write_results:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from results_file import write_section

        write_section("## spark", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
