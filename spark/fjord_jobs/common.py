"""What every Fjord Spark job shares: options, the session, JSON parsing with reject reasons,
dead-letter records, and reading/writing topics through the ``fjord`` data source.

The transformation helpers are pure (DataFrame in, DataFrame out, no I/O); only
:func:`build_session`, :func:`read_topic` and :func:`write_topic` touch Spark's runtime.

Record layout on both sides follows Spark's Kafka source and sink (the ``fjord`` format keeps
those columns): reading yields ``key``, ``value`` (binary), ``topic``, ``partition``, ``offset``,
``timestamp``, ...; writing takes ``key`` and ``value`` (string or binary), an optional ``topic``
column that routes each row (so one query can write results and dead letters), and optional
``headers`` (``array<struct<key: string, value: binary>>``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from fjord.config import CONSUMER_CONFIG, PRODUCER_CONFIG
from fjord.errors import ConfigError
from fjord.security.config import ClientSecurity, parse_properties
from fjord_jobs.defaults import (
    DEFAULT_BOOTSTRAP_SERVERS,
    DEFAULT_LOCAL_MASTER,
    DEFAULT_MAX_OFFSETS_PER_TRIGGER,
    DEFAULT_STARTING_OFFSETS,
    DEFAULT_TRIGGER_INTERVAL,
    REJECT_REASON_HEADER,
)

#: The data source's format name (registered by ``fjord_spark.register``).
FJORD_FORMAT = "fjord"
#: Option prefix the data source passes to the Fjord client (Spark's Kafka source's ``kafka.``).
CLIENT_OPTION_PREFIX = "kafka."
#: Keys a ``--command-config`` file may set: the settings every client of a job shares (the
#: source's consumers and the sink's producers: security, client.id, timeouts). A producer- or
#: consumer-only key would be refused by the other side's data source, so it is refused here,
#: at start, naming the file. ``bootstrap.servers`` is taken when ``--bootstrap-servers`` is not
#: given.
COMMAND_CONFIG_KEYS = frozenset(CONSUMER_CONFIG) & frozenset(PRODUCER_CONFIG)
#: Column holding why a row was rejected (null for rows that are fine).
REJECT_REASON = "reject_reason"
#: Internal column of ``from_json``'s corrupt-record mode.
_CORRUPT = "_corrupt_record"
#: ISO-8601 with the zone offset ("Z" in UTC), so strings mean the same instant in every zone.
ISO_INSTANT_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"

#: Reject reasons shared by the jobs (each job adds its own).
MISSING_VALUE = "MISSING_VALUE"
INVALID_JSON = "INVALID_JSON"
MISSING_FIELD = "MISSING_FIELD"


@dataclass(frozen=True)
class JobOptions:
    """What every job is told on its command line.

    Invariants: ``bootstrap_servers`` and ``checkpoint`` are non-empty; ``max_offsets_per_trigger``
    is positive; with ``available_now`` the job processes what is in its input topics when it
    starts and stops, otherwise it runs micro-batches every ``trigger_interval`` until stopped.
    """

    bootstrap_servers: str
    checkpoint: str
    available_now: bool = False
    starting_offsets: str = DEFAULT_STARTING_OFFSETS
    max_offsets_per_trigger: int = DEFAULT_MAX_OFFSETS_PER_TRIGGER
    trigger_interval: str = DEFAULT_TRIGGER_INTERVAL
    master: str | None = None
    #: Client properties (Kafka's names, e.g. ``security.protocol``, ``ssl.*``, ``sasl.*``)
    #: passed to every source and sink of the job as ``kafka.<key>``; from ``--command-config``.
    client_properties: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise ConfigError("--bootstrap-servers must name at least one host:port")
        if not self.checkpoint.strip():
            raise ConfigError("--checkpoint must name a directory")
        if self.max_offsets_per_trigger <= 0:
            raise ConfigError(
                f"--max-offsets-per-trigger must be positive, got {self.max_offsets_per_trigger}"
            )


def base_arg_parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options of :class:`JobOptions`; jobs add their own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--bootstrap-servers",
        default=None,
        help="Fjord brokers, host:port[,host:port...] (default: bootstrap.servers of "
        f"--command-config, else {DEFAULT_BOOTSTRAP_SERVERS})",
    )
    parser.add_argument(
        "--command-config",
        default=None,
        metavar="FILE",
        help="client properties file, as Kafka's tools take it (security.protocol, ssl.*, "
        "sasl.*; e.g. the client.properties of a FjordUser's Secret): each key reaches every "
        "source and sink of the job as kafka.<key>",
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="checkpoint directory (offsets and state; a restart resumes from it)",
    )
    parser.add_argument(
        "--available-now",
        action="store_true",
        help="process what the input topics hold now, then stop (Trigger.AvailableNow)",
    )
    parser.add_argument(
        "--starting-offsets",
        default=DEFAULT_STARTING_OFFSETS,
        help=f"earliest, latest or JSON, first run only (default {DEFAULT_STARTING_OFFSETS})",
    )
    parser.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        default=DEFAULT_MAX_OFFSETS_PER_TRIGGER,
        help=f"records per micro-batch at most (default {DEFAULT_MAX_OFFSETS_PER_TRIGGER})",
    )
    parser.add_argument(
        "--trigger-interval",
        default=DEFAULT_TRIGGER_INTERVAL,
        help=f"micro-batch interval without --available-now (default {DEFAULT_TRIGGER_INTERVAL})",
    )
    parser.add_argument(
        "--master",
        default=None,
        help=f"Spark master when not set by spark-submit (default {DEFAULT_LOCAL_MASTER})",
    )
    return parser


def read_command_config(path: str) -> dict[str, str]:
    """The client properties of a ``--command-config`` file (Kafka's properties syntax).

    Raises ConfigError naming the file when it cannot be read, a line is not ``key=value``, a
    key is not in :data:`COMMAND_CONFIG_KEYS`, or the security settings do not fit together
    (e.g. ``security.protocol=SASL_SSL`` without ``sasl.username``)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--command-config: cannot read {path}: {exc.strerror or exc}") from None
    properties = parse_properties(text, path)
    for key in sorted(properties):
        if key not in COMMAND_CONFIG_KEYS:
            raise ConfigError(
                f"--command-config {path}: {key!r} is not a setting every client of the job "
                f"takes (known: {', '.join(sorted(COMMAND_CONFIG_KEYS))})"
            )
    try:
        ClientSecurity.from_config(properties)
    except ConfigError as exc:
        raise ConfigError(f"--command-config {path}: {exc}") from None
    return properties


def job_options(args: argparse.Namespace) -> JobOptions:
    """The shared options out of parsed arguments (raises ConfigError on bad values).
    ``--bootstrap-servers`` wins over the ``bootstrap.servers`` of ``--command-config``."""
    properties = read_command_config(args.command_config) if args.command_config else {}
    file_bootstrap = properties.pop("bootstrap.servers", None)
    return JobOptions(
        bootstrap_servers=args.bootstrap_servers or file_bootstrap or DEFAULT_BOOTSTRAP_SERVERS,
        checkpoint=args.checkpoint,
        available_now=args.available_now,
        starting_offsets=args.starting_offsets,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        trigger_interval=args.trigger_interval,
        master=args.master,
        client_properties=properties,
    )


def build_session(app_name: str, master: str | None = None) -> SparkSession:
    """The job's SparkSession with the ``fjord`` format registered (Java checked first).

    The master is, in order: ``master``, what ``spark-submit`` set (it launches the driver with
    ``PYSPARK_GATEWAY_PORT`` in the environment), ``DEFAULT_LOCAL_MASTER``. The session time
    zone is UTC so windows and printed timestamps read the same on every machine.
    """
    import fjord_spark

    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = DEFAULT_LOCAL_MASTER
    return fjord_spark.create_session(app_name, master, {"spark.sql.session.timeZone": "UTC"})


def read_topic(
    spark: SparkSession, topic: str, options: JobOptions, read_committed: bool = False
) -> DataFrame:
    """A streaming DataFrame of ``topic``'s records (the Kafka source's columns);
    ``read_committed``: only records of committed transactions (for transactional input)."""
    isolation = "read_committed" if read_committed else "read_uncommitted"
    return (
        spark.readStream.format(FJORD_FORMAT)
        .options(**client_options(options))
        .option(f"{CLIENT_OPTION_PREFIX}isolation.level", isolation)
        .option("subscribe", topic)
        .option("startingOffsets", options.starting_offsets)
        .option("maxOffsetsPerTrigger", str(options.max_offsets_per_trigger))
        .load()
    )


def write_topic(
    records: DataFrame,
    options: JobOptions,
    query_name: str,
    checkpoint_subdir: str,
    output_mode: str = "append",
    exactly_once: bool = False,
) -> StreamingQuery:
    """Start a query writing ``records`` (topic, key, value[, headers]) to Fjord topics;
    ``exactly_once``: the sink's transactional mode (each micro-batch committed once, read it
    with read_committed)."""
    writer = (
        records.writeStream.format(FJORD_FORMAT)
        .options(**client_options(options))
        .option("exactlyOnce", str(exactly_once).lower())
        .option("checkpointLocation", checkpoint_path(options, checkpoint_subdir))
        .outputMode(output_mode)
        .queryName(query_name)
    )
    return with_trigger(writer, options).start()


def client_options(options: JobOptions) -> dict[str, str]:
    """The data source options every source and sink of the job gets: the client properties
    and the bootstrap servers, as Spark's Kafka source spells them (``kafka.<key>``)."""
    out = {f"{CLIENT_OPTION_PREFIX}{k}": v for k, v in options.client_properties.items()}
    out[f"{CLIENT_OPTION_PREFIX}bootstrap.servers"] = options.bootstrap_servers
    return out


def checkpoint_path(options: JobOptions, subdir: str) -> str:
    """One checkpoint directory per query, under the job's ``--checkpoint``."""
    return f"{options.checkpoint.rstrip('/')}/{subdir}"


def with_trigger(writer: DataStreamWriter, options: JobOptions) -> DataStreamWriter:
    """AvailableNow (process the backlog, stop) or a processing-time trigger."""
    if options.available_now:
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=options.trigger_interval)


