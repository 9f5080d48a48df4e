"""Replication Fetch answers on the wire without protobuf's copies of their records.

The leader serialises a follower's answer with the records joined in once
(:class:`DetachedFetchResponse`, see :class:`DetachedRecords`); the follower reads a large
answer with the records left where they arrived (:func:`decode_fetch_response`).

Read through protobuf (upb), each partition's ``records`` is copied twice on the follower:
``FetchResponse.FromString`` copies the received message into its arena, and every read of
the bytes field copies it again into a new ``bytes``. A replication answer is mostly records
(up to ``replica.fetch.max.bytes`` per partition), so :func:`decode_fetch_response` reads the
``FetchResponse`` wire format itself and hands each partition's records on as a
``memoryview`` of the message gRPC received: no copy until the follower's log writes it. The
other fields are few and small. Answers below :data:`VIEW_MIN_BYTES` (empty long-poll answers,
a session's news of many idle partitions) go through upb as before, where its C parser is the
cheaper way.

The decoded objects answer the attribute reads the fetcher and
``ReplicaManager.on_follower_fetch_response`` make of a ``broker_pb2.FetchResponse`` (proto3
defaults for absent fields, ``HasField`` for the message fields), checked field by field
against upb on generated messages (tests/unit/test_fetch_wire.py). Unknown fields are
skipped, as protobuf does; a malformed message raises :class:`FetchWireError` (gRPC fails the
call, and the fetcher retries with a new session).

Invariant: a decoded answer holds exactly the field values upb would give for the same bytes
(the last occurrence of a scalar wins, occurrences of a message field merge, repeated fields
append), with ``records`` a zero-copy view instead of ``bytes``.
"""

from __future__ import annotations

from fjord._proto import broker_pb2
from fjord.records.varint import encode_unsigned_varint

#: Answers at least this large are decoded by hand (records as views); smaller ones by upb.
VIEW_MIN_BYTES = 64 * 1024

_MASK64 = (1 << 64) - 1


class FetchWireError(ValueError):
    """The bytes are not a well-formed FetchResponse (truncated, a bad wire type, a varint
    longer than ten bytes)."""


class WireError:
    """``fjord.v1.Error``: ``code`` and ``message``."""

    __slots__ = ("code", "message")

    def __init__(self) -> None:
        self.code = 0
        self.message = ""


class WireEpochEndOffset:
    """``fjord.v1.EpochEndOffset``."""

    __slots__ = ("end_offset", "epoch")

    def __init__(self) -> None:
        self.epoch = 0
        self.end_offset = 0


class WireAbortedTransaction:
    """``fjord.v1.AbortedTransaction``."""

    __slots__ = ("first_offset", "producer_id")

    def __init__(self) -> None:
        self.producer_id = 0
        self.first_offset = 0


class WirePartition:
    """``fjord.v1.FetchPartitionResponse`` with ``records`` as a view of the received bytes."""

    __slots__ = (
        "_present", "aborted_transactions", "diverging_epoch", "error", "high_watermark",
        "last_stable_offset", "leader_epoch", "leader_id", "log_start_offset", "partition",
        "records",
    )

    def __init__(self) -> None:
        self.partition = 0
        self.error = WireError()
        self.high_watermark = 0
        self.last_stable_offset = 0
        self.log_start_offset = 0
        self.records: memoryview | bytes = b""
        self.diverging_epoch = WireEpochEndOffset()
        self.leader_id = 0
        self.leader_epoch = 0
        self.aborted_transactions: list[WireAbortedTransaction] = []
        self._present: set[str] = set()

    def HasField(self, name: str) -> bool:
        """Whether the message field ``name`` (``error`` or ``diverging_epoch``) was sent."""
        if name not in ("error", "diverging_epoch"):
            raise ValueError(f"FetchPartitionResponse has no message field {name!r}")
        return name in self._present


class WireTopic:
    """``fjord.v1.FetchTopicResponse``."""

    __slots__ = ("name", "partitions")

    def __init__(self) -> None:
        self.name = ""
        self.partitions: list[WirePartition] = []


class WireFetchResponse:
    """``fjord.v1.FetchResponse``."""

    __slots__ = ("_has_error", "error", "session_id", "topics")

    def __init__(self) -> None:
        self.error = WireError()
        self.topics: list[WireTopic] = []
        self.session_id = 0
        self._has_error = False

    def HasField(self, name: str) -> bool:
        if name != "error":
            raise ValueError(f"FetchResponse has no message field {name!r}")
        return self._has_error


def decode_fetch_response(
    data: bytes | memoryview,
) -> WireFetchResponse | broker_pb2.FetchResponse:
    """The FetchResponse in ``data`` (a follower's Fetch answer, from gRPC or a direct door):
    by hand with zero-copy records from :data:`VIEW_MIN_BYTES` on, else upb's message."""
    if len(data) < VIEW_MIN_BYTES:
        return broker_pb2.FetchResponse.FromString(data)
    return decode_fetch_response_views(data)


