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
from collections.abc import Iterator
from typing import Any

import click

from fjord.cli.client_common import (
    bootstrap_for_command,
    bootstrap_option,
    command_config,
    friendly_errors,
    parse_pairs,
)
from fjord.client import (
    AdminClient,
    Consumer,
    ConsumerRecord,
    Producer,
    RecordFuture,
    TopicPartition,
)
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
@click.option(
    "--print-offsets",
    "-v",
    "print_offsets",
    is_flag=True,
    help="Print where each record landed: 'Produced to partition P at offset O.' (rpk's -v).",
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
    print_offsets: bool,
) -> None:
    """Send each line of stdin as one record. On a terminal each line is sent as you type it
    and the next '>' prompt (on stderr, as Kafka's console producer shows it) appears once the
    cluster acknowledged it (Ctrl-D ends); --print-offsets confirms every record with its
    partition and offset."""
    props = parse_pairs(properties, "--property")
    _check_properties(props, _PRODUCER_PROPERTIES)
    parse_key = _true(props, "parse.key")
    separator = props.get("key.separator", "\t")
    config: dict[str, Any] = {
        **command_config(),
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
    futures: list[RecordFuture] = []
    interactive = sys.stdin.isatty()
    if interactive:
        click.echo(f"Type records for {topic!r}, one per line; Ctrl-D to finish.", err=True)

    def settle() -> None:
        for future in futures:
            metadata = future.result()
            if print_offsets:
                click.echo(
                    f"Produced to partition {metadata.partition} at offset {metadata.offset}."
                )
        futures.clear()

    try:
        for number, line in enumerate(_prompted_lines() if interactive else sys.stdin, start=1):
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
            if interactive:  # a person waits for each line: send it now
                producer.flush()
                settle()
            elif len(futures) >= 10000:
                settle()
        producer.flush()
        settle()
    finally:
        producer.close()


def _prompted_lines() -> Iterator[str]:
    """stdin's lines, each read after a '>' prompt on stderr (a terminal: the prompt after a
    line means the line before was acknowledged); a newline after the last, so the shell's
    prompt starts on its own line."""
    while True:
        click.echo(">", nl=False, err=True)
        line = sys.stdin.readline()
        if not line:
            click.echo("", err=True)
            return
        yield line


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
@click.option(
    "--group",
    default=None,
    help="Consume as a member of this consumer group: start from its committed offsets (else "
    "--from-beginning's earliest or latest), commit what was printed, share partitions with "
    "other members.",
)
@click.option("--partition", type=int, default=None, help="Only this partition.")
@click.option("--from-beginning", is_flag=True, help="Start at the earliest offset.")
@click.option("--offset", default=None, help="earliest, latest or an offset (needs --partition).")
@click.option("--max-messages", type=int, default=None, help="Exit after this many records.")
@click.option(
    "--isolation-level",
    type=click.Choice(["read_uncommitted", "read_committed"]),
    default=None,
    help="read_committed: only committed transactions, up to the last stable offset "
    "(default read_uncommitted, as Kafka's console consumer).",
)
@click.option(
    "--timeout-ms",
    type=int,
    default=None,
    help="Exit after this long without records (with --group: counted from joining the group).",
)
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
    group: str | None,
    partition: int | None,
    from_beginning: bool,
    offset: str | None,
    max_messages: int | None,
    isolation_level: str | None,
    timeout_ms: int | None,
    properties: tuple[str, ...],
    consumer_properties: tuple[str, ...],
    output: str,
) -> None:
    """Print records of a topic: of every partition (or --partition) from the end (or
    --from-beginning, --offset), or, with --group, of the partitions the group assigns."""
    props = parse_pairs(properties, "--property")
    _check_properties(props, _CONSUMER_PROPERTIES)
    extra = parse_pairs(consumer_properties, "--consumer-property")
    group = _group_id(group, extra.pop("group.id", None))
    if group is not None and (partition is not None or offset is not None):
        raise click.UsageError(
            "--partition and --offset cannot be used with --group: a group member reads the "
            "partitions the group assigns it, from the group's committed offsets"
        )
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
    bootstrap = bootstrap_for_command(bootstrap_server)
    config: dict[str, Any] = {
        **command_config(),
        "bootstrap.servers": bootstrap,
        "auto.offset.reset": "earliest" if from_beginning else "latest",
    }
    if isolation_level is not None:
        config["isolation.level"] = isolation_level
    if group is not None:
        # Only what was printed is committed (auto commit, and on close), so --max-messages
        # never skips records the next run of the group should see.
        config |= {"group.id": group, "enable.auto.offset.store": "false"}
    config.update(extra)
    line_separator = props.get("line.separator", "\n")
    consumer = Consumer(config)
    count = 0
    leaderless: list[int] = []
    try:
        numbers = consumer.partitions_for_topic(topic)
        if partition is not None:
            if partition not in numbers:
                raise click.ClickException(
                    f"UNKNOWN_TOPIC_OR_PARTITION: topic {topic!r} has no partition {partition}"
                )
            numbers = [partition]
        leaderless = _without_leader(bootstrap, topic, numbers)
        for number in leaderless:
            click.echo(
                f"warning: {topic}-{number} has no leader (its replicas are offline); its "
                "records cannot be read until one comes back",
                err=True,
            )
        tps = [TopicPartition(topic, p) for p in numbers]
        joined = [group is None]  # set by the first rebalance (an empty assignment too)
        if group is not None:
            # Each assigned partition starts at the group's committed offset, else at
            # auto.offset.reset (--from-beginning: earliest), as in Kafka.
            consumer.subscribe([topic], on_assign=lambda _c, _tps: joined.__setitem__(0, True))
        else:
            consumer.assign(tps)
            if start_offset is not None:
                consumer.seek(tps[0], start_offset)
            elif from_beginning:
                consumer.seek_to_beginning(*tps)
            else:
                consumer.seek_to_end(*tps)
                # Pin "latest" now, so records produced from here on are seen (a partition
                # without a leader has no end to ask for: it resolves once a leader is back).
                for tp in tps:
                    if tp.partition not in leaderless:
                        consumer.position(tp)
        # --timeout-ms counts time without records once records can come: joining a group
        # (a rebalance delay, other members) is not idleness, but is bounded on its own.
        idle_s = None if timeout_ms is None else timeout_ms / 1000
        idle_deadline: float | None = None
        join_deadline = time.monotonic() + GROUP_JOIN_WAIT_S
        while max_messages is None or count < max_messages:
            wait = 1.0
            now = time.monotonic()
            if idle_s is not None and not joined[0] and now > join_deadline:
                raise click.ClickException(
                    f"REQUEST_TIMED_OUT: did not join group {group!r} within "
                    f"{GROUP_JOIN_WAIT_S:.0f} s (see `fjord groups describe --group {group}`)"
                )
            if idle_s is not None and joined[0]:
                if idle_deadline is None:
                    idle_deadline = now + idle_s
                wait = idle_deadline - now
                if wait <= 0:
                    break
            records = consumer.poll(min(wait, 1.0))
            if not records:
                continue
            if idle_s is not None:
                idle_deadline = time.monotonic() + idle_s
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
            if group is not None:
                consumer.store_offsets(records=records)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    click.echo(f"Processed a total of {count} messages", err=True)
    if leaderless and count == 0:
        still = _without_leader(bootstrap, topic, leaderless)
        if still:
            names = ", ".join(f"{topic}-{n}" for n in still)
            raise click.ClickException(
                f"LEADER_NOT_AVAILABLE: {names} had no leader the whole time; nothing was read "
                "from it (see `fjord topics describe`)"
            )


#: How long ``consume --group --timeout-ms`` waits to join its group before giving up (Kafka's
#: default.api.timeout.ms).
GROUP_JOIN_WAIT_S = 60.0


def _group_id(option: str | None, from_property: str | None) -> str | None:
    """``--group``, or ``--consumer-property group.id=...`` (the same thing, as in Kafka's
    console consumer); both must agree."""
    if option and from_property and option != from_property:
        raise click.UsageError(
            f"--group {option!r} and --consumer-property group.id={from_property!r} disagree"
        )
    return option or from_property or None


def _without_leader(bootstrap: str, topic: str, partitions: list[int]) -> list[int]:
    """Which of ``partitions`` of ``topic`` have no leader now, as the metadata says."""
    with AdminClient({**command_config(), "bootstrap.servers": bootstrap}) as admin:
        (described,) = admin.describe_topics([topic])
    wanted = set(partitions)
    return sorted(p.partition for p in described.partitions
                  if p.partition in wanted and p.leader < 0)
