"""Hand-written codecs for the listener's hottest messages: Fetch requests (v4-v12) and
responses, Produce requests (v3-v12) and responses, straight between the wire bytes and plain
Python values, without kafka-python's message objects.

Why: with kafka-python's generated classes a one-partition Fetch costs ~12 us to decode and ~40
us to build and encode (one DataContainer per topic, partition and nested struct, the marker
search of fjord.kafka.zerocopy afterwards); on a broker spending ~300 us of CPU per request
that was the largest piece of the listener's own work (bench/RESULTS.md, "kafka listener:
per-request cost").

Kafka's message specs stay the only authority: nothing here is trusted on its own. Property
tests (tests/unit/test_kafka_fastpath.py) encode random messages with kafka-python's classes
(generated from Kafka's JSON specs) and check that these decoders read the same values, and
that these encoders write byte for byte what kafka-python writes for the same response, in
every version the listener serves. Record batches are never parsed here: Produce hands each
partition's ``records`` on as bytes, Fetch writes the log's bytes (or a file region to
``sendfile``) as they are.

Bad input: every decoder raises :class:`~fjord.kafka.codec.MalformedFrameError` (the
listener's answer is to close the connection, as for kafka-python's decoder) for a truncated
frame, a negative length, a null where the spec allows none, or a name that is not UTF-8.
Bytes after the body are ignored, as kafka-python does.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fjord.kafka.codec import MalformedFrameError
from fjord.kafka.zerocopy import Part
from fjord.records.varint import encode_unsigned_varint as _uvarint
from fjord.storage.region import FileRegion

FETCH_VERSIONS = (4, 12)
"""Fetch versions these codecs read and write (the listener's range; v13+ name topics by id)."""
PRODUCE_VERSIONS = (3, 12)
"""Produce versions these codecs read and write (the listener's range; v13 names topics by
id)."""
FETCH_FIRST_FLEXIBLE = 12
PRODUCE_FIRST_FLEXIBLE = 9

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_HEADER = struct.Struct(">hhih")  # api_key, api_version, correlation_id, client_id length


class _Frame:
    """A read position in one request frame. Every read raises IndexError/struct.error past
    the end; the public decoders turn those into MalformedFrameError."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | memoryview, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def i8(self) -> int:
        value: int = _I8.unpack_from(self.data, self.pos)[0]
        self.pos += 1
        return value

    def i16(self) -> int:
        value: int = _I16.unpack_from(self.data, self.pos)[0]
        self.pos += 2
        return value

    def i32(self) -> int:
        value: int = _I32.unpack_from(self.data, self.pos)[0]
        self.pos += 4
        return value

    def i64(self) -> int:
        value: int = _I64.unpack_from(self.data, self.pos)[0]
        self.pos += 8
        return value

    def uvarint(self) -> int:
        data, pos = self.data, self.pos
        value = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
            if shift > 28:
                raise MalformedFrameError("an unsigned varint longer than 5 bytes")
        self.pos = pos
        return value

    def take(self, size: int) -> bytes:
        end = self.pos + size
        if end > len(self.data):
            raise MalformedFrameError(
                f"a field of {size} bytes runs past the end of the {len(self.data)}-byte frame"
            )
        value = bytes(self.data[self.pos:end])
        self.pos = end
        return value

    # -- Kafka's field types, classic (int16/int32 lengths) and compact (uvarint length + 1) --

    def string(self, flexible: bool, what: str) -> str:
        value = self.nullable_string(flexible)
        if value is None:
            raise MalformedFrameError(f"{what}: null where the spec allows no null")
        return value

    def nullable_string(self, flexible: bool) -> str | None:
        size = self.uvarint() - 1 if flexible else self.i16()
        if size < 0:
            if size == -1:
                return None
            raise MalformedFrameError(f"string length {size}")
        return self.take(size).decode("utf-8")

    def nullable_bytes(self, flexible: bool) -> bytes | None:
        size = self.uvarint() - 1 if flexible else self.i32()
        if size < 0:
            if size == -1:
                return None
            raise MalformedFrameError(f"bytes length {size}")
        return self.take(size)

    def array_length(self, flexible: bool, what: str) -> int:
        size = self.uvarint() - 1 if flexible else self.i32()
        if size < 0:
            raise MalformedFrameError(f"{what}: array length {size} (null where the spec "
                                      "allows no null)")
        if size > len(self.data) - self.pos:  # each element takes at least one byte
            raise MalformedFrameError(f"{what}: array of {size} elements in "
                                      f"{len(self.data) - self.pos} bytes")
        return size

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # the tag: none of the tagged request fields is read here
            self.take(self.uvarint())


@dataclass(slots=True)
class RequestHeader:
    """A request header (v1, or v2 with tagged fields skipped)."""

    request_api_key: int
    request_api_version: int
    correlation_id: int
    client_id: str | None


def _header(frame: _Frame, flexible: bool) -> RequestHeader:
    api_key, api_version, correlation_id, size = _HEADER.unpack_from(frame.data, 0)
    frame.pos = _HEADER.size
    if size < -1:
        raise MalformedFrameError(f"client_id length {size}")
    client_id = None if size == -1 else frame.take(size).decode("utf-8")
    if flexible:
        frame.skip_tagged_fields()
    return RequestHeader(api_key, api_version, correlation_id, client_id)


def _decoding(what: str, version: int, decode: Any, frame: bytes | memoryview) -> Any:
    try:
        return decode(_Frame(frame), version)
    except MalformedFrameError as exc:
        raise MalformedFrameError(f"{what} v{version} does not parse: {exc}") from exc
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        raise MalformedFrameError(
            f"{what} v{version} does not parse: {type(exc).__name__}: {exc}"
        ) from exc


# --- Fetch request -------------------------------------------------------------------------------


@dataclass(slots=True)
class FetchPartition:
    partition: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    log_start_offset: int
    partition_max_bytes: int


@dataclass(slots=True)
class FetchTopic:
    topic: str
    partitions: list[FetchPartition]


@dataclass(slots=True)
class ForgottenTopic:
    topic: str
    partitions: list[int]


class FetchRequestFields:
    """A decoded Fetch request: kafka-python's attribute names (snake case of the spec's),
    fields of versions before their introduction at the spec's defaults."""

    __slots__ = ("forgotten_topics_data", "header", "isolation_level", "max_bytes",
                 "max_wait_ms", "min_bytes", "rack_id", "replica_id", "session_epoch",
                 "session_id", "topics")

    header: RequestHeader
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    session_id: int
    session_epoch: int
    topics: list[FetchTopic]
    forgotten_topics_data: list[ForgottenTopic]
    rack_id: str


