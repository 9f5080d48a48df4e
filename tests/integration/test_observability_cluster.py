"""Observability of real processes: /metrics of every process, spans across processes.

A small cluster of its own (etcd, 2 controllers, 1 broker) started by the plain launcher (which
gives every process a metrics port) with ``OTEL_TRACES_EXPORTER=console`` in the children's
environment (their spans go to each process's log file), so the shared cluster stays untouched.
Client spans are recorded in this process with an ``InMemorySpanExporter`` given to each client
as its ``tracer_provider``, so the process-wide OpenTelemetry provider stays unset.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from grpc import aio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.cli.main import cli
from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.client.network import RPC_STREAMS_ENV
from fjord.direct_client import DIRECT_DOOR_ENV
from fjord.local.cluster import LocalCluster
from fjord.observability import client_interceptors
from fjord.observability.defaults import TRACEPARENT_HEADER
from fjord.testing.waiting import wait_for
from tests.helpers.metrics import metric_value

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0
RECORDS = 50
# Children export spans every 50 ms instead of the SDK's 5 s, so the test waits little.
CHILD_ENV = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "50"}
PRODUCE = "fjord.v1.Broker/Produce"
FETCH = "fjord.v1.Broker/Fetch"
PRODUCE_STREAM = "fjord.v1.Broker/ProduceStream"
FETCH_STREAM = "fjord.v1.Broker/FetchStream"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    saved = {k: os.environ.get(k) for k in CHILD_ENV}
    os.environ.update(CHILD_ENV)  # inherited by the children at spawn, then restored
    started = LocalCluster(
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


def _scrape(address: str) -> dict[str, float]:
    """``{'name{labels}': value}`` from the /metrics page at ``host:port``."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=TIMEOUT_S) as reply:
        text = reply.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def _rpc_sum(samples: dict[str, float], metric: str, method: str) -> float:
    """Sum over the label sets of ``metric`` for one gRPC method with code OK."""
    return sum(
        v for k, v in samples.items()
        if k.startswith(metric + "{") and f'method="{method}"' in k and 'code="OK"' in k
    )  # fmt: skip


def _in_memory_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _create_topic(cluster: LocalCluster, partitions: int = 1) -> str:
    topic = f"obs-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(topic, partitions, 1)], timeout=TIMEOUT_S)
    return topic


def test_local_status_shows_every_metrics_address(cluster: LocalCluster) -> None:
    result = CliRunner().invoke(
        cli, ["local", "status", "--data-dir", str(cluster.data_dir), "--output", "json"]
    )
    assert result.exit_code == 0, result.output
    processes = json.loads(result.output)["processes"]
    assert sorted(p["role"] for p in processes) == [
        "broker", "controller", "controller", "coordinator", "coordinator", "etcd"
    ]
    for process in processes:
        assert process["metrics_address"] == cluster.metrics_address(process["role"], process["id"])
        assert process["metrics_address"] != process["address"] or process["role"] == "etcd"
        samples = _scrape(process["metrics_address"])
        if process["role"] == "etcd":
            assert samples["etcd_server_has_leader"] == 1.0
        else:
            assert samples[f'fjord_build_info{{version="{_version()}"}}'] == 1.0
    table = CliRunner().invoke(cli, ["local", "status", "--data-dir", str(cluster.data_dir)])
    assert "metrics_address" in table.output
    assert cluster.metrics_address("broker", 0) in table.output


def _version() -> str:
    from fjord import __version__

    return __version__


