"""Spark schemas and the conversions between Fjord records and Arrow record batches.

The read schema is exactly Spark's Kafka source's: key binary, value binary, topic string,
partition int, offset long, timestamp timestamp, timestampType int (0 CreateTime,
1 LogAppendTime), and headers array<struct<key string, value binary>> with ``includeHeaders``.
Timestamps travel as ``timestamp[us, tz=UTC]``, as Spark expects.
"""

from __future__ import annotations

import bisect
import functools
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
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
        repeated_string(first.topic, count),
        pa.repeat(pa.scalar(first.partition, pa.int32()), count),
        offsets,
        timestamps,
        pa.repeat(pa.scalar(timestamp_type, pa.int32()), count),
    ]
    if len(schema) == 8:
        ordered.append(pa.array([r.headers for r in records], schema.field("headers").type))
    return pa.RecordBatch.from_arrays(ordered, schema=schema)


@functools.lru_cache(maxsize=64)
def repeated_string(text: str, count: int) -> pa.Array:
    """A string column of ``count`` times ``text``, built from its buffers: ``pa.repeat`` of a
    string scalar costs ~330 ns a row here (a third of a read task's budget at 1M rows/s),
    this ~6 ns; cached, since a task's batches are mostly of one topic and one size (Arrow
    arrays are immutable)."""
    data = text.encode()
    offsets = np.arange(count + 1, dtype=np.int32) * len(data)
    return pa.Array.from_buffers(
        pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data * count)]
    )


# ConsumerRecord's fields, in the order the C column builders address them by index.
_KEY, _VALUE, _OFFSET, _TIMESTAMP = (
    ConsumerRecord._fields.index(name) for name in ("key", "value", "offset", "timestamp")
)

#: The C column builders (fjord.records._speedups: the columns of ConsumerRecords, and
#: ``ColumnBuilder``, records decoded straight into Arrow buffers by ``Consumer.poll_into``),
#: when the extension is in use, was built from a source that has them (an extension built
#: before them lacks them until rebuilt) and Arrow's little-endian buffers are the machine's
#: byte order.
_COLUMNS = (
    EXTENSION
    if IMPLEMENTATION == "c"
    and hasattr(EXTENSION, "binary_column")
    and hasattr(EXTENSION, "ColumnBuilder")
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


def _columns_from_buffers(
    taken: tuple[int, Any, Any, bytes, bytes],
) -> tuple[int, list[pa.Array]]:
    """keys, values, offsets, timestamps (us) from ``ColumnBuilder.take()``'s buffers."""
    rows, keys, values, offsets, timestamps = taken

    def binary(buffers: tuple[bytes, bytes, bytes | None, int]) -> pa.Array:
        offsets_buffer, data, validity, nulls = buffers
        return pa.Array.from_buffers(
            pa.binary(),
            rows,
            [None if validity is None else pa.py_buffer(validity), pa.py_buffer(offsets_buffer),
             pa.py_buffer(data)],
            null_count=nulls,
        )  # fmt: skip

    return rows, [
        binary(keys),
        binary(values),
        pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(offsets)]),
        pa.Array.from_buffers(_US_TIMESTAMP, rows, [None, pa.py_buffer(timestamps)]),
    ]