_FETCH_HEAD = struct.Struct(">iiiib")  # replica_id, max_wait, min_bytes, max_bytes, isolation
_SESSION = struct.Struct(">ii")


def _decode_fetch(frame: _Frame, version: int) -> FetchRequestFields:
    flexible = version >= FETCH_FIRST_FLEXIBLE
    out = FetchRequestFields()
    out.header = _header(frame, flexible)
    data = frame.data
    (out.replica_id, out.max_wait_ms, out.min_bytes, out.max_bytes,
     out.isolation_level) = _FETCH_HEAD.unpack_from(data, frame.pos)
    frame.pos += _FETCH_HEAD.size
    if version >= 7:
        out.session_id, out.session_epoch = _SESSION.unpack_from(data, frame.pos)
        frame.pos += _SESSION.size
    else:
        out.session_id, out.session_epoch = 0, -1
    topics = []
    for _ in range(frame.array_length(flexible, "topics")):
        name = frame.string(flexible, "topic")
        partitions = []
        for _ in range(frame.array_length(flexible, "partitions")):
            partition = frame.i32()
            current_leader_epoch = frame.i32() if version >= 9 else -1
            fetch_offset = frame.i64()
            last_fetched_epoch = frame.i32() if version >= 12 else -1
            log_start_offset = frame.i64() if version >= 5 else -1
            partitions.append(FetchPartition(
                partition, current_leader_epoch, fetch_offset, last_fetched_epoch,
                log_start_offset, frame.i32()))
            if flexible:
                frame.skip_tagged_fields()
        topics.append(FetchTopic(name, partitions))
        if flexible:
            frame.skip_tagged_fields()
    out.topics = topics
    forgotten = []
    if version >= 7:
        for _ in range(frame.array_length(flexible, "forgotten_topics_data")):
            name = frame.string(flexible, "forgotten topic")
            indexes = [frame.i32()
                       for _ in range(frame.array_length(flexible, "forgotten partitions"))]
            forgotten.append(ForgottenTopic(name, indexes))
            if flexible:
                frame.skip_tagged_fields()
    out.forgotten_topics_data = forgotten
    out.rack_id = frame.string(flexible, "rack_id") if version >= 11 else ""
    if flexible:
        frame.skip_tagged_fields()  # ClusterId (tag 0) is not used
    return out


