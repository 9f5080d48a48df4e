"""Risk control (seed 000, scenario 3): per-user transaction velocity over a sliding window, and
an alert when a user makes too many transactions or spends too much in one window.

Input, the ``transactions`` topic, one JSON object per record::

    {"txn_id": "t-1", "user_id": "u-7", "amount": 120.5, "ts": "2026-11-22T01:29:22Z"}

``txn_id``, ``user_id`` and ``amount`` (> 0) are required; ``ts`` (ISO-8601 with a zone) is the
event time, and the record's timestamp stands in when it is absent. Anything else goes to
``transactions.dlq`` unchanged with a reason header (INVALID_JSON, MISSING_FIELD, INVALID_AMOUNT,
INVALID_TIMESTAMP, MISSING_VALUE).

Velocity: for every user, windows of ``--window`` (N, default 10 minutes) starting every
``--slide`` (M, default 1 minute): the transaction count and the total amount. A window whose count
exceeds ``--max-transactions`` or whose total exceeds ``--max-amount`` becomes an alert on
``risk-alerts``, keyed by user::

    {"alert_id": "u-7@2026-11-22T01:20:00.000Z", "user_id": "u-7",
     "window_start": "2026-11-22T01:20:00.000Z", "window_end": "2026-11-22T01:30:00.000Z",
     "txn_count": 7, "total_amount": 1250.0,
     "reasons": ["TOO_MANY_TRANSACTIONS"], "max_transactions": 5, "max_amount": 10000.0}

With sliding windows one burst falls into up to N/M windows, so it can raise several alerts; they
differ in ``window_start`` and ``alert_id`` lets the consumer collapse them. Windows are emitted
when the watermark (latest event time minus ``--watermark``) passes their end (append mode), so
each alert is written once; ``--output-mode update`` instead alerts in the micro-batch where the
threshold is crossed and repeats the alert while the window keeps growing.

Run: ``python -m fjord_jobs.risk_control --bootstrap-servers HOST:PORT --checkpoint DIR
[--available-now]``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from fjord.errors import ConfigError
from fjord_jobs.common import (
    REJECT_REASON,
    JobOptions,
    await_queries,
    base_arg_parser,
    build_session,
    dead_letters,
    iso_instant,
    job_options,
    parse_instant,
    parse_json_value,
    read_topic,
    reject_when,
    write_topic,
)
from fjord_jobs.defaults import (
    DEFAULT_MAX_AMOUNT_PER_WINDOW,
    DEFAULT_MAX_TRANSACTIONS_PER_WINDOW,
    DEFAULT_RISK_ALERTS_TOPIC,
    DEFAULT_TRANSACTIONS_DEAD_LETTER_TOPIC,
    DEFAULT_TRANSACTIONS_TOPIC,
    DEFAULT_VELOCITY_SLIDE,
    DEFAULT_VELOCITY_WATERMARK,
    DEFAULT_VELOCITY_WINDOW,
)

APP_NAME = "fjord-risk-control"

TRANSACTION_SCHEMA = T.StructType(
    [
        T.StructField("txn_id", T.StringType()),
        T.StructField("user_id", T.StringType()),
        T.StructField("amount", T.DoubleType()),
        T.StructField("ts", T.StringType()),
    ]
)
REQUIRED_TRANSACTION_FIELDS = ("txn_id", "user_id", "amount")

INVALID_AMOUNT = "INVALID_AMOUNT"
INVALID_TIMESTAMP = "INVALID_TIMESTAMP"
#: Alert reasons.
TOO_MANY_TRANSACTIONS = "TOO_MANY_TRANSACTIONS"
AMOUNT_OVER_LIMIT = "AMOUNT_OVER_LIMIT"

VELOCITY_COLUMNS = ("user_id", "window_start", "window_end", "txn_count", "total_amount")
OUTPUT_MODES = ("append", "update")


@dataclass(frozen=True)
class VelocityRule:
    """The alert rule. Invariants: ``window`` and ``slide`` are Spark interval strings with
    ``slide`` no longer than ``window`` (checked by Spark when the plan is built); the limits are
    positive. A window alerts when ``txn_count > max_transactions`` or
    ``total_amount > max_amount``."""

    window: str = DEFAULT_VELOCITY_WINDOW
    slide: str = DEFAULT_VELOCITY_SLIDE
    watermark: str = DEFAULT_VELOCITY_WATERMARK
    max_transactions: int = DEFAULT_MAX_TRANSACTIONS_PER_WINDOW
    max_amount: float = DEFAULT_MAX_AMOUNT_PER_WINDOW

    def __post_init__(self) -> None:
        if self.max_transactions <= 0:
            raise ConfigError(f"--max-transactions must be positive, got {self.max_transactions}")
        if not self.max_amount > 0:
            raise ConfigError(f"--max-amount must be positive, got {self.max_amount}")


def parse_transactions(raw: DataFrame) -> DataFrame:
    """``raw`` plus the transaction fields, ``event_time`` (``ts``, else the record timestamp)
    and ``reject_reason`` (null for a good transaction)."""
    parsed = parse_json_value(raw, TRANSACTION_SCHEMA, REQUIRED_TRANSACTION_FIELDS)
    parsed = reject_when(parsed, ~(F.col("amount") > 0), INVALID_AMOUNT)
    event_time = F.when(F.col("ts").isNull(), F.col("timestamp")).otherwise(
        parse_instant(F.col("ts"))
    )
    parsed = parsed.withColumn("event_time", event_time)
    return reject_when(parsed, F.col("event_time").isNull(), INVALID_TIMESTAMP)


def velocity(transactions: DataFrame, rule: VelocityRule) -> DataFrame:
    """Count and total amount per user per sliding window (columns :data:`VELOCITY_COLUMNS`) of
    the good transactions."""
    good = transactions.where(F.col(REJECT_REASON).isNull())
    per_window = (
        good.withWatermark("event_time", rule.watermark)
        .groupBy(F.window("event_time", rule.window, rule.slide), "user_id")
        .agg(F.count(F.lit(1)).alias("txn_count"), F.sum("amount").alias("total_amount"))
    )
    return per_window.select(
        "user_id",
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "txn_count",
        "total_amount",
    )


def alerts(velocities: DataFrame, rule: VelocityRule) -> DataFrame:
    """The windows that break the rule, with ``reasons`` (array of TOO_MANY_TRANSACTIONS,
    AMOUNT_OVER_LIMIT, in that order)."""
    too_many = F.col("txn_count") > F.lit(rule.max_transactions)
    too_much = F.col("total_amount") > F.lit(float(rule.max_amount))
    reasons = F.filter(
        F.array(
            F.when(too_many, F.lit(TOO_MANY_TRANSACTIONS)),
            F.when(too_much, F.lit(AMOUNT_OVER_LIMIT)),
        ),
        lambda reason: reason.isNotNull(),
    )
    return velocities.where(too_many | too_much).withColumn("reasons", reasons)


def alert_records(flagged: DataFrame, rule: VelocityRule, topic: str) -> DataFrame:
    """Sink records (topic, key = user_id, value = the alert as JSON, see the module docstring)."""
    window_start = iso_instant(F.col("window_start"))
    value = F.to_json(
        F.struct(
            F.concat(F.col("user_id"), F.lit("@"), window_start).alias("alert_id"),
            "user_id",
            window_start.alias("window_start"),
            iso_instant(F.col("window_end")).alias("window_end"),
            "txn_count",
            "total_amount",
            "reasons",
            F.lit(rule.max_transactions).alias("max_transactions"),
            F.lit(float(rule.max_amount)).alias("max_amount"),
        )
    )
    return flagged.select(
        F.lit(topic).alias("topic"), F.col("user_id").alias("key"), value.alias("value")
    )


def start(
    spark: SparkSession,
    options: JobOptions,
    rule: VelocityRule,
    transactions_topic: str = DEFAULT_TRANSACTIONS_TOPIC,
    alerts_topic: str = DEFAULT_RISK_ALERTS_TOPIC,
    dead_letter_topic: str = DEFAULT_TRANSACTIONS_DEAD_LETTER_TOPIC,
    output_mode: str = "append",
) -> list[StreamingQuery]:
    """Start the alert query and the dead-letter query (separate checkpoints)."""
    if output_mode not in OUTPUT_MODES:
        raise ConfigError(f"--output-mode must be one of {OUTPUT_MODES}, got {output_mode!r}")

    def parsed() -> DataFrame:
        return parse_transactions(read_topic(spark, transactions_topic, options))

    flagged = alerts(velocity(parsed(), rule), rule)
    alert_query = write_topic(
        alert_records(flagged, rule, alerts_topic),
        options,
        f"{APP_NAME}-alerts",
        "alerts",
        output_mode,
    )
    rejected = write_topic(
        dead_letters(parsed().where(F.col(REJECT_REASON).isNotNull()), dead_letter_topic),
        options,
        f"{APP_NAME}-dead-letters",
        "dead-letters",
    )
    return [alert_query, rejected]


def build_parser() -> argparse.ArgumentParser:
    """The command line of the job (shared options plus its own)."""
    parser = base_arg_parser(__doc__.splitlines()[0] if __doc__ else APP_NAME)
    parser.add_argument("--transactions-topic", default=DEFAULT_TRANSACTIONS_TOPIC)
    parser.add_argument("--alerts-topic", default=DEFAULT_RISK_ALERTS_TOPIC)
    parser.add_argument("--dead-letter-topic", default=DEFAULT_TRANSACTIONS_DEAD_LETTER_TOPIC)
    parser.add_argument("--window", default=DEFAULT_VELOCITY_WINDOW, help="window length N")
    parser.add_argument("--slide", default=DEFAULT_VELOCITY_SLIDE, help="window slide M")
    parser.add_argument("--watermark", default=DEFAULT_VELOCITY_WATERMARK)
    parser.add_argument("--max-transactions", type=int, default=DEFAULT_MAX_TRANSACTIONS_PER_WINDOW)
    parser.add_argument("--max-amount", type=float, default=DEFAULT_MAX_AMOUNT_PER_WINDOW)
    parser.add_argument("--output-mode", choices=OUTPUT_MODES, default="append")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job until it stops (with --available-now) or fails; 0 on success."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        options = job_options(args)
        rule = VelocityRule(
            args.window, args.slide, args.watermark, args.max_transactions, args.max_amount
        )
    except ConfigError as exc:
        parser.error(str(exc))
    spark = build_session(APP_NAME, options.master)
    queries = start(
        spark,
        options,
        rule,
        args.transactions_topic,
        args.alerts_topic,
        args.dead_letter_topic,
        args.output_mode,
    )
    await_queries(spark, queries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
