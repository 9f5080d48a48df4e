"""Log collection and analysis (seed 000, scenario 2): services ship log lines to the ``logs``
topic; this job counts them per service and level in event-time windows and writes the counts to
the ``log-counts`` topic and to Parquet files for later analysis.

Line format (one record value = one line, UTF-8)::

    <timestamp> <LEVEL> <service> <message>
    2026-11-22T01:29:22.125Z ERROR checkout payment declined for order o-1001

- ``timestamp``: ISO-8601 with a zone (``Z`` or ``+02:00``); it is the event time of the line.
- ``LEVEL``: TRACE, DEBUG, INFO, WARN (or WARNING), ERROR, FATAL, in any case (counted upper-case,
  WARNING as WARN).
- ``service``: one word, the emitting service's name.
- ``message``: the rest, may be empty and may span lines (stack traces).

Fields are separated by spaces or tabs. Lines that do not fit go to ``logs.dlq`` unchanged, with a
reason header (UNPARSEABLE_LINE, INVALID_TIMESTAMP, UNKNOWN_LEVEL, or MISSING_VALUE).

Counts: tumbling windows of ``--window`` (default 1 minute) per (service, level); a window is
emitted once, when the watermark (latest event time seen minus ``--watermark``, default 2 minutes)
passes its end; lines later than that are not counted (Spark's watermark semantics). Each count is
written to ``log-counts`` keyed by service::

    {"window_start": "2026-11-22T01:29:00.000Z", "window_end": "2026-11-22T01:30:00.000Z",
     "service": "checkout", "level": "ERROR", "count": 3}

and to Parquet under ``--parquet-dir`` (columns window_start, window_end, service, level, count;
partitioned by ``date`` of the window start), with Spark's exactly-once file sink.

Run: ``python -m fjord_jobs.log_analysis --bootstrap-servers HOST:PORT --checkpoint DIR
--parquet-dir DIR [--available-now]``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from fjord.errors import ConfigError
from fjord_jobs.common import (
    MISSING_VALUE,
    REJECT_REASON,
    JobOptions,
    await_queries,
    base_arg_parser,
    build_session,
    checkpoint_path,
    dead_letters,
    iso_instant,
    job_options,
    parse_instant,
    read_topic,
    reject_when,
    with_trigger,
    write_topic,
)
from fjord_jobs.defaults import (
    DEFAULT_LOG_COUNTS_TOPIC,
    DEFAULT_LOG_WATERMARK,
    DEFAULT_LOG_WINDOW,
    DEFAULT_LOGS_DEAD_LETTER_TOPIC,
    DEFAULT_LOGS_TOPIC,
)

APP_NAME = "fjord-log-analysis"

LEVELS = ("TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL")
#: Spellings counted as another level.
LEVEL_ALIASES = {"WARNING": "WARN"}

# (?s): the message may contain newlines. Groups: timestamp, level, service, message.
LOG_LINE_PATTERN = r"(?s)^(\S+)[ \t]+(\S+)[ \t]+(\S+)(?:[ \t]+(.*))?$"

UNPARSEABLE_LINE = "UNPARSEABLE_LINE"
INVALID_TIMESTAMP = "INVALID_TIMESTAMP"
UNKNOWN_LEVEL = "UNKNOWN_LEVEL"

COUNT_COLUMNS = ("window_start", "window_end", "service", "level", "count")


def parse_log_lines(raw: DataFrame) -> DataFrame:
    """``raw`` plus ``event_time``, ``level``, ``service``, ``message`` parsed from ``value``
    (see the module docstring) and ``reject_reason`` (null for a good line)."""
    line = F.col("value").cast("string")
    level_text = F.upper(F.regexp_extract(line, LOG_LINE_PATTERN, 2))
    normalized = level_text
    for alias, canonical in LEVEL_ALIASES.items():
        normalized = F.when(level_text == alias, F.lit(canonical)).otherwise(normalized)
    parsed = raw.select(
        *raw.columns,
        parse_instant(F.regexp_extract(line, LOG_LINE_PATTERN, 1)).alias("event_time"),
        normalized.alias("level"),
        F.regexp_extract(line, LOG_LINE_PATTERN, 3).alias("service"),
        F.regexp_extract(line, LOG_LINE_PATTERN, 4).alias("message"),
        F.when(F.col("value").isNull(), F.lit(MISSING_VALUE))
        .when(~line.rlike(LOG_LINE_PATTERN), F.lit(UNPARSEABLE_LINE))
        .alias(REJECT_REASON),
    )
    parsed = reject_when(parsed, F.col("event_time").isNull(), INVALID_TIMESTAMP)
    return reject_when(parsed, ~F.col("level").isin(*LEVELS), UNKNOWN_LEVEL)


def count_by_service_and_level(
    parsed: DataFrame, window: str = DEFAULT_LOG_WINDOW, watermark: str = DEFAULT_LOG_WATERMARK
) -> DataFrame:
    """Counts of good lines per (window, service, level): columns :data:`COUNT_COLUMNS`.
    On a stream, a window is final (and emitted in append mode) once the watermark passes it."""
    good = parsed.where(F.col(REJECT_REASON).isNull())
    counts = (
        good.withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", window), "service", "level")
        .count()
    )
    return counts.select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "service",
        "level",
        "count",
    )


def count_records(counts: DataFrame, topic: str = DEFAULT_LOG_COUNTS_TOPIC) -> DataFrame:
    """Sink records (topic, key = service, value = the count as JSON)."""
    value = F.to_json(
        F.struct(
            iso_instant(F.col("window_start")).alias("window_start"),
            iso_instant(F.col("window_end")).alias("window_end"),
            "service",
            "level",
            "count",
        )
    )
    return counts.select(
        F.lit(topic).alias("topic"), F.col("service").alias("key"), value.alias("value")
    )


def parquet_rows(counts: DataFrame) -> DataFrame:
    """The counts as stored in Parquet: :data:`COUNT_COLUMNS` plus ``date`` (the partition)."""
    return counts.withColumn("date", F.to_date("window_start"))


def start(
    spark: SparkSession,
    options: JobOptions,
    parquet_dir: str,
    logs_topic: str = DEFAULT_LOGS_TOPIC,
    counts_topic: str = DEFAULT_LOG_COUNTS_TOPIC,
    dead_letter_topic: str = DEFAULT_LOGS_DEAD_LETTER_TOPIC,
    window: str = DEFAULT_LOG_WINDOW,
    watermark: str = DEFAULT_LOG_WATERMARK,
) -> list[StreamingQuery]:
    """Start the job's three queries (each with its own checkpoint, so each sink keeps its own
    guarantee): counts to the topic, counts to Parquet, rejected lines to the dead-letter topic."""

    def parsed() -> DataFrame:
        return parse_log_lines(read_topic(spark, logs_topic, options))

    counts_to_topic = write_topic(
        count_records(count_by_service_and_level(parsed(), window, watermark), counts_topic),
        options,
        f"{APP_NAME}-counts-topic",
        "counts-topic",
    )
    counts_to_parquet = with_trigger(
        parquet_rows(count_by_service_and_level(parsed(), window, watermark))
        .writeStream.format("parquet")
        .option("path", parquet_dir)
        .option("checkpointLocation", checkpoint_path(options, "counts-parquet"))
        .partitionBy("date")
        .outputMode("append")
        .queryName(f"{APP_NAME}-counts-parquet"),
        options,
    ).start()
    rejected = write_topic(
        dead_letters(parsed().where(F.col(REJECT_REASON).isNotNull()), dead_letter_topic),
        options,
        f"{APP_NAME}-dead-letters",
        "dead-letters",
    )
    return [counts_to_topic, counts_to_parquet, rejected]


def build_parser() -> argparse.ArgumentParser:
    """The command line of the job (shared options plus its own)."""
    parser = base_arg_parser(__doc__.splitlines()[0] if __doc__ else APP_NAME)
    parser.add_argument("--parquet-dir", required=True, help="where the counts are stored")
    parser.add_argument("--logs-topic", default=DEFAULT_LOGS_TOPIC)
    parser.add_argument("--counts-topic", default=DEFAULT_LOG_COUNTS_TOPIC)
    parser.add_argument("--dead-letter-topic", default=DEFAULT_LOGS_DEAD_LETTER_TOPIC)
    parser.add_argument("--window", default=DEFAULT_LOG_WINDOW, help="window length")
    parser.add_argument("--watermark", default=DEFAULT_LOG_WATERMARK, help="allowed lateness")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job until it stops (with --available-now) or fails; 0 on success."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        options = job_options(args)
    except ConfigError as exc:
        parser.error(str(exc))
    spark = build_session(APP_NAME, options.master)
    queries = start(
        spark,
        options,
        args.parquet_dir,
        args.logs_topic,
        args.counts_topic,
        args.dead_letter_topic,
        args.window,
        args.watermark,
    )
    await_queries(spark, queries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