def decode_fetch_request(frame: bytes | memoryview, version: int) -> FetchRequestFields:
    """A Fetch request frame (size prefix excluded, header included) at ``version``
    (FETCH_VERSIONS)."""
    if not FETCH_VERSIONS[0] <= version <= FETCH_VERSIONS[1]:
        raise ValueError(f"Fetch v{version} is outside {FETCH_VERSIONS}")
    result: FetchRequestFields = _decoding("FetchRequest", version, _decode_fetch, frame)
    return result


# --- Produce request -----------------------------------------------------------------------------


@dataclass(slots=True)
class PartitionProduceData:
    index: int
    records: bytes | None


@dataclass(slots=True)
class TopicProduceData:
    name: str
    partition_data: list[PartitionProduceData]


@dataclass(slots=True)
class ProduceRequestFields:
    """A decoded Produce request (kafka-python's attribute names); each partition's
    ``records`` are the request's bytes, unparsed."""

    header: RequestHeader
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list[TopicProduceData]


def _decode_produce(frame: _Frame, version: int) -> ProduceRequestFields:
    flexible = version >= PRODUCE_FIRST_FLEXIBLE
    header = _header(frame, flexible)
    transactional_id = frame.nullable_string(flexible)
    acks = frame.i16()
    timeout_ms = frame.i32()
    topics = []
    for _ in range(frame.array_length(flexible, "topic_data")):
        name = frame.string(flexible, "topic name")
        partitions = []
        for _ in range(frame.array_length(flexible, "partition_data")):
            index = frame.i32()
            partitions.append(PartitionProduceData(index, frame.nullable_bytes(flexible)))
            if flexible:
                frame.skip_tagged_fields()
        topics.append(TopicProduceData(name, partitions))
        if flexible:
            frame.skip_tagged_fields()
    if flexible:
        frame.skip_tagged_fields()
    return ProduceRequestFields(header, transactional_id, acks, timeout_ms, topics)


def decode_produce_request(frame: bytes | memoryview, version: int) -> ProduceRequestFields:
    """A Produce request frame (size prefix excluded, header included) at ``version``
    (PRODUCE_VERSIONS)."""
    if not PRODUCE_VERSIONS[0] <= version <= PRODUCE_VERSIONS[1]:
        raise ValueError(f"Produce v{version} is outside {PRODUCE_VERSIONS}")
    result: ProduceRequestFields = _decoding("ProduceRequest", version, _decode_produce, frame)
    return result


# --- Responses -----------------------------------------------------------------------------------


_NO_TAGS = b"\x00"


