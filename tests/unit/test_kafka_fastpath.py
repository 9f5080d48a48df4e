"""The hand-written Produce/Fetch codecs (fjord.kafka.fastpath) against kafka-python's classes
(generated from Kafka's JSON message specs), the oracle: at every version the listener serves,
the fast decoders read from kafka-python's encoding of a random request the values kafka-python
reads back, and the fast encoders write byte for byte the frame kafka-python writes for the
same response (records given as bytes or as a file region to sendfile). Bad frames (truncated
anywhere, negative lengths, nulls the spec forbids, names that are not UTF-8, overlong varints)
raise MalformedFrameError."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

from fjord.kafka.codec import MalformedFrameError, decode_request, encode_response
from fjord.kafka.fastpath import (
    FETCH_VERSIONS,
    PRODUCE_VERSIONS,
    FetchResponseWriter,
    ProduceResponseWriter,
    decode_fetch_request,
    decode_produce_request,
)
from fjord.kafka.zerocopy import materialize
from fjord.storage.region import FileRegion

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
INT16 = st.integers(-(2**15), 2**15 - 1)
NAMES = st.text(min_size=0, max_size=12)
CLIENT_IDS = st.one_of(st.none(), st.text(max_size=10))
FETCH_VERSION = st.integers(*FETCH_VERSIONS)
PRODUCE_VERSION = st.integers(*PRODUCE_VERSIONS)


def _request_frame(request: Any, version: int, client_id: str | None) -> bytes:
    request.with_header(correlation_id=7, client_id=client_id)
    return bytes(request.encode(version=version, header=True, framed=False))


# --- Fetch request ----------------------------------------------------------------------------

fetch_partitions = st.lists(st.fixed_dictionaries({
    "partition": INT32, "current_leader_epoch": INT32, "fetch_offset": INT64,
    "last_fetched_epoch": INT32, "log_start_offset": INT64, "partition_max_bytes": INT32,
}), max_size=3)
fetch_requests = st.fixed_dictionaries({
    "replica_id": INT32, "max_wait_ms": INT32, "min_bytes": INT32, "max_bytes": INT32,
    "isolation_level": st.integers(-128, 127), "session_id": INT32, "session_epoch": INT32,
    "topics": st.lists(st.tuples(NAMES, fetch_partitions), max_size=3),
    "forgotten": st.lists(st.tuples(NAMES, st.lists(INT32, max_size=3)), max_size=2),
    "rack_id": NAMES, "cluster_id": st.one_of(st.none(), NAMES),
})


def fetch_request(version: int, values: dict[str, Any]) -> Any:
    cls = FetchRequest[version]
    topic_cls = cls.FetchTopic
    return cls(
        replica_id=values["replica_id"], max_wait_ms=values["max_wait_ms"],
        min_bytes=values["min_bytes"], max_bytes=values["max_bytes"],
        isolation_level=values["isolation_level"], session_id=values["session_id"],
        session_epoch=values["session_epoch"],
        topics=[topic_cls(topic=name, partitions=[topic_cls.FetchPartition(**p) for p in parts])
                for name, parts in values["topics"]],
        forgotten_topics_data=[cls.ForgottenTopic(topic=name, partitions=indexes)
                               for name, indexes in values["forgotten"]],
        rack_id=values["rack_id"], cluster_id=values["cluster_id"],
    )


def fetch_fields(request: Any, version: int) -> dict[str, Any]:
    """What the broker's Fetch handler reads of a request, version by version."""
    out: dict[str, Any] = {
        "client_id": request.header.client_id,
        "correlation_id": request.header.correlation_id,
        "max_wait_ms": request.max_wait_ms, "min_bytes": request.min_bytes,
        "max_bytes": request.max_bytes, "isolation_level": request.isolation_level,
        "replica_id": request.replica_id,
        "topics": [(t.topic, [
            (p.partition, p.fetch_offset, p.partition_max_bytes,
             p.current_leader_epoch if version >= 9 else None,
             p.last_fetched_epoch if version >= 12 else None,
             p.log_start_offset if version >= 5 else None)
            for p in t.partitions]) for t in request.topics],
    }
    if version >= 7:
        out["session"] = (request.session_id, request.session_epoch)
        out["forgotten"] = [(f.topic, list(f.partitions))
                            for f in request.forgotten_topics_data or ()]
    if version >= 11:
        out["rack_id"] = request.rack_id
    return out