class ArrowColumns:
    """A read task's records of one partition, gathered for Arrow batches: the
    :class:`fjord.client.fetcher.RecordSink` a read task hands to ``Consumer.poll_into``.

    With the C extension (and no headers wanted) each fetched batch is decoded straight into
    the buffers of the key, value, offset and timestamp columns (``ColumnBuilder``: no
    ConsumerRecord per row); a batch the builder leaves alone (records with headers, anything
    malformed) is decoded into ConsumerRecords and appended from them. Otherwise the
    ConsumerRecords are kept and converted by :func:`records_to_batch`. Both give equal
    batches.

    Invariant: :attr:`rows` records are held, in offset order, all of ``topic``'s
    ``partition``; :meth:`take` hands out those below ``until`` and holds nothing after."""

    def __init__(self, schema: pa.Schema, topic: str, partition: int, timestamp_type: int):
        self.schema = schema
        self.topic = topic
        self.partition = partition
        self.timestamp_type = timestamp_type
        headers = len(schema) == 8  # headers wanted: only ConsumerRecords carry them
        self._builder = (
            _COLUMNS.ColumnBuilder(1000) if _COLUMNS is not None and not headers else None
        )
        self._records: list[ConsumerRecord] = []

    def add_batch(self, batch: Any, topic: str, partition: int, min_offset: int) -> int:
        if self._builder is not None:
            added = batch.append_columns(self._builder, min_offset)
            if added is not None:
                return int(added)
        return self.add_records(batch.records_as(ConsumerRecord, topic, partition, min_offset))

    def add_records(self, records: list[ConsumerRecord]) -> int:
        if self._builder is not None:
            return int(self._builder.append_records(records))
        self._records.extend(records)
        return len(records)

    @property
    def rows(self) -> int:
        return self._builder.rows if self._builder is not None else len(self._records)

    @property
    def data_bytes(self) -> int:
        """Bytes of keys and values held (only counted with the builder; 0 otherwise)."""
        return self._builder.data_bytes if self._builder is not None else 0

    def take(self, until: int) -> pa.RecordBatch | None:
        """One Arrow batch of the records held below offset ``until`` (None when there are
        none); every record held is dropped."""
        if self._builder is None:
            records, self._records = self._records, []
            if records and records[-1].offset >= until:
                records = records[: bisect.bisect_left(records, until, key=_offset_of)]
            if not records:
                return None
            return records_to_batch(records, self.schema, self.timestamp_type)
        count, (keys, values, offsets, timestamps) = _columns_from_buffers(self._builder.take())
        if not count:
            return None
        batch = pa.RecordBatch.from_arrays(
            [
                keys,
                values,
                repeated_string(self.topic, count),
                pa.repeat(pa.scalar(self.partition, pa.int32()), count),
                offsets,
                timestamps,
                pa.repeat(pa.scalar(self.timestamp_type, pa.int32()), count),
            ],
            schema=self.schema,
        )
        if offsets[count - 1].as_py() >= until:
            kept = int(np.searchsorted(offsets.to_numpy(zero_copy_only=True), until))
            batch = batch.slice(0, kept)
            if not kept:
                return None
        return batch


def _offset_of(record: ConsumerRecord) -> int:
    return record.offset


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


#: Rows of one topic (and one explicit partition, or None: the producer's partitioner) in the
#: order they came: ``(topic, partition, keys or None, values)``, what ``Producer.send_many``
#: takes.
OutgoingGroup = tuple[str, int | None, list[bytes | None] | None, list[bytes | None]]


def batch_to_groups(batch: pa.RecordBatch, topic_option: str | None) -> list[OutgoingGroup] | None:
    """The rows of a batch to write as :data:`OutgoingGroup` s, split with Arrow's vectorised
    calls (no Python per row but the lists handed over); None when the batch needs the
    row-by-row path (:func:`batch_to_records`): a row has headers, or the ``partition`` column
    mixes null and set values (grouping would reorder a partition's rows). Every row of one
    partition keeps its order. ``ConfigError`` for a null topic (no ``topic`` option)."""
    import pyarrow.compute as pc  # here: the sink's alone (~25 ms at import in the offsets process)

    names = set(batch.schema.names)
    if "headers" in names:
        headers = batch.column("headers")
        if headers.null_count < len(headers) and pc.max(pc.list_value_length(headers)).as_py():
            return None
    partitions = batch.column("partition") if "partition" in names else None
    if partitions is not None and 0 < partitions.null_count < len(partitions):
        return None
    if topic_option is None:
        topics = batch.column("topic")
        if topics.null_count:
            raise ConfigError("a row has a null topic and the option topic is not set")
    groups: list[OutgoingGroup] = []
    for topic, rows in _split(batch, None if topic_option is not None else "topic"):
        if partitions is None or partitions.null_count:
            parts: list[tuple[Any, pa.RecordBatch]] = [(None, rows)]
        else:
            parts = _split(rows, "partition")
        for partition, part_rows in parts:
            groups.append(
                (
                    topic_option if topic_option is not None else topic,
                    partition,
                    _as_bytes_list(part_rows, "key"),
                    _as_bytes_list(part_rows, "value") or [],
                )
            )
    return groups


def _split(batch: pa.RecordBatch, column: str | None) -> list[tuple[Any, pa.RecordBatch]]:
    """``batch`` split by the distinct values of ``column`` (None: not split), each part's
    rows in their order."""
    import pyarrow.compute as pc

    if column is None:
        return [(None, batch)]
    values = batch.column(column)
    distinct = pc.unique(values).to_pylist()
    if len(distinct) == 1:
        return [(distinct[0], batch)]
    return [(v, batch.filter(pc.equal(values, pa.scalar(v, values.type)))) for v in distinct]


def _as_bytes_list(batch: pa.RecordBatch, name: str) -> list[bytes | None] | None:
    """Column ``name`` (binary or string: strings as their UTF-8 bytes) as a list of bytes and
    None; None when the batch has no such column or it is all null."""
    if name not in batch.schema.names:
        return None
    column = batch.column(name)
    if name == "key" and column.null_count == len(column):
        return None
    if not pa.types.is_binary(column.type):
        column = column.cast(pa.binary())
    return column.to_pylist()
