"""Pure parts of fjord.observability: metric helpers, OTEL_* parsing, traceparent record headers."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from prometheus_client import REGISTRY

from fjord.errors import ConfigError
from fjord.observability import (
    extract_from_record_headers,
    inject_traceparent_header,
    record_bytes_in,
    record_bytes_out,
    record_rpc,
    remove_group_lag,
    requested_exporters,
    set_active_controller,
    set_group_lag,
    set_partitions_led,
    setup_tracing,
    start_metrics_server,
    tracing,
)
from fjord.observability.interceptors import FjordServerInterceptor
from fjord.observability.tracing import _exporters_from_env


def _value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --- metrics --------------------------------------------------------------------------------


def test_bytes_counters_are_per_topic() -> None:
    orders, payments = _unique("orders"), _unique("payments")
    record_bytes_in(orders, 100, num_records=3)
    record_bytes_in(orders, 50)
    record_bytes_in(payments, 7, num_records=1)
    record_bytes_out(orders, 40)
    assert _value("fjord_broker_bytes_in_total", topic=orders) == 150
    assert _value("fjord_broker_messages_in_total", topic=orders) == 3
    assert _value("fjord_broker_bytes_in_total", topic=payments) == 7
    assert _value("fjord_broker_bytes_out_total", topic=orders) == 40
    assert _value("fjord_broker_bytes_out_total", topic=payments) is None


def test_gauges_take_the_last_value() -> None:
    set_active_controller(True)
    assert _value("fjord_controller_active") == 1
    set_active_controller(False)
    assert _value("fjord_controller_active") == 0
    set_partitions_led(12)
    set_partitions_led(4)
    assert _value("fjord_broker_partitions_led") == 4


def test_group_lag_series_can_be_removed() -> None:
    group = _unique("g")
    set_group_lag(group, "orders", 3, 42)
    assert _value("fjord_group_lag", group=group, topic="orders", partition="3") == 42
    remove_group_lag(group, "orders", 3)
    assert _value("fjord_group_lag", group=group, topic="orders", partition="3") is None
    remove_group_lag(group, "orders", 3)  # forgetting twice is harmless


def test_record_rpc_counts_and_observes_each_side() -> None:
    service = _unique("svc")
    record_rpc("server", service, "fjord.v1.Broker/Produce", "OK", 0.002)
    record_rpc("server", service, "fjord.v1.Broker/Produce", "OK", 0.004)
    record_rpc("client", service, "fjord.v1.Broker/Produce", "UNAVAILABLE", 0.5)
    labels = {"service": service, "method": "fjord.v1.Broker/Produce"}
    assert _value("fjord_rpc_server_requests_total", code="OK", **labels) == 2
    assert _value("fjord_rpc_server_latency_seconds_sum", code="OK", **labels) == pytest.approx(
        0.006
    )
    # 2 ms and 4 ms both fall under the 5 ms bucket, neither under 1 ms.
    assert _value("fjord_rpc_server_latency_seconds_bucket", code="OK", le="0.005", **labels) == 2
    assert _value("fjord_rpc_server_latency_seconds_bucket", code="OK", le="0.001", **labels) == 0
    assert _value("fjord_rpc_client_requests_total", code="UNAVAILABLE", **labels) == 1
    with pytest.raises(ValueError, match="side"):
        record_rpc("sideways", service, "m", "OK", 0.1)


def test_metrics_server_rejects_bad_ports() -> None:
    with pytest.raises(ConfigError, match="65535"):
        start_metrics_server(70000)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConfigError, match="cannot serve metrics"):
            start_metrics_server(taken.getsockname()[1])


# --- OTEL_* configuration -------------------------------------------------------------------


def test_no_exporter_by_default() -> None:
    assert requested_exporters({}) == []
    assert requested_exporters({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert requested_exporters({"OTEL_TRACES_EXPORTER": " Console , none"}) == ["console"]


def test_unknown_exporter_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"OTEL_TRACES_EXPORTER.*'jaeger'"):
        requested_exporters({"OTEL_TRACES_EXPORTER": "console,jaeger"})


def test_console_exporter_is_built_from_env() -> None:
    exporters = _exporters_from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert [type(e) for e in exporters] == [ConsoleSpanExporter]


def test_otlp_without_its_package_names_the_package() -> None:
    try:
        import opentelemetry.exporter.otlp.proto.grpc  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("the OTLP gRPC exporter is installed here")
    with pytest.raises(ConfigError, match="opentelemetry-exporter-otlp-proto-grpc"):
        _exporters_from_env({"OTEL_TRACES_EXPORTER": "otlp"})
    with pytest.raises(ConfigError, match="unsupported protocol"):
        _exporters_from_env(
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}
        )


def test_setup_without_exporter_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    installed_before = tracing._provider is not None
    assert setup_tracing("unit") is None or installed_before
    if not installed_before:  # (another test of this process may have installed one)
        assert not isinstance(trace.get_tracer_provider(), TracerProvider)
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    assert setup_tracing("unit") is None


def test_console_exporter_end_to_end_in_a_fresh_process() -> None:
    """A real process configured only by OTEL_* prints its span (on stderr, not stdout)."""
    script = (
        "from fjord.observability import setup_tracing, get_tracer, shutdown_tracing\n"
        "assert setup_tracing('quiet-name') is not None\n"
        "with get_tracer().start_as_current_span('hello-span'):\n"
        "    pass\n"
        "shutdown_tracing()\n"
    )
    env = dict(os.environ, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="env-name")
    env.pop("OTEL_SDK_DISABLED", None)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert '"name": "hello-span"' in done.stderr
    assert '"service.name": "env-name"' in done.stderr


# --- traceparent record headers -------------------------------------------------------------


def _span(trace_id: int, span_id: int, sampled: bool = True) -> NonRecordingSpan:
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags))


@given(
    trace_id=st.integers(min_value=1, max_value=2**128 - 1),
    span_id=st.integers(min_value=1, max_value=2**64 - 1),
    sampled=st.booleans(),
)
def test_traceparent_header_round_trip(trace_id: int, span_id: int, sampled: bool) -> None:
    context = trace.set_span_in_context(_span(trace_id, span_id, sampled))
    headers = inject_traceparent_header(context)
    assert [name for name, _ in headers] == ["traceparent"]
    value = headers[0][1]
    assert value == f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}".encode()
    extracted = trace.get_current_span(extract_from_record_headers((("key", b"x"), *headers)))
    span_context = extracted.get_span_context()
    assert span_context.is_remote
    assert (span_context.trace_id, span_context.span_id) == (trace_id, span_id)
    assert span_context.trace_flags.sampled == sampled


def test_no_current_span_injects_nothing() -> None:
    assert inject_traceparent_header() == ()


@pytest.mark.parametrize(
    "headers",
    [
        (),
        (("traceparent", None),),
        (("traceparent", b"\xff\xfe"),),
        (("traceparent", b"00-zz-not-hex"),),
        (("traceparent", b"00-00000000000000000000000000000000-0000000000000001-01"),),
        (("other", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),),
    ],
)
def test_malformed_or_missing_traceparent_starts_a_new_trace(
    headers: tuple[tuple[str, bytes | None], ...],
) -> None:
    extracted = trace.get_current_span(extract_from_record_headers(headers))
    assert not extracted.get_span_context().is_valid


def test_every_metric_is_documented() -> None:
    """docs/observability.md lists every metric metrics.py defines (names as exported)."""
    from prometheus_client.metrics import MetricWrapperBase

    from fjord.observability import metrics

    doc = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    defined = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    assert len(defined) >= 15
    for metric in defined:
        exported = {
            "counter": f"{metric._name}_total",
            "info": f"{metric._name}_info",
        }.get(metric._type, metric._name)
        assert f"`{exported}`" in doc, f"{exported} is not in docs/observability.md"


class _StreamContext:
    """What the server interceptor asks of a call's context: no metadata, no status set."""

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def code(self) -> None:
        return None

    def details(self) -> None:
        return None


