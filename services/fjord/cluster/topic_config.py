"""Topic config validation and description, pure.

Precedence, lowest first (Kafka's): built-in defaults, the cluster's ``cluster-config``, the
topic's own overrides. Unknown keys and invalid values raise :class:`ConfigError` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fjord.cluster.broker_config import (
    BROKER_ONLY_KEYS,
    CONTROLLER_ONLY_KEYS,
    TOPIC_CONFIG_KEYS,
    canonical_keys,
    topic_settings,
    validate_broker_config,
)
from fjord.cluster.cleaner_config import CLEANER_CONFIG_DEFAULTS
from fjord.cluster.defaults import (
    AUTO_CREATE_TOPICS_ENABLE,
    DEFAULT_MIN_INSYNC_REPLICAS,
    DEFAULT_REPLICATION_FACTOR,
    MAX_BROKER_PARTITIONS,
    MAX_RECORDS_PER_USER_OP,
    NUM_PARTITIONS,
    OTHER_TOPIC_CONFIG_DEFAULTS,
    RETENTION_CHECK_INTERVAL_MS,
)
from fjord.cluster.replication_config import REPLICATION_CONFIG_DEFAULTS
from fjord.cluster.scrubber_config import SCRUBBER_CONFIG_DEFAULTS
from fjord.cluster.values import positive_int
from fjord.errors import ConfigError
from fjord.records.recompress import TOPIC_COMPRESSION_TYPES
from fjord.security.sasl_sessions import (
    CONNECTIONS_MAX_REAUTH_MS_KEY,
    DEFAULT_CONNECTIONS_MAX_REAUTH_MS,
)
from fjord.storage.defaults import DEFAULT_LOG_CONFIG
from fjord.topic_names import is_internal_topic

#: Cluster-wide keys only the controller reads (defaults for CreateTopics with -1, and the
#: limits of fjord.controller.limits).
CONTROLLER_CONFIG_KEYS = CONTROLLER_ONLY_KEYS

#: Every topic config key with its built-in default, as strings.
TOPIC_CONFIG_DEFAULTS: dict[str, str] = {
    **{k: str(v) for k, v in DEFAULT_LOG_CONFIG.items()},
    "min.insync.replicas": str(DEFAULT_MIN_INSYNC_REPLICAS),
    **OTHER_TOPIC_CONFIG_DEFAULTS,
}

_CHOICES = {
    "compression.type": tuple(TOPIC_COMPRESSION_TYPES),
    "unclean.leader.election.enable": ("true", "false"),
    "preallocate": ("true", "false"),
}
_NON_NEGATIVE_INTS = ("message.timestamp.difference.max.ms",)

#: Values Kafka accepts that Fjord refuses (INVALID_CONFIG naming the key) rather than store
#: and ignore, with the reason; only the default value of each is accepted.
UNSUPPORTED_VALUES: dict[str, str] = {
    "preallocate": (
        "only false: Fjord's segment files grow as records are appended (recovery and the "
        "indexes rely on the file ending at the last batch), so preallocating them to "
        "segment.bytes is not supported"
    ),
}

assert set(TOPIC_CONFIG_DEFAULTS) == set(TOPIC_CONFIG_KEYS), "every topic key needs a default"


def _check_value(key: str, value: str) -> None:
    if key in _CHOICES and value.strip().lower() not in _CHOICES[key]:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(_CHOICES[key])}")
    if key in _NON_NEGATIVE_INTS:
        try:
            number = int(value.strip())
        except ValueError:
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
        if number < 0:
            raise ConfigError(f"{key}: {number} is below the minimum 0")
    if key in UNSUPPORTED_VALUES and value.strip().lower() != TOPIC_CONFIG_DEFAULTS[key]:
        raise ConfigError(f"{key}: {value!r} is not supported, {UNSUPPORTED_VALUES[key]}")


def check_topic_values(config: Mapping[str, str]) -> None:
    """Every value of topic-level keys on its own (choices, Fjord's refusals of values it would
    otherwise store and ignore); ConfigError naming the key. The keys must be topic keys."""
    for key, value in config.items():
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string value, got {value!r}")
        _check_value(key, value)


def validate_topic_config(
    config: Mapping[str, str], cluster_config: Mapping[str, str]
) -> dict[str, str]:
    """The topic overrides, checked: every key known, every value valid on its own and in
    combination with the cluster defaults. Returns a plain copy."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if key not in TOPIC_CONFIG_KEYS:
            raise ConfigError(f"{key}: unknown topic config")
        check_topic_values({key: value})
        out[key] = value
    topic_settings({}, cluster_config, out)
    return out


