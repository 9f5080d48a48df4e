"""LogConfig: Kafka names, parsing, validation errors that name the key."""

from __future__ import annotations

import pytest

from fjord.errors import ConfigError, ErrorCode
from fjord.storage import LogConfig, defaults


def test_defaults_are_kafkas() -> None:
    config = LogConfig()
    assert config.to_dict() == defaults.DEFAULT_LOG_CONFIG
    assert config.segment_bytes == 1024**3
    assert not config.log_append_time


def test_from_dict_parses_ints_and_strings_and_round_trips() -> None:
    config = LogConfig.from_dict(
        {"segment.bytes": "4096", "retention.ms": -1, "message.timestamp.type": "LogAppendTime"}
    )
    assert config.segment_bytes == 4096
    assert config.retention_ms == -1
    assert config.log_append_time
    assert LogConfig.from_dict(config.to_dict()) == config


def test_from_dict_layers_on_a_base() -> None:
    base = LogConfig.from_dict({"segment.bytes": 5000})
    assert LogConfig.from_dict({"retention.bytes": 10}, base).segment_bytes == 5000


def test_keys_of_other_components_are_ignored() -> None:
    assert LogConfig.from_dict({"min.insync.replicas": "2", "cleanup.policy": "delete"}) == (
        LogConfig()
    )


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"segment.bytez": 1}, "segment.bytez"),
        ({"segment.bytes": "ten"}, "segment.bytes"),
        ({"segment.bytes": 3}, "segment.bytes"),
        ({"segment.bytes": 2**31}, "segment.bytes"),
        ({"retention.ms": -2}, "retention.ms"),
        ({"flush.messages": 0}, "flush.messages"),
        ({"flush.ms": True}, "flush.ms"),
        ({"index.interval.bytes": 1.5}, "index.interval.bytes"),
        ({"message.timestamp.type": "WallTime"}, "message.timestamp.type"),
        ({"message.timestamp.type": 1}, "message.timestamp.type"),
    ],
)
def test_bad_values_raise_config_error_naming_the_key(raw: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        LogConfig.from_dict(raw)
    assert key in str(info.value)
    assert info.value.code is ErrorCode.INVALID_CONFIG