def test_a_streaming_answer_closed_from_another_context_ends_its_rpc_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server stream closed at a yield by the loop's finalizer (the client went away while
    an answer was being sent: grpc.aio drops the generator) runs in a context of its own: the
    interceptor ends the RPC as CANCELLED without trying to detach the span's context there
    (OpenTelemetry logged "Failed to detach context" with a traceback, found by a broker's
    log check in tests/integration/test_disk_full.py)."""
    method = "fjord.v1.Test/Stream"

    async def answers(requests: object, context: object) -> AsyncIterator[bytes]:
        for i in itertools.count():
            yield b"%d" % i

    wrapped = FjordServerInterceptor("test-stream")._wrap(
        grpc.stream_stream_rpc_method_handler(answers), method
    )

    def cancelled() -> float:
        return REGISTRY.get_sample_value(
            "fjord_rpc_server_requests_total",
            {"service": "test-stream", "method": method, "code": "CANCELLED"},
        ) or 0.0

    async def scenario() -> None:
        stream = wrapped.stream_stream(None, _StreamContext())
        # The first answer taken in a task of its own (its context holds the span's).
        assert await asyncio.ensure_future(stream.__anext__()) == b"0"
        before = cancelled()
        # Closed from another task, as the loop's finalizer of an abandoned generator does.
        await asyncio.ensure_future(stream.aclose())
        assert cancelled() == before + 1

    with caplog.at_level(logging.ERROR, logger="opentelemetry.context"):
        asyncio.run(scenario())
    assert not [r for r in caplog.records if r.name == "opentelemetry.context"], caplog.text