def check_min_insync_replicas(
    topic: str,
    replication_factor: int,
    topic_config: Mapping[str, str],
    cluster_config: Mapping[str, str],
) -> None:
    """Refuse (ConfigError, INVALID_CONFIG, naming the key) a topic whose effective
    ``min.insync.replicas`` (its own, else the cluster default, else 1) is larger than its
    replication factor: every ``acks=all`` produce to it would wait and then fail with
    NOT_ENOUGH_REPLICAS. Internal topics are not checked (``__consumer_offsets`` follows the
    live broker count by design)."""
    if is_internal_topic(topic):
        return
    min_isr = topic_settings({}, cluster_config, topic_config).min_insync_replicas
    if min_isr > replication_factor:
        where = "the topic's" if "min.insync.replicas" in topic_config else "the cluster default"
        raise ConfigError(
            f"min.insync.replicas: {min_isr} ({where}) is larger than the replication factor "
            f"{replication_factor} of topic {topic!r}; every acks=all produce would fail with "
            "NOT_ENOUGH_REPLICAS (lower min.insync.replicas or raise the replication factor)"
        )


def validate_cluster_config(config: Mapping[str, str]) -> dict[str, str]:
    """``cluster-config`` entries: topic defaults plus the controller's own keys (Kafka's
    broker names accepted: ``log.retention.ms`` is stored as ``retention.ms``)."""
    out: dict[str, str] = {}
    topic_part: dict[str, str] = {}
    for key, value in canonical_keys(config).items():
        if key in CONTROLLER_CONFIG_KEYS:
            positive_int(key, value)
        elif key in TOPIC_CONFIG_KEYS:
            topic_part[key] = value
        else:
            raise ConfigError(f"{key}: unknown cluster config")
        out[key] = value
    validate_topic_config(topic_part, {})
    return out


