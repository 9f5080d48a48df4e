"""fjord.direct_client: :class:`DirectConnection` against a small direct-door server built here
from fjord.direct_frames, over real loopback sockets; :class:`DoorFallbacks` on a fake clock.

The server holds every request until the test answers it, so the order in which things happen
is the test's; the only timers are the request timeouts under test, and every wait is bounded
(``BOUND_S``).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord._proto import broker_pb2
from fjord.broker.fetch_wire import VIEW_MIN_BYTES, decode_fetch_response
from fjord.direct_client import (
    DirectConnection,
    DirectDoorUnavailableError,
    DoorFallbacks,
    InPlaceFrameReader,
    door_address,
    split_door_address,
)
from fjord.direct_frames import (
    HELLO_FETCH,
    REFUSED,
    STATUS_ERROR,
    FrameTooLargeError,
    answer_prefix,
    frame_prefix,
)
from fjord.errors import KafkaTimeoutError
from fjord.rpc_streams import StreamClosedError
from tests.helpers.direct_door import BOUND_S, Door
from tests.helpers.loops import run_watched

T = TypeVar("T")

def run(scenario: Coroutine[Any, Any, T]) -> T:
    """``scenario`` bounded by ``BOUND_S``, failed on an error the loop reported."""
    return run_watched(scenario, BOUND_S)


async def bounded(awaitable: Awaitable[T]) -> T:
    return await asyncio.wait_for(awaitable, BOUND_S)


def request(n: int) -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(max_wait_ms=n)


def response(n: int) -> broker_pb2.FetchResponse:
    return broker_pb2.FetchResponse(session_id=n)


async def started(coroutine: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task of ``coroutine`` that has run up to its first wait (its request is written or
    queued in call order)."""
    task = asyncio.ensure_future(coroutine)
    await asyncio.sleep(0)
    return task


