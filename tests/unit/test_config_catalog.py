"""docs/configuration.md's tables are what fjord.cluster.config_catalog says (regenerate with
``python -m fjord.tools.config_doc``), and the catalog holds every key any config schema
accepts, once."""

from __future__ import annotations

import re

import pytest

from fjord.cluster.broker_config import (
    BROKER_ONLY_KEYS,
    CONTROLLER_ONLY_KEYS,
    TOPIC_CONFIG_KEYS,
    validate_broker_config,
)
from fjord.cluster.config_catalog import CATALOG
from fjord.cluster.dynamic_config import (
    DYNAMIC_BROKER_KEYS,
    READ_ONLY_BROKER_KEYS,
    plan_broker_config,
)
from fjord.cluster.topic_config import validate_topic_config
from fjord.errors import ConfigError
from fjord.tools.config_doc import DOC, render


def test_the_doc_is_generated_from_the_catalog() -> None:
    text = DOC.read_text()
    assert render(text) == text, "docs/configuration.md is stale: python -m fjord.tools.config_doc"


def test_the_catalog_holds_every_accepted_key_once() -> None:
    names = [k.name for k in CATALOG]
    assert len(names) == len(set(names))
    assert set(names) == TOPIC_CONFIG_KEYS | BROKER_ONLY_KEYS | CONTROLLER_ONLY_KEYS
    for key in CATALOG:
        assert (key.update_mode == "read-only") == (key.name in READ_ONLY_BROKER_KEYS)
        assert (key.update_mode != "read-only") == (key.name in DYNAMIC_BROKER_KEYS)


@pytest.mark.parametrize("key", [
    "segment.jitter.ms", "file.delete.delay.ms", "message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms", "compression.gzip.level", "compression.zstd.level",
    "leader.replication.throttled.replicas", "follower.replication.throttled.replicas",
    "remote.storage.enable", "local.retention.ms", "local.retention.bytes",
    "message.downconversion.enable",
])
def test_kafka_topic_keys_fjord_lacks_are_refused(key: str) -> None:
    """docs/configuration.md, "Kafka keys Fjord refuses as unknown": never stored."""
    with pytest.raises(ConfigError, match=f"^{re.escape(key)}: unknown topic config"):
        validate_topic_config({key: "1"}, {})


@pytest.mark.parametrize("key", [
    "log.retention.hours", "log.retention.minutes", "log.roll.hours", "log.cleaner.threads",
    "log.cleaner.io.buffer.size", "num.replica.fetchers", "num.io.threads",
    "num.network.threads",
])
def test_kafka_broker_keys_fjord_lacks_are_refused(key: str) -> None:
    for default in (True, False):
        with pytest.raises(ConfigError, match=f"^{re.escape(key)}: unknown broker config"):
            plan_broker_config({}, {key: "1"}, [], default=default)
    with pytest.raises(ConfigError, match=re.escape(key)):
        validate_broker_config({key: "1"})
