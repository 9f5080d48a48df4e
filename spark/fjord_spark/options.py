"""Parsing and validation of the data source's options (pure: no I/O).

The names and meanings follow Spark's Kafka source (see docs/spark.md): a query selects topics
with exactly one of ``subscribe``, ``subscribePattern`` or ``assign``; offsets are ``earliest``,
``latest`` or Spark's JSON (``{"topic": {"0": 42, "1": -2}}``, -2 = earliest, -1 = latest);
client properties pass through with a ``fjord.`` prefix (``fjord.fetch.max.bytes``).
Every problem raises :class:`fjord.errors.ConfigError` naming the option.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fjord.client.types import TopicPartition
from fjord.config import ADMIN_CONFIG, consumer_config, producer_config
from fjord.errors import ConfigError
from fjord_spark import defaults

#: Prefix of client properties passed through to fjord.client (Spark's Kafka source: "kafka.").
CLIENT_PREFIX = "fjord."

#: Offsets in Spark's JSON that mean "the partition's start" / "its end".
EARLIEST = -2
LATEST = -1

_STRATEGIES = ("earliest", "latest")


@dataclass(frozen=True)
class TopicSelection:
    """Which partitions a query reads: exactly one of ``topics`` (subscribe), ``pattern``
    (subscribePattern, matched against whole topic names like Java's ``Pattern.matches``) or
    ``assigned`` (assign) is set."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[TopicPartition, ...] = ()

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        if self.assigned:
            return any(tp.topic == topic for tp in self.assigned)
        return topic in self.topics


@dataclass(frozen=True)
class OffsetSpec:
    """Where to start or end: a ``strategy`` ("earliest"/"latest") for every partition, or
    ``specific`` offsets (EARLIEST/LATEST allowed) with ``strategy`` as the fallback for
    partitions the JSON does not name."""

    strategy: str
    specific: Mapping[TopicPartition, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ReaderOptions:
    """Validated reader options. ``client_properties`` holds the ``fjord.`` properties without
    the prefix (and without bootstrap.servers); they were checked against the consumer's
    configuration table at parse time."""

    bootstrap_servers: str
    selection: TopicSelection
    starting: OffsetSpec
    ending: OffsetSpec | None
    starting_timestamp: int | None
    timestamp_strategy: str
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    include_headers: bool
    poll_timeout_ms: int
    client_properties: Mapping[str, str]

    def task_consumer_config(self) -> dict[str, Any]:
        """The configuration of the consumer inside a read task: it never resets on its own
        (auto.offset.reset=none), so a deleted offset surfaces as an error the task handles."""
        config: dict[str, Any] = {"max.poll.records": defaults.TASK_MAX_POLL_RECORDS}
        config.update(self.client_properties)
        config["bootstrap.servers"] = self.bootstrap_servers
        config["auto.offset.reset"] = "none"
        return config

    def driver_consumer_config(self) -> dict[str, Any]:
        config = dict(self.client_properties)
        config["bootstrap.servers"] = self.bootstrap_servers
        return config

    def admin_config(self) -> dict[str, Any]:
        config = {k: v for k, v in self.client_properties.items() if k in ADMIN_CONFIG}
        config["bootstrap.servers"] = self.bootstrap_servers
        return config


@dataclass(frozen=True)
class WriterOptions:
    """Validated writer options: ``topic`` (overrides a topic column) and the producer's
    properties (checked against the producer's configuration table)."""

    bootstrap_servers: str
    topic: str | None
    client_properties: Mapping[str, str]

    def producer_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"acks": defaults.WRITER_ACKS}
        config.update(self.client_properties)
        config["bootstrap.servers"] = self.bootstrap_servers
        return config


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    # Spark's options are case-insensitive; so are ours.
    return {str(k).lower(): str(v) for k, v in options.items()}


def _bootstrap(opts: Mapping[str, str]) -> str:
    plain = opts.get("bootstrap.servers", "").strip()
    prefixed = opts.get(CLIENT_PREFIX + "bootstrap.servers", "").strip()
    if plain and prefixed and plain != prefixed:
        raise ConfigError(
            "options bootstrap.servers and fjord.bootstrap.servers disagree "
            f"({plain!r} vs {prefixed!r}): give one"
        )
    value = plain or prefixed
    if not value:
        raise ConfigError(
            "missing option bootstrap.servers (or fjord.bootstrap.servers): "
            "the brokers to connect to, host:port[,host:port...]"
        )
    return value


def _client_properties(opts: Mapping[str, str]) -> dict[str, str]:
    return {
        k[len(CLIENT_PREFIX) :]: v
        for k, v in opts.items()
        if k.startswith(CLIENT_PREFIX) and k != CLIENT_PREFIX + "bootstrap.servers"
    }


def parse_bool(name: str, raw: str | None, default: bool) -> bool:
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in ("true", "false"):
        return value == "true"
    raise ConfigError(f"invalid value for option {name}: {raw!r} (expected true or false)")


def _parse_int(name: str, raw: str | None, minimum: int) -> int | None:
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"invalid value for option {name}: {raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"invalid value for option {name}: {value} is below {minimum}")
    return value


def _json_object(name: str, raw: str) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"invalid JSON in option {name}: {exc}: {raw!r}") from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"invalid value for option {name}: expected a JSON object, got {raw!r}")
    return parsed


