"""Offset lookups of the consumer (Kafka's ``OffsetFetcher``): ListOffsets to partition leaders,
the resets of positions (``auto.offset.reset``, committed offsets of a group), and the
refinement of ``offsets_for_times`` answers to the first matching record.

Runs on the client's loop thread; positions and resets live in the shared
:class:`~fjord.client.subscription_state.SubscriptionState` and change only under its lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from fjord._proto import broker_pb2
from fjord.client.metadata import topic_error
from fjord.client.network import Network, transport_error
from fjord.client.subscription_state import SubscriptionState
from fjord.client.types import OffsetAndMetadata, TopicPartition
from fjord.config import ClientConfig
from fjord.errors import (
    ErrorCode,
    FjordError,
    KafkaTimeoutError,
    OffsetOutOfRangeError,
    error_code_from_number,
    error_for_code,
)
from fjord.records.reader import read_batches

log = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
_STRATEGY_TIMESTAMP = {"earliest": EARLIEST_TIMESTAMP, "latest": LATEST_TIMESTAMP}
NO_TIMESTAMP_BOUND = -(2**63)
"""A ``min_timestamp`` every record passes (records without a timestamp carry -1)."""

CommittedLookup = Callable[
    [list[TopicPartition], float], Awaitable[dict[TopicPartition, OffsetAndMetadata]]
]
"""``(partitions, deadline) -> {tp: committed}``: a group's OffsetFetch (absent: none)."""


class NoOffsetForPartitionError(OffsetOutOfRangeError):
    """No position for a partition and ``auto.offset.reset=none`` (Kafka's
    NoOffsetForPartitionException): seek() first, or choose earliest/latest."""


def no_position_error(tp: TopicPartition) -> NoOffsetForPartitionError:
    """What ``poll()``/``position()`` raise for a partition without a position whose reset
    policy is "none" (:meth:`SubscriptionState.without_position`)."""
    return NoOffsetForPartitionError(
        f"no position for {tp.topic}-{tp.partition} (none was set, or the broker answered "
        "OFFSET_OUT_OF_RANGE) and auto.offset.reset is none: seek() to an offset first"
    )


