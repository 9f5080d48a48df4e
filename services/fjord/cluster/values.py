"""Parsing of config values shared by the schemas of :mod:`fjord.cluster`, pure."""

from __future__ import annotations

from collections.abc import Mapping

from fjord.errors import ConfigError


def positive_int(key: str, value: object) -> int:
    """``value`` (a string, surrounding blanks allowed) as an integer >= 1; ConfigError naming
    ``key`` otherwise."""
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
    if number < 1:
        raise ConfigError(f"{key}: {number} is below the minimum 1")
    return number


def throttled_task_settings(
    config: Mapping[str, str], prefix: str, defaults: Mapping[str, str]
) -> tuple[bool, int, int]:
    """``<prefix>.enable``, ``<prefix>.io.max.bytes.per.second`` and ``<prefix>.backoff.ms``
    of a broker's throttled background task (the scrubber, the log cleaner), each from
    ``config`` or ``defaults``: a boolean and two integers >= 1; ConfigError naming the key."""
    enable_key = f"{prefix}.enable"
    enable = config.get(enable_key, defaults[enable_key]).strip().lower()
    if enable not in ("true", "false"):
        raise ConfigError(f"{enable_key}: expected true or false, got {enable!r}")
    rate_key, backoff_key = f"{prefix}.io.max.bytes.per.second", f"{prefix}.backoff.ms"
    return (
        enable == "true",
        positive_int(rate_key, config.get(rate_key, defaults[rate_key])),
        positive_int(backoff_key, config.get(backoff_key, defaults[backoff_key])),
    )