def _partition_number(name: str, topic: str, raw: Any) -> int:
    try:
        number = int(raw)
    except (TypeError, ValueError):
        number = -1
    if number < 0 or isinstance(raw, bool):
        raise ConfigError(f"invalid partition {raw!r} of topic {topic!r} in option {name}")
    return number


def parse_assign(raw: str) -> tuple[TopicPartition, ...]:
    """``{"topicA": [0, 1], "topicB": [2]}`` as a tuple of partitions."""
    parsed = _json_object("assign", raw)
    out: list[TopicPartition] = []
    for topic, partitions in parsed.items():
        if not isinstance(partitions, list):
            raise ConfigError(
                f"invalid value for option assign: topic {topic!r} needs a list of partitions"
            )
        out.extend(TopicPartition(topic, _partition_number("assign", topic, p)) for p in partitions)
    if not out:
        raise ConfigError("invalid value for option assign: no partition given")
    return tuple(dict.fromkeys(out))


def parse_selection(opts: Mapping[str, str]) -> TopicSelection:
    given = [name for name in ("subscribe", "subscribepattern", "assign") if name in opts]
    if len(given) != 1:
        raise ConfigError(
            "give exactly one of the options subscribe, subscribePattern or assign "
            f"(got {len(given)})"
        )
    (kind,) = given
    raw = opts[kind]
    if kind == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
        if not topics:
            raise ConfigError("invalid value for option subscribe: no topic given")
        return TopicSelection(topics=topics)
    if kind == "subscribepattern":
        try:
            re.compile(raw)
        except re.error as exc:
            raise ConfigError(f"invalid regular expression in subscribePattern: {exc}") from None
        return TopicSelection(pattern=raw)
    return TopicSelection(assigned=parse_assign(raw))


