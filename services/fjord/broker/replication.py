"""Replication, follower side, pure parts: which leader each followed partition is
fetched from, the Fetch request one fetcher sends, and the divergence (truncation) decision. The
settings (``replica.*`` keys) are :mod:`fjord.cluster.replication_config`'s.

No sockets, threads or clocks here; :mod:`fjord.broker.fetcher` is the asyncio shell.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fjord._proto import broker_pb2
from fjord.cluster.replication_config import ReplicationSettings
from fjord.topic_partition import TopicPartition

#: Sent as a follower's last fetched epoch when its log is empty (no divergence check).
NO_EPOCH = -1


@dataclass(frozen=True, slots=True)
class FollowerTarget:
    """Where a followed partition is fetched from: its leader and the leader epoch we know."""

    leader_id: int
    leader_epoch: int


def group_by_source(
    targets: Mapping[TopicPartition, FollowerTarget],
) -> dict[int, dict[TopicPartition, FollowerTarget]]:
    """One group per source (leader) broker: each group is served by one fetcher, and one Fetch
    request carries all of its partitions. Partitions without a leader (-1) are not fetched."""
    groups: dict[int, dict[TopicPartition, FollowerTarget]] = {}
    for key, target in targets.items():
        if target.leader_id >= 0:
            groups.setdefault(target.leader_id, {})[key] = target
    return groups


@dataclass(frozen=True, slots=True)
class FollowerPosition:
    """One partition as a follower fetches it: from its log end, with its latest epoch."""

    topic: str
    partition: int
    fetch_offset: int
    last_fetched_epoch: int
    current_leader_epoch: int
    log_start_offset: int
    #: The batch the leader sent at ``fetch_offset`` last time failed its check here.
    damaged_at_fetch_offset: bool = False


def build_fetch_request(
    replica_id: int,
    replica_epoch: int,
    positions: Iterable[FollowerPosition],
    settings: ReplicationSettings,
    *,
    session_id: int = 0,
    session_epoch: int = -1,
    forgotten: Iterable[TopicPartition] = (),
) -> broker_pb2.FetchRequest:
    """The Fetch a follower sends to one leader for the partitions it follows there (topics
    grouped, in the order given): all of them, or in an incremental fetch session
    (:mod:`fjord.broker.fetch_session`) only those added or changed, with the ``forgotten``
    ones to drop. The default session metadata is Kafka's "no session" (epoch -1)."""
    request = broker_pb2.FetchRequest(
        replica_id=replica_id,
        replica_epoch=replica_epoch,
        max_wait_ms=settings.fetch_wait_max_ms,
        min_bytes=settings.fetch_min_bytes,
        max_bytes=settings.fetch_response_max_bytes,
        session_id=session_id,
        session_epoch=session_epoch,
    )
    dropped: dict[str, broker_pb2.ForgottenTopic] = {}
    for topic_name, number in forgotten:
        entry = dropped.get(topic_name)
        if entry is None:
            entry = dropped[topic_name] = request.forgotten.add(name=topic_name)
        entry.partitions.append(number)
    by_topic: dict[str, broker_pb2.FetchTopic] = {}
    for pos in positions:
        topic = by_topic.get(pos.topic)
        if topic is None:
            topic = request.topics.add(name=pos.topic)
            by_topic[pos.topic] = topic
        topic.partitions.add(
            partition=pos.partition,
            fetch_offset=pos.fetch_offset,
            partition_max_bytes=settings.fetch_max_bytes,
            current_leader_epoch=pos.current_leader_epoch,
            last_fetched_epoch=pos.last_fetched_epoch,
            log_start_offset=pos.log_start_offset,
            damaged_at_fetch_offset=pos.damaged_at_fetch_offset,
        )
    return request


@dataclass(frozen=True, slots=True)
class Truncation:
    """Where a diverged follower truncates to. ``complete`` False: the epochs did not match yet;
    the follower truncates and asks again with its (now older) latest epoch."""

    offset: int
    complete: bool


def truncation_for_divergence(
    leader_epoch: int,
    leader_end_offset: int,
    local_epoch_end: tuple[int, int],
    log_end_offset: int,
    high_watermark: int,
) -> Truncation:
    """Kafka's follower rule (AbstractFetcherThread.getOffsetTruncationState).

    ``(leader_epoch, leader_end_offset)`` is the leader's answer (the largest epoch it has at
    or below our last fetched epoch, and where that epoch ends in its log);
    ``local_epoch_end`` is our own ``end_offset_for_epoch(leader_epoch)``.

    - The leader knows no such epoch: truncate to our high watermark (committed, so the leader
      has it).
    - We know no such epoch either: truncate to the leader's end offset.
    - Our largest epoch at or below it differs: truncate to where ours ends, ask again.
    - Same epoch: both logs agree up to the smaller end offset.
    """
    if leader_end_offset < 0:
        return Truncation(min(high_watermark, log_end_offset), True)
    local_epoch, local_end = local_epoch_end
    if leader_epoch < 0 or local_end < 0:
        return Truncation(min(leader_end_offset, log_end_offset), True)
    if local_epoch != leader_epoch:
        return Truncation(min(local_end, log_end_offset), False)
    return Truncation(min(leader_end_offset, local_end, log_end_offset), True)
