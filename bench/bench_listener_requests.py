"""The Kafka listener's per-request cost on a real broker: broker CPU per Fetch and per Produce
as librdkafka sends them, this checkout against another (``--compare``) in the same run.

One one-broker LocalCluster per tree (``--compare PATH``: the services/ of another checkout, e.g.
a worktree of main as the baseline), each with a one-partition topic holding ``--records`` values
of 100 bytes. A client process (plain sockets, no Kafka client library: its own cost stays out of
the broker's) sends, one at a time and waiting for each answer:

- ``--requests`` Fetch v12 requests shaped as librdkafka 2.x sends them (no fetch session:
  ``session_epoch`` -1, one topic, one partition, ``max_wait_ms`` 100), each for offset 0 with
  ``partition_max_bytes`` ``--fetch-bytes`` (default 16 KiB: one batch, so the figure is the
  request handling, not the bytes);
- ``--requests`` Produce v10 requests (librdkafka's version against this listener), acks=1, each
  one RecordBatch of ``--batch-records`` (100) records of 100 bytes built once by kafka-python
  (no producer id, so resending the same bytes appends them again; 10,000 records make a
  ~1 MB batch, librdkafka's largest at its defaults: the per-MB cost of the append path).

The figure is the broker process's user + system CPU per request (``/proc/<pid>/stat``, 10 ms
ticks, over thousands of requests) and the requests per second the client saw; rounds alternate
the trees so both see the same load, and the load average is printed with every figure.

Run::

    .venv/bin/python bench/bench_listener_requests.py [--compare /path/to/other/services]
        [--rounds 3] [--requests 3000]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_servers import fjord_broker
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.producer.produce import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from fjord.client import AdminClient, NewTopic, Producer
from fjord.local.cluster import LocalCluster

WAIT_S = 120.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
FETCH_VERSION = 12
PRODUCE_VERSION = 10
TOPIC = "bench-listener-requests"

CLIENT = r"""
import socket, struct, sys, time
host, port = sys.argv[1].rsplit(":", 1)
frame, count = sys.stdin.buffer.read(), int(sys.argv[2])
sock = socket.create_connection((host, int(port)))
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buffer = bytearray(64 << 20)
view = memoryview(buffer)
start = time.perf_counter()
for _ in range(count):
    sock.sendall(frame)
    got, need = 0, None
    while need is None or got < need:
        n = sock.recv_into(view[got:])
        if not n:
            raise SystemExit("the broker closed the connection")
        got += n
        if need is None and got >= 4:
            need = 4 + struct.unpack(">i", buffer[:4])[0]
print(count / (time.perf_counter() - start))
"""


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS


def fetch_frame(fetch_bytes: int) -> bytes:
    cls = FetchRequest[FETCH_VERSION]
    request = cls(
        replica_id=-1, max_wait_ms=100, min_bytes=1, max_bytes=52428800, isolation_level=0,
        session_id=0, session_epoch=-1, topics=[cls.FetchTopic(topic=TOPIC, partitions=[
            cls.FetchTopic.FetchPartition(partition=0, fetch_offset=0,
                                          partition_max_bytes=fetch_bytes,
                                          current_leader_epoch=-1, last_fetched_epoch=-1,
                                          log_start_offset=-1)])],
        forgotten_topics_data=[], rack_id="")
    request.with_header(correlation_id=1, client_id="rdkafka")
    return bytes(request.encode(version=FETCH_VERSION, header=True, framed=True))


def produce_frame(batch_records: int = 100) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=16 << 20)
    for i in range(batch_records):
        builder.append(timestamp=1_700_000_000_000 + i, key=None, value=b"v" * 100, headers=[])
    builder.close()
    records = bytes(builder.buffer())
    cls = ProduceRequest[PRODUCE_VERSION]
    request = cls(transactional_id=None, acks=1, timeout_ms=30000, topic_data=[
        cls.TopicProduceData(name=TOPIC, partition_data=[
            cls.TopicProduceData.PartitionProduceData(index=0, records=records)])])
    request.with_header(correlation_id=2, client_id="rdkafka")
    return bytes(request.encode(version=PRODUCE_VERSION, header=True, framed=True))


def seed(cluster: LocalCluster) -> None:
    """The topic the requests read and write, with 1,000 records to fetch."""
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(TOPIC, 1, 1)])
    with Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": 1}) as producer:
        for _ in range(1000):
            producer.send(TOPIC, b"v" * 100)
        producer.flush(WAIT_S)


def one_round(cluster: LocalCluster, frame: bytes, count: int) -> tuple[float, float, float]:
    """(broker user CPU us per request, its system CPU us per request, requests/s seen by the
    client)."""
    pid = next(p.pid for p in cluster.processes() if p.role == "broker")
    before = cpu_seconds(pid)
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, cluster.kafka_bootstrap_servers, str(count)],
        input=frame, check=True, capture_output=True, timeout=WAIT_S)
    user, system = cpu_seconds(pid)
    return ((user - before[0]) * 1e6 / count, (system - before[1]) * 1e6 / count,
            float(out.stdout.decode()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", help="services/ of another checkout (the baseline)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--fetch-bytes", type=int, default=16384)
    parser.add_argument("--batch-records", type=int, default=100,
                        help="records of 100 bytes in each Produce request's one batch")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent.parent / "services")
    trees = {"this checkout": here}
    if args.compare:
        trees = {"compare": args.compare, **trees}
    frames = {"Fetch v12": fetch_frame(args.fetch_bytes),
              "Produce v10": produce_frame(args.batch_records)}
    print(f"start {time.strftime('%H:%M:%S', time.gmtime())} UTC, load "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    #: (request, tree) -> [(user us, system us, requests/s, load)] per round
    figures: dict[tuple[str, str], list[tuple[float, float, float, float]]] = {}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-listener-requests-"))
        clusters = {name: stack.enter_context(fjord_broker(Path(tmp) / str(i), path))
                    for i, (name, path) in enumerate(trees.items())}
        for cluster in clusters.values():
            seed(cluster)
        for round_no in range(args.rounds):
            for what, frame in frames.items():
                for name, cluster in clusters.items():
                    user, system, rate = one_round(cluster, frame, args.requests)
                    load = os.getloadavg()[0]
                    figures.setdefault((what, name), []).append((user, system, rate, load))
                    print(f"round {round_no + 1} {what} {name}: broker {user:.0f} us user "
                          f"+ {system:.0f} us system CPU per request, {rate:,.0f} "
                          f"requests/s, load {load:.1f}", flush=True)
    print(f"end {time.strftime('%H:%M:%S', time.gmtime())} UTC, load "
          f"{os.getloadavg()[0]:.1f}")
    print("| request | tree | broker CPU us per request, user + system (median) "
          "| requests/s (median) | rounds, user + system us | loads |")
    print("|---|---|---:|---:|---|---|")
    for (what, name), rows in figures.items():
        print(f"| {what} | {name} | {statistics.median(r[0] + r[1] for r in rows):.0f} | "
              f"{statistics.median(r[2] for r in rows):,.0f} | "
              f"{', '.join(f'{r[0]:.0f} + {r[1]:.0f}' for r in rows)} | "
              f"{', '.join(f'{r[3]:.1f}' for r in rows)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
