"""Fjord's Spark jobs (spark/fjord_jobs) as pure transformations: static DataFrames made from
Python lists in, DataFrames out, every expected row written out by hand. One streaming test
(file source -> memory sink) checks the watermark semantics the windowed jobs rely on.
No cluster is needed; the shared SparkSession comes from tests/spark/conftest.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from fjord.errors import ConfigError
from fjord_jobs import log_analysis, orders_shipments, risk_control
from fjord_jobs.common import JobOptions, base_arg_parser, job_options
from fjord_jobs.defaults import REJECT_REASON_HEADER

# The first Spark jobs of a session compile a lot; on a loaded 2-core machine that takes minutes.
pytestmark = pytest.mark.timeout(900)

RAW_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"
)
RECORD_TIME = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)


def raw_records(spark: Any, topic: str, values: list[bytes | str | None]) -> DataFrame:
    """What the fjord source yields for ``values`` in partition 0, offsets 0.. (no keys)."""
    rows = [
        (None, v.encode() if isinstance(v, str) else v, topic, 0, offset, RECORD_TIME)
        for offset, v in enumerate(values)
    ]
    return spark.createDataFrame(rows, RAW_SCHEMA)


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def epoch(text: str) -> int:
    return int(instant(text).timestamp())


def dead_letters_by_offset(records: DataFrame) -> dict[int, tuple[str, bytes | None]]:
    """source offset (from the dead letter's header) -> (reject reason, value)."""
    out: dict[int, tuple[str, bytes | None]] = {}
    for row in records.where(F.col("headers").isNotNull()).collect():
        headers = {h.key: bytes(h.value).decode() for h in row.headers}
        offset = int(headers["fjord.reject.source"].rsplit(":", 1)[1])
        value = None if row.value is None else bytes(row.value)
        out[offset] = (headers[REJECT_REASON_HEADER], value)
    return out


# -- orders -> shipments --


def order(order_id: str, sku: str, qty: Any = 1, user: str = "u1", **extra: Any) -> str:
    return json.dumps({"order_id": order_id, "user_id": user, "sku": sku, "qty": qty, **extra})


def test_orders_become_one_shipment_or_one_dead_letter_each(spark: Any) -> None:
    values: list[bytes | str | None] = [
        order("o-1", "SKU-BOOK", 2, created_at="2026-11-22T01:00:00Z", coupon="X"),  # 0: ships
        order("o-2", "SKU-PHONE", 1, user="u2"),  # 1: ships
        "not json at all",  # 2
        None,  # 3: a tombstone
        json.dumps({"order_id": "o-5", "user_id": "u1", "qty": 1}),  # 4: no sku
        order("o-6", "SKU-UNKNOWN"),  # 5
        order("o-7", "SKU-BOOK", 0),  # 6
        order("o-8", "SKU-BOOK", "two"),  # 7: qty of the wrong type
        "[1, 2, 3]",  # 8: JSON, but not an object
        order("o-10", "SKU-DESK", 3, user="u3"),  # 9: ships
    ]
    raw = raw_records(spark, "orders", values)
    out = orders_shipments.output_records(
        raw, orders_shipments.warehouses_frame(spark), "ships", "dead"
    )
    rows = out.collect()
    assert len(rows) == len(values)  # every input record yields exactly one output record

    shipments = {
        bytes(r.key).decode(): json.loads(bytes(r.value)) for r in rows if r.topic == "ships"
    }
    assert shipments == {
        "o-1": {
            "shipment_id": "shp-o-1",
            "order_id": "o-1",
            "user_id": "u1",
            "sku": "SKU-BOOK",
            "qty": 2,
            "warehouse": "WH-NORTH",
            "carrier": "DHL",
            "promised_days": 2,
            "status": "READY_TO_SHIP",
            "created_at": "2026-11-22T01:00:00Z",
            "source": {"topic": "orders", "partition": 0, "offset": 0},
        },
        "o-2": {
            "shipment_id": "shp-o-2",
            "order_id": "o-2",
            "user_id": "u2",
            "sku": "SKU-PHONE",
            "qty": 1,
            "warehouse": "WH-SOUTH",
            "carrier": "UPS",
            "promised_days": 1,
            "status": "READY_TO_SHIP",
            "created_at": None,
            "source": {"topic": "orders", "partition": 0, "offset": 1},
        },
        "o-10": {
            "shipment_id": "shp-o-10",
            "order_id": "o-10",
            "user_id": "u3",
            "sku": "SKU-DESK",
            "qty": 3,
            "warehouse": "WH-WEST",
            "carrier": "FEDEX",
            "promised_days": 7,
            "status": "READY_TO_SHIP",
            "created_at": None,
            "source": {"topic": "orders", "partition": 0, "offset": 9},
        },
    }
    assert all(r.headers is None for r in rows if r.topic == "ships")

    assert all(r.topic == "dead" for r in rows if r.headers is not None)
    # Dead letters carry the input's bytes unchanged, with the reason in a header.
    reasons = {
        2: "INVALID_JSON",
        3: "MISSING_VALUE",
        4: "MISSING_FIELD",
        5: "UNKNOWN_SKU",
        6: "INVALID_QUANTITY",
        7: "INVALID_JSON",
        8: "INVALID_JSON",
    }
    assert dead_letters_by_offset(out) == {
        offset: (reason, None if values[offset] is None else str(values[offset]).encode())
        for offset, reason in reasons.items()
    }


def test_orders_join_a_custom_warehouse_table(spark: Any, tmp_path: Path) -> None:
    table = tmp_path / "warehouses.csv"
    table.write_text("sku,warehouse,carrier,promised_days\nSKU-BOOK,WH-EAST,POST,4\n")
    rows = orders_shipments.read_warehouses_csv(table)
    assert rows == [("SKU-BOOK", "WH-EAST", "POST", 4)]
    raw = raw_records(spark, "orders", [order("o-1", "SKU-BOOK"), order("o-2", "SKU-PHONE")])
    planned = orders_shipments.plan_shipments(
        orders_shipments.parse_orders(raw), orders_shipments.warehouses_frame(spark, rows)
    )
    got = {r.order_id: (r.warehouse, r.carrier, r.reject_reason) for r in planned.collect()}
    assert got == {"o-1": ("WH-EAST", "POST", None), "o-2": (None, None, "UNKNOWN_SKU")}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("sku,warehouse,carrier\nSKU-A,W,C\n", "header must be"),
        ("sku,warehouse,carrier,promised_days\nSKU-A,W,C,soon\n", ":2: promised_days"),
        ("sku,warehouse,carrier,promised_days\nSKU-A,W,C,\u00b2\n", ":2: promised_days"),
        ("sku,warehouse,carrier,promised_days\nSKU-A,,C,1\n", ":2: empty field"),
        ("sku,warehouse,carrier,promised_days\nSKU-A,W,C,1\nSKU-A,V,C,2\n", "listed twice"),
        ("sku,warehouse,carrier,promised_days\n", "empty"),
    ],
)
def test_bad_warehouse_tables_are_refused(tmp_path: Path, content: str, message: str) -> None:
    table = tmp_path / "warehouses.csv"
    table.write_text(content)
    with pytest.raises(ConfigError, match=message):
        orders_shipments.read_warehouses_csv(table)