def decode_fetch_response_views(data: bytes | memoryview) -> WireFetchResponse:
    """``data`` decoded by hand whatever its size (records as views of ``data``)."""
    view = memoryview(data)
    out = WireFetchResponse()
    pos, end = 0, len(view)
    while pos < end:
        field, wire, pos = _tag(view, pos, end)
        if field == 1 and wire == 2:
            start, pos = _length(view, pos, end)
            _merge_error(out.error, view, start, pos)
            out._has_error = True
        elif field == 2 and wire == 2:
            start, pos = _length(view, pos, end)
            out.topics.append(_topic(view, start, pos))
        elif field == 3 and wire == 0:
            value, pos = _varint(view, pos, end)
            out.session_id = _int32(value)
        else:
            pos = _skip(view, pos, end, wire)
    return out


def _topic(view: memoryview, pos: int, end: int) -> WireTopic:
    topic = WireTopic()
    while pos < end:
        field, wire, pos = _tag(view, pos, end)
        if field == 1 and wire == 2:
            start, pos = _length(view, pos, end)
            topic.name = _text(view, start, pos)
        elif field == 2 and wire == 2:
            start, pos = _length(view, pos, end)
            topic.partitions.append(_partition(view, start, pos))
        else:
            pos = _skip(view, pos, end, wire)
    return topic


#: FetchPartitionResponse's varint fields: number -> (attribute, 32 bits?).
_PARTITION_VARINTS = {
    1: ("partition", True),
    3: ("high_watermark", False),
    4: ("last_stable_offset", False),
    5: ("log_start_offset", False),
    8: ("leader_id", True),
    9: ("leader_epoch", True),
}


def _partition(view: memoryview, pos: int, end: int) -> WirePartition:
    part = WirePartition()
    while pos < end:
        field, wire, pos = _tag(view, pos, end)
        if wire == 0 and field in _PARTITION_VARINTS:
            value, pos = _varint(view, pos, end)
            name, narrow = _PARTITION_VARINTS[field]
            setattr(part, name, _int32(value) if narrow else _int64(value))
        elif wire == 2 and field == 6:
            start, pos = _length(view, pos, end)
            part.records = view[start:pos]
        elif wire == 2 and field == 2:
            start, pos = _length(view, pos, end)
            _merge_error(part.error, view, start, pos)
            part._present.add("error")
        elif wire == 2 and field == 7:
            start, pos = _length(view, pos, end)
            _merge_epoch_end_offset(part.diverging_epoch, view, start, pos)
            part._present.add("diverging_epoch")
        elif wire == 2 and field == 10:
            start, pos = _length(view, pos, end)
            part.aborted_transactions.append(_aborted(view, start, pos))
        else:
            pos = _skip(view, pos, end, wire)
    return part


def _merge_error(error: WireError, view: memoryview, pos: int, end: int) -> None:
    while pos < end:
        field, wire, pos = _tag(view, pos, end)
        if field == 1 and wire == 0:
            value, pos = _varint(view, pos, end)
            error.code = _int32(value)
        elif field == 2 and wire == 2:
            start, pos = _length(view, pos, end)
            error.message = _text(view, start, pos)
        else:
            pos = _skip(view, pos, end, wire)


def _merge_epoch_end_offset(
    epoch: WireEpochEndOffset, view: memoryview, pos: int, end: int
) -> None:
    while pos < end:
        field, wire, pos = _tag(view, pos, end)
        if field == 1 and wire == 0:
            value, pos = _varint(view, pos, end)
            epoch.epoch = _int32(value)
        elif field == 2 and wire == 0:
            value, pos = _varint(view, pos, end)
            epoch.end_offset = _int64(value)
        else:
            pos = _skip(view, pos, end, wire)


def _aborted(view: memoryview, pos: int, end: int) -> WireAbortedTransaction:
    txn = WireAbortedTransaction()
    while pos < end:
        field, wire, pos = _tag(view, pos, end)
        if field == 1 and wire == 0:
            value, pos = _varint(view, pos, end)
            txn.producer_id = _int64(value)
        elif field == 2 and wire == 0:
            value, pos = _varint(view, pos, end)
            txn.first_offset = _int64(value)
        else:
            pos = _skip(view, pos, end, wire)
    return txn


