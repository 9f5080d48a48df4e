"""End-to-end benchmark: Fjord against what a Python user would otherwise pick.

The same workload against these systems, each server started here on a free loopback port with
its data in a temporary directory:

- **Redis Streams, redis-py sync + hiredis** (``redis``, the fastest Python path, what a user
  tuning for speed runs): produce = ``XADD`` in a ``pipeline(transaction=False)`` of
  ``--pipeline`` commands per round trip; consume = ``XREADGROUP COUNT --xread-count`` with the
  previous batch's ``XACK`` pipelined in front of each read. Throughput only (no latency run).
  AOF with ``appendfsync everysec``. The Fjord targets are read against this one, so when
  ``fjord`` runs too its rounds run between Fjord's (fjord.client, confluent-kafka, Redis, next
  round), all three seeing the same load on a shared machine.
- **Redis Streams, redis-py asyncio** (``redis-asyncio``, kept for comparison with earlier runs;
  its reply parser is hiredis too when installed): the same commands, ``COUNT --batch``.
- **NATS JetStream** (nats-py): produce = ``publish_async`` for every record, then gather the
  acknowledgements; consume = a durable pull subscription, ``fetch(--batch)``, acknowledging
  the last message of each batch (``AckPolicy.ALL``). File storage.
- **Fjord** (fjord.client): a LocalCluster with one broker, a topic with 1 partition and
  replication factor 1; ``Producer`` with ``acks=1`` (other settings default), ``send()`` every
  record then ``flush()``; ``Consumer`` assigned to the partition from the beginning, ``poll()``.
- **confluent-kafka through Fjord's Kafka listener** (part of ``fjord``: the same broker, its own
  topic per round): ``produce()`` every record with delivery reports for failures only
  (``delivery.report.only.error``: the peer at its fastest) and ``poll(0)`` every 1,024
  records, then ``flush()``, ``acks=1``, librdkafka's default ``linger.ms``; consumer
  ``assign()`` from offset 0, ``consume(10000)`` (bench/bench_kafka.py's ``ck_produce`` and
  ``ck_consume``). Throughput only.

Every record carries a 100-byte value, no key. Throughput: ``--rounds`` rounds (default 3), each
moving ``--records`` records through a fresh stream/topic, the same value made once per round
for every peer (the time stamps are for the latency run; making one per record cost each loop
~0.3 us a record, and confluent-kafka's ``ck_produce`` never paid it); the table gives the
median round.
End-to-end latency: a producer paced at ``--rate`` records/s for ``--seconds`` and a consumer
in the same process, on its own thread and event loop (Fjord's clients each run an I/O thread;
the Redis and NATS consumers get one too, with their own connection); each value starts with the
send time (``perf_counter_ns``); latency is receive time minus send time, the first 10% dropped
as warm-up. Fjord's producer keeps its default ``linger.ms`` (5) unless ``--fjord-linger-ms``.
For Fjord the garbage collector's pauses in this process during the latency run are recorded
too (count and longest, per generation): the clients freeze the start-up objects out of the
cyclic collector (``fjord.runtime.freeze_startup_objects``); run with ``FJORD_GC_FREEZE=false``
in the environment to measure without that (it reaches the broker too).

Run::

    .venv/bin/python bench/bench_e2e.py [--records N] [--systems redis,redis-asyncio,nats,fjord]
        [--write-results]

``--write-results`` rewrites the "end to end" section of bench/RESULTS.md with the table, the
command, the machine and the targets met or missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import gc
import os
import platform
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kafka import ck_consume, ck_produce
from e2e_servers import nats_server, redis_server
from results_file import cpu_model, write_section

VALUE_SIZE = 100
STAMP = struct.Struct(">q")
PADDING = b"x" * (VALUE_SIZE - STAMP.size)
SECTION_START = "## end to end"
WARMUP_FRACTION = 0.1
TICK_S = 0.001  # the paced producer's clock: records due are sent every millisecond
OP_TIMEOUT_S = 60.0  # bound on any single phase waiting for records that do not come

# Targets from the benchmark issue 18 (Fjord vs the alternatives, as ratios in the same run).
TARGET_PRODUCE_X_REDIS = 4.0  # x pipelined XADD, redis-py sync + hiredis
TARGET_CONSUME_X_REDIS = 4.0  # x XREADGROUP, redis-py sync + hiredis
TARGET_X_CONFLUENT_KAFKA = 1.0  # x confluent-kafka into / out of the same broker
TARGET_E2E_P99_MS = 8.0
REDIS_SYNC = "Redis Streams, redis-py sync + hiredis (XADD pipelined / XREADGROUP)"
CK_OVER_LISTENER = "confluent-kafka over Fjord's Kafka listener (produce() / consumer)"


@dataclass
class Figures:
    system: str
    produce_runs: list[float] = field(default_factory=list)  # records/s of each round
    consume_runs: list[float] = field(default_factory=list)
    e2e_latencies_ms: list[float] = field(default_factory=list)
    e2e_sent: int = 0
    note: str = ""
    gc_pauses_ms: list[tuple[int, float]] = field(default_factory=list)  # (generation, ms)

    @property
    def produce_rps(self) -> float:
        return statistics.median(self.produce_runs) if self.produce_runs else 0.0

    @property
    def consume_rps(self) -> float:
        return statistics.median(self.consume_runs) if self.consume_runs else 0.0

    @property
    def produce_mbps(self) -> float:
        return self.produce_rps * VALUE_SIZE / 1e6

    @property
    def consume_mbps(self) -> float:
        return self.consume_rps * VALUE_SIZE / 1e6

    def percentile(self, q: float) -> float:
        data = sorted(self.e2e_latencies_ms)
        if not data:
            return float("nan")
        return data[min(len(data) - 1, int(q * len(data)))]


def stamped_value() -> bytes:
    return STAMP.pack(time.perf_counter_ns()) + PADDING


def latency_ms(value: bytes, received_ns: int) -> float:
    return (received_ns - STAMP.unpack_from(value)[0]) / 1e6


def keep_after_warmup(latencies: list[float]) -> list[float]:
    return latencies[int(len(latencies) * WARMUP_FRACTION) :]


async def paced_producer(rate: int, seconds: float, send_many: Callable[[int], object]) -> int:
    """Call ``send_many(k)`` (awaitable or not) each tick with the records now due."""
    total = int(rate * seconds)
    sent = 0
    start = time.perf_counter()
    while sent < total:
        due = min(total, int((time.perf_counter() - start) * rate) + 1)
        if due > sent:
            result = send_many(due - sent)
            if asyncio.iscoroutine(result):
                await result
            sent = due
        await asyncio.sleep(TICK_S)
    return sent


def in_thread(consume: Callable[[], Coroutine[Any, Any, None]]) -> threading.Thread:
    """Run a consumer coroutine on its own event loop in its own thread (as Fjord's clients
    each have an I/O thread), so the paced producer's loop does not delay its reads."""
    thread = threading.Thread(target=lambda: asyncio.run(consume()), name="e2e-consumer")
    thread.start()
    return thread