def test_broker_and_controller_metrics_move(cluster: LocalCluster) -> None:
    broker_address = cluster.metrics_address("broker", 0)
    before = _scrape(broker_address)
    topic = _create_topic(cluster, partitions=2)
    bootstrap = cluster.bootstrap_servers
    with Producer({"bootstrap.servers": bootstrap, "acks": "1"}) as producer:
        for i in range(RECORDS):
            producer.send(topic, b"v" * 100, partition=i % 2)
        producer.flush(TIMEOUT_S)
    consumer = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        got: list[Any] = []
        wait_for(
            lambda: got.extend(consumer.poll(0.2)) or len(got) >= RECORDS, "records", TIMEOUT_S
        )
    finally:
        consumer.close()

    after = _scrape(broker_address)
    label = f'{{topic="{topic}"}}'
    assert after[f"fjord_broker_messages_in_total{label}"] == RECORDS
    assert after[f"fjord_broker_bytes_in_total{label}"] > RECORDS * 100
    assert after[f"fjord_broker_bytes_out_total{label}"] > RECORDS * 100
    assert after["fjord_broker_partitions_led"] == before["fjord_broker_partitions_led"] + 2
    for metric in ("fjord_rpc_server_requests_total", "fjord_rpc_server_latency_seconds_count"):
        for method in (PRODUCE, FETCH):
            assert _rpc_sum(after, metric, method) > _rpc_sum(before, metric, method), (
                metric, method
            )
    # The histogram has the buckets and a sum consistent with its count.
    produce_sum = _rpc_sum(after, "fjord_rpc_server_latency_seconds_sum", PRODUCE)
    assert 0 < produce_sum < _rpc_sum(after, "fjord_rpc_server_latency_seconds_count", PRODUCE)

    controllers = [_scrape(cluster.metrics_address("controller", i)) for i in range(2)]
    assert sorted(c["fjord_controller_active"] for c in controllers) == [0.0, 1.0]
    active = next(c for c in controllers if c["fjord_controller_active"] == 1.0)
    assert _rpc_sum(active, "fjord_rpc_server_requests_total", "fjord.v1.Controller/CreateTopics")
    assert active["fjord_controller_offline_partitions"] == 0.0


def _broker_spans(cluster: LocalCluster) -> Iterator[dict[str, Any]]:
    log = Path(cluster.logs_dir) / "broker-0.log"
    yield from _json_documents(log.read_text(errors="replace"))


def _broker_child_of(cluster: LocalCluster, client: ReadableSpan) -> dict[str, Any]:
    """Wait for the broker's server span (in its log) whose parent is ``client``."""
    assert client.context is not None
    trace_hex = f"0x{client.context.trace_id:032x}"
    parent_hex = f"0x{client.context.span_id:016x}"

    def find() -> dict[str, Any] | None:
        for document in _broker_spans(cluster):
            if (
                document.get("name") == client.name
                and document.get("context", {}).get("trace_id") == trace_hex
                and document.get("parent_id") == parent_hex
            ):
                return document
        return None

    span: dict[str, Any] = wait_for(find, f"the broker's child span of {client.name}", TIMEOUT_S)
    assert span["kind"] == "SpanKind.SERVER"
    assert span["resource"]["attributes"]["service.name"] == "broker"
    return span


def test_trace_context_crosses_into_the_broker_process(cluster: LocalCluster) -> None:
    """A client span in this process is the parent of the broker's server span (its log)."""
    provider, exporter = _in_memory_provider()

    async def call() -> None:
        channel = aio.insecure_channel(
            cluster.broker_addresses[0], interceptors=client_interceptors("test", provider)
        )
        try:
            with provider.get_tracer("test").start_as_current_span("test-root"):
                stub = broker_pb2_grpc.BrokerStub(channel)
                await stub.Metadata(broker_pb2.MetadataRequest(), timeout=TIMEOUT_S)
        finally:
            await channel.close()

    asyncio.run(call())
    (client,) = [s for s in exporter.get_finished_spans() if s.name == "fjord.v1.Broker/Metadata"]
    (root,) = [s for s in exporter.get_finished_spans() if s.name == "test-root"]
    assert client.parent is not None and root.context is not None
    assert client.parent.span_id == root.context.span_id
    _broker_child_of(cluster, client)


