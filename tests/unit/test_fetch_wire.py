"""fjord.broker.fetch_wire: a follower's hand-decoded FetchResponse holds exactly what upb reads
from the same bytes (records as zero-copy views), malformed bytes raise FetchWireError, and a
leader's answer with its records kept apart serialises as the message with them set."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord._proto import broker_pb2
from fjord.broker.fetch_wire import (
    VIEW_MIN_BYTES,
    DetachedRecords,
    FetchWireError,
    WireFetchResponse,
    decode_fetch_response,
    decode_fetch_response_views,
    serialize_fetch_response,
)

int32s = st.integers(-(2**31), 2**31 - 1)
int64s = st.integers(-(2**63), 2**63 - 1)
texts = st.text(max_size=12)


@st.composite
def errors(draw: Any) -> dict[str, Any] | None:
    if not draw(st.booleans()):
        return None
    return {"code": draw(int32s), "message": draw(texts)}


@st.composite
def partitions(draw: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "partition": draw(int32s),
        "high_watermark": draw(int64s),
        "last_stable_offset": draw(int64s),
        "log_start_offset": draw(int64s),
        "records": draw(st.binary(max_size=300)),
        "leader_id": draw(int32s),
        "leader_epoch": draw(int32s),
        "aborted_transactions": draw(st.lists(
            st.fixed_dictionaries({"producer_id": int64s, "first_offset": int64s}), max_size=3
        )),
    }
    error = draw(errors())
    if error is not None:
        fields["error"] = error
    if draw(st.booleans()):
        fields["diverging_epoch"] = {"epoch": draw(int32s), "end_offset": draw(int64s)}
    return fields


responses = st.builds(
    lambda error, topics, session_id: broker_pb2.FetchResponse(
        topics=[{"name": name, "partitions": parts} for name, parts in topics],
        session_id=session_id,
        **({} if error is None else {"error": error}),
    ),
    errors(),
    st.lists(st.tuples(texts, st.lists(partitions(), max_size=3)), max_size=3),
    int32s,
)


def assert_same(decoded: Any, expected: broker_pb2.FetchResponse) -> None:
    """Every field the follower reads, as upb reads it."""
    assert decoded.HasField("error") == expected.HasField("error")
    assert (decoded.error.code, decoded.error.message) == (
        expected.error.code, expected.error.message
    )
    assert decoded.session_id == expected.session_id
    assert len(decoded.topics) == len(expected.topics)
    for topic, want_topic in zip(decoded.topics, expected.topics, strict=True):
        assert topic.name == want_topic.name
        assert len(topic.partitions) == len(want_topic.partitions)
        for part, want in zip(topic.partitions, want_topic.partitions, strict=True):
            for name in ("partition", "high_watermark", "last_stable_offset",
                         "log_start_offset", "leader_id", "leader_epoch"):
                assert getattr(part, name) == getattr(want, name), name
            assert bytes(part.records) == want.records
            for name in ("error", "diverging_epoch"):
                assert part.HasField(name) == want.HasField(name), name
            assert (part.error.code, part.error.message) == (want.error.code, want.error.message)
            assert (part.diverging_epoch.epoch, part.diverging_epoch.end_offset) == (
                want.diverging_epoch.epoch, want.diverging_epoch.end_offset
            )
            assert [(t.producer_id, t.first_offset) for t in part.aborted_transactions] == [
                (t.producer_id, t.first_offset) for t in want.aborted_transactions
            ]


@settings(max_examples=150, deadline=None)
@given(responses)
def test_views_decode_what_upb_decodes(response: broker_pb2.FetchResponse) -> None:
    data = response.SerializeToString()
    assert_same(decode_fetch_response_views(data), broker_pb2.FetchResponse.FromString(data))


@settings(max_examples=100, deadline=None)
@given(responses, st.data())
def test_unknown_fields_are_skipped_and_repeats_merge_as_in_upb(
    response: broker_pb2.FetchResponse, data: st.DataObject
) -> None:
    """A newer leader's extra fields (every wire type) are skipped; a scalar sent twice keeps
    its last value, a message field sent twice merges: protobuf's rules, as upb applies them."""
    unknown = bytes.fromhex(
        "f8ff1f" "2a"              # field 65535, varint 42
        "818020" "0000000000000000"  # field 65536, fixed64
        "8d8020" "00000000"          # field 65537, fixed32
        "928020" "03616263"          # field 65538, bytes "abc"
    )
    extra = broker_pb2.FetchResponse(
        session_id=data.draw(int32s), error={"message": data.draw(texts)}
    ).SerializeToString()
    wire = response.SerializeToString() + unknown + extra
    assert_same(decode_fetch_response_views(wire), broker_pb2.FetchResponse.FromString(wire))


