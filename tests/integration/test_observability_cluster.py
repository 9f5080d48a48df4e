"""Observability of real processes: /metrics of brokers and controllers, spans across processes.

A small cluster of its own (etcd, 2 controllers, 1 broker) started by the shared launcher, with
``--metrics-port`` added to each process and ``OTEL_TRACES_EXPORTER=console`` in their
environment (spans go to each process's log file), so the shared cluster stays untouched.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from grpc import aio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.local.cluster import LocalCluster
from fjord.local.etcd import free_port
from fjord.observability import client_interceptors

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0
RECORDS = 50
# Children export spans every 50 ms instead of the SDK's 5 s, so the test waits little.
CHILD_ENV = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "50"}


class _MetricsCluster(LocalCluster):
    """A LocalCluster whose controllers and brokers also serve /metrics on a free port each."""

    metrics_ports: dict[tuple[str, int], int]

    def _spawn(self, role: str, node_id: int, args: list[str]) -> subprocess.Popen[bytes]:
        if not hasattr(self, "metrics_ports"):
            self.metrics_ports = {}
        port = free_port()
        self.metrics_ports[(role, node_id)] = port
        return super()._spawn(role, node_id, [*args, "--metrics-port", str(port)])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_MetricsCluster]:
    saved = {k: os.environ.get(k) for k in CHILD_ENV}
    os.environ.update(CHILD_ENV)  # inherited by the children at spawn, then restored
    started = _MetricsCluster(
        tmp_path_factory.mktemp("obs-cluster"), brokers=1, controllers=2, unsafe_etcd_no_fsync=True
    )
    try:
        started.start()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    try:
        yield started
    finally:
        started.stop()


def _scrape(port: int) -> dict[str, float]:
    """``{'name{labels}': value}`` from a /metrics page."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as reply:
        text = reply.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def _wait_for(check: Any, what: str) -> Any:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_broker_and_controller_metrics(cluster: _MetricsCluster) -> None:
    topic = f"obs-{uuid.uuid4().hex[:8]}"
    bootstrap = cluster.bootstrap_servers
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)], timeout=TIMEOUT_S)
    with Producer({"bootstrap.servers": bootstrap, "acks": "1"}) as producer:
        for i in range(RECORDS):
            producer.send(topic, b"v" * 100, key=str(i).encode())
        producer.flush(TIMEOUT_S)
    consumer = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, 0)])
        got: list[Any] = []
        _wait_for(lambda: got.extend(consumer.poll(0.2)) or len(got) >= RECORDS, "records")
    finally:
        consumer.close()

    broker = _scrape(cluster.metrics_ports[("broker", 0)])
    label = f'{{topic="{topic}"}}'
    assert broker[f"fjord_broker_messages_in_total{label}"] == RECORDS
    assert broker[f"fjord_broker_bytes_in_total{label}"] > RECORDS * 100
    assert broker[f"fjord_broker_bytes_out_total{label}"] > RECORDS * 100
    assert broker["fjord_broker_partitions_led"] >= 1
    produced = [
        v for k, v in broker.items()
        if k.startswith("fjord_rpc_server_requests_total")
        and 'method="fjord.v1.Broker/Produce"' in k and 'code="OK"' in k
    ]  # fmt: skip
    assert produced and sum(produced) >= 1
    assert any(k.startswith("fjord_build_info") for k in broker)

    controllers = [_scrape(cluster.metrics_ports[("controller", i)]) for i in range(2)]
    assert sorted(c["fjord_controller_active"] for c in controllers) == [0.0, 1.0]
    active = next(c for c in controllers if c["fjord_controller_active"] == 1.0)
    created = [
        v for k, v in active.items()
        if k.startswith("fjord_rpc_server_requests_total") and "CreateTopics" in k
    ]  # fmt: skip
    assert created and sum(created) >= 1


def test_trace_context_crosses_into_the_broker_process(cluster: _MetricsCluster) -> None:
    """A client span in this process is the parent of the broker's server span (its log)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    span_ids: dict[str, int] = {}

    async def call() -> None:
        channel = aio.insecure_channel(
            cluster.broker_addresses[0], interceptors=client_interceptors("test", provider)
        )
        try:
            with tracer.start_as_current_span("test-root") as root:
                span_ids["trace"] = root.get_span_context().trace_id
                stub = broker_pb2_grpc.BrokerStub(channel)
                await stub.Metadata(broker_pb2.MetadataRequest(), timeout=TIMEOUT_S)
        finally:
            await channel.close()

    asyncio.run(call())
    log = Path(cluster.logs_dir) / "broker-0.log"
    trace_hex = f"0x{span_ids['trace']:032x}"

    def broker_span() -> dict[str, Any] | None:
        for document in _json_documents(log.read_text(errors="replace")):
            if (
                document.get("name") == "fjord.v1.Broker/Metadata"
                and document.get("context", {}).get("trace_id") == trace_hex
            ):
                return document
        return None

    span = _wait_for(broker_span, "the broker's span of our trace in its log")
    (client,) = [s for s in exporter.get_finished_spans() if s.name == "fjord.v1.Broker/Metadata"]
    assert span["kind"] == "SpanKind.SERVER"
    assert span["parent_id"] == f"0x{client.context.span_id:016x}"
    assert span["resource"]["attributes"]["service.name"]


def _json_documents(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects the console exporter wrote, among the log lines around them."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"^\{", text, re.M):
        try:
            document, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(document, dict):
            yield document
