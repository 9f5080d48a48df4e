"""The quickstart scenario against a live cluster: order service -> orders -> shipping service.

Each stage is a function over the public clients (``fjord.client``), so the CLI, the
integration test and anyone reading along run the same code. Every stage is bounded by a
timeout on progress (no new record for ``stage_timeout_s`` fails the stage with
:class:`~fjord.client.KafkaTimeoutError` naming the stage), never by a fixed sleep.

Tracing: each order is sent inside an ``order-service send`` span (kind PRODUCER) whose context
travels in the record's ``traceparent`` header; the shipping service processes it inside a
``shipping-service process`` span (kind CONSUMER) that continues that trace, and its shipment
carries the header on. With no tracer provider installed the spans are non-recording and no
header is added; without a provider the demo skips the spans altogether (see
docs/observability.md).

A run works on the records it writes itself: it notes both topics' end offsets before writing,
and the shipping service and the verification start there. So running the quickstart again on
the same data directory (the topics already exist, with the previous run's records) verifies
the new run alone, as a shipping service resuming from its last position would.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Mapping

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.trace import SpanKind

from fjord.client import (
    AdminClient,
    Consumer,
    ConsumerRecord,
    KafkaTimeoutError,
    NewTopic,
    Producer,
    TopicPartition,
)
from fjord.demo.defaults import (
    DEMO_PARTITIONS,
    DEMO_REPLICATION_FACTOR,
    ORDERS_TOPIC,
    POLL_TIMEOUT_S,
    PRODUCER_ACKS,
    SHIPMENTS_TOPIC,
    STAGE_TIMEOUT_S,
)
from fjord.demo.orders import (
    ScenarioReport,
    StageStats,
    decode,
    encode,
    make_order,
    order_key,
    shipment_for,
    verify,
)
from fjord.errors import TopicAlreadyExistsError
from fjord.observability import extract_from_record_headers, get_tracer, inject_traceparent_header

Offsets = Mapping[TopicPartition, int]


def create_demo_topics(
    bootstrap: str,
    orders_topic: str = ORDERS_TOPIC,
    shipments_topic: str = SHIPMENTS_TOPIC,
    partitions: int = DEMO_PARTITIONS,
    replication_factor: int = DEMO_REPLICATION_FACTOR,
    timeout_s: float = STAGE_TIMEOUT_S,
) -> list[str]:
    """Create both topics; returns the names that already existed (kept as they are).

    Any other error (e.g. INVALID_REPLICATION_FACTOR on a smaller cluster) is raised.
    """
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        errors = admin.create_topics(
            [
                NewTopic(orders_topic, partitions, replication_factor),
                NewTopic(shipments_topic, partitions, replication_factor),
            ],
            timeout=timeout_s,
            raise_on_error=False,
        )
    existing = []
    for name, error in errors.items():
        if isinstance(error, TopicAlreadyExistsError):
            existing.append(name)
        elif error is not None:
            raise error
    return existing


def end_offsets(bootstrap: str, topic: str, timeout_s: float = STAGE_TIMEOUT_S) -> Offsets:
    """The current end offset of every partition of ``topic``."""
    consumer = _consumer_for(bootstrap, topic, timeout_s)
    try:
        return consumer.end_offsets(sorted(consumer.assignment()), timeout=timeout_s)
    finally:
        consumer.close()


def write_orders(
    bootstrap: str,
    topic: str,
    count: int,
    seed: int = 0,
    timeout_s: float = STAGE_TIMEOUT_S,
    tracer: trace.Tracer | None = None,
) -> tuple[StageStats, dict[bytes, int]]:
    """The order service: ``count`` JSON orders keyed by order id; returns {key: partition}."""
    tracer = _active_tracer(tracer)
    rng = random.Random(seed)
    stats = StageStats("order service: write orders")
    placed: dict[bytes, int] = {}
    with Producer({"bootstrap.servers": bootstrap, "acks": PRODUCER_ACKS}) as producer:
        producer.partitions_for(topic)  # metadata before the clock starts
        began = time.perf_counter()
        futures = []
        for n in range(1, count + 1):
            key = order_key(n)
            value = encode(make_order(n, rng))
            if tracer is None:
                future = producer.send(topic, value, key=key)
            else:
                with tracer.start_as_current_span("order-service send", kind=SpanKind.PRODUCER):
                    future = producer.send(
                        topic, value, key=key, headers=inject_traceparent_header()
                    )
            futures.append((key, future))
        producer.flush(timeout_s)
        for key, future in futures:
            metadata = future.result(timeout_s)
            placed[key] = metadata.partition
            stats.per_partition[metadata.partition] += 1
        stats.seconds = time.perf_counter() - began
    stats.records = len(placed)
    return stats, placed


def _active_tracer(tracer: trace.Tracer | None) -> trace.Tracer | None:
    """``tracer``, else the global one when an SDK provider is installed, else None: without a
    provider the per-record spans would record nothing and only cost time."""
    if tracer is not None:
        return tracer
    if isinstance(trace.get_tracer_provider(), SdkTracerProvider):
        return get_tracer()
    return None


def _drain(
    consumer: Consumer, stage: str, timeout_s: float, start: Offsets | None = None
) -> Iterator[ConsumerRecord]:
    """Every record of the assigned partitions from ``start`` (default: the beginning) up to
    their end offsets as of now."""
    assigned = sorted(consumer.assignment())
    if start is None:
        consumer.seek_to_beginning(*assigned)
    else:
        for tp in assigned:
            consumer.seek(tp, start.get(tp, 0))
    ends = consumer.end_offsets(assigned, timeout=timeout_s)
    remaining = {tp for tp in assigned if ends[tp] > consumer.position(tp, timeout=timeout_s)}
    last_progress = time.monotonic()
    while remaining:
        records = consumer.poll(POLL_TIMEOUT_S)
        if records:
            last_progress = time.monotonic()
        yield from records
        for tp in list(remaining):
            if consumer.position(tp, timeout=timeout_s) >= ends[tp]:
                remaining.discard(tp)
        if remaining and time.monotonic() - last_progress > timeout_s:
            behind = ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(remaining))
            raise KafkaTimeoutError(f"{stage}: no progress for {timeout_s} s on {behind}")


def _consumer_for(bootstrap: str, topic: str, timeout_s: float) -> Consumer:
    consumer = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"})
    partitions = consumer.partitions_for_topic(topic, timeout=timeout_s)
    consumer.assign([TopicPartition(topic, p) for p in partitions])
    return consumer


def ship_orders(
    bootstrap: str,
    orders_topic: str,
    shipments_topic: str,
    timeout_s: float = STAGE_TIMEOUT_S,
    start: Offsets | None = None,
    tracer: trace.Tracer | None = None,
) -> StageStats:
    """The shipping service: read every order (from ``start``, default the beginning) and
    write one shipment per order under the order's key."""
    tracer = _active_tracer(tracer)
    stats = StageStats("shipping service: orders -> shipments")
    consumer = _consumer_for(bootstrap, orders_topic, timeout_s)
    try:
        with Producer({"bootstrap.servers": bootstrap, "acks": PRODUCER_ACKS}) as producer:
            producer.partitions_for(shipments_topic)
            began = time.perf_counter()
            for record in _drain(consumer, "shipping service", timeout_s, start):
                where = f"order {record.partition}/{record.offset}"
                if tracer is None:
                    shipment = shipment_for(
                        decode(record.value, where), record.partition, record.offset
                    )
                    producer.send(shipments_topic, encode(shipment), key=record.key)
                else:
                    with tracer.start_as_current_span(
                        "shipping-service process",
                        context=extract_from_record_headers(record.headers),
                        kind=SpanKind.CONSUMER,
                    ):
                        shipment = shipment_for(
                            decode(record.value, where), record.partition, record.offset
                        )
                        producer.send(
                            shipments_topic,
                            encode(shipment),
                            key=record.key,
                            headers=inject_traceparent_header(),
                        )
                stats.records += 1
                stats.per_partition[record.partition] += 1
            producer.flush(timeout_s)
            stats.seconds = time.perf_counter() - began
    finally:
        consumer.close()
    return stats


