"""The two implementations of the record hot loops (issue 18), for tests that run against
both: the pure-Python reference and the C extension (fjord.records.speedups)."""

from __future__ import annotations

from typing import Any

import pytest

from fjord.records import builder, reader, speedups

RECORD_IMPLEMENTATIONS = ("python", "c")


def record_implementation(name: str) -> dict[str, object]:
    """The builder and decoders of implementation ``name`` (skips the test when ``c`` is not
    available)."""
    if name == "python":
        return {
            "BatchBuilder": builder.PyBatchBuilder,
            "decode_record_tuples": reader.py_decode_record_tuples,
            "decode_records_as": reader.py_decode_records_as,
        }
    if speedups.pure_python_forced():
        pytest.skip(f"{speedups.PURE_PYTHON_ENV}=1 forces the pure-Python implementation")
    if speedups.EXTENSION is None:
        pytest.skip("the C extension fjord.records._speedups is not built (make install)")
    ext = speedups.EXTENSION
    assert builder.BatchBuilder.__mro__[2] is ext.RecordAppender
    return {
        "BatchBuilder": builder.BatchBuilder,
        "decode_record_tuples": ext.decode_record_tuples,
        "decode_records_as": ext.decode_records_as,
    }


class RecordListSink:
    """A :class:`fjord.client.fetcher.RecordSink` that keeps the records it is given as
    ConsumerRecords (decoded with ``records_as``): what ``Consumer.poll_into`` hands a sink,
    readable like ``poll()``'s answer."""

    def __init__(self) -> None:
        from fjord.client.types import ConsumerRecord

        self._record_type = ConsumerRecord
        self.records: list[Any] = []

    def add_batch(self, batch: Any, topic: str, partition: int, min_offset: int) -> int:
        return self.add_records(batch.records_as(self._record_type, topic, partition, min_offset))

    def add_records(self, records: list[Any]) -> int:
        self.records.extend(records)
        return len(records)

    def take(self) -> list[Any]:
        out, self.records = self.records, []
        return out
