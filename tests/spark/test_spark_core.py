"""The pure parts of fjord_spark: options, offsets, rate limiting, range planning, Arrow
conversion, Java detection. No Spark session, no cluster."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType, StructField, StructType

from fjord.client import ConsumerRecord, TopicPartition
from fjord.errors import ConfigError
from fjord_spark import defaults
from fjord_spark.arrow import (
    HEADER_TYPE,
    arrow_schema,
    batch_to_records,
    check_writer_schema,
    reader_schema,
    records_to_batch,
)
from fjord_spark.errors import DataLossError, JavaNotFoundError
from fjord_spark.java import check_java, parse_java_major_version
from fjord_spark.offsets import (
    OffsetRange,
    limit_offsets,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    resolve_offsets,
)
from fjord_spark.options import (
    OffsetSpec,
    parse_reader_options,
    parse_writer_options,
)

BOOT = {"bootstrap.servers": "127.0.0.1:1"}
T0, T1, U0 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)


# -- options --------------------------------------------------------------------------------


def test_reader_defaults_follow_sparks_kafka_source() -> None:
    stream = parse_reader_options({**BOOT, "subscribe": "a, b,a"}, streaming=True)
    assert stream.selection.topics == ("a", "b")
    assert stream.starting == OffsetSpec("latest") and stream.ending is None
    assert stream.fail_on_data_loss and not stream.include_headers
    assert stream.max_offsets_per_trigger is None
    assert stream.poll_timeout_ms == defaults.POLL_TIMEOUT_MS
    batch = parse_reader_options({**BOOT, "subscribe": "a"}, streaming=False)
    assert batch.starting == OffsetSpec("earliest") and batch.ending == OffsetSpec("latest")


def test_reader_options_are_case_insensitive_and_pass_client_properties() -> None:
    opts = parse_reader_options(
        {
            "fjord.bootstrap.servers": "h:1",
            "SUBSCRIBEPATTERN": "orders-.*",
            "MaxOffsetsPerTrigger": "7",
            "failondataloss": "FALSE",
            "includeHeaders": "true",
            "fjord.fetch.max.bytes": "1024",
            "startingTimestamp": "1700000000000",
        },
        streaming=True,
    )
    assert opts.bootstrap_servers == "h:1"
    assert opts.selection.matches("orders-1") and not opts.selection.matches("xorders-1")
    assert opts.max_offsets_per_trigger == 7 and not opts.fail_on_data_loss
    assert opts.include_headers and opts.starting_timestamp == 1700000000000
    task = opts.task_consumer_config()
    assert task["fetch.max.bytes"] == "1024" and task["auto.offset.reset"] == "none"
    assert task["bootstrap.servers"] == "h:1"
    assert task["max.poll.records"] == defaults.TASK_MAX_POLL_RECORDS
    assert "fetch.max.bytes" not in opts.admin_config()


def test_assign_and_offsets_json() -> None:
    opts = parse_reader_options(
        {
            **BOOT,
            "assign": json.dumps({"t": [0, 1], "u": [0]}),
            "startingOffsets": json.dumps({"t": {"0": 5, "1": -2}}),
            "endingOffsets": json.dumps({"t": {"0": -1}, "u": {"0": 9}}),
        },
        streaming=False,
    )
    assert opts.selection.assigned == (T0, T1, U0)
    assert opts.starting.specific == {T0: 5, T1: -2}
    assert opts.ending is not None and opts.ending.specific == {T0: -1, U0: 9}


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"subscribe": "t"}, True, "missing option bootstrap.servers"),
        ({**BOOT, "fjord.bootstrap.servers": "x:2", "subscribe": "t"}, True, "disagree"),
        (BOOT, True, "exactly one of"),
        ({**BOOT, "subscribe": "t", "assign": '{"t":[0]}'}, True, "exactly one of"),
        ({**BOOT, "subscribe": " , "}, True, "no topic"),
        ({**BOOT, "subscribePattern": "("}, True, "regular expression"),
        ({**BOOT, "assign": "[1]"}, True, "JSON object"),
        ({**BOOT, "assign": '{"t": 0}'}, True, "list of partitions"),
        ({**BOOT, "assign": '{"t": [-1]}'}, True, "invalid partition"),
        ({**BOOT, "assign": "{}"}, True, "no partition"),
        ({**BOOT, "subscribe": "t", "startingOffsets": "{oops"}, True, "invalid JSON"),
        ({**BOOT, "subscribe": "t", "startingOffsets": '{"t": {"0": -3}}'}, True, "-2 for"),
        ({**BOOT, "subscribe": "t", "startingOffsets": '{"t": {"0": "1"}}'}, True, "offset"),
        ({**BOOT, "subscribe": "t", "startingOffsets": '{"t": 1}'}, True, "needs an object"),
        ({**BOOT, "subscribe": "t", "startingOffsets": "latest"}, False, "not allowed"),
        ({**BOOT, "subscribe": "t", "startingOffsets": '{"t": {"0": -1}}'}, False, "latest"),
        ({**BOOT, "subscribe": "t", "endingOffsets": "earliest"}, False, "not allowed"),
        ({**BOOT, "subscribe": "t", "endingOffsets": "latest"}, True, "batch queries only"),
        ({**BOOT, "subscribe": "t", "maxOffsetsPerTrigger": "0"}, True, "below 1"),
        ({**BOOT, "subscribe": "t", "maxOffsetsPerTrigger": "x"}, True, "not an integer"),
        ({**BOOT, "subscribe": "t", "failOnDataLoss": "maybe"}, True, "true or false"),
        ({**BOOT, "subscribe": "t", "fjord.no.such.property": "1"}, True, "no.such.property"),
        ({**BOOT, "subscribe": "t", "fjord.fetch.max.wait.ms": "-5"}, True, "fetch.max.wait"),
        (
            {**BOOT, "subscribe": "t", "startingOffsetsByTimestampStrategy": "x"},
            True,
            "error or latest",
        ),
    ],
)
def test_bad_reader_options_name_the_problem(
    options: dict[str, str], streaming: bool, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_reader_options(options, streaming=streaming)


def test_writer_options() -> None:
    w = parse_writer_options({**BOOT, "topic": "out", "fjord.linger.ms": "20"})
    config = w.producer_config()
    assert w.topic == "out" and config["linger.ms"] == "20" and config["acks"] == "all"
    assert parse_writer_options(BOOT).topic is None
    with pytest.raises(ConfigError, match=r"compression\.type"):
        parse_writer_options({**BOOT, "fjord.compression.type": "rar"})
    with pytest.raises(ConfigError, match="topic: empty"):
        parse_writer_options({**BOOT, "topic": " "})
    with pytest.raises(ConfigError, match="bootstrap"):
        parse_writer_options({"topic": "x"})


# -- offsets --------------------------------------------------------------------------------


@given(st.dictionaries(st.tuples(st.text(min_size=1), st.integers(0, 9)), st.integers(0, 2**62)))
def test_offsets_json_round_trip(raw: dict[tuple[str, int], int]) -> None:
    offsets = {TopicPartition(t, p): o for (t, p), o in raw.items()}
    document = offsets_to_json(offsets)
    assert offsets_from_json(json.loads(json.dumps(document))) == offsets


def test_offsets_json_is_sparks_kafka_shape() -> None:
    assert offsets_to_json({T1: 7, T0: 42, U0: 0}) == {"t": {"0": 42, "1": 7}, "u": {"0": 0}}
    for bad in ({"t": 1}, {"t": {"x": 1}}, {"t": {"0": -1}}, {"t": {"0": "1"}}, [1]):
        with pytest.raises(ConfigError):
            offsets_from_json(bad)  # type: ignore[arg-type]


def test_resolve_offsets() -> None:
    earliest, latest = {T0: 3, T1: 0}, {T0: 10, T1: 20}
    assert resolve_offsets(OffsetSpec("earliest"), [T0, T1], earliest, latest, "o") == earliest
    assert resolve_offsets(OffsetSpec("latest"), [T0, T1], earliest, latest, "o") == latest
    spec = OffsetSpec("latest", {T0: -2, T1: 5})
    assert resolve_offsets(spec, [T0, T1], earliest, latest, "o") == {T0: 3, T1: 5}
    with pytest.raises(ConfigError, match="u-0"):
        resolve_offsets(OffsetSpec("latest", {U0: 1}), [T0], earliest, latest, "o")


@given(
    st.lists(st.tuples(st.integers(0, 1000), st.integers(-50, 1000)), min_size=1, max_size=6),
    st.integers(1, 3000),
)
def test_limit_offsets_properties(parts: list[tuple[int, int]], max_rows: int) -> None:
    start = {TopicPartition("t", i): s for i, (s, _) in enumerate(parts)}
    latest = {TopicPartition("t", i): s + extra for i, (s, extra) in enumerate(parts)}
    limited = limit_offsets(start, latest, max_rows)
    available = sum(max(0, latest[tp] - start[tp]) for tp in start)
    read = 0
    for tp in start:
        if latest[tp] <= start[tp]:
            assert limited[tp] == latest[tp]
        else:
            assert start[tp] <= limited[tp] <= latest[tp]
            read += limited[tp] - start[tp]
    assert read == min(max_rows, available)


def test_limit_offsets_is_proportional() -> None:
    start = {T0: 0, T1: 100}
    assert limit_offsets(start, {T0: 300, T1: 200}, 100) == {T0: 75, T1: 125}
    assert limit_offsets(start, {T0: 10, T1: 110}, 100) == {T0: 10, T1: 110}
    with pytest.raises(ValueError):
        limit_offsets(start, {T0: 10, T1: 110}, 0)


def test_plan_ranges_reads_new_partitions_from_log_start_and_skips_empty() -> None:
    ranges = plan_ranges({T0: 5, T1: 9}, {T0: 8, T1: 9, U0: 4}, {T0: 0, T1: 0, U0: 2}, True)
    assert ranges == [OffsetRange(T0, 5, 8), OffsetRange(U0, 2, 4)]
    assert [r.size for r in ranges] == [3, 2]


@pytest.mark.parametrize(
    ("start", "end", "log_start", "lenient", "message"),
    [
        ({T0: 2}, {T0: 10}, {T0: 5}, [OffsetRange(T0, 5, 10)], "now starts at 5"),
        ({T0: 2}, {T0: 4}, {T0: 5}, [], "now starts at 5"),
        ({T0: 8}, {T0: 3}, {T0: 0}, [], "went back from 8 to 3"),
        ({T0: 1, T1: 1}, {T0: 3}, {T0: 0}, [OffsetRange(T0, 1, 3)], "t-1 no longer exists"),
    ],
)
def test_plan_ranges_data_loss_fails_or_skips(
    start: dict[TopicPartition, int],
    end: dict[TopicPartition, int],
    log_start: dict[TopicPartition, int],
    lenient: list[OffsetRange],
    message: str,
) -> None:
    with pytest.raises(DataLossError, match=message) as info:
        plan_ranges(start, end, log_start, True)
    assert "failOnDataLoss" in str(info.value)
    assert plan_ranges(start, end, log_start, False) == lenient


# -- Arrow ----------------------------------------------------------------------------------


def test_reader_schema_is_sparks_kafka_schema() -> None:
    assert reader_schema(False).simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    )
    assert reader_schema(True).fields[-1] == StructField("headers", ArrayType(HEADER_TYPE))


@pytest.mark.parametrize("include_headers", [False, True])
def test_records_to_batch(include_headers: bool) -> None:
    schema = arrow_schema(reader_schema(include_headers))
    records = [
        ConsumerRecord("t", 3, 10, b"k", b"v", (("h", b"1"), ("n", None)), 1_700_000_000_123),
        ConsumerRecord("t", 3, 12, None, None, (), 1_700_000_000_456),
    ]
    batch = records_to_batch(records, schema, 1)
    assert batch.schema.equals(schema)
    assert batch.column("key").to_pylist() == [b"k", None]
    assert batch.column("value").to_pylist() == [b"v", None]
    assert batch.column("topic").to_pylist() == ["t", "t"]
    assert batch.column("partition").to_pylist() == [3, 3]
    assert batch.column("offset").to_pylist() == [10, 12]
    assert batch.column("timestampType").to_pylist() == [1, 1]
    micros = batch.column("timestamp").cast(pa.int64()).to_pylist()
    assert micros == [1_700_000_000_123_000, 1_700_000_000_456_000]
    if include_headers:
        assert batch.column("headers").to_pylist() == [
            [{"key": "h", "value": b"1"}, {"key": "n", "value": None}],
            [],
        ]


def test_writer_schema_rules() -> None:
    ok = StructType(
        [
            StructField("key", StringType()),
            StructField("value", StringType()),
            StructField("partition", IntegerType()),
            StructField("headers", ArrayType(HEADER_TYPE)),
            StructField("other", LongType()),
        ]
    )
    check_writer_schema(ok, "t")
    with pytest.raises(ConfigError, match="option topic or a 'topic' column"):
        check_writer_schema(ok, None)
    with pytest.raises(ConfigError, match="needs a 'value' column"):
        check_writer_schema(StructType([StructField("key", StringType())]), "t")
    with pytest.raises(ConfigError, match="'partition' must be int"):
        check_writer_schema(
            StructType([StructField("value", StringType()), StructField("partition", LongType())]),
            "t",
        )
    with pytest.raises(ConfigError, match="'headers' must be"):
        check_writer_schema(
            StructType([StructField("value", StringType()), StructField("headers", StringType())]),
            "t",
        )


def test_batch_to_records_topic_option_overrides_column() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "value": [b"a", b"b"],
            "topic": ["x", None],
            "headers": [[{"key": "h", "value": b"1"}], None],
        }
    )
    assert list(batch_to_records(batch, None)) == [
        ("x", None, None, b"a", [("h", b"1")]),
        (None, None, None, b"b", None),
    ]
    assert [r[0] for r in batch_to_records(batch, "forced")] == ["forced", "forced"]


# -- Java -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_392"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ("no version here", None),
    ],
)
def test_parse_java_major_version(output: str, major: int | None) -> None:
    assert parse_java_major_version(output) == major


def test_check_java(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    assert check_java() >= defaults.MIN_JAVA_VERSION  # this machine runs Spark
    with pytest.raises(JavaNotFoundError, match="openjdk-17-jre-headless"):
        check_java(minimum=999)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match="JAVA_HOME"):
        check_java()
