"""Leader elections of the controller, pure: liveness (clean / unclean), preferred elections,
auto leader rebalancing and ElectLeaders planning."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.controller.election import (
    elect_preferred,
    elect_unclean,
    initial_state,
    needs_preferred_election,
    on_liveness_change,
)
from fjord.controller.planner import (
    PREFERRED_ELECTION,
    UNCLEAN_ELECTION,
    partition_keys,
    plan_elect_leaders,
    plan_liveness,
    plan_preferred_rebalance,
    plan_reconcile,
)
from fjord.errors import (
    ElectionNotNeededError,
    EligibleLeadersNotAvailableError,
    InvalidRequestError,
    PreferredLeaderNotAvailableError,
    UnknownTopicOrPartitionError,
)
from fjord.metadata import (
    NO_LEADER,
    PartitionState,
)
from tests.helpers.metadata_images import image_of, state

# -- liveness ---------------------------------------------------------------------------------


def test_dead_leader_hands_over_to_first_live_isr_member_in_preferred_order() -> None:
    new = on_liveness_change(state([1, 2, 3], [3, 2, 1], 1), live={2, 3})
    assert new.leader == 2  # replica order, not ISR order
    assert new.isr == (3, 2)
    assert (new.leader_epoch, new.partition_epoch) == (5, 10)


def test_dead_follower_leaves_isr_without_leader_epoch_bump() -> None:
    new = on_liveness_change(state([1, 2, 3], [1, 2, 3], 1), live={1, 2})
    assert (new.leader, new.isr, new.leader_epoch, new.partition_epoch) == (1, (1, 2), 4, 10)


def test_no_live_isr_goes_offline_unless_unclean_allowed() -> None:
    s = state([1, 2, 3], [1], 1)
    offline = on_liveness_change(s, live={2, 3})
    assert offline.leader == NO_LEADER and offline.isr == (1,)  # last member kept
    unclean = on_liveness_change(s, live={2, 3}, unclean_allowed=True)
    assert (unclean.leader, unclean.isr) == (2, (2,))
    assert unclean.leader_epoch == 5


def test_returning_last_isr_member_leads_again() -> None:
    offline = on_liveness_change(state([1, 2], [1], 1), live={2})
    back = on_liveness_change(offline, live={1, 2})
    assert back.leader == 1 and back.leader_epoch == offline.leader_epoch + 1


def test_returning_broker_is_a_follower_not_in_isr() -> None:
    moved = on_liveness_change(state([1, 2, 3], [1, 2, 3], 1), live={2, 3})
    back = on_liveness_change(moved, live={1, 2, 3})
    assert back is moved  # it rejoins the ISR only through the leader's AlterPartition


@settings(max_examples=300, deadline=None)
@given(
    replicas=st.permutations([1, 2, 3, 4]).map(lambda p: p[:3]),
    isr_mask=st.lists(st.booleans(), min_size=3, max_size=3),
    live=st.sets(st.integers(1, 4)),
    unclean=st.booleans(),
)
def test_liveness_keeps_invariants(
    replicas: list[int], isr_mask: list[bool], live: set[int], unclean: bool
) -> None:
    isr = [r for r, keep in zip(replicas, isr_mask, strict=True) if keep] or replicas[:1]
    leader = isr[0]
    old = state(replicas, isr, leader)
    new = on_liveness_change(old, live, unclean)
    assert set(new.isr) <= set(new.replicas) and new.isr
    assert new.leader == NO_LEADER or new.leader in new.isr
    if new.leader != NO_LEADER:
        assert new.leader in live
        if not unclean:
            assert new.leader in old.isr  # clean: never a replica that may lack data
    assert new.leader_epoch == old.leader_epoch + (new.leader != old.leader)
    assert new.partition_epoch == old.partition_epoch + (new is not old)
    if any(r in live for r in old.isr):
        assert new.leader != NO_LEADER


def test_partitions_of_awaited_brokers_are_left_alone() -> None:
    """A controller that just took office (e.g. after an etcd outage in which every lease
    expired) waits for unregistered brokers instead of taking their partitions offline."""
    parts = {
        ("t", 0): state([1, 2, 3], [1, 2, 3], 1),  # leader 1 unregistered
        ("t", 1): state([2, 3, 1], [2, 3], 2),  # ISR names only registered brokers
        ("t", 2): state([3, 1, 2], [3], NO_LEADER),  # offline, its ISR member is back
    }
    image = image_of([2, 3], parts)
    waiting = plan_liveness(image, waiting_for={1})
    assert ("t", 0) not in waiting
    assert waiting[("t", 2)].leader == 3  # brokers that are registered are decided on
    assert ("t", 1) not in waiting
    after_grace = plan_reconcile(image)
    assert after_grace[("t", 0)].leader == 2 and 1 not in after_grace[("t", 0)].isr


def test_restarted_broker_loses_its_place_and_leads_again_where_it_is_the_only_copy() -> None:
    """A new incarnation (a fast restart replaced its registration without a gap): the old
    process leaves the ISR and leadership as if it had died; where it is the last ISR member it
    leads again under a new leader epoch."""
    parts = {
        ("t", 0): state([1, 2, 3], [1, 2, 3], 1, le=4),
        ("t", 1): state([2, 1, 3], [2, 1, 3], 2, le=4),
        ("t", 2): state([1, 2, 3], [1], 1, le=4),
        ("t", 3): state([2, 3, 1], [2, 3], 2, le=4),
    }
    image = image_of([1, 2, 3], parts)
    changes = plan_reconcile(image, restarted={1})
    assert changes[("t", 0)].leader == 2 and changes[("t", 0)].isr == (2, 3)
    assert changes[("t", 1)].leader == 2 and changes[("t", 1)].isr == (2, 3)
    assert changes[("t", 1)].leader_epoch == 4  # a follower left: no new leader epoch
    assert changes[("t", 2)].leader == 1 and changes[("t", 2)].leader_epoch > 4
    assert ("t", 3) not in changes
    assert plan_reconcile(image) == {}  # without the restart nothing changes


# -- preferred and unclean elections ------------------------------------------------------------


def test_preferred_election_moves_leadership_back() -> None:
    new = elect_preferred(state([1, 2, 3], [2, 3, 1], 2), live={1, 2, 3})
    assert (new.leader, new.isr, new.leader_epoch) == (1, (2, 3, 1), 5)


@pytest.mark.parametrize(
    ("s", "live", "error"),
    [
        (state([1, 2], [1, 2], 1), {1, 2}, ElectionNotNeededError),
        (state([1, 2], [2], 2), {1, 2}, PreferredLeaderNotAvailableError),  # not in ISR
        (state([1, 2], [1, 2], 2), {2}, PreferredLeaderNotAvailableError),  # not live
    ],
)
def test_preferred_election_refusals(s: PartitionState, live: set[int], error: type) -> None:
    with pytest.raises(error):
        elect_preferred(s, live)
    assert not needs_preferred_election(s, live)


def test_unclean_election() -> None:
    offline = state([1, 2, 3], [1], NO_LEADER)
    new = elect_unclean(offline, live={3, 2})
    assert (new.leader, new.isr) == (2, (2,))
    with pytest.raises(ElectionNotNeededError):
        elect_unclean(state([1, 2], [1, 2], 1), live={1})
    with pytest.raises(EligibleLeadersNotAvailableError):
        elect_unclean(offline, live={7})
    # A live ISR member is preferred over a replica outside the ISR.
    assert elect_unclean(state([1, 2, 3], [3], NO_LEADER), live={2, 3}).leader == 3


# -- planner ----------------------------------------------------------------------------------


def test_auto_rebalance_plans_only_partitions_whose_preferred_replica_can_lead() -> None:
    image = image_of(
        [1, 2, 3],
        {
            ("t", 0): state([1, 2, 3], [1, 2, 3], 2),  # moves back to 1
            ("t", 1): state([2, 3, 1], [2, 3, 1], 2),  # already preferred
            ("t", 2): state([3, 1, 2], [1, 2], 1),  # 3 not in ISR
        },
    )
    changes = plan_preferred_rebalance(image)
    assert set(changes) == {("t", 0)} and changes[("t", 0)].leader == 1


def test_elect_leaders_outcomes() -> None:
    image = image_of(
        [1, 2],
        {("t", 0): state([1, 2], [1, 2], 2), ("t", 1): state([2, 1], [2, 1], 2)},
    )
    changes, outcomes = plan_elect_leaders(image, PREFERRED_ELECTION, [("t", 0), ("t", 1),
                                                                      ("t", 5)])
    assert set(changes) == {("t", 0)}
    errors = {(o.topic, o.partition): type(o.error) for o in outcomes}
    assert errors == {
        ("t", 0): type(None),
        ("t", 1): ElectionNotNeededError,
        ("t", 5): UnknownTopicOrPartitionError,
    }
    # All partitions: the ones needing nothing are left out, as Kafka does.
    _, all_outcomes = plan_elect_leaders(image, PREFERRED_ELECTION, None)
    assert [(o.topic, o.partition) for o in all_outcomes] == [("t", 0)]
    with pytest.raises(InvalidRequestError):
        plan_elect_leaders(image, 7, None)


def test_elect_leaders_unclean_for_offline_partition() -> None:
    image = image_of([2], {("t", 0): state([1, 2], [1], NO_LEADER)})
    changes, outcomes = plan_elect_leaders(image, UNCLEAN_ELECTION, [("t", 0)])
    assert changes[("t", 0)].leader == 2 and outcomes[0].error is None


def test_initial_state_first_replica_leads() -> None:
    assert initial_state([3, 1, 2]) == PartitionState((3, 1, 2), (3, 1, 2), 3, 0, 0)


# -- a leader resigns (disk cannot be written, damaged copy) ------------------------------


def test_resigning_leader_hands_over_to_first_live_isr_member_and_leaves_the_isr() -> None:
    from fjord.controller.election import resign_leadership

    new = resign_leadership(state([1, 2, 3], [3, 2, 1], 1), 1, 4, 9, live={1, 2, 3})
    assert new.leader == 2 and new.isr == (3, 2)
    assert (new.leader_epoch, new.partition_epoch) == (5, 10)
    # A dead ISR member is skipped.
    assert resign_leadership(state([1, 2, 3], [1, 2, 3], 1), 1, 4, 9, live={1, 3}).leader == 3


def test_resigning_without_another_live_isr_member_is_refused() -> None:
    from fjord.controller.election import resign_leadership

    with pytest.raises(EligibleLeadersNotAvailableError):
        resign_leadership(state([1], [1], 1), 1, 4, 9, live={1})
    with pytest.raises(EligibleLeadersNotAvailableError):
        resign_leadership(state([1, 2], [1, 2], 1), 1, 4, 9, live={1})


def test_resigning_is_fenced_like_an_isr_change() -> None:
    from fjord.controller.election import resign_leadership
    from fjord.errors import (
        FencedLeaderEpochError,
        InvalidUpdateVersionError,
        NotLeaderOrFollowerError,
    )

    s = state([1, 2, 3], [1, 2, 3], 1)
    with pytest.raises(NotLeaderOrFollowerError):
        resign_leadership(s, 2, 4, 9, live={1, 2, 3})
    with pytest.raises(FencedLeaderEpochError):
        resign_leadership(s, 1, 3, 9, live={1, 2, 3})
    with pytest.raises(InvalidUpdateVersionError):
        resign_leadership(s, 1, 4, 8, live={1, 2, 3})


def test_a_partition_created_after_a_restart_keeps_the_new_process() -> None:
    """A topic created between a broker's new registration and the reconcile that ends its
    predecessor's place names the new process: it keeps its leader and ISR (moving them failed
    the writes it was taking), while partitions that existed when the restart was seen lose
    the old process as before. Partitions added to an existing topic later count as new."""
    parts = {
        ("old", 0): state([1, 2, 3], [1, 2, 3], 1, le=4),
        ("old", 1): state([2, 1, 3], [2, 1, 3], 2, le=4),
        ("new", 0): state([1, 2, 3], [1, 2, 3], 1, le=0, pe=0),
        ("new", 1): state([2, 3, 1], [2, 3, 1], 2, le=0, pe=0),
    }
    image = image_of([1, 2, 3], parts)
    known = {1: frozenset({("id-old", 0), ("id-old", 1)})}
    changes = plan_reconcile(image, restarted={1}, known_at_restart=known)
    assert changes[("old", 0)].leader == 2 and changes[("old", 0)].isr == (2, 3)
    assert changes[("old", 1)].isr == (2, 3)
    assert ("new", 0) not in changes and ("new", 1) not in changes
    # Without the record of what existed (None): every partition, as before.
    assert ("new", 0) in plan_reconcile(image, restarted={1})
    # A broker restarted without a record of its own is treated everywhere.
    assert ("new", 0) in plan_reconcile(image, restarted={1}, known_at_restart={2: known[1]})
    assert partition_keys(image) == {("id-old", 0), ("id-old", 1), ("id-new", 0), ("id-new", 1)}
