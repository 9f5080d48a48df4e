"""Throughput of the fjord Spark source and sink on ``local[2]``, each beside in-memory
baselines measured in the same run (issue 18: source >= 1,000,000 rows/s into the noop sink,
sink >= 500,000 rows/s).

Setup: a private local cluster (``fjord.local``, ``--brokers`` brokers, etcd without fsync);
topic ``bench`` with ``--partitions`` partitions is prefilled with ``--records`` records
(10-byte keys ``k000000042``, ``--value-size``-byte values) by one ``fjord.client.Producer``.
One Spark session ``local[2]`` runs every query; Spark's Python workers are reused
(``spark.python.worker.reuse``, Spark's default) and the session is warmed up first (JVM,
Python workers, the fjord connector's imports) with a tenth of the rows.

Source (rows/s = rows / wall time of the whole action, planning included):

- ``fjord batch``: ``spark.read.format("fjord")`` (subscribe, earliest .. latest)
  ``.load().write.format("noop").mode("overwrite").save()``: one task per partition.
- ``fjord streaming``: ``spark.readStream.format("fjord")`` with ``Trigger.AvailableNow`` into
  the ``noop`` sink (one micro-batch), from query start to termination.
- ``python source (baseline)``: a Python data source defined here (``memory-baseline``) with
  the same schema, the same number of partitions and rows, whose ``read()`` yields Arrow
  batches of the same size (same columns, keys and values of the same lengths) built with
  vectorised Arrow calls (no per-row Python): what Spark itself costs for rows that come from a
  Python data source (the Python worker, Arrow to the JVM, the rows into the noop sink). The
  fjord source cannot beat it; the gap is the fetching and decoding.
- ``spark.range (JVM baseline)``: ``spark.range(rows, numPartitions)`` with columns of the same
  types and sizes built by Spark expressions, into ``noop``: Spark without any Python.
- ``python streaming source (baseline)``: a Python streaming data source defined here
  (``memory-stream-baseline``) with ``Trigger.AvailableNow`` into ``noop``: one micro-batch of
  the same rows, partitions and Arrow batches as the Python-source baseline. Spark runs a
  streaming Python source's offsets in a Python process of its own, started for each query;
  this baseline pays that as the fjord stream does (its classes import nothing of fjord there),
  so it is the streaming source's baseline.

Steady streaming (what a long-running query sees once started): ``fjord streaming`` and the
``python streaming source (baseline)`` with a ``processingTime`` trigger of 0 s (the next
micro-batch as soon as the last ends) and at most ``--steady-batch-rows`` rows per
micro-batch (``maxOffsetsPerTrigger``; the baseline's ``maxRows``), into ``noop``, until all
``--records`` rows were read (``processAllAvailable``). rows/s = the rows of the micro-batches
after the first / the wall time from the end of the first to the end of the last (Spark's
progress reports: trigger start + triggerExecution): the query's start, the offsets
process's start and the first micro-batch are left out.

Fixed cost per query (seconds from start to end, topic ``one``: one partition, one record),
after the rows/s measurements of each round, ``--fixed-repeats`` times each, interleaved:
``fjord streaming`` (AvailableNow), ``python streaming source (baseline)`` (one row) and
``fjord batch``. With ``--records`` rows the
streaming figure is about rows / batch rate + this cost.

Per trigger (before Spark starts, topic ``triggers``): the fjord stream reader's
``latestOffset`` and ``partitions`` as Spark's offsets process calls them, ``--triggers``
times back to back with one new record each (medians, ms).

Sink (rows/s = rows / wall time of ``save()``), all from the same DataFrame
``spark.range(rows, numPartitions).selectExpr(key binary 10 bytes, value binary)``:

- ``fjord sink``: ``.write.format("fjord")`` to topic ``sink`` (``--partitions`` partitions,
  the producer's partitioner by key), the sink's default options (``fjord.acks`` all; with one
  broker and replication factor 1 that is acks=1 in effect); the written count is checked
  against the topic's end offsets after each round.
- ``python noop writer (baseline)``: a Python ``DataSourceArrowWriter`` defined here that
  counts the rows of the Arrow batches it receives: what Spark itself costs to hand rows to a
  Python sink.
- ``noop (JVM baseline)``: ``.write.format("noop")``.

Every round runs each measurement once, in the order above, and records the 1-minute load
average beside it (the machine is shared: the spread over rounds is reported).

    .venv/bin/python bench/bench_spark.py [--records 5000000] [--rounds 3] [--write-results]
        [--skip triggers,source,streaming,steady,fixed,sink]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

import fjord_spark
from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.local.cluster import LocalCluster
from fjord_spark.arrow import reader_schema

SOURCE_TARGET = 1_000_000
SINK_TARGET = 500_000
BASELINE_BATCH_ROWS = 20_000
KEY_SIZE = 10


def memory_batch(
    schema: pa.Schema, partition: int, first: int, count: int, value_size: int, now_us: int
) -> pa.RecordBatch:
    """Rows ``first .. first+count`` of the baseline, shaped like the fjord source's rows
    (10-byte keys, ``value_size``-byte values, topic, partition, offset, timestamp, type),
    built with vectorised numpy/Arrow calls only (no Python per row). Imports fjord_spark here,
    not at the top: the streaming baseline's classes (pickled by value with what they use) must
    import nothing of fjord in Spark's offsets process."""
    from fjord_spark.arrow import repeated_string

    def fixed_binary(size: int, data: bytes) -> pa.Array:
        offsets = np.arange(0, (count + 1) * size, size, dtype=np.int32)
        return pa.Array.from_buffers(
            pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        )

    keys = fixed_binary(KEY_SIZE, b"k%09d" % first * count)
    values = fixed_binary(value_size, b"x" * (value_size * count))
    columns = [
        keys,
        values,
        repeated_string("bench", count),
        pa.repeat(pa.scalar(partition, pa.int32()), count),
        pa.array(np.arange(first, first + count, dtype=np.int64)),
        pa.repeat(pa.scalar(now_us, pa.timestamp("us", tz="UTC")), count),
        pa.repeat(pa.scalar(0, pa.int32()), count),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class MemoryRows:
    """What both in-memory baselines read: ``records`` rows (options ``records``,
    ``partitions``, ``valuesize``) over ``partitions`` partitions, each read as Arrow batches of
    ``BASELINE_BATCH_ROWS`` rows (:func:`memory_batch`). Imports fjord only when reading, in
    the workers: the streaming baseline's classes (pickled by value with what they use) must
    import nothing of fjord in Spark's offsets process."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.records = int(options["records"])
        self.partitions_count = int(options["partitions"])
        self.value_size = int(options["valuesize"])  # Spark lower-cases option names
        self.spark_schema = schema
        self.options = dict(options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from fjord_spark.arrow import arrow_schema

        schema = arrow_schema(self.spark_schema)
        number, rows = partition.value
        now_us = int(time.time() * 1_000_000)
        for first in range(0, rows, BASELINE_BATCH_ROWS):
            count = min(BASELINE_BATCH_ROWS, rows - first)
            yield memory_batch(schema, number, first, count, self.value_size, now_us)


class MemoryReader(MemoryRows, DataSourceReader):
    """The batch baseline: every row in one read."""

    def partitions(self) -> list[InputPartition]:
        return split_rows(self.records, self.partitions_count)


def split_rows(rows: int, partitions: int) -> list[InputPartition]:
    """``rows`` rows over ``partitions`` partitions (plain InputPartitions: a class of this
    script would not unpickle in the workers)."""
    base, extra = divmod(rows, partitions)
    return [InputPartition((p, base + (p < extra))) for p in range(partitions)]


class MemoryStreamReader(MemoryRows, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming baseline: every row available from the start (offsets ``{"row": n}``),
    read as the batch baseline reads them."""

    def initialOffset(self) -> dict[str, int]:
        return {"row": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        """Option ``maxRows``: at most that many rows per micro-batch (as the fjord source's
        ``maxOffsetsPerTrigger``)."""
        max_rows = self.options.get("maxrows")
        return ReadAllAvailable() if max_rows is None else ReadMaxRows(int(max_rows))

    def prepareForTriggerAvailableNow(self) -> None:
        return None

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        if isinstance(limit, ReadMaxRows):
            return {"row": min(self.records, start["row"] + limit.max_rows)}
        return {"row": self.records}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return split_rows(end["row"] - start["row"], self.partitions_count)

    def commit(self, end: dict[str, int]) -> None:
        return None


@dataclass(frozen=True)
class CountMessage(WriterCommitMessage):
    rows: int


class CountingWriter(DataSourceArrowWriter):
    """Counts the rows of the Arrow batches Spark hands it; keeps nothing."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return CountMessage(sum(batch.num_rows for batch in iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        return None


class MemoryDataSource(DataSource):
    """``memory-baseline``: :class:`MemoryRows` as a batch source, and a sink that counts what
    it is given (:class:`CountingWriter`)."""

    @classmethod
    def name(cls) -> str:
        return "memory-baseline"

    def schema(self) -> StructType:
        from fjord_spark.arrow import reader_schema  # (see MemoryRows: not at unpickling)

        return reader_schema(False)

    def reader(self, schema: StructType) -> DataSourceReader:
        return MemoryReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> CountingWriter:
        return CountingWriter()


class MemoryStreamDataSource(MemoryDataSource):
    """``memory-stream-baseline``: the same rows as a streaming source."""

    @classmethod
    def name(cls) -> str:
        return "memory-stream-baseline"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MemoryStreamReader(dict(self.options), schema)


def produce(bootstrap: str, topic: str, records: int, value_size: int) -> None:
    value = b"x" * value_size
    config = {"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 5, "batch.size": 262144}
    with Producer(config) as producer:
        send = producer.send
        for i in range(records):
            send(topic, value=value, key=b"k%09d" % i)
        producer.flush()


def trigger_cost(bootstrap: str, topic: str, triggers: int) -> tuple[float, float]:
    """The stream reader's calls per trigger outside Spark, as Spark's offsets process makes
    them back to back (no query work in between): one record produced before each trigger,
    then ``latestOffset``, ``partitions`` and ``commit``. Median ms of ``latestOffset`` and of
    ``partitions``."""
    from fjord_spark.options import parse_reader_options
    from fjord_spark.source import FjordStreamReader

    options = parse_reader_options(
        {"bootstrap.servers": bootstrap, "subscribe": topic, "startingOffsets": "earliest"},
        streaming=True,
    )
    reader = FjordStreamReader(options, reader_schema(False))
    latest_ms: list[float] = []
    plan_ms: list[float] = []
    try:
        with Producer({"bootstrap.servers": bootstrap, "linger.ms": 0}) as producer:
            start = reader.initialOffset()
            for i in range(triggers):
                producer.send(topic, value=b"x", key=b"k%09d" % i)
                producer.flush()
                began = time.perf_counter()
                end = reader.latestOffset(start, ReadAllAvailable())
                planned = time.perf_counter()
                reader.partitions(start, end)
                latest_ms.append((planned - began) * 1000)
                plan_ms.append((time.perf_counter() - planned) * 1000)
                reader.commit(end)
                start = end
    finally:
        reader.stop()
    return statistics.median(latest_ms), statistics.median(plan_ms)


def end_offsets_total(bootstrap: str, topic: str, partitions: int) -> int:
    with Consumer({"bootstrap.servers": bootstrap}) as consumer:
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    return sum(ends.values())


@dataclass
class Series:
    """One measured thing: rows/s per round and the load average beside each."""

    name: str
    rates: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)

    def add(self, rows: int, run: Callable[[], None]) -> float:
        start = time.monotonic()
        run()
        rate = rows / (time.monotonic() - start)
        self.rates.append(rate)
        self.loads.append(os.getloadavg()[0])
        print(f"  {self.name}: {rate:,.0f} rows/s (load {self.loads[-1]:.1f})", flush=True)
        return rate

    def record(self, rate: float) -> float:
        """A rate measured by the caller (rows/s)."""
        self.rates.append(rate)
        self.loads.append(os.getloadavg()[0])
        print(f"  {self.name}: {rate:,.0f} rows/s (load {self.loads[-1]:.1f})", flush=True)
        return rate

    def time(self, run: Callable[[], None]) -> float:
        """One query's wall time in seconds (kept in ``rates``; ``row_seconds`` shows it)."""
        start = time.monotonic()
        run()
        seconds = time.monotonic() - start
        self.rates.append(seconds)
        self.loads.append(os.getloadavg()[0])
        print(f"  {self.name}: {seconds:.3f} s (load {self.loads[-1]:.1f})", flush=True)
        return seconds

    def row_seconds(self) -> str:
        runs = ", ".join(
            f"{s:.3f} ({load:.1f})" for s, load in zip(self.rates, self.loads, strict=True)
        )
        return (
            f"| {self.name} | {statistics.median(self.rates):.3f} | {min(self.rates):.3f} | "
            f"{max(self.rates):.3f} | {runs} |"
        )

    @property
    def best(self) -> float:
        return max(self.rates)

    def row(self) -> str:
        rounds = ", ".join(
            f"{r:,.0f} ({load:.1f})" for r, load in zip(self.rates, self.loads, strict=True)
        )
        return f"| {self.name} | {self.best:,.0f} | {min(self.rates):,.0f} | {rounds} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--sink-records", type=int, default=None, help="default: --records")
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--skip", default="", help="comma-separated: triggers,source,streaming,steady,fixed,sink"
    )
    parser.add_argument(
        "--fixed-repeats", type=int, default=3, help="one-record queries of each kind per round"
    )
    parser.add_argument("--triggers", type=int, default=30, help="stream reader triggers timed")
    parser.add_argument(
        "--steady-batch-rows",
        type=int,
        default=None,
        help="rows per micro-batch of the steady streaming queries (default: --records / 10)",
    )
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    sink_records = args.sink_records or args.records
    os.environ["PYSPARK_PYTHON"] = sys.executable
    load_start = os.getloadavg()[0]
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    warmup = max(args.records // 10, 1)
    steady_rows = args.steady_batch_rows or max(args.records // 10, 1)
    series = {
        name: Series(name)
        for name in (
            "fjord batch read -> noop",
            "fjord streaming read (AvailableNow) -> noop",
            "python streaming source (AvailableNow, baseline) -> noop",
            "fjord streaming read (steady: processingTime 0, batches after the first) -> noop",
            "python streaming source (steady, baseline) -> noop",
            "python source (baseline) -> noop",
            "spark.range (JVM baseline) -> noop",
            "spark.range -> fjord sink",
            "spark.range -> python noop writer (baseline)",
            "spark.range -> noop (JVM baseline)",
        )
    }
    triggers_line = ""
    fixed = {
        name: Series(name)
        for name in (
            "fjord streaming read (AvailableNow), 1 record",
            "python streaming source (AvailableNow, baseline), 1 row",
            "fjord batch read, 1 record",
        )
    }
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        cluster = LocalCluster(
            os.path.join(tmp, "cluster"), brokers=args.brokers, unsafe_etcd_no_fsync=True
        )
        cluster.start()
        spark = None
        try:
            bootstrap = cluster.bootstrap_servers
            with AdminClient({"bootstrap.servers": bootstrap}) as admin:
                admin.create_topics(
                    [
                        NewTopic(name, args.partitions, 1)
                        for name in ("warmup", "bench", "sink-warmup", "sink", "triggers")
                    ]
                    + [NewTopic("one", 1, 1)]
                )
            prefill = time.monotonic()
            produce(bootstrap, "warmup", warmup, args.value_size)
            produce(bootstrap, "bench", args.records, args.value_size)
            produce(bootstrap, "one", 1, args.value_size)
            prefill_s = time.monotonic() - prefill
            print(f"prefilled {args.records + warmup:,} records in {prefill_s:.1f} s", flush=True)
            if "triggers" not in skip:
                latest_ms, plan_ms = trigger_cost(bootstrap, "triggers", args.triggers)
                triggers_line = (
                    f"Stream reader per trigger, outside Spark ({args.triggers} triggers back "
                    f"to back, one record each; load {os.getloadavg()[0]:.1f}): latestOffset "
                    f"median {latest_ms:.1f} ms, partitions median {plan_ms:.1f} ms."
                )
                print(triggers_line, flush=True)
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
            spark.dataSource.register(MemoryStreamDataSource)
            run = 0

            def checkpoint() -> str:
                nonlocal run
                run += 1
                return os.path.join(tmp, f"checkpoint-{run}")

            def fjord_reader(topic: str, streaming: bool) -> Any:
                reader = (spark.readStream if streaming else spark.read).format("fjord")
                return (
                    reader.option("bootstrap.servers", bootstrap)
                    .option("subscribe", topic)
                    .option("startingOffsets", "earliest")
                )

            def fjord_batch(topic: str) -> None:
                fjord_reader(topic, False).load().write.format("noop").mode("overwrite").save()

            def available_now(frame: Any) -> None:
                """A streaming DataFrame into ``noop`` with ``Trigger.AvailableNow`` (one
                micro-batch), from start to termination."""
                query = (
                    frame.writeStream.format("noop")
                    .option("checkpointLocation", checkpoint())
                    .trigger(availableNow=True)
                    .start()
                )
                if not query.awaitTermination(1800):
                    query.stop()
                    raise RuntimeError("streaming query did not finish in 30 min")
                if query.exception() is not None:
                    raise RuntimeError(f"streaming query failed: {query.exception()}")

            def fjord_streaming(topic: str) -> None:
                available_now(fjord_reader(topic, True).load())

            def steady(frame: Any, rows: int) -> float:
                """rows/s of a ``processingTime`` 0 query into ``noop`` over its
                micro-batches after the first (module docstring), once all ``rows`` rows
                were read."""
                query = (
                    frame.writeStream.format("noop")
                    .option("checkpointLocation", checkpoint())
                    .trigger(processingTime="0 seconds")
                    .start()
                )
                try:
                    query.processAllAvailable()
                    if query.exception() is not None:
                        raise RuntimeError(f"streaming query failed: {query.exception()}")
                    batches = sorted(
                        (p for p in query.recentProgress if p["numInputRows"]),
                        key=lambda p: p["batchId"],
                    )
                finally:
                    query.stop()
                read = sum(p["numInputRows"] for p in batches)
                if read != rows or len(batches) < 2:
                    raise RuntimeError(
                        f"steady query: {read:,} rows in {len(batches)} micro-batches, "
                        f"expected {rows:,} in more than one"
                    )

                def end(progress: Any) -> float:
                    began = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00"))
                    return began.timestamp() + progress["durationMs"]["triggerExecution"] / 1000

                return (read - batches[0]["numInputRows"]) / (end(batches[-1]) - end(batches[0]))

            def fjord_steady(topic: str, rows: int) -> float:
                frame = fjord_reader(topic, True).option("maxOffsetsPerTrigger", str(steady_rows))
                return steady(frame.load(), rows)

            def python_steady(rows: int) -> float:
                frame = spark.readStream.format("memory-stream-baseline").option(
                    "maxRows", str(steady_rows)
                )
                return steady(memory_rows(frame, rows), rows)

            def memory_rows(reader: Any, rows: int) -> Any:
                """The in-memory baselines' rows (MemoryRows), as many as the fjord topic's."""
                return (
                    reader.option("records", str(rows))
                    .option("partitions", str(args.partitions))
                    .option("valueSize", str(args.value_size))
                    .load()
                )

            def python_streaming(rows: int) -> None:
                available_now(memory_rows(spark.readStream.format("memory-stream-baseline"), rows))

            def python_source(rows: int) -> None:
                frame = memory_rows(spark.read.format("memory-baseline"), rows)
                frame.write.format("noop").mode("overwrite").save()

            def generated(rows: int) -> Any:
                return spark.range(rows, numPartitions=args.partitions).selectExpr(
                    "CAST(format_string('k%09d', id) AS BINARY) AS key",
                    f"CAST(repeat('x', {args.value_size}) AS BINARY) AS value",
                )

            def jvm_source(rows: int) -> None:
                (
                    spark.range(rows, numPartitions=args.partitions)
                    .selectExpr(
                        "CAST(format_string('k%09d', id) AS BINARY) AS key",
                        f"CAST(repeat('x', {args.value_size}) AS BINARY) AS value",
                        "'bench' AS topic",
                        "CAST(spark_partition_id() AS INT) AS partition",
                        "id AS offset",
                        "current_timestamp() AS timestamp",
                        "0 AS timestampType",
                    )
                    .write.format("noop")
                    .mode("overwrite")
                    .save()
                )

            def fjord_sink(rows: int, topic: str) -> None:
                before = end_offsets_total(bootstrap, topic, args.partitions)
                (
                    generated(rows)
                    .write.format("fjord")
                    .option("bootstrap.servers", bootstrap)
                    .option("topic", topic)
                    .mode("append")
                    .save()
                )
                written = end_offsets_total(bootstrap, topic, args.partitions) - before
                if written != rows:
                    raise RuntimeError(f"the sink wrote {written:,} records, expected {rows:,}")

            def python_writer(rows: int) -> None:
                generated(rows).write.format("memory-baseline").mode("append").save()

            def jvm_sink(rows: int) -> None:
                generated(rows).write.format("noop").mode("overwrite").save()

            count = fjord_reader("warmup", False).load().count()
            if count != warmup:
                raise RuntimeError(f"the fjord source read {count:,} rows, expected {warmup:,}")
            fjord_streaming("warmup")
            python_streaming(warmup)
            python_source(warmup)
            jvm_source(warmup)
            fjord_sink(warmup, "sink-warmup")
            python_writer(warmup)
            jvm_sink(warmup)
            for number in range(args.rounds):
                print(f"round {number + 1}", flush=True)
                if "source" not in skip:
                    series["fjord batch read -> noop"].add(
                        args.records, lambda: fjord_batch("bench")
                    )
                if "streaming" not in skip:
                    series["fjord streaming read (AvailableNow) -> noop"].add(
                        args.records, lambda: fjord_streaming("bench")
                    )
                    series["python streaming source (AvailableNow, baseline) -> noop"].add(
                        args.records, lambda: python_streaming(args.records)
                    )
                if "steady" not in skip:
                    series[
                        "fjord streaming read (steady: processingTime 0, batches after the first) "
                        "-> noop"
                    ].record(fjord_steady("bench", args.records))
                    series["python streaming source (steady, baseline) -> noop"].record(
                        python_steady(args.records)
                    )
                for _ in range(0 if "fixed" in skip else args.fixed_repeats):
                    fixed["fjord streaming read (AvailableNow), 1 record"].time(
                        lambda: fjord_streaming("one")
                    )
                    fixed["python streaming source (AvailableNow, baseline), 1 row"].time(
                        lambda: python_streaming(1)
                    )
                    fixed["fjord batch read, 1 record"].time(lambda: fjord_batch("one"))
                if "source" not in skip:
                    series["python source (baseline) -> noop"].add(
                        args.records, lambda: python_source(args.records)
                    )
                    series["spark.range (JVM baseline) -> noop"].add(
                        args.records, lambda: jvm_source(args.records)
                    )
                if "sink" not in skip:
                    series["spark.range -> fjord sink"].add(
                        sink_records, lambda: fjord_sink(sink_records, "sink")
                    )
                    series["spark.range -> python noop writer (baseline)"].add(
                        sink_records, lambda: python_writer(sink_records)
                    )
                    series["spark.range -> noop (JVM baseline)"].add(
                        sink_records, lambda: jvm_sink(sink_records)
                    )
        finally:
            if spark is not None:
                spark.stop()
            cluster.stop()
    measured = [s for s in series.values() if s.rates]
    verdicts = []
    for name, target in (
        ("fjord batch read -> noop", SOURCE_TARGET),
        ("fjord streaming read (AvailableNow) -> noop", SOURCE_TARGET),
        (
            "fjord streaming read (steady: processingTime 0, batches after the first) -> noop",
            SOURCE_TARGET,
        ),
        ("spark.range -> fjord sink", SINK_TARGET),
    ):
        s = series[name]
        if s.rates:
            verdict = "met" if s.best >= target else "MISSED"
            verdicts.append(
                f"- {name}: best {s.best:,.0f} rows/s, worst {min(s.rates):,.0f} "
                f"(target >= {target:,}): {verdict}"
            )
    for name, baseline in (
        ("fjord batch read -> noop", "python source (baseline) -> noop"),
        ("fjord streaming read (AvailableNow) -> noop", "python source (baseline) -> noop"),
        (
            "fjord streaming read (AvailableNow) -> noop",
            "python streaming source (AvailableNow, baseline) -> noop",
        ),
        (
            "fjord streaming read (steady: processingTime 0, batches after the first) -> noop",
            "python streaming source (steady, baseline) -> noop",
        ),
        ("spark.range -> fjord sink", "spark.range -> python noop writer (baseline)"),
        ("spark.range -> fjord sink", "spark.range -> noop (JVM baseline)"),
    ):
        a, b = series[name], series[baseline]
        if a.rates and b.rates:
            ratios = [x / y for x, y in zip(a.rates, b.rates, strict=True)]
            verdicts.append(
                f"- {name} / {baseline}, per round: " + ", ".join(f"{r:.0%}" for r in ratios)
            )
    when = datetime.now(UTC).strftime("%H:%M UTC")
    body = "\n".join(
        [
            f"Command: `.venv/bin/python bench/bench_spark.py --records {args.records} "
            f"--rounds {args.rounds} --write-results`"
            + (f" `--skip {args.skip}`" if skip else "")
            + f", {started} to {when}; machine: {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}, Spark local[2] (pyspark {_pyspark_version()}, pyarrow "
            f"{pa.__version__}); {args.brokers} local broker(s); load average (1 min) "
            f"{load_start:.1f} at the start (the machine is shared with other work; the load "
            "after each measurement is in brackets). Source: "
            f"{args.records:,} records ({args.value_size}-byte values, {KEY_SIZE}-byte keys) in "
            f"{args.partitions} partitions; sink: {sink_records:,} rows. Method and baselines: "
            "the script's docstring.",
            "",
            "| measurement | rows/s (best) | rows/s (worst) | rounds: rows/s (load) |",
            "|---|---:|---:|---|",
            *(s.row() for s in measured),
            "",
            *verdicts,
            *(["", triggers_line] if triggers_line else []),
            *(
                [
                    "",
                    "Fixed cost per query (topic `one`: one partition, one record):",
                    "",
                    "| query | median s | best s | worst s | each query: seconds (load) |",
                    "|---|---:|---:|---:|---|",
                    *(s.row_seconds() for s in fixed.values() if s.rates),
                ]
                if any(s.rates for s in fixed.values())
                else []
            ),
        ]
    )
    print(body)
    if args.write_results:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from results_file import write_section

        write_section("## spark", body)
    return 0


def _pyspark_version() -> str:
    import pyspark

    return pyspark.__version__


if __name__ == "__main__":
    sys.exit(main())