def test_records_are_views_of_the_received_bytes() -> None:
    records = bytes(range(256)) * (VIEW_MIN_BYTES // 256 + 1)
    response = broker_pb2.FetchResponse(topics=[{"name": "t", "partitions": [
        {"partition": 2, "records": records, "high_watermark": 9}
    ]}])
    data = response.SerializeToString()
    decoded = decode_fetch_response(data)
    assert isinstance(decoded, WireFetchResponse)
    part = decoded.topics[0].partitions[0]
    assert isinstance(part.records, memoryview)
    assert part.records.obj is data  # no copy: a window on what gRPC received
    assert part.records == records and part.high_watermark == 9


def test_small_answers_go_through_upb() -> None:
    data = broker_pb2.FetchResponse(session_id=3).SerializeToString()
    decoded = decode_fetch_response(data)
    assert isinstance(decoded, broker_pb2.FetchResponse) and decoded.session_id == 3


def test_has_field_refuses_names_protobuf_would_refuse() -> None:
    decoded = decode_fetch_response_views(b"")
    with pytest.raises(ValueError):
        decoded.HasField("topics")
    part = decode_fetch_response_views(
        broker_pb2.FetchResponse(topics=[{"partitions": [{}]}]).SerializeToString()
    ).topics[0].partitions[0]
    with pytest.raises(ValueError):
        part.HasField("records")


@settings(max_examples=100, deadline=None)
@given(responses, st.data())
def test_truncated_answers_raise_a_typed_error(
    response: broker_pb2.FetchResponse, data: st.DataObject
) -> None:
    """A cut message fails as upb fails it (or, where the cut falls between fields, decodes
    as upb does): never a wrong answer, never an untyped error."""
    wire = response.SerializeToString()
    if not wire:
        return
    cut = wire[: data.draw(st.integers(0, len(wire) - 1))]
    try:
        expected = broker_pb2.FetchResponse.FromString(cut)
    except Exception:
        with pytest.raises(FetchWireError):
            decode_fetch_response_views(cut)
    else:
        assert_same(decode_fetch_response_views(cut), expected)


@pytest.mark.parametrize("wire", [
    b"\x80",                          # a key varint that never ends
    b"\x18" + b"\xff" * 10 + b"\x01",  # a varint longer than ten bytes
    b"\x12\x05ab",                    # a topic longer than the message
    b"\x1b",                          # wire type 3 (a group: not proto3)
    b"\x00",                          # field number 0
    b"\x12\x04\x0a\x02\xff\xfe",      # a topic name that is not UTF-8
])
def test_malformed_answers_raise_a_typed_error(wire: bytes) -> None:
    with pytest.raises(FetchWireError):
        decode_fetch_response_views(wire)


@settings(max_examples=100, deadline=None)
@given(responses, st.data())
def test_detached_records_serialise_as_the_message_with_them_set(
    response: broker_pb2.FetchResponse, data: st.DataObject
) -> None:
    """The leader's side: records kept apart and joined in at serialisation read back (upb
    and the follower's decoder alike) as the message with them set."""
    detached = DetachedRecords()
    bare = broker_pb2.FetchResponse()
    bare.CopyFrom(response)
    for t, topic in enumerate(bare.topics):
        for p, partition in enumerate(topic.partitions):
            if partition.records and data.draw(st.booleans()):
                detached.records[t, p] = partition.records
                partition.ClearField("records")
    wire = serialize_fetch_response(detached.attach_to(bare))
    assert broker_pb2.FetchResponse.FromString(wire) == response
    assert_same(decode_fetch_response_views(wire), response)


def test_nothing_detached_serialises_the_message_itself() -> None:
    message = broker_pb2.FetchResponse(session_id=7)
    assert DetachedRecords().attach_to(message) is message
    assert serialize_fetch_response(message) == message.SerializeToString()