def test_producer_and_consumer_spans_reach_the_broker_and_the_record(
    cluster: LocalCluster,
) -> None:
    """Producer.send + flush and Consumer.poll with a tracer provider: their Produce and Fetch
    client spans are the parents of the broker's server spans, and the record carries the
    application's send span to the consumer in its ``traceparent`` header."""
    topic = _create_topic(cluster)
    provider, exporter = _in_memory_provider()
    tracer = provider.get_tracer("test")
    bootstrap = cluster.bootstrap_servers
    with Producer({"bootstrap.servers": bootstrap}, tracer_provider=provider) as producer:
        with tracer.start_as_current_span("orders send", kind=SpanKind.PRODUCER) as send_span:
            producer.send(topic, b"traced")
        # Outside any span: no header, and a header the caller set is kept as it is.
        producer.send(topic, b"untraced")
        with tracer.start_as_current_span("other"):
            producer.send(topic, b"own", headers=[(TRACEPARENT_HEADER, b"00-custom")])
        producer.flush(TIMEOUT_S)

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}, tracer_provider=provider
    )
    try:
        consumer.assign([TopicPartition(topic, 0)])
        got: list[Any] = []
        wait_for(lambda: got.extend(consumer.poll(0.2)) or len(got) >= 3, "the records", TIMEOUT_S)
    finally:
        consumer.close()

    traced, untraced, own = got
    send_context = send_span.get_span_context()
    assert [name for name, _ in traced.headers] == [TRACEPARENT_HEADER]
    assert traced.headers[0][1] == (
        f"00-{send_context.trace_id:032x}-{send_context.span_id:016x}-"
        f"{int(send_context.trace_flags):02x}".encode()
    )
    assert untraced.headers == ()
    assert own.headers == ((TRACEPARENT_HEADER, b"00-custom"),)
    # The consumer continues the producer's trace.
    with tracer.start_as_current_span(
        "orders process", context=traced.trace_context(), kind=SpanKind.CONSUMER
    ) as process_span:
        pass
    process_context = process_span.get_span_context()
    assert process_context.trace_id == send_context.trace_id
    assert isinstance(process_span, ReadableSpan) and process_span.parent is not None
    assert process_span.parent.span_id == send_context.span_id
    # A malformed header: the consumer's span starts a new trace, nothing fails.
    assert not trace.get_current_span(own.trace_context()).get_span_context().is_valid

    finished = exporter.get_finished_spans()
    produce = [s for s in finished if s.name == PRODUCE and s.kind is SpanKind.CLIENT]
    fetch = [
        s for s in finished
        if s.name == FETCH and s.kind is SpanKind.CLIENT and s.status.is_ok
    ]  # fmt: skip
    assert produce and fetch
    assert produce[0].resource is not None
    _broker_child_of(cluster, produce[0])
    _broker_child_of(cluster, fetch[0])


def test_clients_without_a_tracer_provider_use_bare_channels(
    cluster: LocalCluster, no_global_instrumentation: None
) -> None:
    """No provider and no /metrics in this process: no interceptors, no record header."""
    from fjord.observability.clients import client_instrumentation_enabled

    assert not client_instrumentation_enabled()
    topic = _create_topic(cluster)
    provider, _ = _in_memory_provider()
    with Producer({"bootstrap.servers": cluster.bootstrap_servers}) as producer:
        assert producer._network.interceptors is None
        with provider.get_tracer("test").start_as_current_span("not exported"):
            producer.send(topic, b"v").result(TIMEOUT_S)
    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "auto.offset.reset": "earliest"}
    )
    try:
        assert consumer._network.interceptors is None
        consumer.assign([TopicPartition(topic, 0)])
        got: list[Any] = []
        wait_for(lambda: got.extend(consumer.poll(0.2)) or got, "the record", TIMEOUT_S)
    finally:
        consumer.close()
    assert got[0].headers == ()


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


