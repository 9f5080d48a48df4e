"""fjord.client.network.Network's Produce and Fetch against real in-process grpc.aio Broker
servers: on the ProduceStream/FetchStream when the broker serves them, as unary calls when it
does not (an older broker: the methods unregistered, or the generated servicer's defaults that
answer UNIMPLEMENTED; remembered per address) or when FJORD_CLIENT_RPC_STREAMS=0. A server
interceptor records every call the server saw, so which path a request took is observed on the
server, not assumed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import grpc
import pytest
from grpc import aio

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.client.network import RPC_STREAMS_ENV, Network
from tests.helpers.grpc_brokers import (
    FETCH,
    FETCH_STREAM,
    PRODUCE,
    PRODUCE_STREAM,
    SERVICE,
    CallsSeen,
    StreamingBroker,
    UnaryBroker,
    fetch,
    produce,
)

T = TypeVar("T")

BOUND_S = 10.0


def add_unary_methods_only(servicer: UnaryBroker, server: aio.Server) -> None:
    """A broker built before the streams: its service has no such methods at all."""
    methods = {
        "Produce": grpc.unary_unary_rpc_method_handler(
            servicer.Produce,
            request_deserializer=broker_pb2.ProduceRequest.FromString,
            response_serializer=broker_pb2.ProduceResponse.SerializeToString,
        ),
        "Fetch": grpc.unary_unary_rpc_method_handler(
            servicer.Fetch,
            request_deserializer=broker_pb2.FetchRequest.FromString,
            response_serializer=broker_pb2.FetchResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))


BROKERS: dict[str, Callable[[aio.Server], None]] = {
    "unregistered": lambda server: add_unary_methods_only(UnaryBroker(), server),
    "generated-default": lambda server: broker_pb2_grpc.add_BrokerServicer_to_server(
        UnaryBroker(), server
    ),
    "streaming": lambda server: broker_pb2_grpc.add_BrokerServicer_to_server(
        StreamingBroker(), server
    ),
}


def with_broker(
    kind: str, body: Callable[[Network, str, CallsSeen], Coroutine[Any, Any, None]]
) -> None:
    """Runs ``body(network, address, calls)`` against a fresh broker of ``kind`` on a free
    loopback port, failed (not hung) after ``BOUND_S``."""

    async def scenario() -> None:
        calls = CallsSeen()
        server = aio.server(interceptors=[calls])
        BROKERS[kind](server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        network = Network([("127.0.0.1", port)], client_id="test", request_timeout_ms=5000)
        try:
            await body(network, f"127.0.0.1:{port}", calls)
        finally:
            await network.close()
            await server.stop(None)

    asyncio.run(asyncio.wait_for(scenario(), BOUND_S))


async def produce_all(
    network: Network, address: str, timeouts: range
) -> list[broker_pb2.ProduceResponse]:
    """One Produce per timeout, all at once (as a producer's in-flight batches go)."""
    return await asyncio.gather(*(network.produce(address, produce(t), 5) for t in timeouts))


@pytest.fixture(autouse=True)
def bare_clients(no_global_instrumentation: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The clients' default: no interceptors, streams on (whatever earlier tests left)."""
    monkeypatch.delenv(RPC_STREAMS_ENV, raising=False)


@pytest.mark.parametrize("kind", ["unregistered", "generated-default"])
def test_a_broker_without_streams_gets_unary_calls_from_then_on(kind: str) -> None:
    """Concurrent Produce and Fetch requests (a producer's in-flight batches, a consumer's
    fetch) to a broker without the streams: each gets the unary answer to its own request,
    the address is remembered, and later requests go unary without trying a stream."""

    async def body(network: Network, address: str, calls: CallsSeen) -> None:
        assert network.rpc_streams
        produced = await produce_all(network, address, range(6))
        assert [r.throttle_time_ms for r in produced] == list(range(6))
        fetched = await network.fetch(address, fetch(7), 5)
        assert fetched.session_id == 7
        assert address in network._unary_only
        assert calls.count(PRODUCE) == 6 and calls.count(FETCH) == 1
        tried = calls.count(PRODUCE_STREAM) + calls.count(FETCH_STREAM)
        assert tried >= 1
        assert (await network.produce(address, produce(9), 5)).throttle_time_ms == 9
        assert (await network.fetch(address, fetch(8), 5)).session_id == 8
        assert calls.count(PRODUCE_STREAM) + calls.count(FETCH_STREAM) == tried
        assert calls.count(PRODUCE) == 7 and calls.count(FETCH) == 2

    with_broker(kind, body)


def test_a_broker_with_streams_gets_every_request_on_one_stream_per_kind() -> None:
    async def body(network: Network, address: str, calls: CallsSeen) -> None:
        produced = await produce_all(network, address, range(6))
        assert [r.throttle_time_ms for r in produced] == list(range(6))
        for epoch in range(3):
            assert (await network.fetch(address, fetch(epoch), 5)).session_id == epoch
        assert address not in network._unary_only
        assert calls.methods == [PRODUCE_STREAM, FETCH_STREAM]

    with_broker("streaming", body)


def test_streams_turned_off_in_the_environment_send_unary_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(RPC_STREAMS_ENV, "0")

    async def body(network: Network, address: str, calls: CallsSeen) -> None:
        assert not network.rpc_streams
        produced = await produce_all(network, address, range(3))
        assert [r.throttle_time_ms for r in produced] == list(range(3))
        assert (await network.fetch(address, fetch(4), 5)).session_id == 4
        assert calls.methods == [PRODUCE] * 3 + [FETCH]

    with_broker("streaming", body)
