"""When the clients instrument their channels, and the traceparent record header they add."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from fjord.client import ConsumerRecord
from fjord.client.network import Network
from fjord.observability import start_metrics_server, stop_metrics_server
from fjord.observability.clients import (
    client_instrumentation_enabled,
    tracing_configured,
    with_traceparent,
)


def _network(provider: TracerProvider | None = None) -> Network:
    return Network(
        [("127.0.0.1", 1)], client_id="t", request_timeout_ms=1000, tracer_provider=provider
    )


def test_bare_channels_unless_tracing_or_metrics(no_global_instrumentation: None) -> None:
    assert not tracing_configured()
    assert _network().interceptors is None
    with_provider = _network(TracerProvider()).interceptors
    assert with_provider is not None and len(with_provider) == 4  # one per call kind
    port = start_metrics_server(0)
    try:
        assert client_instrumentation_enabled()
        assert _network().interceptors is not None
    finally:
        stop_metrics_server(port)
    assert _network().interceptors is None


def test_traceparent_header_only_inside_a_valid_span() -> None:
    headers = (("h", b"1"),)
    assert with_traceparent(headers) is headers  # no current span
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("send") as span:
        added = with_traceparent(headers)
        own = (("TraceParent", b"00-mine"),)
        assert with_traceparent(own) is own  # the caller's own header wins
    context = span.get_span_context()
    assert added[0] == ("h", b"1")
    name, value = added[1]
    assert name == "traceparent"
    assert value is not None
    version, trace_id, span_id, _flags = value.decode().split("-")
    assert (version, int(trace_id, 16), int(span_id, 16)) == (
        "00", context.trace_id, context.span_id
    )


def test_consumer_record_trace_context_round_trip() -> None:
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("send") as span:
        headers = with_traceparent(())
    record = ConsumerRecord("t", 0, 0, None, b"v", headers, 0)
    parent = trace.get_current_span(record.trace_context()).get_span_context()
    assert parent.is_remote and parent.span_id == span.get_span_context().span_id
    for bad in ((), (("traceparent", b"\xff"),), (("traceparent", None),),
                (("traceparent", b"00-" + b"0" * 32 + b"-" + b"1" * 16 + b"-01"),)):
        record = ConsumerRecord("t", 0, 0, None, b"v", bad, 0)
        assert not trace.get_current_span(record.trace_context()).get_span_context().is_valid
