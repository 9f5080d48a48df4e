"""Every config key Fjord accepts for topics, brokers and the controller, with its default, its
update mode and what it does (or why a value is refused): the single source of
docs/configuration.md's tables (``python -m fjord.tools.config_doc`` writes them;
tests/unit/test_config_catalog.py fails when the doc is stale, and
tests/integration/test_config_catalog.py proves each entry's effect or refusal).

Pure data; the defaults are read from the modules that define them, never retyped.
"""

from __future__ import annotations

from dataclasses import dataclass

from fjord.cluster.broker_config import BROKER_ONLY_KEYS, CONTROLLER_ONLY_KEYS, TOPIC_CONFIG_KEYS
from fjord.cluster.defaults import (
    DEFAULT_REPLICATION_FACTOR,
    MAX_BROKER_PARTITIONS,
    MAX_RECORDS_PER_USER_OP,
    NUM_PARTITIONS,
)
from fjord.cluster.dynamic_config import (
    CLUSTER_WIDE_ONLY_KEYS,
    DYNAMIC_BROKER_KEYS,
    broker_name,
)
from fjord.cluster.topic_config import (
    BROKER_ONLY_DEFAULTS,
    TOPIC_CONFIG_DEFAULTS,
    UNSUPPORTED_VALUES,
)

#: Update modes (Kafka's broker config table's names).
READ_ONLY = "read-only"
CLUSTER_WIDE = "cluster-wide"  # dynamic: per broker and as the cluster-wide default
CLUSTER_DEFAULT_ONLY = "cluster-wide default only"


@dataclass(frozen=True, slots=True)
class ConfigKey:
    """One key: ``name`` is Fjord's (the topic config name for topic keys), ``broker_name``
    Kafka's name for it on a broker (``log.retention.ms``), ``scope`` ``topic`` (a topic
    config, and under ``broker_name`` the brokers' default for it), ``broker`` or
    ``controller``; ``effect`` what it does in Fjord, or for a refused value why."""

    name: str
    scope: str
    default: str
    update_mode: str
    effect: str

    @property
    def broker_name(self) -> str:
        return broker_name(self.name)

    @property
    def refused_values(self) -> str | None:
        """Why values other than the default are refused (INVALID_CONFIG), or None."""
        return UNSUPPORTED_VALUES.get(self.name)


_TOPIC_EFFECTS: dict[str, str] = {
    "segment.bytes": "The active segment rolls when an append would grow it past this size.",
    "segment.ms": "A non-empty active segment older than this rolls (the broker checks every "
    "few seconds).",
    "segment.index.bytes": "Most bytes of a segment's offset and time index; a full index "
    "rolls the segment.",
    "index.interval.bytes": "One sparse index entry per this many bytes of log.",
    "retention.ms": "Whole closed segments whose newest record is older are deleted (-1: "
    "never); the log start offset moves. Needs `delete` in cleanup.policy.",
    "retention.bytes": "Oldest closed segments are deleted while the log is larger (-1: no "
    "limit).",
    "flush.messages": "fsync after this many unflushed records (default: the OS decides).",
    "flush.ms": "fsync when the oldest unflushed append is this old (default: never).",
    "max.message.bytes": "A batch larger than this is refused with MESSAGE_TOO_LARGE (checked "
    "again after the broker recompresses it).",
    "message.timestamp.type": "CreateTime keeps the producer's timestamps; LogAppendTime "
    "stamps each batch with the broker's clock.",
    "cleanup.policy": "delete (retention), compact (the log cleaner keeps the newest record "
    "of each key) or both.",
    "min.cleanable.dirty.ratio": "The cleaner compacts a log once this share of its cleanable "
    "bytes is dirty.",
    "min.compaction.lag.ms": "Records younger than this are never compacted.",
    "max.compaction.lag.ms": "A dirty record older than this makes the log cleanable whatever "
    "its dirty ratio.",
    "delete.retention.ms": "Tombstones stay this long after their segment's newest record, "
    "then the cleaner drops them.",
    "compression.type": "producer keeps each batch as its producer compressed it; a codec "
    "(uncompressed, gzip, snappy, lz4, zstd) makes the leader rewrite batches in another "
    "codec before the append (the one case where the broker decodes records).",
    "min.insync.replicas": "acks=all produces fail with NOT_ENOUGH_REPLICAS while the ISR is "
    "smaller; a topic whose replication factor is below it is refused at creation.",
    "unclean.leader.election.enable": "true lets the controller elect a replica outside the "
    "ISR when no ISR member is alive (acknowledged records can be lost).",
    "message.timestamp.difference.max.ms": "On a CreateTime topic, a produce holding a record "
    "whose timestamp differs from the leader's clock by more is refused with "
    "INVALID_TIMESTAMP (the leader then decodes every record; the default never checks).",
    "preallocate": "Segment files are not preallocated (false).",
}

