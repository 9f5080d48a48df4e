"""Parsing of config values shared by the schemas of :mod:`fjord.cluster`, pure."""

from __future__ import annotations

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
