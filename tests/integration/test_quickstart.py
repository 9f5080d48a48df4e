"""The quickstart scenario against a real local cluster, and the ``fjord quickstart`` command."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from fjord.demo import run_scenario

pytestmark = pytest.mark.integration

COMMAND_TIMEOUT_S = 240
FJORD = [sys.executable, "-c", "from fjord.cli.main import main; main()"]


def test_scenario_on_the_shared_cluster(bootstrap: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    orders, shipments = f"orders-{suffix}", f"shipments-{suffix}"
    report = run_scenario(
        bootstrap,
        records=300,
        orders_topic=orders,
        shipments_topic=shipments,
        partitions=6,
        replication_factor=1,
    )
    assert report.verification.ok, report.verification.describe()
    assert (report.verification.orders, report.verification.shipments) == (300, 300)
    written, shipped, read = report.stages
    assert written.records == shipped.records == read.records == 300
    # Keyed records spread over every partition, and each shipment sits in its order's number.
    assert set(written.per_partition) == set(range(6))
    assert read.per_partition == written.per_partition

    # A second run on the same topics verifies its own records only (as `make run` twice does).
    again = run_scenario(
        bootstrap, records=120, orders_topic=orders, shipments_topic=shipments,
        partitions=6, replication_factor=1,
    )  # fmt: skip
    assert again.verification.ok, again.verification.describe()
    assert again.verification.shipments == 120


def test_quickstart_command_runs_and_stops(tmp_path: Path) -> None:
    data_dir = tmp_path / "quickstart"
    done = subprocess.run(
        [*FJORD, "quickstart", "--data-dir", str(data_dir),
         "--records", "400", "--no-wait"],
        capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "verification OK: every one of 400 orders got exactly one shipment" in out
    assert [line.split() for line in out.splitlines() if line.startswith("total")] == [
        ["total", "400", "400"]
    ]
    for stage in ("order service", "shipping service", "verify"):
        assert stage in out
    assert "stopped." in out
    state: dict[str, Any] = json.loads((data_dir / "cluster.json").read_text())
    status = subprocess.run(
        [*FJORD, "local", "status", "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "stopped" in status.stdout, (state, status.stdout, status.stderr)


def test_scenario_traces_each_order_through_its_shipment(bootstrap: str) -> None:
    """The traceparent record header links each shipping span to the order span it came from."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    suffix = uuid.uuid4().hex[:8]
    report = run_scenario(
        bootstrap, records=25, orders_topic=f"orders-{suffix}",
        shipments_topic=f"shipments-{suffix}", partitions=3, replication_factor=1,
        tracer=provider.get_tracer("test"),
    )  # fmt: skip
    assert report.verification.ok, report.verification.describe()
    spans = exporter.get_finished_spans()
    sends = {s.context.span_id: s for s in spans if s.name == "order-service send"}
    processes = [s for s in spans if s.name == "shipping-service process"]
    assert len(sends) == len(processes) == 25
    for span in processes:
        assert span.kind == SpanKind.CONSUMER
        assert span.parent is not None and span.parent.is_remote
        parent = sends[span.parent.span_id]
        assert parent.context.trace_id == span.context.trace_id
    assert len({s.context.trace_id for s in processes}) == 25  # one trace per order
