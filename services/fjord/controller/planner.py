"""What each controller request changes in the metadata, computed from a :class:`MetadataImage`.

Pure: image and request in, new values (or a typed error) out. The controller's etcd shell
writes the result in fenced transactions; these functions never touch etcd.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from fjord.controller.configs import (
    default_partitions,
    default_replication_factor,
    unclean_election_allowed,
    validate_topic_config,
)
from fjord.controller.defaults import MAX_SUPPORTED_REPLICATION_FACTOR
from fjord.controller.election import initial_state, on_liveness_change
from fjord.controller.placement import assign_replicas, validate_manual_assignment
from fjord.controller.topics import find_collision, validate_topic_name
from fjord.errors import (
    ConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from fjord.metadata import MetadataImage, PartitionState, TopicRecord


@dataclass(frozen=True)
class TopicSpec:
    """A CreateTopics entry: -1 means the cluster default; ``assignments`` is manual placement
    (partition -> broker ids, first = preferred leader), empty for automatic placement."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str] = field(default_factory=dict)
    assignments: Mapping[int, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class TopicPlan:
    """The topic record to write and the partition states to create (new partitions only)."""

    name: str
    record: TopicRecord
    partitions: dict[int, PartitionState]


def live_racks(image: MetadataImage) -> dict[int, str | None]:
    return {broker_id: reg.rack for broker_id, reg in image.brokers.items()}


def _check_replication_factor(rf: int, live: int) -> None:
    if rf < 1:
        raise InvalidReplicationFactorError(f"replication factor must be at least 1, got {rf}")
    if rf > live:
        raise InvalidReplicationFactorError(
            f"replication factor {rf} is larger than the {live} live brokers"
        )
    if rf > MAX_SUPPORTED_REPLICATION_FACTOR:
        raise InvalidReplicationFactorError(
            f"replication factor {rf}: replication is not available yet "
            f"(at most {MAX_SUPPORTED_REPLICATION_FACTOR})"
        )


def plan_create_topic(
    image: MetadataImage, spec: TopicSpec, topic_id: str, rng: random.Random
) -> TopicPlan:
    """Validate a new topic and place its replicas. Raises InvalidTopicError,
    TopicAlreadyExistsError, InvalidPartitionsError, InvalidReplicationFactorError,
    InvalidReplicaAssignmentError or ConfigError (naming the key)."""
    validate_topic_name(spec.name)
    if image.topic(spec.name) is not None:
        raise TopicAlreadyExistsError(f"topic {spec.name!r} already exists")
    other = find_collision(spec.name, image.topics)
    if other is not None:
        raise InvalidTopicError(
            f"topic {spec.name!r} collides with existing topic {other!r} "
            "('.' and '_' are interchangeable in metric names)"
        )
    cluster = image.cluster_config
    racks = live_racks(image)
    if spec.assignments:
        sizes = {len(r) for r in spec.assignments.values()}
        num_partitions = (
            spec.num_partitions if spec.num_partitions != -1 else len(spec.assignments)
        )
        rf = spec.replication_factor if spec.replication_factor != -1 else max(sizes)
    else:
        num_partitions = (
            spec.num_partitions if spec.num_partitions != -1 else default_partitions(cluster)
        )
        rf = (
            spec.replication_factor
            if spec.replication_factor != -1
            else default_replication_factor(cluster)
        )
    if num_partitions < 1:
        raise InvalidPartitionsError(
            f"number of partitions must be at least 1, got {num_partitions}"
        )
    _check_replication_factor(rf, len(racks))
    configs = validate_topic_config(spec.configs, cluster)
    if spec.assignments:
        assignment = validate_manual_assignment(
            spec.assignments, range(num_partitions), racks, rf
        )
    else:
        assignment = assign_replicas(racks, num_partitions, rf, rng=rng)
    record = TopicRecord(topic_id, num_partitions, rf, configs)
    states = {p: initial_state(replicas) for p, replicas in assignment.items()}
    return TopicPlan(spec.name, record, states)


def plan_create_partitions(
    image: MetadataImage,
    name: str,
    count: int,
    assignments: Mapping[int, list[int]],
    rng: random.Random,
) -> TopicPlan:
    """Grow ``name`` to ``count`` partitions (never fewer: InvalidPartitionsError)."""
    record = image.topic(name)
    if record is None:
        raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
    current = record.partitions
    if count < current:
        raise InvalidPartitionsError(
            f"topic {name!r} has {current} partitions; partitions can only be added, not removed"
        )
    if count == current:
        raise InvalidPartitionsError(f"topic {name!r} already has {current} partitions")
    racks = live_racks(image)
    new = range(current, count)
    if assignments:
        assignment = validate_manual_assignment(
            assignments, new, racks, record.replication_factor
        )
    else:
        _check_replication_factor(record.replication_factor, len(racks))
        ordered = sorted(racks)
        first = image.partition(name, 0)
        # Kafka continues from where partition 0's leader sits in the broker list.
        start = ordered.index(first.replicas[0]) if first and first.replicas[0] in racks else None
        assignment = assign_replicas(
            racks,
            len(new),
            record.replication_factor,
            start_partition=current,
            start_index=start,
            rng=rng,
        )
    states = {p: initial_state(replicas) for p, replicas in assignment.items()}
    return TopicPlan(name, replace(record, partitions=count), states)


def plan_alter_configs(
    image: MetadataImage, name: str, set_configs: Mapping[str, str], delete: list[str]
) -> TopicRecord:
    """The topic record with ``set_configs`` applied and ``delete`` keys reset to defaults."""
    record = image.topic(name)
    if record is None:
        raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
    both = set(set_configs) & set(delete)
    if both:
        raise ConfigError(f"{sorted(both)[0]}: cannot be both set and deleted")
    config = {k: v for k, v in record.config.items() if k not in delete}
    config.update(set_configs)
    return replace(record, config=validate_topic_config(config, image.cluster_config))


def plan_liveness(image: MetadataImage) -> dict[tuple[str, int], PartitionState]:
    """Every partition whose leader or ISR must change because brokers came or went."""
    live = set(image.brokers)
    changes: dict[tuple[str, int], PartitionState] = {}
    for ref in image.all_partitions():
        record = image.topic(ref.topic)
        unclean = record is not None and unclean_election_allowed(
            record.config, image.cluster_config
        )
        new = on_liveness_change(ref.state, live, unclean)
        if new is not ref.state:
            changes[(ref.topic, ref.partition)] = new
    return changes
