"""When Fjord's clients instrument themselves, and the ``traceparent`` record header they add.

The producer, consumer and admin client install :func:`~fjord.observability.client_interceptors`
on their gRPC channels only when someone can see the result: a tracer provider is configured
(given to the client, or installed globally by :func:`~fjord.observability.setup_tracing` or by
the application's own OpenTelemetry SDK set-up) or this process serves ``/metrics``. Otherwise
the channels are bare: grpc.aio's interceptor machinery alone costs about 100 us of CPU per call
(an extra task and an ``asyncio.wait`` per unary call; ``bench/bench_interceptors.py``), which
would be paid on every produce and fetch for spans nobody exports.

The decision is taken when a client is created (its channels are created lazily, with the same
answer): set up tracing or start the metrics server before creating clients.

Record headers: with tracing configured, the producer adds a W3C ``traceparent`` header to
every record sent while a valid span is current (the application's "send" span), unless the
record already carries one. The broker stores it untouched; the consumer returns it among the
record's headers (:meth:`fjord.client.ConsumerRecord.trace_context` turns it into the parent
context of the consumer's span).
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider

from fjord.observability.defaults import TRACEPARENT_HEADER
from fjord.observability.metrics import metrics_served
from fjord.observability.tracing import inject_traceparent_header

Headers = tuple[tuple[str, bytes | None], ...]


def tracing_configured(tracer_provider: trace.TracerProvider | None = None) -> bool:
    """True when spans can be recorded: ``tracer_provider`` is given, or a real (not the
    no-op or not-yet-set proxy) provider is installed globally."""
    if tracer_provider is not None:
        return True
    return not isinstance(trace.get_tracer_provider(), ProxyTracerProvider | NoOpTracerProvider)


def client_instrumentation_enabled(tracer_provider: trace.TracerProvider | None = None) -> bool:
    """Whether a client's channels get the tracing/metrics interceptors (see the module doc)."""
    return tracing_configured(tracer_provider) or metrics_served()


def with_traceparent(headers: Headers) -> Headers:
    """``headers`` plus a ``traceparent`` of the current span; unchanged when there is no
    valid current span or the record already has a ``traceparent`` header."""
    for name, _ in headers:
        if name.lower() == TRACEPARENT_HEADER:
            return headers
    extra = inject_traceparent_header()
    return headers + extra if extra else headers