def await_queries(spark: SparkSession, queries: Sequence[StreamingQuery]) -> None:
    """Wait until every query has stopped (with AvailableNow: processed the backlog). When one
    fails, the others are stopped and its StreamingQueryException is raised: a job never goes on
    half-running."""
    try:
        while any(query.isActive for query in queries):
            spark.streams.awaitAnyTermination()
            spark.streams.resetTerminated()
    except Exception:
        for query in queries:
            if query.isActive:
                query.stop()
        raise
    for query in queries:
        failure = query.exception()
        if failure is not None:
            raise failure


def parse_json_value(raw: DataFrame, schema: T.StructType, required: Sequence[str]) -> DataFrame:
    """``raw``'s columns plus the fields of ``schema`` parsed from ``value`` (JSON objects), and
    :data:`REJECT_REASON`: MISSING_VALUE (null value), INVALID_JSON (not a JSON object, or a field
    of the wrong type), MISSING_FIELD (a ``required`` field is absent or null), else null.

    Unknown JSON fields are ignored (producers may add fields without breaking the job).
    """
    missing = [name for name in required if name not in schema.fieldNames()]
    if missing:
        raise ConfigError(f"required fields {missing} are not in the schema")
    with_corrupt = T.StructType([*schema.fields, T.StructField(_CORRUPT, T.StringType())])
    parsed = raw.withColumn(
        "_parsed",
        F.from_json(
            F.col("value").cast("string"),
            with_corrupt,
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT},
        ),
    )
    any_required_missing = F.lit(False)
    for name in required:
        any_required_missing = any_required_missing | F.col(f"_parsed.{name}").isNull()
    reason = (
        F.when(F.col("value").isNull(), F.lit(MISSING_VALUE))
        .when(F.col("_parsed").isNull(), F.lit(INVALID_JSON))
        .when(F.col(f"_parsed.{_CORRUPT}").isNotNull(), F.lit(INVALID_JSON))
        .when(any_required_missing, F.lit(MISSING_FIELD))
    )
    fields = [F.col(f"_parsed.{name}").alias(name) for name in schema.fieldNames()]
    return parsed.select(*raw.columns, *fields, reason.alias(REJECT_REASON))


