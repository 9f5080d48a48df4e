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
from fjord.records import Compression, TimestampType
from fjord.records.builder import BatchBuilder
from fjord.records.header import stamp_batch
from fjord.records.reader import RecordBatch
from fjord_spark import arrow as fjord_arrow
from fjord_spark import defaults
from fjord_spark.arrow import (
    HEADER_TYPE,
    ArrowColumns,
    arrow_schema,
    batch_to_groups,
    batch_to_records,
    check_writer_schema,
    reader_schema,
    records_to_batch,
)
from fjord_spark.errors import DataLossError, JavaNotFoundError
from fjord_spark.java import check_java, parse_java_major_version
from fjord_spark.offsets import (
    OffsetRange,
    TriggerDelay,
    available_records,
    limit_offsets,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    resolve_offsets,
    split_ranges,
)
from fjord_spark.options import (
    OffsetSpec,
    parse_duration_ms,
    parse_reader_options,
    parse_writer_options,
)
from fjord_spark.source import FjordDataSource

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
    assert config["batch.size"] == defaults.WRITER_BATCH_SIZE == 1_048_576
    small = parse_writer_options({**BOOT, "kafka.batch.size": "16384"}).producer_config()
    assert small["batch.size"] == "16384"  # the user's wins
    assert parse_writer_options(BOOT).topic is None
    with pytest.raises(ConfigError, match=r"compression\.type"):
        parse_writer_options({**BOOT, "fjord.compression.type": "rar"})
    with pytest.raises(ConfigError, match="topic: empty"):
        parse_writer_options({**BOOT, "topic": " "})
    with pytest.raises(ConfigError, match="bootstrap"):
        parse_writer_options({"topic": "x"})


def test_exactly_once_writer_options() -> None:
    assert not parse_writer_options(BOOT).exactly_once
    w = parse_writer_options(
        {**BOOT, "exactlyOnce": "TRUE", "fjord.client.id": "c", "fjord.linger.ms": "5"}
    )
    assert w.exactly_once and w.transactional_id_prefix == "fjord-spark"
    producer = w.transactional_producer_config("fjord-spark-q-1")
    assert producer["transactional.id"] == "fjord-spark-q-1" and producer["acks"] == "all"
    reader = w.marker_reader_config("fjord-spark-q-1")
    assert reader["group.id"] == "fjord-spark-q-1"
    assert reader["isolation.level"] == "read_committed"
    assert reader["client.id"] == "c" and "linger.ms" not in reader  # no producer-only keys
    named = parse_writer_options({**BOOT, "exactlyOnce": "true", "transactionalIdPrefix": " p "})
    assert named.transactional_id_prefix == "p"
    with pytest.raises(ConfigError, match="exactlyOnce: 'yes'"):
        parse_writer_options({**BOOT, "exactlyOnce": "yes"})
    with pytest.raises(ConfigError, match="transactionalIdPrefix: empty"):
        parse_writer_options({**BOOT, "transactionalIdPrefix": ""})
    with pytest.raises(ConfigError, match="exactlyOnce=true"):
        parse_writer_options({**BOOT, "kafka.transactional.id": "mine"})
    with pytest.raises(ConfigError, match="streaming writes"):
        FjordDataSource({**BOOT, "topic": "t", "exactlyOnce": "true"}).writer(
            reader_schema(False), False
        )


