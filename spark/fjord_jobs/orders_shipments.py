"""Orders -> shipments: the order service and the shipping service decoupled through the log
(seed 000, scenario 1).

The order service writes each order to the ``orders`` topic as a JSON object::

    {"order_id": "o-1001", "user_id": "u-7", "sku": "SKU-BOOK", "qty": 2, ...}

(``order_id``, ``user_id``, ``sku`` and ``qty`` are required; ``created_at`` is optional; other
fields are ignored). This job joins each order with the warehouse table (which warehouse stocks a
sku, which carrier ships from there, in how many days) and writes one shipment per order to
``shipments``, keyed by ``order_id`` (so every event of an order lands in one partition, in
order)::

    {"shipment_id": "shp-o-1001", "order_id": "o-1001", "user_id": "u-7", "sku": "SKU-BOOK",
     "qty": 2, "warehouse": "WH-NORTH", "carrier": "DHL", "promised_days": 2,
     "status": "READY_TO_SHIP", "created_at": null,
     "source": {"topic": "orders", "partition": 0, "offset": 41}}

The job writes with the sink's exactly-once mode (one transaction per micro-batch and write
task, docs/spark.md) and reads ``orders`` with ``read_committed`` (an order service writing
transactionally has its aborted orders skipped; plain orders read as before): consumers of
``shipments`` and ``orders.dlq`` that read with ``isolation.level=read_committed`` see every
order's output exactly once, also across a crash and restart of the driver. ``shipment_id`` is
derived from the order id all the same, so a read_uncommitted reader (which may see an aborted
attempt's records) can drop duplicates. Orders that cannot ship
(bad JSON, a missing field, ``qty`` < 1, a sku no warehouse stocks) go to ``orders.dlq`` byte for
byte with a reason header; nothing is dropped.

Run: ``python -m fjord_jobs.orders_shipments --bootstrap-servers HOST:PORT --checkpoint DIR
[--available-now] [--warehouses FILE.csv]``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from pathlib import Path

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
    job_options,
    parse_json_value,
    read_topic,
    reject_when,
    write_topic,
)
from fjord_jobs.defaults import (
    DEFAULT_ORDERS_DEAD_LETTER_TOPIC,
    DEFAULT_ORDERS_TOPIC,
    DEFAULT_SHIPMENTS_TOPIC,
)

APP_NAME = "fjord-orders-shipments"

ORDER_SCHEMA = T.StructType(
    [
        T.StructField("order_id", T.StringType()),
        T.StructField("user_id", T.StringType()),
        T.StructField("sku", T.StringType()),
        T.StructField("qty", T.IntegerType()),
        T.StructField("created_at", T.StringType()),
    ]
)
REQUIRED_ORDER_FIELDS = ("order_id", "user_id", "sku", "qty")

# Every column nullable on purpose: the table is the right side of a left join, and Spark 4.3
# mis-evaluates null checks on a non-nullable right-side column after an outer join.
WAREHOUSE_SCHEMA = T.StructType(
    [
        T.StructField("sku", T.StringType()),
        T.StructField("warehouse", T.StringType()),
        T.StructField("carrier", T.StringType()),
        T.StructField("promised_days", T.IntegerType()),
    ]
)

#: The reference table shipped with the job (replace it with ``--warehouses FILE.csv``, columns
#: sku,warehouse,carrier,promised_days with a header line).
DEFAULT_WAREHOUSES: tuple[tuple[str, str, str, int], ...] = (
    ("SKU-BOOK", "WH-NORTH", "DHL", 2),
    ("SKU-LAMP", "WH-NORTH", "DHL", 3),
    ("SKU-PHONE", "WH-SOUTH", "UPS", 1),
    ("SKU-LAPTOP", "WH-SOUTH", "UPS", 2),
    ("SKU-CHAIR", "WH-WEST", "FEDEX", 5),
    ("SKU-DESK", "WH-WEST", "FEDEX", 7),
)

SHIPMENT_STATUS = "READY_TO_SHIP"
SHIPMENT_ID_PREFIX = "shp-"

#: Reject reasons of this job (besides common's MISSING_VALUE, INVALID_JSON, MISSING_FIELD).
INVALID_QUANTITY = "INVALID_QUANTITY"
UNKNOWN_SKU = "UNKNOWN_SKU"


def read_warehouses_csv(path: str | Path) -> list[tuple[str, str, str, int]]:
    """Rows of a warehouse CSV (header ``sku,warehouse,carrier,promised_days``).

    Raises ConfigError naming the file and line for a missing column, an empty field, a
    ``promised_days`` that is not a non-negative integer, or a sku listed twice (which would ship
    an order twice).
    """
    path = Path(path)
    expected = WAREHOUSE_SCHEMA.fieldNames()
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames is None or sorted(reader.fieldnames) != sorted(expected):
                raise ConfigError(
                    f"{path}: header must be {','.join(expected)}, got {reader.fieldnames}"
                )
            rows = [_warehouse_row(path, reader.line_num, line) for line in reader]
    except OSError as exc:
        raise ConfigError(f"cannot read warehouse table {path}: {exc}") from exc
    validate_warehouses(rows, str(path))
    return rows


def _warehouse_row(path: Path, line: int, fields: dict[str, str]) -> tuple[str, str, str, int]:
    values = {name: (fields.get(name) or "").strip() for name in WAREHOUSE_SCHEMA.fieldNames()}
    empty = [name for name, value in values.items() if not value]
    if empty:
        raise ConfigError(f"{path}:{line}: empty field(s) {empty}")
    days = values["promised_days"]
    if not (days.isascii() and days.isdigit()):
        raise ConfigError(f"{path}:{line}: promised_days must be an integer >= 0, got {days!r}")
    return (values["sku"], values["warehouse"], values["carrier"], int(days))


def validate_warehouses(rows: Sequence[tuple[str, str, str, int]], origin: str) -> None:
    """ConfigError unless every sku appears once and the table is not empty."""
    if not rows:
        raise ConfigError(f"{origin}: the warehouse table is empty")
    seen: set[str] = set()
    for sku, *_ in rows:
        if sku in seen:
            raise ConfigError(f"{origin}: sku {sku!r} is listed twice")
        seen.add(sku)


def warehouses_frame(
    spark: SparkSession, rows: Sequence[tuple[str, str, str, int]] = DEFAULT_WAREHOUSES
) -> DataFrame:
    """The warehouse table as a DataFrame (sku, warehouse, carrier, promised_days)."""
    validate_warehouses(rows, "warehouse table")
    return spark.createDataFrame(list(rows), WAREHOUSE_SCHEMA)


def parse_orders(raw: DataFrame) -> DataFrame:
    """``raw`` (the source's columns) plus the order fields and ``reject_reason``
    (see :func:`fjord_jobs.common.parse_json_value`; INVALID_QUANTITY when ``qty`` < 1)."""
    parsed = parse_json_value(raw, ORDER_SCHEMA, REQUIRED_ORDER_FIELDS)
    return reject_when(parsed, F.col("qty") < 1, INVALID_QUANTITY)


def plan_shipments(orders: DataFrame, warehouses: DataFrame) -> DataFrame:
    """Parsed orders joined with the warehouse table: every order once, with ``warehouse``,
    ``carrier`` and ``promised_days`` (null for a sku no warehouse stocks, which is then rejected
    as UNKNOWN_SKU). The warehouse table is small: it is broadcast, and each micro-batch of a
    stream joins against it without shuffling the orders."""
    joined = orders.join(F.broadcast(warehouses), on="sku", how="left")
    return reject_when(joined, F.col("warehouse").isNull(), UNKNOWN_SKU)


def shipment_records(planned: DataFrame, shipments_topic: str) -> DataFrame:
    """Sink records (topic, key, value) of the orders that ship: key = order_id, value = the
    shipment as JSON (see the module docstring)."""
    shipment = F.struct(
        F.concat(F.lit(SHIPMENT_ID_PREFIX), F.col("order_id")).alias("shipment_id"),
        F.col("order_id"),
        F.col("user_id"),
        F.col("sku"),
        F.col("qty"),
        F.col("warehouse"),
        F.col("carrier"),
        F.col("promised_days"),
        F.lit(SHIPMENT_STATUS).alias("status"),
        F.col("created_at"),
        F.struct(
            F.col("topic").alias("topic"),
            F.col("partition").alias("partition"),
            F.col("offset").alias("offset"),
        ).alias("source"),
    )
    return planned.where(F.col(REJECT_REASON).isNull()).select(
        F.lit(shipments_topic).alias("topic"),
        F.col("order_id").alias("key"),
        F.to_json(shipment, {"ignoreNullFields": "false"}).alias("value"),
    )


def output_records(
    raw: DataFrame,
    warehouses: DataFrame,
    shipments_topic: str = DEFAULT_SHIPMENTS_TOPIC,
    dead_letter_topic: str = DEFAULT_ORDERS_DEAD_LETTER_TOPIC,
) -> DataFrame:
    """The whole job as one transformation: raw order records in; shipments and dead letters out
    as sink records (topic, key, value, headers), so one query writes both and every input record
    yields exactly one output record."""
    planned = plan_shipments(parse_orders(raw), warehouses)
    shipments = shipment_records(planned, shipments_topic).select(
        "topic",
        F.col("key").cast("binary").alias("key"),
        F.col("value").cast("binary").alias("value"),
        F.lit(None).cast("array<struct<key:string,value:binary>>").alias("headers"),
    )
    rejected = dead_letters(planned.where(F.col(REJECT_REASON).isNotNull()), dead_letter_topic)
    return shipments.unionByName(rejected)


def start(
    spark: SparkSession,
    options: JobOptions,
    warehouses: DataFrame,
    orders_topic: str = DEFAULT_ORDERS_TOPIC,
    shipments_topic: str = DEFAULT_SHIPMENTS_TOPIC,
    dead_letter_topic: str = DEFAULT_ORDERS_DEAD_LETTER_TOPIC,
) -> StreamingQuery:
    """Start the streaming query (one query: shipments and dead letters share a checkpoint)."""
    raw = read_topic(spark, orders_topic, options, read_committed=True)
    records = output_records(raw, warehouses, shipments_topic, dead_letter_topic)
    return write_topic(records, options, APP_NAME, "orders-shipments", exactly_once=True)


def build_parser() -> argparse.ArgumentParser:
    """The command line of the job (shared options plus its own)."""
    parser = base_arg_parser(__doc__.splitlines()[0] if __doc__ else APP_NAME)
    parser.add_argument("--orders-topic", default=DEFAULT_ORDERS_TOPIC)
    parser.add_argument("--shipments-topic", default=DEFAULT_SHIPMENTS_TOPIC)
    parser.add_argument("--dead-letter-topic", default=DEFAULT_ORDERS_DEAD_LETTER_TOPIC)
    parser.add_argument(
        "--warehouses",
        default=None,
        help="CSV sku,warehouse,carrier,promised_days (default: the table shipped with the job)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job until it stops (with --available-now) or fails; 0 on success."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        options = job_options(args)
        rows = read_warehouses_csv(args.warehouses) if args.warehouses else DEFAULT_WAREHOUSES
    except ConfigError as exc:
        parser.error(str(exc))
    spark = build_session(APP_NAME, options.master)
    query = start(
        spark,
        options,
        warehouses_frame(spark, rows),
        args.orders_topic,
        args.shipments_topic,
        args.dead_letter_topic,
    )
    await_queries(spark, [query])
    return 0


if __name__ == "__main__":
    sys.exit(main())
