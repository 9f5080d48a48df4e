"""The consumer's group coordination (Kafka's ``ConsumerCoordinator``): JoinGroup/SyncGroup,
heartbeats, commits and committed-offset lookups against the group's coordinator, and the
rebalances applied in the thread that calls ``poll()``.

The decisions (member id, generation, owned partitions, what to revoke or assign, deadlines)
are the pure :class:`fjord.client.group_membership.GroupMembership`; this module only makes the
calls. Threads: a background task on the client's loop (``run``) sends heartbeats, auto-commits,
refreshes metadata for patterns and partition counts and enforces ``max.poll.interval.ms``;
assignments it receives are posted as events that ``poll()`` applies (``run_group_work``), so
``on_assign``/``on_revoke`` run in the application's thread (docs/clients.md, "Consumer
groups"). Shared consumer state is read and changed only under the
:class:`~fjord.client.subscription_state.SubscriptionState` lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from fjord._proto import broker_pb2, coordinator_pb2
from fjord.client.group_membership import (
    GroupAction,
    GroupMembership,
    MemberState,
    Rebalanced,
)
from fjord.client.metadata import snapshot_from_response
from fjord.client.network import EventLoopThread, Network, transport_error
from fjord.client.subscription_state import SubscriptionState
from fjord.client.types import OffsetAndMetadata, TopicPartition
from fjord.config import ClientConfig
from fjord.errors import (
    CommitFailedError,
    ErrorCode,
    FjordError,
    KafkaTimeoutError,
    MaxPollIntervalExceededError,
    error_code_from_number,
    error_for_code,
)
from fjord.groups.defaults import CONSUMER_PROTOCOL_TYPE

if TYPE_CHECKING:
    from fjord.client.consumer import Consumer

log = logging.getLogger(__name__)

RebalanceCallback = Callable[["Consumer", list[TopicPartition]], Any]
"""``on_assign`` / ``on_revoke``: ``fn(consumer, partitions)``."""

# Group answers meaning "this member's generation is over": a commit becomes CommitFailedError.
_COMMIT_FENCED = frozenset(
    {
        ErrorCode.ILLEGAL_GENERATION,
        ErrorCode.UNKNOWN_MEMBER_ID,
        ErrorCode.REBALANCE_IN_PROGRESS,
        ErrorCode.FENCED_INSTANCE_ID,
    }
)


POLL_TIMER_REFRESH_S = 1.0
"""A group member waiting in a long poll() wakes this often to refresh its poll timer."""


def now_ms() -> int:
    """The membership's injected clock: monotonic milliseconds."""
    return int(time.monotonic() * 1000)


def normalize_offsets(
    offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
) -> dict[TopicPartition, OffsetAndMetadata]:
    """``{tp: offset | OffsetAndMetadata}`` checked (offsets >= 0, else the typed
    INVALID_COMMIT_OFFSET_SIZE error) and as OffsetAndMetadata."""
    out: dict[TopicPartition, OffsetAndMetadata] = {}
    for tp, value in offsets.items():
        om = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(value)
        if isinstance(om.offset, bool) or not isinstance(om.offset, int) or om.offset < 0:
            raise FjordError(
                f"invalid offset {om.offset!r} for {tp[0]}-{tp[1]}: offsets are integers >= 0",
                code=ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
            )
        out[TopicPartition(*tp)] = om
    return out


def _subscribed_topics(metadata: bytes) -> tuple[str, ...]:
    from fjord.groups.protocol import decode_subscription

    try:
        return decode_subscription(metadata).topics
    except FjordError:
        return ()