def test_unknown_options_are_refused_naming_the_closest_known_one() -> None:
    """Spark's own Kafka source ignores a typo such as startingOffset and reads from latest."""
    cases = [
        ({"subscribe": "t", "startingOffset": "earliest"}, True, "'startingOffsets'"),
        ({"subscribe": "t", "maxOffsetPerTrigger": "5"}, True, "'maxOffsetsPerTrigger'"),
        ({"subscribe": "t", "minPartition": "5"}, False, "'minPartitions'"),
        ({"subscribe": "t", "zzz": "5"}, False, "unknown option 'zzz' for the fjord source$"),
        ({"subscribe": "t", "path": "/x"}, False, "takes no path"),
    ]
    for options, streaming, message in cases:
        with pytest.raises(ConfigError, match=message):
            parse_reader_options({**BOOT, **options}, streaming=streaming)
    with pytest.raises(ConfigError, match="'topic'"):
        parse_writer_options({**BOOT, "topics": "t"})
    # What Spark itself adds to a streaming writer's options is not ours to refuse.
    parse_writer_options({**BOOT, "checkpointLocation": "/c", "queryName": "q"})


def test_kafka_prefixed_options_reach_the_client_and_are_validated_by_it() -> None:
    opts = parse_reader_options(
        {
            "kafka.bootstrap.servers": "h:1",
            "subscribe": "t",
            "kafka.fetch.max.bytes": "1024",
            "fjord.request.timeout.ms": "5000",
            "kafka.security.protocol": "SSL",
            "kafka.ssl.ca.location": "/ca.pem",
            "kafka.ssl.certificate.location": "/c.pem",
            "kafka.ssl.key.location": "/k.pem",
        },
        streaming=True,
    )
    assert opts.bootstrap_servers == "h:1"
    for config in (opts.task_consumer_config(), opts.admin_config()):
        assert config["security.protocol"] == "SSL" and config["ssl.ca.location"] == "/ca.pem"
        assert config["ssl.certificate.location"] == "/c.pem"
    assert opts.task_consumer_config()["fetch.max.bytes"] == "1024"
    sasl = {"kafka.security.protocol": "SASL_SSL", "kafka.ssl.ca.location": "/ca.pem",
            "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.username": "alice",
            "kafka.sasl.password": "pw"}
    sasl_reader = parse_reader_options({**BOOT, "subscribe": "t", **sasl}, streaming=True)
    assert sasl_reader.task_consumer_config()["sasl.username"] == "alice"
    assert parse_writer_options({**BOOT, **sasl}).producer_config()["sasl.password"] == "pw"
    writer = parse_writer_options({**BOOT, "kafka.security.protocol": "SSL", "kafka.acks": "1"})
    assert writer.producer_config()["security.protocol"] == "SSL"
    assert writer.producer_config()["acks"] == "1"
    refused = [
        ({"kafka.fetch.max.byte": "1"}, r"'fetch\.max\.byte' \(did you mean 'fetch\.max\.bytes'"),
        ({"kafka.security.protocol": "TLS"}, r"security\.protocol"),
        ({"kafka.security.protocol": "SASL_SSL"}, r"sasl\.mechanism: SCRAM-SHA-256 or"),
        ({"kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
          "kafka.sasl.username": "alice"}, r"sasl\.password: required"),
        ({"kafka.auto.offset.reset": "earliest"}, "startingOffsets"),
        ({"kafka.enable.auto.commit": "true"}, "commits each micro-batch"),
        ({"kafka.linger.ms": "1", "fjord.linger.ms": "2"}, "disagree"),
        ({"kafka.bootstrap.servers": "x:2"}, "disagree"),
    ]
    for options, message in refused:
        with pytest.raises(ConfigError, match=message):
            parse_reader_options({**BOOT, "subscribe": "t", **options}, streaming=True)
    with pytest.raises(ConfigError, match=r"'lingr\.ms' \(did you mean 'linger\.ms'"):
        parse_writer_options({**BOOT, "kafka.lingr.ms": "5"})