class EncodedResponse:
    """A response body already in wire bytes, with file regions to ``sendfile`` between them:
    the listener adds the size prefix and the response header (``flexible``: header v1, with
    its empty tagged fields). ``size`` is the body's length on the wire, regions included."""

    __slots__ = ("flexible", "parts", "size")

    def __init__(self, parts: list[Part], size: int, flexible: bool) -> None:
        self.parts = parts
        self.size = size
        self.flexible = flexible

    def frame_parts(self, correlation_id: int) -> list[Part]:
        """The whole frame: the size prefix and header joined to the first bytes part."""
        header = _I32.pack(correlation_id) + (_NO_TAGS if self.flexible else b"")
        prefix = _I32.pack(self.size + len(header)) + header
        parts = self.parts
        first = parts[0] if parts else b""
        if isinstance(first, FileRegion):
            return [prefix, *parts]
        return [prefix + first, *parts[1:]]


class _Writer:
    """Appends encoded fields to a buffer; a file region ends the current bytes part."""

    __slots__ = ("buffer", "flexible", "parts", "size")

    def __init__(self, flexible: bool) -> None:
        self.flexible = flexible
        self.buffer = bytearray()
        self.parts: list[Part] = []
        self.size = 0

    def array_length(self, count: int) -> None:
        self.buffer += _uvarint(count + 1) if self.flexible else _I32.pack(count)

    def string(self, value: str) -> None:
        data = value.encode("utf-8")
        self.buffer += (_uvarint(len(data) + 1) if self.flexible else _I16.pack(len(data)))
        self.buffer += data

    def nullable_string(self, value: str | None) -> None:
        if value is None:
            self.buffer += b"\x00" if self.flexible else b"\xff\xff"
        else:
            self.string(value)

    def records(self, value: bytes | FileRegion | None) -> None:
        flexible = self.flexible
        if value is None:
            self.buffer += b"\x00" if flexible else b"\xff\xff\xff\xff"
            return
        count = len(value)
        self.buffer += _uvarint(count + 1) if flexible else _I32.pack(count)
        if isinstance(value, FileRegion):
            if count:
                self.parts.append(bytes(self.buffer))
                self.size += len(self.buffer)
                self.buffer.clear()
                self.parts.append(value)
                self.size += count
            else:
                value.close()
        else:
            self.buffer += value

    def finish(self) -> EncodedResponse:
        if self.buffer or not self.parts:
            self.parts.append(bytes(self.buffer))
            self.size += len(self.buffer)
        return EncodedResponse(self.parts, self.size, self.flexible)


#: One tagged field: tag 1 (CurrentLeader), 9 bytes: leader_id, leader_epoch, no tags.
_LEADER_TAG = struct.Struct(">bbbiib")
_ABORTED = struct.Struct(">qq")
_FETCH_PARTITION = {
    # partition_index, error_code, high_watermark, last_stable_offset[, log_start_offset]
    4: struct.Struct(">ihqq"),
    5: struct.Struct(">ihqqq"),
}
_THROTTLE_ERROR_SESSION = struct.Struct(">ihi")


