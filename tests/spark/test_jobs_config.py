"""Properties of the jobs' configuration parsing that need no SparkSession: any warehouse table
with distinct skus round-trips through its CSV form, and a table naming a sku twice is refused."""

from __future__ import annotations

import csv
import io
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.errors import ConfigError
from fjord_jobs.orders_shipments import WAREHOUSE_SCHEMA, read_warehouses_csv

# Printable text without surrounding spaces (the reader strips them) and not empty.
_field = (
    st.text(
        st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters="\r\n"),
        min_size=1,
        max_size=12,
    )
    .map(str.strip)
    .filter(bool)
)
_row = st.tuples(_field, _field, _field, st.integers(min_value=0, max_value=365))
_tables = st.lists(_row, min_size=1, max_size=8, unique_by=lambda row: row[0])


def write_table(rows: list[tuple[str, str, str, int]]) -> Path:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(WAREHOUSE_SCHEMA.fieldNames())
    writer.writerows(rows)
    with tempfile.NamedTemporaryFile(
        "w", suffix=".csv", delete=False, encoding="utf-8", newline=""
    ) as handle:
        handle.write(buffer.getvalue())
    return Path(handle.name)


@settings(max_examples=60, deadline=None)
@given(_tables)
def test_warehouse_tables_round_trip_through_csv(rows: list[tuple[str, str, str, int]]) -> None:
    path = write_table(rows)
    try:
        assert read_warehouses_csv(path) == rows
    finally:
        path.unlink()


@settings(max_examples=30, deadline=None)
@given(_tables, st.data())
def test_a_sku_listed_twice_is_refused(
    rows: list[tuple[str, str, str, int]], data: st.DataObject
) -> None:
    repeated = data.draw(st.sampled_from(rows))
    path = write_table([*rows, (repeated[0], "OTHER", "OTHER", 1)])
    try:
        with pytest.raises(ConfigError, match="listed twice"):
            read_warehouses_csv(path)
    finally:
        path.unlink()
