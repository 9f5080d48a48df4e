"""Client configuration: every property the Fjord clients accept, with Kafka's names and defaults.

A client is configured with a plain dict (``{"bootstrap.servers": "host:port", "acks": "all"}``).
:func:`producer_config`, :func:`consumer_config` and :func:`admin_config` check it against the
definitions below and return a :class:`ClientConfig` holding every property (defaults filled in,
values converted to their types). An unknown key or an invalid value raises
:class:`fjord.errors.ConfigError` whose message names the key: bad input fails at construction,
never later in a background thread.

This module is the single place where client defaults live (ports, timeouts, sizes); the tables
in ``docs/clients.md`` list the same definitions (a unit test checks they agree).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fjord.cluster.defaults import DEFAULT_BROKER_PORT
from fjord.errors import ConfigError
from fjord.groups.defaults import (
    CONSUMER_HEARTBEAT_INTERVAL_MS,
    CONSUMER_MAX_POLL_INTERVAL_MS,
    CONSUMER_SESSION_TIMEOUT_MS,
)
from fjord.security import ClientSecurity

DEFAULT_BOOTSTRAP_PORT = DEFAULT_BROKER_PORT
"""Port assumed for a bootstrap address given without one: the brokers' default (Kafka's 9092)."""

DEFAULT_BOOTSTRAP_SERVERS = f"localhost:{DEFAULT_BOOTSTRAP_PORT}"
"""The CLI's last resort when neither ``--bootstrap-server``, ``FJORD_BOOTSTRAP_SERVERS`` nor a
running ``fjord local`` cluster names one."""

BOOTSTRAP_ENV_VAR = "FJORD_BOOTSTRAP_SERVERS"
"""Environment variable the CLI reads the bootstrap servers from (before the local cluster)."""

COMPRESSION_TYPES = ("none", "gzip", "snappy", "lz4", "zstd")
OFFSET_RESET_POLICIES = ("earliest", "latest", "none")
ISOLATION_LEVELS = ("read_uncommitted", "read_committed")

METADATA_REFRESH_BACKOFF_MS = 50
"""Shortest interval between two metadata refreshes triggered by errors (Kafka's 50 ms)."""

CHANNEL_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""gRPC send/receive limit on client channels; requests are bounded far lower by
``max.request.size`` and ``fetch.max.bytes``, this only lifts gRPC's 4 MiB default."""


@dataclass(frozen=True, slots=True)
class ConfigDef:
    """One property: its Kafka name, default, converter and documentation.

    Invariant: ``parse(default)`` succeeds, i.e. every default is itself a valid value.
    """

    name: str
    default: Any
    parse: Callable[[str, Any], Any]
    doc: str


def _int(lo: int | None = None, hi: int | None = None) -> Callable[[str, Any], int]:
    def parse(key: str, raw: Any) -> int:
        if isinstance(raw, bool):
            raise ConfigError(f"invalid value {raw!r} for {key}: expected an integer")
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"invalid value {raw!r} for {key}: expected an integer") from None
        if lo is not None and value < lo:
            raise ConfigError(f"invalid value {raw!r} for {key}: must be at least {lo}")
        if hi is not None and value > hi:
            raise ConfigError(f"invalid value {raw!r} for {key}: must be at most {hi}")
        return value

    return parse