def _varint(view: memoryview, pos: int, end: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` (at most ten bytes, as protobuf) and the position after."""
    result = shift = 0
    while True:
        if pos >= end:
            raise FetchWireError("FetchResponse ends inside a varint")
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _MASK64, pos
        shift += 7
        if shift >= 70:
            raise FetchWireError("FetchResponse has a varint longer than ten bytes")


def _tag(view: memoryview, pos: int, end: int) -> tuple[int, int, int]:
    key, pos = _varint(view, pos, end)
    field = key >> 3
    if field == 0:
        raise FetchWireError("FetchResponse has a field number 0")
    return field, key & 7, pos


def _length(view: memoryview, pos: int, end: int) -> tuple[int, int]:
    """The start and end of the length-delimited value whose length is at ``pos``."""
    size, pos = _varint(view, pos, end)
    if size > end - pos:
        raise FetchWireError("FetchResponse has a field running past its message")
    return pos, pos + size


def _skip(view: memoryview, pos: int, end: int, wire: int) -> int:
    """The position after an unknown field's value of wire type ``wire``."""
    if wire == 0:
        return _varint(view, pos, end)[1]
    if wire == 2:
        return _length(view, pos, end)[1]
    size = {1: 8, 5: 4}.get(wire)
    if size is None:  # groups (3, 4) are not proto3; 6 and 7 do not exist
        raise FetchWireError(f"FetchResponse has a field of wire type {wire}")
    if size > end - pos:
        raise FetchWireError("FetchResponse ends inside a fixed-size field")
    return pos + size


def _text(view: memoryview, start: int, end: int) -> str:
    try:
        return str(view[start:end], "utf-8")
    except UnicodeDecodeError as exc:
        raise FetchWireError(f"FetchResponse has a string that is not UTF-8: {exc}") from None


def _int32(value: int) -> int:
    """A varint as protobuf's int32 (negative values arrive sign-extended to 64 bits; upb
    keeps the low 32 bits)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value



# --- the leader's side: a Fetch answer serialised with its records joined in once ---------

#: Keys (field number << 3 | wire type 2) of FetchResponse.topics, FetchTopicResponse.partitions
#: and FetchPartitionResponse.records.
_TOPICS_KEY = b"\x12"
_PARTITIONS_KEY = b"\x12"
_RECORDS_KEY = b"\x32"


class DetachedRecords:
    """The records of a follower's Fetch answer, kept out of the protobuf message.

    Set into a ``bytes`` field, upb copies the records into its arena, and
    ``SerializeToString`` copies them again; :class:`DetachedFetchResponse` instead serialises
    the message without them and joins each partition's records in (one copy). Keys are the
    partition's place in the answer: (index of its topic, index in that topic's partitions).
    """

    __slots__ = ("records",)

    def __init__(self) -> None:
        self.records: dict[tuple[int, int], bytes | bytearray | memoryview] = {}

    def attach_to(
        self, message: broker_pb2.FetchResponse
    ) -> broker_pb2.FetchResponse | DetachedFetchResponse:
        """What gRPC serialises for ``message``: itself when nothing was kept apart."""
        if not self.records:
            return message
        return DetachedFetchResponse(message, self.records)


class DetachedFetchResponse:
    """A FetchResponse whose partitions' records are given apart; :meth:`serialize` gives
    the bytes of the message with each set (protobuf's wire format allows a field after the
    others, so parsers read exactly the message with the records set)."""

    __slots__ = ("message", "records")

    def __init__(
        self, message: broker_pb2.FetchResponse,
        records: dict[tuple[int, int], bytes | bytearray | memoryview],
    ) -> None:
        self.message = message
        self.records = records

    def serialize(self) -> bytes:
        message = self.message
        head = broker_pb2.FetchResponse(session_id=message.session_id)
        if message.HasField("error"):
            head.error.CopyFrom(message.error)
        parts: list[bytes | bytearray | memoryview] = [head.SerializeToString()]
        for t, topic in enumerate(message.topics):
            topic_parts: list[bytes | bytearray | memoryview] = [
                broker_pb2.FetchTopicResponse(name=topic.name).SerializeToString()
            ]
            for p, partition in enumerate(topic.partitions):
                fields = partition.SerializeToString()
                records = self.records.get((t, p))
                if records:
                    size = len(records)
                    record_prefix = _RECORDS_KEY + encode_unsigned_varint(size)
                    topic_parts += [
                        _PARTITIONS_KEY,
                        encode_unsigned_varint(len(fields) + len(record_prefix) + size),
                        fields, record_prefix, records,
                    ]
                else:
                    topic_parts += [_PARTITIONS_KEY, encode_unsigned_varint(len(fields)), fields]
            parts += [_TOPICS_KEY, encode_unsigned_varint(sum(map(len, topic_parts)))]
            parts += topic_parts
        return b"".join(parts)


def serialize_fetch_response(response: broker_pb2.FetchResponse | DetachedFetchResponse) -> bytes:
    """gRPC's response serializer for the Broker service's Fetch."""
    if isinstance(response, DetachedFetchResponse):
        return response.serialize()
    return response.SerializeToString()
