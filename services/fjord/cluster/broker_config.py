"""Effective configuration of a topic on this broker: storage settings plus the broker-side
topic settings (``min.insync.replicas``), layered Kafka's way.

Pure. Precedence, lowest first: Fjord's defaults, the broker's ``--config k=v``, the cluster's
``cluster-config`` key in etcd, the topic's own overrides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fjord.cluster import defaults
from fjord.cluster.cleaner_config import CLEANER_CONFIG_DEFAULTS, CleanerSettings
from fjord.cluster.replication_config import REPLICATION_CONFIG_DEFAULTS, ReplicationSettings
from fjord.cluster.scrubber_config import SCRUBBER_CONFIG_DEFAULTS, ScrubberSettings
from fjord.cluster.values import positive_int
from fjord.errors import ConfigError
from fjord.records.header import Compression
from fjord.records.recompress import topic_codec
from fjord.security.sasl_sessions import CONNECTIONS_MAX_REAUTH_MS_KEY, connections_max_reauth_ms
from fjord.storage.config import LogConfig
from fjord.storage.defaults import DEFAULT_LOG_CONFIG, LONG_MAX, OTHER_TOPIC_CONFIG_KEYS

#: Every topic config key a broker understands (storage's keys and the other components').
TOPIC_CONFIG_KEYS = frozenset(DEFAULT_LOG_CONFIG) | OTHER_TOPIC_CONFIG_KEYS

#: Broker-only keys accepted by ``fjord broker --config`` besides topic defaults.
BROKER_ONLY_KEYS = frozenset(
    {"auto.create.topics.enable", "log.retention.check.interval.ms", *REPLICATION_CONFIG_DEFAULTS,
     *SCRUBBER_CONFIG_DEFAULTS, *CLEANER_CONFIG_DEFAULTS, CONNECTIONS_MAX_REAUTH_MS_KEY}
)

#: Cluster-wide keys only the controller reads (defaults for CreateTopics with -1, and the
#: limits of fjord.controller.limits); a broker refuses them naming where they belong.
CONTROLLER_ONLY_KEYS = frozenset(
    {"num.partitions", "default.replication.factor", "max.records.per.user.op",
     "max.broker.partitions"}
)


#: Kafka's broker-level names of the topic configs (the broker default of each), as Kafka's
#: ServerTopicConfigSynonyms; the topic configs not listed have the same name on a broker.
BROKER_SYNONYMS: dict[str, str] = {
    "log.segment.bytes": "segment.bytes",
    "log.roll.ms": "segment.ms",
    "log.index.size.max.bytes": "segment.index.bytes",
    "log.index.interval.bytes": "index.interval.bytes",
    "log.retention.ms": "retention.ms",
    "log.retention.bytes": "retention.bytes",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "message.max.bytes": "max.message.bytes",
    "log.message.timestamp.type": "message.timestamp.type",
    "log.cleanup.policy": "cleanup.policy",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.cleaner.max.compaction.lag.ms": "max.compaction.lag.ms",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
    "log.message.timestamp.difference.max.ms": "message.timestamp.difference.max.ms",
    "log.preallocate": "preallocate",
}



def broker_key(name: str) -> str:
    """Fjord's key for a broker config name (Kafka's ``log.retention.ms`` -> ``retention.ms``;
    any other name unchanged)."""
    return BROKER_SYNONYMS.get(name, name)


def canonical_keys(config: Mapping[str, str]) -> dict[str, str]:
    """``config`` with Kafka's broker names (``log.retention.ms``, server.properties' names)
    turned into Fjord's keys (``retention.ms``); ConfigError when both names of one key are
    given."""
    out: dict[str, str] = {}
    names: dict[str, str] = {}
    for name, value in config.items():
        key = broker_key(name)
        if key in out:
            raise ConfigError(f"{name}: the same setting as {names[key]}, given twice")
        out[key], names[key] = value, name
    return out


def retention_check_interval_s(config: Mapping[str, str]) -> float:
    """``log.retention.check.interval.ms`` in seconds (a positive integer; ConfigError naming
    the key otherwise)."""
    raw = config.get("log.retention.check.interval.ms")
    if raw is None:
        return defaults.RETENTION_CHECK_INTERVAL_MS / 1000
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(
            f"log.retention.check.interval.ms: expected a positive integer, got {raw!r}"
        )
    return value / 1000


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """What the broker needs to host one topic's partitions.

    Invariant: ``log_config`` is validated and ``min_insync_replicas >= 1``;
    ``compression`` is the codec the leader writes produced batches in (None: ``producer``,
    each batch as its producer compressed it; fjord.records.recompress).
    """

    log_config: LogConfig
    min_insync_replicas: int
    compression: Compression | None = None
    #: ``message.timestamp.difference.max.ms`` when the leader must check record timestamps
    #: (a CreateTime topic with a value below Kafka's "never"); None otherwise.
    max_timestamp_difference_ms: int | None = None


def validate_broker_config(config: Mapping[str, str]) -> dict[str, str]:
    """Check ``fjord broker --config`` entries; unknown keys raise ConfigError naming them."""
    out = dict(config)
    for key in out:
        if key in CONTROLLER_ONLY_KEYS:
            # Kafka reads these in whichever process creates topics: in Fjord, the controller.
            raise ConfigError(
                f"{key}: a controller config, read where topics are created (give it to "
                "`fjord controller --config` or the cluster's config), not to a broker"
            )
        if key not in TOPIC_CONFIG_KEYS and key not in BROKER_ONLY_KEYS:
            raise ConfigError(f"{key}: unknown broker config")
    auto = out.get("auto.create.topics.enable", "false").strip().lower()
    if auto not in ("true", "false"):
        raise ConfigError(f"auto.create.topics.enable: expected true or false, got {auto!r}")
    if auto == "true":
        raise ConfigError(
            "auto.create.topics.enable: not supported by Fjord yet; create topics with "
            "`fjord topics create`"
        )
    from fjord.cluster.topic_config import check_topic_values  # it imports this module

    check_topic_values({k: v for k, v in out.items() if k in TOPIC_CONFIG_KEYS})
    topic_settings(out, {}, {})  # validates every topic default now, naming the bad key
    ReplicationSettings.from_config(out)  # replica.* settings, naming the bad key
    ScrubberSettings.from_config(out)  # log.scrubber.* settings
    CleanerSettings.from_config(out)  # log.cleaner.* settings
    retention_check_interval_s(out)
    connections_max_reauth_ms(out)
    return out


def topic_settings(
    broker_config: Mapping[str, str],
    cluster_config: Mapping[str, str],
    topic_config: Mapping[str, str],
) -> TopicSettings:
    """The effective settings of a topic. Raises ConfigError naming an invalid key."""
    merged: dict[str, str] = {}
    for layer in (broker_config, cluster_config, topic_config):
        for key, value in layer.items():
            # cluster-config also holds broker/controller settings (num.partitions, ...):
            # only the topic-level ones matter here.
            if key in TOPIC_CONFIG_KEYS:
                merged[key] = value
    log_config = LogConfig.from_dict(merged)
    raw_isr = merged.get("min.insync.replicas", str(defaults.DEFAULT_MIN_INSYNC_REPLICAS))
    key = "message.timestamp.difference.max.ms"
    try:
        difference = int(merged.get(key, str(LONG_MAX)).strip())
    except ValueError:
        raise ConfigError(f"{key}: expected an integer, got {merged[key]!r}") from None
    if difference < 0:
        raise ConfigError(f"{key}: {difference} is below the minimum 0")
    return TopicSettings(
        log_config,
        positive_int("min.insync.replicas", raw_isr),
        topic_codec(merged.get("compression.type", "producer")),
        None if difference >= LONG_MAX or log_config.log_append_time else difference,
    )
