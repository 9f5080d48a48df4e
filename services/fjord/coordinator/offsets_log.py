"""The records of ``__consumer_offsets`` (Kafka's key/value schemas, byte for byte), which group
lives in which partition, and the loader that rebuilds groups and offsets from a partition.

Keys (int16 version first)::

    offset commit key    v0/v1  group: string, topic: string, partition: int32
    group metadata key   v2     group: string

Values (int16 version first; a null value is a tombstone that deletes the key)::

    offset commit value  v0  offset: int64, metadata: string, commit_timestamp: int64
                         v1  offset, metadata, commit_timestamp, expire_timestamp: int64
                         v2  offset, metadata, commit_timestamp
                         v3  offset, leader_epoch: int32, metadata, commit_timestamp
    group metadata value v0  protocol_type: string, generation: int32, protocol: nullable string,
                             leader: nullable string, members: [member v0]
                         v1  members: [member v1]
                         v2  + current_state_timestamp: int64 (after leader)
                         v3  members: [member v3]
    member v0: member_id, client_id, client_host: string, session_timeout: int32,
               subscription: bytes, assignment: bytes
    member v1/v2: member_id, client_id, client_host, rebalance_timeout: int32, session_timeout,
               subscription, assignment
    member v3: member_id, group_instance_id: nullable string, client_id, client_host,
               rebalance_timeout, session_timeout, subscription, assignment

Fjord's own record (not in Kafka: Kafka writes these offsets as transactional batches of the
producer instead, see docs/transactions.md)::

    pending transactional offset key  v100  group: string, topic: string, partition: int32,
                                            producer_id: int64
    (value: offset commit value v3; a tombstone once the transaction ended)

Fjord writes key v1, offset value v3 (v1 when an explicit expire timestamp is set, as Kafka) and
group value v3; it reads every version above.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fjord.errors import CorruptRecordError
from fjord.groups.wire import Reader, Writer
from fjord.topic_partition import TopicPartition

NO_TIMESTAMP = -1
NO_LEADER_EPOCH = -1

OFFSET_KEY_VERSION = 1
GROUP_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 3
GROUP_VALUE_VERSION = 3


@dataclass(frozen=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True)
class PendingTxnOffsetKey:
    """An offset committed by TxnOffsetCommit in producer ``producer_id``'s open transaction:
    it counts only once that transaction commits."""

    group: str
    topic: str
    partition: int
    producer_id: int


PENDING_TXN_OFFSET_KEY_VERSION = 100


@dataclass(frozen=True)
class OffsetCommitValue:
    """A committed offset. ``expire_timestamp`` is only set by v1 (old explicit retention)."""

    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str = ""
    commit_timestamp: int = NO_TIMESTAMP
    expire_timestamp: int = NO_TIMESTAMP


@dataclass(frozen=True)
class MemberRecord:
    """One member as stored in group metadata (its subscription and assignment bytes)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupMetadataValue:
    """A group's membership after a rebalance (or Empty with no members)."""

    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int = NO_TIMESTAMP
    members: tuple[MemberRecord, ...] = ()


RecordKey = OffsetCommitKey | GroupMetadataKey | PendingTxnOffsetKey
RecordValue = OffsetCommitValue | GroupMetadataValue
#: One ``__consumer_offsets`` record: a key and its value, or None for a tombstone.
LogRecord = tuple[RecordKey, RecordValue | None]


def encode_key(key: RecordKey) -> bytes:
    if isinstance(key, PendingTxnOffsetKey):
        writer = Writer().int16(PENDING_TXN_OFFSET_KEY_VERSION).string(key.group)
        return writer.string(key.topic).int32(key.partition).int64(key.producer_id).bytes()
    if isinstance(key, OffsetCommitKey):
        writer = Writer().int16(OFFSET_KEY_VERSION).string(key.group).string(key.topic)
        return writer.int32(key.partition).bytes()
    return Writer().int16(GROUP_KEY_VERSION).string(key.group).bytes()


def encode_value(value: RecordValue | None) -> bytes | None:
    """The value bytes (None stays None: a tombstone)."""
    if value is None:
        return None
    if isinstance(value, OffsetCommitValue):
        if value.expire_timestamp != NO_TIMESTAMP:
            writer = Writer().int16(1).int64(value.offset).string(value.metadata)
            return writer.int64(value.commit_timestamp).int64(value.expire_timestamp).bytes()
        writer = Writer().int16(OFFSET_VALUE_VERSION).int64(value.offset)
        writer.int32(value.leader_epoch).string(value.metadata).int64(value.commit_timestamp)
        return writer.bytes()
    writer = Writer().int16(GROUP_VALUE_VERSION).string(value.protocol_type)
    writer.int32(value.generation).string(value.protocol).string(value.leader)
    writer.int64(value.current_state_timestamp).int32(len(value.members))
    for m in value.members:
        writer.string(m.member_id).string(m.group_instance_id).string(m.client_id)
        writer.string(m.client_host).int32(m.rebalance_timeout_ms).int32(m.session_timeout_ms)
        writer.bytes_(m.subscription).bytes_(m.assignment)
    return writer.bytes()


