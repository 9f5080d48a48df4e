"""Control batches: the transaction markers (COMMIT / ABORT) a partition leader appends when a
transaction ends, in Kafka's format byte for byte.

A control batch is a RecordBatch v2 whose attributes have bit 5 (control) and bit 4
(transactional) set, whose producer id and epoch are the transaction's producer's, base sequence
-1, and which holds exactly one record without headers::

    key   : version int16 (0) | type int16 (0 = ABORT, 1 = COMMIT)
    value : version int16 (0) | coordinator_epoch int32

(Kafka's ``ControlRecordType`` and ``EndTransactionMarker``.) Readers accept any key version >= 0
(Kafka reads the type from the first four bytes whatever the version) and a value of at least
six bytes (a newer version may append fields). Consumers never return control records; they use
ABORT markers to stop filtering a producer's aborted records.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from fjord.errors import CorruptRecordError
from fjord.records.builder import BatchBuilder
from fjord.records.header import NO_SEQUENCE, BatchHeader
from fjord.records.reader import RecordBatch

_KEY = struct.Struct(">hh")  # version, type
_VALUE = struct.Struct(">hi")  # version, coordinator epoch
CONTROL_KEY_VERSION = 0
END_TXN_MARKER_VERSION = 0


class ControlType(IntEnum):
    """Kafka's ControlRecordType ids (the second int16 of a control record's key)."""

    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class ControlRecord:
    """A decoded transaction marker: its type and the coordinator epoch that wrote it."""

    type: ControlType
    coordinator_epoch: int
    key_version: int = CONTROL_KEY_VERSION
    value_version: int = END_TXN_MARKER_VERSION

    @property
    def committed(self) -> bool:
        return self.type is ControlType.COMMIT


def control_record_key(control_type: ControlType) -> bytes:
    return _KEY.pack(CONTROL_KEY_VERSION, int(control_type))


def end_txn_marker_value(coordinator_epoch: int) -> bytes:
    return _VALUE.pack(END_TXN_MARKER_VERSION, coordinator_epoch)


def build_control_batch(
    producer_id: int,
    producer_epoch: int,
    *,
    committed: bool,
    coordinator_epoch: int,
    timestamp_ms: int,
) -> bytes:
    """One control batch ending ``producer_id``'s transaction (base offset 0, leader epoch -1:
    the log stamps both). Raises InvalidRecordError for out-of-range ids or epochs."""
    builder = BatchBuilder(
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        is_transactional=True,
        is_control=True,
    )
    control_type = ControlType.COMMIT if committed else ControlType.ABORT
    builder.append(timestamp_ms, control_record_key(control_type),
                   end_txn_marker_value(coordinator_epoch))
    return builder.build()


def parse_control_record(key: bytes | None, value: bytes | None) -> ControlRecord:
    """Decode a control record's key and value; CorruptRecordError when malformed (a key that
    is not 4 bytes with a known type, a value shorter than 6 bytes)."""
    if key is None or len(key) < _KEY.size:
        raise CorruptRecordError(f"control record key {key!r} is shorter than {_KEY.size} bytes")
    key_version, type_id = _KEY.unpack_from(key)
    if key_version < 0:
        raise CorruptRecordError(f"control record key version {key_version} is negative")
    try:
        control_type = ControlType(type_id)
    except ValueError:
        raise CorruptRecordError(
            f"control record type {type_id} is unknown (0 ABORT, 1 COMMIT)"
        ) from None
    if value is None or len(value) < _VALUE.size:
        raise CorruptRecordError(
            f"transaction marker value {value!r} is shorter than {_VALUE.size} bytes"
        )
    value_version, coordinator_epoch = _VALUE.unpack_from(value)
    return ControlRecord(control_type, coordinator_epoch, key_version, value_version)


def read_control_batch(buf: bytes | bytearray | memoryview, pos: int = 0) -> ControlRecord:
    """The marker of the (validated) control batch at ``buf[pos]``. CorruptRecordError when it
    is not a control batch or does not hold exactly one well-formed control record."""
    batch = RecordBatch(buf, pos)
    return control_record_of(batch)


def control_record_of(batch: RecordBatch) -> ControlRecord:
    """The marker held by ``batch`` (already validated). See :func:`read_control_batch`."""
    header: BatchHeader = batch.header
    if not header.is_control:
        raise CorruptRecordError(f"batch at offset {header.base_offset} is not a control batch")
    records = batch.record_tuples()
    if len(records) != 1:
        raise CorruptRecordError(
            f"control batch at offset {header.base_offset} holds {len(records)} records, not 1"
        )
    _, _, key, value, _ = records[0]
    return parse_control_record(key, value)