class ConsumerCoordinator:
    """One consumer's group membership: the calls to the group coordinator and what they
    change in the consumer.

    Invariants: ``_stored`` (offsets auto commit may send) and ``_last_committed`` only hold
    assigned partitions; auto commit sends a partition only when its offset differs from the
    last one committed; group events reach the application in the order they were posted.
    """

    def __init__(
        self,
        consumer: Consumer,
        state: SubscriptionState,
        network: Network,
        io: EventLoopThread,
        config: ClientConfig,
        membership: GroupMembership,
        *,
        set_assignment: Callable[[list[TopicPartition]], None],
        wake_fetcher: Callable[[], None],
    ) -> None:
        self._consumer = consumer
        self._state = state
        self._network = network
        self._io = io
        self._config = config
        self._membership = membership
        self._set_assignment = set_assignment
        self._wake_fetcher = wake_fetcher
        self._group_id: str = config["group.id"]
        self._auto_commit: bool = config["enable.auto.commit"]
        self._auto_store: bool = config["enable.auto.offset.store"]
        self._request_timeout_s = config["request.timeout.ms"] / 1000
        self._backoff_s = config["retry.backoff.ms"] / 1000
        self._on_assign: RebalanceCallback | None = None
        self._on_revoke: RebalanceCallback | None = None
        # Events for the poll() thread, in order: ("rebalanced", Rebalanced), ("lost", tps),
        # ("error", FjordError).
        self._group_events: deque[tuple[str, Any]] = deque()
        # Offsets stored for auto commit: store_offsets(), or (enable.auto.offset.store) the
        # positions at the start of the last poll(), i.e. after the records returned before it.
        self._stored: dict[TopicPartition, int] = {}
        self._last_committed: dict[TopicPartition, int] = {}
        self._address: str | None = None  # the group coordinator's, None until found
        self._joining: asyncio.Task[Any] | None = None
        self._group_wakeup: asyncio.Event | None = None

    @property
    def membership(self) -> GroupMembership:
        return self._membership

    def set_listener(
        self, on_assign: RebalanceCallback | None, on_revoke: RebalanceCallback | None
    ) -> None:
        """The application's rebalance callbacks (called with the lock held)."""
        self._on_assign, self._on_revoke = on_assign, on_revoke

    def forget_unassigned(self, keep: set[TopicPartition]) -> None:
        """Drop stored and committed offsets of partitions not in ``keep`` (with the lock)."""
        for state in (self._stored, self._last_committed):
            for tp in [tp for tp in state if tp not in keep]:
                del state[tp]

    def store(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Record processed offsets for the next auto commit (with the lock)."""
        self._stored.update(offsets)

    def still_polling(self) -> None:
        """A poll() waiting for records is polling: keep max.poll.interval.ms satisfied."""
        self._membership.still_polling(now_ms())

    def cancel_tasks(self) -> None:
        """Stop a join in progress (on the loop thread, at close)."""
        if self._joining is not None:
            self._joining.cancel()

    def leave(self, reason: str) -> None:
        """Leave the group (``unsubscribe()``, ``close()``): auto commit and ``on_revoke`` the
        owned partitions, stop fetching, send LeaveGroup unless this is a static member."""
        membership = self._membership
        with self._state.lock:
            owned = [TopicPartition(*tp) for tp in sorted(membership.owned)]
        if owned:
            self._revoke(owned, commit=True)
        with self._state.lock:
            member_id = membership.member_id
            _, leave = membership.unsubscribe()
            self._group_events.clear()
        self._set_assignment([])
        if leave:
            with contextlib.suppress(Exception):
                self._io.run(self._leave_group(member_id, reason), self._request_timeout_s + 1)

    # -- consumer groups: the poll() thread ---------------------------------------------------

    def poll_started(self) -> None:
        """At the start of ``poll()``: store positions and auto commit when due, apply group
        work; raises :class:`MaxPollIntervalExceededError` once after the member left."""
        membership = self._membership
        now = now_ms()
        offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        with self._state.lock:
            expired = membership.poll_called(now)
            if self._auto_store:
                # Records returned before this poll() count as processed (Kafka's rule).
                self._stored.update(self._state.positions)
            if self._auto_commit and membership.auto_commit_due(now):
                membership.auto_commit_scheduled(now)
                offsets = self._offsets_to_auto_commit()
        if offsets:
            self._io.submit(self.commit_quietly(offsets))
        if self._state.mode == "subscribe":
            self.run_group_work()
        if expired:
            interval = self._config["max.poll.interval.ms"]
            raise MaxPollIntervalExceededError(
                f"poll() was not called within max.poll.interval.ms ({interval} ms), so this "
                f"consumer left group {self._group_id!r} and its partitions were reassigned; "
                "process records faster, lower max.poll.records or raise max.poll.interval.ms. "
                "The next poll() rejoins the group."
            )

    def work_pending(self) -> bool:
        """Events to apply or a rebalance to start (called with the lock held)."""
        membership = self._membership
        return bool(self._group_events) or membership.should_start_join()

    def run_group_work(self) -> None:
        """Apply what the group task posted (assignments, lost partitions, errors), and start
        a rebalance when one is needed: callbacks run here, in the poll() thread."""
        membership = self._membership
        while True:
            revoke: list[TopicPartition] = []
            with self._state.lock:
                event = self._group_events.popleft() if self._group_events else None
                if event is None:
                    if self._state.mode != "subscribe" or not membership.should_start_join():
                        return
                    revoke = [TopicPartition(*tp) for tp in membership.start_join()]
            if event is not None:
                self._apply_group_event(event)
                continue
            if revoke:
                self._revoke(revoke, commit=True)
            self._io.call_soon(self._start_join_task)
            return

    def _apply_group_event(self, event: tuple[str, Any]) -> None:
        kind, payload = event
        if kind == "error":
            raise payload
        if kind == "lost":
            lost = [TopicPartition(*tp) for tp in payload]
            self._revoke(lost, commit=False)
            return
        rebalanced: Rebalanced = payload
        if rebalanced.revoked:
            self._revoke([TopicPartition(*tp) for tp in rebalanced.revoked], commit=True)
        assignment = [TopicPartition(*tp) for tp in rebalanced.assignment]
        self._set_assignment(assignment)
        self._network.topics_of_interest |= {tp.topic for tp in assignment}
        self._wake_fetcher()
        log.info(
            "group %s generation %d: assigned %s", self._group_id, rebalanced.generation, assignment
        )
        if self._on_assign is not None:
            self._on_assign(self._consumer, [TopicPartition(*tp) for tp in rebalanced.added])

    def _revoke(self, partitions: list[TopicPartition], *, commit: bool) -> None:
        """Stop consuming ``partitions``: auto commit their positions first (not for lost
        partitions: another member may own them), then ``on_revoke``."""
        gone = set(partitions)
        try:
            if commit and self._auto_commit:
                with self._state.lock:
                    offsets = self.final_offsets(partitions)
                if offsets:
                    try:
                        self._io.run(
                            self.commit(offsets, time.monotonic() + self._request_timeout_s),
                            self._request_timeout_s + 1,
                        )
                    except FjordError as exc:
                        log.warning("commit before revoking %s failed: %s", partitions, exc)
            if self._on_revoke is not None:
                self._on_revoke(self._consumer, list(partitions))
        finally:
            with self._state.lock:
                remaining = [tp for tp in self._state.assignment if tp not in gone]
            self._set_assignment(remaining)

    def final_offsets(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        # Called with the lock held: what auto commit sends when partitions are given up
        # (revoke, unsubscribe, close): the positions (everything poll() returned counts as
        # processed), or only the stored offsets with enable.auto.offset.store=false.
        source = self._state.positions if self._auto_store else self._stored
        return {
            tp: OffsetAndMetadata(source[tp])
            for tp in partitions
            if tp in source and source[tp] != self._last_committed.get(tp)
        }

    def _offsets_to_auto_commit(self) -> dict[TopicPartition, OffsetAndMetadata]:
        # Called with the lock held: stored offsets of assigned partitions not yet committed.
        assigned = set(self._state.assignment)
        return {
            tp: OffsetAndMetadata(offset)
            for tp, offset in self._stored.items()
            if tp in assigned and self._last_committed.get(tp) != offset
        }

    # -- consumer groups: the loop thread -----------------------------------------------------

    def wake(self) -> None:
        def wake() -> None:
            if self._group_wakeup is not None:
                self._group_wakeup.set()

        self._io.call_soon(wake)

    def _notify_poller(self) -> None:
        # Called with the lock held: wake a poll() waiting for records.
        self._state.notify()

    def _post_lost(self, membership: GroupMembership) -> None:
        # Called with the lock held.
        lost = membership.take_lost()
        if lost:
            self._group_events.append(("lost", lost))
        self._notify_poller()

    def _start_join_task(self) -> None:
        if self._joining is None or self._joining.done():
            self._joining = asyncio.ensure_future(self._join())

    async def run(self) -> None:
        """Background duties of a member: enforce max.poll.interval.ms, heartbeat, auto commit,
        refresh metadata for patterns and partition counts; sleeps until the next deadline."""
        membership = self._membership
        self._group_wakeup = wakeup = asyncio.Event()
        tasks: dict[str, asyncio.Task[Any]] = {}

        def launch(name: str, coro: Any) -> None:
            running = tasks.get(name)
            if running is not None and not running.done():
                coro.close()
                return
            task = asyncio.ensure_future(coro)
            tasks[name] = task
            task.add_done_callback(lambda _: wakeup.set())

        while not self._state.closed:
            wakeup.clear()
            now = now_ms()
            offsets: dict[TopicPartition, OffsetAndMetadata] = {}
            heartbeat: tuple[int, str, str | None] | None = None
            with self._state.lock:
                subscribed = self._state.mode == "subscribe"
                member_id = membership.member_id
                leave = membership.check_poll_interval(now) if subscribed else None
                if leave is not None:
                    log.warning(
                        "consumer %s left group %s: poll() not called within max.poll.interval.ms",
                        member_id,
                        self._group_id,
                    )
                    self._post_lost(membership)
                if subscribed and membership.session_expired(now):
                    self._address = None
                if subscribed and membership.heartbeat_due(now):
                    generation = membership.heartbeat_sent(now)
                    heartbeat = (
                        generation,
                        membership.member_id,
                        membership.config.group_instance_id,
                    )
                if (
                    self._auto_commit
                    and self._state.mode is not None
                    and membership.auto_commit_due(now)
                ):
                    membership.auto_commit_scheduled(now)
                    offsets = self._offsets_to_auto_commit()
                refresh = subscribed and membership.metadata_due(now)
                deadline = membership.next_deadline_ms()
            if leave:
                launch("leave", self._leave_group(member_id, "max.poll.interval.ms exceeded"))
            if heartbeat is not None:
                launch("heartbeat", self._heartbeat(*heartbeat))
            if offsets:
                launch("commit", self.commit_quietly(offsets))
            if refresh:
                launch("metadata", self._refresh_group_metadata())
            sleep = 1.0 if deadline is None else max((deadline - now_ms()) / 1000, 0.001)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(wakeup.wait(), min(sleep, 1.0))

    async def _coordinator_address(self, deadline: float) -> str:
        address = self._address
        if address is None:
            group_id = self._group_id
            assert group_id is not None

            async def find() -> str:
                return await self._network.find_coordinator(group_id)

            address = await self._network.call_with_retries(
                find, deadline=deadline, backoff_s=self._backoff_s, what="FindCoordinator"
            )
            self._address = address
        return address

    async def _group_call(self, method: str, request: Any, timeout_s: float) -> Any:
        """One call to the group's coordinator (found first when unknown); transport errors
        forget the coordinator and raise the typed retriable error."""
        address = await self._coordinator_address(time.monotonic() + self._request_timeout_s)
        try:
            return await getattr(self._network.coordinator(address), method)(
                request, timeout=timeout_s
            )
        except Exception as exc:
            self._address = None
            raise transport_error(exc, address) from exc

    def _after_group_error(self, code: ErrorCode) -> None:
        if code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE):
            self._address = None

    async def _join(self) -> None:
        """JoinGroup and SyncGroup until this member has an assignment (posted for poll()),
        is reset (lost partitions posted), or fails (the error posted)."""
        membership = self._membership
        cfg = self._config
        join_timeout = max(self._request_timeout_s, cfg["max.poll.interval.ms"] / 1000 + 5)
        while not self._state.closed:
            with self._state.lock:
                if membership.state is not MemberState.PREPARING_REBALANCE:
                    return
                join = membership.join_request()
            request = coordinator_pb2.JoinGroupRequest(
                group_id=self._group_id,
                session_timeout_ms=join.session_timeout_ms,
                rebalance_timeout_ms=join.rebalance_timeout_ms,
                member_id=join.member_id,
                group_instance_id=join.group_instance_id or "",
                protocol_type=CONSUMER_PROTOCOL_TYPE,
                protocols=[
                    coordinator_pb2.JoinGroupProtocol(name=n, metadata=md)
                    for n, md in join.protocols
                ],
                client_id=cfg["client.id"],
                reason=join.reason,
            )
            try:
                response = await self._group_call("JoinGroup", request, join_timeout)
                code = error_code_from_number(response.error.code)
            except FjordError as exc:
                log.debug("JoinGroup failed: %s", exc)
                code = exc.code  # transport errors are retriable: rediscover
                response = None
            members = (
                [(m.member_id, m.group_instance_id or None, m.metadata) for m in response.members]
                if response is not None
                else []
            )
            with self._state.lock:
                action = membership.join_completed(
                    code,
                    member_id=response.member_id if response is not None else "",
                    generation=response.generation_id if response is not None else -1,
                    protocol=response.protocol_name if response is not None else "",
                    leader_id=response.leader if response is not None else "",
                    members=members,
                )
                generation, member_id = membership.generation, membership.member_id
                is_leader, protocol = membership.is_leader, membership.protocol
            if action is GroupAction.JOIN_AGAIN:
                continue
            if action is not GroupAction.SYNC:
                await self._join_failed(action, code, "JoinGroup")
                # poll() may have started the next attempt meanwhile (the loop's top checks).
                continue
            assignments: dict[str, bytes] = {}
            if is_leader:
                topics = {t for _, _, md in members for t in _subscribed_topics(md)}
                counts = await self._partition_counts(topics)
                with self._state.lock:
                    assignments = membership.assignments_to_send(members, counts)
            sync = coordinator_pb2.SyncGroupRequest(
                group_id=self._group_id,
                generation_id=generation,
                member_id=member_id,
                group_instance_id=join.group_instance_id or "",
                protocol_type=CONSUMER_PROTOCOL_TYPE,
                protocol_name=protocol or "",
                assignments=[
                    coordinator_pb2.SyncGroupAssignment(member_id=m, assignment=a)
                    for m, a in assignments.items()
                ],
            )
            try:
                answer = await self._group_call("SyncGroup", sync, join_timeout)
                code = error_code_from_number(answer.error.code)
                assignment = answer.assignment
            except FjordError as exc:
                log.debug("SyncGroup failed: %s", exc)
                code = exc.code  # transport errors are retriable: rediscover
                assignment = b""
            with self._state.lock:
                subscribed = membership.subscribed_topics
            counts = await self._partition_counts(subscribed) if code is ErrorCode.NONE else {}
            with self._state.lock:
                try:
                    result = membership.sync_completed(code, assignment, counts)
                except FjordError as exc:  # undecodable assignment bytes
                    self._group_events.append(("error", exc))
                    self._notify_poller()
                    return
                if isinstance(result, Rebalanced):
                    membership.stable_started(now_ms())
                    self._group_events.append(("rebalanced", result))
                    self._notify_poller()
            if isinstance(result, Rebalanced):
                self.wake()
                return
            if result is not GroupAction.JOIN_AGAIN:
                await self._join_failed(result, code, "SyncGroup")

    async def _join_failed(self, action: GroupAction, code: ErrorCode, what: str) -> None:
        membership = self._membership
        self._after_group_error(code)
        with self._state.lock:
            if action is GroupAction.RESET:
                self._post_lost(membership)
            elif action is GroupAction.FATAL:
                self._group_events.append(
                    (
                        "error",
                        error_for_code(code, f"{what} for group {self._group_id!r}: {code.name}"),
                    )
                )
        if action is not GroupAction.FATAL:
            await asyncio.sleep(self._backoff_s)
        with self._state.lock:
            self._notify_poller()

    async def _partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        """Partition counts of ``topics`` (those the metadata knows) from a fresh answer."""
        wanted = set(topics)
        if not wanted:
            return {}
        try:
            snapshot = await asyncio.wait_for(
                self._network.refresh_metadata(wanted), self._request_timeout_s
            )
        except (FjordError, TimeoutError) as exc:
            log.debug("metadata for the group failed: %s", exc)
            snapshot = self._network.snapshot
        counts = {}
        for topic in wanted:
            count = snapshot.partition_count(topic)
            if count:
                counts[topic] = count
        return counts

    async def _all_topic_counts(self) -> dict[str, int]:
        """Every topic and its partition count (a pattern subscription needs all names)."""
        request = broker_pb2.MetadataRequest(all_topics=True, allow_auto_topic_creation=False)
        last: FjordError | None = None
        for address in self._network.candidate_addresses():
            try:
                response = await self._network.broker(address).Metadata(
                    request, timeout=self._request_timeout_s
                )
            except Exception as exc:
                last = transport_error(exc, address)
                continue
            snapshot = snapshot_from_response(response)
            return {name: len(d.partitions) for name, d in snapshot.topics.items()}
        raise last or FjordError("no broker to ask", code=ErrorCode.NETWORK_EXCEPTION)

    async def _refresh_group_metadata(self) -> None:
        membership = self._membership
        with self._state.lock:
            by_pattern = membership.pattern is not None
            watched = membership.topics_to_watch()
        try:
            if by_pattern:
                counts = await self._all_topic_counts()
            else:
                counts = await self._partition_counts(watched)
        except FjordError as exc:
            log.debug("group metadata refresh failed: %s", exc)
            return
        with self._state.lock:
            if membership.update_metadata(now_ms(), counts, all_topics=by_pattern):
                log.info("group %s: rejoining (%s)", self._group_id, membership.rejoin_reason)
                if membership.pattern is not None:
                    self._network.topics_of_interest |= set(membership.subscribed_topics)
                self._notify_poller()

    async def _heartbeat(self, generation: int, member_id: str, instance_id: str | None) -> None:
        membership = self._membership
        request = coordinator_pb2.HeartbeatRequest(
            group_id=self._group_id,
            generation_id=generation,
            member_id=member_id,
            group_instance_id=instance_id or "",
        )
        try:
            response = await self._group_call("Heartbeat", request, self._request_timeout_s)
            code = error_code_from_number(response.error.code)
        except FjordError as exc:
            code = exc.code
        self._after_group_error(code)
        with self._state.lock:
            action = membership.heartbeat_completed(code, generation, now_ms())
            if action is GroupAction.RESET:
                log.info("group %s: member %s reset (%s)", self._group_id, member_id, code.name)
                self._post_lost(membership)
            elif action is GroupAction.REJOIN:
                self._notify_poller()
            elif action is GroupAction.FATAL:
                self._post_lost(membership)
                self._group_events.append(
                    ("error", error_for_code(code, f"Heartbeat of group {self._group_id!r}"))
                )
        if action is GroupAction.REDISCOVER:
            self.wake()

    async def _leave_group(self, member_id: str, reason: str) -> None:
        request = coordinator_pb2.LeaveGroupRequest(
            group_id=self._group_id,
            members=[coordinator_pb2.MemberIdentity(member_id=member_id, reason=reason)],
        )
        try:
            await self._group_call("LeaveGroup", request, self._request_timeout_s)
        except FjordError as exc:
            log.debug("LeaveGroup failed (the session timeout will remove the member): %s", exc)

    async def commit_quietly(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        try:
            await self.commit(offsets, time.monotonic() + self._request_timeout_s)
        except FjordError as exc:
            log.warning("auto commit of group %s failed: %s", self._group_id, exc)

    async def commit(
        self, offsets: dict[TopicPartition, OffsetAndMetadata], deadline: float
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """OffsetCommit, retrying coordinator moves until ``deadline``."""
        membership = self._membership
        if not offsets:
            return {}
        with self._state.lock:
            as_member = self._state.mode == "subscribe"
            generation = membership.generation if as_member else -1
            member_id = membership.member_id if as_member else ""
            instance_id = membership.config.group_instance_id if as_member else None
        if as_member and generation < 0:
            raise CommitFailedError(
                f"cannot commit for group {self._group_id!r} now: this consumer is not a member "
                "of a generation (a rebalance is in progress); poll() rejoins, then commit",
                code=ErrorCode.REBALANCE_IN_PROGRESS,
            )
        by_topic: dict[str, list[coordinator_pb2.OffsetCommitPartition]] = {}
        for tp, om in offsets.items():
            by_topic.setdefault(tp.topic, []).append(
                coordinator_pb2.OffsetCommitPartition(
                    partition=tp.partition,
                    committed_offset=om.offset,
                    committed_leader_epoch=-1 if om.leader_epoch is None else om.leader_epoch,
                    committed_metadata=om.metadata,
                )
            )
        request = coordinator_pb2.OffsetCommitRequest(
            group_id=self._group_id,
            generation_id=generation,
            member_id=member_id,
            group_instance_id=instance_id or "",
            topics=[
                coordinator_pb2.OffsetCommitTopic(name=n, partitions=ps)
                for n, ps in by_topic.items()
            ],
        )
        last: FjordError | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaTimeoutError(
                    f"OffsetCommit for group {self._group_id!r} did not succeed in time; "
                    f"last error: {last}"
                )
            try:
                response = await self._group_call("OffsetCommit", request, remaining)
            except FjordError as exc:
                if not exc.retriable:
                    raise
                last = exc
                await asyncio.sleep(self._backoff_s)
                continue
            failures: list[tuple[TopicPartition | None, ErrorCode, str]] = [
                (None, error_code_from_number(response.error.code), response.error.message)
            ]
            for topic in response.topics:
                for p in topic.partitions:
                    failures.append(
                        (
                            TopicPartition(topic.name, p.partition),
                            error_code_from_number(p.error.code),
                            p.error.message,
                        )
                    )
            failures = [f for f in failures if f[1] is not ErrorCode.NONE]
            if not failures:
                with self._state.lock:
                    for tp, om in offsets.items():
                        self._last_committed[tp] = om.offset
                return dict(offsets)
            failed_tp, code, message = failures[0]
            if code.retriable:
                self._after_group_error(code)
                last = error_for_code(code, message)
                await asyncio.sleep(self._backoff_s)
                continue
            if code in _COMMIT_FENCED:
                if as_member:
                    with self._state.lock:
                        membership.commit_failed(code, generation)
                        self._post_lost(membership)
                    raise CommitFailedError(
                        f"commit for group {self._group_id!r} refused ({code.name}): the group "
                        "has rebalanced and this consumer's partitions may belong to another "
                        "member now; poll() rejoins",
                        code=code,
                    )
                raise CommitFailedError(
                    f"simple commit (assign()) for group {self._group_id!r} refused "
                    f"({code.name}): the group has active members",
                    code=code,
                )
            where = f"{failed_tp.topic}-{failed_tp.partition}: " if failed_tp is not None else ""
            raise error_for_code(code, f"OffsetCommit {where}{message or code.name}")

    async def fetch_committed(
        self, partitions: list[TopicPartition], deadline: float
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """OffsetFetch: the committed offsets of ``partitions`` (absent: none committed);
        a read_committed consumer asks for stable offsets (KIP-447)."""
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        request = coordinator_pb2.OffsetFetchRequest(
            group_id=self._group_id,
            topics=[
                coordinator_pb2.OffsetFetchTopic(name=n, partitions=ps)
                for n, ps in by_topic.items()
            ],
            # A read_committed consumer never starts from an offset a transaction may still
            # replace: UNSTABLE_OFFSET_COMMIT is retried until the transaction ended.
            require_stable=self._config["isolation.level"] == "read_committed",
        )

        async def attempt() -> dict[TopicPartition, OffsetAndMetadata]:
            response = await self._group_call(
                "OffsetFetch", request, max(deadline - time.monotonic(), 0.001)
            )
            code = error_code_from_number(response.error.code)
            if code is not ErrorCode.NONE:
                self._after_group_error(code)
                raise error_for_code(code, f"OffsetFetch for group {self._group_id!r}")
            found: dict[TopicPartition, OffsetAndMetadata] = {}
            for topic in response.topics:
                for p in topic.partitions:
                    tp = TopicPartition(topic.name, p.partition)
                    pcode = error_code_from_number(p.error.code)
                    if pcode is not ErrorCode.NONE:
                        self._after_group_error(pcode)
                        raise error_for_code(pcode, f"OffsetFetch {tp.topic}-{tp.partition}")
                    if p.committed_offset >= 0:
                        epoch = p.committed_leader_epoch
                        found[tp] = OffsetAndMetadata(
                            p.committed_offset, p.metadata, epoch if epoch >= 0 else None
                        )
            return found

        return await self._network.call_with_retries(
            attempt, deadline=deadline, backoff_s=self._backoff_s, what="OffsetFetch"
        )