def test_missing_warehouse_table_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read warehouse table"):
        orders_shipments.read_warehouses_csv(tmp_path / "absent.csv")


# -- log collection and analysis --


LOG_LINES: list[bytes | str | None] = [
    "2026-11-22T01:00:05Z INFO checkout order o-1 placed",  # 0
    "2026-11-22T01:00:10.500Z ERROR checkout payment declined",  # 1
    "2026-11-22T01:00:59Z error\tcheckout timeout talking to bank",  # 2: tab, lower case
    "2026-11-22T03:00:20+02:00 WARNING search slow query\n  at index.py:12",  # 3: 01:00:20Z
    "2026-11-22T01:01:00Z INFO checkout",  # 4: next window, empty message
    "garbage",  # 5
    "yesterday INFO checkout hello",  # 6
    "2026-11-22T01:00:30Z LOUD checkout hello",  # 7
    None,  # 8
]


def test_log_lines_are_parsed_and_bad_ones_rejected(spark: Any) -> None:
    parsed = log_analysis.parse_log_lines(raw_records(spark, "logs", LOG_LINES))
    rows = {r.offset: r for r in parsed.collect()}
    assert (rows[2].level, rows[2].service, rows[2].message) == (
        "ERROR",
        "checkout",
        "timeout talking to bank",
    )
    assert (rows[3].level, rows[3].service, rows[3].message) == (
        "WARN",
        "search",
        "slow query\n  at index.py:12",
    )
    assert (rows[4].level, rows[4].message, rows[4].reject_reason) == ("INFO", "", None)
    assert {o: r.reject_reason for o, r in rows.items() if r.reject_reason} == {
        5: "UNPARSEABLE_LINE",
        6: "INVALID_TIMESTAMP",
        7: "UNKNOWN_LEVEL",
        8: "MISSING_VALUE",
    }