def encode_record(record: LogRecord) -> tuple[bytes, bytes | None]:
    """(key bytes, value bytes or None) ready to go into a RecordBatch."""
    key, value = record
    return encode_key(key), encode_value(value)


def decode_key(data: bytes) -> RecordKey:
    reader = Reader(data, "__consumer_offsets key")
    version = reader.int16()
    key: RecordKey
    if version in (0, 1):
        key = OffsetCommitKey(reader.string(), reader.string(), reader.int32())
    elif version == 2:
        key = GroupMetadataKey(reader.string())
    elif version == PENDING_TXN_OFFSET_KEY_VERSION:
        key = PendingTxnOffsetKey(reader.string(), reader.string(), reader.int32(), reader.int64())
    else:
        raise CorruptRecordError(f"__consumer_offsets key: unknown version {version}")
    if not reader.done():
        raise CorruptRecordError(f"__consumer_offsets key v{version}: trailing bytes")
    return key


def decode_offset_value(data: bytes) -> OffsetCommitValue:
    reader = Reader(data, "offset commit value")
    version = reader.int16()
    if version == 3:
        offset, epoch = reader.int64(), reader.int32()
        value = OffsetCommitValue(offset, epoch, reader.string(), reader.int64())
    elif version in (0, 2):
        value = OffsetCommitValue(reader.int64(), NO_LEADER_EPOCH, reader.string(), reader.int64())
    elif version == 1:
        offset, metadata, commit_ts = reader.int64(), reader.string(), reader.int64()
        value = OffsetCommitValue(offset, NO_LEADER_EPOCH, metadata, commit_ts, reader.int64())
    else:
        raise CorruptRecordError(f"offset commit value: unknown version {version}")
    if not reader.done():
        raise CorruptRecordError(f"offset commit value v{version}: trailing bytes")
    return value


def decode_group_value(data: bytes) -> GroupMetadataValue:
    reader = Reader(data, "group metadata value")
    version = reader.int16()
    if not 0 <= version <= 3:
        raise CorruptRecordError(f"group metadata value: unknown version {version}")
    protocol_type = reader.string()
    generation = reader.int32()
    protocol = reader.nullable_string()
    leader = reader.nullable_string()
    state_ts = reader.int64() if version >= 2 else NO_TIMESTAMP
    members = []
    for _ in range(reader.array_length()):
        member_id = reader.string()
        instance_id = reader.nullable_string() if version >= 3 else None
        client_id, client_host = reader.string(), reader.string()
        rebalance_timeout = reader.int32() if version >= 1 else -1
        session_timeout = reader.int32()
        if version == 0:
            rebalance_timeout = session_timeout  # v0 had one timeout for both
        subscription = reader.nullable_bytes() or b""
        assignment = reader.nullable_bytes() or b""
        members.append(
            MemberRecord(
                member_id,
                instance_id,
                client_id,
                client_host,
                rebalance_timeout,
                session_timeout,
                subscription,
                assignment,
            )
        )
    if not reader.done():
        raise CorruptRecordError(f"group metadata value v{version}: trailing bytes")
    return GroupMetadataValue(protocol_type, generation, protocol, leader, state_ts, tuple(members))


def decode_record(key: bytes, value: bytes | None) -> LogRecord:
    """Decode one record of ``__consumer_offsets``; CorruptRecordError on malformed bytes."""
    decoded_key = decode_key(key)
    if value is None:
        return decoded_key, None
    if isinstance(decoded_key, OffsetCommitKey | PendingTxnOffsetKey):
        return decoded_key, decode_offset_value(value)
    return decoded_key, decode_group_value(value)


@dataclass
class LoadedGroup:
    """What a partition replay knows of one group: its last metadata (None if never written or
    deleted by a tombstone) and its committed offsets."""

    group_id: str
    metadata: GroupMetadataValue | None = None
    offsets: dict[TopicPartition, OffsetCommitValue] = field(default_factory=dict)
    #: Offsets of open transactions: {producer id: {partition: offset}}.
    pending_txn: dict[int, dict[TopicPartition, OffsetCommitValue]] = field(default_factory=dict)


