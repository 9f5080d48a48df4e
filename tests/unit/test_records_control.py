"""Transaction markers (control batches): our builder and parser against Kafka's layout, and
kafka-python (an implementation nobody here wrote) decoding what we build."""

from __future__ import annotations

import struct
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch

from fjord.errors import CorruptRecordError, InvalidRecordError
from fjord.records import BatchBuilder, decode_records, read_batches, stamp_batch
from fjord.records.control import (
    ControlRecord,
    ControlType,
    build_control_batch,
    parse_control_record,
    read_control_batch,
)

PRODUCER_IDS = st.integers(0, 2**63 - 1)
EPOCHS = st.integers(0, 2**15 - 1)
COORDINATOR_EPOCHS = st.integers(-(2**31), 2**31 - 1)
TIMESTAMPS = st.integers(0, 2**50)


@settings(max_examples=150, deadline=None)
@given(PRODUCER_IDS, EPOCHS, st.booleans(), COORDINATOR_EPOCHS, TIMESTAMPS,
       st.integers(0, 2**40))
def test_marker_round_trip_and_kafka_python_reads_it(
    pid, epoch, committed, coordinator_epoch, ts, base_offset
) -> None:
    batch = bytearray(build_control_batch(
        pid, epoch, committed=committed, coordinator_epoch=coordinator_epoch, timestamp_ms=ts
    ))
    stamp_batch(batch, 0, base_offset, 3)
    (read,) = read_batches(bytes(batch))
    h = read.header
    assert h.is_control and h.is_transactional
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (pid, epoch, -1)
    assert h.record_count == 1 and h.base_offset == base_offset and h.max_timestamp == ts
    marker = read_control_batch(bytes(batch))
    assert marker == ControlRecord(
        ControlType.COMMIT if committed else ControlType.ABORT, coordinator_epoch
    )
    assert marker.committed is committed
    # A consumer's record view never includes the marker.
    assert list(decode_records(bytes(batch))) == []

    theirs = DefaultRecordBatch(bytes(batch))
    assert theirs.validate_crc()
    assert theirs.is_control_batch and theirs.is_transactional
    assert (theirs.producer_id, theirs.producer_epoch) == (pid, epoch)
    (record,) = list(theirs)
    assert record.offset == base_offset
    assert record.commit is committed and record.abort is not committed
    assert record.version == 0
    assert struct.unpack(">hi", record.value) == (0, coordinator_epoch)


def test_control_batch_layout_byte_for_byte() -> None:
    batch = build_control_batch(5, 2, committed=False, coordinator_epoch=9, timestamp_ms=1000)
    # attributes (offset 21): control (0x20) | transactional (0x10), codec none
    assert struct.unpack_from(">h", batch, 21)[0] == 0x30
    # the one record: length, attrs 0, ts delta 0, offset delta 0, key len 4, key, value len 6
    record = batch[61:]
    assert record == bytes([
        2 * 16, 0, 0, 0, 8, 0, 0, 0, 0, 12, 0, 0, 0, 0, 0, 9, 0
    ])


def test_newer_versions_are_read_and_bad_markers_refused() -> None:
    assert parse_control_record(b"\x00\x01\x00\x01", b"\x00\x01\x00\x00\x00\x07extra") == (
        ControlRecord(ControlType.COMMIT, 7, 1, 1)
    )
    bad = [
        (None, b"\x00\x00\x00\x00\x00\x00", "shorter"),
        (b"\x00\x00", b"\x00\x00\x00\x00\x00\x00", "shorter"),
        (b"\x00\x00\x00\x07", b"\x00\x00\x00\x00\x00\x00", "unknown"),
        (b"\xff\xff\x00\x00", b"\x00\x00\x00\x00\x00\x00", "negative"),
        (b"\x00\x00\x00\x00", b"\x00\x00\x00", "shorter"),
        (b"\x00\x00\x00\x00", None, "shorter"),
    ]
    for key, value, message in bad:
        with pytest.raises(CorruptRecordError, match=message):
            parse_control_record(key, value)


def test_a_data_batch_is_not_a_marker() -> None:
    builder = BatchBuilder(producer_id=1, producer_epoch=0, base_sequence=0, is_transactional=True)
    builder.append(1, b"k", b"v")
    with pytest.raises(CorruptRecordError, match="not a control batch"):
        read_control_batch(builder.build())
    builder = BatchBuilder(is_control=True)
    builder.append(1, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00")
    builder.append(2, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00")
    with pytest.raises(CorruptRecordError, match="holds 2 records"):
        read_control_batch(builder.build())


def test_out_of_range_producer_is_refused() -> None:
    with pytest.raises(InvalidRecordError, match="producer epoch"):
        build_control_batch(1, 2**15, committed=True, coordinator_epoch=0, timestamp_ms=0)