def test_log_counts_per_window_service_and_level(spark: Any) -> None:
    parsed = log_analysis.parse_log_lines(raw_records(spark, "logs", LOG_LINES))
    counts = log_analysis.count_by_service_and_level(parsed, "1 minute", "2 minutes")
    records = log_analysis.count_records(counts, "counts").collect()
    got = sorted(
        (
            epoch(v["window_start"]),
            epoch(v["window_end"]) - epoch(v["window_start"]),
            r.key,
            v["service"],
            v["level"],
            v["count"],
        )
        for r in records
        for v in [json.loads(r.value)]
    )
    minute = epoch("2026-11-22T01:00:00Z")
    assert got == [
        (minute, 60, "checkout", "checkout", "ERROR", 2),
        (minute, 60, "checkout", "checkout", "INFO", 1),
        (minute, 60, "search", "search", "WARN", 1),
        (minute + 60, 60, "checkout", "checkout", "INFO", 1),
    ]
    assert all(r.topic == "counts" for r in records)
    stored = log_analysis.parquet_rows(counts)
    assert stored.columns == [*log_analysis.COUNT_COLUMNS, "date"]


def test_log_counts_stream_emits_closed_windows_and_drops_late_lines(
    spark: Any, tmp_path: Path
) -> None:
    """On a stream (files -> memory sink, append mode) a window is emitted once the watermark
    passes its end, and a line older than the watermark is not counted."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()

    def drop(name: str, lines: list[str]) -> None:
        staged = tmp_path / name
        staged.write_text("\n".join(lines) + "\n")
        staged.rename(inbox / name)  # whole files only: the file source must not see a partial one

    lines = (
        spark.readStream.format("text")
        .load(str(inbox))
        .select(
            F.lit(None).cast("binary").alias("key"),
            F.col("value").cast("binary").alias("value"),
            F.lit("logs").alias("topic"),
            F.lit(0).alias("partition"),
            F.lit(0).cast("long").alias("offset"),
            F.current_timestamp().alias("timestamp"),
        )
    )
    counts = log_analysis.count_by_service_and_level(
        log_analysis.parse_log_lines(lines), "1 minute", "1 minute"
    )
    table = f"log_counts_{tmp_path.name.replace('-', '_')}"
    query = (
        counts.writeStream.format("memory")
        .queryName(table)
        .outputMode("append")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        drop("1.log", ["2026-11-22T01:00:05Z INFO api a", "2026-11-22T01:00:06Z INFO api b"])
        query.processAllAvailable()
        assert spark.table(table).count() == 0  # window 01:00 still open
        # Event time moves to 01:03: the watermark (01:02) closes window 01:00-01:01.
        drop("2.log", ["2026-11-22T01:03:00Z INFO api c"])
        query.processAllAvailable()
        # A line for the closed window is too late; the new batch advances nothing more.
        drop("3.log", ["2026-11-22T01:00:30Z INFO api late", "2026-11-22T01:03:01Z INFO api d"])
        query.processAllAvailable()
        rows = spark.table(table).select(
            F.unix_seconds("window_start").alias("start"), "service", "level", "count"
        )
        assert [tuple(r) for r in rows.collect()] == [
            (epoch("2026-11-22T01:00:00Z"), "api", "INFO", 2)
        ]
    finally:
        query.stop()


# -- risk control --


def txn(txn_id: str, user: str, amount: Any, ts: str | None = None) -> str:
    body: dict[str, Any] = {"txn_id": txn_id, "user_id": user, "amount": amount}
    if ts is not None:
        body["ts"] = ts
    return json.dumps(body)


def test_velocity_alerts_on_count_and_amount(spark: Any) -> None:
    values: list[bytes | str | None] = [
        # u1: 3 transactions within 01:00:00-01:01:30 -> too many for max 2 in a 2-minute window
        txn("t1", "u1", 10, "2026-11-22T01:00:10Z"),
        txn("t2", "u1", 10, "2026-11-22T01:00:50Z"),
        txn("t3", "u1", 10, "2026-11-22T01:01:30Z"),
        # u2: one big transaction -> over the amount
        txn("t4", "u2", 900.5, "2026-11-22T01:00:20Z"),
        # u3: quiet
        txn("t5", "u3", 5, "2026-11-22T01:00:20Z"),
        # rejects
        txn("t6", "u3", -5, "2026-11-22T01:00:20Z"),
        txn("t7", "u3", 5, "last tuesday"),
        "{}",
    ]
    rule = risk_control.VelocityRule(
        window="2 minutes",
        slide="1 minute",
        watermark="1 minute",
        max_transactions=2,
        max_amount=500,
    )
    parsed = risk_control.parse_transactions(raw_records(spark, "transactions", values))
    assert {r.offset: r.reject_reason for r in parsed.collect() if r.reject_reason} == {
        5: "INVALID_AMOUNT",
        6: "INVALID_TIMESTAMP",
        7: "MISSING_FIELD",
    }
    speeds = risk_control.velocity(parsed, rule)
    got_speeds = sorted(
        (r.user_id, r.start, r.txn_count, r.total_amount)
        for r in speeds.select("*", F.unix_seconds("window_start").alias("start")).collect()
    )
    t = epoch("2026-11-22T01:00:00Z")
    assert got_speeds == [
        ("u1", t - 60, 2, 20.0),  # window 00:59-01:01
        ("u1", t, 3, 30.0),  # window 01:00-01:02
        ("u1", t + 60, 1, 10.0),  # window 01:01-01:03
        ("u2", t - 60, 1, 900.5),
        ("u2", t, 1, 900.5),
        ("u3", t - 60, 1, 5.0),
        ("u3", t, 1, 5.0),
    ]
    records = risk_control.alert_records(
        risk_control.alerts(speeds, rule), rule, "alerts"
    ).collect()
    assert sorted(r.key for r in records) == ["u1", "u2", "u2"]
    assert all(r.topic == "alerts" for r in records)
    alerts = [json.loads(r.value) for r in records]
    assert {(a["user_id"], epoch(a["window_start"]), tuple(a["reasons"])) for a in alerts} == {
        ("u1", t, ("TOO_MANY_TRANSACTIONS",)),
        ("u2", t - 60, ("AMOUNT_OVER_LIMIT",)),
        ("u2", t, ("AMOUNT_OVER_LIMIT",)),
    }
    (u1,) = [a for a in alerts if a["user_id"] == "u1"]
    assert u1["alert_id"] == "u1@" + u1["window_start"]
    assert (u1["txn_count"], u1["total_amount"], u1["max_transactions"], u1["max_amount"]) == (
        3,
        30.0,
        2,
        500.0,
    )
    assert epoch(u1["window_end"]) - epoch(u1["window_start"]) == 120


def test_transaction_without_ts_uses_the_record_timestamp(spark: Any) -> None:
    parsed = risk_control.parse_transactions(
        raw_records(spark, "transactions", [txn("t1", "u1", 1)])
    )
    (row,) = parsed.select(F.unix_seconds("event_time").alias("t"), "reject_reason").collect()
    assert (row.t, row.reject_reason) == (int(RECORD_TIME.timestamp()), None)


def test_both_alert_reasons_at_once(spark: Any) -> None:
    rule = risk_control.VelocityRule(
        window="1 minute", slide="1 minute", max_transactions=1, max_amount=1
    )
    values: list[bytes | str | None] = [
        txn("t1", "u1", 5, "2026-11-22T01:00:01Z"),
        txn("t2", "u1", 5, "2026-11-22T01:00:02Z"),
    ]
    speeds = risk_control.velocity(
        risk_control.parse_transactions(raw_records(spark, "transactions", values)), rule
    )
    (alert,) = risk_control.alerts(speeds, rule).collect()
    assert alert.reasons == ["TOO_MANY_TRANSACTIONS", "AMOUNT_OVER_LIMIT"]


# -- options --


def test_job_options_refuse_bad_values() -> None:
    parser = base_arg_parser("test")
    args = parser.parse_args(["--checkpoint", "/tmp/c", "--max-offsets-per-trigger", "0"])
    with pytest.raises(ConfigError, match="max-offsets-per-trigger"):
        job_options(args)
    with pytest.raises(ConfigError, match="bootstrap-servers"):
        JobOptions(bootstrap_servers=" ", checkpoint="/tmp/c")
    with pytest.raises(ConfigError, match="max-transactions"):
        risk_control.VelocityRule(max_transactions=0)
    with pytest.raises(ConfigError, match="max-amount"):
        risk_control.VelocityRule(max_amount=float("nan"))
    ok = job_options(parser.parse_args(["--checkpoint", "/tmp/c", "--available-now"]))
    assert ok.available_now and ok.starting_offsets == "earliest"


def test_main_reports_bad_arguments_without_starting_spark(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exit_info:
        orders_shipments.main(["--checkpoint", "/tmp/c", "--warehouses", "/nonexistent.csv"])
    assert exit_info.value.code == 2
    assert "cannot read warehouse table" in capsys.readouterr().err
