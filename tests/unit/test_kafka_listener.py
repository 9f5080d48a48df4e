"""The Kafka listener's shell (fjord.kafka.server) on real sockets, in-process: bad input closes
only the offending connection, with a log line (a stalled half frame after
``connections.max.idle.ms``, a size prefix above ``socket.request.max.bytes``, garbage after a
good request, a handler that fails), while a thousand connections at once are all served.
The same listener inside a broker is tested in tests/integration/test_kafka_protocol.py."""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.metadata import MetadataRequest

from fjord.kafka.dispatch import Api, KafkaDispatcher, RequestContext
from fjord.kafka.server import KafkaListener

WAIT_S = 10.0
IDLE_MS = 300
MAX_REQUEST_BYTES = 4096


async def failing_handler(request: Any, ctx: RequestContext) -> Any:
    raise RuntimeError("a bug in a handler")


@asynccontextmanager
async def listening(idle_ms: int = IDLE_MS) -> AsyncIterator[int]:
    dispatcher = KafkaDispatcher([Api(3, 0, 12, MetadataRequest, failing_handler)])
    listener = KafkaListener(dispatcher, "127.0.0.1", 0, max_request_bytes=MAX_REQUEST_BYTES,
                             idle_timeout_ms=idle_ms, name="test")
    port = await listener.start()
    try:
        yield port
    finally:
        await listener.stop()
        assert listener.connection_count == 0


def api_versions_frame(correlation_id: int) -> bytes:
    request = ApiVersionsRequest[3](client_software_name="t", client_software_version="1")
    request.with_header(correlation_id=correlation_id, client_id="t")
    return bytes(request.encode(version=3, header=True, framed=True))


async def answered(reader: asyncio.StreamReader, correlation_id: int) -> None:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    response = ApiVersionsResponse.decode(await reader.readexactly(size), version=3, header=True)
    assert response.header.correlation_id == correlation_id and response.error_code == 0


async def closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(1), WAIT_S) == b""


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_stalled_half_frame_is_closed_after_the_idle_timeout_others_served_meanwhile(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with listening() as port:
            stalled_reader, stalled = await asyncio.open_connection("127.0.0.1", port)
            stalled.write(struct.pack(">i", 100) + b"\x00\x12")  # half a frame, then nothing
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            stalled_closed = asyncio.create_task(closed(stalled_reader))
            started = asyncio.get_running_loop().time()
            served = 0
            while not stalled_closed.done():  # served all along, each request well in time
                writer.write(api_versions_frame(served))
                await answered(reader, served)
                served += 1
                await asyncio.sleep(IDLE_MS / 6000)
            assert stalled_closed.result()
            # The busy connection outlived the idle timeout: it counts per request.
            assert asyncio.get_running_loop().time() - started >= IDLE_MS / 1000
            writer.write(api_versions_frame(served))
            await answered(reader, served)
            writer.close()
            stalled.close()

    with caplog.at_level(logging.WARNING, logger="fjord.kafka.server"):
        run(scenario)
    assert "(connections.max.idle.ms)" in caplog.text


def test_oversized_frame_garbage_and_a_failing_handler_close_only_their_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with listening() as port:
            keeper_reader, keeper = await asyncio.open_connection("127.0.0.1", port)
            oversized_reader, oversized = await asyncio.open_connection("127.0.0.1", port)
            oversized.write(struct.pack(">i", MAX_REQUEST_BYTES + 1) + b"\x00" * 64)
            assert await closed(oversized_reader)
            # A good request, then garbage in the same write: the answer, then the close.
            mixed_reader, mixed = await asyncio.open_connection("127.0.0.1", port)
            mixed.write(api_versions_frame(1) + struct.pack(">ihhi", 8, 9999, 0, 2))
            await answered(mixed_reader, 1)
            assert await closed(mixed_reader)
            failing_reader, failing = await asyncio.open_connection("127.0.0.1", port)
            request = MetadataRequest[12](topics=None, allow_auto_topic_creation=False)
            request.with_header(correlation_id=3, client_id="t")
            failing.write(bytes(request.encode(version=12, header=True, framed=True)))
            assert await closed(failing_reader)
            keeper.write(api_versions_frame(4))
            await answered(keeper_reader, 4)
            for w in (keeper, oversized, mixed, failing):
                w.close()

    with caplog.at_level(logging.WARNING, logger="fjord.kafka.server"):
        run(scenario)
    assert f"outside 0..{MAX_REQUEST_BYTES} (socket.request.max.bytes)" in caplog.text
    assert "unsupported API key 9999" in caplog.text
    assert "failed; closing it" in caplog.text and "a bug in a handler" in caplog.text


def test_a_thousand_connections_at_once_are_all_served() -> None:
    async def scenario() -> None:
        # Opening them all takes longer than IDLE_MS on a busy machine: a long idle timeout.
        async with listening(idle_ms=60_000) as port:
            connections = await asyncio.gather(
                *(asyncio.open_connection("127.0.0.1", port) for _ in range(1000))
            )
            for i, (_, writer) in enumerate(connections):
                writer.write(api_versions_frame(i))
            await asyncio.gather(
                *(answered(reader, i) for i, (reader, _) in enumerate(connections))
            )
            for _, writer in connections:
                writer.close()

    run(scenario)


def test_produce_requests_overlap_in_order_and_others_wait_for_them() -> None:
    """Consecutive Produce requests of one connection run concurrently, start in arrival
    order (so their appends keep it) and are answered in that order; any other request starts
    only after every earlier one is answered."""
    from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

    started: list[tuple[int, int]] = []  # (api key, correlation id)
    running = 0
    most_at_once = 0

    async def produce(request: Any, ctx: RequestContext) -> Any:
        nonlocal running, most_at_once
        started.append((0, ctx.correlation_id))
        running += 1
        most_at_once = max(most_at_once, running)
        await asyncio.sleep(0.05 * (4 - ctx.correlation_id))  # the first finishes last
        running -= 1
        return ProduceResponse[9](throttle_time_ms=0, responses=[])

    async def metadata(request: Any, ctx: RequestContext) -> Any:
        started.append((3, ctx.correlation_id))
        assert running == 0  # every Produce before it is done
        from kafka.protocol.metadata.metadata import MetadataResponse

        return MetadataResponse[12](throttle_time_ms=0, brokers=[], cluster_id="c",
                                    controller_id=-1, topics=[])

    def frame(request: Any, correlation_id: int, version: int) -> bytes:
        request.with_header(correlation_id=correlation_id, client_id="t")
        return bytes(request.encode(version=version, header=True, framed=True))

    async def scenario() -> None:
        dispatcher = KafkaDispatcher([Api(0, 3, 12, ProduceRequest, produce),
                                      Api(3, 0, 12, MetadataRequest, metadata)])
        listener = KafkaListener(dispatcher, "127.0.0.1", 0, name="test")
        port = await listener.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            produce_request = ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=1000,
                                                topic_data=[])
            writer.write(b"".join(frame(produce_request, i, 9) for i in (1, 2, 3))
                         + frame(MetadataRequest[12](topics=None,
                                                     allow_auto_topic_creation=False), 4, 12))
            order = []
            for _ in range(4):
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                body = await reader.readexactly(size)
                order.append(struct.unpack(">i", body[:4])[0])
            assert order == [1, 2, 3, 4]
            writer.close()
        finally:
            await listener.stop()

    run(scenario)
    assert started == [(0, 1), (0, 2), (0, 3), (3, 4)]
    assert most_at_once == 3
