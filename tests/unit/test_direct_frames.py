"""fjord.direct_frames: the direct door's framing, split at every point a socket may split it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fjord.direct_frames import (
    ACCEPTED,
    HELLO_FETCH,
    HELLO_PRODUCE,
    KIND_FETCH,
    KIND_PRODUCE,
    MAX_FRAME_BYTES,
    STATUS_ERROR,
    STATUS_OK,
    FrameReader,
    FrameTooLargeError,
    MalformedDirectFrameError,
    answer_prefix,
    frame_prefix,
    hello_kind,
    split_answer,
)
from fjord.errors import InvalidRequestError


def framed(payload: bytes) -> bytes:
    return frame_prefix(len(payload)) + payload


@given(st.lists(st.binary(max_size=300), max_size=12), st.data())
def test_frames_come_out_whole_and_in_order_however_the_bytes_are_split(
    payloads: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(framed(p) for p in payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    reader = FrameReader()
    out: list[bytes] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        out += reader.feed(stream[start:cut])
        start = cut
    assert out == payloads
    assert reader.buffered == 0


@given(st.lists(st.integers(0, 20_000), min_size=1, max_size=6), st.data())
def test_large_frames_split_anywhere_come_out_whole_and_the_rest_is_buffered(
    sizes: list[int], data: st.DataObject
) -> None:
    """Frames larger than one feed (kept as pieces until their last byte comes): after every
    feed, what came out plus what is buffered is exactly what was fed."""
    payloads = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    stream = b"".join(framed(p) for p in payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=30)))
    reader = FrameReader()
    out: list[bytes] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        piece = stream[start:cut]
        if cut % 2:  # a buffer the caller reuses: what is kept must not change with it
            reused = bytearray(piece)
            out += reader.feed(reused)
            reused[:] = b"\x00" * len(reused)
        else:
            out += reader.feed(piece)
        start = cut
        assert sum(4 + len(f) for f in out) + reader.buffered == cut
    assert out == payloads
    assert all(type(f) is bytes for f in out)


def test_an_incomplete_frame_stays_buffered() -> None:
    reader = FrameReader()
    assert reader.feed(framed(b"abc") + frame_prefix(5) + b"12") == [b"abc"]
    assert reader.buffered == 4 + 2
    assert reader.feed(memoryview(b"345")) == [b"12345"]
    assert reader.buffered == 0


def test_a_length_over_the_bound_is_refused_as_soon_as_its_prefix_is_complete() -> None:
    reader = FrameReader(max_frame_bytes=10)
    assert reader.feed(framed(b"x" * 10)) == [b"x" * 10]
    with pytest.raises(FrameTooLargeError, match="11 bytes"):
        reader.feed(frame_prefix(11)[:4])
    with pytest.raises(FrameTooLargeError):
        FrameReader().feed((0xFFFFFFFF).to_bytes(4, "big"))
    with pytest.raises(FrameTooLargeError):
        frame_prefix(MAX_FRAME_BYTES + 1)
    assert issubclass(FrameTooLargeError, InvalidRequestError)


def test_answers_carry_a_status() -> None:
    payload = b"\x08\x01"
    frame = (answer_prefix(len(payload)) + payload)[4:]
    status, body = split_answer(frame)
    assert (status, bytes(body)) == (STATUS_OK, payload)
    error = b"leader moved"
    status, body = split_answer((answer_prefix(len(error), STATUS_ERROR) + error)[4:])
    assert (status, bytes(body).decode()) == (STATUS_ERROR, "leader moved")
    with pytest.raises(MalformedDirectFrameError, match="empty"):
        split_answer(b"")
    with pytest.raises(MalformedDirectFrameError, match="status 7"):
        split_answer(b"\x07abc")


def test_hellos() -> None:
    assert hello_kind(HELLO_PRODUCE) == KIND_PRODUCE
    assert hello_kind(HELLO_FETCH) == KIND_FETCH
    assert ACCEPTED.startswith(b"FJD1")
    for other in (b"PRI * HTTP/2.0", b"\x00\x00\x00\x10\x00\x12", b"FJD1", b"FJD2P"):
        with pytest.raises(MalformedDirectFrameError, match="not a direct-door hello"):
            hello_kind(other)
