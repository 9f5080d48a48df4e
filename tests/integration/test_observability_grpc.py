"""The interceptors on a real grpc.aio server and client over loopback, and /metrics over HTTP.

The servicer is a tiny test implementation of the generated Broker service: it exercises the
outcomes an interceptor must tell apart (OK, abort with a code, an exception, a nested call).
Spans go to a test-local TracerProvider, so the process-wide provider is left untouched.
"""

from __future__ import annotations

import asyncio
import itertools
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from grpc import aio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import REGISTRY

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.observability import (
    client_interceptors,
    server_interceptors,
    start_metrics_server,
    stop_metrics_server,
)

pytestmark = pytest.mark.integration

CALL_TIMEOUT_S = 10.0


class _TestBroker(broker_pb2_grpc.BrokerServicer):
    """Metadata answers OK (and notes the trace it ran in); Produce aborts; ListOffsets raises;
    Fetch calls Metadata on ``self.downstream`` (a second hop through an intercepted channel)."""

    def __init__(self) -> None:
        self.seen_trace_ids: list[int] = []
        self.downstream: broker_pb2_grpc.BrokerStub | None = None

    async def Metadata(self, request: Any, context: Any) -> Any:
        self.seen_trace_ids.append(trace.get_current_span().get_span_context().trace_id)
        return broker_pb2.MetadataResponse(cluster_id="test")

    async def Produce(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "acks must be 0, 1 or -1")

    async def ListOffsets(self, request: Any, context: Any) -> Any:
        raise RuntimeError("handler bug")

    async def Fetch(self, request: Any, context: Any) -> Any:
        assert self.downstream is not None
        await self.downstream.Metadata(broker_pb2.MetadataRequest(), timeout=CALL_TIMEOUT_S)
        return broker_pb2.FetchResponse()


async def _with_server(
    service: str,
    provider: TracerProvider,
    body: Callable[[broker_pb2_grpc.BrokerStub, _TestBroker], Awaitable[None]],
) -> None:
    servicer = _TestBroker()
    server = aio.server(interceptors=server_interceptors(service, provider))
    broker_pb2_grpc.add_BrokerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    target = f"127.0.0.1:{port}"
    channel = aio.insecure_channel(target, interceptors=client_interceptors(service, provider))
    inner = aio.insecure_channel(target, interceptors=client_interceptors(service, provider))
    servicer.downstream = broker_pb2_grpc.BrokerStub(inner)
    try:
        await body(broker_pb2_grpc.BrokerStub(channel), servicer)
    finally:
        await channel.close()
        await inner.close()
        await server.stop(grace=None)


@pytest.fixture
def traced() -> tuple[TracerProvider, InMemorySpanExporter, str]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # A label of our own, so counters shared with the rest of the process start at zero here.
    return provider, exporter, f"test-{uuid.uuid4().hex[:8]}"


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _one(spans: list[ReadableSpan], name: str, kind: SpanKind) -> ReadableSpan:
    matching = [s for s in spans if s.name == name and s.kind == kind]
    assert len(matching) == 1, [(s.name, s.kind) for s in spans]
    return matching[0]


def test_client_and_server_spans_share_the_trace(traced: Any) -> None:
    provider, exporter, service = traced
    tracer = provider.get_tracer("test")
    root_ids: list[int] = []

    async def body(stub: broker_pb2_grpc.BrokerStub, servicer: _TestBroker) -> None:
        with tracer.start_as_current_span("caller") as root:
            root_ids.append(root.get_span_context().trace_id)
            response = await stub.Metadata(broker_pb2.MetadataRequest(), timeout=CALL_TIMEOUT_S)
        assert response.cluster_id == "test"
        assert servicer.seen_trace_ids == root_ids

    asyncio.run(_with_server(service, provider, body))
    spans = list(exporter.get_finished_spans())
    root = _one(spans, "caller", SpanKind.INTERNAL)
    client = _one(spans, "fjord.v1.Broker/Metadata", SpanKind.CLIENT)
    server = _one(spans, "fjord.v1.Broker/Metadata", SpanKind.SERVER)
    trace_id = root.context.trace_id
    assert client.context.trace_id == server.context.trace_id == trace_id
    assert client.parent is not None and client.parent.span_id == root.context.span_id
    assert server.parent is not None and server.parent.span_id == client.context.span_id
    assert server.parent.is_remote
    assert server.attributes is not None
    assert server.attributes["rpc.method"] == "Metadata"
    assert server.attributes["rpc.service"] == "fjord.v1.Broker"
    assert server.attributes["rpc.grpc.status_code"] == 0
    assert server.status.is_ok and client.status.is_ok


def test_context_flows_through_a_server_into_its_own_calls(traced: Any) -> None:
    provider, exporter, service = traced

    async def body(stub: broker_pb2_grpc.BrokerStub, servicer: _TestBroker) -> None:
        await stub.Fetch(broker_pb2.FetchRequest(), timeout=CALL_TIMEOUT_S)

    asyncio.run(_with_server(service, provider, body))
    spans = list(exporter.get_finished_spans())
    outer_client = _one(spans, "fjord.v1.Broker/Fetch", SpanKind.CLIENT)
    outer_server = _one(spans, "fjord.v1.Broker/Fetch", SpanKind.SERVER)
    inner_client = _one(spans, "fjord.v1.Broker/Metadata", SpanKind.CLIENT)
    inner_server = _one(spans, "fjord.v1.Broker/Metadata", SpanKind.SERVER)
    # No span was current in the test: the outer client span is the root of the trace.
    assert outer_client.parent is None
    chain = [outer_client, outer_server, inner_client, inner_server]
    assert len({s.context.trace_id for s in chain}) == 1
    for parent, child in itertools.pairwise(chain):
        assert child.parent is not None and child.parent.span_id == parent.context.span_id