_BROKER_EFFECTS: dict[str, str] = {
    "auto.create.topics.enable": "Only false: a Metadata or produce request for an unknown "
    "topic gets UNKNOWN_TOPIC_OR_PARTITION; topics are created explicitly.",
    "log.retention.check.interval.ms": "How often the broker applies retention.ms and "
    "retention.bytes.",
    "replica.lag.time.max.ms": "A follower that has not caught up for this long leaves the ISR.",
    "replica.fetch.wait.max.ms": "How long a leader may park a follower's fetch.",
    "replica.fetch.min.bytes": "A follower's fetch returns once this many bytes are there.",
    "replica.fetch.max.bytes": "Most bytes per partition in one follower fetch.",
    "replica.fetch.response.max.bytes": "Most bytes in one follower fetch response.",
    "replica.fetch.backoff.ms": "A follower's pause after a failed fetch or partition error.",
    "replica.high.watermark.checkpoint.interval.ms": "How often high watermarks are written to "
    "the replication-offset-checkpoint.",
    "log.scrubber.enable": "Verify closed segments' CRCs in the background (Fjord's, no Kafka "
    "counterpart).",
    "log.scrubber.io.max.bytes.per.second": "The scrubber reads at most this many bytes per "
    "second (DescribeLogDirs shows the rate in force).",
    "log.scrubber.backoff.ms": "The scrubber's pause after a full pass.",
    "log.cleaner.enable": "Run the log cleaner (compaction of cleanup.policy=compact topics).",
    "log.cleaner.io.max.bytes.per.second": "The cleaner reads at most this many bytes per "
    "second.",
    "log.cleaner.backoff.ms": "The cleaner's pause when no log needs cleaning.",
    "connections.max.reauth.ms": "How long a SASL session lives (KIP-368): the Kafka "
    "listener answers it as SaslAuthenticate's session_lifetime_ms and closes a connection "
    "whose session expired on its next request unless the client re-authenticated; the SASL "
    "gRPC door's session tokens expire after it (Fjord's clients renew them at 85-95%). A "
    "deleted user or changed password takes effect at the next re-authentication. 0: never "
    "(Kafka's default; Fjord bounds it, see docs/security.md). Coordinators and controllers "
    "take it in their --config too.",
    "log.cleaner.dedupe.buffer.size": "The memory bound of the cleaner's offset map (about "
    "120 bytes a key plus the key); a log with more dirty keys is cleaned in rounds.",
}

_CONTROLLER_DEFAULTS: dict[str, int] = {
    "num.partitions": NUM_PARTITIONS,
    "default.replication.factor": DEFAULT_REPLICATION_FACTOR,
    "max.records.per.user.op": MAX_RECORDS_PER_USER_OP,
    "max.broker.partitions": MAX_BROKER_PARTITIONS,
}

_CONTROLLER_EFFECTS: dict[str, str] = {
    "num.partitions": "Partitions of a topic created with -1 (CreateTopics' default).",
    "default.replication.factor": "Replication factor of a topic created with -1.",
    "max.records.per.user.op": "A CreateTopics or CreatePartitions entry needing more metadata "
    "records is refused with POLICY_VIOLATION.",
    "max.broker.partitions": "A placement putting more replicas on one broker is refused with "
    "POLICY_VIOLATION.",
}

assert set(_TOPIC_EFFECTS) == set(TOPIC_CONFIG_KEYS)
assert set(_BROKER_EFFECTS) == set(BROKER_ONLY_KEYS)
assert set(_CONTROLLER_EFFECTS) == set(_CONTROLLER_DEFAULTS) == set(CONTROLLER_ONLY_KEYS)


def _mode(key: str) -> str:
    if key in CLUSTER_WIDE_ONLY_KEYS:
        return CLUSTER_DEFAULT_ONLY
    return CLUSTER_WIDE if key in DYNAMIC_BROKER_KEYS else READ_ONLY


#: Every key, topic keys first, then broker keys, then the controller's, each sorted by name.
CATALOG: tuple[ConfigKey, ...] = (
    *(ConfigKey(k, "topic", TOPIC_CONFIG_DEFAULTS[k], _mode(k), _TOPIC_EFFECTS[k])
      for k in sorted(_TOPIC_EFFECTS)),
    *(ConfigKey(k, "broker", BROKER_ONLY_DEFAULTS[k], _mode(k), _BROKER_EFFECTS[k])
      for k in sorted(_BROKER_EFFECTS)),
    *(ConfigKey(k, "controller", str(_CONTROLLER_DEFAULTS[k]), READ_ONLY, _CONTROLLER_EFFECTS[k])
      for k in sorted(_CONTROLLER_EFFECTS)),
)

BY_NAME: dict[str, ConfigKey] = {k.name: k for k in CATALOG}


def markdown_tables() -> str:
    """docs/configuration.md's generated part: one table per scope."""
    out: list[str] = []
    titles = {
        "topic": ("Topic configs (a topic's own value changes at any time; the dynamic update "
                  "column is about the brokers' default)", "topic key",
                  "broker default (name on a broker)"),
        "broker": ("Broker configs", "key", None),
        "controller": ("Controller configs (cluster-wide, read where topics are created)",
                       "key", None),
    }
    for scope, (title, key_title, broker_title) in titles.items():
        out.append(f"### {title}\n")
        head = [key_title, *((broker_title and [broker_title]) or []), "default",
                "dynamic update", "effect"]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for entry in (e for e in CATALOG if e.scope == scope):
            refused = entry.refused_values
            effect = entry.effect + (
                f" Other values: INVALID_CONFIG ({refused})." if refused else "")
            row = [f"`{entry.name}`",
                   *([f"`{entry.broker_name}`"] if broker_title else []),
                   f"`{entry.default}`", entry.update_mode, effect]
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    return "\n".join(out)
