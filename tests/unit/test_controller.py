"""The controller's pure cores: topic names, configs, elections, ISR changes and the planner."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.cluster.broker_config import validate_broker_config
from fjord.cluster.dynamic_config import broker_key
from fjord.cluster.topic_config import (
    describe_broker_config,
    describe_topic_config,
    unclean_election_allowed,
    validate_cluster_config,
    validate_topic_config,
)
from fjord.controller.election import alter_isr, initial_state, on_liveness_change
from fjord.controller.planner import (
    TopicSpec,
    plan_alter_configs,
    plan_create_partitions,
    plan_create_topic,
    plan_liveness,
)
from fjord.controller.topics import find_collision, validate_topic_name
from fjord.errors import (
    ConfigError,
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    InvalidUpdateVersionError,
    NotLeaderOrFollowerError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from fjord.metadata import (
    ClusterConfig,
    MetadataEvent,
    PartitionState,
    TopicRecord,
)
from tests.helpers.metadata_images import K, image_with, with_plan

# -- topic names -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "A-b_c.9", "x" * 249, "__consumer_offsets", "..."])
def test_legal_topic_names(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize(
    ("name", "text"),
    [("", "empty"), (".", "cannot"), ("..", "cannot"), ("x" * 250, "249"), ("a b", "illegal"),
     ("a/b", "illegal"), ("é", "illegal"), ("a:b", "illegal")],
)
def test_illegal_topic_names(name: str, text: str) -> None:
    with pytest.raises(InvalidTopicError, match=text):
        validate_topic_name(name)


def test_collisions_are_dot_underscore_equivalence() -> None:
    assert find_collision("a.b", ["a_b", "c"]) == "a_b"
    assert find_collision("a_b", ["a.b"]) == "a.b"
    assert find_collision("a.b", ["a.b"]) is None  # itself is not a collision
    assert find_collision("ab", ["a_b"]) is None


# -- configs ------------------------------------------------------------------------------------


def test_topic_config_validation_names_the_key() -> None:
    assert validate_topic_config({"retention.ms": "1000"}, {}) == {"retention.ms": "1000"}
    for config, key in [
        ({"nope": "1"}, "nope"),
        ({"retention.ms": "x"}, "retention.ms"),
        ({"segment.bytes": "1"}, "segment.bytes"),
        ({"cleanup.policy": "compact,archive"}, "cleanup.policy"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "min.cleanable.dirty.ratio"),
        ({"max.compaction.lag.ms": "0"}, "max.compaction.lag.ms"),
        ({"compression.type": "brotli"}, "compression.type"),
        ({"min.insync.replicas": "0"}, "min.insync.replicas"),
        ({"unclean.leader.election.enable": "yes"}, "unclean.leader.election.enable"),
        ({"delete.retention.ms": "-5"}, "delete.retention.ms"),
    ]:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            validate_topic_config(config, {})


def test_cluster_config_accepts_controller_keys() -> None:
    config = {"num.partitions": "3", "min.insync.replicas": "2"}
    assert validate_cluster_config(config) == config
    with pytest.raises(ConfigError, match=r"num\.partitions"):
        validate_cluster_config({"num.partitions": "0"})
    with pytest.raises(ConfigError, match="bogus"):
        validate_cluster_config({"bogus": "1"})


def test_describe_layers_topic_over_cluster_over_default() -> None:
    entries = {
        e.name: (e.value, e.source, e.is_default)
        for e in describe_topic_config({"retention.ms": "5"}, {"segment.bytes": "1048576"})
    }
    assert entries["retention.ms"] == ("5", "TOPIC", False)
    assert entries["segment.bytes"] == ("1048576", "CLUSTER_DEFAULT", True)
    assert entries["cleanup.policy"] == ("delete", "DEFAULT", True)


def test_broker_description_layers_cluster_over_static_over_default() -> None:
    """Every key a broker reads, once, sorted; the cluster's defaults win over the broker's
    --config for topic defaults (as in topic_settings), broker-only keys come from --config;
    topic defaults under Kafka's broker names (log.retention.ms)."""
    broker = {"replica.lag.time.max.ms": "5000", "retention.ms": "1", "segment.bytes": "2048"}
    described = describe_broker_config(broker, {"retention.ms": "7", "num.partitions": "3"})
    names = [e.name for e in described]
    assert names == sorted(set(names))
    entries = {e.name: (e.value, e.source) for e in described}
    assert entries["replica.lag.time.max.ms"] == ("5000", "STATIC_BROKER")
    assert entries["log.retention.ms"] == ("7", "CLUSTER_DEFAULT")
    assert entries["log.segment.bytes"] == ("2048", "STATIC_BROKER")
    assert entries["min.insync.replicas"] == ("1", "DEFAULT")
    assert entries["auto.create.topics.enable"] == ("false", "DEFAULT")
    assert "num.partitions" not in entries  # the controller's key, not a broker's
    # every value is valid
    validate_broker_config({broker_key(e.name): e.value for e in described})


