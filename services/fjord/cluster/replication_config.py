"""The broker's replication settings (Kafka's ``replica.*`` broker keys), pure: their defaults
and :class:`ReplicationSettings`, read from ``fjord broker --config``. Shared so that everyone
who checks a broker config before handing it over (the operator, ``fjord local``) applies the
broker's own rules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fjord.cluster.values import positive_int

# --- defaults (Kafka's broker settings; every one can be set with ``fjord broker --config``) ---

#: ``replica.lag.time.max.ms``: a follower that has not caught up with the leader's log end for
#: this long leaves the ISR (Kafka: 30 s). ``fjord local`` uses a shorter value, see
#: fjord.local.defaults.LOCAL_REPLICA_LAG_TIME_MAX_MS.
DEFAULT_REPLICA_LAG_TIME_MAX_MS = 30_000

#: ``replica.fetch.wait.max.ms``: how long the leader may park a follower's fetch (Kafka: 500).
DEFAULT_REPLICA_FETCH_WAIT_MAX_MS = 500

#: ``replica.fetch.min.bytes`` (Kafka: 1): a follower's fetch returns as soon as any byte is there.
DEFAULT_REPLICA_FETCH_MIN_BYTES = 1

#: ``replica.fetch.max.bytes`` (Kafka: 1 MiB): per partition in one follower fetch.
DEFAULT_REPLICA_FETCH_MAX_BYTES = 1024 * 1024

#: ``replica.fetch.response.max.bytes`` (Kafka: 10 MiB): one follower fetch in total.
DEFAULT_REPLICA_FETCH_RESPONSE_MAX_BYTES = 10 * 1024 * 1024

#: ``replica.fetch.backoff.ms`` (Kafka: 1000): pause after a failed fetch or partition error.
#: Fjord: 200 ms, since a leader change is announced by etcd within milliseconds and a shorter
#: pause shortens under-replication after failovers.
DEFAULT_REPLICA_FETCH_BACKOFF_MS = 200

#: ``replica.high.watermark.checkpoint.interval.ms`` (Kafka: 5000).
DEFAULT_HW_CHECKPOINT_INTERVAL_MS = 5_000

#: Keys (and defaults) :class:`ReplicationSettings` reads from the broker config.
REPLICATION_CONFIG_DEFAULTS: dict[str, int] = {
    "replica.lag.time.max.ms": DEFAULT_REPLICA_LAG_TIME_MAX_MS,
    "replica.fetch.wait.max.ms": DEFAULT_REPLICA_FETCH_WAIT_MAX_MS,
    "replica.fetch.min.bytes": DEFAULT_REPLICA_FETCH_MIN_BYTES,
    "replica.fetch.max.bytes": DEFAULT_REPLICA_FETCH_MAX_BYTES,
    "replica.fetch.response.max.bytes": DEFAULT_REPLICA_FETCH_RESPONSE_MAX_BYTES,
    "replica.fetch.backoff.ms": DEFAULT_REPLICA_FETCH_BACKOFF_MS,
    "replica.high.watermark.checkpoint.interval.ms": DEFAULT_HW_CHECKPOINT_INTERVAL_MS,
}

@dataclass(frozen=True, slots=True)
class ReplicationSettings:
    """The broker's replication settings. Invariant: every value is >= 1 (checked)."""

    lag_time_max_ms: int = DEFAULT_REPLICA_LAG_TIME_MAX_MS
    fetch_wait_max_ms: int = DEFAULT_REPLICA_FETCH_WAIT_MAX_MS
    fetch_min_bytes: int = DEFAULT_REPLICA_FETCH_MIN_BYTES
    fetch_max_bytes: int = DEFAULT_REPLICA_FETCH_MAX_BYTES
    fetch_response_max_bytes: int = DEFAULT_REPLICA_FETCH_RESPONSE_MAX_BYTES
    fetch_backoff_ms: int = DEFAULT_REPLICA_FETCH_BACKOFF_MS
    hw_checkpoint_interval_ms: int = DEFAULT_HW_CHECKPOINT_INTERVAL_MS

    @classmethod
    def from_config(cls, config: Mapping[str, str]) -> ReplicationSettings:
        """Read the ``replica.*`` keys; ConfigError names a key that is not an integer >= 1."""
        values: dict[str, int] = {}
        for key, default in REPLICATION_CONFIG_DEFAULTS.items():
            raw = config.get(key)
            if raw is None:
                values[key] = default
                continue
            values[key] = positive_int(key, raw)
        return cls(*values.values())