def test_a_taken_metrics_port_is_replaced_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher picks ports free, but another process may bind one before the child does:
    the child then fails to serve /metrics and is started again on fresh ports."""
    import fjord.local.cluster as cluster_module

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    taken_port = taken.getsockname()[1]
    real_free_port = cluster_module.free_port
    picks = iter([real_free_port(), taken_port])  # the first child's gRPC, then metrics port
    monkeypatch.setattr(cluster_module, "free_port", lambda: next(picks, None) or real_free_port())
    cluster = LocalCluster(
        tmp_path, brokers=0, controllers=1, coordinators=0, unsafe_etcd_no_fsync=True
    )
    try:
        cluster.start()
        address = cluster.metrics_address("controller", 0)
        assert address != f"127.0.0.1:{taken_port}"
        assert _scrape(address)["fjord_controller_active"] == 1.0
        assert "Address already in use" in (tmp_path / "logs" / "controller-0.log").read_text()
    finally:
        cluster.stop()
        taken.close()


@pytest.mark.parametrize("streams", [True, False], ids=["streams", "unary"])
def test_produce_and_fetch_go_on_streams_unless_the_client_turns_them_off(
    cluster: LocalCluster,
    no_global_instrumentation: None,
    monkeypatch: pytest.MonkeyPatch,
    streams: bool,
) -> None:
    """Bare clients send Produce and Fetch on the broker's ProduceStream/FetchStream
    (fjord.rpc_streams); FJORD_CLIENT_RPC_STREAMS=0 in the client's process sends them as
    unary calls. Either way every record arrives exactly once, and the broker counts each
    request under Produce/Fetch; the streams themselves count as one call each when the
    clients close them."""
    if streams:
        monkeypatch.delenv(RPC_STREAMS_ENV, raising=False)
    else:
        monkeypatch.setenv(RPC_STREAMS_ENV, "0")
    # The gRPC path under test: not through the brokers' direct doors (their own test:
    # tests/integration/test_direct_door_clients.py).
    monkeypatch.setenv(DIRECT_DOOR_ENV, "0")
    broker_address = cluster.metrics_address("broker", 0)
    methods = (PRODUCE, FETCH, PRODUCE_STREAM, FETCH_STREAM)

    def calls() -> dict[str, float]:
        """The broker's calls of each method, whatever their code (a client ends its streams
        by cancelling them)."""
        return {
            m: metric_value(broker_address, "fjord_rpc_server_requests_total", method=m)
            for m in methods
        }

    topic = _create_topic(cluster, partitions=2)
    before = calls()
    sent = [f"record-{i}".encode() for i in range(RECORDS)]
    with Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"}) as producer:
        assert producer._network.rpc_streams is streams
        for i, value in enumerate(sent):
            producer.send(topic, value, partition=i % 2)
        producer.flush(TIMEOUT_S)
        assert bool(producer._network._streams) is streams
        assert not producer._network._unary_only  # no fallback: the broker serves streams
        if streams:  # this producer's stream, open until it closes
            assert metric_value(
                broker_address, "fjord_broker_open_streams", method=PRODUCE_STREAM
            ) >= 1
    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "auto.offset.reset": "earliest"}
    )
    partitions = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    try:
        assert consumer._network.rpc_streams is streams
        consumer.assign(partitions)
        got: list[Any] = []
        wait_for(
            lambda: got.extend(consumer.poll(0.2)) or len(got) >= RECORDS, "records", TIMEOUT_S
        )
        assert bool(consumer._network._streams) is streams
        ends = consumer.end_offsets(partitions, TIMEOUT_S)
    finally:
        consumer.close()
    assert sorted(r.value for r in got) == sorted(sent)  # each once: none lost, none twice
    assert sum(ends.values()) == RECORDS  # and each appended once

    def counts() -> dict[str, float]:
        now = calls()
        return {m: now[m] - before[m] for m in methods}

    if streams:
        # Each client's stream is one call, counted when the client closes it.
        moved = wait_for(
            lambda: (c := counts())[PRODUCE_STREAM] >= 1 and c[FETCH_STREAM] >= 1 and c,
            "the broker to count the closed ProduceStream and FetchStream", TIMEOUT_S,
        )
    else:
        moved = counts()
        assert moved[PRODUCE_STREAM] == moved[FETCH_STREAM] == 0, moved
    assert moved[PRODUCE] >= 1 and moved[FETCH] >= 1, moved