def parse_offset_spec(name: str, raw: str, *, default: str, allow: tuple[int, ...]) -> OffsetSpec:
    """``earliest``, ``latest`` or Spark's JSON per partition. ``allow`` lists which of
    EARLIEST/LATEST the option accepts (Spark: no "latest" start and no "earliest" end in
    batch queries)."""
    text = raw.strip()
    if text.lower() in _STRATEGIES:
        strategy = text.lower()
        if (EARLIEST if strategy == "earliest" else LATEST) not in allow:
            raise ConfigError(f"option {name}={strategy} is not allowed for this query")
        return OffsetSpec(strategy)
    parsed = _json_object(name, text)
    specific: dict[TopicPartition, int] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise ConfigError(
                f"invalid value for option {name}: topic {topic!r} needs an object "
                '{"partition": offset}'
            )
        for partition, offset in partitions.items():
            number = _partition_number(name, topic, partition)
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
                raise ConfigError(
                    f"invalid offset {offset!r} for {topic}-{number} in option {name} "
                    "(an offset >= 0, -2 for earliest or -1 for latest)"
                )
            if offset < 0 and offset not in allow:
                word = "earliest (-2)" if offset == EARLIEST else "latest (-1)"
                raise ConfigError(f"{word} for {topic}-{number} is not allowed in option {name}")
            specific[TopicPartition(topic, number)] = offset
    return OffsetSpec(default, specific)


def parse_reader_options(options: Mapping[str, str], *, streaming: bool) -> ReaderOptions:
    """Validate a reader's options; ``streaming`` selects Spark's rules for readStream."""
    opts = _lower(options)
    bootstrap = _bootstrap(opts)
    selection = parse_selection(opts)
    client = _client_properties(opts)
    consumer_config({**client, "bootstrap.servers": bootstrap})  # names a bad key early
    if streaming:
        if "endingoffsets" in opts:
            raise ConfigError("option endingOffsets is for batch queries only")
        starting = parse_offset_spec(
            "startingOffsets",
            opts.get("startingoffsets", defaults.STREAMING_STARTING_OFFSETS),
            default=defaults.STREAMING_STARTING_OFFSETS,
            allow=(EARLIEST, LATEST),
        )
        ending = None
    else:
        starting = parse_offset_spec(
            "startingOffsets",
            opts.get("startingoffsets", defaults.BATCH_STARTING_OFFSETS),
            default=defaults.BATCH_STARTING_OFFSETS,
            allow=(EARLIEST,),
        )
        ending = parse_offset_spec(
            "endingOffsets",
            opts.get("endingoffsets", defaults.BATCH_ENDING_OFFSETS),
            default=defaults.BATCH_ENDING_OFFSETS,
            allow=(LATEST,),
        )
    strategy = opts.get("startingoffsetsbytimestampstrategy", defaults.TIMESTAMP_STRATEGY)
    strategy = strategy.strip().lower()
    if strategy not in ("error", "latest"):
        raise ConfigError(
            f"invalid value for option startingOffsetsByTimestampStrategy: {strategy!r} "
            "(expected error or latest)"
        )
    poll_timeout = _parse_int("pollTimeoutMs", opts.get("polltimeoutms"), 1)
    return ReaderOptions(
        bootstrap_servers=bootstrap,
        selection=selection,
        starting=starting,
        ending=ending,
        starting_timestamp=_parse_int("startingTimestamp", opts.get("startingtimestamp"), 0),
        timestamp_strategy=strategy,
        max_offsets_per_trigger=_parse_int(
            "maxOffsetsPerTrigger", opts.get("maxoffsetspertrigger"), 1
        ),
        fail_on_data_loss=parse_bool(
            "failOnDataLoss", opts.get("failondataloss"), defaults.FAIL_ON_DATA_LOSS
        ),
        include_headers=parse_bool("includeHeaders", opts.get("includeheaders"), False),
        poll_timeout_ms=defaults.POLL_TIMEOUT_MS if poll_timeout is None else poll_timeout,
        client_properties=client,
    )


def parse_writer_options(options: Mapping[str, str]) -> WriterOptions:
    """Validate a writer's options (``topic`` and ``fjord.`` producer properties)."""
    opts = _lower(options)
    bootstrap = _bootstrap(opts)
    client = _client_properties(opts)
    topic = opts.get("topic")
    if topic is not None and not topic.strip():
        raise ConfigError("invalid value for option topic: empty")
    writer = WriterOptions(bootstrap, topic.strip() if topic else None, client)
    producer_config(writer.producer_config())  # names a bad key early
    return writer
