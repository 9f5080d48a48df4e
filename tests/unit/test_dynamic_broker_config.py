"""Dynamic broker configs, the pure core (fjord.cluster.dynamic_config): Kafka's names, Kafka's
precedence (per broker > cluster default > static > built in), read-only keys refused with
Kafka's error, unknown keys and bad values with INVALID_CONFIG naming them."""

from __future__ import annotations

import pytest

from fjord.cluster.dynamic_config import (
    DYNAMIC_BROKER_KEYS,
    READ_ONLY_BROKER_KEYS,
    broker_key,
    broker_name,
    describe_default_broker_config,
    effective_broker_config,
    plan_broker_config,
)
from fjord.cluster.topic_config import TOPIC_CONFIG_DEFAULTS, describe_broker_config
from fjord.errors import ConfigError, ErrorCode, InvalidRequestError


def test_kafka_broker_names_map_to_fjord_keys_and_back() -> None:
    assert broker_key("log.retention.ms") == "retention.ms"
    assert broker_key("message.max.bytes") == "max.message.bytes"
    assert broker_key("min.insync.replicas") == "min.insync.replicas"
    assert broker_name("retention.ms") == "log.retention.ms"
    assert broker_name("cleanup.policy") == "log.cleanup.policy"
    for key in TOPIC_CONFIG_DEFAULTS:  # every topic default has a broker name that maps back
        assert broker_key(broker_name(key)) == key
    assert not DYNAMIC_BROKER_KEYS & READ_ONLY_BROKER_KEYS


def test_set_delete_and_replace() -> None:
    current = {"retention.ms": "1000", "num.partitions": "3"}
    new = plan_broker_config(current, {"log.segment.bytes": "1048576"}, ["log.retention.ms"],
                             default=True)
    assert new == {"segment.bytes": "1048576", "num.partitions": "3"}  # controller key kept
    replaced = plan_broker_config(new, {"log.cleaner.backoff.ms": "500"}, [], default=True,
                                  replace_all=True)
    assert replaced == {"log.cleaner.backoff.ms": "500", "num.partitions": "3"}


@pytest.mark.parametrize(("change", "code", "needles"), [
    ({"replica.lag.time.max.ms": "1000"}, ErrorCode.INVALID_REQUEST,
     ["Cannot update these configs dynamically: replica.lag.time.max.ms"]),
    ({"num.partitions": "3"}, ErrorCode.INVALID_REQUEST, ["num.partitions"]),
    ({"log.cleaner.enable": "false"}, ErrorCode.INVALID_REQUEST, ["log.cleaner.enable"]),
    ({"log.retention.hours": "1"}, ErrorCode.INVALID_CONFIG,
     ["log.retention.hours: unknown broker config"]),
    ({"log.retention.ms": "soon"}, ErrorCode.INVALID_CONFIG, ["retention.ms", "'soon'"]),
    ({"log.cleaner.backoff.ms": "0"}, ErrorCode.INVALID_CONFIG, ["log.cleaner.backoff.ms"]),
    ({"compression.type": "brotli"}, ErrorCode.INVALID_CONFIG, ["compression.type"]),
    ({"log.preallocate": "true"}, ErrorCode.INVALID_CONFIG, ["preallocate", "not supported"]),
    ({"unclean.leader.election.enable": "true"}, ErrorCode.INVALID_REQUEST,
     ["only a cluster-wide default"]),
])
def test_refusals_name_the_key(change: dict[str, str], code: ErrorCode,
                               needles: list[str]) -> None:
    with pytest.raises((ConfigError, InvalidRequestError)) as caught:
        plan_broker_config({}, change, [], default=False)
    assert caught.value.code is code
    for needle in needles:
        assert needle in str(caught.value)


def test_unclean_election_is_a_cluster_wide_default() -> None:
    assert plan_broker_config({}, {"unclean.leader.election.enable": "true"}, [],
                              default=True) == {"unclean.leader.election.enable": "true"}


def test_precedence_and_sources() -> None:
    static = {"retention.ms": "1", "segment.bytes": "2000", "replica.lag.time.max.ms": "5000",
              "log.cleaner.backoff.ms": "9"}
    cluster = {"retention.ms": "10", "segment.bytes": "3000", "num.partitions": "4"}
    dynamic = {"retention.ms": "100"}
    assert effective_broker_config(static, cluster, dynamic) == {
        "retention.ms": "100", "segment.bytes": "3000", "replica.lag.time.max.ms": "5000",
        "log.cleaner.backoff.ms": "9"}
    entries = {e.name: (e.value, e.source)
               for e in describe_broker_config(static, cluster, dynamic)}
    assert entries["log.retention.ms"] == ("100", "DYNAMIC_BROKER")
    assert entries["log.segment.bytes"] == ("3000", "CLUSTER_DEFAULT")
    assert entries["replica.lag.time.max.ms"] == ("5000", "STATIC_BROKER")
    assert entries["log.cleaner.backoff.ms"] == ("9", "STATIC_BROKER")
    assert entries["log.roll.ms"][1] == "DEFAULT"
    assert "num.partitions" not in entries and "retention.ms" not in entries
    assert [(e.name, e.value) for e in describe_default_broker_config(cluster)] == [
        ("log.retention.ms", "10"), ("log.segment.bytes", "3000")]


def test_static_configs_take_kafkas_broker_names() -> None:
    """server.properties' names work where a whole cluster's or a broker's static config is
    given (fjord local up --config, a FjordCluster's config, fjord broker/controller --config)."""
    from fjord.cluster.broker_config import canonical_keys
    from fjord.cluster.topic_config import split_cluster_config, validate_cluster_config

    controller, brokers = split_cluster_config(
        {"log.retention.ms": "5", "num.partitions": "2", "log.cleaner.backoff.ms": "9"})
    assert controller == {"retention.ms": "5", "num.partitions": "2"}
    assert brokers == {"retention.ms": "5", "log.cleaner.backoff.ms": "9"}
    assert validate_cluster_config({"message.max.bytes": "2000"}) == {
        "max.message.bytes": "2000"}
    with pytest.raises(ConfigError, match=r"retention\.ms: the same setting as log\.retention\.ms"):
        canonical_keys({"log.retention.ms": "5", "retention.ms": "6"})