def split_cluster_config(config: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """A whole cluster's config (Kafka's server.properties keys: ``fjord local up --config``, a
    FjordCluster's ``spec.brokers.config``), validated and split by who reads it; returns
    (controller entries, broker entries).

    Topic defaults go to both (a broker applies them to the topics it hosts, the controller
    checks new topics against them); the controller's own keys (num.partitions,
    default.replication.factor, the limits) only to controllers; broker-only keys
    (replica.*, log.retention.check.interval.ms, ...) only to brokers. Unknown keys or invalid
    values raise ConfigError naming the key.
    """
    config = canonical_keys(config)  # server.properties' names (log.retention.ms) too
    broker_only = {k: v for k, v in config.items() if k in BROKER_ONLY_KEYS}
    controller = validate_cluster_config({k: v for k, v in config.items() if k not in broker_only})
    brokers = {k: v for k, v in config.items() if k in TOPIC_CONFIG_KEYS or k in broker_only}
    validate_broker_config(brokers)
    return controller, brokers


def default_partitions(cluster_config: Mapping[str, str]) -> int:
    raw = cluster_config.get("num.partitions", str(NUM_PARTITIONS))
    return positive_int("num.partitions", raw)


def default_replication_factor(cluster_config: Mapping[str, str]) -> int:
    return positive_int(
        "default.replication.factor",
        cluster_config.get("default.replication.factor", str(DEFAULT_REPLICATION_FACTOR)),
    )


def max_records_per_user_op(cluster_config: Mapping[str, str]) -> int:
    key = "max.records.per.user.op"
    return positive_int(key, cluster_config.get(key, str(MAX_RECORDS_PER_USER_OP)))


def max_broker_partitions(cluster_config: Mapping[str, str]) -> int:
    key = "max.broker.partitions"
    return positive_int(key, cluster_config.get(key, str(MAX_BROKER_PARTITIONS)))


@dataclass(frozen=True)
class ConfigValue:
    """One effective config entry; ``source`` is TOPIC, DYNAMIC_BROKER (a broker's own dynamic
    config), CLUSTER_DEFAULT, STATIC_BROKER (a broker's own ``--config``) or DEFAULT."""

    name: str
    value: str
    source: str

    @property
    def is_default(self) -> bool:
        return self.source != "TOPIC"


def describe_topic_config(
    topic_config: Mapping[str, str], cluster_config: Mapping[str, str]
) -> list[ConfigValue]:
    """Every topic config key with its effective value and where it comes from, by name."""
    out = []
    for key in sorted(TOPIC_CONFIG_DEFAULTS):
        if key in topic_config:
            out.append(ConfigValue(key, topic_config[key], "TOPIC"))
        elif key in cluster_config:
            out.append(ConfigValue(key, cluster_config[key], "CLUSTER_DEFAULT"))
        else:
            out.append(ConfigValue(key, TOPIC_CONFIG_DEFAULTS[key], "DEFAULT"))
    return out


#: Every broker-only key (``fjord broker --config``) with its built-in default, as strings.
BROKER_ONLY_DEFAULTS: dict[str, str] = {
    "auto.create.topics.enable": str(AUTO_CREATE_TOPICS_ENABLE).lower(),
    "log.retention.check.interval.ms": str(RETENTION_CHECK_INTERVAL_MS),
    **{k: str(v) for k, v in REPLICATION_CONFIG_DEFAULTS.items()},
    **SCRUBBER_CONFIG_DEFAULTS,
    **CLEANER_CONFIG_DEFAULTS,
    CONNECTIONS_MAX_REAUTH_MS_KEY: str(DEFAULT_CONNECTIONS_MAX_REAUTH_MS),
}

assert set(BROKER_ONLY_DEFAULTS) == set(BROKER_ONLY_KEYS), "every broker key needs a default"


def describe_broker_config(
    broker_config: Mapping[str, str],
    cluster_config: Mapping[str, str],
    dynamic_config: Mapping[str, str] | None = None,
) -> list[ConfigValue]:
    """Every key a broker reads (its own keys and the topic defaults it applies, under Kafka's
    broker names: ``log.retention.ms``) with its effective value and source, sorted by name, as
    Kafka's DescribeConfigs answers for a broker. Precedence, highest first (Kafka's):
    DYNAMIC_BROKER (the broker's own dynamic configs, ``broker-configs/<id>``), CLUSTER_DEFAULT
    (the dynamic cluster-wide default, ``cluster-config``), STATIC_BROKER (the broker's
    ``--config`` at start), DEFAULT. Only dynamic keys are taken from the dynamic layers."""
    from fjord.cluster.dynamic_config import DYNAMIC_BROKER_KEYS, broker_name

    dynamic = dynamic_config or {}
    defaults = {**TOPIC_CONFIG_DEFAULTS, **BROKER_ONLY_DEFAULTS}
    out = []
    for key in defaults:
        if key in dynamic and key in DYNAMIC_BROKER_KEYS:
            value, source = dynamic[key], "DYNAMIC_BROKER"
        elif key in cluster_config and key in DYNAMIC_BROKER_KEYS:
            value, source = cluster_config[key], "CLUSTER_DEFAULT"
        elif key in broker_config:
            value, source = broker_config[key], "STATIC_BROKER"
        else:
            value, source = defaults[key], "DEFAULT"
        out.append(ConfigValue(broker_name(key), value, source))
    return sorted(out, key=lambda e: e.name)


def unclean_election_allowed(
    topic_config: Mapping[str, str], cluster_config: Mapping[str, str]
) -> bool:
    key = "unclean.leader.election.enable"
    raw = topic_config.get(key, cluster_config.get(key, TOPIC_CONFIG_DEFAULTS[key]))
    return raw.strip().lower() == "true"
