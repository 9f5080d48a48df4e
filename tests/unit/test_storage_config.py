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


def test_cleanup_policy_and_compaction_settings() -> None:
    assert LogConfig().cleanup_policy == "delete" and LogConfig().delete
    for raw in ("compact,delete", "[delete, compact]", " Delete,COMPACT "):
        config = LogConfig.from_dict({"cleanup.policy": raw})
        assert config.cleanup_policy == "compact,delete" and config.compact and config.delete
    compact = LogConfig.from_dict({"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1",
                                    "max.compaction.lag.ms": "60000"})
    assert compact.compact and not compact.delete
    assert (compact.min_cleanable_dirty_ratio, compact.max_compaction_lag_ms) == (0.1, 60000)
    assert LogConfig.from_dict(compact.to_dict()) == compact
    for bad in ({"cleanup.policy": "archive"}, {"cleanup.policy": "compact,compact"},
                {"cleanup.policy": ""}, {"min.cleanable.dirty.ratio": "x"},
                {"min.cleanable.dirty.ratio": "-0.1"}, {"delete.retention.ms": "-1"},
                {"min.compaction.lag.ms": "-1"}, {"max.compaction.lag.ms": "0"}):
        (key,) = bad
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            LogConfig.from_dict(bad)
