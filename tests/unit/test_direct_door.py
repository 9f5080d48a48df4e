"""The broker's direct door (fjord.broker.direct_door): the pure RequestWindow (order and
in-flight bound), the options' refusal of a door with TLS or authorization, and the asyncio
shell on a real loopback socket with handlers of this test (a handler that raises, a client
that does not read its answers: neither can be provoked in a real broker on demand; the real
broker is tested in tests/integration/test_direct_door.py)."""

from __future__ import annotations

import asyncio
import logging
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fjord._proto import broker_pb2
from fjord.broker.direct_door import (
    WRITE_BUFFER_HIGH_BYTES,
    DirectConnection,
    DirectDoor,
    RequestWindow,
)
from fjord.broker.fetch_wire import DetachedFetchResponse, DetachedRecords
from fjord.broker.server import BrokerOptions
from fjord.direct_frames import (
    ACCEPTED,
    HELLO_FETCH,
    HELLO_PRODUCE,
    STATUS_ERROR,
    STATUS_OK,
    frame_prefix,
)
from fjord.errors import ConfigError
from fjord.security import ServiceSecurity
from fjord.security.acls import AuthorizerSettings, Caller

# --- RequestWindow ----------------------------------------------------------------------------


@given(
    in_flight=st.integers(1, 5),
    steps=st.lists(st.one_of(st.just("arrive"), st.integers(0, 20)), max_size=60),
)
def test_window_starts_in_order_bounds_in_flight_and_releases_each_answer_once_in_order(
    in_flight: int, steps: list[str | int]
) -> None:
    """Any interleaving of arrivals and answers (an int: answer the i-th running request,
    modulo how many run): requests start in arrival order, never more than ``in_flight``
    unreleased, and the answers come out in arrival order, each once."""
    window: RequestWindow[int, int] = RequestWindow(in_flight)
    arrived = started = 0
    running: list[int] = []
    released: list[int] = []

    def start() -> None:
        nonlocal started
        for seq, request in window.start():
            assert seq == request == started
            started += 1
            running.append(seq)
        assert window.unanswered <= in_flight

    for step in steps:
        if step == "arrive":
            window.arrive(arrived)
            arrived += 1
        elif running:
            seq = running.pop(int(step) % len(running))
            window.finish(seq, seq * 10)
            released += window.ready()
        start()
    for seq in reversed(running):  # answer the rest, newest first
        window.finish(seq, seq * 10)
    running.clear()
    released += window.ready()
    start()
    assert released == [s * 10 for s in range(len(released))]
    assert window.waiting == arrived - started


def test_window_refuses_an_answer_to_no_running_request() -> None:
    window: RequestWindow[str, str] = RequestWindow(1)
    window.arrive("a")
    window.arrive("b")
    assert window.start() == [(0, "a")]
    assert window.start() == []  # one at a time
    with pytest.raises(ValueError, match="not started"):
        window.finish(1, "early")
    window.finish(0, "A")
    with pytest.raises(ValueError, match="not started"):
        window.finish(0, "again")
    assert window.ready() == ["A"] and window.ready() == []
    assert window.start() == [(1, "b")]
    with pytest.raises(ValueError, match="in_flight"):
        RequestWindow(0)


# --- options ----------------------------------------------------------------------------------


def broker_options(tmp_path: Path, **overrides: object) -> BrokerOptions:
    base: dict[str, object] = {
        "broker_id": 1, "listen_host": "127.0.0.1", "listen_port": 0, "data_dir": tmp_path,
        "etcd_url": "http://127.0.0.1:2379", "cluster_id": "c",
        "direct_listener": ("127.0.0.1", 0),
    }
    base.update(overrides)
    return BrokerOptions(**base)  # type: ignore[arg-type]


def test_a_direct_door_is_refused_with_tls_or_authorization(tmp_path: Path) -> None:
    assert broker_options(tmp_path).direct_listener == ("127.0.0.1", 0)
    with pytest.raises(ConfigError, match=r"direct-listen: .* without identity"):
        broker_options(tmp_path, security=ServiceSecurity("k.pem", "ca.pem"))
    with pytest.raises(ConfigError, match=r"direct-listen: .* without identity"):
        broker_options(tmp_path, authorization=AuthorizerSettings())
    # Without a door, TLS and authorization are the broker's business as before.
    assert broker_options(tmp_path, direct_listener=None,
                          authorization=AuthorizerSettings()).direct_listener is None


