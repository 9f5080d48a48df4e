"""fjord.client.network.Network's Produce and Fetch with a broker that advertises a direct door:
a real in-process grpc.aio Broker server (calls recorded by a server interceptor) and a
loopback door (tests/helpers/direct_door.py) beside it. Which way a request went is observed
on the servers, not assumed: through the door when the metadata names one; on gRPC when the
door refuses or cannot be reached (then not tried again until the metadata changes), with
FJORD_DIRECT_DOOR=0, or for a client with security configured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import socket
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from grpc import aio

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.client.metadata import EMPTY_SNAPSHOT
from fjord.client.network import RPC_STREAMS_ENV, Network
from fjord.direct_client import DIRECT_DOOR_ENV
from fjord.direct_frames import ACCEPTED, KIND_FETCH, KIND_PRODUCE, REFUSED
from fjord.errors import FjordError, KafkaTimeoutError
from fjord.rpc_streams import StreamClosedError
from fjord.security.config import ClientSecurity, SaslLogin, SecurityProtocol
from tests.helpers.direct_door import Door
from tests.helpers.grpc_brokers import (
    FETCH_STREAM,
    PRODUCE_STREAM,
    CallsSeen,
    StreamingBroker,
    fetch,
    produce,
)

BOUND_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def advertise(network: Network, address: str, door: str, version: int = 1) -> None:
    """The client's metadata says the broker at ``address`` opens ``door``."""
    network.snapshot = dataclasses.replace(
        EMPTY_SNAPSHOT, version=version, direct_doors={address: door}
    )


