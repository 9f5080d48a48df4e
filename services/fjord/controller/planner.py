"""What each controller request changes in the metadata, computed from a :class:`MetadataImage`.

Pure: image and request in, new values (or a typed error) out. The controller's etcd shell
writes the result in fenced transactions; these functions never touch etcd.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

from fjord.cluster.topic_config import (
    check_min_insync_replicas,
    default_partitions,
    default_replication_factor,
    unclean_election_allowed,
    validate_topic_config,
)
from fjord.controller.election import (
    elect_preferred,
    elect_unclean,
    initial_state,
    needs_preferred_election,
    on_liveness_change,
)
from fjord.controller.limits import check_broker_partitions, check_records_per_op, topic_records
from fjord.controller.placement import assign_replicas, validate_manual_assignment
from fjord.controller.reassignment import (
    can_complete,
    cancel_reassignment,
    complete_reassignment,
    start_reassignment,
)
from fjord.controller.topics import find_collision, validate_topic_name
from fjord.errors import (
    ConfigError,
    ElectionNotNeededError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from fjord.metadata import MetadataImage, PartitionState, TopicRecord
from fjord.topic_partition import TopicPartition


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


def plan_create_topic(
    image: MetadataImage, spec: TopicSpec, topic_id: str, rng: random.Random
) -> TopicPlan:
    """Validate a new topic and place its replicas. Raises InvalidTopicError,
    TopicAlreadyExistsError, InvalidPartitionsError, InvalidReplicationFactorError,
    InvalidReplicaAssignmentError, ConfigError (naming the key) or PolicyViolationError (a
    limit of fjord.controller.limits)."""
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
    check_min_insync_replicas(spec.name, rf, configs, cluster)
    what = f"creating topic {spec.name!r} with {num_partitions} partitions"
    check_records_per_op(
        cluster, what, topic_records(num_partitions, len(configs)), num_partitions
    )
    if spec.assignments:
        assignment = validate_manual_assignment(
            spec.assignments, range(num_partitions), racks, rf
        )
    else:
        assignment = assign_replicas(racks, num_partitions, rf, rng=rng)
    check_broker_partitions(image, f"{what} (replication factor {rf})", assignment.values())
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
    what = f"adding {len(new)} partitions to topic {name!r}"
    check_records_per_op(image.cluster_config, what, topic_records(len(new), 0), len(new))
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
    check_broker_partitions(image, what, assignment.values())
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
    config = validate_topic_config(config, image.cluster_config)
    check_min_insync_replicas(name, record.replication_factor, config, image.cluster_config)
    return replace(record, config=config)


def partition_keys(image: MetadataImage) -> frozenset[tuple[str, int]]:
    """(topic id, partition) of every partition in ``image`` (``known_at_restart``'s form)."""
    keys = []
    for ref in image.all_partitions():
        record = image.topic(ref.topic)
        if record is not None:
            keys.append((record.topic_id, ref.partition))
    return frozenset(keys)


def plan_liveness(
    image: MetadataImage,
    *,
    waiting_for: Collection[int] = (),
    restarted: Collection[int] = (),
    known_at_restart: Mapping[int, Collection[tuple[str, int]]] | None = None,
) -> dict[TopicPartition, PartitionState]:
    """Every partition whose leader or ISR must change because brokers came or went.

    ``waiting_for``: brokers not registered now whose return is awaited (a controller that just
    took office, e.g. after an etcd outage in which every lease expired, gives them time to
    register again): a partition whose leader or ISR names one of them is left as it is.
    ``restarted``: brokers registered again by a new process (a new incarnation): the old
    process's place ends first, as if it had died (it leaves ISRs where it is not the last
    member, its partitions get another leader), then the new one counts as live (it leads
    again where it is the only ISR member, under a new leader epoch).
    ``known_at_restart``: per restarted broker, the partitions (topic id, partition) that
    existed when its new process was seen; only those lose the old process's place. A
    partition created after that (a topic created between the new registration and this
    reconcile) never had the old process: its leader and ISR are the new one's, and moving
    them would only fail the writes they are taking. None: every partition."""
    live = set(image.brokers)
    held = set(waiting_for) - live
    restarted_live = set(restarted) & live
    changes: dict[TopicPartition, PartitionState] = {}
    for ref in image.all_partitions():
        state = ref.state
        if held and (state.leader in held or not held.isdisjoint(state.isr)):
            continue
        record = image.topic(ref.topic)
        unclean = record is not None and unclean_election_allowed(
            record.config, image.cluster_config
        )
        new = state
        gone_before = restarted_live
        if gone_before and known_at_restart is not None:
            key = (record.topic_id if record is not None else "", ref.partition)
            gone_before = {
                b for b in gone_before if b not in known_at_restart or key in known_at_restart[b]
            }
        if gone_before and (state.leader in gone_before or not gone_before.isdisjoint(state.isr)):
            new = on_liveness_change(new, live - gone_before, unclean)
        new = on_liveness_change(new, live, unclean)
        if new is not state:
            changes[TopicPartition(ref.topic, ref.partition)] = new
    return changes


def plan_reconcile(
    image: MetadataImage,
    *,
    waiting_for: Collection[int] = (),
    restarted: Collection[int] = (),
    known_at_restart: Mapping[int, Collection[tuple[str, int]]] | None = None,
) -> dict[TopicPartition, PartitionState]:
    """:func:`plan_liveness`, then every reassignment that can complete now (all target
    replicas in the ISR) completes. Run after broker changes, ISR changes and on take-over, so
    a new controller resumes the reassignments its predecessor started."""
    live = set(image.brokers)
    changes = plan_liveness(
        image, waiting_for=waiting_for, restarted=restarted, known_at_restart=known_at_restart
    )
    for ref in image.all_partitions():
        key = TopicPartition(ref.topic, ref.partition)
        state = changes.get(key, ref.state)
        if can_complete(state, live):
            changes[key] = complete_reassignment(state, live)
    return changes


def plan_preferred_rebalance(image: MetadataImage) -> dict[TopicPartition, PartitionState]:
    """Auto leader rebalancing: partitions whose preferred replica is live and in the ISR but
    does not lead get it back as leader."""
    live = set(image.brokers)
    return {
        TopicPartition(ref.topic, ref.partition): elect_preferred(ref.state, live)
        for ref in image.all_partitions()
        if needs_preferred_election(ref.state, live)
    }


#: ElectLeaders election types (Kafka's values).
PREFERRED_ELECTION = 0
UNCLEAN_ELECTION = 1


@dataclass(frozen=True)
class PartitionOutcome:
    """One partition's result of a batch request: the error, or None."""

    topic: str
    partition: int
    error: Exception | None


def _known_partition(image: MetadataImage, topic: str, partition: int) -> PartitionState:
    state = image.partition(topic, partition)
    if state is None:
        raise UnknownTopicOrPartitionError(f"{topic}-{partition} does not exist")
    return state


def plan_elect_leaders(
    image: MetadataImage, election_type: int, partitions: list[TopicPartition] | None
) -> tuple[dict[TopicPartition, PartitionState], list[PartitionOutcome]]:
    """ElectLeaders: the new states and each partition's outcome (None = all partitions;
    then partitions needing no election are left out of the outcomes, as Kafka does)."""
    if election_type not in (PREFERRED_ELECTION, UNCLEAN_ELECTION):
        raise InvalidRequestError(f"unknown election type {election_type}")
    live = set(image.brokers)
    elect = elect_preferred if election_type == PREFERRED_ELECTION else elect_unclean
    keys = (
        [(r.topic, r.partition) for r in image.all_partitions()]
        if partitions is None
        else partitions
    )
    changes: dict[TopicPartition, PartitionState] = {}
    outcomes: list[PartitionOutcome] = []
    for topic, partition in keys:
        try:
            state = _known_partition(image, topic, partition)
            changes[TopicPartition(topic, partition)] = elect(state, live)
        except ElectionNotNeededError as exc:
            if partitions is not None:
                outcomes.append(PartitionOutcome(topic, partition, exc))
            continue
        except Exception as exc:
            outcomes.append(PartitionOutcome(topic, partition, exc))
            continue
        outcomes.append(PartitionOutcome(topic, partition, None))
    return changes, outcomes


@dataclass(frozen=True)
class ReassignmentRequest:
    """One partition of AlterPartitionReassignments: ``target`` None cancels."""

    topic: str
    partition: int
    target: tuple[int, ...] | None


def _records_after(
    image: MetadataImage, changes: Mapping[TopicPartition, PartitionState]
) -> dict[str, TopicRecord]:
    """Topic records whose replication factor changes with ``changes``: the size every
    partition's target replica list shares (none when sizes differ: the RF stays)."""
    out: dict[str, TopicRecord] = {}
    for topic in sorted({t for t, _ in changes}):
        record = image.topic(topic)
        if record is None:
            continue
        sizes = {
            len(changes.get(TopicPartition(topic, p), state).target_replicas)
            for p, state in image.partitions(topic).items()
        }
        if len(sizes) == 1:
            (size,) = sizes
            if size != record.replication_factor:
                out[topic] = replace(record, replication_factor=size)
    return out


def plan_alter_reassignments(
    image: MetadataImage, requests: list[ReassignmentRequest]
) -> tuple[
    dict[TopicPartition, PartitionState], dict[str, TopicRecord], list[PartitionOutcome]
]:
    """AlterPartitionReassignments: new partition states (step 1 of the procedure, or cancel),
    topic records whose replication factor follows, and each partition's outcome. A partition
    named twice is refused (INVALID_REQUEST), bad targets with INVALID_REPLICA_ASSIGNMENT,
    cancelling an idle partition with NO_REASSIGNMENT_IN_PROGRESS."""
    live = set(image.brokers)
    changes: dict[TopicPartition, PartitionState] = {}
    outcomes: list[PartitionOutcome] = []
    counts = Counter((r.topic, r.partition) for r in requests)
    for request in requests:
        key = TopicPartition(request.topic, request.partition)
        try:
            if counts[key] > 1:
                raise InvalidRequestError(f"{key[0]}-{key[1]} is named more than once")
            state = _known_partition(image, *key)
            if request.target is None:
                new = cancel_reassignment(state, live)
            else:
                new = start_reassignment(state, request.target, live)
                record = image.topic(request.topic)
                if record is not None and len(request.target) != len(state.target_replicas):
                    # A valid target (checked above) that changes the replication factor must
                    # leave room for min.insync.replicas.
                    check_min_insync_replicas(
                        request.topic, len(request.target), record.config, image.cluster_config
                    )
                # Already complete (e.g. only the order changed, or targets all in the ISR)?
                # Then start and completion are one change: the epochs grow once.
                new = complete_reassignment(new, live)
                if new is not state:
                    new = replace(
                        new,
                        leader_epoch=state.leader_epoch + (new.leader != state.leader),
                        partition_epoch=state.partition_epoch + 1,
                    )
        except Exception as exc:
            outcomes.append(PartitionOutcome(request.topic, request.partition, exc))
            continue
        if new is not state:
            changes[key] = new
        outcomes.append(PartitionOutcome(request.topic, request.partition, None))
    return changes, _records_after(image, changes), outcomes


@dataclass(frozen=True)
class OngoingReassignment:
    """A running reassignment as ListPartitionReassignments shows it."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]


def list_reassignments(
    image: MetadataImage, partitions: list[TopicPartition] | None = None
) -> list[OngoingReassignment]:
    """The running reassignments (of the named partitions, or all), sorted."""
    wanted = None if partitions is None else set(partitions)
    return [
        OngoingReassignment(
            ref.topic, ref.partition, ref.state.replicas,
            ref.state.adding_replicas, ref.state.removing_replicas,
        )
        for ref in sorted(image.all_partitions(), key=lambda r: (r.topic, r.partition))
        if ref.state.reassigning and (wanted is None or (ref.topic, ref.partition) in wanted)
    ]
