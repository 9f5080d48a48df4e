"""The lease keep-alive's rules (fjord.broker.lease_keeper): renew while the broker's loop shows
progress within the stall limit, never past it, never a lease etcd said is gone."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fjord.broker.lease_keeper import (
    EtcdReachable,
    EtcdUnreachable,
    LeaseKeeper,
    LeaseLost,
    LoopSlow,
    LoopSlowBegan,
    LoopStalled,
    Renew,
)
from fjord.metadata.registration import LeaseStatus

INTERVAL = 2.0  # a 6 s lease renewed three times per TTL
LIMIT = 6.0


def keeper_with(lease_id: int = 7) -> LeaseKeeper:
    keeper = LeaseKeeper(INTERVAL, LIMIT)
    keeper.lease_registered(lease_id)
    return keeper


def test_renews_at_once_then_every_interval_while_the_loop_moves() -> None:
    keeper = keeper_with()
    assert keeper.poll(100.0, 100.0) == (Renew(7), [])
    assert keeper.poll(101.0, 101.0) == (None, [])
    assert keeper.poll(102.0, 102.0) == (Renew(7), [])


def test_nothing_to_renew_without_a_lease() -> None:
    keeper = LeaseKeeper(INTERVAL, LIMIT)
    assert keeper.poll(100.0, 100.0) == (None, [])


def test_a_loop_stalled_within_the_limit_keeps_its_lease() -> None:
    keeper = keeper_with()
    keeper.poll(100.0, 100.0)
    # The loop's last progress is at 100; renewals go on while it is at most LIMIT old.
    assert keeper.poll(102.0, 100.0) == (Renew(7), [])
    assert keeper.poll(102.5, 100.0) == (None, [LoopSlowBegan(2.5)])  # once per stretch
    assert keeper.poll(104.0, 100.0) == (Renew(7), [])
    assert keeper.poll(106.0, 100.0) == (Renew(7), [])
    # It moves again: the slow stretch is reported once, with its longest idle time.
    renew, events = keeper.poll(106.5, 106.4)
    assert renew is None
    assert events == [LoopSlow(6.0, withheld=False)]


def test_a_loop_stalled_past_the_limit_gets_no_renewal_until_it_moves() -> None:
    keeper = keeper_with()
    keeper.poll(100.0, 100.0)
    renew, events = keeper.poll(106.5, 100.0)
    assert renew is None and events == [LoopSlowBegan(6.5), LoopStalled(6.5, LIMIT)]
    assert keeper.withholding
    assert keeper.poll(120.0, 100.0) == (None, [])  # reported once
    # The first poll after it moved renews at once (the lease may be about to run out).
    renew, events = keeper.poll(120.1, 120.05)
    assert renew == Renew(7)
    assert events == [LoopSlow(20.0, withheld=True)]
    assert not keeper.withholding


def test_etcd_unreachable_is_reported_once_and_then_its_return() -> None:
    keeper = keeper_with()
    keeper.poll(100.0, 100.0)
    assert keeper.answered(7, LeaseStatus.UNREACHABLE, 100.1) == [EtcdUnreachable()]
    assert keeper.answered(7, LeaseStatus.UNREACHABLE, 102.1) == []
    assert keeper.answered(7, LeaseStatus.HELD, 104.6) == [EtcdReachable(pytest.approx(4.5))]
    assert keeper.answered(7, LeaseStatus.HELD, 106.6) == []


def test_a_gone_lease_is_reported_and_never_renewed_again() -> None:
    keeper = keeper_with()
    keeper.poll(100.0, 100.0)
    keeper.answered(7, LeaseStatus.UNREACHABLE, 100.1)
    assert keeper.answered(7, LeaseStatus.GONE, 103.1) == [LeaseLost(7, pytest.approx(3.0))]
    assert keeper.lease_id is None
    assert keeper.poll(110.0, 110.0) == (None, [])
    keeper.lease_registered(8)  # the broker registered anew
    assert keeper.poll(110.1, 110.1) == (Renew(8), [])


def test_an_answer_about_a_replaced_lease_changes_nothing() -> None:
    keeper = keeper_with(7)
    keeper.poll(100.0, 100.0)
    keeper.lease_registered(8)
    assert keeper.answered(7, LeaseStatus.GONE, 100.2) == []
    assert keeper.answered(7, LeaseStatus.UNREACHABLE, 100.2) == []
    assert keeper.lease_id == 8
    assert keeper.poll(100.3, 100.3) == (Renew(8), [])


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        LeaseKeeper(0, LIMIT)
    with pytest.raises(ValueError, match="must be > 0"):
        LeaseKeeper(INTERVAL, -1)


# A run: polls at increasing times; at each the loop either made progress just now or not.
polls = st.lists(
    st.tuples(st.floats(0.01, 3.0), st.booleans(), st.sampled_from(list(LeaseStatus))),
    min_size=1, max_size=80,
)


@given(polls)
def test_no_renewal_is_ever_sent_past_the_stall_limit(run: list[tuple[float, bool, LeaseStatus]]
                                                      ) -> None:
    """Whatever the loop and etcd do: a renewal is issued only while the loop's last progress
    is at most the limit old (so a wedged loop's lease runs out by last progress + limit +
    TTL), only for the lease registered, and never after etcd said it is gone."""
    keeper = keeper_with(7)
    now = progress = 0.0
    gone = False
    for step, moved, status in run:
        now += step
        if moved:
            progress = now
        renew, _ = keeper.poll(now, progress)
        if renew is not None:
            assert now - progress <= LIMIT
            assert renew.lease_id == 7 and not gone
            events = keeper.answered(7, status, now)
            gone = gone or any(isinstance(e, LeaseLost) for e in events)


@given(st.lists(st.floats(0.01, 0.5), min_size=1, max_size=200),
       st.lists(st.floats(0.0, LIMIT), min_size=1, max_size=200))
def test_a_loop_within_the_limit_is_renewed_every_interval(
    poll_gaps: list[float], idles: list[float]
) -> None:
    """Polled at least every 0.5 s, with the loop's stamp never older than the limit and etcd
    answering, renewals are never more than an interval plus a poll gap apart: the lease (three
    intervals long) cannot run out, however busy the loop is."""
    keeper = keeper_with(7)
    now = 0.0
    last_renewal = None
    for i, gap in enumerate(poll_gaps):
        now += gap
        renew, _ = keeper.poll(now, now - idles[i % len(idles)])
        if last_renewal is not None:
            assert now - last_renewal <= INTERVAL + 0.5
        if renew is not None:
            assert keeper.answered(renew.lease_id, LeaseStatus.HELD, now) == []
            last_renewal = now
    assert last_renewal is not None