def reject_when(frame: DataFrame, condition: Column, reason: str) -> DataFrame:
    """Set :data:`REJECT_REASON` to ``reason`` where ``condition`` holds and no earlier reason
    was set (the first reason found wins)."""
    return frame.withColumn(
        REJECT_REASON,
        F.when(F.col(REJECT_REASON).isNull() & condition, F.lit(reason)).otherwise(
            F.col(REJECT_REASON)
        ),
    )


def dead_letters(rejected: DataFrame, topic: str) -> DataFrame:
    """Records for the dead-letter ``topic``: the input's key and value byte for byte, and a
    header :data:`REJECT_REASON_HEADER` carrying the reason (plus the source position)."""
    source = F.concat_ws(
        ":", F.col("topic"), F.col("partition").cast("string"), F.col("offset").cast("string")
    )
    return rejected.select(
        F.lit(topic).alias("topic"),
        F.col("key"),
        F.col("value"),
        F.array(
            header(REJECT_REASON_HEADER, F.col(REJECT_REASON)),
            header("fjord.reject.source", source),
        ).alias("headers"),
    )


def header(name: str, value: Column) -> Column:
    """One record header (Spark's Kafka sink layout: key string, value binary)."""
    return F.struct(F.lit(name).alias("key"), value.cast("binary").alias("value"))


def iso_instant(column: Column) -> Column:
    """A timestamp as ISO-8601 text with its zone offset (see :data:`ISO_INSTANT_FORMAT`)."""
    return F.date_format(column, ISO_INSTANT_FORMAT)


def parse_instant(column: Column) -> Column:
    """ISO-8601 text (with ``Z`` or an offset) to a timestamp; null when unparseable (never an
    error, so one bad row cannot fail a query under ANSI mode)."""
    return F.try_to_timestamp(column)
