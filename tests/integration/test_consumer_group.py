"""Consumer group basics of the client against the shared local cluster (with coordinators):
subscribe/poll/commit/committed, a second member splitting the partitions and taking them all
back when the first leaves, pattern subscription picking up a new topic, store_offsets with
auto commit, max.poll.interval.ms enforcement, and the typed errors of bad calls.

Each test uses its own topics and group ids. Timeouts are shortened (session.timeout.ms 6000,
the coordinator's minimum; heartbeat.interval.ms 500). The deeper semantics (crashes, static
members, cooperative timing, fail-over) are in test_group_semantics.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fjord.client import (
    AdminClient,
    Consumer,
    ConsumerRecord,
    NewTopic,
    OffsetAndMetadata,
    Producer,
    TopicPartition,
)
from fjord.client.consumer import IllegalStateError
from fjord.errors import (
    CommitFailedError,
    ErrorCode,
    FjordError,
    InvalidGroupIdError,
    MaxPollIntervalExceededError,
)
from fjord.testing.waiting import wait_for

pytestmark = pytest.mark.integration

WAIT_S = 60.0

FAST_GROUP = {
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
    "max.poll.interval.ms": 20000,
    "auto.offset.reset": "earliest",
}


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> Iterator[AdminClient]:
    client = AdminClient({"bootstrap.servers": bootstrap, "default.api.timeout.ms": 20000})
    yield client
    client.close()


def make_topic(admin: AdminClient, partitions: int, name: str | None = None) -> str:
    topic = name or new_name("g3")
    admin.create_topics([NewTopic(topic, partitions, 1)])
    return topic


def produce(bootstrap: str, topic: str, partitions: int, per_partition: int, tag: str) -> None:
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 0}) as producer:
        for p in range(partitions):
            for i in range(per_partition):
                producer.send(topic, value=f"{tag}-{p}-{i}".encode(), partition=p)
        producer.flush(WAIT_S)


def member(bootstrap: str, group: str, **config: Any) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, **FAST_GROUP, **config})


def poll_until(
    consumers: list[Consumer], done: Callable[[], bool], what: str, into: list[Any] | None = None
) -> None:
    """Poll every consumer in turn until ``done()``; records go to ``into``."""

    def polled_until_done() -> bool:
        if done():
            return True
        for consumer in consumers:
            records = consumer.poll(0.05)
            if into is not None:
                into.extend(records)
        return False

    wait_for(polled_until_done, what, WAIT_S, interval=0)


def test_subscribe_poll_commit_and_resume_from_committed(
    admin: AdminClient, bootstrap: str
) -> None:
    topic, group = make_topic(admin, 3), new_name("grp")
    produce(bootstrap, topic, 3, 10, "a")
    assigned: list[list[TopicPartition]] = []
    records: list[ConsumerRecord] = []
    with member(bootstrap, group, **{"enable.auto.commit": False}) as consumer:
        consumer.subscribe([topic], on_assign=lambda c, tps: assigned.append(sorted(tps)))
        poll_until([consumer], lambda: len(records) >= 30, "30 records", records)
        tps = [TopicPartition(topic, p) for p in range(3)]
        assert assigned == [tps]
        assert consumer.assignment() == set(tps)
        assert sorted((r.partition, r.offset) for r in records) == [
            (p, o) for p in range(3) for o in range(10)
        ]
        assert consumer.committed(tps) == {tp: None for tp in tps}
        committed = consumer.commit()
        assert committed == {tp: OffsetAndMetadata(10) for tp in tps}
        assert consumer.committed(tps) == {tp: 10 for tp in tps}
        # Explicit offsets, asynchronously.
        future = consumer.commit({tps[0]: 7}, asynchronous=True)
        assert future.result(WAIT_S) == {tps[0]: OffsetAndMetadata(7)}
        assert consumer.committed([tps[0]]) == {tps[0]: 7}
    produce(bootstrap, topic, 3, 2, "b")
    again: list[ConsumerRecord] = []
    with member(bootstrap, group, **{"enable.auto.commit": False}) as consumer:
        consumer.subscribe([topic])
        poll_until([consumer], lambda: len(again) >= 9, "the records after the commits", again)
        assert sorted((r.partition, r.offset) for r in again) == sorted(
            [(0, o) for o in range(7, 12)] + [(1, 10), (1, 11), (2, 10), (2, 11)]
        )


def test_second_member_splits_partitions_and_gets_all_when_the_first_leaves(
    admin: AdminClient, bootstrap: str
) -> None:
    topic, group = make_topic(admin, 4), new_name("grp")
    revoked: list[list[int]] = []
    first = member(bootstrap, group, **{"partition.assignment.strategy": "range"})
    second = member(bootstrap, group, **{"partition.assignment.strategy": "range"})
    try:
        first.subscribe(
            [topic], on_revoke=lambda c, tps: revoked.append(sorted(tp.partition for tp in tps))
        )
        poll_until([first], lambda: len(first.assignment()) == 4, "the first member has all")
        second.subscribe([topic])
        poll_until(
            [first, second],
            lambda: len(first.assignment()) == 2 and len(second.assignment()) == 2,
            "both members have two partitions",
        )
        assert first.assignment() | second.assignment() == {
            TopicPartition(topic, p) for p in range(4)
        }
        assert revoked and revoked[0] == [0, 1, 2, 3]  # eager: everything revoked first
        first.close()
        poll_until([second], lambda: len(second.assignment()) == 4, "the second member has all")
    finally:
        first.close()
        second.close()


def test_cooperative_member_keeps_partitions_that_do_not_move(
    admin: AdminClient, bootstrap: str
) -> None:
    topic, group = make_topic(admin, 4), new_name("grp")
    config = {"partition.assignment.strategy": "cooperative-sticky"}
    revoked: list[set[TopicPartition]] = []
    first = member(bootstrap, group, **config)
    second = member(bootstrap, group, **config)
    try:
        first.subscribe([topic], on_revoke=lambda c, tps: revoked.append(set(tps)))
        poll_until([first], lambda: len(first.assignment()) == 4, "the first member has all")
        second.subscribe([topic])
        poll_until(
            [first, second],
            lambda: len(first.assignment()) == 2 and len(second.assignment()) == 2,
            "the partitions are split",
        )
        kept = first.assignment()
        assert revoked == [{TopicPartition(topic, p) for p in range(4)} - kept]
    finally:
        first.close()
        second.close()


def test_pattern_subscription_picks_up_new_matching_topics(
    admin: AdminClient, bootstrap: str
) -> None:
    prefix = new_name("pat")
    first = make_topic(admin, 1, f"{prefix}-one")
    make_topic(admin, 1, f"other-{prefix}")
    with member(bootstrap, new_name("grp"), **{"metadata.max.age.ms": 500}) as consumer:
        consumer.subscribe(f"{prefix}-.*")
        poll_until(
            [consumer],
            lambda: consumer.assignment() == {TopicPartition(first, 0)},
            "the matching topic is assigned",
        )
        second = make_topic(admin, 2, f"{prefix}-two")
        poll_until(
            [consumer],
            lambda: (
                consumer.assignment()
                == {TopicPartition(first, 0), TopicPartition(second, 0), TopicPartition(second, 1)}
            ),
            "the new matching topic is assigned too",
        )


def test_added_partitions_are_assigned_and_unsubscribe_gives_everything_back(
    admin: AdminClient, bootstrap: str
) -> None:
    topic = make_topic(admin, 2)
    revoked: list[set[TopicPartition]] = []
    with member(bootstrap, new_name("grp"), **{"metadata.max.age.ms": 500}) as consumer:
        consumer.subscribe([topic], on_revoke=lambda c, tps: revoked.append(set(tps)))
        poll_until([consumer], lambda: len(consumer.assignment()) == 2, "two partitions")
        admin.create_partitions({topic: 3})
        poll_until([consumer], lambda: len(consumer.assignment()) == 3, "the third partition")
        consumer.unsubscribe()
        assert consumer.assignment() == set()
        assert revoked[-1] == {TopicPartition(topic, p) for p in range(3)}
        assert consumer.poll(0.2) == []


def test_auto_commit_sends_only_stored_offsets(admin: AdminClient, bootstrap: str) -> None:
    topic, group = make_topic(admin, 1), new_name("grp")
    produce(bootstrap, topic, 1, 10, "s")
    tp = TopicPartition(topic, 0)
    records: list[ConsumerRecord] = []
    config = {"enable.auto.offset.store": False, "auto.commit.interval.ms": 100}
    with member(bootstrap, group, **config) as consumer:
        consumer.subscribe([topic])
        poll_until([consumer], lambda: len(records) >= 10, "10 records", records)
        consumer.store_offsets(records=records[:4])  # "processed" the first four
        poll_until([consumer], lambda: consumer.committed([tp])[tp] == 4, "offset 4 committed")
        # Several auto commits run meanwhile: none sends anything beyond the stored offset.
        assert consumer._coordinator is not None  # private: its schedule of auto commits
        membership = consumer._coordinator.membership
        started = membership.auto_commits_started
        wait_for(lambda: membership.auto_commits_started >= started + 3, "three more auto commits")
        assert consumer.committed([tp]) == {tp: 4}
        with pytest.raises(IllegalStateError, match="not assigned"):
            consumer.store_offsets({TopicPartition(topic, 5): 1})
    # close() committed the stored offset again, not the position (10).
    with member(bootstrap, group) as consumer:
        assert consumer.committed([tp]) == {tp: 4}


def test_max_poll_interval_exceeded_raises_then_rejoins(admin: AdminClient, bootstrap: str) -> None:
    topic, group = make_topic(admin, 2), new_name("grp")
    lost: list[set[TopicPartition]] = []
    with member(bootstrap, group, **{"max.poll.interval.ms": 1500}) as consumer:
        consumer.subscribe([topic], on_revoke=lambda c, tps: lost.append(set(tps)))
        poll_until([consumer], lambda: len(consumer.assignment()) == 2, "assigned")
        # The application is "stuck" (no poll()) longer than max.poll.interval.ms: the
        # background task leaves the group, which the coordinator then shows as Empty.
        wait_for(
            lambda: admin.describe_consumer_groups([group])[group].state == "Empty",
            "the member to leave the group",
            WAIT_S,
        )
        with pytest.raises(MaxPollIntervalExceededError, match=r"max\.poll\.interval\.ms"):
            consumer.poll(0)
        assert lost == [{TopicPartition(topic, 0), TopicPartition(topic, 1)}]
        assert consumer.assignment() == set()
        poll_until([consumer], lambda: len(consumer.assignment()) == 2, "assigned again")


def test_group_calls_have_typed_errors(admin: AdminClient, bootstrap: str) -> None:
    topic = make_topic(admin, 1)
    tp = TopicPartition(topic, 0)
    with Consumer({"bootstrap.servers": bootstrap}) as consumer:
        with pytest.raises(InvalidGroupIdError, match=r"group\.id"):
            consumer.subscribe([topic])
        with pytest.raises(InvalidGroupIdError):
            consumer.commit({tp: 1})
        with pytest.raises(InvalidGroupIdError):
            consumer.committed([tp])
    with member(bootstrap, new_name("grp")) as consumer:
        consumer.assign([tp])
        with pytest.raises(IllegalStateError, match="mutually exclusive"):
            consumer.subscribe([topic])
        with pytest.raises(FjordError) as bad:
            consumer.commit({tp: -3})
        assert bad.value.code is ErrorCode.INVALID_COMMIT_OFFSET_SIZE
        with pytest.raises(IllegalStateError, match=r"enable\.auto\.offset\.store"):
            consumer.store_offsets({tp: 1})
        # A simple commit (assign() with a group.id) while the group is empty works ...
        assert consumer.commit({tp: 0}) == {tp: OffsetAndMetadata(0)}
        assert consumer.committed([tp]) == {tp: 0}
        group = consumer.config["group.id"]
        with member(bootstrap, group) as subscriber:
            subscriber.subscribe([topic])
            poll_until([subscriber], lambda: subscriber.assignment() == {tp}, "assigned")
            # ... but not while the group has members: their generation owns the offsets.
            with pytest.raises(CommitFailedError, match="active members"):
                consumer.commit({tp: 1})
            assert subscriber.committed([tp]) == {tp: 0}
