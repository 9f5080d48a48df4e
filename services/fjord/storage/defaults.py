"""Every storage default, defined once (Kafka's topic-level defaults unless noted).

These are the values a partition log uses when neither the topic config nor the cluster config
overrides them. The names in :data:`DEFAULT_LOG_CONFIG` are Kafka's topic config names.
"""

from __future__ import annotations

from typing import Final

LONG_MAX: Final = 2**63 - 1
"""Kafka's "never" for flush.messages / flush.ms."""

SEGMENT_BYTES: Final = 1024 * 1024 * 1024
"""segment.bytes: roll the active segment once it would grow past 1 GiB."""

SEGMENT_MS: Final = 7 * 24 * 3600 * 1000
"""segment.ms: roll a non-empty active segment that is older than 7 days."""

SEGMENT_INDEX_BYTES: Final = 10 * 1024 * 1024
"""segment.index.bytes: the most an offset (or time) index may hold; a full index rolls."""

INDEX_INTERVAL_BYTES: Final = 4096
"""index.interval.bytes: one sparse index entry per this many bytes of log."""

RETENTION_MS: Final = 7 * 24 * 3600 * 1000
"""retention.ms: delete segments whose newest batch is older than 7 days (-1: keep forever)."""

RETENTION_BYTES: Final = -1
"""retention.bytes: no size limit by default (-1)."""

FLUSH_MESSAGES: Final = LONG_MAX
"""flush.messages: fsync after this many unflushed records (default: leave it to the OS)."""

FLUSH_MS: Final = LONG_MAX
"""flush.ms: fsync when the oldest unflushed append is this old (default: never)."""

MAX_MESSAGE_BYTES: Final = 1024 * 1024 + 12
"""max.message.bytes: the largest batch accepted (1 MiB plus the 12-byte log overhead)."""

MESSAGE_TIMESTAMP_TYPE: Final = "CreateTime"
"""message.timestamp.type: CreateTime (keep the producer's) or LogAppendTime (the broker's)."""

CLEANUP_POLICY: Final = "delete"
"""cleanup.policy: delete (retention), compact (the log cleaner keeps the last record of each
key), or both ("compact,delete")."""

MIN_CLEANABLE_DIRTY_RATIO: Final = 0.5
"""min.cleanable.dirty.ratio: clean a compacted log once half its cleanable bytes are dirty."""

MIN_COMPACTION_LAG_MS: Final = 0
"""min.compaction.lag.ms: a record stays uncompacted at least this long."""

MAX_COMPACTION_LAG_MS: Final = LONG_MAX
"""max.compaction.lag.ms: a dirty record older than this makes the log cleanable whatever its
dirty ratio."""

DELETE_RETENTION_MS: Final = 24 * 3600 * 1000
"""delete.retention.ms: tombstones stay this long after their segment's largest timestamp."""

DEFAULT_LOG_CONFIG: Final[dict[str, int | str | float]] = {
    "segment.bytes": SEGMENT_BYTES,
    "segment.ms": SEGMENT_MS,
    "segment.index.bytes": SEGMENT_INDEX_BYTES,
    "index.interval.bytes": INDEX_INTERVAL_BYTES,
    "retention.ms": RETENTION_MS,
    "retention.bytes": RETENTION_BYTES,
    "flush.messages": FLUSH_MESSAGES,
    "flush.ms": FLUSH_MS,
    "max.message.bytes": MAX_MESSAGE_BYTES,
    "message.timestamp.type": MESSAGE_TIMESTAMP_TYPE,
    "cleanup.policy": CLEANUP_POLICY,
    "min.cleanable.dirty.ratio": MIN_CLEANABLE_DIRTY_RATIO,
    "min.compaction.lag.ms": MIN_COMPACTION_LAG_MS,
    "max.compaction.lag.ms": MAX_COMPACTION_LAG_MS,
    "delete.retention.ms": DELETE_RETENTION_MS,
}

OTHER_TOPIC_CONFIG_KEYS: Final = frozenset(
    {
        # Kafka topic configs that other components own (replication, clients);
        # LogConfig.from_dict accepts and ignores them so a topic's whole config can be passed.
        "compression.type",
        "min.insync.replicas",
        "unclean.leader.election.enable",
        "message.timestamp.difference.max.ms",
        "preallocate",
    }
)

RECOVERY_READ_BYTES: Final = 8 * 1024 * 1024
"""Recovery validates a segment in reads of this size (a larger batch is read whole)."""

CRC_OVERLAP_BYTES: Final = 256 * 1024
"""Appends at least this big check their CRCs in a helper thread while the write proceeds (a
bad CRC cuts the write back before it is visible); smaller ones check first, then write."""

# File names inside a partition directory (Kafka's where Kafka has one).
LOG_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".index"
TIME_INDEX_SUFFIX: Final = ".timeindex"
TXN_INDEX_SUFFIX: Final = ".txnindex"
"""Aborted transactions per segment (format in :mod:`fjord.storage.txn_index`)."""
LEADER_EPOCH_CHECKPOINT: Final = "leader-epoch-checkpoint"
PARTITION_CHECKPOINT: Final = "partition-checkpoint"
"""Per partition: recovery point and log start offset (see docs/storage.md)."""
CLEAN_SHUTDOWN_MARKER: Final = ".clean-shutdown"
DELETED_SUFFIX: Final = ".deleted"
"""A partition directory renamed with this suffix is being deleted and is skipped on load."""
OFFSET_DIGITS: Final = 20
DATA_DIR_LOCK: Final = ".lock"
"""Held with flock by the LogManager that uses a data directory."""

#: Partition logs a broker opens at once when it starts (their fsyncs overlap).
LOAD_THREADS = 8