# --- the shell, with this test's handlers ----------------------------------------------------


class Handlers:
    """Produce answers the offset of its first record count (requests numbered in arrival
    order); a Produce to topic "boom" raises; Fetch answers ``fetch_bytes`` of records."""

    def __init__(self, fetch_bytes: int = 10) -> None:
        self.produced = 0
        self.fetched = 0
        self.fetch_bytes = fetch_bytes
        self.callers: set[Caller] = set()

    async def produce_from(
        self, caller: Caller, request: broker_pb2.ProduceRequest
    ) -> broker_pb2.ProduceResponse:
        self.callers.add(caller)
        number = self.produced
        self.produced += 1
        topic = request.topics[0].name
        await asyncio.sleep(0.001 * (5 - number % 5))  # later requests finish first
        if topic == "boom":
            raise RuntimeError("the handler broke")
        if topic == "cancelled":  # what the handler awaited was cancelled under it
            raise asyncio.CancelledError
        response = broker_pb2.ProduceResponse()
        response.topics.add(name=topic).partitions.add(partition=0, base_offset=number)
        return response

    async def fetch_from(
        self, caller: Caller, request: broker_pb2.FetchRequest
    ) -> broker_pb2.FetchResponse | DetachedFetchResponse:
        self.fetched += 1
        response = broker_pb2.FetchResponse()
        partition = response.topics.add(name="t").partitions.add(partition=0, high_watermark=7)
        if request.replica_id < 0:
            partition.records = b"r" * self.fetch_bytes
            return response
        # A follower's answer, its records apart (as BrokerServicer.fetch_from gives it).
        detached = DetachedRecords()
        detached.records[(0, 0)] = memoryview(b"f" * self.fetch_bytes)
        return detached.attach_to(response)


async def open_door(handlers: Handlers) -> DirectDoor:
    door = DirectDoor(handlers, "test door", max_request_bytes=1 << 20, max_in_flight_produce=5)
    await door.start("127.0.0.1", 0)
    return door