def test_group_options_report_streaming_queries_only() -> None:
    fixed = parse_reader_options({**BOOT, "subscribe": "t", "kafka.group.id": "g"}, streaming=True)
    assert fixed.group_id == "g" and "group.id" not in fixed.task_consumer_config()
    assert fixed.group_committer_config()["group.id"] == "g"
    assert fixed.group_committer_config()["enable.auto.commit"] is False
    prefixed = parse_reader_options(
        {**BOOT, "subscribe": "t", "groupIdPrefix": "p"}, streaming=True
    )
    assert prefixed.group_id is not None and prefixed.group_id.startswith("p-")
    assert parse_reader_options({**BOOT, "subscribe": "t"}, streaming=True).group_id is None
    for options, message in [
        ({"kafka.group.id": "g", "groupIdPrefix": "p"}, "only one of"),
        ({"kafka.group.id": " "}, "empty"),
        ({"fjord.group.id": "g"}, "kafka.group.id"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_reader_options({**BOOT, "subscribe": "t", **options}, streaming=True)
    with pytest.raises(ConfigError, match="streaming queries only"):
        parse_reader_options({**BOOT, "subscribe": "t", "kafka.group.id": "g"}, streaming=False)


def test_new_source_options_parse_with_sparks_rules() -> None:
    stream = parse_reader_options(
        {
            **BOOT,
            "subscribe": "t",
            "minOffsetsPerTrigger": "10",
            "maxOffsetsPerTrigger": "100",
            "maxTriggerDelay": "30s",
            "minPartitions": "8",
            "maxRecordsPerPartition": "1000",
            "startingOffsetsByTimestamp": json.dumps({"t": {"0": 5, "1": 7}}),
            "kafkaConsumer.pollTimeoutMs": "700",
        },
        streaming=True,
    )
    assert (stream.min_offsets_per_trigger, stream.max_trigger_delay_ms) == (10, 30_000)
    assert (stream.min_partitions, stream.max_records_per_partition) == (8, 1000)
    assert stream.starting_by_timestamp == {T0: 5, T1: 7} and stream.poll_timeout_ms == 700
    assert (
        parse_reader_options(
            {**BOOT, "subscribe": "t", "minOffsetsPerTrigger": "1"}, streaming=True
        ).max_trigger_delay_ms
        == defaults.MAX_TRIGGER_DELAY_MS
    )
    batch = parse_reader_options(
        {**BOOT, "subscribe": "t", "endingOffsetsByTimestamp": json.dumps({"t": {"0": 9}})},
        streaming=False,
    )
    assert batch.ending_by_timestamp == {T0: 9}
    assert (
        parse_reader_options(
            {**BOOT, "subscribe": "t", "endingTimestamp": "123"}, streaming=False
        ).ending_timestamp
        == 123
    )


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"minPartitions": "-1"}, False, "minPartitions: -1 is below 1"),
        ({"minPartitions": "0"}, True, "minPartitions: 0 is below 1"),
        ({"maxRecordsPerPartition": "0"}, False, "maxRecordsPerPartition: 0 is below 1"),
        ({"minOffsetsPerTrigger": "-5"}, True, "minOffsetsPerTrigger: -5 is below 1"),
        ({"minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "5"}, True, "above"),
        ({"maxTriggerDelay": "5m"}, True, "only applies with minOffsetsPerTrigger"),
        ({"minOffsetsPerTrigger": "1", "maxTriggerDelay": "soon"}, True, "duration"),
        ({"minOffsetsPerTrigger": "1", "maxTriggerDelay": "5 weeks"}, True, "duration"),
        ({"endingTimestamp": "-1"}, False, "endingTimestamp: -1 is below 0"),
        ({"endingTimestamp": "1"}, True, "batch queries only"),
        ({"endingOffsetsByTimestamp": '{"t": {"0": 1}}'}, True, "batch queries only"),
        ({"maxOffsetsPerTrigger": "5"}, False, "streaming queries only"),
        ({"startingOffsetsByTimestamp": '{"t": {"0": -1}}'}, True, "invalid timestamp"),
        ({"startingOffsetsByTimestamp": '{"t": {}}'}, True, "needs an object"),
        ({"startingOffsetsByTimestamp": "[]"}, True, "JSON object"),
        ({"startingTimestamp": "1", "startingOffsetsByTimestamp": '{"t": {"0": 1}}'}, True, "one"),
        ({"endingTimestamp": "1", "endingOffsetsByTimestamp": '{"t": {"0": 1}}'}, False, "one"),
        ({"pollTimeoutMs": "1", "kafkaConsumer.pollTimeoutMs": "2"}, True, "only one"),
    ],
)
def test_bad_new_source_options_name_the_problem(
    options: dict[str, str], streaming: bool, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_reader_options({**BOOT, "subscribe": "t", **options}, streaming=streaming)


def test_durations_are_sparks_time_strings() -> None:
    assert [parse_duration_ms("d", v) for v in ("15m", "30s", "250ms", "2h", "1d", "42")] == [
        900_000,
        30_000,
        250,
        7_200_000,
        86_400_000,
        42,
    ]


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


_RECORD = st.builds(
    ConsumerRecord,
    st.just("t"),
    st.just(0),
    st.integers(0, 2**62),
    st.one_of(st.none(), st.binary(max_size=40)),
    st.one_of(st.none(), st.binary(max_size=200)),
    st.just(()),
    st.integers(-(2**50), 2**50),
)


@pytest.mark.skipif(fjord_arrow._COLUMNS is None, reason="the C extension is not in use")
@given(st.lists(_RECORD, min_size=1, max_size=60))
def test_records_to_batch_in_c_equals_the_pyarrow_lists_path(
    records: list[ConsumerRecord],
) -> None:
    """The C column builders give the same batch as pyarrow from Python lists (null keys and
    values, empty bytes, negative timestamps)."""
    schema = arrow_schema(reader_schema(False))
    in_c = records_to_batch(records, schema, 0)
    from_lists = records_to_batch(tuple(records), schema, 0)  # not a list: the Python path
    assert in_c.equals(from_lists)
    assert in_c.column("key").to_pylist() == [r.key for r in records]
    assert in_c.column("value").to_pylist() == [r.value for r in records]


@pytest.mark.skipif(fjord_arrow._COLUMNS is None, reason="the C extension is not in use")
def test_c_column_builders_refuse_what_is_not_a_record_field() -> None:
    columns = fjord_arrow._COLUMNS
    assert columns is not None
    good = ConsumerRecord("t", 0, 1, b"k", b"v", (), 5)
    with pytest.raises(TypeError, match="not bytes or None"):
        columns.binary_column([good, good._replace(key="text")], 3)
    with pytest.raises(TypeError, match="must be a tuple with a field 9"):
        columns.binary_column([good], 9)
    with pytest.raises(TypeError, match="records must be a list"):
        columns.int64_column((good,), 2, 1)
    with pytest.raises(TypeError, match="not int"):
        columns.int64_column([good._replace(timestamp=1.5)], 6, 1000)
    with pytest.raises(OverflowError, match="leaves int64"):
        columns.int64_column([good._replace(timestamp=2**62)], 6, 1000)
    with pytest.raises(ValueError, match="index must be >= 0"):
        columns.int64_column([good], -1, 1)
    assert columns.binary_column([], 3) == (b"\0\0\0\0", b"", None, 0)


_FETCHED_RECORD = st.tuples(
    st.one_of(st.none(), st.binary(max_size=12)),
    st.one_of(st.none(), st.binary(max_size=60)),
    st.booleans(),  # with a header
)


@given(
    batches=st.lists(st.lists(_FETCHED_RECORD, min_size=1, max_size=8), min_size=1, max_size=4),
    min_offset=st.integers(0, 12),
    until=st.integers(0, 40),
    log_append=st.booleans(),
    lz4=st.booleans(),
)
def test_arrow_columns_equal_records_to_batch(
    batches: list[list[tuple[bytes | None, bytes | None, bool]]],
    min_offset: int,
    until: int,
    log_append: bool,
    lz4: bool,
) -> None:
    """A read task's ArrowColumns (fetched batches decoded straight into Arrow buffers with
    the C extension; ConsumerRecords converted by records_to_batch without it) give the
    batch that records_to_batch gives for the same records below ``until``: null keys and
    values, records with headers (left to the records path), LogAppendTime, compression."""
    timestamp_type = 1 if log_append else 0
    schema = arrow_schema(reader_schema(False))
    columns = ArrowColumns(schema, "t", 3, timestamp_type)
    expected: list[ConsumerRecord] = []
    base = 0
    for records in batches:
        builder = BatchBuilder(
            compression=Compression.LZ4 if lz4 else Compression.NONE,
            timestamp_type=(
                TimestampType.LOG_APPEND_TIME if log_append else TimestampType.CREATE_TIME
            ),
        )
        for i, (key, value, header) in enumerate(records):
            builder.append(1_000 + base + i, key, value, (("h", b"x"),) if header else ())
        raw = bytearray(builder.build())
        stamp_batch(raw, 0, base, 0)
        batch = RecordBatch(bytes(raw))
        decoded = batch.records_as(ConsumerRecord, "t", 3, min_offset)
        assert columns.add_batch(batch, "t", 3, min_offset) == len(decoded)
        expected.extend(decoded)
        base += len(records)
    assert columns.rows == len(expected)
    got = columns.take(until)
    below = tuple(r for r in expected if r.offset < until)
    if not below:
        assert got is None
    else:
        assert got is not None and got.equals(records_to_batch(below, schema, timestamp_type))
    assert columns.rows == 0 and columns.take(until) is None


def test_batch_to_groups_splits_by_topic_and_partition_keeping_order() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "key": pa.array(["a", None, "c", "d"], pa.string()),
            "value": pa.array([b"1", b"2", None, b"4"], pa.binary()),
            "topic": ["x", "y", "x", "x"],
            "partition": pa.array([0, 1, 1, 0], pa.int32()),
        }
    )
    assert batch_to_groups(batch, None) == [
        ("x", 0, [b"a", b"d"], [b"1", b"4"]),
        ("x", 1, [b"c"], [None]),
        ("y", 1, None, [b"2"]),  # (a group whose keys are all null: no keys)
    ]
    # The topic option wins over the column; no partition column: the producer's partitioner.
    plain = batch.drop_columns(["partition"])
    assert batch_to_groups(plain, "out") == [
        ("out", None, [b"a", None, b"c", b"d"], [b"1", b"2", None, b"4"])
    ]
    # All keys null: no keys; an all-null partition column: the partitioner.
    no_keys = pa.RecordBatch.from_pydict(
        {
            "key": pa.array([None, None], pa.binary()),
            "value": pa.array(["s", "t"], pa.string()),
            "partition": pa.array([None, None], pa.int32()),
            "headers": pa.array([None, []], pa.list_(fjord_arrow.arrow_schema(
                reader_schema(True)).field("headers").type.value_type)),
        }
    )  # fmt: skip
    assert batch_to_groups(no_keys, "out") == [("out", None, None, [b"s", b"t"])]


