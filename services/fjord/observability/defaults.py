"""Every default of :mod:`fjord.observability`, defined once here.

- ``METRICS_HOST``: the address ``/metrics`` binds to when a service is given ``--metrics-port``
  without a host. Loopback, so that a process started on a laptop does not expose its metrics
  to the network; Kubernetes deployments pass ``0.0.0.0`` explicitly.
- ``METRICS_HOST_ENV``: the environment variable that overrides ``METRICS_HOST`` for every
  service of a process (``FJORD_METRICS_HOST``); the container image (``Dockerfile``) sets it to
  ``0.0.0.0``: the pods' probes and Prometheus reach ``/metrics`` on the pod's address.
- ``METRICS_PATH``: where Prometheus scrapes (the client library serves every path; this is the
  one we document and test).
- ``RPC_LATENCY_BUCKETS_S``: histogram buckets of RPC latency, in seconds. They start at 100 us
  (a loopback unary call on an idle machine) and end at 30 s (the longest request timeout a
  client may set), roughly doubling, so p50/p99 of both fast produce calls and long fetch polls
  land in a bucket that tells them apart.
- ``TRACEPARENT_HEADER``: the W3C Trace Context header name, used both as gRPC metadata key and as
  the record header that carries a trace from producer through broker to consumer.
- ``OTEL_TRACES_EXPORTER_DEFAULT``: ``none``: no span leaves the process unless the operator
  asks for it with the standard ``OTEL_TRACES_EXPORTER`` variable.
- ``TRACER_NAME``: instrumentation scope name of every span Fjord creates.
"""

from __future__ import annotations

METRICS_HOST = "127.0.0.1"
METRICS_HOST_ENV = "FJORD_METRICS_HOST"
METRICS_PATH = "/metrics"

RPC_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

TRACEPARENT_HEADER = "traceparent"
TRACESTATE_HEADER = "tracestate"

OTEL_TRACES_EXPORTER_DEFAULT = "none"

TRACER_NAME = "fjord"
