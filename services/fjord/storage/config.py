"""Per-partition log configuration with Kafka's topic config names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from fjord.errors import ConfigError
from fjord.storage import defaults

_TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")

# Kafka name -> (attribute name, smallest allowed value); -1 is allowed where Kafka allows it.
_INT_KEYS: dict[str, tuple[str, int]] = {
    "segment.bytes": ("segment_bytes", 14),
    "segment.ms": ("segment_ms", 1),
    "segment.index.bytes": ("segment_index_bytes", 8),
    "index.interval.bytes": ("index_interval_bytes", 0),
    "retention.ms": ("retention_ms", -1),
    "retention.bytes": ("retention_bytes", -1),
    "flush.messages": ("flush_messages", 1),
    "flush.ms": ("flush_ms", 0),
    "max.message.bytes": ("max_message_bytes", 0),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", 0),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", 1),
    "delete.retention.ms": ("delete_retention_ms", 0),
}
#: cleanup.policy values (Kafka's list, in any order, without repeats).
_POLICIES = ("delete", "compact")
# Sizes that index entries store as 32-bit positions, or that Kafka holds in an int.
_MAXIMUM: dict[str, int] = {
    "segment.bytes": 2**31 - 1,
    "segment.index.bytes": 2**31 - 1,
    "index.interval.bytes": 2**31 - 1,
    "max.message.bytes": 2**31 - 1,
}


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The storage settings of one partition log.

    Invariants: every field holds a validated value (sizes and times within Kafka's bounds,
    ``message_timestamp_type`` is ``"CreateTime"`` or ``"LogAppendTime"``). Build one from Kafka
    names with :meth:`from_dict`; the defaults are those of :mod:`fjord.storage.defaults`.
    """

    segment_bytes: int = defaults.SEGMENT_BYTES
    segment_ms: int = defaults.SEGMENT_MS
    segment_index_bytes: int = defaults.SEGMENT_INDEX_BYTES
    index_interval_bytes: int = defaults.INDEX_INTERVAL_BYTES
    retention_ms: int = defaults.RETENTION_MS
    retention_bytes: int = defaults.RETENTION_BYTES
    flush_messages: int = defaults.FLUSH_MESSAGES
    flush_ms: int = defaults.FLUSH_MS
    max_message_bytes: int = defaults.MAX_MESSAGE_BYTES
    message_timestamp_type: str = defaults.MESSAGE_TIMESTAMP_TYPE
    min_compaction_lag_ms: int = defaults.MIN_COMPACTION_LAG_MS
    max_compaction_lag_ms: int = defaults.MAX_COMPACTION_LAG_MS
    delete_retention_ms: int = defaults.DELETE_RETENTION_MS
    cleanup_policy: str = defaults.CLEANUP_POLICY
    """Normalised: "delete", "compact" or "compact,delete"."""
    min_cleanable_dirty_ratio: float = defaults.MIN_CLEANABLE_DIRTY_RATIO

    def __post_init__(self) -> None:
        for key, (attr, minimum) in _INT_KEYS.items():
            value = getattr(self, attr)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{key}: expected an integer, got {value!r}")
            if value < minimum or (minimum == -1 and value < -1):
                raise ConfigError(f"{key}: {value} is below the minimum {minimum}")
            maximum = _MAXIMUM.get(key, defaults.LONG_MAX)
            if value > maximum:
                raise ConfigError(f"{key}: {value} is above the maximum {maximum}")
        if self.cleanup_policy not in ("delete", "compact", "compact,delete"):
            raise ConfigError(
                f"cleanup.policy: {self.cleanup_policy!r} is not one of delete, compact, "
                "compact,delete"
            )
        ratio = self.min_cleanable_dirty_ratio
        if not isinstance(ratio, float | int) or isinstance(ratio, bool) or not 0 <= ratio <= 1:
            raise ConfigError(f"min.cleanable.dirty.ratio: expected a number in [0, 1], "
                              f"got {ratio!r}")
        if self.message_timestamp_type not in _TIMESTAMP_TYPES:
            raise ConfigError(
                f"message.timestamp.type: {self.message_timestamp_type!r} is not one of "
                f"{', '.join(_TIMESTAMP_TYPES)}"
            )

    @property
    def compact(self) -> bool:
        """The log cleaner compacts this log (cleanup.policy holds compact)."""
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        """Retention deletes old segments (cleanup.policy holds delete)."""
        return "delete" in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @classmethod
    def from_dict(cls, config: Mapping[str, Any], base: LogConfig | None = None) -> LogConfig:
        """A config from Kafka names (values may be ints or their decimal strings, as from
        ``--config k=v``), on top of ``base`` (or the defaults).

        Keys of other components (:data:`defaults.OTHER_TOPIC_CONFIG_KEYS`) are ignored; any other
        unknown key or an invalid value raises :class:`ConfigError` naming the key.
        """
        changes: dict[str, Any] = {}
        for key, raw in config.items():
            if key in _INT_KEYS:
                attr, _ = _INT_KEYS[key]
                changes[attr] = _parse_int(key, raw)
            elif key == "message.timestamp.type":
                if not isinstance(raw, str):
                    raise ConfigError(f"message.timestamp.type: expected a string, got {raw!r}")
                changes["message_timestamp_type"] = raw
            elif key == "cleanup.policy":
                changes["cleanup_policy"] = _parse_policy(raw)
            elif key == "min.cleanable.dirty.ratio":
                changes["min_cleanable_dirty_ratio"] = _parse_ratio(raw)
            elif key not in defaults.OTHER_TOPIC_CONFIG_KEYS:
                raise ConfigError(f"{key}: unknown topic config")
        return replace(base or cls(), **changes)

    def to_dict(self) -> dict[str, int | str | float]:
        """This config with Kafka names (the inverse of :meth:`from_dict`)."""
        out: dict[str, int | str | float] = {
            key: getattr(self, attr) for key, (attr, _) in _INT_KEYS.items()
        }
        out["message.timestamp.type"] = self.message_timestamp_type
        out["cleanup.policy"] = self.cleanup_policy
        out["min.cleanable.dirty.ratio"] = self.min_cleanable_dirty_ratio
        return out


