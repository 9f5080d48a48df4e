"""The broker's scrubber settings (``log.scrubber.*`` broker keys, named after Kafka's
``log.cleaner.*`` keys), pure: defaults and :class:`ScrubberSettings`, read from
``fjord broker --config``. See docs/storage.md, "Scrubbing"."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from fjord.cluster.values import throttled_task_settings

#: ``log.scrubber.enable``: verify closed segments in the background (Kafka has no scrubber).
DEFAULT_SCRUBBER_ENABLE = True

#: ``log.scrubber.io.max.bytes.per.second`` (like Kafka's
#: ``log.cleaner.io.max.bytes.per.second``): the most the scrubber reads per second. 8 MiB/s
#: verifies 100 GiB in under 4 hours while leaving a disk's bandwidth to produce and fetch.
DEFAULT_SCRUBBER_IO_MAX_BYTES_PER_SECOND = 8 * 1024 * 1024

#: ``log.scrubber.backoff.ms`` (like ``log.cleaner.backoff.ms``): the pause after a pass that
#: verified every closed segment, before the next pass starts.
DEFAULT_SCRUBBER_BACKOFF_MS = 60_000

SCRUBBER_CONFIG_DEFAULTS: dict[str, str] = {
    "log.scrubber.enable": "true",
    "log.scrubber.io.max.bytes.per.second": str(DEFAULT_SCRUBBER_IO_MAX_BYTES_PER_SECOND),
    "log.scrubber.backoff.ms": str(DEFAULT_SCRUBBER_BACKOFF_MS),
}


@dataclass(frozen=True, slots=True)
class ScrubberSettings:
    """The scrubber's settings. Invariant: the rate and backoff are >= 1 (checked)."""

    enable: bool = DEFAULT_SCRUBBER_ENABLE
    io_max_bytes_per_second: int = DEFAULT_SCRUBBER_IO_MAX_BYTES_PER_SECOND
    backoff_ms: int = DEFAULT_SCRUBBER_BACKOFF_MS

    @classmethod
    def from_config(cls, config: Mapping[str, str]) -> ScrubberSettings:
        """Read the ``log.scrubber.*`` keys; ConfigError naming a bad one."""
        return cls(*throttled_task_settings(config, "log.scrubber", SCRUBBER_CONFIG_DEFAULTS))
