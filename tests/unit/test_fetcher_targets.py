"""The fetcher manager recomputes follower targets only after a leadership change: the replica
manager's leadership generation grows exactly when a hosted partition is added or dropped or
one's leader or leader epoch changes (whichever path applied it), and only then can the
targets differ. At 10,000 replicas a recomputation costs tens of milliseconds of the event loop,
and most metadata changes after a restart are ISR changes."""

from __future__ import annotations

from pathlib import Path

from fjord.broker.fetcher import ReplicaFetcherManager
from fjord.broker.partition import PartitionAssignment
from fjord.broker.replica_manager import ReplicaManager
from fjord.broker.replication import FollowerTarget
from fjord.metadata import PartitionState
from fjord.storage import LogManager
from fjord.topic_partition import TopicPartition
from tests.helpers.replica_manager import BROKER, Cluster, leader_state, run

OTHER = 2
T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def followed(leader_epoch: int, isr: tuple[int, ...] = (OTHER, BROKER)) -> PartitionState:
    """Partition state led by OTHER, this broker a follower."""
    return PartitionState((OTHER, BROKER), isr, OTHER, leader_epoch, leader_epoch + len(isr))


def test_targets_follow_leadership_changes_and_skip_the_rest(tmp_path: Path) -> None:
    logs = LogManager(tmp_path / "data")
    manager = ReplicaManager(BROKER, logs)
    cluster = Cluster()
    fetchers = ReplicaFetcherManager(manager, lambda _: None, lambda: 1)

    async def body() -> None:
        await manager.apply_metadata(
            cluster.topic("t", [followed(0), leader_state((BROKER, OTHER))]))
        opened = manager.leadership_generation
        assert opened >= 2  # two partitions opened
        await fetchers.update()
        assert fetchers.fetchers[OTHER].targets == {T0: FollowerTarget(OTHER, 0)}

        # An ISR change only: same targets, the generation stays, the update is skipped.
        await manager.apply_metadata(cluster.topic(
            "t", [followed(0, isr=(OTHER,)), leader_state((BROKER, OTHER), isr=(BROKER,))]))
        assert manager.leadership_generation == opened
        assert manager.follower_targets() == {T0: FollowerTarget(OTHER, 0)}
        computed: list[int] = []
        real = manager.follower_targets

        def counted() -> dict[TopicPartition, FollowerTarget]:
            computed.append(1)
            return real()

        manager.follower_targets = counted  # type: ignore[method-assign]
        await fetchers.update()
        assert computed == []  # skipped

        # A new leader epoch: the generation grows and the fetcher's target follows it.
        await manager.apply_metadata(
            cluster.topic("t", [followed(1), leader_state((BROKER, OTHER))]))
        assert manager.leadership_generation > opened
        await fetchers.update()
        assert computed == [1]
        assert fetchers.fetchers[OTHER].targets == {T0: FollowerTarget(OTHER, 1)}

        # A leadership adopted outside a metadata apply (an AlterPartition answer) counts too.
        before = manager.leadership_generation
        partition = manager.partitions[T1]
        partition.update_assignment(
            PartitionAssignment(OTHER, 1, (BROKER, OTHER), (BROKER, OTHER), 9))
        assert manager.leadership_generation == before + 1
        await fetchers.update()
        assert fetchers.fetchers[OTHER].targets == {T0: FollowerTarget(OTHER, 1),
                                                    T1: FollowerTarget(OTHER, 1)}

        # A partition dropped (topic deleted): the generation grows, the fetcher stops.
        before = manager.leadership_generation
        await manager.apply_metadata(cluster.change(
            [], (cluster.keys.topic("t"), cluster.keys.partition("t", 0),
                 cluster.keys.partition("t", 1))))
        assert manager.leadership_generation > before
        await fetchers.update()
        assert fetchers.fetchers == {}

    try:
        run(body())
    finally:
        run(fetchers.close())
        logs.close()
