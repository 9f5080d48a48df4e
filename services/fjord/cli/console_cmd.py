"""``fjord produce`` and ``fjord consume``: Kafka's console producer and consumer.

produce reads lines from stdin (``--property parse.key=true --property key.separator=:`` splits
each into key and value); consume prints values (``--property print.key=true`` and friends) or,
with ``--output json``, one JSON object per record and line.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from typing import Any

import click

from fjord.cli.client_common import (
    bootstrap_for_command,
    bootstrap_option,
    friendly_errors,
    parse_pairs,
)
from fjord.client import Consumer, ConsumerRecord, Producer, TopicPartition
from fjord.config import COMPRESSION_TYPES
from fjord.errors import ConfigError

_PRODUCER_PROPERTIES = {"parse.key", "key.separator", "ignore.error"}
_CONSUMER_PROPERTIES = {
    "print.key",
    "print.value",
    "print.offset",
    "print.partition",
    "print.timestamp",
    "print.headers",
    "key.separator",
    "line.separator",
}
_CONSOLE_MAX_BLOCK_MS = 15000  # the console producer gives up on an unknown topic sooner


def _true(props: dict[str, str], name: str, default: bool = False) -> bool:
    value = props.get(name)
    return default if value is None else value.lower() == "true"


def _check_properties(props: dict[str, str], allowed: set[str]) -> None:
    for name in props:
        if name not in allowed:
            raise ConfigError(f"unknown --property {name!r} (known: {sorted(allowed)})")


@click.command("produce")
@bootstrap_option
@click.option("--topic", required=True, help="Topic to write to.")
@click.option("--property", "properties", multiple=True, metavar="K=V", help="parse.key, ...")
@click.option("--acks", default=None, help="0, 1 or all (default: all).")
@click.option(
    "--compression-type", type=click.Choice(COMPRESSION_TYPES), default=None, help="Batch codec."
)
@click.option("--partition", type=int, default=None, help="Write every record to this partition.")
@click.option(
    "--producer-property", "producer_properties", multiple=True, metavar="K=V", help="Any config."
)
@friendly_errors
def produce(
    bootstrap_server: str | None,
    topic: str,
    properties: tuple[str, ...],
    acks: str | None,
    compression_type: str | None,
    partition: int | None,
    producer_properties: tuple[str, ...],
) -> None:
    """Send each line of stdin as one record."""
    props = parse_pairs(properties, "--property")
    _check_properties(props, _PRODUCER_PROPERTIES)
    parse_key = _true(props, "parse.key")
    separator = props.get("key.separator", "\t")
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_for_command(bootstrap_server),
        "max.block.ms": _CONSOLE_MAX_BLOCK_MS,
        "linger.ms": 5,
    }
    if acks is not None:
        config["acks"] = acks
    if compression_type is not None:
        config["compression.type"] = compression_type
    config.update(parse_pairs(producer_properties, "--producer-property"))
    producer = Producer(config)
    futures = []
    try:
        for number, line in enumerate(sys.stdin, start=1):
            line = line.rstrip("\n").rstrip("\r")
            key: str | None = None
            value = line
            if parse_key:
                key, sep, value = line.partition(separator)
                if not sep:
                    raise click.ClickException(
                        f"line {number}: no key separator {separator!r} (parse.key=true)"
                    )
            futures.append(producer.send(topic, value=value, key=key, partition=partition))
            if len(futures) >= 10000:
                for future in futures:
                    future.result()
                futures.clear()
        producer.flush()
        for future in futures:
            future.result()
    finally:
        producer.close()


def _format_record(record: ConsumerRecord, props: dict[str, str]) -> str:
    separator = props.get("key.separator", "\t")
    parts = []
    if _true(props, "print.timestamp"):
        parts.append(f"CreateTime:{record.timestamp}")
    if _true(props, "print.partition"):
        parts.append(f"Partition:{record.partition}")
    if _true(props, "print.offset"):
        parts.append(f"Offset:{record.offset}")
    if _true(props, "print.headers"):
        parts.append(
            ",".join(f"{k}:{_text(v)}" for k, v in record.headers)
            if record.headers
            else "NO_HEADERS"
        )
    if _true(props, "print.key"):
        parts.append(_text(record.key))
    if _true(props, "print.value", default=True):
        parts.append(_text(record.value))
    return separator.join(parts)


def _text(data: bytes | None) -> str:
    if data is None:
        return "null"
    return data.decode("utf-8", errors="replace")


def _json_bytes(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def record_json(record: ConsumerRecord) -> dict[str, Any]:
    return {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": _json_bytes(record.key),
        "value": _json_bytes(record.value),
        "headers": [[k, _json_bytes(v)] for k, v in record.headers],
    }


@click.command("consume")
@bootstrap_option
@click.option("--topic", required=True, help="Topic to read.")
@click.option("--partition", type=int, default=None, help="Only this partition.")
@click.option("--from-beginning", is_flag=True, help="Start at the earliest offset.")
@click.option("--offset", default=None, help="earliest, latest or an offset (needs --partition).")
@click.option("--max-messages", type=int, default=None, help="Exit after this many records.")
@click.option("--timeout-ms", type=int, default=None, help="Exit after this long without records.")
@click.option("--property", "properties", multiple=True, metavar="K=V", help="print.key, ...")
@click.option(
    "--consumer-property", "consumer_properties", multiple=True, metavar="K=V", help="Any config."
)
@click.option(
    "--output",
    "-o",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Formatted lines, or one JSON object per record.",
)
@friendly_errors
def consume(
    bootstrap_server: str | None,
    topic: str,
    partition: int | None,
    from_beginning: bool,
    offset: str | None,
    max_messages: int | None,
    timeout_ms: int | None,
    properties: tuple[str, ...],
    consumer_properties: tuple[str, ...],
    output: str,
) -> None:
    """Print records of a topic."""
    props = parse_pairs(properties, "--property")
    _check_properties(props, _CONSUMER_PROPERTIES)
    start_offset: int | None = None
    if offset is not None:
        if offset not in ("earliest", "latest"):
            if partition is None:
                raise click.UsageError("--offset with a number needs --partition")
            try:
                start_offset = int(offset)
            except ValueError:
                raise click.BadParameter(
                    f"expected earliest, latest or a number, got {offset!r}", param_hint="--offset"
                ) from None
        elif offset == "earliest":
            from_beginning = True
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_for_command(bootstrap_server),
        "auto.offset.reset": "earliest" if from_beginning else "latest",
    }
    config.update(parse_pairs(consumer_properties, "--consumer-property"))
    line_separator = props.get("line.separator", "\n")
    consumer = Consumer(config)
    count = 0
    try:
        numbers = consumer.partitions_for_topic(topic)
        if partition is not None:
            if partition not in numbers:
                raise click.ClickException(
                    f"UNKNOWN_TOPIC_OR_PARTITION: topic {topic!r} has no partition {partition}"
                )
            numbers = [partition]
        tps = [TopicPartition(topic, p) for p in numbers]
        consumer.assign(tps)
        if start_offset is not None:
            consumer.seek(tps[0], start_offset)
        elif from_beginning:
            consumer.seek_to_beginning(*tps)
        else:
            consumer.seek_to_end(*tps)
            for tp in tps:  # pin "latest" now, so records produced from here on are seen
                consumer.position(tp)
        idle_deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
        while max_messages is None or count < max_messages:
            wait = 1.0
            if idle_deadline is not None:
                wait = idle_deadline - time.monotonic()
                if wait <= 0:
                    break
            records = consumer.poll(min(wait, 1.0))
            if not records:
                continue
            if idle_deadline is not None:
                idle_deadline = time.monotonic() + timeout_ms / 1000  # type: ignore[operator]
            if max_messages is not None:
                records = records[: max_messages - count]
            out = []
            for record in records:
                if output == "json":
                    out.append(json.dumps(record_json(record), sort_keys=True) + "\n")
                else:
                    out.append(_format_record(record, props) + line_separator)
            sys.stdout.write("".join(out))
            sys.stdout.flush()
            count += len(records)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    click.echo(f"Processed a total of {count} messages", err=True)