def test_batch_to_groups_leaves_headers_and_mixed_partitions_to_the_row_path() -> None:
    header_type = fjord_arrow.arrow_schema(reader_schema(True)).field("headers").type
    with_headers = pa.RecordBatch.from_pydict(
        {
            "value": pa.array([b"1", b"2"]),
            "headers": pa.array([[], [{"key": "h", "value": b"v"}]], header_type),
        }
    )
    assert batch_to_groups(with_headers, "out") is None
    mixed = pa.RecordBatch.from_pydict(
        {"value": pa.array([b"1", b"2"]), "partition": pa.array([None, 2], pa.int32())}
    )
    assert batch_to_groups(mixed, "out") is None
    null_topic = pa.RecordBatch.from_pydict(
        {"value": pa.array([b"1"]), "topic": pa.array([None], pa.string())}
    )
    with pytest.raises(ConfigError, match="null topic"):
        batch_to_groups(null_topic, None)


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


# -- range splitting and trigger delay ------------------------------------------------------


def test_split_ranges_as_sparks_offset_range_calculator() -> None:
    big, small = OffsetRange(T0, 0, 1000), OffsetRange(T1, 0, 10)
    assert split_ranges([big, small], None, None) == [big, small]
    assert split_ranges([big, small], 2, None) == [big, small]  # enough already
    # minPartitions 4: T1 stays whole (round(10/1010*4) = 0 -> 1), T0 gets the other 3.
    assert split_ranges([big, small], 4, None) == [
        OffsetRange(T0, 0, 333),
        OffsetRange(T0, 333, 666),
        OffsetRange(T0, 666, 1000),
        small,
    ]
    assert split_ranges([OffsetRange(T0, 5, 15)], None, 4) == [
        OffsetRange(T0, 5, 8),
        OffsetRange(T0, 8, 11),
        OffsetRange(T0, 11, 15),
    ]
    assert split_ranges([OffsetRange(T0, 0, 0)], 3, None) == []