def test_failures_are_counted_and_marked(traced: Any) -> None:
    provider, exporter, service = traced
    codes: list[grpc.StatusCode] = []

    async def body(stub: broker_pb2_grpc.BrokerStub, servicer: _TestBroker) -> None:
        for call, request in (
            (stub.Produce, broker_pb2.ProduceRequest(acks=7)),
            (stub.ListOffsets, broker_pb2.ListOffsetsRequest()),
        ):
            with pytest.raises(aio.AioRpcError) as caught:
                await call(request, timeout=CALL_TIMEOUT_S)
            codes.append(caught.value.code())

    asyncio.run(_with_server(service, provider, body))
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNKNOWN]
    spans = list(exporter.get_finished_spans())
    produce = _one(spans, "fjord.v1.Broker/Produce", SpanKind.SERVER)
    assert not produce.status.is_ok
    assert produce.status.description == "acks must be 0, 1 or -1"
    list_offsets = _one(spans, "fjord.v1.Broker/ListOffsets", SpanKind.SERVER)
    assert any(event.name == "exception" for event in list_offsets.events)
    produce_client = _one(spans, "fjord.v1.Broker/Produce", SpanKind.CLIENT)
    assert not produce_client.status.is_ok
    for side in ("server", "client"):
        assert (
            _sample(
                f"fjord_rpc_{side}_requests_total",
                service=service,
                method="fjord.v1.Broker/Produce",
                code="INVALID_ARGUMENT",
            )
            == 1
        )
        assert (
            _sample(
                f"fjord_rpc_{side}_requests_total",
                service=service,
                method="fjord.v1.Broker/ListOffsets",
                code="UNKNOWN",
            )
            == 1
        )


def test_metrics_endpoint_serves_rpc_counters(traced: Any) -> None:
    provider, _exporter, service = traced
    calls = 5

    async def body(stub: broker_pb2_grpc.BrokerStub, servicer: _TestBroker) -> None:
        for _ in range(calls):
            await stub.Metadata(broker_pb2.MetadataRequest(), timeout=CALL_TIMEOUT_S)

    asyncio.run(_with_server(service, provider, body))
    port = start_metrics_server(0)
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=CALL_TIMEOUT_S
        ) as reply:
            assert reply.status == 200
            text = reply.read().decode()
    finally:
        stop_metrics_server(port)
    labels = f'code="OK",method="fjord.v1.Broker/Metadata",service="{service}"'
    assert f"fjord_rpc_server_requests_total{{{labels}}} {float(calls)}" in text
    assert f"fjord_rpc_client_requests_total{{{labels}}} {float(calls)}" in text
    assert f"fjord_rpc_server_latency_seconds_count{{{labels}}} {float(calls)}" in text
    assert "# TYPE fjord_broker_bytes_in_total counter" in text
    assert "# TYPE fjord_controller_active gauge" in text
    assert "_created" not in text


def test_streaming_calls_are_traced_and_counted(traced: Any) -> None:
    """A server-streaming method (registered generically, raw bytes) through both interceptors."""
    provider, exporter, service = traced
    method = "/test.Stream/Count"
    received: list[bytes] = []

    async def count(request: bytes, context: Any) -> Any:
        for i in range(int(request)):
            yield str(i).encode()

    async def scenario() -> None:
        server = aio.server(interceptors=server_interceptors(service, provider))
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "test.Stream", {"Count": grpc.unary_stream_rpc_method_handler(count)}
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = aio.insecure_channel(
            f"127.0.0.1:{port}", interceptors=client_interceptors(service, provider)
        )
        try:
            call = channel.unary_stream(method)(b"3", timeout=CALL_TIMEOUT_S)
            async for item in call:
                received.append(item)
            # The client span ends from the call's done callback: wait for it, bounded.
            deadline = asyncio.get_running_loop().time() + CALL_TIMEOUT_S
            while not any(s.kind == SpanKind.CLIENT for s in exporter.get_finished_spans()):
                assert asyncio.get_running_loop().time() < deadline, "client span never ended"
                await asyncio.sleep(0.01)
        finally:
            await channel.close()
            await server.stop(grace=None)

    asyncio.run(scenario())
    assert received == [b"0", b"1", b"2"]
    spans = list(exporter.get_finished_spans())
    client = _one(spans, "test.Stream/Count", SpanKind.CLIENT)
    server = _one(spans, "test.Stream/Count", SpanKind.SERVER)
    assert server.parent is not None and server.parent.span_id == client.context.span_id
    assert client.context.trace_id == server.context.trace_id
    for side in ("server", "client"):
        count_ok = _sample(
            f"fjord_rpc_{side}_requests_total",
            service=service,
            method="test.Stream/Count",
            code="OK",
        )
        assert count_ok == 1
