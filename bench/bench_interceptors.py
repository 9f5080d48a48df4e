"""Per-call cost of fjord.observability's gRPC interceptors on a loopback unary call.

Four configurations of the same server and client (a Broker.Metadata that answers at once):
``bare`` (no interceptors), ``pass-through`` (a server and a client interceptor that only call
the continuation: the cost of grpc.aio's interceptor machinery itself), ``metrics`` (Fjord's
interceptors, no tracer provider: what a service runs with when ``OTEL_TRACES_EXPORTER`` is
unset), ``traced`` (Fjord's interceptors and an SDK provider that records every span in
memory). Sequential calls; client and server share one process, so the
CPU time per call (what the interceptors add to it is their cost) is reported next to the
wall-clock time, which on a shared 2-core machine moves with everyone else's load.

    .venv/bin/python bench/bench_interceptors.py [--calls N] [--rounds R] [--write-results]

``--write-results`` rewrites the "observability interceptors" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from grpc import aio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.observability import client_interceptors, server_interceptors

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_section


class _PassThroughServer(aio.ServerInterceptor):
    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        return await continuation(details)


class _PassThroughClient(aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(details, request)


class _Echo(broker_pb2_grpc.BrokerServicer):
    async def Metadata(self, request: Any, context: Any) -> Any:
        return broker_pb2.MetadataResponse(cluster_id="bench")


async def _measure(mode: str, calls: int) -> tuple[float, float]:
    """Mean (wall, CPU) microseconds per sequential call in ``mode``."""
    provider: TracerProvider | None = None
    exporter = InMemorySpanExporter()
    if mode == "traced":
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    server_side: list[Any] | None = None
    client_side: list[Any] | None = None
    if mode == "pass-through":
        server_side, client_side = [_PassThroughServer()], [_PassThroughClient()]
    elif mode != "bare":
        server_side = server_interceptors("bench", provider)
        client_side = client_interceptors("bench", provider)
    server = aio.server(interceptors=server_side)
    broker_pb2_grpc.add_BrokerServicer_to_server(_Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = aio.insecure_channel(f"127.0.0.1:{port}", interceptors=client_side)
    stub = broker_pb2_grpc.BrokerStub(channel)
    request = broker_pb2.MetadataRequest()
    try:
        for _ in range(200):  # warm up the connection and the code paths
            await stub.Metadata(request, timeout=10)
        exporter.clear()
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            await stub.Metadata(request, timeout=10)
        elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
    finally:
        await channel.close()
        await server.stop(grace=None)
    if mode == "traced":
        assert len(exporter.get_finished_spans()) == 2 * calls
    return elapsed / calls * 1e6, elapsed_cpu / calls * 1e6


def run(calls: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Median over ``rounds`` of the mean per-call (wall, CPU) microseconds of each mode."""
    samples: dict[str, list[tuple[float, float]]] = {
        "bare": [],
        "pass-through": [],
        "metrics": [],
        "traced": [],
    }
    for _ in range(rounds):
        for mode in samples:  # interleaved, so background load hits every mode alike
            samples[mode].append(asyncio.run(_measure(mode, calls)))
    return {
        mode: (
            statistics.median(wall for wall, _ in values),
            statistics.median(cpu for _, cpu in values),
        )
        for mode, values in samples.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per round and mode")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    result = run(args.calls, args.rounds)
    _bare_wall, bare_cpu = result["bare"]
    rows = [
        "| mode | wall us/call | CPU us/call | CPU overhead us/call |",
        "|---|---:|---:|---:|",
    ]
    for mode, (wall, cpu) in result.items():
        rows.append(f"| {mode} | {wall:.1f} | {cpu:.1f} | {cpu - bare_cpu:.1f} |")
    text_table = "\n".join(rows)
    print(f"interceptor overhead, {args.calls} sequential unary calls x {args.rounds} rounds")
    print(text_table)
    if args.write_results:
        today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        write_section(
            "## observability interceptors",
            f"Command: `.venv/bin/python bench/bench_interceptors.py --calls {args.calls} "
            f"--rounds {args.rounds}`, {today}; machine: {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}, shared with other work. Median of the rounds; "
            "modes and method: the script's docstring.\n\n" + text_table,
        )


if __name__ == "__main__":
    main()
