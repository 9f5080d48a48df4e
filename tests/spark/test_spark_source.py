"""The fjord data source end to end: Spark ``local[2]`` against the shared local cluster."""

from __future__ import annotations

import datetime
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka.partitioner.default import murmur2 as kafka_murmur2

from fjord.client import Consumer, TopicPartition
from fjord.errors import KafkaTimeoutError
from fjord.testing.waiting import wait_for
from fjord_spark import defaults
from fjord_spark.arrow import arrow_schema, reader_schema
from fjord_spark.errors import DataLossError
from fjord_spark.offsets import OffsetRange
from fjord_spark.options import parse_reader_options
from fjord_spark.source import ClusterView, FjordInputPartition, read_partition
from tests.helpers.spark import SPARK_WAIT_S, produce

pytestmark = pytest.mark.integration

RETAINED_RECORDS = 30


@pytest.fixture(scope="module")
def retained_topic(new_topic: Callable[..., str], bootstrap: str) -> str:
    """A topic whose oldest segments retention deletes (tiny segments, retention.bytes=1).
    Made first (autouse below) so the broker's retention pass runs while other tests do."""
    topic = new_topic(1, {"segment.bytes": "200", "retention.bytes": "1"})
    for i in range(RETAINED_RECORDS):  # one batch each, so several segments roll
        produce(bootstrap, topic, 1, start=i)
    return topic


@pytest.fixture(scope="module", autouse=True)
def _start_retention_early(retained_topic: str) -> None:
    return None


def rows_of(df: Any) -> list[tuple[Any, ...]]:
    return sorted((r.partition, r.offset, bytes(r.key), bytes(r.value)) for r in df.collect())


def expected_rows(metadata: list[Any], start: int = 0) -> list[tuple[Any, ...]]:
    return sorted(
        (m.partition, m.offset, f"k{start + i}".encode(), f"v{start + i}".encode())
        for i, m in enumerate(metadata)
    )


def reader(spark: Any, bootstrap: str, **options: str) -> Any:
    r = spark.read.format("fjord").option("bootstrap.servers", bootstrap)
    for key, value in options.items():
        r = r.option(key, value)
    return r


# -- batch --------------------------------------------------------------------------------------


def test_batch_read_all_with_headers_and_schema(spark: Any, bootstrap: str, new_topic: Any) -> None:
    topic = new_topic(3)
    sent = produce(bootstrap, topic, 200)
    df = reader(spark, bootstrap, subscribe=topic, includeHeaders="true").load()
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,value:binary>>>"
    )
    rows = df.collect()
    assert len(rows) == 200
    by_value = {bytes(r.value): r for r in rows}
    for i, m in enumerate(sent):
        row = by_value[f"v{i}".encode()]
        assert (row.topic, row.partition, row.offset) == (topic, m.partition, m.offset)
        assert bytes(row.key) == f"k{i}".encode()
        assert [(h.key, bytes(h.value)) for h in row.headers] == [("i", str(i).encode())]
        assert row.timestampType == 0
        assert int(row.timestamp.timestamp() * 1000) == m.timestamp


def test_batch_read_between_offsets(spark: Any, bootstrap: str, new_topic: Any) -> None:
    topic = new_topic(2)
    sent = produce(bootstrap, topic, 100)
    per_partition = {p: sorted(m.offset for m in sent if m.partition == p) for p in (0, 1)}
    assert min(len(v) for v in per_partition.values()) > 10
    df = reader(
        spark,
        bootstrap,
        assign=json.dumps({topic: [0, 1]}),
        startingOffsets=json.dumps({topic: {"0": 5, "1": -2}}),
        endingOffsets=json.dumps({topic: {"0": 9, "1": -1}}),
    ).load()
    got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    assert got == [(0, o) for o in range(5, 9)] + [(1, o) for o in per_partition[1]]


def test_batch_write_then_read_back(spark: Any, bootstrap: str, new_topic: Any) -> None:
    topic = new_topic(2)
    data = [
        (f"k{i}".encode(), f"v{i}".encode(), i % 2, [("h", f"{i}".encode())]) for i in range(120)
    ]
    schema = (
        "key binary, value binary, partition int, headers array<struct<key:string,value:binary>>"
    )
    spark.createDataFrame(data, schema).write.format("fjord").option(
        "bootstrap.servers", bootstrap
    ).option("topic", topic).mode("append").save()
    back = reader(spark, bootstrap, subscribe=topic, includeHeaders="true").load().collect()
    got = sorted(
        (bytes(r.key), bytes(r.value), r.partition, [(h.key, bytes(h.value)) for h in r.headers])
        for r in back
    )
    assert got == sorted(data)
    # Order within a partition is the write order of that task's rows.
    assert sorted(r.offset for r in back if r.partition == 0) == list(range(60))


