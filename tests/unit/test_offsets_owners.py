"""``__consumer_offsets`` placement: the owners planner (exhaustive and property tests), the
internal topic's settings and name rules, and the broker's pure FindCoordinator lookup."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.cluster.topic_config import validate_topic_config
from fjord.controller.defaults import (
    OFFSETS_TOPIC_CONFIG,
    OFFSETS_TOPIC_REPLICATION_FACTOR,
    OFFSETS_TOPIC_SEGMENT_BYTES,
)
from fjord.controller.offsets_owners import (
    check_user_topic,
    offsets_topic_spec,
    plan_offsets_owners,
)
from fjord.controller.planner import TopicSpec, plan_create_topic
from fjord.errors import (
    CoordinatorNotAvailableError,
    ErrorCode,
    InvalidGroupIdError,
    InvalidRequestError,
    InvalidTopicError,
)
from fjord.groups.defaults import OFFSETS_TOPIC, OFFSETS_TOPIC_PARTITIONS
from fjord.groups.offsets_topic import group_partition
from fjord.metadata import (
    BrokerRegistration,
    CoordinatorRegistration,
    Keys,
    MetadataEvent,
    MetadataImage,
    OffsetsOwner,
    TopicRecord,
)
from fjord.metadata.coordinator_lookup import (
    locate_group_coordinator,
    missing_coordinator_topics,
)
from fjord.transactions.defaults import TRANSACTION_STATE_PARTITIONS, TRANSACTION_STATE_TOPIC
from fjord.transactions.log import transaction_partition

K = Keys("c1")

# -- the planner: examples -----------------------------------------------------------------------


def owners(assignment: dict[int, int], epoch: int = 1) -> dict[int, OffsetsOwner]:
    return {p: OffsetsOwner(c, epoch) for p, c in assignment.items()}


def apply(
    current: dict[int, OffsetsOwner], changes: dict[int, OffsetsOwner]
) -> dict[int, OffsetsOwner]:
    return {**current, **changes}


def loads(state: dict[int, OffsetsOwner], live: list[int]) -> dict[int, int]:
    out = dict.fromkeys(live, 0)
    for owner in state.values():
        out[owner.coordinator_id] += 1
    return out


def test_first_assignment_deals_partitions_round_robin_with_epoch_1() -> None:
    plan = plan_offsets_owners(5, [2, 1], {})
    assert plan == {
        0: OffsetsOwner(1, 1),
        1: OffsetsOwner(2, 1),
        2: OffsetsOwner(1, 1),
        3: OffsetsOwner(2, 1),
        4: OffsetsOwner(1, 1),
    }


def test_balanced_live_owners_change_nothing() -> None:
    current = owners({0: 1, 1: 2, 2: 1, 3: 2})
    assert plan_offsets_owners(4, [1, 2], current) == {}


def test_no_live_coordinator_leaves_owners_as_they_are() -> None:
    assert plan_offsets_owners(4, [], owners({0: 1, 1: 2})) == {}
    assert plan_offsets_owners(4, [], {}) == {}


def test_dead_owner_partitions_move_to_the_survivors_with_bumped_epoch() -> None:
    current = owners({0: 1, 1: 2, 2: 3, 3: 1, 4: 2, 5: 3}, epoch=4)
    plan = plan_offsets_owners(6, [1, 2], current)
    assert plan == {2: OffsetsOwner(1, 5), 5: OffsetsOwner(2, 5)}


def test_new_coordinator_takes_from_the_most_loaded_only_while_loads_differ_by_two() -> None:
    current = owners({p: 1 if p < 4 else 2 for p in range(7)})  # loads 1:4, 2:3
    plan = plan_offsets_owners(7, [1, 2, 3], current)
    # 3 needs two partitions: one from 1 (the most loaded), then 1 and 2 tie at 3 and the
    # lowest id gives again; each donor gives its highest-numbered partition.
    assert plan == {3: OffsetsOwner(3, 2), 2: OffsetsOwner(3, 2)}
    after = loads(apply(current, plan), [1, 2, 3])
    assert after == {1: 2, 2: 3, 3: 2}


def test_partitions_beyond_the_count_are_ignored_and_missing_ones_filled() -> None:
    current = owners({0: 1, 7: 1})
    plan = plan_offsets_owners(2, [1], current)
    assert plan == {1: OffsetsOwner(1, 1)}


def test_negative_partition_count_is_refused() -> None:
    with pytest.raises(ValueError, match="partition count"):
        plan_offsets_owners(-1, [1], {})


# -- the planner: properties ---------------------------------------------------------------------


def min_moves_bound(current_live_loads: list[int], partitions: int) -> int:
    """The fewest live-owned partitions any within-one balance must move: the final loads are
    q+1 for r coordinators and q for the rest; giving q+1 to the most loaded is best."""
    k = len(current_live_loads)
    q, r = divmod(partitions, k)
    targets = [q + 1] * r + [q] * (k - r)
    return sum(
        max(0, load - target)
        for load, target in zip(sorted(current_live_loads, reverse=True), targets, strict=True)
    )


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, list[int], dict[int, OffsetsOwner]]:
    partitions = draw(st.integers(0, 60))
    ids = st.integers(0, 9)
    live = draw(st.lists(ids, max_size=6, unique=True))
    current: dict[int, OffsetsOwner] = {}
    for p in range(partitions + 3):  # a few stale entries past the count too
        if draw(st.integers(0, 3)) == 0:  # no owner yet
            continue
        current[p] = OffsetsOwner(draw(ids), draw(st.integers(1, 1000)))
    return partitions, live, current


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_plan_properties(scenario: tuple[int, list[int], dict[int, OffsetsOwner]]) -> None:
    partitions, live, current = scenario
    plan = plan_offsets_owners(partitions, live, current)
    assert plan == plan_offsets_owners(partitions, list(reversed(live)), dict(current))
    if not live:
        assert plan == {}
        return
    after = apply(current, plan)
    in_range = {p: after[p] for p in range(partitions)}
    # every partition owned by a live coordinator ...
    assert all(o.coordinator_id in live for o in in_range.values())
    assert len(in_range) == partitions
    # ... loads within one ...
    counts = loads(in_range, live)
    assert max(counts.values()) - min(counts.values()) <= 1
    # ... only partitions of the topic change, each with its epoch bumped ...
    assert all(0 <= p < partitions for p in plan)
    for p, new in plan.items():
        old = current.get(p)
        assert new.coordinator_epoch == (1 if old is None else old.coordinator_epoch + 1)
        assert (
            old is None
            or old.coordinator_id != new.coordinator_id
            or old.coordinator_id not in live
        )
    # ... and the fewest moves: every orphan once, plus the bound for live-owned partitions.
    orphans = {
        p for p in range(partitions) if p not in current or current[p].coordinator_id not in live
    }
    moved_live = [p for p in plan if p not in orphans]
    assert orphans <= set(plan)
    live_loads = [
        sum(
            1
            for p in range(partitions)
            if p in current and p not in orphans and current[p].coordinator_id == c
        )
        for c in live
    ]
    assert len(moved_live) == min_moves_bound(live_loads, partitions)
    # a second run is a no-op (stable)
    assert plan_offsets_owners(partitions, live, after) == {}


def test_coordinators_joining_and_leaving_one_by_one_stay_balanced() -> None:
    rng = random.Random(7)
    state: dict[int, OffsetsOwner] = {}
    live: list[int] = []
    for step in range(60):
        if live and (len(live) > 4 or rng.random() < 0.4):
            live.remove(rng.choice(live))
        else:
            live.append(max(live, default=0) + 1 + step)
        state = apply(state, plan_offsets_owners(OFFSETS_TOPIC_PARTITIONS, live, state))
        if live:
            counts = loads(state, live)
            assert sum(counts.values()) == OFFSETS_TOPIC_PARTITIONS
            assert max(counts.values()) - min(counts.values()) <= 1


def test_every_small_case_exhaustively() -> None:
    """Every assignment of 4 partitions to owners in {none, 0, 1, 2} for every live set."""
    choices = [None, 0, 1, 2]
    for live_mask in range(8):
        live = [c for c in range(3) if live_mask >> c & 1]
        for combo in itertools.product(choices, repeat=4):
            current = {p: OffsetsOwner(c, 3) for p, c in enumerate(combo) if c is not None}
            plan = plan_offsets_owners(4, live, current)
            if not live:
                assert plan == {}
                continue
            after = apply(current, plan)
            counts = loads(after, live)
            assert max(counts.values()) - min(counts.values()) <= 1
            assert all(after[p].coordinator_id in live for p in range(4))


# -- the internal topic --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("brokers", "rf"), [(1, 1), (2, 2), (3, 3), (5, OFFSETS_TOPIC_REPLICATION_FACTOR)]
)
def test_offsets_topic_spec_is_the_controllers(brokers: int, rf: int) -> None:
    spec = offsets_topic_spec(TopicSpec(OFFSETS_TOPIC), brokers)
    assert (spec.num_partitions, spec.replication_factor) == (OFFSETS_TOPIC_PARTITIONS, rf)
    assert spec.configs == OFFSETS_TOPIC_CONFIG
    assert spec.configs["segment.bytes"] == str(OFFSETS_TOPIC_SEGMENT_BYTES) == "104857600"
    assert spec.configs["retention.ms"] == "-1"  # no compaction: never delete offsets


def test_offsets_topic_config_is_valid_and_places_replicas() -> None:
    assert validate_topic_config(OFFSETS_TOPIC_CONFIG, {}) == OFFSETS_TOPIC_CONFIG
    image = MetadataImage.empty("c1").apply(
        [
            MetadataEvent.put(K.broker(b), BrokerRegistration(b, "h", b, None).to_json(), 1, 1)
            for b in (1, 2, 3, 4)
        ]
    )
    spec = offsets_topic_spec(TopicSpec(OFFSETS_TOPIC), len(image.brokers))
    plan = plan_create_topic(image, spec, "0" * 32, random.Random(1))
    assert plan.record.partitions == 50 and plan.record.replication_factor == 3
    assert all(len(s.replicas) == 3 for s in plan.partitions.values())


@pytest.mark.parametrize(
    "spec",
    [
        TopicSpec(OFFSETS_TOPIC, 10),
        TopicSpec(OFFSETS_TOPIC, -1, 2),
        TopicSpec(OFFSETS_TOPIC, configs={"retention.ms": "1"}),
        TopicSpec(OFFSETS_TOPIC, assignments={0: [1]}),
    ],
)
def test_offsets_topic_with_other_settings_is_refused(spec: TopicSpec) -> None:
    with pytest.raises(InvalidRequestError, match="internal topic") as info:
        offsets_topic_spec(spec, 3)
    assert info.value.code is ErrorCode.INVALID_REQUEST


def test_offsets_topic_spec_accepts_its_own_values_explicitly() -> None:
    spec = offsets_topic_spec(TopicSpec(OFFSETS_TOPIC, OFFSETS_TOPIC_PARTITIONS, 3), 3)
    assert spec.replication_factor == 3


def test_internal_topic_names() -> None:
    check_user_topic("orders", "create")
    check_user_topic("orders", "delete")
    check_user_topic("_single", "delete")
    check_user_topic(OFFSETS_TOPIC, "create")
    for name, action in [
        (OFFSETS_TOPIC, "delete"),
        (OFFSETS_TOPIC, "add partitions to"),
        ("__mine", "create"),
        ("__mine", "delete"),
    ]:
        with pytest.raises(InvalidTopicError, match="internal") as info:
            check_user_topic(name, action)
        assert info.value.code is ErrorCode.INVALID_TOPIC_EXCEPTION


# -- the broker's lookup -------------------------------------------------------------------------


def lookup_image(owner: int | None, live: list[int], with_topic: bool = True) -> MetadataImage:
    events = [
        MetadataEvent.put(
            K.coordinator(c), CoordinatorRegistration(c, f"h{c}", 9000 + c).to_json(), 2, 2
        )
        for c in live
    ]
    if with_topic:
        record = TopicRecord("1" * 32, OFFSETS_TOPIC_PARTITIONS, 3)
        events.append(MetadataEvent.put(K.topic(OFFSETS_TOPIC), record.to_json(), 3, 3))
    if owner is not None:
        events += [
            MetadataEvent.put(K.offsets_owner(p), OffsetsOwner(owner, 1).to_json(), 4, 4)
            for p in range(OFFSETS_TOPIC_PARTITIONS)
        ]
    return MetadataImage.empty("c1").apply(events)


def test_lookup_returns_the_live_owner_and_the_groups_partition() -> None:
    found = locate_group_coordinator(lookup_image(2, [1, 2]), "my-group", 0)
    assert found.partition == group_partition("my-group") == 12  # Kafka's hash of "my-group"
    assert (found.registration.id, found.registration.address) == (2, "h2:9002")


@pytest.mark.parametrize(
    ("image", "text"),
    [
        (lookup_image(None, [1], with_topic=False), "does not exist"),
        (lookup_image(None, [1]), "no coordinator"),
        (lookup_image(3, [1, 2]), "not live"),
    ],
)
def test_lookup_is_coordinator_not_available_while_anything_is_missing(
    image: MetadataImage, text: str
) -> None:
    with pytest.raises(CoordinatorNotAvailableError, match=text) as info:
        locate_group_coordinator(image, "g", 0)
    assert info.value.retriable


def test_transactional_lookup_is_the_same_numbered_partitions_owner() -> None:
    image = lookup_image(2, [1, 2])
    with pytest.raises(CoordinatorNotAvailableError, match="__transaction_state"):
        locate_group_coordinator(image, "my-txn", 1)  # the topic is created on this lookup
    assert missing_coordinator_topics(image, 1) and not missing_coordinator_topics(image, 0)
    record = TopicRecord("2" * 32, TRANSACTION_STATE_PARTITIONS, 3)
    image = image.apply([MetadataEvent.put(K.topic(TRANSACTION_STATE_TOPIC), record.to_json(), 5,
                                           5)])
    found = locate_group_coordinator(image, "my-group", 1)
    # The same hash as a group's: "my-group" as a transactional id is in partition 12 too.
    assert found.partition == transaction_partition("my-group") == 12
    assert found.registration.id == 2
    with pytest.raises(InvalidRequestError, match="transactional id is empty"):
        locate_group_coordinator(image, "", 1)


def test_lookup_refuses_bad_key_type_and_empty_group() -> None:
    image = lookup_image(1, [1])
    with pytest.raises(InvalidRequestError, match="key_type 2") as info:
        locate_group_coordinator(image, "g", 2)
    assert not info.value.retriable
    with pytest.raises(InvalidGroupIdError):
        locate_group_coordinator(image, "", 0)