# --- Redis Streams --------------------------------------------------------------------------


class RedisSyncRounds:
    """Throughput rounds through redis-py's synchronous client with hiredis parsing the replies,
    against one redis-server kept up between rounds (so its rounds can be interleaved with
    Fjord's and both see the same load on a shared machine)."""

    def __init__(self, records: int, pipeline: int, count: int) -> None:
        from redis.utils import HIREDIS_AVAILABLE

        if not HIREDIS_AVAILABLE:
            raise RuntimeError("hiredis is not installed: not redis-py's fastest path")
        self.records, self.pipeline, self.count = records, pipeline, count
        self.figures = Figures(REDIS_SYNC)
        self.figures.note = f"pipeline {pipeline} XADD per round trip, XREADGROUP COUNT {count}"
        self._rounds = 0

    @contextlib.contextmanager
    def serving(self) -> Iterator[RedisSyncRounds]:
        import redis

        with redis_server() as port:
            self._client = redis.Redis(host="127.0.0.1", port=port)
            self._reader = redis.Redis(host="127.0.0.1", port=port)
            try:
                yield self
            finally:
                self._client.close()
                self._reader.close()

    def run_round(self) -> None:
        records, client, reader = self.records, self._client, self._reader
        stream = f"bench-sync-{self._rounds}"
        self._rounds += 1
        value = stamped_value()  # one value per throughput round, as for every peer
        start = time.perf_counter()
        for first in range(0, records, self.pipeline):
            pipe = client.pipeline(transaction=False)
            xadd = pipe.xadd
            for _ in range(min(self.pipeline, records - first)):
                xadd(stream, {"v": value})
            pipe.execute()
        self.figures.produce_runs.append(records / (time.perf_counter() - start))

        client.xgroup_create(stream, "g", id="0")
        received = 0
        pending_ack: list[bytes] = []
        start = time.perf_counter()
        while received < records:
            pipe = reader.pipeline(transaction=False)
            if pending_ack:
                pipe.xack(stream, "g", *pending_ack)
            pipe.xreadgroup("g", "c", {stream: ">"}, count=self.count)
            replies = pipe.execute()
            entries = replies[-1][0][1] if replies[-1] else []
            pending_ack = [entry_id for entry_id, _ in entries]
            received += len(entries)
        if pending_ack:
            reader.xack(stream, "g", *pending_ack)
        self.figures.consume_runs.append(records / (time.perf_counter() - start))