@settings(max_examples=150, deadline=None)
@given(version=FETCH_VERSION, values=fetch_requests, client_id=CLIENT_IDS)
def test_fetch_request_decodes_as_kafka_python_reads_it(
    version: int, values: dict[str, Any], client_id: str | None
) -> None:
    frame = _request_frame(fetch_request(version, values), version, client_id)
    oracle = decode_request(frame, FetchRequest, version)
    fast = decode_fetch_request(frame, version)
    assert fetch_fields(fast, version) == fetch_fields(oracle, version)


# --- Produce request --------------------------------------------------------------------------

produce_requests = st.fixed_dictionaries({
    "transactional_id": st.one_of(st.none(), NAMES), "acks": INT16, "timeout_ms": INT32,
    "topics": st.lists(st.tuples(NAMES, st.lists(st.tuples(
        INT32, st.one_of(st.none(), st.binary(max_size=200))), max_size=3)), max_size=3),
})


def produce_request(version: int, values: dict[str, Any]) -> Any:
    cls = ProduceRequest[version]
    topic_cls = cls.TopicProduceData
    part_cls = topic_cls.PartitionProduceData
    return cls(
        transactional_id=values["transactional_id"], acks=values["acks"],
        timeout_ms=values["timeout_ms"],
        topic_data=[topic_cls(name=name, partition_data=[
            part_cls(index=index, records=records) for index, records in parts])
            for name, parts in values["topics"]],
    )


def produce_fields(request: Any) -> dict[str, Any]:
    return {
        "client_id": request.header.client_id,
        "correlation_id": request.header.correlation_id,
        "transactional_id": request.transactional_id, "acks": request.acks,
        "timeout_ms": request.timeout_ms,
        "topics": [(t.name, [(p.index, None if p.records is None else bytes(p.records))
                             for p in t.partition_data]) for t in request.topic_data],
    }


@settings(max_examples=150, deadline=None)
@given(version=PRODUCE_VERSION, values=produce_requests, client_id=CLIENT_IDS)
def test_produce_request_decodes_as_kafka_python_reads_it(
    version: int, values: dict[str, Any], client_id: str | None
) -> None:
    frame = _request_frame(produce_request(version, values), version, client_id)
    oracle = decode_request(frame, ProduceRequest, version)
    fast = decode_produce_request(frame, version)
    assert produce_fields(fast) == produce_fields(oracle)


# --- Fetch response ---------------------------------------------------------------------------

fetch_answer_partitions = st.lists(st.fixed_dictionaries({
    "index": INT32, "error_code": INT16, "high_watermark": INT64,
    "last_stable_offset": INT64, "log_start_offset": INT64,
    "aborted": st.one_of(st.none(), st.lists(st.tuples(INT64, INT64), max_size=2)),
    "preferred_read_replica": INT32,
    "records": st.one_of(st.none(), st.binary(max_size=300)),
    "as_region": st.booleans(),
    "leader": st.one_of(st.just((-1, -1)), st.tuples(INT32, INT32)),
}), max_size=3)
fetch_answers = st.fixed_dictionaries({
    "throttle_time_ms": INT32, "error_code": INT16, "session_id": INT32,
    "topics": st.lists(st.tuples(NAMES, fetch_answer_partitions), max_size=3),
    "correlation_id": INT32,
})