class OffsetFetcher:
    """ListOffsets and position resets for one consumer.

    A partition whose reset strategy is "committed" (a group member's new partition) starts at
    the group's committed offset (``committed_lookup``), else at ``auto.offset.reset``; a reset
    is applied only if no ``seek`` or new assignment replaced it while the lookup ran.
    """

    def __init__(self, state: SubscriptionState, network: Network, config: ClientConfig) -> None:
        self._state = state
        self._network = network
        self._config = config
        self._reset_policy: str = config["auto.offset.reset"]
        self._request_timeout_s = config["request.timeout.ms"] / 1000
        self._backoff_s = config["retry.backoff.ms"] / 1000
        self.committed_lookup: CommittedLookup | None = None

    async def refine_to_records(
        self, found: dict[TopicPartition, tuple[int, int]], asked: dict[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int]]:
        """The broker's time index answers per batch (it never decodes records): the base
        offset of the first batch whose max timestamp is >= the one asked. Kafka's answer is the
        first *record* with such a timestamp, so read that batch and find it. When the read
        fails the broker's (batch-granular) answer is kept."""
        refined = dict(found)
        for tp, (offset, _) in found.items():
            if offset < 0:
                continue
            match = await self.first_record(tp, offset, asked[tp])
            if match is not None:
                refined[tp] = match
        return refined

    async def first_record(
        self, tp: TopicPartition, offset: int, min_timestamp: int = NO_TIMESTAMP_BOUND
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after ``offset`` whose timestamp is
        >= ``min_timestamp``, read with one Fetch of the partition's leader (at least one batch:
        the broker never splits one). None when the leader is unknown, the read fails or that
        Fetch holds no such record (e.g. ``offset`` is the log end)."""
        snapshot = self._network.snapshot
        node = snapshot.leader_of(tp)
        if node is None:
            return None
        request = first_record_fetch(
            tp, offset, self._config["max.partition.fetch.bytes"], snapshot.leader_epoch_of(tp)
        )
        try:
            response = await self._network.broker(node.address).Fetch(
                request, timeout=self._request_timeout_s
            )
        except Exception as exc:
            log.debug("read of the first record of %s at %d failed: %s", tp, offset, exc)
            return None
        return first_record_at_or_after(response, tp, offset, min_timestamp)

    async def reset_positions(self, tps: list[TopicPartition], timeout: float) -> None:
        """Give each of ``tps`` that still has a reset strategy its position ("none" stays
        pending: see :func:`no_position_error`); on failure back off and leave the strategy for
        the next attempt."""
        with self._state.lock:
            pending = {tp: self._state.resets[tp] for tp in tps if tp in self._state.resets}
        if not pending:
            return
        committed = [tp for tp, strategy in pending.items() if strategy == "committed"]
        if committed:
            # Kafka's refreshCommittedOffsetsIfNeeded: the group's committed offset, else the
            # reset policy.
            lookup = self.committed_lookup
            try:
                found_committed = (
                    await lookup(committed, time.monotonic() + timeout) if lookup else {}
                )
            except FjordError as exc:
                log.debug("committed offsets lookup failed: %s", exc)
                await asyncio.sleep(self._backoff_s)
                return
            with self._state.lock:
                for tp in committed:
                    if self._state.resets.get(tp) != "committed":
                        pending.pop(tp)  # a seek or a new assignment came meanwhile
                        continue
                    if tp in found_committed:
                        del self._state.resets[tp]
                        self._state.positions[tp] = found_committed[tp].offset
                        pending.pop(tp)
                    else:
                        self._state.resets[tp] = pending[tp] = self._reset_policy
                self._state.notify()
        # "none" stays pending: poll() and position() raise NoOffsetForPartitionError while it
        # is (SubscriptionState.without_position), so a seek() that lands before them wins.
        asked = {
            tp: _STRATEGY_TIMESTAMP[strategy]
            for tp, strategy in pending.items()
            if strategy != "none"
        }
        if not asked:
            return
        try:
            found = await self.list_offsets(asked, timeout)
        except FjordError as exc:
            log.debug("offset reset failed: %s", exc)
            await asyncio.sleep(self._backoff_s)
            return
        with self._state.lock:
            for tp, (offset, _) in found.items():
                if self._state.resets.get(tp) == pending[tp] and offset >= 0:
                    del self._state.resets[tp]
                    self._state.positions[tp] = offset
            self._state.notify()

    async def list_offsets(
        self, asked: dict[TopicPartition, int], timeout: float
    ) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets to each partition's leader, retrying retriable errors until
        ``timeout``; returns {tp: (offset, timestamp)}."""
        deadline = time.monotonic() + timeout
        remaining = dict(asked)
        found: dict[TopicPartition, tuple[int, int]] = {}
        last: FjordError | None = None
        while remaining:
            snapshot = self._network.snapshot
            missing = [tp for tp in remaining if tp not in snapshot.leaders]
            if missing:
                try:
                    snapshot = await asyncio.wait_for(
                        self._network.refresh_metadata({tp.topic for tp in missing}),
                        max(deadline - time.monotonic(), 0.001),
                    )
                except FjordError as exc:
                    last = exc
                except TimeoutError:
                    pass
                for tp in missing:
                    if tp.topic in snapshot.topic_errors:
                        code, message = snapshot.topic_errors[tp.topic]
                        if not code.retriable:
                            raise topic_error(tp.topic, code, message)
                        last = topic_error(tp.topic, code, message)
            by_node: dict[int, list[TopicPartition]] = {}
            for tp in remaining:
                leader = snapshot.leaders.get(tp)
                if leader is not None:
                    by_node.setdefault(leader, []).append(tp)
            for node_id, tps in by_node.items():
                node = snapshot.brokers[node_id]
                by_topic: dict[str, list[broker_pb2.ListOffsetsPartition]] = {}
                for tp in tps:
                    by_topic.setdefault(tp.topic, []).append(
                        broker_pb2.ListOffsetsPartition(
                            partition=tp.partition,
                            timestamp=remaining[tp],
                            current_leader_epoch=snapshot.leader_epoch_of(tp),
                        )
                    )
                request = broker_pb2.ListOffsetsRequest(
                    replica_id=-1,
                    # read_committed: "latest" is the last stable offset (Kafka's consumer).
                    isolation_level=(
                        1 if self._config["isolation.level"] == "read_committed" else 0
                    ),
                    topics=[
                        broker_pb2.ListOffsetsTopic(name=n, partitions=ps)
                        for n, ps in by_topic.items()
                    ],
                )
                try:
                    response = await self._network.broker(node.address).ListOffsets(
                        request, timeout=max(min(deadline - time.monotonic(), 30.0), 0.001)
                    )
                except Exception as exc:
                    last = transport_error(exc, node.address)
                    continue
                for topic in response.topics:
                    for p in topic.partitions:
                        tp = TopicPartition(topic.name, p.partition)
                        if tp not in remaining:
                            continue
                        code = error_code_from_number(p.error.code)
                        if code is ErrorCode.NONE:
                            found[tp] = (p.offset, p.timestamp)
                            del remaining[tp]
                        elif code.retriable:
                            last = error_for_code(code, p.error.message)
                        else:
                            raise error_for_code(
                                code, f"{tp.topic}-{tp.partition}: {p.error.message or code.name}"
                            )
            if not remaining:
                break
            if time.monotonic() >= deadline:
                raise KafkaTimeoutError(
                    f"no offsets for {sorted(remaining)} within {timeout} s; last error: {last}"
                )
            await asyncio.sleep(self._backoff_s)
            with contextlib.suppress(FjordError, TimeoutError):
                await asyncio.wait_for(
                    self._network.refresh_metadata(),
                    max(deadline - time.monotonic(), 0.001),
                )
        return found