def read_shipments(
    bootstrap: str, topic: str, timeout_s: float = STAGE_TIMEOUT_S, start: Offsets | None = None
) -> tuple[StageStats, list[tuple[bytes | None, bytes | None, int]]]:
    """Every shipment (from ``start``, default the beginning) as ``(key, value, partition)``."""
    stats = StageStats("verify: read shipments")
    shipments: list[tuple[bytes | None, bytes | None, int]] = []
    consumer = _consumer_for(bootstrap, topic, timeout_s)
    try:
        began = time.perf_counter()
        for record in _drain(consumer, "verify", timeout_s, start):
            shipments.append((record.key, record.value, record.partition))
            stats.per_partition[record.partition] += 1
        stats.seconds = time.perf_counter() - began
    finally:
        consumer.close()
    stats.records = len(shipments)
    return stats, shipments


def run_scenario(
    bootstrap: str,
    records: int,
    orders_topic: str = ORDERS_TOPIC,
    shipments_topic: str = SHIPMENTS_TOPIC,
    partitions: int = DEMO_PARTITIONS,
    replication_factor: int = DEMO_REPLICATION_FACTOR,
    timeout_s: float = STAGE_TIMEOUT_S,
    tracer: trace.Tracer | None = None,
) -> ScenarioReport:
    """Create the topics, run the three stages, verify; the report says what happened.

    ``tracer``: where the demo's spans go (default: the global provider's, see
    :func:`fjord.observability.setup_tracing`).
    """
    if records < 1:
        raise ValueError(f"records must be at least 1, got {records}")
    began = time.perf_counter()
    create_demo_topics(
        bootstrap, orders_topic, shipments_topic, partitions, replication_factor, timeout_s
    )
    orders_start = end_offsets(bootstrap, orders_topic, timeout_s)
    shipments_start = end_offsets(bootstrap, shipments_topic, timeout_s)
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        # What the topics are, which differs from what was asked when they already existed.
        (orders_description,) = admin.describe_topics([orders_topic], timeout=timeout_s)
    actual_replication = min(len(p.replicas) for p in orders_description.partitions)
    written, placed = write_orders(
        bootstrap, orders_topic, records, timeout_s=timeout_s, tracer=tracer
    )
    shipped = ship_orders(
        bootstrap, orders_topic, shipments_topic, timeout_s, orders_start, tracer=tracer
    )
    read, shipments = read_shipments(bootstrap, shipments_topic, timeout_s, shipments_start)
    # Same key -> same partition number only holds when both topics have the same count (a
    # previous run's topics may have been altered).
    same_count = len(orders_start) == len(shipments_start)
    return ScenarioReport(
        orders_topic=orders_topic,
        shipments_topic=shipments_topic,
        partitions=len(orders_start),
        replication_factor=actual_replication,
        stages=[written, shipped, read],
        verification=verify(placed, shipments, check_placement=same_count),
        elapsed_s=time.perf_counter() - began,
    )
