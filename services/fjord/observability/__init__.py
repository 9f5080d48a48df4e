"""Metrics (Prometheus), tracing (OpenTelemetry) and the gRPC interceptors that feed both.

A service wires it in with three lines::

    setup_tracing("broker")                       # OTEL_* variables decide; none by default
    metrics_port = start_metrics_server(port)     # /metrics; 0 picks a free port
    server = grpc.aio.server(interceptors=server_interceptors("broker"))

and its outgoing channels with ``interceptors=client_interceptors("broker")``.
See docs/observability.md for every metric and variable.
"""

from fjord.observability.clients import (
    client_instrumentation_enabled,
    tracing_configured,
    with_traceparent,
)
from fjord.observability.interceptors import (
    FjordServerInterceptor,
    client_interceptors,
    server_interceptors,
)
from fjord.observability.metrics import (
    record_bytes_in,
    record_bytes_out,
    record_isr_expand,
    record_isr_shrink,
    record_rebalance,
    record_rpc,
    remove_group_lag,
    set_active_controller,
    set_cluster_under_replicated_partitions,
    set_group_lag,
    set_group_lag_seconds,
    set_offline_partitions,
    set_partitions_led,
    set_under_replicated_partitions,
    start_metrics_server,
    stop_metrics_server,
)
from fjord.observability.tracing import (
    extract_from_record_headers,
    get_tracer,
    inject_traceparent_header,
    requested_exporters,
    setup_tracing,
    shutdown_tracing,
)

__all__ = [
    "FjordServerInterceptor",
    "client_instrumentation_enabled",
    "client_interceptors",
    "extract_from_record_headers",
    "get_tracer",
    "inject_traceparent_header",
    "record_bytes_in",
    "record_bytes_out",
    "record_isr_expand",
    "record_isr_shrink",
    "record_rebalance",
    "record_rpc",
    "remove_group_lag",
    "requested_exporters",
    "server_interceptors",
    "set_active_controller",
    "set_cluster_under_replicated_partitions",
    "set_group_lag",
    "set_group_lag_seconds",
    "set_offline_partitions",
    "set_partitions_led",
    "set_under_replicated_partitions",
    "setup_tracing",
    "shutdown_tracing",
    "start_metrics_server",
    "stop_metrics_server",
    "tracing_configured",
    "with_traceparent",
]