def test_unclean_election_flag_layers() -> None:
    key = "unclean.leader.election.enable"
    assert not unclean_election_allowed({}, {})
    assert unclean_election_allowed({}, {key: "true"})
    assert not unclean_election_allowed({key: "false"}, {key: "true"})


# -- elections ----------------------------------------------------------------------------------


def test_rf1_leader_goes_offline_and_returns() -> None:
    state = initial_state([2])
    off = on_liveness_change(state, live={1, 3})
    assert off == PartitionState((2,), (2,), -1, 1, 1)
    assert on_liveness_change(off, live={1, 3}) is off  # nothing changes while it is down
    back = on_liveness_change(off, live={1, 2, 3})
    assert back == PartitionState((2,), (2,), 2, 2, 2)


def test_new_leader_comes_from_the_isr_in_preferred_order() -> None:
    state = PartitionState((1, 2, 3), (1, 3, 2), 1, 4, 7)
    after = on_liveness_change(state, live={2, 3})
    assert after == PartitionState((1, 2, 3), (3, 2), 2, 5, 8)


def test_follower_death_shrinks_isr_without_leader_change() -> None:
    state = PartitionState((1, 2, 3), (1, 2, 3), 1, 4, 7)
    assert on_liveness_change(state, live={1, 3}) == PartitionState((1, 2, 3), (1, 3), 1, 4, 8)


def test_no_unclean_election_unless_allowed() -> None:
    state = PartitionState((1, 2), (1,), 1, 0, 0)
    clean = on_liveness_change(state, live={2})
    assert clean == PartitionState((1, 2), (1,), -1, 1, 1)
    unclean = on_liveness_change(state, live={2}, unclean_allowed=True)
    assert unclean == PartitionState((1, 2), (2,), 2, 1, 1)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.frozensets(st.integers(1, 4)), min_size=1, max_size=12),
    st.permutations([1, 2, 3, 4]),
    st.integers(1, 4),
    st.booleans(),
)
def test_liveness_invariants(lives, order, rf, unclean) -> None:  # type: ignore[no-untyped-def]
    state = initial_state(list(order[:rf]))
    for live in lives:
        new = on_liveness_change(state, live, unclean)
        assert set(new.isr) <= set(new.replicas) and new.isr
        assert new.leader == -1 or new.leader in new.isr
        if new.leader != -1:
            assert new.leader in live
        assert new.leader_epoch == state.leader_epoch + (new.leader != state.leader)
        assert new.partition_epoch == state.partition_epoch + (new != state)
        # Without unclean election only ISR members ever lead.
        if not unclean and new.leader != -1:
            assert new.leader in state.isr
        state = new


def test_alter_isr_fencing_and_rules() -> None:
    state = PartitionState((1, 2, 3), (1, 2), 1, 3, 5)
    grown = alter_isr(state, 1, 3, 5, [1, 2, 3], live={1, 2, 3})
    assert grown == PartitionState((1, 2, 3), (1, 2, 3), 1, 3, 6)
    assert alter_isr(state, 1, 3, 5, [1, 2], live={1, 2}) is state
    with pytest.raises(NotLeaderOrFollowerError):
        alter_isr(state, 2, 3, 5, [1, 2], {1, 2, 3})
    with pytest.raises(FencedLeaderEpochError):
        alter_isr(state, 1, 2, 5, [1, 2], {1, 2, 3})
    with pytest.raises(InvalidUpdateVersionError):
        alter_isr(state, 1, 3, 4, [1, 2], {1, 2, 3})
    with pytest.raises(InvalidRequestError):
        alter_isr(state, 1, 3, 5, [2, 3], {1, 2, 3})  # without the leader
    with pytest.raises(InvalidRequestError):
        alter_isr(state, 1, 3, 5, [1, 4], {1, 2, 3, 4})  # not a replica
    with pytest.raises(IneligibleReplicaError):
        alter_isr(state, 1, 3, 5, [1, 2, 3], {1, 2})  # 3 is not live