def test_bulk_write_of_keyed_rows_lands_on_kafkas_partitions(
    spark: Any, bootstrap: str, new_topic: Any
) -> None:
    """Rows without headers go through Producer.send_many: string keys and values as UTF-8,
    the topic from a column, keyed rows on Kafka's murmur2 partition, null keys too, nothing
    lost or doubled, each partition in write order."""
    topic = new_topic(3)
    df = spark.range(0, 500, numPartitions=2).selectExpr(
        "IF(id % 50 = 0, NULL, CONCAT('k', CAST(id % 40 AS STRING))) AS key",
        "CAST(id AS STRING) AS value",
        f"'{topic}' AS topic",
    )
    df.write.format("fjord").option("bootstrap.servers", bootstrap).mode("append").save()
    back = reader(spark, bootstrap, subscribe=topic).load().collect()
    assert sorted(int(bytes(r.value)) for r in back) == list(range(500))
    for r in back:
        if r.key is not None:
            key = bytes(r.key)
            assert key == b"k%d" % (int(bytes(r.value)) % 40)
            assert r.partition == (kafka_murmur2(key) & 0x7FFFFFFF) % 3
    for p in range(3):
        rows = sorted((r.offset, int(bytes(r.value))) for r in back if r.partition == p)
        for task in (range(0, 250), range(250, 500)):  # each write task's rows in order
            mine = [v for _, v in rows if v in task]
            assert mine == sorted(mine)


def test_write_to_unknown_topic_fails_the_task(spark: Any, bootstrap: str) -> None:
    df = spark.createDataFrame([("k", "v")], "key string, value string")
    with pytest.raises(Exception, match="spark-no-such-topic"):
        df.write.format("fjord").option("bootstrap.servers", bootstrap).option(
            "topic", "spark-no-such-topic"
        ).option("fjord.max.block.ms", "1500").option(
            "fjord.allow.auto.create.topics", "false"
        ).mode("append").save()


def test_clear_errors_for_unknown_topic_and_missing_bootstrap(spark: Any, bootstrap: str) -> None:
    with pytest.raises(Exception, match="topic 'spark-absent' does not exist"):
        reader(spark, bootstrap, subscribe="spark-absent").load().collect()
    with pytest.raises(Exception, match=r"missing option bootstrap\.servers"):
        spark.read.format("fjord").option("subscribe", "x").load().collect()
    with pytest.raises(Exception, match=r"missing option bootstrap\.servers"):
        spark.readStream.format("fjord").option("subscribe", "x").load().writeStream.format(
            "noop"
        ).start().awaitTermination(SPARK_WAIT_S)
    with pytest.raises(Exception, match="startingOffsets=latest is not allowed"):
        reader(spark, bootstrap, subscribe="x", startingOffsets="latest").load().collect()


# -- streaming ----------------------------------------------------------------------------------