async def bench_redis(
    records: int, pipeline: int, batch: int, rate: int, seconds: float, rounds: int
) -> Figures:
    import redis.asyncio as redis

    figures = Figures("Redis Streams, redis-py asyncio (XADD pipelined / XREADGROUP)")
    with redis_server() as port:
        client = redis.Redis(host="127.0.0.1", port=port)
        reader = redis.Redis(host="127.0.0.1", port=port)
        try:
            for round_number in range(rounds):
                stream = f"bench-{round_number}"
                value = stamped_value()
                start = time.perf_counter()
                for first in range(0, records, pipeline):
                    pipe = client.pipeline(transaction=False)
                    for _ in range(min(pipeline, records - first)):
                        pipe.xadd(stream, {"v": value})
                    await pipe.execute()
                figures.produce_runs.append(records / (time.perf_counter() - start))

                await client.xgroup_create(stream, "g", id="0")
                received = 0
                pending_ack: list[bytes] = []
                start = time.perf_counter()
                while received < records:
                    pipe = reader.pipeline(transaction=False)
                    if pending_ack:
                        pipe.xack(stream, "g", *pending_ack)
                    pipe.xreadgroup("g", "c", {stream: ">"}, count=batch)
                    replies = await pipe.execute()
                    entries = replies[-1][0][1] if replies[-1] else []
                    pending_ack = [entry_id for entry_id, _ in entries]
                    received += len(entries)
                if pending_ack:
                    await reader.xack(stream, "g", *pending_ack)
                figures.consume_runs.append(records / (time.perf_counter() - start))

            e2e_stream = "e2e"
            await client.xgroup_create(e2e_stream, "g", id="$", mkstream=True)
            total = int(rate * seconds)
            latencies: list[float] = []

            async def consume() -> None:
                own = redis.Redis(host="127.0.0.1", port=port)
                got = 0
                deadline = time.monotonic() + seconds + OP_TIMEOUT_S
                try:
                    while got < total and time.monotonic() < deadline:
                        reply = await own.xreadgroup(
                            "g", "c", {e2e_stream: ">"}, count=batch, block=100, noack=True
                        )
                        now = time.perf_counter_ns()
                        for _, fields in reply[0][1] if reply else []:
                            latencies.append(latency_ms(fields[b"v"], now))
                            got += 1
                finally:
                    await own.aclose()

            async def send_many(count: int) -> None:
                pipe = client.pipeline(transaction=False)
                for _ in range(count):
                    pipe.xadd(e2e_stream, {"v": stamped_value()})
                await pipe.execute()

            consumer = in_thread(consume)
            figures.e2e_sent = await paced_producer(rate, seconds, send_many)
            await asyncio.to_thread(consumer.join, OP_TIMEOUT_S)
            figures.e2e_latencies_ms = keep_after_warmup(latencies)
        finally:
            await client.aclose()
            await reader.aclose()
    return figures