class GroupMetadataLoader:
    """Replays the records of one ``__consumer_offsets`` partition in log order into groups and
    committed offsets (what a coordinator does when it takes the partition over).

    Invariants: the last record for a key wins; a tombstone removes its key; a group whose
    metadata was deleted and that has no offsets left is not in :meth:`groups`. Records may be
    fed as decoded pairs (:meth:`apply`) or as raw bytes (:meth:`apply_bytes`).
    """

    def __init__(self) -> None:
        self._metadata: dict[str, GroupMetadataValue] = {}
        self._offsets: dict[str, dict[TopicPartition, OffsetCommitValue]] = {}
        self._pending: dict[str, dict[int, dict[TopicPartition, OffsetCommitValue]]] = {}

    def apply(self, key: RecordKey, value: RecordValue | None) -> None:
        if isinstance(key, PendingTxnOffsetKey):
            tp = TopicPartition(key.topic, key.partition)
            by_pid = self._pending.setdefault(key.group, {})
            if value is None:
                by_pid.get(key.producer_id, {}).pop(tp, None)
                if not by_pid.get(key.producer_id, True):
                    del by_pid[key.producer_id]
                if not by_pid:
                    del self._pending[key.group]
            elif isinstance(value, OffsetCommitValue):
                by_pid.setdefault(key.producer_id, {})[tp] = value
            else:
                raise CorruptRecordError(f"pending offset key of {key.group!r} with group value")
            return
        if isinstance(key, OffsetCommitKey):
            tp = TopicPartition(key.topic, key.partition)
            if value is None:
                group_offsets = self._offsets.get(key.group)
                if group_offsets is not None:
                    group_offsets.pop(tp, None)
                    if not group_offsets:
                        del self._offsets[key.group]
            elif isinstance(value, OffsetCommitValue):
                self._offsets.setdefault(key.group, {})[tp] = value
            else:
                raise CorruptRecordError(f"offset key for group {key.group!r} with group value")
        elif value is None:
            self._metadata.pop(key.group, None)
        elif isinstance(value, GroupMetadataValue):
            self._metadata[key.group] = value
        else:
            raise CorruptRecordError(f"group key for group {key.group!r} with an offset value")

    def apply_all(self, records: Iterable[LogRecord]) -> GroupMetadataLoader:
        for key, value in records:
            self.apply(key, value)
        return self

    def apply_bytes(self, key: bytes, value: bytes | None) -> None:
        self.apply(*decode_record(key, value))

    def groups(self) -> dict[str, LoadedGroup]:
        names = set(self._metadata) | set(self._offsets) | set(self._pending)
        return {
            name: LoadedGroup(
                name,
                self._metadata.get(name),
                dict(self._offsets.get(name, {})),
                {pid: dict(o) for pid, o in self._pending.get(name, {}).items()},
            )
            for name in sorted(names)
        }


def offsets_to_expire(
    offsets: Mapping[TopicPartition, OffsetCommitValue],
    *,
    now_ms: int,
    retention_ms: int,
    group_is_empty: bool,
    protocol_type: str | None,
    empty_since_ms: int,
    subscribed_topics: frozenset[str] | None,
) -> list[TopicPartition]:
    """Kafka's offset expiry (KIP-211), pure. An offset with an explicit expire timestamp expires
    then. Otherwise:

    - Empty group with a protocol type (a consumer group whose members all left): every offset
      expires ``retention_ms`` after the group became empty (``empty_since_ms``; the commit time
      if that is unknown, as after loading a v0/v1 group record).
    - Group without a protocol type (only simple/admin commits) that is Empty: each offset
      expires ``retention_ms`` after its commit.
    - Active consumer group with known subscriptions: offsets of topics it no longer subscribes
      to expire ``retention_ms`` after their commit; the others never while it is active.
    - Any other active group: nothing expires.
    """
    expired = []
    for tp, value in offsets.items():
        if value.expire_timestamp != NO_TIMESTAMP:
            if now_ms >= value.expire_timestamp:
                expired.append(tp)
            continue
        if group_is_empty and protocol_type:
            base = empty_since_ms if empty_since_ms != NO_TIMESTAMP else value.commit_timestamp
        elif group_is_empty:
            base = value.commit_timestamp
        elif protocol_type == "consumer" and subscribed_topics is not None:
            if tp[0] in subscribed_topics:
                continue
            base = value.commit_timestamp
        else:
            continue
        if now_ms - base >= retention_ms:
            expired.append(tp)
    return sorted(expired)