def _bool(key: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise ConfigError(f"invalid value {raw!r} for {key}: expected true or false")


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def parse(key: str, raw: Any) -> str:
        value = str(raw).strip().lower()
        if value not in choices:
            raise ConfigError(f"invalid value {raw!r} for {key}: expected one of {list(choices)}")
        return value

    return parse


def _string(key: str, raw: Any) -> str:
    if not isinstance(raw, str):
        raise ConfigError(f"invalid value {raw!r} for {key}: expected a string")
    return raw


def _optional_string(key: str, raw: Any) -> str | None:
    return None if raw is None else _string(key, raw)


def parse_host_port(address: str, key: str = "bootstrap.servers") -> tuple[str, int]:
    """``host:port`` (or ``host`` alone, meaning port 9092; ``[v6]:port`` too) as a tuple."""
    address = address.strip()
    if not address:
        raise ConfigError(f"invalid value for {key}: empty address")
    host, port_text = address, str(DEFAULT_BOOTSTRAP_PORT)
    if address.startswith("["):
        end = address.find("]")
        if end < 0:
            raise ConfigError(f"invalid value {address!r} for {key}: unclosed '['")
        host, rest = address[1:end], address[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ConfigError(f"invalid value {address!r} for {key}: expected [host]:port")
            port_text = rest[1:]
    elif ":" in address:
        host, _, port_text = address.rpartition(":")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"invalid value {address!r} for {key}: port is not a number") from None
    if not host or not 0 < port < 65536:
        raise ConfigError(f"invalid value {address!r} for {key}: expected host:port")
    return host, port


def _bootstrap(key: str, raw: Any) -> tuple[tuple[str, int], ...]:
    items = raw.split(",") if isinstance(raw, str) else list(raw) if raw is not None else []
    servers = tuple(parse_host_port(str(item), key) for item in items if str(item).strip())
    if not servers:
        raise ConfigError(f"missing value for {key}: give at least one host:port")
    return servers


def _acks(key: str, raw: Any) -> int:
    text = str(raw).strip().lower()
    if text == "all" or text == "-1":
        return -1
    if text in ("0", "1"):
        return int(text)
    raise ConfigError(f"invalid value {raw!r} for {key}: expected 0, 1, all or -1")


_COMMON = (
    ConfigDef("bootstrap.servers", None, _bootstrap, "First brokers to ask: host:port,..."),
    ConfigDef("client.id", "fjord-client", _string, "Name sent for logging and metrics."),
    ConfigDef("request.timeout.ms", 30000, _int(1), "Longest wait for one request's answer."),
    ConfigDef("retry.backoff.ms", 100, _int(0), "Pause before retrying a failed request."),
    ConfigDef("metadata.max.age.ms", 300000, _int(0), "Refresh metadata at least this often."),
    # Security (Kafka's names; validated together by fjord.security.ClientSecurity).
    ConfigDef("security.protocol", "PLAINTEXT", _string,
              "PLAINTEXT, SSL (TLS), SASL_SSL or SASL_PLAINTEXT (SCRAM on the SASL gRPC doors)."),
    ConfigDef("ssl.ca.location", None, _optional_string, "PEM CA certificates to trust."),
    ConfigDef("ssl.certificate.location", None, _optional_string, "PEM client certificate."),
    ConfigDef("ssl.key.location", None, _optional_string, "PEM private key of that certificate."),
    ConfigDef("ssl.key.password", None, _optional_string, "Refused: keys must be unencrypted."),
    ConfigDef(
        "ssl.endpoint.identification.algorithm", "https", _string,
        "https: the server's certificate must name the host dialled (the only choice).",
    ),
    ConfigDef("sasl.mechanism", None, _optional_string, "SCRAM-SHA-256 or SCRAM-SHA-512."),
    ConfigDef("sasl.username", None, _optional_string, "The SCRAM user (with SASL)."),
    ConfigDef("sasl.password", None, _optional_string, "Its password (with SASL)."),
)

_PRODUCER = (
    ConfigDef("acks", "all", _acks, "Replicas that must have a batch before it is acknowledged."),
    ConfigDef(
        "retries",
        2147483647,
        _int(0),
        "Retries of a failed batch.",
    ),
    ConfigDef("delivery.timeout.ms", 120000, _int(1), "Bound from send() to outcome."),
    ConfigDef("batch.size", 16384, _int(1), "Target size in bytes of one partition's batch."),
    ConfigDef("linger.ms", 5, _int(0), "Wait this long for more records before sending a batch."),
    ConfigDef("compression.type", "none", _choice(*COMPRESSION_TYPES), "Codec of batches."),
    ConfigDef(
        "enable.idempotence",
        True,
        _bool,
        "Exactly one copy of each record per partition, in order (needs acks=all).",
    ),
    ConfigDef(
        "max.in.flight.requests.per.connection",
        5,
        _int(1),
        "Unanswered requests per broker.",
    ),
    ConfigDef("buffer.memory", 33554432, _int(1024), "Bytes of records waiting to be sent."),
    ConfigDef("max.block.ms", 60000, _int(0), "Longest block of send()."),
    ConfigDef("max.request.size", 1048576, _int(1), "Largest Produce request."),
    ConfigDef(
        "blocked.batch.size", 524288, _int(0),
        "Fjord's: largest batch an idempotent producer builds while the partition's 5-batch "
        "window is full (at most max.request.size; batch.size or less turns growth off).",
    ),
    ConfigDef(
        "allow.auto.create.topics", True, _bool,
        "Kafka's; no effect: Fjord's brokers never create topics.",
    ),
    ConfigDef("partitioner.ignore.keys", False, _bool, "Sticky-partition keyed records too."),
    ConfigDef(
        "transactional.id", None, _optional_string,
        "Makes the producer transactional (init_transactions() first); needs idempotence.",
    ),
    ConfigDef(
        "transaction.timeout.ms", 60000, _int(1),
        "The coordinator aborts a transaction open longer than this.",
    ),
)

ASSIGNMENT_STRATEGIES = ("range", "roundrobin", "sticky", "cooperative-sticky")
"""Names ``partition.assignment.strategy`` accepts (Kafka's assignor class names map to them)."""

_ASSIGNOR_CLASS_NAMES = {
    "rangeassignor": "range",
    "roundrobinassignor": "roundrobin",
    "stickyassignor": "sticky",
    "cooperativestickyassignor": "cooperative-sticky",
}

DEFAULT_AUTO_COMMIT_INTERVAL_MS = 5000
"""``auto.commit.interval.ms`` (Kafka's): how often consumed positions are committed."""


def _non_empty_string(key: str, raw: Any) -> str | None:
    if raw is None:
        return None
    value = _string(key, raw)
    if not value.strip():
        raise ConfigError(f"invalid value {raw!r} for {key}: must not be empty")
    return value


def _strategies(key: str, raw: Any) -> tuple[str, ...]:
    """A comma-separated list (or a list) of assignor names, most preferred first."""
    items = raw.split(",") if isinstance(raw, str) else list(raw) if raw is not None else []
    names: list[str] = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        name = _ASSIGNOR_CLASS_NAMES.get(text.rsplit(".", 1)[-1].lower(), text.lower())
        if name not in ASSIGNMENT_STRATEGIES:
            raise ConfigError(
                f"invalid value {raw!r} for {key}: unknown assignor {text!r}; "
                f"expected some of {list(ASSIGNMENT_STRATEGIES)}"
            )
        if name not in names:
            names.append(name)
    if not names:
        raise ConfigError(f"missing value for {key}: name at least one assignor")
    return tuple(names)


_CONSUMER = (
    ConfigDef("group.id", None, _non_empty_string, "Consumer group this consumer belongs to."),
    ConfigDef(
        "group.instance.id",
        None,
        _non_empty_string,
        "Static membership: a restart within session.timeout.ms keeps the partitions.",
    ),
    ConfigDef("auto.offset.reset", "latest", _choice(*OFFSET_RESET_POLICIES), "Where to start."),
    ConfigDef(
        "enable.auto.commit",
        True,
        _bool,
        "Commit positions in the background (off without group.id).",
    ),
    ConfigDef(
        "auto.commit.interval.ms",
        DEFAULT_AUTO_COMMIT_INTERVAL_MS,
        _int(0),
        "How often auto commit runs.",
    ),
    ConfigDef(
        "enable.auto.offset.store",
        True,
        _bool,
        "poll() stores positions for auto commit; false: only store_offsets() does.",
    ),
    ConfigDef(
        "session.timeout.ms",
        CONSUMER_SESSION_TIMEOUT_MS,
        _int(1),
        "Without heartbeats this long the coordinator drops the member.",
    ),
    ConfigDef(
        "heartbeat.interval.ms",
        CONSUMER_HEARTBEAT_INTERVAL_MS,
        _int(1),
        "Time between heartbeats (below session.timeout.ms).",
    ),
    ConfigDef(
        "max.poll.interval.ms",
        CONSUMER_MAX_POLL_INTERVAL_MS,
        _int(1),
        "Longest time between poll() calls before the member leaves the group.",
    ),
    ConfigDef(
        "partition.assignment.strategy",
        "range,cooperative-sticky",
        _strategies,
        "Assignors, most preferred first.",
    ),
    ConfigDef("fetch.min.bytes", 1, _int(0), "The broker waits until it has this many bytes."),
    ConfigDef("fetch.max.wait.ms", 500, _int(0), "...or until this much time has passed."),
    ConfigDef("fetch.max.bytes", 52428800, _int(0), "Most bytes one Fetch response carries."),
    ConfigDef("max.partition.fetch.bytes", 1048576, _int(0), "Most bytes per partition per Fetch."),
    ConfigDef("max.poll.records", 500, _int(1), "Most records one poll() returns."),
    ConfigDef("isolation.level", "read_uncommitted", _choice(*ISOLATION_LEVELS), "Isolation."),
    ConfigDef(
        "allow.auto.create.topics", False, _bool,
        "Kafka's; no effect: Fjord's brokers never create topics.",
    ),
)

_ADMIN = (ConfigDef("default.api.timeout.ms", 60000, _int(1), "Bound of one admin call."),)

PRODUCER_CONFIG: dict[str, ConfigDef] = {d.name: d for d in _COMMON + _PRODUCER}
CONSUMER_CONFIG: dict[str, ConfigDef] = {d.name: d for d in _COMMON + _CONSUMER}
ADMIN_CONFIG: dict[str, ConfigDef] = {d.name: d for d in _COMMON + _ADMIN}


class ClientConfig(Mapping[str, Any]):
    """A validated client configuration: every defined key, each value of its parsed type.

    Invariants: the keys are exactly those of the definitions it was built from; values are
    immutable (ints, strings, booleans, tuples). Read with ``config["linger.ms"]``.
    """

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"ClientConfig({self._values!r})"


def parse_config(definitions: Mapping[str, ConfigDef], raw: Mapping[str, Any]) -> ClientConfig:
    """Check ``raw`` against ``definitions``: ConfigError names the first bad key."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"configuration must be a dict, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in definitions)
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(definitions), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown configuration key {unknown[0]!r}{hint}")
    values: dict[str, Any] = {}
    for name, definition in definitions.items():
        if name in raw:
            values[name] = definition.parse(name, raw[name])
        elif definition.default is None and name == "bootstrap.servers":
            raise ConfigError("missing value for bootstrap.servers: give at least one host:port")
        elif definition.default is None:
            values[name] = None
        else:
            values[name] = definition.parse(name, definition.default)
    if "security.protocol" in definitions:
        ClientSecurity.from_config(values)  # SecurityConfigError names the key
    return ClientConfig(values)


def producer_config(raw: Mapping[str, Any]) -> ClientConfig:
    """Validated producer configuration (see :data:`PRODUCER_CONFIG`)."""
    config = parse_config(PRODUCER_CONFIG, raw)
    if config["delivery.timeout.ms"] < config["linger.ms"] + config["request.timeout.ms"]:
        raise ConfigError(
            "invalid value for delivery.timeout.ms: must be at least linger.ms + request.timeout.ms"
        )
    return _resolve_idempotence(config, raw)


MAX_IN_FLIGHT_FOR_IDEMPOTENCE = 5
"""Most unanswered requests per broker an idempotent producer may have: brokers remember the
last 5 batches of each producer, so a retry of anything older could not be recognised."""


def _resolve_idempotence(config: ClientConfig, raw: Mapping[str, Any]) -> ClientConfig:
    """Kafka's rules: idempotence needs acks=all, retries > 0 and at most 5 requests in flight.
    Asked for explicitly with a conflicting setting: ConfigError naming that setting. On by
    default only: a conflicting setting the user chose turns idempotence off instead."""
    if config.get("transactional.id") is not None:
        if not config["enable.idempotence"]:
            raise ConfigError(
                "invalid value False for enable.idempotence: a producer with a "
                "transactional.id is idempotent"
            )
        if "enable.idempotence" not in raw:
            raw = {**raw, "enable.idempotence": True}  # conflicts below are then errors
    if not config["enable.idempotence"]:
        return config
    conflicts = []
    if config["acks"] != -1:
        conflicts.append(("acks", "must be all (-1) when enable.idempotence is true"))
    if config["retries"] == 0:
        conflicts.append(("retries", "must be greater than 0 when enable.idempotence is true"))
    if config["max.in.flight.requests.per.connection"] > MAX_IN_FLIGHT_FOR_IDEMPOTENCE:
        conflicts.append(
            (
                "max.in.flight.requests.per.connection",
                f"must be at most {MAX_IN_FLIGHT_FOR_IDEMPOTENCE} when enable.idempotence is true",
            )
        )
    if not conflicts:
        return config
    if "enable.idempotence" in raw:
        key, why = conflicts[0]
        raise ConfigError(f"invalid value {raw.get(key)!r} for {key}: {why}")
    values = dict(config)
    values["enable.idempotence"] = False
    return ClientConfig(values)


def consumer_config(raw: Mapping[str, Any]) -> ClientConfig:
    """Validated consumer configuration (see :data:`CONSUMER_CONFIG`)."""
    config = parse_config(CONSUMER_CONFIG, raw)
    if config["fetch.max.wait.ms"] >= config["request.timeout.ms"]:
        raise ConfigError("invalid value for fetch.max.wait.ms: must be below request.timeout.ms")
    if config["heartbeat.interval.ms"] >= config["session.timeout.ms"]:
        raise ConfigError(
            "invalid value for heartbeat.interval.ms: must be below session.timeout.ms"
        )
    if config["group.id"] is None:
        # Kafka's rules: without a group there is nothing to commit to and no membership.
        if config["group.instance.id"] is not None:
            raise ConfigError("invalid value for group.instance.id: needs a group.id")
        if "enable.auto.commit" in raw and config["enable.auto.commit"]:
            raise ConfigError("invalid value for enable.auto.commit: true needs a group.id")
        values = dict(config)
        values["enable.auto.commit"] = False
        return ClientConfig(values)
    return config


def admin_config(raw: Mapping[str, Any]) -> ClientConfig:
    """Validated admin client configuration (see :data:`ADMIN_CONFIG`)."""
    return parse_config(ADMIN_CONFIG, raw)


def bootstrap_from_environment() -> str | None:
    """``FJORD_BOOTSTRAP_SERVERS`` when set and not empty."""
    value = os.environ.get(BOOTSTRAP_ENV_VAR, "").strip()
    return value or None
