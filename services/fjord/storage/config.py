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
}
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
        if self.message_timestamp_type not in _TIMESTAMP_TYPES:
            raise ConfigError(
                f"message.timestamp.type: {self.message_timestamp_type!r} is not one of "
                f"{', '.join(_TIMESTAMP_TYPES)}"
            )

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
            elif key not in defaults.OTHER_TOPIC_CONFIG_KEYS:
                raise ConfigError(f"{key}: unknown topic config")
        return replace(base or cls(), **changes)

    def to_dict(self) -> dict[str, int | str]:
        """This config with Kafka names (the inverse of :meth:`from_dict`)."""
        out: dict[str, int | str] = {
            key: getattr(self, attr) for key, (attr, _) in _INT_KEYS.items()
        }
        out["message.timestamp.type"] = self.message_timestamp_type
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


assert {f.name for f in fields(LogConfig)} == {a for a, _ in _INT_KEYS.values()} | {
    "message_timestamp_type"
}