async def connect(door: DirectDoor, hello: bytes
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", door.port)
    writer.write(hello)
    assert await reader.readexactly(len(ACCEPTED)) == ACCEPTED
    return reader, writer


def frame(message: bytes) -> bytes:
    return frame_prefix(len(message)) + message


def produce(topic: str) -> bytes:
    request = broker_pb2.ProduceRequest(acks=1)
    request.topics.add(name=topic).partitions.add(partition=0, records=b"x")
    return frame(request.SerializeToString())


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    (length,) = struct.unpack(">I", await reader.readexactly(4))
    body = await reader.readexactly(length)
    return body[0], body[1:]


async def failing_handler_round(failing: str) -> None:
    handlers = Handlers()
    door = await open_door(handlers)
    reader, writer = await connect(door, HELLO_PRODUCE)
    writer.write(produce("a") + produce("b") + produce(failing) + produce("c") + produce("d"))
    offsets = []
    for _ in range(2):
        status, payload = await answer(reader)
        assert status == STATUS_OK
        offsets.append(broker_pb2.ProduceResponse.FromString(payload)
                       .topics[0].partitions[0].base_offset)
    assert offsets == [0, 1]  # in request order, though the later ones finished first
    status, why = await answer(reader)
    assert status == STATUS_ERROR
    assert (b"the handler broke" if failing == "boom" else b"CancelledError") in why
    assert await reader.read() == b""  # closed after the error frame
    assert {c.principal.name for c in handlers.callers} == {"ANONYMOUS"}
    assert {c.host for c in handlers.callers} == {"127.0.0.1"}
    writer.close()
    await asyncio.wait_for(wait_untracked(door), 10)
    door.close()


async def wait_untracked(door: DirectDoor) -> None:
    while door.connection_count:
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("failing", ["boom", "cancelled"])
def test_a_failing_handler_answers_earlier_requests_then_an_error_and_closes(
    caplog: pytest.LogCaptureFixture, failing: str
) -> None:
    with caplog.at_level(logging.ERROR, logger="fjord.broker.direct_door"):
        asyncio.run(asyncio.wait_for(failing_handler_round(failing), 30))
    failures = [r for r in caplog.records if "handler failed" in r.getMessage()]
    assert len(failures) == 1  # logged once


async def follower_fetch_round() -> None:
    door = await open_door(Handlers(fetch_bytes=100_000))
    reader, writer = await connect(door, HELLO_FETCH)
    writer.write(frame(broker_pb2.FetchRequest(replica_id=2).SerializeToString()))
    status, payload = await answer(reader)
    assert status == STATUS_OK
    partition = broker_pb2.FetchResponse.FromString(payload).topics[0].partitions[0]
    assert (partition.high_watermark, partition.records) == (7, b"f" * 100_000)
    writer.close()
    door.close()


def test_a_follower_answer_is_serialised_with_its_records_joined_in() -> None:
    asyncio.run(follower_fetch_round())


async def slow_reader_round() -> None:
    """Fetch answers of 1 MiB to a client that writes 64 requests and reads none: the door
    stops reading (and handling) once its write buffer is above its high-water mark, so it
    holds at most that plus an answer or two; then the client reads all 64."""
    handlers = Handlers(fetch_bytes=1 << 20)
    door = await open_door(handlers)
    reader, writer = await connect(door, HELLO_FETCH)
    request = frame(broker_pb2.FetchRequest(replica_id=-1).SerializeToString())
    writer.write(request * 64)
    await writer.drain()
    # The kernel's socket buffers take a few MiB first, then the door's write buffer fills.
    connection = await asyncio.wait_for(paused_connection(door), 30)
    stalled = handlers.fetched
    for _ in range(500):  # loop turns (not time): a door that went on would handle the rest
        await asyncio.sleep(0)
    assert not connection.reading and connection.writing_paused
    assert handlers.fetched == stalled < 64, "a client that reads nothing stops the handling"
    assert connection.buffered_bytes <= WRITE_BUFFER_HIGH_BYTES + 2 * (handlers.fetch_bytes + 64)
    for _ in range(64):
        status, payload = await answer(reader)
        assert status == STATUS_OK and len(payload) > 1 << 20
    assert handlers.fetched == 64
    writer.close()
    door.close()


async def paused_connection(door: DirectDoor) -> DirectConnection:
    while not (door.connections and door.connections[0].writing_paused):
        await asyncio.sleep(0.01)
    return door.connections[0]


def test_a_client_that_does_not_read_stops_the_door_reading() -> None:
    asyncio.run(slow_reader_round())


async def hello_round() -> None:
    """A hello sent a byte at a time, then in the same write as the first requests; bytes of
    another protocol close the connection as soon as they differ from the magic."""
    door = await open_door(Handlers())
    reader, writer = await asyncio.open_connection("127.0.0.1", door.port)
    for byte in HELLO_PRODUCE:
        writer.write(bytes([byte]))
        await writer.drain()
    assert await reader.readexactly(len(ACCEPTED)) == ACCEPTED
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", door.port)
    writer.write(HELLO_PRODUCE + produce("a") + produce("b"))
    assert await reader.readexactly(len(ACCEPTED)) == ACCEPTED
    assert [(await answer(reader))[0] for _ in range(2)] == [STATUS_OK, STATUS_OK]
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", door.port)
    writer.write(b"G")  # not even a whole hello: "GET / HTTP/1.1" starts so
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    door.close()


def test_hellos_split_or_joined_with_requests_and_foreign_bytes() -> None:
    asyncio.run(hello_round())


async def closing_round() -> None:
    handlers = Handlers()
    door = await open_door(handlers)
    reader, _ = await connect(door, HELLO_PRODUCE)
    other, _ = await connect(door, HELLO_FETCH)
    await asyncio.wait_for(wait_tracked(door, 2), 10)
    assert door.close() == 2
    assert await asyncio.wait_for(reader.read(), 10) == b""
    assert await asyncio.wait_for(other.read(), 10) == b""
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", door.port)


async def wait_tracked(door: DirectDoor, count: int) -> None:
    while door.connection_count < count:
        await asyncio.sleep(0.01)


def test_closing_the_door_closes_its_connections_and_stops_listening() -> None:
    asyncio.run(closing_round())