# -- planner ------------------------------------------------------------------------------------

RNG = random.Random(7)


def test_plan_create_topic_uses_cluster_defaults() -> None:
    cfg = ClusterConfig({"num.partitions": "4"}).to_json()
    image = image_with({1: None, 2: None}, MetadataEvent.put(K.cluster_config, cfg, 1, 1))
    plan = plan_create_topic(image, TopicSpec("t"), "id", RNG)
    assert plan.record == TopicRecord("id", 4, 1, {})
    assert sorted(plan.partitions) == [0, 1, 2, 3]
    assert all(s.leader_epoch == 0 and s.isr == s.replicas for s in plan.partitions.values())


def test_plan_create_topic_with_manual_assignment() -> None:
    image = image_with({1: None, 2: None})
    plan = plan_create_topic(image, TopicSpec("t", assignments={0: [2], 1: [2]}), "id", RNG)
    assert plan.record.partitions == 2 and plan.partitions[1].leader == 2
    with pytest.raises(InvalidReplicaAssignmentError):
        plan_create_topic(image, TopicSpec("t", assignments={0: [5]}), "id", RNG)


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (TopicSpec("t", 0), InvalidPartitionsError),
        (TopicSpec("t", 1, 0), InvalidReplicationFactorError),
        (TopicSpec("t", 1, 3), InvalidReplicationFactorError),  # more than live brokers
        (TopicSpec("bad name"), InvalidTopicError),
        (TopicSpec("t", configs={"x": "1"}), ConfigError),
    ],
)
def test_plan_create_topic_refusals(spec: TopicSpec, error: type[Exception]) -> None:
    with pytest.raises(error):
        plan_create_topic(image_with({1: None, 2: None}), spec, "id", RNG)


def test_plan_refuses_without_live_brokers_and_existing_topics() -> None:
    with pytest.raises(InvalidReplicationFactorError, match="0 live brokers"):
        plan_create_topic(image_with({}), TopicSpec("t"), "id", RNG)
    image = with_plan(image_with({1: None}), plan_create_topic(image_with({1: None}),
                                                               TopicSpec("a.b"), "id", RNG))
    with pytest.raises(TopicAlreadyExistsError):
        plan_create_topic(image, TopicSpec("a.b"), "id2", RNG)
    with pytest.raises(InvalidTopicError, match="collides"):
        plan_create_topic(image, TopicSpec("a_b"), "id2", RNG)


def test_plan_create_partitions_and_alter_configs() -> None:
    image = image_with({1: None, 2: None, 3: None})
    image = with_plan(image, plan_create_topic(image, TopicSpec("t", 2), "id", RNG))
    plan = plan_create_partitions(image, "t", 5, {}, RNG)
    assert plan.record.partitions == 5 and sorted(plan.partitions) == [2, 3, 4]
    for count in (1, 2):
        with pytest.raises(InvalidPartitionsError):
            plan_create_partitions(image, "t", count, {}, RNG)
    with pytest.raises(UnknownTopicOrPartitionError):
        plan_create_partitions(image, "u", 3, {}, RNG)
    record = plan_alter_configs(image, "t", {"retention.ms": "9"}, [])
    assert record.config == {"retention.ms": "9"}
    image = image.apply([MetadataEvent.put(K.topic("t"), record.to_json(), 1, image.revision + 1)])
    assert plan_alter_configs(image, "t", {}, ["retention.ms"]).config == {}
    with pytest.raises(ConfigError, match="both"):
        plan_alter_configs(image, "t", {"retention.ms": "1"}, ["retention.ms"])
    with pytest.raises(UnknownTopicOrPartitionError):
        plan_alter_configs(image, "u", {}, [])


def test_plan_liveness_changes_only_affected_partitions() -> None:
    image = image_with({1: None, 2: None})
    image = with_plan(image, plan_create_topic(image, TopicSpec("t", 4), "id", RNG))
    assert plan_liveness(image) == {}
    image = image.apply([MetadataEvent.delete(K.broker(2), image.revision + 1)])
    changes = plan_liveness(image)
    led_by_2 = {("t", r.partition) for r in image.partitions_led_by(2)}
    assert set(changes) == led_by_2 and all(s.leader == -1 for s in changes.values())
