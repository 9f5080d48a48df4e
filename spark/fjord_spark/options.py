"""Parsing and validation of the data source's options (pure: no I/O).

The names and meanings follow Spark's Kafka source (see docs/spark.md): a query selects topics
with exactly one of ``subscribe``, ``subscribePattern`` or ``assign``; offsets are ``earliest``,
``latest`` or Spark's JSON (``{"topic": {"0": 42, "1": -2}}``, -2 = earliest, -1 = latest);
client properties pass through with Spark's ``kafka.`` prefix (``kafka.fetch.max.bytes``,
``kafka.security.protocol``; ``fjord.`` is accepted too) and are validated by the client's own
configuration table. An option that is neither known nor prefixed is refused, naming the
closest known option: nothing is accepted and ignored (Spark's Kafka source silently ignores a
typo such as ``startingOffset``). Every problem raises :class:`fjord.errors.ConfigError` naming
the option.
"""

from __future__ import annotations

import difflib
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fjord.client.types import TopicPartition
from fjord.config import ADMIN_CONFIG, CONSUMER_CONFIG, consumer_config, producer_config
from fjord.errors import ConfigError
from fjord_spark import defaults

#: Prefixes of client properties passed through to fjord.client: Spark's Kafka source's
#: "kafka." and this project's older "fjord." (both mean the same).
CLIENT_PREFIXES = ("kafka.", "fjord.")

#: Reader options (Spark's spelling; Spark hands them to the source lower-cased).
READER_OPTIONS = (
    "bootstrap.servers",
    "subscribe",
    "subscribePattern",
    "assign",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "minPartitions",
    "maxRecordsPerPartition",
    "failOnDataLoss",
    "includeHeaders",
    "pollTimeoutMs",
    "kafkaConsumer.pollTimeoutMs",
    "groupIdPrefix",
)

#: Options only a streaming query reads (a batch query refuses them rather than ignore them).
STREAMING_ONLY = (
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "groupIdPrefix",
    "kafka.group.id",
)

#: Options only a batch query reads.
BATCH_ONLY = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")

#: Writer options, and the ones Spark itself adds to a streaming writer's options.
WRITER_OPTIONS = ("bootstrap.servers", "topic", "exactlyOnce", "transactionalIdPrefix")
SPARK_WRITER_OPTIONS = ("checkpointLocation", "queryName")

#: Client properties the source sets itself; Spark's Kafka source refuses the same ones.
_SOURCE_OWNED_CLIENT_KEYS = {
    "auto.offset.reset": "use the option startingOffsets (or startingTimestamp) instead",
    "enable.auto.commit": "the source commits each micro-batch's end itself (kafka.group.id)",
    "group.instance.id": "the source's group only receives commits; it has no members",
}

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
    """Validated reader options. ``client_properties`` holds the ``kafka.``/``fjord.``
    properties without the prefix (and without bootstrap.servers and group.id); they were
    checked against the consumer's configuration table at parse time. ``group_id`` is the
    consumer group a streaming query reports its committed micro-batches to (``kafka.group.id``,
    or ``groupIdPrefix`` plus a random suffix), None when neither was given.

    Invariants: at most one of ``starting_timestamp`` / ``starting_by_timestamp`` is set (and
    likewise for the ending ones); ``min_offsets_per_trigger`` <= ``max_offsets_per_trigger``
    when both are set."""

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
    starting_by_timestamp: Mapping[TopicPartition, int] | None = None
    ending_timestamp: int | None = None
    ending_by_timestamp: Mapping[TopicPartition, int] | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = defaults.MAX_TRIGGER_DELAY_MS
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    group_id: str | None = None

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

    def group_committer_config(self) -> dict[str, Any]:
        """The consumer that commits micro-batch ends to ``group_id`` (never joins the group:
        simple commits, no auto commit)."""
        config = self.driver_consumer_config()
        config["group.id"] = self.group_id
        config["enable.auto.commit"] = False
        return config

    def admin_config(self) -> dict[str, Any]:
        config = {k: v for k, v in self.client_properties.items() if k in ADMIN_CONFIG}
        config["bootstrap.servers"] = self.bootstrap_servers
        return config