# --- NATS JetStream -------------------------------------------------------------------------


async def bench_nats(records: int, batch: int, rate: int, seconds: float, rounds: int) -> Figures:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    figures = Figures("NATS JetStream (publish_async / pull fetch)")
    with nats_server() as port:
        connection = await nats.connect(f"nats://127.0.0.1:{port}")
        try:
            js = connection.jetstream()
            config = ConsumerConfig(ack_policy=AckPolicy.ALL, max_ack_pending=-1)
            for round_number in range(rounds):
                subject = f"bench{round_number}"
                await js.add_stream(name=subject.upper(), subjects=[subject])
                value = stamped_value()
                start = time.perf_counter()
                acks = [await js.publish_async(subject, value) for _ in range(records)]
                await asyncio.gather(*acks)
                figures.produce_runs.append(records / (time.perf_counter() - start))

                subscription = await js.pull_subscribe(subject, durable=subject, config=config)
                received = 0
                start = time.perf_counter()
                while received < records:
                    wanted = min(batch, records - received)
                    messages = await subscription.fetch(wanted, timeout=5)
                    received += len(messages)
                    await messages[-1].ack()
                figures.consume_runs.append(records / (time.perf_counter() - start))

            await js.add_stream(name="E2E", subjects=["e2e"])
            total = int(rate * seconds)
            latencies: list[float] = []

            async def consume() -> None:
                own = await nats.connect(f"nats://127.0.0.1:{port}")
                e2e_sub = await own.jetstream().pull_subscribe("e2e", durable="e2e", config=config)
                got = 0
                deadline = time.monotonic() + seconds + OP_TIMEOUT_S
                try:
                    while got < total and time.monotonic() < deadline:
                        try:
                            messages = await e2e_sub.fetch(batch, timeout=0.05)
                        except nats.errors.TimeoutError:
                            continue
                        now = time.perf_counter_ns()
                        for message in messages:
                            latencies.append(latency_ms(message.data, now))
                        got += len(messages)
                        await messages[-1].ack()
                finally:
                    await own.close()

            pending: list[asyncio.Future[object]] = []

            async def send_many(count: int) -> None:
                for _ in range(count):
                    pending.append(await js.publish_async("e2e", stamped_value()))

            consumer = in_thread(consume)
            figures.e2e_sent = await paced_producer(rate, seconds, send_many)
            await asyncio.gather(*pending)
            await asyncio.to_thread(consumer.join, OP_TIMEOUT_S)
            figures.e2e_latencies_ms = keep_after_warmup(latencies)
        finally:
            await connection.close()
    return figures


# --- Fjord ----------------------------------------------------------------------------------