@given(
    st.lists(st.integers(0, 500), min_size=1, max_size=5),
    st.one_of(st.none(), st.integers(1, 40)),
    st.one_of(st.none(), st.integers(1, 200)),
)
def test_split_ranges_cover_exactly_the_records(
    sizes: list[int], min_partitions: int | None, max_records: int | None
) -> None:
    ranges = [OffsetRange(TopicPartition("t", i), 7 * i, 7 * i + n) for i, n in enumerate(sizes)]
    pieces = split_ranges(ranges, min_partitions, max_records)
    assert all(p.size > 0 for p in pieces)
    if max_records is not None:
        assert all(p.size <= max_records for p in pieces)
    for r in ranges:
        mine = [p for p in pieces if p.tp == r.tp]
        covered = [o for p in mine for o in range(p.from_offset, p.until_offset)]
        assert covered == list(range(r.from_offset, r.until_offset))  # no gap, overlap, reorder
    if min_partitions is not None and max_records is None:
        non_empty = sum(1 for r in ranges if r.size)
        total = sum(sizes)
        # As many pieces as asked for, give or take rounding, never fewer than before.
        assert non_empty <= len(pieces) <= max(non_empty, min(total, min_partitions + len(sizes)))


def test_trigger_delay_waits_for_min_records_or_max_delay() -> None:
    delay = TriggerDelay(min_records=100, max_delay_ms=30_000, now_ms=1_000)
    assert delay.should_wait(99, now_ms=2_000)
    assert not delay.should_wait(100, now_ms=3_000)  # enough: runs, and the clock restarts
    assert delay.should_wait(1, now_ms=32_999)
    assert not delay.should_wait(1, now_ms=33_000)  # waited maxTriggerDelay: runs anyway
    assert delay.should_wait(0, now_ms=33_001)
    with pytest.raises(ValueError):
        TriggerDelay(0, 1, 0)


def test_available_records_counts_only_forward() -> None:
    assert available_records({T0: 5, T1: 9}, {T0: 8, T1: 7, U0: 4}) == 3 + 0 + 4


@pytest.mark.parametrize(("text", "count"), [("orders", 3), ("", 2), ("töpic", 1), ("x", 0)])
def test_repeated_string_is_pa_repeat(text: str, count: int) -> None:
    built = fjord_arrow.repeated_string(text, count)
    assert built.equals(pa.repeat(pa.scalar(text, pa.string()), count))
    built.validate(full=True)


def test_the_offsets_process_imports_no_sink_or_sasl_machinery() -> None:
    """Spark starts a Python process for every streaming query's offsets, and it imports
    fjord_spark.source there (unpickling the data source): neither the sink's Arrow compute
    kernels nor the SCRAM library belong in that start-up."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import fjord_spark.source\n"
        "print(sorted(m for m in sys.modules if m in ('pyarrow.compute', 'scramp')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"