def with_broker_and_door(
    body: Callable[[Network, str, CallsSeen, Door], Coroutine[Any, Any, None]],
    hello_answer: bytes | None = ACCEPTED,
    servicer: StreamingBroker | None = None,
    **network_options: Any,
) -> None:
    """``body(network, address, calls, door)``: a streaming gRPC broker at ``address``
    (``servicer``, by default a StreamingBroker) and a door beside it, advertised in the
    network's metadata; the loop must report no error."""
    unhandled: list[dict[str, Any]] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, c: unhandled.append(c))
        calls = CallsSeen()
        server = aio.server(interceptors=[calls])
        broker_pb2_grpc.add_BrokerServicer_to_server(servicer or StreamingBroker(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        network = Network([("127.0.0.1", port)], client_id="test", request_timeout_ms=5000,
                          **network_options)
        address = f"127.0.0.1:{port}"
        try:
            async with Door(hello_answer) as door:
                advertise(network, address, f"127.0.0.1:{door.port}")
                await body(network, address, calls, door)
        finally:
            await network.close()
            await server.stop(None)
            gc.collect()

    asyncio.run(asyncio.wait_for(scenario(), BOUND_S))
    assert not unhandled, unhandled


@pytest.fixture(autouse=True)
def bare_clients(no_global_instrumentation: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The clients' default: no interceptors, streams and doors on."""
    monkeypatch.delenv(RPC_STREAMS_ENV, raising=False)
    monkeypatch.delenv(DIRECT_DOOR_ENV, raising=False)


async def answered(door: Door, call: Coroutine[Any, Any, Any], response: Any) -> Any:
    """``call``'s result once the door answered its request with ``response``."""
    task = asyncio.ensure_future(call)
    number, _ = await door.next_request()
    door.answer(number, response)
    return await asyncio.wait_for(task, BOUND_S)


def test_produce_and_fetch_go_through_the_advertised_door() -> None:
    async def body(network: Network, address: str, calls: CallsSeen, door: Door) -> None:
        assert network.direct_doors
        # A producer's in-flight requests: pipelined on one connection, answered in order.
        produced = [asyncio.ensure_future(network.produce(address, produce(t), 5))
                    for t in range(4)]
        seen = [await door.next_request() for _ in range(4)]
        assert [r.timeout_ms for _, r in seen] == [0, 1, 2, 3]
        for number, request in seen:
            door.answer(number, broker_pb2.ProduceResponse(throttle_time_ms=request.timeout_ms))
        assert [(await p).throttle_time_ms for p in produced] == [0, 1, 2, 3]
        fetched = await answered(door, network.fetch(address, fetch(7), 5),
                                 broker_pb2.FetchResponse(session_id=7))
        assert fetched.session_id == 7
        assert door.kinds == [KIND_PRODUCE, KIND_FETCH]
        assert calls.methods == []  # nothing on gRPC
        connections = network.door_connections()
        assert [connections[(address, m)].answers for m in ("Produce", "Fetch")] == [4, 1]

    with_broker_and_door(body)


def test_a_refusing_door_sends_requests_on_grpc_until_the_metadata_changes() -> None:
    async def body(network: Network, address: str, calls: CallsSeen, door: Door) -> None:
        assert (await network.produce(address, produce(1), 5)).throttle_time_ms == 1
        assert (await network.produce(address, produce(2), 5)).throttle_time_ms == 2
        assert (await network.fetch(address, fetch(3), 5)).session_id == 3
        assert calls.methods == [PRODUCE_STREAM, FETCH_STREAM]
        assert door.kinds == [KIND_PRODUCE]  # tried once; the fetch did not try it either
        assert door.bytes_after_hello == [0]
        # Newer metadata: the door is tried again (and refuses again).
        advertise(network, address, f"127.0.0.1:{door.port}", version=2)
        assert (await network.produce(address, produce(4), 5)).throttle_time_ms == 4
        assert door.kinds == [KIND_PRODUCE, KIND_PRODUCE]

    with_broker_and_door(body, hello_answer=REFUSED)


def test_an_unreachable_door_sends_requests_on_grpc() -> None:
    async def body(network: Network, address: str, calls: CallsSeen, door: Door) -> None:
        advertise(network, address, f"127.0.0.1:{free_port()}")
        concurrent = [network.produce(address, produce(t), 5) for t in range(3)]
        assert [r.throttle_time_ms for r in await asyncio.gather(*concurrent)] == [0, 1, 2]
        assert calls.methods == [PRODUCE_STREAM]

    with_broker_and_door(body)


def test_a_broken_door_connection_is_a_retriable_failure_then_a_new_connection() -> None:
    async def body(network: Network, address: str, calls: CallsSeen, door: Door) -> None:
        waiting = asyncio.ensure_future(network.fetch(address, fetch(1), 5))
        await door.next_request()
        door.writers[0].close()  # the broker went away mid-request
        with pytest.raises(FjordError) as failed:
            await asyncio.wait_for(waiting, BOUND_S)
        assert isinstance(failed.value, StreamClosedError) and failed.value.retriable
        fetched = await answered(door, network.fetch(address, fetch(2), 5),
                                 broker_pb2.FetchResponse(session_id=2))
        assert fetched.session_id == 2
        assert network.door_connections()[(address, "Fetch")].connections_opened == 2
        assert calls.methods == []

    with_broker_and_door(body)


class DepartedBroker(StreamingBroker):
    """Answers Metadata as a cluster that no longer names the broker (nor its door)."""

    async def Metadata(  # type: ignore[override]
        self, request: broker_pb2.MetadataRequest, context: aio.ServicerContext
    ) -> broker_pb2.MetadataResponse:
        return broker_pb2.MetadataResponse()


def test_metadata_without_the_broker_closes_its_idle_door_connections() -> None:
    async def body(network: Network, address: str, calls: CallsSeen, door: Door) -> None:
        fetched = await answered(door, network.fetch(address, fetch(1), 5),
                                 broker_pb2.FetchResponse(session_id=1))
        assert fetched.session_id == 1
        waiting = asyncio.ensure_future(network.produce(address, produce(2), 5))
        number, _ = await door.next_request()  # a Produce in flight: not idle
        await network.refresh_metadata(spaced=False)
        assert address not in network.snapshot.direct_doors
        assert list(network.door_connections()) == [(address, "Produce")]
        await asyncio.wait_for(door.closed[0].wait(), BOUND_S)  # the Fetch connection
        door.answer(number, broker_pb2.ProduceResponse(throttle_time_ms=2))
        assert (await asyncio.wait_for(waiting, BOUND_S)).throttle_time_ms == 2
        await network.refresh_metadata(spaced=False)  # now idle: closed too
        assert network.door_connections() == {}
        await asyncio.wait_for(door.closed[1].wait(), BOUND_S)
        assert calls.methods == ["/fjord.v1.Broker/Metadata"] * 2

    with_broker_and_door(body, servicer=DepartedBroker())


def test_a_request_the_door_does_not_answer_in_time_times_out() -> None:
    async def body(network: Network, address: str, calls: CallsSeen, door: Door) -> None:
        with pytest.raises(KafkaTimeoutError):
            await network.fetch(address, fetch(1), 0.2)
        await asyncio.wait_for(door.closed[0].wait(), BOUND_S)

    with_broker_and_door(body)


def test_doors_turned_off_in_the_environment_send_requests_on_grpc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(DIRECT_DOOR_ENV, "0")

    async def body(network: Network, address: str, calls: CallsSeen, door: Door) -> None:
        assert not network.direct_doors
        assert (await network.produce(address, produce(1), 5)).throttle_time_ms == 1
        assert (await network.fetch(address, fetch(2), 5)).session_id == 2
        assert calls.methods == [PRODUCE_STREAM, FETCH_STREAM]
        assert door.kinds == []

    with_broker_and_door(body)


def test_a_client_with_security_configured_keeps_to_grpc() -> None:
    """SASL_PLAINTEXT: the door has no login, so the client does not use it (the requests
    themselves are not sent here: the test broker has no SASL)."""
    security = ClientSecurity(SecurityProtocol.SASL_PLAINTEXT,
                              sasl=SaslLogin("SCRAM-SHA-256", "u", "p"))

    async def body(network: Network, address: str, calls: CallsSeen, door: Door) -> None:
        assert not network.direct_doors

    with_broker_and_door(body, security=security)


def test_closing_with_requests_waiting_on_the_door_fails_them_retriably() -> None:
    async def body(network: Network, address: str, calls: CallsSeen, door: Door) -> None:
        waiting = asyncio.ensure_future(network.fetch(address, fetch(1), 5))
        await door.next_request()
        await network.close()
        with pytest.raises(StreamClosedError):
            await asyncio.wait_for(waiting, BOUND_S)
        await asyncio.wait_for(door.closed[0].wait(), BOUND_S)

    with_broker_and_door(body)
