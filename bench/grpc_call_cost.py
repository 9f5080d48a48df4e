"""CPU per gRPC exchange: a unary call against one message each way on an open bidirectional
stream (grpc.aio, loopback; issue 18, what a replication Fetch costs beside its bytes).

A server process answers every request with ``--answer-bytes`` bytes, both as a unary method
and on a stream-stream method; the client (this process) sends ``--exchanges`` requests one at
a time each way, alternating the two kinds ``--rounds`` times. Per exchange it prints the
client's CPU (``time.process_time``) and the server's (user + system from ``/proc``). No
protobuf, no interceptors: bytes in, bytes out, so the figures are gRPC's own cost of a call
against a message on a stream (a replica fetcher on a stream would pay the second). With
``--fjord-interceptor`` the server runs the brokers' interceptor
(``fjord.observability.interceptors.server_interceptors``: a span and the RPC metrics per
call; the global tracer provider, a no-op unless tracing is set up, as in a broker).

Run::

    .venv/bin/python bench/grpc_call_cost.py [--exchanges 3000] [--rounds 2]
        [--answer-bytes 16384] [--fjord-interceptor]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time
from multiprocessing.queues import Queue

import grpc
from grpc import aio

from fjord.observability.interceptors import server_interceptors

SERVICE = "bench.CallCost"


def _same(data: bytes) -> bytes:
    return data


async def _serve(answer_bytes: int, ports: Queue[int], fjord_interceptor: bool) -> None:
    answer = b"x" * answer_bytes
    server = aio.server(
        interceptors=server_interceptors("bench") if fjord_interceptor else None
    )

    async def unary(_request: bytes, _context: aio.ServicerContext) -> bytes:
        return answer

    async def stream(requests: object, _context: aio.ServicerContext) -> object:
        async for _request in requests:  # type: ignore[attr-defined]
            yield answer

    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, _same, _same),
        "Stream": grpc.stream_stream_rpc_method_handler(stream, _same, _same),
    }),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ports.put(port)
    await server.wait_for_termination()


def _server_main(answer_bytes: int, ports: Queue[int], fjord_interceptor: bool) -> None:
    asyncio.run(_serve(answer_bytes, ports, fjord_interceptor))


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(port: int, server_pid: int, exchanges: int, rounds: int) -> None:
    channel = aio.insecure_channel(f"127.0.0.1:{port}")
    unary = channel.unary_unary(
        f"/{SERVICE}/Unary", request_serializer=_same, response_deserializer=_same
    )
    stream = channel.stream_stream(
        f"/{SERVICE}/Stream", request_serializer=_same, response_deserializer=_same
    )
    for _ in range(200):  # the channel connected, both sides warm
        await unary(b"q")
    for _ in range(rounds):
        for kind in ("unary call", "stream message"):
            client_before, server_before = time.process_time(), _cpu_seconds(server_pid)
            if kind == "unary call":
                for _ in range(exchanges):
                    await unary(b"q")
            else:
                call = stream()
                for _ in range(exchanges):
                    await call.write(b"q")
                    await call.read()
                await call.done_writing()
            client = (time.process_time() - client_before) / exchanges * 1e6
            server = (_cpu_seconds(server_pid) - server_before) / exchanges * 1e6
            print(f"{kind}: client {client:.0f} us, server {server:.0f} us of CPU per exchange; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    await channel.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exchanges", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--answer-bytes", type=int, default=16384)
    parser.add_argument("--fjord-interceptor", action="store_true",
                        help="the server runs the brokers' interceptor (span, metrics)")
    args = parser.parse_args()
    ports: Queue[int] = multiprocessing.Queue()
    server = multiprocessing.Process(
        target=_server_main, args=(args.answer_bytes, ports, args.fjord_interceptor), daemon=True
    )
    server.start()
    try:
        port = ports.get(timeout=30)
        assert server.pid is not None
        asyncio.run(_measure(port, server.pid, args.exchanges, args.rounds))
    finally:
        server.terminate()
        server.join(10)


if __name__ == "__main__":
    main()