def free_port() -> int:
    """A loopback port nobody listens on (bound and released: connecting is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_pipelined_requests_are_answered_in_order() -> None:
    async def scenario() -> None:
        async with Door() as door:
            connection = door.connection()
            calls = [await started(connection.call(request(n), BOUND_S)) for n in range(5)]
            # All five reach the door before any is answered: pipelined, in call order.
            seen = [await door.next_request() for _ in range(5)]
            assert [r.max_wait_ms for _, r in seen] == list(range(5))
            assert {number for number, _ in seen} == {0}
            for n in range(5):
                door.answer(0, response(n))
            assert [(await bounded(c)).session_id for c in calls] == list(range(5))
            # The connection stays open for the next requests.
            again = await started(connection.call(request(7), BOUND_S))
            assert (await door.next_request())[0] == 0
            door.answer(0, response(7))
            assert (await bounded(again)).session_id == 7
            assert (connection.connections_opened, connection.answers) == (1, 6)
            connection.close()

    run(scenario())


def test_large_and_small_requests_arrive_whole_and_in_order() -> None:
    """Payloads from 16 KiB on leave in two writes (prefix, then payload); smaller ones in one."""

    async def scenario() -> None:
        async with Door() as door:
            connection = door.connection()
            sizes = [10, 200_000, 20, 70_000]
            sent = [broker_pb2.FetchRequest(max_wait_ms=n) for n in range(len(sizes))]
            for message, size in zip(sent, sizes, strict=True):
                message.topics.add(name="t" * size)
            calls = [await started(connection.call(message, BOUND_S)) for message in sent]
            seen = [(await door.next_request())[1] for _ in sizes]
            assert seen == sent
            for n in range(len(sizes)):
                door.answer(0, response(n))
            assert [(await bounded(c)).session_id for c in calls] == list(range(len(sizes)))
            connection.close()

    run(scenario())


def test_requests_made_before_the_hello_is_answered_are_written_in_order() -> None:
    async def scenario() -> None:
        async with Door(hello_answer=None) as door:
            connection = door.connection()
            calls = [await started(connection.call(request(n), BOUND_S)) for n in range(3)]
            assert not connection.connected
            door.accept_held()
            seen = [await door.next_request() for _ in range(3)]
            assert [r.max_wait_ms for _, r in seen] == [0, 1, 2]
            for n in range(3):
                door.answer(0, response(n))
            assert [(await bounded(c)).session_id for c in calls] == [0, 1, 2]
            connection.close()

    run(scenario())


def test_a_timeout_closes_the_connection_and_fails_the_others_retriably() -> None:
    async def scenario() -> None:
        async with Door() as door:
            connection = door.connection()
            late = await started(connection.call(request(1), 0.2))
            other = await started(connection.call(request(2), BOUND_S))
            await door.next_request()
            await door.next_request()
            with pytest.raises(KafkaTimeoutError):
                await bounded(late)
            with pytest.raises(StreamClosedError) as closed:
                await bounded(other)
            assert closed.value.retriable
            await bounded(door.closed[0].wait())  # the client closed the connection
            # The next call opens a new connection.
            fresh = await started(connection.call(request(3), BOUND_S))
            number, seen = await door.next_request()
            assert (number, seen.max_wait_ms) == (1, 3)
            door.answer(1, response(3))
            assert (await bounded(fresh)).session_id == 3
            assert connection.connections_opened == 2
            connection.close()

    run(scenario())


def test_an_error_answer_fails_its_request_and_closes() -> None:
    async def scenario() -> None:
        async with Door() as door:
            connection = door.connection()
            failing = await started(connection.call(request(1), BOUND_S))
            behind = await started(connection.call(request(2), BOUND_S))
            await door.next_request()
            await door.next_request()
            text = b"handler raised: disk on fire"
            door.answer_raw(0, answer_prefix(len(text), STATUS_ERROR) + text)
            with pytest.raises(StreamClosedError, match="disk on fire"):
                await bounded(failing)
            with pytest.raises(StreamClosedError):
                await bounded(behind)
            await bounded(door.closed[0].wait())
            connection.close()

    run(scenario())


def test_the_server_closing_mid_request_fails_the_waiters_retriably() -> None:
    async def scenario() -> None:
        async with Door() as door:
            connection = door.connection()
            first = await started(connection.call(request(1), BOUND_S))
            second = await started(connection.call(request(2), BOUND_S))
            await door.next_request()
            await door.next_request()
            door.answer(0, response(1))
            door.writers[0].close()
            assert (await bounded(first)).session_id == 1
            with pytest.raises(StreamClosedError, match="closed by the broker") as closed:
                await bounded(second)
            assert closed.value.retriable
            connection.close()

    run(scenario())


def test_a_refused_hello_sends_nothing_and_says_to_use_grpc() -> None:
    async def scenario() -> None:
        async with Door(hello_answer=REFUSED) as door:
            connection = door.connection()
            calls = [await started(connection.call(request(n), BOUND_S)) for n in range(2)]
            for call in calls:
                with pytest.raises(DirectDoorUnavailableError, match="refused"):
                    await bounded(call)
            await bounded(door.closed[0].wait())
            assert door.bytes_after_hello == [0]  # no request left the client
            connection.close()

    run(scenario())


def test_a_server_speaking_another_protocol_says_to_use_grpc() -> None:
    async def scenario() -> None:
        async with Door(hello_answer=b"HTTP/1.1 400 Bad Request\r\n\r\n") as door:
            connection = door.connection()
            with pytest.raises(DirectDoorUnavailableError):
                await bounded(connection.call(request(1), BOUND_S))
            connection.close()

    run(scenario())


def test_a_door_that_never_answers_the_hello_says_to_use_grpc() -> None:
    """A listener that takes the connection and says nothing (a frozen broker, something
    else on the port): after half the first request's timeout (at most
    DOOR_CONNECT_TIMEOUT_S) the requests fall back, nothing of them sent."""

    async def scenario() -> None:
        async with Door(hello_answer=None) as door:  # held: never released
            connection = door.connection()
            calls = [await started(connection.call(request(n), 0.4)) for n in range(2)]
            for call in calls:
                with pytest.raises(DirectDoorUnavailableError, match="did not accept"):
                    await bounded(call)
            assert door.bytes_after_hello == [0]  # nothing was sent
            connection.close()

    run(scenario())


def test_a_refused_connection_says_to_use_grpc() -> None:
    async def scenario() -> None:
        port = free_port()
        connection: DirectConnection[Any, Any] = DirectConnection(
            "127.0.0.1", port, HELLO_FETCH, broker_pb2.FetchResponse.FromString, name="door"
        )
        with pytest.raises(DirectDoorUnavailableError) as unavailable:
            await bounded(connection.call(request(1), BOUND_S))
        assert unavailable.value.retriable
        connection.close()

    run(scenario())


def test_an_oversize_answer_frame_closes_the_connection() -> None:
    async def scenario() -> None:
        async with Door() as door:
            connection = door.connection(max_frame_bytes=1024)
            call = await started(connection.call(request(1), BOUND_S))
            await door.next_request()
            door.answer_raw(0, frame_prefix(2000))  # announced; the bytes never need to come
            with pytest.raises(StreamClosedError, match="2000 bytes"):
                await bounded(call)
            await bounded(door.closed[0].wait())
            connection.close()

    run(scenario())


def test_a_malformed_answer_closes_the_connection() -> None:
    async def scenario() -> None:
        async with Door() as door:
            connection = door.connection()
            call = await started(connection.call(request(1), BOUND_S))
            await door.next_request()
            door.answer_raw(0, frame_prefix(1) + b"\x07")  # an unknown status byte
            with pytest.raises(StreamClosedError, match="status 7"):
                await bounded(call)
            connection.close()

    run(scenario())


def test_a_cancelled_caller_leaves_the_others_answers_matched() -> None:
    async def scenario() -> None:
        async with Door() as door:
            connection = door.connection()
            gone = await started(connection.call(request(1), BOUND_S))
            kept = await started(connection.call(request(2), BOUND_S))
            await door.next_request()
            await door.next_request()
            gone.cancel()
            door.answer(0, response(1))
            door.answer(0, response(2))
            assert (await bounded(kept)).session_id == 2
            assert connection.connections_opened == 1
            connection.close()

    run(scenario())


def test_close_fails_the_waiters_and_later_calls() -> None:
    async def scenario() -> None:
        async with Door() as door:
            connection = door.connection()
            waiting = await started(connection.call(request(1), BOUND_S))
            await door.next_request()
            connection.close()
            with pytest.raises(StreamClosedError, match="closed by the client"):
                await bounded(waiting)
            with pytest.raises(StreamClosedError):
                await connection.call(request(2), BOUND_S)
            await bounded(door.closed[0].wait())

    run(scenario())


def test_close_while_connecting_leaves_nothing_behind() -> None:
    async def scenario() -> None:
        async with Door(hello_answer=None) as door:
            connection = door.connection()
            waiting = await started(connection.call(request(1), BOUND_S))
            connection.close()
            with pytest.raises(StreamClosedError):
                await bounded(waiting)
            door.accept_held()

    run(scenario())


def test_a_big_fetch_answer_decodes_with_records_as_views() -> None:
    """The follower's decoder on a door's answer: records of an answer from VIEW_MIN_BYTES on
    are views of the received frame, equal to what was sent."""

    async def scenario() -> None:
        async with Door() as door:
            connection: DirectConnection[Any, Any] = DirectConnection(
                "127.0.0.1", door.port, HELLO_FETCH, decode_fetch_response, name="door"
            )
            records = bytes(range(256)) * (VIEW_MIN_BYTES // 128)
            big = broker_pb2.FetchResponse(session_id=5)
            big.topics.add(name="t").partitions.add(partition=3, high_watermark=9, records=records)
            call = await started(connection.call(request(1), BOUND_S))
            await door.next_request()
            door.answer(0, big)
            answer = await bounded(call)
            partition = answer.topics[0].partitions[0]
            assert isinstance(partition.records, memoryview)
            assert bytes(partition.records) == records
            assert (answer.session_id, partition.partition, partition.high_watermark) == (5, 3, 9)
            connection.close()

    run(scenario())


def test_door_fallbacks_skip_a_door_until_the_generation_changes_or_time_passes() -> None:
    now = [100.0]
    fallbacks = DoorFallbacks(retry_after_s=30.0, clock=lambda: now[0])
    assert fallbacks.usable("h:1", generation=1)
    fallbacks.mark_unavailable("h:1", generation=1)
    assert not fallbacks.usable("h:1", generation=1)
    assert fallbacks.usable("h:2", generation=1)  # another door
    now[0] += 29.9
    assert not fallbacks.usable("h:1", generation=1)
    assert fallbacks.usable("h:1", generation=2)  # new metadata: tried again
    assert len(fallbacks) == 0
    fallbacks.mark_unavailable("h:1", generation=2)
    now[0] += 30.0
    assert fallbacks.usable("h:1", generation=2)  # time passed: tried again


def test_door_addresses() -> None:
    assert door_address("h", 0) is None
    assert door_address("", 9) is None
    assert door_address("h", 9) == "h:9"
    assert split_door_address("h:9") == ("h", 9)
    assert split_door_address("[::1]:9") == ("::1", 9)


# --- InPlaceFrameReader (pure) ----------------------------------------------------------------


def receive(
    reader: InPlaceFrameReader, stream: bytes, chunks: list[int], lead: int
) -> list[bytes]:
    """``stream`` received as a socket would: each time at most the offered buffer's size
    (chunk sizes cycled), and ``filled(0)`` once the lead came, as the protocol does."""
    out: list[bytes] = []
    position, turn, lead_pending = 0, 0, lead > 0
    while position < len(stream):
        buffer = reader.buffer()
        assert len(buffer) > 0
        count = min(len(buffer), chunks[turn % len(chunks)], len(stream) - position)
        buffer[:count] = stream[position:position + count]
        position += count
        turn += 1
        frames = reader.filled(count)
        out.extend(bytes(f) for f in frames)
        if frames and lead_pending:  # the lead alone: then what came with it
            lead_pending = False
            out.extend(bytes(f) for f in reader.filled(0))
    return out


@settings(max_examples=300, deadline=None)
@given(
    frames=st.lists(st.binary(max_size=200), max_size=12),
    chunks=st.lists(st.integers(1, 300), min_size=1, max_size=8),
    lead=st.sampled_from([0, 5]),
)
def test_in_place_frame_reader_returns_every_frame_once_in_order(
    frames: list[bytes], chunks: list[int], lead: int
) -> None:
    """Small receive buffer (64 bytes; frames from 16 bytes on received in place): any
    chunking of the stream gives back the lead, then exactly the frames, in order."""
    reader = InPlaceFrameReader(1000, lead_bytes=lead, scratch_bytes=64, in_place_from=16)
    head = b"L" * lead
    stream = head + b"".join(frame_prefix(len(f)) + f for f in frames)
    expected = ([head] if lead else []) + frames
    assert receive(reader, stream, chunks, lead) == expected


def test_in_place_frame_reader_refuses_an_oversize_frame_at_its_prefix() -> None:
    reader = InPlaceFrameReader(100, scratch_bytes=64, in_place_from=16)
    reader.buffer()[:4] = frame_prefix(101)
    with pytest.raises(FrameTooLargeError):
        reader.filled(4)


def test_in_place_frame_reader_receives_a_large_frame_into_its_own_buffer() -> None:
    reader = InPlaceFrameReader(10_000, scratch_bytes=64, in_place_from=16)
    payload = bytes(range(256)) * 8
    reader.buffer()[:14] = frame_prefix(len(payload)) + payload[:10]
    assert reader.filled(14) == []
    buffer = reader.buffer()
    assert len(buffer) == len(payload) - 10  # exactly the rest of the frame, in place
    buffer[:] = payload[10:]
    (frame,) = reader.filled(len(payload) - 10)
    assert frame == payload
