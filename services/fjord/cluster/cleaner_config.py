"""The broker's log cleaner settings (Kafka's ``log.cleaner.*`` broker keys), pure: defaults and
:class:`CleanerSettings`, read from ``fjord broker --config``. See docs/compaction.md."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fjord.errors import ConfigError

#: ``log.cleaner.io.max.bytes.per.second``: Kafka's default is unlimited; 64 MiB/s leaves a
#: disk's bandwidth to produce and fetch while cleaning a 1 GiB segment in 16 s.
DEFAULT_CLEANER_IO_MAX_BYTES_PER_SECOND = 64 * 1024 * 1024

#: ``log.cleaner.backoff.ms`` (Kafka's 15 s): the pause when no log needs cleaning.
DEFAULT_CLEANER_BACKOFF_MS = 15_000

CLEANER_CONFIG_DEFAULTS: dict[str, str] = {
    "log.cleaner.enable": "true",
    "log.cleaner.io.max.bytes.per.second": str(DEFAULT_CLEANER_IO_MAX_BYTES_PER_SECOND),
    "log.cleaner.backoff.ms": str(DEFAULT_CLEANER_BACKOFF_MS),
}


def _positive_int(config: Mapping[str, str], key: str) -> int:
    raw = config.get(key, CLEANER_CONFIG_DEFAULTS[key])
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"{key}: expected a positive integer, got {raw!r}")
    return value


@dataclass(frozen=True, slots=True)
class CleanerSettings:
    """The log cleaner's settings. Invariant: the rate and backoff are >= 1 (checked)."""

    enable: bool = True
    io_max_bytes_per_second: int = DEFAULT_CLEANER_IO_MAX_BYTES_PER_SECOND
    backoff_ms: int = DEFAULT_CLEANER_BACKOFF_MS

    @classmethod
    def from_config(cls, config: Mapping[str, str]) -> CleanerSettings:
        """Read the ``log.cleaner.*`` keys; ConfigError naming a bad one."""
        enable = config.get("log.cleaner.enable", "true").strip().lower()
        if enable not in ("true", "false"):
            raise ConfigError(f"log.cleaner.enable: expected true or false, got {enable!r}")
        return cls(
            enable == "true",
            _positive_int(config, "log.cleaner.io.max.bytes.per.second"),
            _positive_int(config, "log.cleaner.backoff.ms"),
        )