#: Client properties the exactly-once sink's marker reader takes from the writer's options: the
#: ones every client shares (security, client.id, timeouts), none of the producer's own.
_MARKER_READER_KEYS = frozenset(ADMIN_CONFIG) & frozenset(CONSUMER_CONFIG)


@dataclass(frozen=True)
class WriterOptions:
    """Validated writer options: ``topic`` (overrides a topic column) and the producer's
    properties (checked against the producer's configuration table)."""

    bootstrap_servers: str
    topic: str | None
    client_properties: Mapping[str, str]
    #: ``exactlyOnce``: each streaming write task writes in a transaction (docs/spark.md).
    exactly_once: bool = False
    #: ``transactionalIdPrefix``: start of every transactional.id the exactly-once sink derives.
    transactional_id_prefix: str = defaults.TRANSACTIONAL_ID_PREFIX

    def producer_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "acks": defaults.WRITER_ACKS,
            "batch.size": defaults.WRITER_BATCH_SIZE,
        }
        config.update(self.client_properties)
        config["bootstrap.servers"] = self.bootstrap_servers
        return config

    def transactional_producer_config(self, transactional_id: str) -> dict[str, Any]:
        """The producer of one exactly-once write task (acks=all, idempotent, transactional)."""
        config = self.producer_config()
        config.update({"transactional.id": transactional_id, "acks": "all"})
        return config

    def marker_reader_config(self, transactional_id: str) -> dict[str, Any]:
        """A consumer that reads back the batch marker a write task's transaction commits (in
        the group named like the transactional id), seeing only committed offsets."""
        config: dict[str, Any] = {
            k: v for k, v in self.client_properties.items() if k in _MARKER_READER_KEYS
        }
        config.update(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "group.id": transactional_id,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        return config


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    # Spark's options are case-insensitive; so are ours.
    return {str(k).lower(): str(v) for k, v in options.items()}


def _client_key(option: str) -> str | None:
    """The client property an option names (``kafka.x`` / ``fjord.x`` -> ``x``), else None."""
    for prefix in CLIENT_PREFIXES:
        if option.startswith(prefix) and len(option) > len(prefix):
            return option[len(prefix) :]
    return None


def check_known_options(opts: Mapping[str, str], known: tuple[str, ...], what: str) -> None:
    """Refuse every option (lower-cased, as Spark passes them) that is neither in ``known`` nor
    a client property, naming it and the closest known option (difflib)."""
    by_lower = {name.lower(): name for name in known}
    for option in sorted(opts):
        if option in by_lower or _client_key(option) is not None:
            continue
        if option == "path":
            raise ConfigError(
                f"the fjord {what} takes no path (load()/save()/start() with a path): name "
                "topics with the options instead"
            )
        close = difflib.get_close_matches(option, list(by_lower), n=1, cutoff=0.6)
        hint = f"; did you mean {by_lower[close[0]]!r}?" if close else ""
        raise ConfigError(f"unknown option {option!r} for the fjord {what}{hint}")


def _bootstrap(opts: Mapping[str, str]) -> str:
    given = {
        name: opts[name].strip()
        for name in ("bootstrap.servers", *(p + "bootstrap.servers" for p in CLIENT_PREFIXES))
        if opts.get(name, "").strip()
    }
    if len(set(given.values())) > 1:
        shown = ", ".join(f"{k}={v!r}" for k, v in given.items())
        raise ConfigError(f"options {shown} disagree: give one")
    if not given:
        raise ConfigError(
            "missing option bootstrap.servers (or kafka.bootstrap.servers): "
            "the brokers to connect to, host:port[,host:port...]"
        )
    return next(iter(given.values()))


def _client_properties(opts: Mapping[str, str]) -> dict[str, str]:
    """Client properties without their prefix. The same key under both prefixes with different
    values or a key the source sets itself is refused naming the option."""
    out: dict[str, str] = {}
    origin: dict[str, str] = {}
    for option, value in sorted(opts.items()):
        key = _client_key(option)
        if key is None or key == "bootstrap.servers":
            continue
        if key in out and out[key] != value:
            raise ConfigError(f"options {origin[key]} and {option} disagree: give one")
        out[key], origin[key] = value, option
    return out


def _validated(check: Any, properties: Mapping[str, Any]) -> None:
    """Run a client configuration check, naming the options in its error."""
    try:
        check(properties)
    except ConfigError as exc:
        raise ConfigError(f"invalid client option (kafka.<property>): {exc}") from None


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


_DURATION_UNITS_MS = {
    "us": 0.001,
    "ms": 1,
    "s": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
}


def parse_duration_ms(name: str, raw: str) -> int:
    """Spark's time strings (``JavaUtils.timeStringAsMs``): ``15m``, ``30s``, ``100ms``,
    ``1h``, ``2d``; a bare number is milliseconds."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", raw.lower())
    if match is None or match.group(2) not in ("", *_DURATION_UNITS_MS):
        raise ConfigError(
            f"invalid value for option {name}: {raw!r} (expected a duration such as 15m, 30s, "
            "500ms or a number of milliseconds)"
        )
    number, unit = int(match.group(1)), match.group(2) or "ms"
    return int(number * _DURATION_UNITS_MS[unit])


def parse_timestamps_json(name: str, raw: str) -> dict[TopicPartition, int]:
    """``{"topic": {"0": 1700000000000}}``: a timestamp (ms since the epoch) per partition."""
    out: dict[TopicPartition, int] = {}
    for topic, partitions in _json_object(name, raw).items():
        if not isinstance(partitions, dict) or not partitions:
            raise ConfigError(
                f"invalid value for option {name}: topic {topic!r} needs an object "
                '{"partition": timestamp}'
            )
        for partition, stamp in partitions.items():
            number = _partition_number(name, topic, partition)
            if not isinstance(stamp, int) or isinstance(stamp, bool) or stamp < 0:
                raise ConfigError(
                    f"invalid timestamp {stamp!r} for {topic}-{number} in option {name} "
                    "(milliseconds since the epoch, >= 0)"
                )
            out[TopicPartition(topic, number)] = stamp
    if not out:
        raise ConfigError(f"invalid value for option {name}: no partition given")
    return out


def _one_of(opts: Mapping[str, str], *names: str) -> None:
    given = [n for n in names if n.lower() in opts]
    if len(given) > 1:
        raise ConfigError(f"give only one of the options {', '.join(given)} (got {len(given)})")


def _group_id(opts: Mapping[str, str]) -> str | None:
    """``kafka.group.id`` as given, or ``groupIdPrefix`` plus a random suffix (Spark's rule for
    generated group ids), or None (no reporting)."""
    _one_of(opts, "kafka.group.id", "groupIdPrefix")
    if "kafka.group.id" in opts:
        group = opts["kafka.group.id"].strip()
        if not group:
            raise ConfigError("invalid value for option kafka.group.id: empty")
        return group
    if "groupidprefix" in opts:
        prefix = opts["groupidprefix"].strip()
        if not prefix:
            raise ConfigError("invalid value for option groupIdPrefix: empty")
        return f"{prefix}-{uuid.uuid4()}"
    return None


def parse_reader_options(options: Mapping[str, str], *, streaming: bool) -> ReaderOptions:
    """Validate a reader's options; ``streaming`` selects Spark's rules for readStream."""
    opts = _lower(options)
    check_known_options(opts, READER_OPTIONS, "source")
    kind = "streaming" if streaming else "batch"
    wrong = BATCH_ONLY if streaming else STREAMING_ONLY
    for name in wrong:
        if name.lower() in opts:
            other = "batch" if streaming else "streaming"
            raise ConfigError(f"option {name} is for {other} queries only (this is a {kind} query)")
    bootstrap = _bootstrap(opts)
    selection = parse_selection(opts)
    client = _client_properties(opts)
    if "fjord.group.id" in opts:
        raise ConfigError("use the option kafka.group.id (Spark's name) for the report group")
    group_id = _group_id(opts) if streaming else None
    client.pop("group.id", None)
    for key, why in _SOURCE_OWNED_CLIENT_KEYS.items():
        if key in client:
            raise ConfigError(f"option kafka.{key} is not allowed in the fjord source: {why}")
    _validated(consumer_config, {**client, "bootstrap.servers": bootstrap})
    if streaming:
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
    _one_of(opts, "startingTimestamp", "startingOffsetsByTimestamp")
    _one_of(opts, "endingTimestamp", "endingOffsetsByTimestamp")
    strategy = opts.get("startingoffsetsbytimestampstrategy", defaults.TIMESTAMP_STRATEGY)
    strategy = strategy.strip().lower()
    if strategy not in ("error", "latest"):
        raise ConfigError(
            f"invalid value for option startingOffsetsByTimestampStrategy: {strategy!r} "
            "(expected error or latest)"
        )
    _one_of(opts, "pollTimeoutMs", "kafkaConsumer.pollTimeoutMs")
    poll_timeout = _parse_int(
        "pollTimeoutMs", opts.get("polltimeoutms", opts.get("kafkaconsumer.polltimeoutms")), 1
    )
    max_per_trigger = _parse_int("maxOffsetsPerTrigger", opts.get("maxoffsetspertrigger"), 1)
    min_per_trigger = _parse_int("minOffsetsPerTrigger", opts.get("minoffsetspertrigger"), 1)
    if (
        min_per_trigger is not None
        and max_per_trigger is not None
        and min_per_trigger > max_per_trigger
    ):
        raise ConfigError(
            f"option minOffsetsPerTrigger ({min_per_trigger}) is above maxOffsetsPerTrigger "
            f"({max_per_trigger})"
        )
    if "maxtriggerdelay" in opts and min_per_trigger is None:
        raise ConfigError("option maxTriggerDelay only applies with minOffsetsPerTrigger")
    delay = opts.get("maxtriggerdelay")
    by_start = opts.get("startingoffsetsbytimestamp")
    by_end = opts.get("endingoffsetsbytimestamp")
    return ReaderOptions(
        bootstrap_servers=bootstrap,
        selection=selection,
        starting=starting,
        ending=ending,
        starting_timestamp=_parse_int("startingTimestamp", opts.get("startingtimestamp"), 0),
        timestamp_strategy=strategy,
        max_offsets_per_trigger=max_per_trigger,
        fail_on_data_loss=parse_bool(
            "failOnDataLoss", opts.get("failondataloss"), defaults.FAIL_ON_DATA_LOSS
        ),
        include_headers=parse_bool("includeHeaders", opts.get("includeheaders"), False),
        poll_timeout_ms=defaults.POLL_TIMEOUT_MS if poll_timeout is None else poll_timeout,
        client_properties=client,
        starting_by_timestamp=(
            None
            if by_start is None
            else parse_timestamps_json("startingOffsetsByTimestamp", by_start)
        ),
        ending_timestamp=_parse_int("endingTimestamp", opts.get("endingtimestamp"), 0),
        ending_by_timestamp=(
            None if by_end is None else parse_timestamps_json("endingOffsetsByTimestamp", by_end)
        ),
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=(
            defaults.MAX_TRIGGER_DELAY_MS
            if delay is None
            else parse_duration_ms("maxTriggerDelay", delay)
        ),
        min_partitions=_parse_int("minPartitions", opts.get("minpartitions"), 1),
        max_records_per_partition=_parse_int(
            "maxRecordsPerPartition", opts.get("maxrecordsperpartition"), 1
        ),
        group_id=group_id,
    )


def parse_writer_options(options: Mapping[str, str]) -> WriterOptions:
    """Validate a writer's options (``topic`` and ``kafka.``/``fjord.`` producer properties)."""
    opts = _lower(options)
    check_known_options(opts, WRITER_OPTIONS + SPARK_WRITER_OPTIONS, "sink")
    bootstrap = _bootstrap(opts)
    client = _client_properties(opts)
    topic = opts.get("topic")
    if topic is not None and not topic.strip():
        raise ConfigError("invalid value for option topic: empty")
    if "transactional.id" in client:
        raise ConfigError(
            "the fjord sink derives transactional ids itself: set exactlyOnce=true (and "
            "optionally transactionalIdPrefix) instead of kafka.transactional.id"
        )
    prefix = opts.get("transactionalidprefix", defaults.TRANSACTIONAL_ID_PREFIX).strip()
    if not prefix:
        raise ConfigError("invalid value for option transactionalIdPrefix: empty")
    writer = WriterOptions(
        bootstrap,
        topic.strip() if topic else None,
        client,
        exactly_once=parse_bool("exactlyOnce", opts.get("exactlyonce"), False),
        transactional_id_prefix=prefix,
    )
    _validated(producer_config, writer.producer_config())
    return writer
