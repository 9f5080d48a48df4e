"""The broker's log cleaner settings (Kafka's ``log.cleaner.*`` broker keys), pure: defaults and
:class:`CleanerSettings`, read from ``fjord broker --config``. See docs/compaction.md."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fjord.cluster.values import positive_int, throttled_task_settings

#: ``log.cleaner.io.max.bytes.per.second``: Kafka's default is unlimited; 64 MiB/s leaves a
#: disk's bandwidth to produce and fetch while cleaning a 1 GiB segment in 16 s.
DEFAULT_CLEANER_IO_MAX_BYTES_PER_SECOND = 64 * 1024 * 1024

#: ``log.cleaner.backoff.ms`` (Kafka's 15 s): the pause when no log needs cleaning.
DEFAULT_CLEANER_BACKOFF_MS = 15_000

#: ``log.cleaner.dedupe.buffer.size`` (Kafka's 128 MiB): the offset map's memory bound, in
#: :func:`fjord.storage.compaction.offset_map_entry_bytes` (~120 bytes a key plus the key: a
#: Python dict entry, where Kafka's map takes 24). A dirty section with more keys is cleaned in
#: rounds.
DEFAULT_CLEANER_DEDUPE_BUFFER_SIZE = 128 * 1024 * 1024

CLEANER_CONFIG_DEFAULTS: dict[str, str] = {
    "log.cleaner.enable": "true",
    "log.cleaner.io.max.bytes.per.second": str(DEFAULT_CLEANER_IO_MAX_BYTES_PER_SECOND),
    "log.cleaner.backoff.ms": str(DEFAULT_CLEANER_BACKOFF_MS),
    "log.cleaner.dedupe.buffer.size": str(DEFAULT_CLEANER_DEDUPE_BUFFER_SIZE),
}


@dataclass(frozen=True, slots=True)
class CleanerSettings:
    """The log cleaner's settings. Invariant: the rate, backoff and map bound are >= 1
    (checked)."""

    enable: bool = True
    io_max_bytes_per_second: int = DEFAULT_CLEANER_IO_MAX_BYTES_PER_SECOND
    backoff_ms: int = DEFAULT_CLEANER_BACKOFF_MS
    dedupe_buffer_size: int = DEFAULT_CLEANER_DEDUPE_BUFFER_SIZE

    @classmethod
    def from_config(cls, config: Mapping[str, str]) -> CleanerSettings:
        """Read the ``log.cleaner.*`` keys; ConfigError naming a bad one."""
        key = "log.cleaner.dedupe.buffer.size"
        return cls(*throttled_task_settings(config, "log.cleaner", CLEANER_CONFIG_DEFAULTS),
                   positive_int(key, config.get(key, CLEANER_CONFIG_DEFAULTS[key])))