def bench_fjord(
    records: int,
    rate: int,
    seconds: float,
    linger_ms: int,
    rounds: int,
    each_round: Callable[[], None] = lambda: None,
) -> tuple[Figures, Figures]:
    """fjord.client's figures, and confluent-kafka's through the same broker's Kafka listener
    (rounds interleaved, so both see the same load); ``each_round`` runs a peer's round after
    each of Fjord's, for the same reason."""
    from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
    from fjord.local.cluster import LocalCluster

    figures = Figures("Fjord (Producer acks=1 / Consumer)")
    ck_figures = Figures(CK_OVER_LISTENER)
    with tempfile.TemporaryDirectory(prefix="bench-fjord-") as tmp:
        cluster = LocalCluster(Path(tmp), brokers=1)
        cluster.start()
        try:
            bootstrap = str(cluster.bootstrap_servers)
            kafka = cluster.kafka_bootstrap_servers
            topics = [f"bench-{n}" for n in range(rounds)]
            ck_topics = [f"bench-ck-{n}" for n in range(rounds)]
            with AdminClient({"bootstrap.servers": bootstrap}) as admin:
                admin.create_topics(
                    [NewTopic(t, 1, 1) for t in [*topics, *ck_topics, "e2e"]],
                    timeout=OP_TIMEOUT_S,
                )
            for topic, ck_topic in zip(topics, ck_topics, strict=True):
                producer = Producer({"bootstrap.servers": bootstrap, "acks": "1"})
                try:
                    producer.partitions_for(topic)  # metadata outside the timed part
                    value, send = stamped_value(), producer.send
                    start = time.perf_counter()
                    for _ in range(records):
                        send(topic, value)
                    producer.flush(OP_TIMEOUT_S)
                    figures.produce_runs.append(records / (time.perf_counter() - start))
                finally:
                    producer.close(OP_TIMEOUT_S)

                consumer = Consumer(
                    {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}
                )
                try:
                    consumer.assign([TopicPartition(topic, 0)])
                    consumer.position(TopicPartition(topic, 0), timeout=30)
                    received = 0
                    deadline = time.monotonic() + OP_TIMEOUT_S
                    start = time.perf_counter()
                    while received < records and time.monotonic() < deadline:
                        received += len(consumer.poll(1.0))
                    figures.consume_runs.append(received / (time.perf_counter() - start))
                    if received < records:
                        figures.note = f"consumer saw {received} of {records}"
                finally:
                    consumer.close()

                ck_figures.produce_runs.append(
                    ck_produce(kafka, ck_topic, records, stamped_value(), linger_ms=None)
                )
                ck_figures.consume_runs.append(ck_consume(kafka, ck_topic, 1, records))
                each_round()

            with gc_pauses(figures.gc_pauses_ms):
                figures.e2e_sent, figures.e2e_latencies_ms = _fjord_e2e(
                    bootstrap, rate, seconds, linger_ms
                )
        finally:
            cluster.stop()
    return figures, ck_figures


@contextlib.contextmanager
def gc_pauses(out: list[tuple[int, float]]) -> Iterator[None]:
    """Record (generation, milliseconds) of every garbage collection in this process."""
    started = [0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter_ns()
        else:
            out.append((info["generation"], (time.perf_counter_ns() - started[0]) / 1e6))

    gc.callbacks.append(callback)
    try:
        yield
    finally:
        gc.callbacks.remove(callback)


def gc_line(figures: Figures) -> str:
    freeze = os.environ.get("FJORD_GC_FREEZE", "true").strip().lower() not in ("false", "0", "no")
    parts = []
    for generation in range(3):
        pauses = [ms for g, ms in figures.gc_pauses_ms if g == generation]
        longest = f", longest {max(pauses):.1f} ms" if pauses else ""
        parts.append(f"gen {generation}: {len(pauses)}{longest}")
    return (
        f"Fjord clients' process, garbage collections during the latency run: {'; '.join(parts)} "
        f"(start-up objects frozen: {'yes' if freeze else 'no, FJORD_GC_FREEZE=false'})"
    )


def _fjord_e2e(
    bootstrap: str, rate: int, seconds: float, linger_ms: int
) -> tuple[int, list[float]]:
    from fjord.client import Consumer, Producer, TopicPartition

    total = int(rate * seconds)
    latencies: list[float] = []
    tp = TopicPartition("e2e", 0)
    consumer = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "latest"})
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": linger_ms})
    try:
        consumer.assign([tp])
        consumer.position(tp, timeout=30)  # resolve "latest" before the first record
        producer.partitions_for("e2e")
        stop = threading.Event()

        def consume() -> None:
            deadline = time.monotonic() + seconds + OP_TIMEOUT_S
            while len(latencies) < total and time.monotonic() < deadline and not stop.is_set():
                batch = consumer.poll(0.1)
                now = time.perf_counter_ns()
                latencies.extend(latency_ms(r.value, now) for r in batch if r.value)

        reader = threading.Thread(target=consume, name="e2e-consumer")
        reader.start()

        def send_many(count: int) -> None:
            for _ in range(count):
                producer.send("e2e", stamped_value())

        sent = asyncio.run(paced_producer(rate, seconds, send_many))
        producer.flush(OP_TIMEOUT_S)
        reader.join(seconds + OP_TIMEOUT_S)
        stop.set()
    finally:
        producer.close(OP_TIMEOUT_S)
        consumer.close()
    return sent, keep_after_warmup(latencies)


