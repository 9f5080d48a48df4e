"""``fjord perf produce|consume``: Kafka's producer/consumer performance tools.

produce sends ``--num-records`` records of ``--record-size`` bytes (optionally throttled to
``--throughput`` records/s) and reports records/s, MB/s and latency avg/p50/p95/p99/p99.9/max,
measured from ``send()`` to acknowledgement on a sample of records (every record up to 50,000
samples, as Kafka's tool samples). consume reads ``--messages`` records from the beginning of
every partition and reports MB/s and records/s.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import click

from fjord.cli.client_common import (
    bootstrap_for_command,
    bootstrap_option,
    command_config,
    friendly_errors,
    parse_pairs,
)
from fjord.client import Consumer, Producer, TopicPartition
from fjord.errors import FjordError

MAX_LATENCY_SAMPLES = 50_000
PERF_CONSUME_TIMEOUT_MS = 10_000  # --timeout-ms default: give up after this long without data


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, math.ceil(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


def run_produce_perf(
    producer: Producer, topic: str, num_records: int, record_size: int, throughput: float
) -> dict[str, Any]:
    """Send the records and measure; returns the report (also used by the benchmarks)."""
    payload = os.urandom(record_size)
    step = max(1, num_records // MAX_LATENCY_SAMPLES)
    latencies: list[float] = []
    errors: list[BaseException] = []

    def sampler(sent_at: float) -> Any:
        def done(future: Any) -> None:
            error = future.exception()
            if error is not None:
                errors.append(error)
            else:
                latencies.append((time.perf_counter() - sent_at) * 1000)

        return done

    send = producer.send
    start = time.perf_counter()
    for i in range(num_records):
        if throughput > 0:
            due = start + i / throughput
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        future = send(topic, payload)
        if i % step == 0:
            future.add_done_callback(sampler(time.perf_counter()))
    producer.flush()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    latencies.sort()
    rate = num_records / elapsed if elapsed > 0 else 0.0
    return {
        "records": num_records,
        "record_size": record_size,
        "elapsed_s": round(elapsed, 3),
        "records_per_sec": round(rate, 1),
        "mb_per_sec": round(rate * record_size / (1024 * 1024), 2),
        "latency_ms": {
            "avg": round(sum(latencies) / len(latencies), 2) if latencies else 0.0,
            "p50": round(percentile(latencies, 0.50), 2),
            "p95": round(percentile(latencies, 0.95), 2),
            "p99": round(percentile(latencies, 0.99), 2),
            "p99.9": round(percentile(latencies, 0.999), 2),
            "max": round(latencies[-1], 2) if latencies else 0.0,
        },
    }


def run_consume_perf(
    consumer: Consumer, topic: str, messages: int, timeout_ms: int
) -> dict[str, Any]:
    """Read ``messages`` records from the beginning of every partition of ``topic``."""
    tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    count = 0
    total_bytes = 0
    start = time.perf_counter()
    last_data = start
    while count < messages:
        records = consumer.poll(0.5)
        now = time.perf_counter()
        if not records:
            if (now - last_data) * 1000 > timeout_ms:
                break
            continue
        last_data = now
        for record in records[: messages - count]:
            total_bytes += (len(record.value) if record.value else 0) + (
                len(record.key) if record.key else 0
            )
        count += min(len(records), messages - count)
    elapsed = time.perf_counter() - start
    mb = total_bytes / (1024 * 1024)
    return {
        "records": count,
        "bytes": total_bytes,
        "elapsed_s": round(elapsed, 3),
        "records_per_sec": round(count / elapsed, 1) if elapsed > 0 else 0.0,
        "mb_per_sec": round(mb / elapsed, 2) if elapsed > 0 else 0.0,
        "complete": count >= messages,
    }


@click.group("perf")
def perf() -> None:
    """Producer and consumer performance tests."""


@perf.command("produce")
@bootstrap_option
@click.option("--topic", required=True)
@click.option("--num-records", type=int, required=True, help="Records to send.")
@click.option("--record-size", type=int, required=True, help="Bytes per record value.")
@click.option("--throughput", type=float, default=-1, show_default=True, help="Max records/s.")
@click.option("--producer-props", "props", multiple=True, metavar="K=V", help="Producer config.")
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table")
@friendly_errors
def perf_produce(
    bootstrap_server: str | None,
    topic: str,
    num_records: int,
    record_size: int,
    throughput: float,
    props: tuple[str, ...],
    output: str,
) -> None:
    """Measure producer throughput and latency."""
    if num_records <= 0 or record_size < 0:
        raise click.UsageError("--num-records must be > 0 and --record-size >= 0")
    config: dict[str, Any] = {
        **command_config(), "bootstrap.servers": bootstrap_for_command(bootstrap_server)
    }
    config.update(parse_pairs(props, "--producer-props"))
    producer = Producer(config)
    try:
        report = run_produce_perf(producer, topic, num_records, record_size, throughput)
    finally:
        producer.close()
    if output == "json":
        click.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    lat = report["latency_ms"]
    click.echo(
        f"{report['records']} records sent, {report['records_per_sec']} records/sec "
        f"({report['mb_per_sec']} MB/sec), {lat['avg']} ms avg latency, {lat['max']} ms max "
        f"latency, {lat['p50']} ms 50th, {lat['p95']} ms 95th, {lat['p99']} ms 99th, "
        f"{lat['p99.9']} ms 99.9th."
    )


@perf.command("consume")
@bootstrap_option
@click.option("--topic", required=True)
@click.option("--messages", type=int, required=True, help="Records to read.")
@click.option(
    "--timeout-ms", type=int, default=PERF_CONSUME_TIMEOUT_MS, show_default=True, help="Idle limit."
)
@click.option("--consumer-props", "props", multiple=True, metavar="K=V", help="Consumer config.")
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table")
@friendly_errors
def perf_consume(
    bootstrap_server: str | None,
    topic: str,
    messages: int,
    timeout_ms: int,
    props: tuple[str, ...],
    output: str,
) -> None:
    """Measure consumer throughput."""
    config: dict[str, Any] = {
        **command_config(), "bootstrap.servers": bootstrap_for_command(bootstrap_server)
    }
    config.update(parse_pairs(props, "--consumer-props"))
    consumer = Consumer(config)
    try:
        report = run_consume_perf(consumer, topic, messages, timeout_ms)
    finally:
        consumer.close()
    if not report["complete"]:
        raise FjordError(
            f"only {report['records']} of {messages} records arrived within --timeout-ms"
        )
    if output == "json":
        click.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    click.echo(
        "data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, elapsed.sec\n"
        f"{report['bytes'] / (1024 * 1024):.4f}, {report['mb_per_sec']}, {report['records']}, "
        f"{report['records_per_sec']}, {report['elapsed_s']}"
    )