def _parse_int(key: str, raw: object) -> int:
    if isinstance(raw, bool):
        raise ConfigError(f"{key}: expected an integer, got {raw!r}")
    if isinstance(raw, int):
        return raw
    if isinstance(raw, str):
        try:
            return int(raw.strip())
        except ValueError:
            raise ConfigError(f"{key}: expected an integer, got {raw!r}") from None
    raise ConfigError(f"{key}: expected an integer, got {raw!r}")


def _parse_policy(raw: object) -> str:
    """Kafka's list (``compact,delete``, ``[delete, compact]``...) normalised."""
    if not isinstance(raw, str):
        raise ConfigError(f"cleanup.policy: expected a string, got {raw!r}")
    items = [p.strip().lower() for p in raw.strip().strip("[]").split(",") if p.strip()]
    if not items or len(set(items)) != len(items) or any(p not in _POLICIES for p in items):
        raise ConfigError(
            f"cleanup.policy: {raw!r} is not one of delete, compact, compact,delete"
        )
    return ",".join(p for p in ("compact", "delete") if p in items)


def _parse_ratio(raw: object) -> float:
    if isinstance(raw, bool):
        raise ConfigError(f"min.cleanable.dirty.ratio: expected a number, got {raw!r}")
    try:
        value = float(raw.strip() if isinstance(raw, str) else raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"min.cleanable.dirty.ratio: expected a number, got {raw!r}") from None
    if not 0 <= value <= 1:
        raise ConfigError(f"min.cleanable.dirty.ratio: {value} is not in [0, 1]")
    return value


assert {f.name for f in fields(LogConfig)} == {a for a, _ in _INT_KEYS.values()} | {
    "message_timestamp_type", "cleanup_policy", "min_cleanable_dirty_ratio"
}