def kafka_python_fetch_frame(version: int, answer: dict[str, Any]) -> bytes:
    cls = FetchResponse[version]
    topic_cls = cls.FetchableTopicResponse
    part_cls = topic_cls.PartitionData
    response = cls(
        throttle_time_ms=answer["throttle_time_ms"], error_code=answer["error_code"],
        session_id=answer["session_id"],
        responses=[topic_cls(topic=name, partitions=[part_cls(
            partition_index=p["index"], error_code=p["error_code"],
            high_watermark=p["high_watermark"], last_stable_offset=p["last_stable_offset"],
            log_start_offset=p["log_start_offset"],
            aborted_transactions=None if p["aborted"] is None else [
                part_cls.AbortedTransaction(producer_id=a, first_offset=b)
                for a, b in p["aborted"]],
            preferred_read_replica=p["preferred_read_replica"],
            current_leader=part_cls.LeaderIdAndEpoch(leader_id=p["leader"][0],
                                                     leader_epoch=p["leader"][1]),
            records=p["records"]) for p in parts]) for name, parts in answer["topics"]],
    )
    return bytes(encode_response(response, answer["correlation_id"], version))


@settings(max_examples=150, deadline=None)
@given(version=FETCH_VERSION, answer=fetch_answers)
def test_fetch_response_encodes_as_kafka_python_does(
    tmp_path_factory: pytest.TempPathFactory, version: int, answer: dict[str, Any]
) -> None:
    path = tmp_path_factory.mktemp("fastpath") / "segment"
    path.write_bytes(b"".join(p["records"] or b"" for _, parts in answer["topics"]
                              for p in parts))
    fd = os.open(path, os.O_RDONLY)
    try:
        out = FetchResponseWriter(version, answer["throttle_time_ms"], answer["error_code"],
                                  answer["session_id"], len(answer["topics"]))
        position = 0
        regions = []
        for name, parts in answer["topics"]:
            out.topic(name, len(parts))
            for p in parts:
                records: bytes | FileRegion | None = p["records"]
                if p["records"] is not None and p["as_region"]:
                    records = FileRegion(os.dup(fd), position, len(p["records"]))
                    regions.append(records)
                position += len(p["records"] or b"")
                out.partition(p["index"], p["error_code"], p["high_watermark"],
                              p["last_stable_offset"], p["log_start_offset"], p["aborted"],
                              p["preferred_read_replica"], records, *p["leader"])
            out.end_topic()
        parts_out = out.finish().frame_parts(answer["correlation_id"])
        # Only non-empty regions become parts of their own (an empty one is closed at once).
        assert [p for p in parts_out if isinstance(p, FileRegion)] == [r for r in regions if r]
        assert materialize(parts_out) == kafka_python_fetch_frame(version, answer)
    finally:
        os.close(fd)
        for region in regions:
            region.close()


# --- Produce response -------------------------------------------------------------------------

produce_answers = st.fixed_dictionaries({
    "throttle_time_ms": INT32, "correlation_id": INT32,
    "topics": st.lists(st.tuples(NAMES, st.lists(st.fixed_dictionaries({
        "index": INT32, "error_code": INT16, "base_offset": INT64,
        "log_append_time_ms": INT64, "log_start_offset": INT64,
        "error_message": st.one_of(st.none(), NAMES),
    }), max_size=3)), max_size=3),
})


@settings(max_examples=150, deadline=None)
@given(version=PRODUCE_VERSION, answer=produce_answers)
def test_produce_response_encodes_as_kafka_python_does(
    version: int, answer: dict[str, Any]
) -> None:
    cls = ProduceResponse[version]
    topic_cls = cls.TopicProduceResponse
    part_cls = topic_cls.PartitionProduceResponse
    response = cls(throttle_time_ms=answer["throttle_time_ms"], responses=[
        topic_cls(name=name, partition_responses=[part_cls(record_errors=[], **p)
                                                  for p in parts])
        for name, parts in answer["topics"]])
    expected = bytes(encode_response(response, answer["correlation_id"], version))
    out = ProduceResponseWriter(version, answer["throttle_time_ms"], len(answer["topics"]))
    for name, parts in answer["topics"]:
        out.topic(name, len(parts))
        for p in parts:
            out.partition(p["index"], p["error_code"], p["base_offset"],
                          p["log_append_time_ms"], p["log_start_offset"], p["error_message"])
        out.end_topic()
    assert materialize(out.finish().frame_parts(answer["correlation_id"])) == expected