class FetchResponseWriter:
    """Writes a Fetch response body at ``version`` (FETCH_VERSIONS), topic by topic, partition
    by partition, in the order the spec lays them out; records go in as bytes or as a
    :class:`FileRegion` (which becomes its own part, for ``sendfile``; the writer owns it from
    then on: an empty one is closed at once, the rest by whoever sends the parts)."""

    __slots__ = ("_head", "_version", "_w")

    def __init__(self, version: int, throttle_time_ms: int, error_code: int, session_id: int,
                 topic_count: int) -> None:
        if not FETCH_VERSIONS[0] <= version <= FETCH_VERSIONS[1]:
            raise ValueError(f"Fetch v{version} is outside {FETCH_VERSIONS}")
        self._version = version
        self._w = _Writer(version >= FETCH_FIRST_FLEXIBLE)
        self._head = _FETCH_PARTITION[5 if version >= 5 else 4]
        if version >= 7:
            self._w.buffer += _THROTTLE_ERROR_SESSION.pack(throttle_time_ms, error_code,
                                                           session_id)
        else:
            self._w.buffer += _I32.pack(throttle_time_ms)
        self._w.array_length(topic_count)

    def topic(self, name: str, partition_count: int) -> None:
        """Start the next topic (close the previous one with :meth:`end_topic`)."""
        self._w.string(name)
        self._w.array_length(partition_count)

    def end_topic(self) -> None:
        if self._w.flexible:
            self._w.buffer += _NO_TAGS

    def partition(
        self, index: int, error_code: int, high_watermark: int, last_stable_offset: int,
        log_start_offset: int, aborted: Sequence[tuple[int, int]] | None,
        preferred_read_replica: int, records: bytes | FileRegion | None,
        leader_id: int = -1, leader_epoch: int = -1,
    ) -> None:
        w, version = self._w, self._version
        if version >= 5:
            w.buffer += self._head.pack(index, error_code, high_watermark, last_stable_offset,
                                        log_start_offset)
        else:
            w.buffer += self._head.pack(index, error_code, high_watermark, last_stable_offset)
        if aborted is None:
            w.buffer += b"\x00" if w.flexible else b"\xff\xff\xff\xff"
        else:
            w.array_length(len(aborted))
            for producer_id, first_offset in aborted:
                w.buffer += _ABORTED.pack(producer_id, first_offset)
                if w.flexible:
                    w.buffer += _NO_TAGS
        if version >= 11:
            w.buffer += _I32.pack(preferred_read_replica)
        w.records(records)
        if w.flexible:
            # Tagged fields: CurrentLeader (tag 1) always, as the listener always answered
            # through kafka-python (which writes a tagged struct that is set, even at its
            # defaults); DivergingEpoch and SnapshotId are never set here.
            w.buffer += _LEADER_TAG.pack(1, 1, 9, leader_id, leader_epoch, 0)

    def finish(self) -> EncodedResponse:
        if self._w.flexible:
            self._w.buffer += _NO_TAGS
        return self._w.finish()


_PRODUCE_PARTITION = {
    # index, error_code, base_offset, log_append_time_ms[, log_start_offset]
    3: struct.Struct(">ihqq"),
    5: struct.Struct(">ihqqq"),
}


class ProduceResponseWriter:
    """Writes a Produce response body at ``version`` (PRODUCE_VERSIONS); record_errors are
    always empty (Fjord refuses a batch whole) and CurrentLeader is never set."""

    __slots__ = ("_head", "_throttle_time_ms", "_version", "_w")

    def __init__(self, version: int, throttle_time_ms: int, topic_count: int) -> None:
        if not PRODUCE_VERSIONS[0] <= version <= PRODUCE_VERSIONS[1]:
            raise ValueError(f"Produce v{version} is outside {PRODUCE_VERSIONS}")
        self._version = version
        self._throttle_time_ms = throttle_time_ms
        self._w = _Writer(version >= PRODUCE_FIRST_FLEXIBLE)
        self._head = _PRODUCE_PARTITION[5 if version >= 5 else 3]
        self._w.array_length(topic_count)

    def topic(self, name: str, partition_count: int) -> None:
        self._w.string(name)
        self._w.array_length(partition_count)

    def end_topic(self) -> None:
        if self._w.flexible:
            self._w.buffer += _NO_TAGS

    def partition(self, index: int, error_code: int, base_offset: int, log_append_time_ms: int,
                  log_start_offset: int, error_message: str | None) -> None:
        w, version = self._w, self._version
        if version >= 5:
            w.buffer += self._head.pack(index, error_code, base_offset, log_append_time_ms,
                                        log_start_offset)
        else:
            w.buffer += self._head.pack(index, error_code, base_offset, log_append_time_ms)
        if version >= 8:
            w.array_length(0)  # record_errors
            w.nullable_string(error_message)
        if w.flexible:
            w.buffer += _NO_TAGS

    def finish(self) -> EncodedResponse:
        self._w.buffer += _I32.pack(self._throttle_time_ms)
        if self._w.flexible:
            self._w.buffer += _NO_TAGS
        return self._w.finish()
