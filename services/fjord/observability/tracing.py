"""OpenTelemetry tracing for Fjord processes, configured only by the standard ``OTEL_*`` variables.

:func:`setup_tracing` installs an SDK ``TracerProvider`` as the global provider when at least one
exporter is wanted, and otherwise leaves OpenTelemetry's no-op provider in place, so a service
that nobody traces pays only for propagating an incoming ``traceparent`` (a few microseconds per
call), never for building spans.

Variables read (names and meaning from the OpenTelemetry specification):

- ``OTEL_TRACES_EXPORTER``: comma-separated list of ``none`` (the default), ``console`` (spans
  as JSON on stderr) and ``otlp``. ``otlp`` needs ``opentelemetry-exporter-otlp-proto-grpc`` (or
  ``-proto-http`` when ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL`` is ``http/protobuf``); Fjord
  does not depend on them, and asking for one that is not installed raises ``ConfigError``
  saying which package to install.
- ``OTEL_SDK_DISABLED=true``: no provider at all, whatever else is set.
- ``OTEL_SERVICE_NAME``: overrides the ``service_name`` argument; ``OTEL_RESOURCE_ATTRIBUTES``,
  ``OTEL_TRACES_SAMPLER[_ARG]``, ``OTEL_BSP_*`` and ``OTEL_EXPORTER_OTLP_*`` are read by the SDK
  and the exporters themselves.

Propagation always uses W3C Trace Context (``traceparent``/``tracestate``), in gRPC metadata
and in record headers, independent of ``OTEL_PROPAGATORS``: the record header is part of the
data format and must not change with one process's environment.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterable

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from fjord.errors import ConfigError
from fjord.observability.defaults import (
    OTEL_TRACES_EXPORTER_DEFAULT,
    TRACEPARENT_HEADER,
    TRACER_NAME,
    TRACESTATE_HEADER,
)

W3C_PROPAGATOR = TraceContextTextMapPropagator()
_TRACE_HEADERS = frozenset((TRACEPARENT_HEADER, TRACESTATE_HEADER))

_KNOWN_EXPORTERS = ("none", "console", "otlp")
_OTLP_PACKAGES = {
    "grpc": (
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        "opentelemetry-exporter-otlp-proto-grpc",
    ),
    "http/protobuf": (
        "opentelemetry.exporter.otlp.proto.http.trace_exporter",
        "opentelemetry-exporter-otlp-proto-http",
    ),
}

_lock = threading.Lock()
_provider: TracerProvider | None = None
_attached_exporters: set[int] = set()


def requested_exporters(environ: dict[str, str] | None = None) -> list[str]:
    """The exporter names ``OTEL_TRACES_EXPORTER`` asks for, validated; ``[]`` means none.

    Raises :class:`ConfigError` naming the variable for an unknown exporter.
    """
    env = os.environ if environ is None else environ
    raw = env.get("OTEL_TRACES_EXPORTER", OTEL_TRACES_EXPORTER_DEFAULT)
    names = [name.strip().lower() for name in raw.split(",") if name.strip()]
    unknown = [name for name in names if name not in _KNOWN_EXPORTERS]
    if unknown:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER: unknown exporter {unknown[0]!r} "
            f"(Fjord supports {', '.join(_KNOWN_EXPORTERS)})"
        )
    return [name for name in names if name != "none"]


def _otlp_exporter(environ: dict[str, str]) -> SpanExporter:
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    ).strip()
    if protocol not in _OTLP_PACKAGES:
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL: unsupported protocol {protocol!r} "
            f"(use one of {', '.join(_OTLP_PACKAGES)})"
        )
    module_name, package = _OTLP_PACKAGES[protocol]
    try:
        module = __import__(module_name, fromlist=["OTLPSpanExporter"])
    except ImportError as exc:
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER=otlp with protocol {protocol} needs the Python package "
            f"{package}, which is not installed: install it into this environment, or unset "
            "OTEL_TRACES_EXPORTER to run without exporting spans"
        ) from exc
    exporter: SpanExporter = module.OTLPSpanExporter()
    return exporter


def _exporters_from_env(environ: dict[str, str]) -> list[SpanExporter]:
    exporters: list[SpanExporter] = []
    for name in requested_exporters(environ):
        if name == "console":
            # stderr: a service's stdout carries nothing but its logs.
            exporters.append(ConsoleSpanExporter(out=sys.stderr))
        elif name == "otlp":
            exporters.append(_otlp_exporter(environ))
    return exporters


def _sdk_disabled(environ: dict[str, str]) -> bool:
    return environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def setup_tracing(
    service_name: str, *, span_exporter: SpanExporter | None = None
) -> TracerProvider | None:
    """Configure tracing for this process from ``OTEL_*``; returns the SDK provider or ``None``.

    ``span_exporter`` adds one more exporter behind a synchronous processor (tests pass an
    ``InMemorySpanExporter`` and see each span as soon as it ends). The global provider can be
    set only once per process: later calls reuse it and only attach a new ``span_exporter``.
    Returns ``None`` (tracing off, propagation only) when no exporter is configured or
    ``OTEL_SDK_DISABLED=true``.
    """
    global _provider
    environ = dict(os.environ)
    if _sdk_disabled(environ):
        return None
    with _lock:
        if _provider is None:
            env_exporters = _exporters_from_env(environ)
            if not env_exporters and span_exporter is None:
                return None
            name = environ.get("OTEL_SERVICE_NAME") or service_name
            provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
            for exporter in env_exporters:
                provider.add_span_processor(BatchSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
            _provider = provider
        if span_exporter is not None and id(span_exporter) not in _attached_exporters:
            _provider.add_span_processor(SimpleSpanProcessor(span_exporter))
            _attached_exporters.add(id(span_exporter))
        return _provider


def shutdown_tracing() -> None:
    """Export what is buffered and stop the exporters (call when a service stops)."""
    with _lock:
        provider = _provider
    if provider is not None:
        provider.force_flush()


def get_tracer(tracer_provider: TracerProvider | None = None) -> trace.Tracer:
    """Fjord's tracer from ``tracer_provider``, else from the global provider.

    The global one is a no-op until :func:`setup_tracing` installs an SDK provider; a tracer
    obtained before that delegates to the provider once it is installed.
    """
    return trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)


def inject_traceparent_header(context: Context | None = None) -> tuple[tuple[str, bytes], ...]:
    """Record headers carrying the current (or ``context``'s) span: ``(("traceparent", b"00-…"),)``.

    Empty when there is no valid span, so a producer can always do
    ``headers + inject_traceparent_header()``.
    """
    carrier: dict[str, str] = {}
    W3C_PROPAGATOR.inject(carrier, context=context)
    return tuple((name, value.encode("ascii")) for name, value in carrier.items())


def extract_from_record_headers(headers: Iterable[tuple[str, bytes | None]]) -> Context:
    """The OpenTelemetry context of the producer's span, from a record's headers.

    Use it as the parent of the consumer's span (``tracer.start_as_current_span(name,
    context=ctx)``). Headers without a well-formed ``traceparent`` (missing, not ASCII, wrong
    version or length) give an empty context: the consumer then starts a new trace, as the W3C
    specification requires, and nothing fails.
    """
    carrier: dict[str, str] = {}
    for name, value in headers:
        if value is None or name.lower() not in _TRACE_HEADERS:
            continue
        try:
            carrier[name.lower()] = value.decode("ascii")
        except UnicodeDecodeError:
            continue
    if not carrier:
        return Context()
    return W3C_PROPAGATOR.extract(carrier, context=Context())
