"""Client configuration: Kafka's names and defaults; bad input fails naming the key."""

from __future__ import annotations

import pytest

from fjord.config import (
    ADMIN_CONFIG,
    CONSUMER_CONFIG,
    PRODUCER_CONFIG,
    admin_config,
    consumer_config,
    parse_host_port,
    producer_config,
)
from fjord.errors import ConfigError

BOOT = {"bootstrap.servers": "127.0.0.1:9092"}


def test_producer_defaults_are_kafkas() -> None:
    config = producer_config(BOOT)
    assert config["acks"] == -1
    assert config["batch.size"] == 16384
    assert config["linger.ms"] == 5
    assert config["compression.type"] == "none"
    assert config["delivery.timeout.ms"] == 120000
    assert config["request.timeout.ms"] == 30000
    assert config["max.in.flight.requests.per.connection"] == 5
    assert config["buffer.memory"] == 33554432
    assert config["max.block.ms"] == 60000
    assert config["bootstrap.servers"] == (("127.0.0.1", 9092),)
    assert set(config) == set(PRODUCER_CONFIG)


def test_consumer_and_admin_defaults() -> None:
    consumer = consumer_config(BOOT)
    assert consumer["auto.offset.reset"] == "latest"
    assert consumer["fetch.min.bytes"] == 1
    assert consumer["fetch.max.wait.ms"] == 500
    assert consumer["fetch.max.bytes"] == 52428800
    assert consumer["max.partition.fetch.bytes"] == 1048576
    assert consumer["max.poll.records"] == 500
    assert set(consumer) == set(CONSUMER_CONFIG)
    admin = admin_config(BOOT)
    assert admin["default.api.timeout.ms"] == 60000
    assert set(admin) == set(ADMIN_CONFIG)


@pytest.mark.parametrize(
    ("value", "expected"), [("all", -1), ("-1", -1), (-1, -1), ("1", 1), (0, 0), ("ALL", -1)]
)
def test_acks_spellings(value: object, expected: int) -> None:
    assert producer_config({**BOOT, "acks": value})["acks"] == expected


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("acks", "2"),
        ("acks", "some"),
        ("linger.ms", -1),
        ("linger.ms", "soon"),
        ("batch.size", 0),
        ("batch.size", True),
        ("compression.type", "brotli"),
        ("retries", -3),
        ("max.in.flight.requests.per.connection", 0),
        ("enable.idempotence", "perhaps"),
        ("bootstrap.servers", ""),
        ("bootstrap.servers", "host:notaport"),
        ("bootstrap.servers", "host:70000"),
        ("client.id", 5),
    ],
)
def test_bad_producer_values_name_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        producer_config({**BOOT, key: value})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("auto.offset.reset", "smallest"),
        ("max.poll.records", 0),
        ("fetch.max.wait.ms", 30000),
        ("isolation.level", "dirty"),
    ],
)
def test_bad_consumer_values_name_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        consumer_config({**BOOT, key: value})


def test_unknown_key_and_missing_bootstrap() -> None:
    with pytest.raises(ConfigError, match=r"lingers\.ms"):
        producer_config({**BOOT, "lingers.ms": 5})
    with pytest.raises(ConfigError, match=r"auto\.offset\.reset"):
        producer_config({**BOOT, "auto.offset.reset": "earliest"})  # a consumer key
    with pytest.raises(ConfigError, match=r"bootstrap\.servers"):
        consumer_config({})
    with pytest.raises(ConfigError, match="dict"):
        admin_config("bootstrap.servers=x")  # type: ignore[arg-type]


def test_cross_field_checks() -> None:
    with pytest.raises(ConfigError, match=r"delivery\.timeout\.ms"):
        producer_config({**BOOT, "delivery.timeout.ms": 1000, "request.timeout.ms": 30000})


def test_bootstrap_forms() -> None:
    assert parse_host_port("broker") == ("broker", 9092)
    assert parse_host_port("[::1]:9093") == ("::1", 9093)
    assert parse_host_port(" a:1 ") == ("a", 1)
    config = consumer_config({"bootstrap.servers": "a:1, b:2,"})
    assert config["bootstrap.servers"] == (("a", 1), ("b", 2))
    assert consumer_config({"bootstrap.servers": ["a:1"]})["bootstrap.servers"] == (("a", 1),)
    with pytest.raises(ConfigError):
        parse_host_port("[::1")


def test_docs_list_every_property_with_its_default() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "clients.md").read_text()
    for definitions in (PRODUCER_CONFIG, CONSUMER_CONFIG, ADMIN_CONFIG):
        for name, definition in definitions.items():
            default = definition.default
            shown = (
                "(none)"
                if default is None
                else str(default).lower()
                if isinstance(default, bool)
                else str(default)
            )
            assert f"| `{name}` | `{shown}` |" in text, name
