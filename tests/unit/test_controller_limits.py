"""The controller's per-operation and per-broker limits (fjord.controller.limits), pure."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.cluster.defaults import MAX_BROKER_PARTITIONS, MAX_RECORDS_PER_USER_OP
from fjord.cluster.topic_config import validate_cluster_config
from fjord.controller.limits import replicas_per_broker, topic_records
from fjord.controller.planner import TopicSpec, plan_create_partitions, plan_create_topic
from fjord.errors import ConfigError, ErrorCode, PolicyViolationError, error_for_code
from fjord.metadata import ClusterConfig, MetadataEvent, MetadataImage
from tests.helpers.metadata_images import K, image_with, with_plan

RNG = random.Random(3)


def configured(brokers: int, **limits: str) -> MetadataImage:
    cfg = ClusterConfig({k.replace("_", "."): v for k, v in limits.items()}).to_json()
    return image_with(
        {b: None for b in range(1, brokers + 1)}, MetadataEvent.put(K.cluster_config, cfg, 1, 1)
    )


def test_policy_violation_is_kafkas_code_44_and_not_retriable() -> None:
    assert ErrorCode.POLICY_VIOLATION.code == 44
    assert not PolicyViolationError().retriable
    assert error_for_code(ErrorCode.POLICY_VIOLATION, "x").__class__ is PolicyViolationError


def test_defaults_are_kafkas_figures() -> None:
    assert MAX_RECORDS_PER_USER_OP == 10_000
    assert MAX_BROKER_PARTITIONS == 1000


def test_the_issues_request_is_refused_naming_the_limit_and_the_way_forward() -> None:
    image = image_with({1: None, 2: None, 3: None})
    with pytest.raises(PolicyViolationError) as info:
        plan_create_topic(image, TopicSpec("big", 100_000, 3), "id", RNG)
    text = str(info.value)
    assert "max.records.per.user.op=10000" in text
    assert "100001 metadata records" in text
    assert "at most 9999 partitions" in text and "--config max.records.per.user.op=N" in text


def test_records_count_topic_record_and_configs() -> None:
    assert topic_records(10, 2) == 13
    image = configured(1, max_records_per_user_op="12", max_broker_partitions="100")
    plan_create_topic(image, TopicSpec("ok", 10, 1, {"retention.ms": "1"}), "id", RNG)
    with pytest.raises(PolicyViolationError, match="13 metadata records"):
        plan_create_topic(
            image, TopicSpec("no", 10, 1, {"retention.ms": "1", "segment.ms": "9"}), "id", RNG
        )


def test_per_broker_limit_counts_existing_replicas() -> None:
    image = configured(3, max_broker_partitions="10")
    image = with_plan(image, plan_create_topic(image, TopicSpec("a", 6, 3), "id", RNG))
    assert replicas_per_broker(image) == {1: 6, 2: 6, 3: 6}
    plan_create_topic(image, TopicSpec("b", 4, 3), "id", RNG)  # exactly 10 each: allowed
    with pytest.raises(PolicyViolationError) as info:
        plan_create_topic(image, TopicSpec("b", 5, 3), "id", RNG)
    text = str(info.value)
    assert "max.broker.partitions=10" in text and "11 partition replicas" in text
    assert "room for 4 more" in text
    with pytest.raises(PolicyViolationError, match=r"max\.broker\.partitions"):
        plan_create_partitions(image, "a", 11, {}, RNG)
    plan_create_partitions(image, "a", 10, {}, RNG)


def test_per_broker_limit_applies_to_manual_assignments_only_where_replicas_go() -> None:
    image = configured(2, max_broker_partitions="2")
    image = with_plan(
        image, plan_create_topic(image, TopicSpec("a", assignments={0: [1], 1: [1]}), "i", RNG)
    )
    plan_create_topic(image, TopicSpec("b", assignments={0: [2], 1: [2]}), "id", RNG)
    with pytest.raises(PolicyViolationError, match="broker 1"):
        plan_create_topic(image, TopicSpec("b", assignments={0: [1]}), "id", RNG)


def test_adding_partitions_counts_records_too() -> None:
    image = configured(1, max_records_per_user_op="5")
    image = with_plan(image, plan_create_topic(image, TopicSpec("a", 2, 1), "id", RNG))
    plan_create_partitions(image, "a", 6, {}, RNG)  # 4 new + topic record = 5
    with pytest.raises(PolicyViolationError, match="at most 4 partitions"):
        plan_create_partitions(image, "a", 7, {}, RNG)


def test_limits_are_cluster_config_keys_checked_as_positive_ints() -> None:
    assert validate_cluster_config({"max.broker.partitions": "8000"}) == {
        "max.broker.partitions": "8000"
    }
    for key in ("max.broker.partitions", "max.records.per.user.op"):
        with pytest.raises(ConfigError, match=key):
            validate_cluster_config({key: "0"})


@settings(max_examples=60, deadline=None)
@given(
    brokers=st.integers(1, 4),
    rf=st.integers(1, 4),
    existing=st.integers(0, 12),
    asked=st.integers(1, 12),
    limit=st.integers(1, 20),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_creation_is_refused_exactly_when_its_placement_would_pass_the_per_broker_limit(
    brokers: int, rf: int, existing: int, asked: int, limit: int, seed: int
) -> None:
    """The limit is checked on the placement the planner makes (not on an ideal balance, which
    Kafka's rack-unaware placement does not promise): refused if and only if the same placement
    (same random state) made without the limit would give a broker receiving replicas more than
    ``limit``. Each example plans from its own ``random.Random(seed)``, so Hypothesis can replay
    it (a shared generator made a failing example pass on replay)."""
    rf = min(rf, brokers)
    image = configured(brokers, max_broker_partitions=str(10**6))
    if existing:
        image = with_plan(image, plan_create_topic(
            image, TopicSpec("a", existing, rf), "i", random.Random(seed)))
    unlimited = image
    image = image.apply([MetadataEvent.put(
        K.cluster_config, ClusterConfig({"max.broker.partitions": str(limit)}).to_json(),
        1, image.revision + 1)])
    before = replicas_per_broker(image)
    placed = replicas_per_broker(with_plan(unlimited, plan_create_topic(
        unlimited, TopicSpec("b", asked, rf), "id", random.Random(seed + 1))))
    exceeds = any(placed[b] > limit for b in placed if placed[b] != before.get(b, 0))
    try:
        plan = plan_create_topic(image, TopicSpec("b", asked, rf), "id", random.Random(seed + 1))
    except PolicyViolationError as exc:
        assert exceeds, f"refused though its placement {placed} stays within {limit}"
        assert "max.broker.partitions" in str(exc)
        return
    assert not exceeds
    after = replicas_per_broker(with_plan(image, plan))
    assert after == placed
    assert all(after[b] <= limit for b in after if after[b] != before.get(b, 0))