def first_record_fetch(
    tp: TopicPartition, offset: int, max_bytes: int, leader_epoch: int = -1
) -> broker_pb2.FetchRequest:
    """A consumer's Fetch of ``tp`` from ``offset`` that answers at once (max wait 0, min
    bytes 0) with at most ``max_bytes``: at least one whole batch, as the broker never splits
    one. ``leader_epoch`` -1: not checked. Read with :func:`first_record_at_or_after`."""
    return broker_pb2.FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=max_bytes,
        topics=[
            broker_pb2.FetchTopic(
                name=tp.topic,
                partitions=[
                    broker_pb2.FetchPartition(
                        partition=tp.partition,
                        fetch_offset=offset,
                        partition_max_bytes=max_bytes,
                        current_leader_epoch=leader_epoch,
                        last_fetched_epoch=-1,
                    )
                ],
            )
        ],
    )


def first_record_at_or_after(
    response: broker_pb2.FetchResponse, tp: TopicPartition, offset: int, timestamp: int
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record at or after ``offset`` in a Fetch answer whose
    timestamp is >= ``timestamp`` (None when the answer holds none, or an error)."""
    for topic in response.topics:
        if topic.name != tp.topic:
            continue
        for p in topic.partitions:
            if p.partition != tp.partition or p.error.code != ErrorCode.NONE.code:
                continue
            try:
                for batch in read_batches(p.records, allow_partial_tail=True):
                    header = batch.header
                    if header.is_control or header.max_timestamp < timestamp:
                        continue
                    for o, ts, _, _, _ in batch.record_tuples():
                        if o >= offset and ts >= timestamp:
                            return o, ts
            except FjordError:
                return None
    return None
