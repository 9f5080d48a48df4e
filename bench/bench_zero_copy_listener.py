"""The Kafka listener alone, per Fetch: CPU of answering with records sent by ``sendfile``
against records encoded into the frame, without a broker behind it.

A KafkaListener in this process whose Fetch handler answers every request with the same
``--region`` bytes of a file, as a file region (zero copy: ``sendfile``) or as bytes already in
memory (the copy path without the broker's own copies: no pread, no protobuf). A client in
another process sends ``--fetches`` Fetch v12 requests one at a time over loopback and reads
each answer whole into a buffer (the way a consumer does, without decoding). The figure is
this process's user and system CPU per Fetch (getrusage; the client's, start included, beside
it): the
listener's per-request cost (decode, handler, encode, asyncio) with a 100-byte region, and
what the records' bytes add, sent by sendfile or written. ``--cork-ab`` instead alternates
sendfile answers written corked (the listener's way, TCP_CORK while the pieces go in) and
uncorked (the cork replaced by a no-op in this process).

Run::

    .venv/bin/python bench/bench_zero_copy_listener.py [--rounds 3] [--region 1048576] [--cork-ab]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse

from fjord.kafka import server
from fjord.kafka.dispatch import Api, KafkaDispatcher, RequestContext
from fjord.kafka.server import KafkaListener
from fjord.kafka.zerocopy import FileBackedResponse
from fjord.storage.region import FileRegion

VERSION = 12
CLIENT = r"""
import socket, struct, sys
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
frame, fetches = bytes.fromhex(sys.argv[2]), int(sys.argv[3])
buffer = bytearray(64 << 20)
for _ in range(fetches):
    sock.sendall(frame)
    got, need = 0, None
    while need is None or got < need:
        n = sock.recv_into(memoryview(buffer)[got:])
        if not n:
            raise SystemExit("the listener closed the connection")
        got += n
        if need is None and got >= 4:
            need = 4 + struct.unpack(">i", buffer[:4])[0]
"""


def fetch_request_frame() -> bytes:
    cls = FetchRequest[VERSION]
    request = cls(
        replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=64 << 20, isolation_level=0,
        session_id=0, session_epoch=-1, topics=[cls.FetchTopic(topic="t", partitions=[
            cls.FetchTopic.FetchPartition(partition=0, fetch_offset=0,
                                          partition_max_bytes=64 << 20, current_leader_epoch=-1,
                                          last_fetched_epoch=-1, log_start_offset=-1)])],
        forgotten_topics_data=[], rack_id="")
    request.with_header(correlation_id=1, client_id="bench")
    return bytes(request.encode(version=VERSION, header=True, framed=True))


def fetch_response(records: bytes) -> Any:
    cls = FetchResponse[VERSION]
    topic_cls = cls.FetchableTopicResponse
    part_cls = topic_cls.PartitionData
    return cls(throttle_time_ms=0, error_code=0, session_id=0, responses=[
        topic_cls(topic="t", partitions=[part_cls(
            partition_index=0, error_code=0, high_watermark=10, last_stable_offset=10,
            log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1,
            current_leader=part_cls.LeaderIdAndEpoch(leader_id=1, leader_epoch=0),
            records=records)])])


async def one_round(
    path: Path, size: int, zero_copy: bool, fetches: int
) -> tuple[float, float, float]:
    """(user, system) CPU microseconds of this process per Fetch, and the client's (user +
    system) per Fetch."""
    data = path.read_bytes()
    fd = os.open(path, os.O_RDONLY)

    async def handler(request: Any, ctx: RequestContext) -> Any:
        if not ctx.zero_copy:
            return fetch_response(data)
        answer = FileBackedResponse(None)
        answer.response = fetch_response(answer.add(FileRegion(os.dup(fd), 0, size)))
        return answer

    listener = KafkaListener(KafkaDispatcher([Api(1, 4, 12, FetchRequest, handler)]),
                             "127.0.0.1", 0, name="bench", zero_copy=zero_copy)
    port = await listener.start()
    try:
        before = resource.getrusage(resource.RUSAGE_SELF)
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT, str(port), fetch_request_frame().hex(), str(fetches))
        if await client.wait() != 0:
            raise RuntimeError("the client failed")
        after = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        await listener.stop()
        os.close(fd)
    client_s = (children.ru_utime - children_before.ru_utime
                + children.ru_stime - children_before.ru_stime)
    return ((after.ru_utime - before.ru_utime) * 1e6 / fetches,
            (after.ru_stime - before.ru_stime) * 1e6 / fetches, client_s * 1e6 / fetches)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--region", type=int, default=1 << 20)
    parser.add_argument("--fetches", type=int, default=1000)
    parser.add_argument("--cork-ab", action="store_true",
                        help="sendfile answers corked against uncorked")
    args = parser.parse_args()
    corked = server._Pipeline._cork_socket
    print(f"start {time.strftime('%H:%M:%S', time.gmtime())} UTC, load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="fjord-bench-zcl-") as tmp:
        cases = []
        for size in (100, args.region):
            path = Path(tmp) / f"records-{size}"
            path.write_bytes(os.urandom(size))
            if args.cork_ab:
                cases += [(path, size, "sendfile corked"), (path, size, "sendfile uncorked")]
            else:
                cases += [(path, size, "sendfile"), (path, size, "copy")]
        for round_no in range(args.rounds):
            for path, size, label in cases:
                server._Pipeline._cork_socket = (  # type: ignore[method-assign]
                    corked if label != "sendfile uncorked" else lambda _: None)
                user, system, client = asyncio.run(
                    one_round(path, size, label != "copy", args.fetches))
                print(f"round {round_no + 1}, {size:,} bytes, {label}: user {user:.0f} us + "
                      f"system {system:.0f} us = {user + system:.0f} us per Fetch (client "
                      f"{client:.0f} us, with its start), load {os.getloadavg()[0]:.1f}",
                      flush=True)
    print(f"end {time.strftime('%H:%M:%S', time.gmtime())} UTC, load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
