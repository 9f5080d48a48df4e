"""Spark schemas and the conversions between Fjord records and Arrow record batches.

The read schema is exactly Spark's Kafka source's: key binary, value binary, topic string,
partition int, offset long, timestamp timestamp, timestampType int (0 CreateTime,
1 LogAppendTime), and headers array<struct<key string, value binary>> with ``includeHeaders``.
Timestamps travel as ``timestamp[us, tz=UTC]``, as Spark expects.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from fjord.client.types import ConsumerRecord
from fjord.errors import ConfigError
from fjord.records.speedups import EXTENSION, IMPLEMENTATION

#: The headers column's element type (Spark's Kafka source's).
HEADER_TYPE = StructType([StructField("key", StringType()), StructField("value", BinaryType())])

TIMESTAMP_TYPES = {"CreateTime": 0, "LogAppendTime": 1}


def reader_schema(include_headers: bool) -> StructType:
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", ArrayType(HEADER_TYPE)))
    return StructType(fields)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark checks batches of ``schema`` against."""
    return to_arrow_schema(schema, timezone="UTC")


_MS_TIMESTAMP = pa.timestamp("ms", tz="UTC")
_US_TIMESTAMP = pa.timestamp("us", tz="UTC")


def records_to_batch(
    records: Sequence[ConsumerRecord],
    schema: pa.Schema,
    timestamp_type: int,
) -> pa.RecordBatch:
    """One Arrow batch of ``records`` (all of one partition). ``schema`` is
    :func:`arrow_schema` of :func:`reader_schema`; it has a headers column exactly when headers
    are wanted.

    With fjord's C extension the key, value, offset and timestamp columns are built in C
    straight into Arrow's buffers (``binary_column`` / ``int64_column``: no Python per record);
    without it (or on a big-endian machine) from Python lists, column by column. Both give
    equal batches."""
    count = len(records)
    first = records[0]
    if _COLUMNS is not None and isinstance(records, list):
        keys, values, offsets, timestamps = _columns_in_c(records, count)
    else:
        keys, values, offsets, timestamps = _columns_from_lists(records)
    ordered = [
        keys,
        values,
        pa.repeat(pa.scalar(first.topic, pa.string()), count),
        pa.repeat(pa.scalar(first.partition, pa.int32()), count),
        offsets,
        timestamps,
        pa.repeat(pa.scalar(timestamp_type, pa.int32()), count),
    ]
    if len(schema) == 8:
        ordered.append(pa.array([r.headers for r in records], schema.field("headers").type))
    return pa.RecordBatch.from_arrays(ordered, schema=schema)


# ConsumerRecord's fields, in the order the C column builders address them by index.
_KEY, _VALUE, _OFFSET, _TIMESTAMP = (
    ConsumerRecord._fields.index(name) for name in ("key", "value", "offset", "timestamp")
)

#: The C column builders (fjord.records._speedups), when the extension is in use, was built
#: from a source that has them (an extension built before them lacks them until rebuilt) and
#: Arrow's little-endian buffers are the machine's byte order.
_COLUMNS = (
    EXTENSION
    if IMPLEMENTATION == "c"
    and hasattr(EXTENSION, "binary_column")
    and sys.byteorder == "little"
    else None
)


def _binary_from_c(records: list[ConsumerRecord], index: int, count: int) -> pa.Array:
    assert _COLUMNS is not None
    offsets, data, validity, nulls = _COLUMNS.binary_column(records, index)
    return pa.Array.from_buffers(
        pa.binary(),
        count,
        [None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets),
         pa.py_buffer(data)],
        null_count=nulls,
    )  # fmt: skip


def _columns_in_c(records: list[ConsumerRecord], count: int) -> list[pa.Array]:
    """keys, values, offsets, timestamps (us) built by the C extension."""
    assert _COLUMNS is not None
    offsets = _COLUMNS.int64_column(records, _OFFSET, 1)
    timestamps = _COLUMNS.int64_column(records, _TIMESTAMP, 1000)
    return [
        _binary_from_c(records, _KEY, count),
        _binary_from_c(records, _VALUE, count),
        pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(offsets)]),
        pa.Array.from_buffers(_US_TIMESTAMP, count, [None, pa.py_buffer(timestamps)]),
    ]


def _columns_from_lists(records: Sequence[ConsumerRecord]) -> list[pa.Array]:
    """keys, values, offsets, timestamps (us) built by pyarrow from Python lists."""
    _, _, offsets, keys, values, _, timestamps = zip(*records, strict=True)
    return [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array(offsets, pa.int64()),
        pa.array(timestamps, _MS_TIMESTAMP).cast(_US_TIMESTAMP),
    ]


# -- writing -----------------------------------------------------------------------------------

_TEXT_OR_BYTES = (BinaryType, StringType)


def check_writer_schema(schema: StructType, topic_option: str | None) -> None:
    """Spark's Kafka sink rules: a ``value`` column (binary or string) is required; ``key``
    (binary or string), ``topic`` (string, unless the ``topic`` option is given), ``partition``
    (int) and ``headers`` (array<struct<key string, value binary>>) are optional; other columns
    are ignored."""
    types: dict[str, DataType] = {f.name: f.dataType for f in schema.fields}

    def require(name: str, allowed: tuple[type[DataType], ...], what: str) -> None:
        if name in types and not isinstance(types[name], allowed):
            raise ConfigError(f"column {name!r} must be {what}, got {types[name].simpleString()}")

    if "value" not in types:
        raise ConfigError("writing to fjord needs a 'value' column (binary or string)")
    require("value", _TEXT_OR_BYTES, "binary or string")
    require("key", _TEXT_OR_BYTES, "binary or string")
    require("topic", (StringType,), "string")
    require("partition", (IntegerType,), "int")
    if (
        "headers" in types
        and types["headers"] != ArrayType(HEADER_TYPE)
        and not (
            isinstance(types["headers"], ArrayType)
            and _same_header_fields(types["headers"].elementType)
        )
    ):
        raise ConfigError(
            "column 'headers' must be array<struct<key:string,value:binary>>, got "
            f"{types['headers'].simpleString()}"
        )
    if topic_option is None and "topic" not in types:
        raise ConfigError("writing to fjord needs the option topic or a 'topic' column")


def _same_header_fields(element: DataType) -> bool:
    return (
        isinstance(element, StructType)
        and [f.name for f in element.fields] == ["key", "value"]
        and isinstance(element.fields[0].dataType, StringType)
        and isinstance(element.fields[1].dataType, BinaryType)
    )


OutgoingRecord = tuple[str | None, int | None, Any, Any, list[tuple[str, bytes | None]] | None]


def batch_to_records(batch: pa.RecordBatch, topic_option: str | None) -> Iterator[OutgoingRecord]:
    """``(topic, partition, key, value, headers)`` for every row of a batch to write; the
    ``topic`` option overrides a topic column (as in Spark's Kafka sink)."""
    names = set(batch.schema.names)
    count = batch.num_rows

    def column(name: str) -> list[Any]:
        return batch.column(name).to_pylist() if name in names else [None] * count

    values = column("value")
    keys = column("key")
    topics = [topic_option] * count if topic_option is not None else column("topic")
    partitions = column("partition")
    if "headers" in names:
        headers: list[Any] = [
            None if hs is None else [(h["key"], h["value"]) for h in hs]
            for hs in batch.column("headers").to_pylist()
        ]
    else:
        headers = [None] * count
    return zip(topics, partitions, keys, values, headers, strict=True)
