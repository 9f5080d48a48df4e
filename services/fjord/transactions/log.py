"""The records of ``__transaction_state`` (Kafka's TransactionLog key and value schemas, byte
for byte), which partition holds a transactional id, and the loader that rebuilds every
transactional id's state from a partition (what a coordinator does when it takes one over).

Key (int16 version first)::

    v0  transactional_id: string

Value (int16 version first; a null value is a tombstone: the id was forgotten)::

    v0  producer_id: int64, producer_epoch: int16, transaction_timeout_ms: int32,
        transaction_status: int8, transaction_partitions: nullable [topic: string,
        partition_ids: [int32]], transaction_last_update_timestamp_ms: int64,
        transaction_start_timestamp_ms: int64
    v1  the same fields in flexible encoding (compact strings and arrays, tagged fields), with
        tagged fields 0 previous_producer_id: int64, 1 next_producer_id: int64,
        2 client_transaction_version: int16

``transaction_status`` is :class:`~fjord.transactions.state.TxnState`'s value. Fjord writes key
v0 and value v0 (what Kafka writes before transactions v2); it reads v0 and v1.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from dataclasses import dataclass

from fjord.errors import CorruptRecordError
from fjord.groups.offsets_topic import group_partition
from fjord.groups.wire import Reader, Writer
from fjord.topic_partition import TopicPartition
from fjord.transactions.defaults import NO_PRODUCER_ID, TRANSACTION_STATE_PARTITIONS
from fjord.transactions.state import TxnRecord, TxnState

KEY_VERSION = 0
VALUE_VERSION = 0


def transaction_partition(
    transactional_id: str, partitions: int = TRANSACTION_STATE_PARTITIONS
) -> int:
    """The ``__transaction_state`` partition of a transactional id: Kafka's
    ``Utils.abs(transactionalId.hashCode()) % transaction.state.log.num.partitions``."""
    return group_partition(transactional_id, partitions)


def encode_key(transactional_id: str) -> bytes:
    return Writer().int16(KEY_VERSION).string(transactional_id).bytes()


def decode_key(data: bytes) -> str:
    reader = Reader(data, "__transaction_state key")
    version = reader.int16()
    if version != 0:
        raise CorruptRecordError(f"__transaction_state key: unknown version {version}")
    transactional_id = reader.string()
    if not reader.done():
        raise CorruptRecordError("__transaction_state key v0: trailing bytes")
    return transactional_id


def _by_topic(partitions: frozenset[TopicPartition]) -> list[tuple[str, list[int]]]:
    topics: dict[str, list[int]] = defaultdict(list)
    for tp in partitions:
        topics[tp.topic].append(tp.partition)
    return [(topic, sorted(numbers)) for topic, numbers in sorted(topics.items())]


def encode_value(record: TxnRecord) -> bytes:
    """The v0 value of ``record`` (``last_producer_epoch`` and ``previous_producer_id`` are
    not in v0: Kafka keeps them in memory only)."""
    if record.state is TxnState.PREPARE_EPOCH_FENCE:
        raise ValueError("PrepareEpochFence is never written")
    writer = Writer().int16(VALUE_VERSION).int64(record.producer_id)
    writer.int16(record.producer_epoch).int32(record.timeout_ms).int8(record.state.value)
    topics = _by_topic(record.partitions)
    writer.int32(len(topics))
    for topic, numbers in topics:
        writer.string(topic).int32(len(numbers))
        for number in numbers:
            writer.int32(number)
    writer.int64(record.last_update_ms).int64(record.txn_start_ms)
    return writer.bytes()


def _compact_string(reader: Reader) -> str:
    n = reader.uvarint()
    if n == 0:
        raise CorruptRecordError("__transaction_state value v1: null topic name")
    try:
        return reader.raw(n - 1).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptRecordError("__transaction_state value v1: topic is not UTF-8") from exc


def _tagged_fields(reader: Reader) -> dict[int, bytes]:
    fields = {}
    for _ in range(reader.uvarint()):
        tag = reader.uvarint()
        fields[tag] = reader.raw(reader.uvarint())
    return fields


def decode_value(transactional_id: str, data: bytes) -> TxnRecord:
    """The state stored for ``transactional_id``; CorruptRecordError on malformed bytes."""
    reader = Reader(data, "__transaction_state value")
    version = reader.int16()
    if version not in (0, 1):
        raise CorruptRecordError(f"__transaction_state value: unknown version {version}")
    flexible = version == 1
    producer_id = reader.int64()
    epoch = reader.int16()
    timeout_ms = reader.int32()
    status = reader.int8()
    try:
        state = TxnState(status)
    except ValueError:
        raise CorruptRecordError(
            f"__transaction_state value: unknown transaction status {status}"
        ) from None
    partitions: set[TopicPartition] = set()
    count = reader.uvarint() - 1 if flexible else reader.int32()
    if count < -1 or count > reader.remaining():
        raise CorruptRecordError(f"__transaction_state value: bad partition count {count}")
    for _ in range(max(count, 0)):
        topic = _compact_string(reader) if flexible else reader.string()
        numbers = reader.uvarint() - 1 if flexible else reader.int32()
        if numbers < 0 or numbers * 4 > reader.remaining():
            raise CorruptRecordError(f"__transaction_state value: bad id count {numbers}")
        partitions.update(TopicPartition(topic, reader.int32()) for _ in range(numbers))
        if flexible:
            _tagged_fields(reader)
    last_update_ms = reader.int64()
    start_ms = reader.int64()
    previous = NO_PRODUCER_ID
    if flexible:
        tags = _tagged_fields(reader)
        if 0 in tags and len(tags[0]) == 8:
            previous = struct.unpack(">q", tags[0])[0]
    if not reader.done():
        raise CorruptRecordError(f"__transaction_state value v{version}: trailing bytes")
    return TxnRecord(
        transactional_id,
        producer_id,
        epoch,
        timeout_ms,
        state,
        frozenset(partitions),
        start_ms,
        last_update_ms,
        previous_producer_id=previous,
    )


def encode_record(record: TxnRecord) -> tuple[bytes, bytes | None]:
    """(key bytes, value bytes) ready to go into a RecordBatch; a Dead id is a tombstone
    (value None: the id is forgotten, and compaction removes it)."""
    if record.state is TxnState.DEAD:
        return encode_key(record.transactional_id), None
    return encode_key(record.transactional_id), encode_value(record)


@dataclass
class TransactionLogLoader:
    """Replays one ``__transaction_state`` partition in log order: the last record of each
    transactional id wins; a tombstone forgets the id."""

    def __post_init__(self) -> None:
        self._records: dict[str, TxnRecord] = {}

    def apply_bytes(self, key: bytes, value: bytes | None) -> None:
        transactional_id = decode_key(key)
        if value is None:
            self._records.pop(transactional_id, None)
        else:
            self._records[transactional_id] = decode_value(transactional_id, value)

    def records(self) -> dict[str, TxnRecord]:
        return dict(sorted(self._records.items()))