# --- report ---------------------------------------------------------------------------------




def table(results: list[Figures]) -> str:
    header = (
        "| system | produce rec/s | produce MB/s | consume rec/s | consume MB/s "
        "| e2e p50 ms | e2e p99 ms | e2e measured/sent |"
    )
    rows = [header, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for f in results:
        latency = (
            f"{f.percentile(0.5):.2f} | {f.percentile(0.99):.2f} "
            f"| {len(f.e2e_latencies_ms)}/{f.e2e_sent}"
            if f.e2e_sent
            else "not run | not run | -"
        )
        rows.append(
            f"| {f.system} | {f.produce_rps:,.0f} | {f.produce_mbps:.1f} | {f.consume_rps:,.0f} "
            f"| {f.consume_mbps:.1f} | {latency} |"
        )
    return "\n".join(rows)


def round_lines(results: list[Figures]) -> list[str]:
    """Every round's records/s, so the spread behind each median is visible."""

    def fmt(runs: list[float]) -> str:
        return ", ".join(f"{r:,.0f}" for r in runs)

    return [
        f"{f.system.split(' (')[0]} rounds, produce: {fmt(f.produce_runs)}; "
        f"consume: {fmt(f.consume_runs)}" + (f" ({f.note})" if f.note else "")
        for f in results
    ]


def ratio_line(what: str, ours: float, peer: float, peer_name: str, target: float) -> str:
    ratio = ours / peer
    met = "met" if ratio >= target else "MISSED"
    return f"{what}: Fjord {ratio:.2f}x {peer_name} (target >= {target:g}x): {met}"


def verdicts(results: list[Figures]) -> list[str]:
    by_name = {f.system: f for f in results}
    fjord = next((f for f in results if f.system.startswith("Fjord")), None)
    if fjord is None:
        return ["Fjord was not measured in this run."]
    lines = []
    redis_figures = by_name.get(REDIS_SYNC)
    if redis_figures is not None and redis_figures.produce_rps and redis_figures.consume_rps:
        lines.append(ratio_line("produce", fjord.produce_rps, redis_figures.produce_rps,
                                "pipelined XADD (sync + hiredis)", TARGET_PRODUCE_X_REDIS))
        lines.append(ratio_line("consume", fjord.consume_rps, redis_figures.consume_rps,
                                "XREADGROUP (sync + hiredis)", TARGET_CONSUME_X_REDIS))
    ck = by_name.get(CK_OVER_LISTENER)
    if ck is not None and ck.produce_rps and ck.consume_rps:
        lines.append(ratio_line("produce", fjord.produce_rps, ck.produce_rps,
                                "confluent-kafka produce() into the same broker",
                                TARGET_X_CONFLUENT_KAFKA))
        lines.append(ratio_line("consume", fjord.consume_rps, ck.consume_rps,
                                "confluent-kafka's consumer from the same broker",
                                TARGET_X_CONFLUENT_KAFKA))
    p99 = fjord.percentile(0.99)
    lines.append(
        f"end to end: Fjord p99 {p99:.2f} ms (target <= {TARGET_E2E_P99_MS:g} ms): "
        f"{'met' if p99 <= TARGET_E2E_P99_MS else 'MISSED'}"
    )
    lines.append(gc_line(fjord))
    return lines


def machine() -> str:
    from fjord.records.speedups import IMPLEMENTATION

    records = "C extension" if IMPLEMENTATION == "c" else "pure Python"
    return (
        f"{os.cpu_count()} CPUs ({cpu_model()}), Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}; Fjord's record code: {records} "
        "(fjord.records.speedups)"
    )


E2E_NOTES = (
    "How to read the ratios (issue 18): the redis-py sync + hiredis rounds run between Fjord's "
    "(fjord.client, then confluent-kafka, then Redis, next round), so the figures the targets "
    "compare were taken under the same load; meanwhile Fjord's one-broker LocalCluster is up "
    "and idle beside redis-server. The other systems run one after another, so their figures "
    "carry whatever load the machine had then. confluent-kafka's consumer sets "
    "fetch.queue.backoff.ms 10 (librdkafka otherwise stops fetching for 1 s whenever 100,000 "
    "records wait in its queue, and the figure measures that pause)."
)


def write_results(text_table: str, lines: list[str], command: str, load_before: float) -> None:
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    write_section(
        SECTION_START,
        f"Command: `{command}`, {today}; machine: {machine()}; load average (1 min) "
        f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end. Every server on "
        "loopback on the same machine as its clients (the machine is shared with other work, "
        "so figures move between runs: a target is a ratio within this one run, issue 18). MB/s "
        "counts the 100-byte values only. Peers: Redis Streams through redis-py's synchronous "
        "client with hiredis (the fastest Python path; the targets are read against it) and "
        "through its asyncio client (kept for comparison with earlier runs), NATS JetStream, "
        "and confluent-kafka (librdkafka) through Fjord's Kafka listener on the same broker as "
        "fjord.client. Workload, settings and method: the docstring of bench/bench_e2e.py.\n\n"
        f"{text_table}\n\n" + "\n".join(f"- {line}" for line in lines) + f"\n\n{E2E_NOTES}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000, help="records per throughput run")
    parser.add_argument("--rate", type=int, default=10_000, help="paced records/s for latency")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the latency run")
    parser.add_argument("--pipeline", type=int, default=1000, help="XADDs per Redis round trip")
    parser.add_argument("--batch", type=int, default=1000, help="records per consumer read")
    parser.add_argument(
        "--xread-count", type=int, default=10_000, help="XREADGROUP COUNT of sync redis-py"
    )
    parser.add_argument("--systems", default="redis,redis-asyncio,nats,fjord")
    parser.add_argument(
        "--rounds", type=int, default=3, help="throughput rounds per system (median reported)"
    )
    parser.add_argument(
        "--fjord-linger-ms",
        type=int,
        default=5,
        help="linger.ms of Fjord's producer in the latency run (5 = the client default)",
    )
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(systems) - {"redis", "redis-asyncio", "nats", "fjord"}
    if unknown:
        parser.error(f"unknown system(s): {', '.join(sorted(unknown))}")

    load_before = os.getloadavg()[0]
    results: list[Figures] = []
    redis_sync = RedisSyncRounds(args.records, args.pipeline, args.xread_count)
    with contextlib.ExitStack() as stack:
        if "redis" in systems:
            stack.enter_context(redis_sync.serving())
            if "fjord" not in systems:  # else its rounds run between Fjord's, below
                for _ in range(args.rounds):
                    redis_sync.run_round()
            results.append(redis_sync.figures)
        for system in systems:
            print(f"running {system} ...", flush=True)
            if system == "redis-asyncio":
                results.append(
                    asyncio.run(
                        bench_redis(
                            args.records,
                            args.pipeline,
                            args.batch,
                            args.rate,
                            args.seconds,
                            args.rounds,
                        )
                    )
                )
            elif system == "nats":
                results.append(
                    asyncio.run(
                        bench_nats(args.records, args.batch, args.rate, args.seconds, args.rounds)
                    )
                )
            elif system == "fjord":
                results.extend(
                    bench_fjord(
                        args.records,
                        args.rate,
                        args.seconds,
                        args.fjord_linger_ms,
                        args.rounds,
                        redis_sync.run_round if "redis" in systems else lambda: None,
                    )
                )
    text_table = table(results)
    lines = verdicts(results) + round_lines(results)
    print(text_table)
    print("\n".join(lines))
    print(f"machine: {machine()}")
    if args.write_results:
        argv = " ".join(a for a in sys.argv[1:] if a != "--write-results")
        command = f".venv/bin/python bench/bench_e2e.py {argv}".strip()
        write_results(text_table, lines, command, load_before)


if __name__ == "__main__":
    main()
