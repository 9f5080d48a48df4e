"""A broker's direct door against its gRPC stream: round trip and broker CPU per request.

One broker (a ``LocalCluster`` with one controller and no coordinator, so the broker opens its
direct door, docs/direct-door.md) and one topic with one partition, replication factor 1. The
client sends Produce requests (``--records`` records of 100 bytes in one batch, acks=1) one
at a time, then Fetch requests for them (max_wait_ms 0) one at a time, on one of two
transports, alternating rounds in the same minutes:

- ``grpc``: the Broker service's ProduceStream/FetchStream through ``fjord.rpc_streams.
  OrderedStream`` (what Fjord's clients use on gRPC);
- ``direct``: the broker's direct door through ``fjord.direct_client.DirectConnection``.

Printed per transport and kind: round trip p50 and p99 (ms) and the broker process's CPU
(user + system, /proc) per request in us, with the load average. The client runs in this
process on one asyncio loop; the broker in its own.

Run::

    .venv/bin/python bench/bench_direct_door.py [--requests 2000] [--rounds 3] [--records 50] \
        [--only grpc|direct]

``--only`` runs one transport (to profile the broker under it, e.g. with py-spy).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from grpc import aio

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.client import AdminClient, NewTopic
from fjord.direct_client import DirectConnection
from fjord.direct_frames import HELLO_FETCH, HELLO_PRODUCE
from fjord.local.cluster import LocalCluster
from fjord.records import BatchBuilder
from fjord.rpc_streams import OrderedStream

TIMEOUT_S = 30.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def produce_request(topic: str, records: int) -> broker_pb2.ProduceRequest:
    builder = BatchBuilder(batch_size=1 << 30)
    now = int(time.time() * 1000)
    for _ in range(records):
        builder.append(now, None, b"v" * 100)
    request = broker_pb2.ProduceRequest(acks=1, timeout_ms=10_000)
    request.topics.add(name=topic).partitions.add(partition=0, records=builder.build())
    return request


def fetch_request(topic: str, offset: int, max_bytes: int) -> broker_pb2.FetchRequest:
    request = broker_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=1,
                                      max_bytes=max_bytes)
    request.topics.add(name=topic).partitions.add(
        partition=0, fetch_offset=offset, partition_max_bytes=max_bytes, current_leader_epoch=-1)
    return request


async def timed(call: Callable[[Any], Awaitable[Any]], requests: list[Any], pid: int
                ) -> tuple[list[float], float]:
    """Round trips (s) of ``requests`` sent one at a time, and the broker's CPU (s) meanwhile."""
    times: list[float] = []
    cpu = cpu_seconds(pid)
    for request in requests:
        start = time.perf_counter()
        await call(request)
        times.append(time.perf_counter() - start)
    return times, cpu_seconds(pid) - cpu


async def run(cluster: LocalCluster, topic: str, args: argparse.Namespace) -> None:
    pid = cluster.process("broker", 0).pid
    grpc_address = cluster.address("broker", 0)
    host, _, port = cluster.direct_address(0).rpartition(":")
    channel = aio.insecure_channel(grpc_address)
    stub = broker_pb2_grpc.BrokerStub(channel)
    transports: dict[str, tuple[Any, Any]] = {
        "grpc": (OrderedStream(stub.ProduceStream, grpc_address, "ProduceStream"),
                 OrderedStream(stub.FetchStream, grpc_address, "FetchStream")),
        "direct": (DirectConnection(host, int(port), HELLO_PRODUCE,
                                    broker_pb2.ProduceResponse.FromString, name="bench produce"),
                   DirectConnection(host, int(port), HELLO_FETCH,
                                    broker_pb2.FetchResponse.FromString, name="bench fetch")),
    }
    produce = produce_request(topic, args.records)
    deadline = time.monotonic() + TIMEOUT_S  # a new leader answers NOT_LEADER a moment
    while (await transports["grpc"][0].call(produce, TIMEOUT_S)).topics[0].partitions[0] \
            .error.code:
        if time.monotonic() > deadline:
            raise SystemExit(f"broker 0 does not serve {topic}")
        await asyncio.sleep(0.1)
    batch_bytes = len(produce.topics[0].partitions[0].records)
    results: dict[tuple[str, str], tuple[list[float], float, int]] = {}
    for _ in range(args.rounds):
        for name, (producer, fetcher) in transports.items():
            if args.only not in (None, name):
                continue
            await producer.call(produce, TIMEOUT_S)  # open the connection / stream
            first = (await producer.call(produce, TIMEOUT_S)).topics[0].partitions[0].base_offset
            times, cpu = await timed(lambda r, p=producer: p.call(r, TIMEOUT_S),
                                     [produce] * args.requests, pid)
            kept = results.get((name, "produce"), ([], 0.0, 0))
            results[(name, "produce")] = (kept[0] + times, kept[1] + cpu, kept[2] + len(times))
            fetches = [fetch_request(topic, first + i * args.records, batch_bytes)
                       for i in range(args.requests)]
            await fetcher.call(fetches[0], TIMEOUT_S)
            times, cpu = await timed(lambda r, f=fetcher: f.call(r, TIMEOUT_S), fetches, pid)
            kept = results.get((name, "fetch"), ([], 0.0, 0))
            results[(name, "fetch")] = (kept[0] + times, kept[1] + cpu, kept[2] + len(times))
    for producer, fetcher in transports.values():
        producer.close()
        fetcher.close()
    await channel.close()
    print(f"{args.requests} requests x {args.rounds} rounds per transport and kind, "
          f"{args.records} records of 100 bytes per batch ({batch_bytes} bytes); "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"{'transport':<10}{'kind':<9}{'p50 ms':>9}{'p99 ms':>9}{'broker CPU us/req':>20}")
    for (name, kind), (times, cpu, count) in sorted(results.items()):
        times.sort()
        p50 = statistics.median(times) * 1000
        p99 = times[int(len(times) * 0.99)] * 1000
        print(f"{name:<10}{kind:<9}{p50:>9.3f}{p99:>9.3f}{cpu / count * 1e6:>20.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=50)
    parser.add_argument("--only", choices=("grpc", "direct"), default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fjord-direct-bench-") as base:
        cluster = LocalCluster(Path(base), brokers=1, controllers=1, coordinators=0,
                               cluster_id=f"bench-{uuid.uuid4().hex[:8]}",
                               unsafe_etcd_no_fsync=True)
        cluster.start()
        try:
            topic = "direct-bench"
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
            try:
                admin.create_topics([NewTopic(topic, 1, 1)])
            finally:
                admin.close()
            asyncio.run(run(cluster, topic, args))
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