def test_stream_restart_from_checkpoint_no_loss_no_duplicate(
    spark: Any, bootstrap: str, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic(3)
    first = produce(bootstrap, topic, 300)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def start(**options: str) -> Any:
        r = spark.readStream.format("fjord").option("bootstrap.servers", bootstrap)
        r = r.option("subscribe", topic).option("startingOffsets", "earliest")
        for key, value in options.items():
            r = r.option(key, value)
        return (
            r.load()
            .select("key", "value", "partition", "offset")
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    def rows_read(query: Any) -> int:
        if not query.isActive:
            raise AssertionError(f"the query stopped: {query.exception()}")
        return sum(p["numInputRows"] for p in query.recentProgress)

    query = start(maxOffsetsPerTrigger="50")
    try:
        wait_for(
            lambda: rows_read(query) >= 50, "the first micro-batch", SPARK_WAIT_S, interval=0.2
        )
    finally:
        query.stop()
    assert sum(p["numInputRows"] for p in query.recentProgress) < 300  # work left to restart
    second = produce(bootstrap, topic, 200, start=300)
    query = start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    got = rows_of(spark.read.parquet(out))
    assert got == expected_rows(first + second)  # exactly once: no loss, no duplicate


def test_available_now_with_max_offsets_per_trigger(
    spark: Any, bootstrap: str, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic(3)
    produce(bootstrap, topic, 250)
    batch_sizes: list[int] = []

    def record(batch_df: Any, batch_id: int) -> None:
        batch_sizes.append(batch_df.count())
        if batch_id == 0:
            produce(bootstrap, topic, 10, start=1000)  # after the start: AvailableNow skips it

    query = (
        spark.readStream.format("fjord")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "100")
        .load()
        .writeStream.foreachBatch(record)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(SPARK_WAIT_S), "AvailableNow did not finish"
    assert query.exception() is None
    assert [s for s in batch_sizes if s] == [100, 100, 50]


def test_stream_write_then_read_back(
    spark: Any, bootstrap: str, new_topic: Any, tmp_path: Path
) -> None:
    source, sink = new_topic(2), new_topic(2)
    sent = produce(bootstrap, source, 150)
    query = (
        spark.readStream.format("fjord")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("key", "value", "partition")
        .writeStream.format("fjord")
        .option("bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(SPARK_WAIT_S), "the streaming write did not finish"
    assert query.exception() is None
    back = reader(spark, bootstrap, subscribe=sink).load()
    assert rows_of(back) == expected_rows(sent)  # same partitions, same offsets, same rows


# -- data loss ----------------------------------------------------------------------------------


def _log_start(bootstrap: str, topic: str) -> int:
    with Consumer({"bootstrap.servers": bootstrap}) as consumer:
        return consumer.beginning_offsets([TopicPartition(topic, 0)])[TopicPartition(topic, 0)]


def test_fail_on_data_loss_both_ways(spark: Any, bootstrap: str, retained_topic: str) -> None:
    wait_for(lambda: _log_start(bootstrap, retained_topic) > 0, "retention", 120, interval=0.2)
    log_start = _log_start(bootstrap, retained_topic)
    from_zero = json.dumps({retained_topic: {"0": 0}})
    with pytest.raises(Exception, match="failOnDataLoss"):
        reader(spark, bootstrap, subscribe=retained_topic, startingOffsets=from_zero).load().count()
    skipped = reader(
        spark,
        bootstrap,
        subscribe=retained_topic,
        startingOffsets=from_zero,
        failOnDataLoss="false",
    ).load()
    assert sorted(r.offset for r in skipped.select("offset").collect()) == list(
        range(log_start, RETAINED_RECORDS)
    )

    # The same inside a read task, when retention runs after the range was planned.
    options = parse_reader_options(
        {"bootstrap.servers": bootstrap, "subscribe": retained_topic, "pollTimeoutMs": "10000"},
        streaming=False,
    )
    view = ClusterView(options)
    try:
        (task,) = view.tasks([OffsetRange(TopicPartition(retained_topic, 0), 0, RETAINED_RECORDS)])
    finally:
        view.close()
    schema = arrow_schema(reader_schema(False))
    with pytest.raises(DataLossError, match="log now starts at"):
        list(read_partition(task, schema))
    lenient = FjordInputPartition(**{**task.__dict__, "fail_on_data_loss": False})
    offsets = [o for b in read_partition(lenient, schema) for o in b.column("offset").to_pylist()]
    assert offsets == list(range(log_start, RETAINED_RECORDS))


def test_read_task_times_out_clearly(bootstrap: str, new_topic: Any) -> None:
    """Records the plan says exist but that never arrive (here: past the end of an empty
    topic) fail the task after pollTimeoutMs instead of hanging."""
    topic = new_topic(1)
    options = parse_reader_options(
        {"bootstrap.servers": bootstrap, "subscribe": topic, "pollTimeoutMs": "1500"},
        streaming=False,
    )
    view = ClusterView(options)
    try:
        (task,) = view.tasks([OffsetRange(TopicPartition(topic, 0), 0, 1)])
    finally:
        view.close()
    with pytest.raises(KafkaTimeoutError, match="pollTimeoutMs=1500"):
        list(read_partition(task, arrow_schema(reader_schema(False))))


# -- Kafka clients over the Kafka listener ------------------------------------------------------


def by_partition_and_value(row: tuple[Any, ...]) -> tuple[int, bytes]:
    """Rows (partition, key, value, ...) in a total order although keys may be null."""
    return row[0], row[2]


def test_kafka_client_records_read_by_spark_and_spark_records_read_by_kafka_clients(
    spark: Any, bootstrap: str, new_topic: Any, local_cluster: Any
) -> None:
    """Byte for byte both ways (keys, null keys, binary values, headers with empty values,
    timestamps): confluent-kafka writes over the Kafka listener, the fjord source reads; the
    fjord sink writes, confluent-kafka reads over the Kafka listener."""
    from confluent_kafka import Consumer as CKConsumer
    from confluent_kafka import Producer as CKProducer
    from confluent_kafka import TopicPartition as CKTopicPartition

    kafka = local_cluster.kafka_bootstrap_servers
    topic = new_topic(2)
    producer = CKProducer(
        {
            "bootstrap.servers": kafka,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "lz4",
        }
    )
    sent = []
    for i in range(60):
        key = None if i % 10 == 0 else f"k{i}".encode()
        value, headers = bytes(range(i, i + 40)), [("h", f"{i}".encode()), ("empty", b"")]
        ts = 1_700_000_200_000 + i
        producer.produce(
            topic, key=key, value=value, headers=headers, timestamp=ts, partition=i % 2
        )
        sent.append((i % 2, key, value, headers, ts))
    assert producer.flush(SPARK_WAIT_S) == 0

    def spark_rows(name: str) -> list[tuple[Any, ...]]:
        rows = reader(spark, bootstrap, subscribe=name, includeHeaders="true").load().collect()
        return sorted(
            (
                (
                    r.partition,
                    None if r.key is None else bytes(r.key),
                    bytes(r.value),
                    [(h.key, bytes(h.value)) for h in r.headers],
                    round(r.timestamp.timestamp() * 1000),
                )
                for r in rows
            ),
            key=by_partition_and_value,
        )

    assert spark_rows(topic) == sorted(sent, key=by_partition_and_value)

    back = new_topic(2)
    data = [
        (
            f"s{i}".encode(),
            bytes(range(200, 200 + i % 50)),
            i % 2,
            [("n", f"{i}".encode()), ("empty", b"")],
        )
        for i in range(40)
    ]
    spark.createDataFrame(
        data,
        "key binary, value binary, partition int, headers array<struct<key:string,value:binary>>",
    ).write.format("fjord").option("bootstrap.servers", bootstrap).option("topic", back).mode(
        "append"
    ).save()
    consumer = CKConsumer(
        {"bootstrap.servers": kafka, "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        consumer.assign([CKTopicPartition(back, p, 0) for p in (0, 1)])
        read: list[Any] = []

        def all_read() -> bool:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                read.append(message)
            return len(read) == len(data)

        wait_for(all_read, "the Spark-written records over the Kafka listener", SPARK_WAIT_S)
    finally:
        consumer.close()
    by_kafka = sorted(
        ((m.partition(), m.key(), m.value(), m.headers(), m.timestamp()[1]) for m in read),
        key=by_partition_and_value,
    )
    assert [row[:4] for row in by_kafka] == sorted(
        ((p, k, v, h) for k, v, p, h in data), key=by_partition_and_value
    )
    # The same records through the gRPC door: the same timestamps (and everything else).
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as native:
        native.assign([TopicPartition(back, p) for p in (0, 1)])
        records: list[Any] = []
        wait_for(
            lambda: records.extend(native.poll(0.5)) or len(records) == len(data),
            "the Spark-written records over gRPC",
            SPARK_WAIT_S,
        )
    assert by_kafka == sorted(
        ((r.partition, r.key, r.value, list(r.headers), r.timestamp) for r in records),
        key=by_partition_and_value,
    )


def test_read_task_honours_the_isolation_level(bootstrap: str, new_topic: Any) -> None:
    """``fjord.isolation.level=read_committed`` (Spark's ``kafka.isolation.level``): the planned end
    is the last stable offset and a read task returns committed records only; the default
    reads the aborted ones too. The source's planning and read code, without a Spark job."""
    import uuid

    from fjord.client import Producer

    topic = new_topic(1)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1,
                         "transactional.id": f"spark-iso-{uuid.uuid4().hex[:8]}"})
    try:
        producer.init_transactions(60)
        for outcome in ("commit", "abort", "commit", "open"):
            producer.begin_transaction()
            producer.send(topic, f"{outcome}-value".encode())
            producer.flush(60)
            if outcome == "commit":
                producer.commit_transaction(60)
            elif outcome == "abort":
                producer.abort_transaction(60)
        # The last transaction stays open while the source plans and reads.
        values = {}
        for isolation in ("read_committed", "read_uncommitted"):
            options = parse_reader_options(
                {"bootstrap.servers": bootstrap, "subscribe": topic, "pollTimeoutMs": "10000",
                 "fjord.isolation.level": isolation},
                streaming=False,
            )
            view = ClusterView(options)
            try:
                tp = TopicPartition(topic, 0)
                end = view.latest([tp])[tp]
                (task,) = view.tasks([OffsetRange(tp, 0, end)])
            finally:
                view.close()
            values[isolation] = [
                v.decode() for b in read_partition(task, arrow_schema(reader_schema(False)))
                for v in b.column("value").to_pylist()
            ]
        assert values["read_committed"] == ["commit-value", "commit-value"]
        assert values["read_uncommitted"] == [
            "commit-value", "abort-value", "commit-value", "open-value"
        ]
        producer.abort_transaction(60)
    finally:
        producer.close(10)


# -- issue 19: the options Spark's Kafka source has, and reporting to a consumer group -----------


def produce_at(bootstrap: str, topic: str, stamps: list[int], partition: int = 0) -> None:
    """One record per timestamp (value ``t<ms>``), in order, into ``partition``."""
    from fjord.client import Producer

    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 1}) as producer:
        futures = [
            producer.send(topic, value=f"t{ts}".encode(), partition=partition, timestamp_ms=ts)
            for ts in stamps
        ]
        producer.flush()
        for future in futures:
            future.result(30)


def test_batch_split_into_more_tasks_and_bounded_by_timestamps(
    spark: Any, bootstrap: str, new_topic: Any
) -> None:
    topic = new_topic(1)
    base = 1_700_000_000_000
    produce_at(bootstrap, topic, [base + i for i in range(100)])

    def offsets(df: Any) -> list[int]:
        return sorted(r.offset for r in df.select("offset").collect())

    split = reader(spark, bootstrap, subscribe=topic, minPartitions="4").load()
    assert split.rdd.getNumPartitions() == 4  # one Fjord partition read by 4 tasks
    assert offsets(split) == list(range(100))
    capped = reader(spark, bootstrap, subscribe=topic, maxRecordsPerPartition="30").load()
    assert capped.rdd.getNumPartitions() == 4  # ceil(100 / 30)
    assert offsets(capped) == list(range(100))
    window = reader(
        spark,
        bootstrap,
        subscribe=topic,
        startingOffsetsByTimestamp=json.dumps({topic: {"0": base + 10}}),
        endingTimestamp=str(base + 50),
    ).load()
    assert offsets(window) == list(range(10, 50))
    tail = reader(
        spark,
        bootstrap,
        subscribe=topic,
        startingTimestamp=str(base + 90),
        endingOffsetsByTimestamp=json.dumps({topic: {"0": base + 10_000}}),  # none: to latest
    ).load()
    assert offsets(tail) == list(range(90, 100))
    with pytest.raises(Exception, match=r"minPartitions: -1 is below 1"):
        reader(spark, bootstrap, subscribe=topic, minPartitions="-1").load().collect()
    with pytest.raises(Exception, match="did you mean 'startingOffsets'"):
        reader(spark, bootstrap, subscribe=topic, startingOffset="earliest").load().collect()
    with pytest.raises(Exception, match="must name exactly the partitions"):
        reader(
            spark, bootstrap, subscribe=topic, endingOffsetsByTimestamp='{"nope": {"0": 1}}'
        ).load().collect()


def test_pattern_picks_up_a_new_topic_and_reports_to_its_group(
    spark: Any, bootstrap: str, admin: Any, tmp_path: Path
) -> None:
    """subscribePattern + startingTimestamp end to end: records older than the timestamp are
    skipped, a topic created while the query runs is read from its start; every micro-batch's
    end reaches the consumer group kafka.group.id, where describe shows lag 0 at the end."""
    from fjord.client import NewTopic

    prefix = f"spark-pat-{uuid.uuid4().hex[:8]}"
    first, second, group = f"{prefix}-a", f"{prefix}-b", f"{prefix}-group"
    admin.create_topics([NewTopic(first, 2, 1)])
    now = int(time.time() * 1000)
    produce_at(bootstrap, first, [now - 60_000] * 5)  # before startingTimestamp: skipped
    produce_at(bootstrap, first, [now + i for i in range(7)], partition=1)
    values: list[bytes] = []

    def collect(batch_df: Any, batch_id: int) -> None:
        values.extend(bytes(r.value) for r in batch_df.select("value").collect())

    query = (
        spark.readStream.format("fjord")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribePattern", f"{prefix}-.*")
        .option("startingTimestamp", str(now - 1_000))
        .option("startingOffsetsByTimestampStrategy", "latest")
        .option("kafka.group.id", group)
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )

    def has(count: int) -> bool:
        if not query.isActive:
            raise AssertionError(f"the query stopped: {query.exception()}")
        return len(values) >= count

    try:
        wait_for(lambda: has(7), "the records at or after startingTimestamp", SPARK_WAIT_S)
        admin.create_topics([NewTopic(second, 1, 1)])
        produce_at(bootstrap, second, [now - 120_000, now - 110_000])  # old, but a new topic
        wait_for(lambda: has(9), "the records of the topic created meanwhile", SPARK_WAIT_S)

        def reported() -> list[Any]:
            rows = admin.describe_consumer_group_lag(group)
            return (
                rows
                if {(r.topic, r.partition) for r in rows} == {(first, 0), (first, 1), (second, 0)}
                and all(r.lag == 0 for r in rows)
                else []
            )

        rows = wait_for(reported, "the group to report every partition caught up", SPARK_WAIT_S)
    finally:
        query.stop()
    assert sorted(values) == sorted(
        [f"t{now + i}".encode() for i in range(7)]
        + [f"t{now - 120_000}".encode(), f"t{now - 110_000}".encode()]
    )
    assert {(r.topic, r.partition): r.current_offset for r in rows} == {
        (first, 0): 5,
        (first, 1): 7,
        (second, 0): 2,
    }
    assert all(r.time_lag_s == 0 for r in rows)  # TIME-LAG of a caught-up query


def test_min_offsets_per_trigger_waits_for_records_or_max_trigger_delay(
    spark: Any, bootstrap: str, new_topic: Any, tmp_path: Path
) -> None:
    topic = new_topic(1)
    query = (
        spark.readStream.format("fjord")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("minOffsetsPerTrigger", "50")
        .option("maxTriggerDelay", "4s")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )

    def batches(count: int) -> list[tuple[float, int]]:
        """(trigger start in s, rows) of the micro-batches that read something."""
        if not query.isActive:
            raise AssertionError(f"the query stopped: {query.exception()}")
        seen = [
            (
                datetime.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp(),
                p["numInputRows"],
            )
            for p in query.recentProgress
            if p["numInputRows"]
        ]
        return seen if len(seen) >= count else []

    try:
        produce(bootstrap, topic, 60)
        wait_for(lambda: batches(1), "the batch of 60", SPARK_WAIT_S)
        produce(bootstrap, topic, 10, start=60)
        (first_at, first), (second_at, second) = wait_for(
            lambda: batches(2), "the batch of 10 after maxTriggerDelay", SPARK_WAIT_S
        )[:2]
    finally:
        query.stop()
    assert (first, second) == (60, 10)
    # 10 < 50 records: held until maxTriggerDelay had passed since the batch of 60 ran (its
    # trigger started before the source's clock restarted; the next one's started just before
    # the source looked again).
    assert second_at - first_at >= 4.0 - 0.5


def test_reports_to_the_group_are_bounded_and_arrive(
    bootstrap: str, new_topic: Any, admin: Any
) -> None:
    """The stream reader's report (no Spark job): waited for at most REPORT_WAIT_S, at most one
    in flight, recorded once acknowledged; the group then holds exactly the reported offsets."""
    from fjord_spark.source import FjordStreamReader

    topic = new_topic(2)
    group = f"spark-report-{uuid.uuid4().hex[:8]}"
    options = parse_reader_options(
        {"bootstrap.servers": bootstrap, "subscribe": topic, "kafka.group.id": group},
        streaming=True,
    )
    stream = FjordStreamReader(options, reader_schema(False))
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    try:
        started = time.monotonic()
        stream.report_to_group({tp0: 3, tp1: 0})
        # Bounded: the wait for the acknowledgement plus starting the committing client.
        assert time.monotonic() - started < defaults.REPORT_WAIT_S + 10
        wait_for(
            lambda: (
                stream.report_to_group({tp0: 3, tp1: 0}) or stream._reported == {tp0: 3, tp1: 0}
            ),
            "the first report acknowledged",
            SPARK_WAIT_S,
        )
        stream.report_to_group({tp0: 7, tp1: 0})  # only what moved is sent
        wait_for(
            lambda: stream.report_to_group({tp0: 7, tp1: 0}) or stream._reported[tp0] == 7,
            "the second report acknowledged",
            SPARK_WAIT_S,
        )
    finally:
        stream.stop()
    committed = admin.list_consumer_group_offsets(group)
    assert {tp: o.offset for tp, o in committed.items() if o is not None} == {tp0: 7, tp1: 0}
