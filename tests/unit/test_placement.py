"""Replica placement (Kafka's algorithm): spread, leader balance, rack awareness."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.controller.placement import (
    assign_replicas,
    rack_alternated_brokers,
    validate_manual_assignment,
)
from fjord.errors import InvalidReplicaAssignmentError, InvalidReplicationFactorError


def test_matches_kafkas_rack_unaware_example() -> None:
    # Kafka's AdminUtils doc example: 5 brokers, 10 partitions, RF 3, start index 0, shift 0.
    got = assign_replicas({b: None for b in range(5)}, 10, 3, start_index=0, replica_shift=0)
    assert got == {
        0: [0, 1, 2], 1: [1, 2, 3], 2: [2, 3, 4], 3: [3, 4, 0], 4: [4, 0, 1],
        5: [0, 2, 3], 6: [1, 3, 4], 7: [2, 4, 0], 8: [3, 0, 1], 9: [4, 1, 2],
    }


def test_rack_alternated_list_interleaves_racks() -> None:
    racks = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "a"}
    assert rack_alternated_brokers(racks) == [0, 2, 4, 1, 3, 5]


def test_matches_kafkas_rack_aware_example() -> None:
    # Kafka's doc example: rack1: 0,1,2  rack2: 3  rack3: 4,5 -> alternated 0,3,4,1,5,2.
    racks = {0: "rack1", 1: "rack1", 2: "rack1", 3: "rack2", 4: "rack3", 5: "rack3"}
    got = assign_replicas(racks, 6, 3, start_index=0, replica_shift=0)
    assert [r[0] for r in got.values()] == [0, 3, 4, 1, 5, 2]
    for replicas in got.values():
        assert len({racks[b] for b in replicas}) == 3


@settings(max_examples=150, deadline=None)
@given(
    brokers=st.integers(1, 9),
    partitions=st.integers(1, 40),
    rf=st.integers(1, 4),
    racks=st.integers(0, 4),
    seed=st.integers(0, 2**32),
)
def test_placement_properties(
    brokers: int, partitions: int, rf: int, racks: int, seed: int
) -> None:
    rf = min(rf, brokers)
    rack_of = {b: (f"r{b % racks}" if racks else None) for b in range(brokers)}
    got = assign_replicas(rack_of, partitions, rf, rng=random.Random(seed))
    assert sorted(got) == list(range(partitions))
    for replicas in got.values():
        assert len(replicas) == rf and len(set(replicas)) == rf
        assert set(replicas) <= set(rack_of)
        if racks:
            # Replicas cover as many racks as they can.
            assert len({rack_of[b] for b in replicas}) == min(rf, len(set(rack_of.values())))
    # Leaders are balanced: counts differ by at most one (Kafka's round robin).
    leaders = Counter(r[0] for r in got.values())
    counts = [leaders.get(b, 0) for b in rack_of]
    assert max(counts) - min(counts) <= 1
    # Without racks, replicas overall are balanced too when partitions fill whole rounds
    # (with uneven racks Kafka trades that for rack spread).
    if partitions % brokers == 0 and racks <= 1:
        total = Counter(b for r in got.values() for b in r)
        assert len(set(total.values())) == 1


def test_partial_racks_fall_back_to_rack_unaware() -> None:
    brokers = {0: "a", 1: None, 2: "b"}
    got = assign_replicas(brokers, 3, 2, start_index=0, replica_shift=0)
    assert got == assign_replicas({0: None, 1: None, 2: None}, 3, 2, start_index=0,
                                  replica_shift=0)


def test_continuing_placement_for_new_partitions() -> None:
    full = assign_replicas({b: None for b in range(3)}, 6, 2, start_index=1, replica_shift=2)
    tail = assign_replicas(
        {b: None for b in range(3)}, 3, 2, start_partition=3, start_index=1, replica_shift=2
    )
    assert tail == {p: full[p] for p in (3, 4, 5)}


@pytest.mark.parametrize(("brokers", "rf", "text"), [(3, 0, "at least 1"), (2, 3, "larger")])
def test_bad_replication_factor(brokers: int, rf: int, text: str) -> None:
    with pytest.raises(InvalidReplicationFactorError, match=text):
        assign_replicas({b: None for b in range(brokers)}, 1, rf)


LIVE = {1: None, 2: None, 3: None}


def test_manual_assignment_accepted() -> None:
    assert validate_manual_assignment({0: [2], 1: [3]}, range(2), LIVE, 1) == {0: [2], 1: [3]}


@pytest.mark.parametrize(
    ("assignment", "text"),
    [
        ({0: [1]}, "cover"),
        ({0: [1], 1: [2], 2: [3]}, "cover"),
        ({0: [1, 1], 1: [2, 3]}, "repeats"),
        ({0: [1], 1: [9]}, "not live"),
        ({0: [1], 1: [2, 3]}, "same number"),
        ({0: [], 1: []}, "no replicas|same number"),
    ],
)
def test_manual_assignment_refused(assignment: dict[int, list[int]], text: str) -> None:
    with pytest.raises(InvalidReplicaAssignmentError, match=text):
        validate_manual_assignment(assignment, range(2), LIVE, None)
