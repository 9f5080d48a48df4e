"""The floor under Fjord's end-to-end steps: one-way latencies of a bare grpc.aio unary call.

A server process with one generic handler (bytes in, the handler's ``perf_counter_ns`` plus the
bytes out) and a client on an asyncio loop in its own thread (as a Fjord client's I/O thread),
sending ``--size``-byte requests one at a time with ``--gap-ms`` between them (5 ms: a batch of
the 10,000 records/s latency run; 0: back to back). No Fjord code on either side: what is left
of ``latency_breakdown.py --broker-stages``' **to broker** and **to consumer** steps once this
is subtracted is Fjord's own. ``CLOCK_MONOTONIC`` is shared by the two processes.

Printed, in ms: client -> handler entered (the request's way in) and handler entered ->
answer back on the client's loop, p50 and p99, and the load.

Run::

    .venv/bin/python bench/grpc_floor.py [--calls 1000] [--gap-ms 5] [--size 6000] \
        [--sync-server] [--second-loop] [--stream | --raw]

``--sync-server`` serves with grpc's thread-pool server instead of grpc.aio's;
``--second-loop`` binds a second, idle client loop in the client's process first (a
Producer and a Consumer in one process: grpc.aio wakes every bound loop at every event).
``--stream`` sends the requests as messages on one open bidirectional stream (what Fjord's
clients do with ProduceStream/FetchStream, fjord.rpc_streams) instead of unary calls;
``--raw`` on a plain asyncio TCP connection with a 4-byte length prefix (no gRPC on either
side: the floor of the machine's loops and sockets).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent import futures
from pathlib import Path

import grpc

METHOD = "/floor.Floor/Echo"
STREAM_METHOD = "/floor.Floor/Stream"


def _same(data: bytes) -> bytes:
    return data


def _stamped(request: bytes) -> bytes:
    return time.perf_counter_ns().to_bytes(8, "little") + request


def _handler() -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler("floor.Floor", {
        "Echo": grpc.unary_unary_rpc_method_handler(_aio_echo, _same, _same),
        "Stream": grpc.stream_stream_rpc_method_handler(_aio_stream, _same, _same),
    })


async def _aio_stream(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
) -> AsyncIterator[bytes]:
    async for request in requests:
        yield _stamped(request)


async def _raw_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
        while True:
            size = int.from_bytes(await reader.readexactly(4), "big")
            answer = _stamped(await reader.readexactly(size))
            writer.write(len(answer).to_bytes(4, "big") + answer)


async def _aio_echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return _stamped(request)


def _sync_echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    return _stamped(request)


def serve(port_file: Path, sync: bool) -> None:
    if sync:
        server = grpc.server(futures.ThreadPoolExecutor(4))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "floor.Floor", {"Echo": grpc.unary_unary_rpc_method_handler(
                _sync_echo, _same, _same)}),))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        port_file.write_text(str(port))
        server.wait_for_termination()
        return

    async def run() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_handler(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        raw = await asyncio.start_server(_raw_echo, "127.0.0.1", 0)
        port_file.write_text(f"{port} {raw.sockets[0].getsockname()[1]}")
        await server.wait_for_termination()

    asyncio.run(run())


def _loop_thread() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return loop


def percentile(data: list[float], q: float) -> float:
    data = sorted(data)
    return data[min(len(data) - 1, int(q * len(data)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--gap-ms", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=6000, help="request bytes (~60 records)")
    parser.add_argument("--sync-server", action="store_true")
    parser.add_argument("--second-loop", action="store_true")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--stream", action="store_true")
    kind.add_argument("--raw", action="store_true")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve), args.sync_server)
        return
    with tempfile.TemporaryDirectory(prefix="grpc-floor-") as tmp:
        port_file = Path(tmp) / "port"
        command = [sys.executable, __file__, "--serve", str(port_file)]
        if args.sync_server and (args.stream or args.raw):
            raise SystemExit("--sync-server serves unary calls only")
        server = subprocess.Popen(command + (["--sync-server"] if args.sync_server else []))
        try:
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text()):
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start")
                time.sleep(0.05)
            grpc_port, _, raw_port = port_file.read_text().partition(" ")
            target = f"127.0.0.1:{grpc_port}"
            payload = b"x" * args.size

            async def calls(count: int, gap_s: float) -> tuple[list[float], list[float]]:
                channel = grpc.aio.insecure_channel(target)
                echo: Callable[..., Awaitable[bytes]]
                if args.raw:
                    reader, writer = await asyncio.open_connection("127.0.0.1", int(raw_port))

                    async def echo(request: bytes, timeout: float) -> bytes:
                        writer.write(len(request).to_bytes(4, "big") + request)
                        size = int.from_bytes(await reader.readexactly(4), "big")
                        return await reader.readexactly(size)
                elif args.stream:
                    stream = channel.stream_stream(
                        STREAM_METHOD, request_serializer=_same, response_deserializer=_same
                    )()

                    async def echo(request: bytes, timeout: float) -> bytes:
                        await stream.write(request)
                        answer = await stream.read()
                        assert isinstance(answer, bytes)
                        return answer
                else:
                    echo = channel.unary_unary(
                        METHOD, request_serializer=_same, response_deserializer=_same
                    )
                await echo(payload, timeout=30)  # connected
                way_in: list[float] = []
                way_back: list[float] = []
                for _ in range(count):
                    sent = time.perf_counter_ns()
                    answer = await echo(payload, timeout=30)
                    back = time.perf_counter_ns()
                    entered = int.from_bytes(answer[:8], "little")
                    way_in.append((entered - sent) / 1e6)
                    way_back.append((back - entered) / 1e6)
                    if gap_s:
                        await asyncio.sleep(gap_s)
                await channel.close()
                return way_in, way_back

            if args.second_loop:
                other = _loop_thread()
                asyncio.run_coroutine_threadsafe(calls(1, 0), other).result(60)
            loop = _loop_thread()
            way_in, way_back = asyncio.run_coroutine_threadsafe(
                calls(args.calls, args.gap_ms / 1000), loop
            ).result()
        finally:
            server.terminate()
            server.wait(10)
    print(f"client -> handler p50 {percentile(way_in, 0.5):.3f} p99 "
          f"{percentile(way_in, 0.99):.3f}; handler -> client p50 "
          f"{percentile(way_back, 0.5):.3f} p99 {percentile(way_back, 0.99):.3f} ms "
          f"(gap {args.gap_ms} ms, "
          f"{'raw TCP' if args.raw else 'stream' if args.stream else 'unary'}, "
          f"{'sync' if args.sync_server else 'aio'} server"
          f"{', second client loop' if args.second_loop else ''}); "
          f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