# --- Bad frames -------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(version=FETCH_VERSION, values=fetch_requests)
def test_every_truncated_fetch_request_is_malformed(version: int, values: dict[str, Any]) -> None:
    frame = _request_frame(fetch_request(version, values), version, "c")
    for end in range(len(frame)):
        with pytest.raises(MalformedFrameError, match=f"FetchRequest v{version}"):
            decode_fetch_request(frame[:end], version)


@settings(max_examples=40, deadline=None)
@given(version=PRODUCE_VERSION, values=produce_requests)
def test_every_truncated_produce_request_is_malformed(
    version: int, values: dict[str, Any]
) -> None:
    frame = _request_frame(produce_request(version, values), version, "c")
    for end in range(len(frame)):
        with pytest.raises(MalformedFrameError, match=f"ProduceRequest v{version}"):
            decode_produce_request(frame[:end], version)


def _produce_frame(version: int, topic: str = "t", records: bytes | None = b"r") -> bytes:
    return _request_frame(produce_request(version, {
        "transactional_id": None, "acks": 1, "timeout_ms": 100,
        "topics": [(topic, [(0, records)])]}), version, "c")


def test_bad_lengths_and_nulls_are_malformed() -> None:
    # Produce v3 (classic): header 10 bytes + client "c" (11), transactional_id null (2),
    # acks (2), timeout (4): the topic_data array length starts at byte 19.
    frame = bytearray(_produce_frame(3))
    assert struct.unpack_from(">i", frame, 19)[0] == 1
    struct.pack_into(">i", frame, 19, -1)
    with pytest.raises(MalformedFrameError, match="topic_data: array length -1"):
        decode_produce_request(bytes(frame), 3)
    struct.pack_into(">i", frame, 19, 1_000_000)
    with pytest.raises(MalformedFrameError, match="topic_data: array of 1000000 elements"):
        decode_produce_request(bytes(frame), 3)
    # The topic name null (length -1) where the spec allows none.
    frame = bytearray(_produce_frame(3))
    struct.pack_into(">h", frame, 23, -1)
    with pytest.raises(MalformedFrameError, match="topic name: null"):
        decode_produce_request(bytes(frame), 3)
    # A name that is not UTF-8.
    frame = bytearray(_produce_frame(3, topic="ab"))
    frame[25:27] = b"\xff\xfe"
    with pytest.raises(MalformedFrameError, match="UnicodeDecodeError"):
        decode_produce_request(bytes(frame), 3)
    # A records length below -1.
    frame = bytearray(_produce_frame(3, records=b"xyz"))
    struct.pack_into(">i", frame, len(frame) - 7, -2)
    with pytest.raises(MalformedFrameError, match="bytes length -2"):
        decode_produce_request(bytes(frame), 3)


def test_overlong_varint_is_malformed() -> None:
    # Produce v9 (flexible): header 10 bytes + client "c" (1) + tags (1) = 12, then the
    # compact transactional_id: a varint that never ends.
    frame = _produce_frame(9)[:12] + b"\xff" * 6 + b"\x00" * 8
    with pytest.raises(MalformedFrameError, match="varint longer than 5 bytes"):
        decode_produce_request(frame, 9)


def test_client_id_length_below_minus_one_is_malformed() -> None:
    frame = bytearray(_produce_frame(3))
    struct.pack_into(">h", frame, 8, -5)
    with pytest.raises(MalformedFrameError, match="client_id length -5"):
        decode_produce_request(bytes(frame), 3)


def test_versions_outside_the_range_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="outside"):
        decode_fetch_request(b"", FETCH_VERSIONS[1] + 1)
    with pytest.raises(ValueError, match="outside"):
        decode_produce_request(b"", PRODUCE_VERSIONS[0] - 1)
    with pytest.raises(ValueError, match="outside"):
        FetchResponseWriter(FETCH_VERSIONS[0] - 1, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="outside"):
        ProduceResponseWriter(PRODUCE_VERSIONS[1] + 1, 0, 0)
