"""Replication, follower side, asyncio shell: one fetcher task per source (leader) broker.

Each :class:`SourceFetcher` loops: build one Fetch for every partition it follows on that
leader (:func:`fjord.broker.replication.build_fetch_request`), send it (the leader parks it up
to ``replica.fetch.wait.max.ms``), and hand each partition's answer to the ReplicaManager, which
truncates, appends and adopts the high watermark. The Fetch requests go on the leader's
FetchStream (:class:`LeaderLink`, fjord.rpc_streams): one stream per followed leader instead of
a unary call per fetch, or, when the leader opens a direct door (fjord.direct_client), on a
plain TCP connection to that door. The pure decisions live in :mod:`fjord.broker.replication`
and :mod:`fjord.broker.partition`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import Callable, Hashable
from typing import Any

import grpc

from fjord._proto import broker_pb2
from fjord.broker import defaults
from fjord.broker.fetch_session import FetchSessionHandler
from fjord.broker.fetch_wire import decode_fetch_response
from fjord.broker.replica_manager import ReplicaManager
from fjord.broker.replication import (
    FollowerPosition,
    FollowerTarget,
    build_fetch_request,
    group_by_source,
)
from fjord.direct_client import (
    DirectConnection,
    DirectDoorUnavailableError,
    DoorFallbacks,
    direct_door_enabled,
    split_door_address,
)
from fjord.direct_frames import HELLO_FETCH
from fjord.errors import ErrorCode, FjordError
from fjord.rpc_streams import OrderedStream, StreamUnimplementedError
from fjord.tls import open_channel, process_client_security
from fjord.topic_partition import TopicPartition

log = logging.getLogger(__name__)

#: Extra seconds a follower's Fetch call may take beyond the leader's max wait before the
#: follower gives up on it (a stopped or partitioned leader), then backs off and retries.
FETCH_CALL_MARGIN_S = 5.0

#: The Broker service's Fetch method (the follower's call, with its own answer decoder).
FETCH_METHOD = "/fjord.v1.Broker/Fetch"
#: The Broker service's FetchStream method: Fetch requests on one stream, answered in order.
FETCH_STREAM_METHOD = "/fjord.v1.Broker/FetchStream"

#: Set to ``0`` in a broker's environment to send its follower fetches as unary Fetch calls
#: (A/B benchmarks in one tree; a way back should a network path mishandle long streams).
REPLICA_FETCH_STREAMS_ENV = "FJORD_REPLICA_FETCH_STREAMS"

#: What a Fetch to the leader raises when it failed in transport (the leader gone, the call or
#: stream broken or timed out): the unary call's RpcError, or the stream's (or direct door's)
#: StreamClosedError / KafkaTimeoutError (both FjordErrors).
FETCH_FAILURES = (grpc.RpcError, FjordError)

#: A leader's direct door as the follower finds it: (``host:port``, the generation of what
#: said so, e.g. the leader's registration), None when the leader opens none.
DoorOf = Callable[[int], tuple[str, Hashable] | None]


def follower_doors_enabled() -> bool:
    """Whether this broker's followers may fetch through their leaders' direct doors: not
    when it dials with TLS or SASL (the door has neither: a secured cluster keeps them) nor
    with FJORD_DIRECT_DOOR=0."""
    security = process_client_security()
    return not security.uses_tls and security.sasl is None and direct_door_enabled()


#: Top-level fetch errors that only end the fetch session (the next fetch is a full one).
SESSION_ERRORS = frozenset(
    {ErrorCode.FETCH_SESSION_ID_NOT_FOUND.code, ErrorCode.INVALID_FETCH_SESSION_EPOCH.code}
)


class LeaderLink:
    """The follower's connection to the leader at ``address``: one channel, and its Fetch
    requests on the leader's FetchStream (an OrderedStream, opened at the first fetch and
    again after one closed), each answered as the unary Fetch is and decoded by the same
    fetch_wire decoder (unary calls throughout with FJORD_REPLICA_FETCH_STREAMS=0). A leader
    that does not serve FetchStream (an older broker: the stream fails as UNIMPLEMENTED,
    nothing was handled) gets the same request as a unary Fetch, and unary calls for the rest
    of this link's life; the fetcher replaces the link after any failure, so an upgraded
    leader is asked for the stream again.

    With ``door`` (the ``host:port`` of the leader's direct door, fjord.direct_client) the
    fetches go through the door instead, decoded alike; a door that cannot be reached or
    refuses (nothing was sent) gets the same request on gRPC, and ``on_door_unavailable`` is
    called so that the fetcher skips the door for a while.

    :meth:`fetch` raises one of FETCH_FAILURES when the request failed in transport.
    Invariant: at most one request in flight (the fetcher awaits each answer), so a stream's
    answers need no matching beyond their order.
    """

    def __init__(
        self,
        address: str,
        door: str | None = None,
        on_door_unavailable: Callable[[str], None] = lambda _door: None,
    ) -> None:
        self.address = address
        #: The direct door fetches go through (None: gRPC, or after the door was unavailable).
        self.door = door
        self._on_door_unavailable = on_door_unavailable
        # Answers decode as the gRPC path's do (fetch_wire: records of big answers as views).
        self._door: DirectConnection[broker_pb2.FetchRequest, Any] | None = None
        if door is not None:
            host, port = split_door_address(door)
            self._door = DirectConnection(
                host, port, HELLO_FETCH, decode_fetch_response,
                name=f"Fetch door {door} of leader {address}",
                max_frame_bytes=defaults.GRPC_MAX_MESSAGE_BYTES + 1,
            )
        streams = os.environ.get(REPLICA_FETCH_STREAMS_ENV, "1") != "0"
        self._channel = open_channel(
            address,
            options=[
                ("grpc.max_send_message_length", defaults.GRPC_MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", defaults.GRPC_MAX_MESSAGE_BYTES),
            ],
        )
        # Large answers are read with their records left in the received message (fetch_wire:
        # upb would copy them twice); the answer's type differs, its fields not.
        self._unary = self._channel.unary_unary(
            FETCH_METHOD,
            request_serializer=broker_pb2.FetchRequest.SerializeToString,
            response_deserializer=decode_fetch_response,
        )
        open_stream = self._channel.stream_stream(
            FETCH_STREAM_METHOD,
            request_serializer=broker_pb2.FetchRequest.SerializeToString,
            response_deserializer=decode_fetch_response,
        )
        #: None once the leader said it serves no FetchStream (or with streams off).
        self._stream: OrderedStream[broker_pb2.FetchRequest, broker_pb2.FetchResponse] | None = (
            OrderedStream(open_stream, address, "FetchStream") if streams else None
        )

    @property
    def streaming(self) -> bool:
        """Whether fetches go on the FetchStream (False after the leader refused it)."""
        return self._stream is not None

    async def fetch(
        self, request: broker_pb2.FetchRequest, timeout_s: float
    ) -> broker_pb2.FetchResponse:
        door = self._door
        if door is not None:
            try:
                return await door.call(request, timeout_s)
            except DirectDoorUnavailableError as exc:
                # Nothing was sent: this fetch and the link's next ones go on gRPC.
                log.info("%s; follower fetches from %s on gRPC", exc, self.address)
                self._door = None
                door.close()
                if self.door is not None:
                    self._on_door_unavailable(self.door)
                self.door = None
        stream = self._stream
        if stream is not None:
            try:
                return await stream.call(request, timeout_s)
            except StreamUnimplementedError:
                log.info("broker at %s serves no FetchStream: follower fetches as unary calls",
                         self.address)
                self._stream = None
                stream.close()
        return await self._unary(request, timeout=timeout_s)

    async def close(self) -> None:
        """Ends the door's connection and the stream (a fetch waiting on them fails with
        StreamClosedError) and the channel."""
        if self._door is not None:
            self._door.close()
        if self._stream is not None:
            self._stream.close()
        with contextlib.suppress(Exception):
            await self._channel.close()


def _failure_text(exc: BaseException) -> str:
    """A failed fetch as the log states it: the gRPC status of a unary call, else the error."""
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        return str(exc.code())
    return f"{type(exc).__name__}: {exc}"


class SourceFetcher:
    """Fetches every partition this broker follows on one leader broker.

    Invariants: at most one Fetch in flight; a partition is in ``targets`` exactly while the
    last applied metadata says this broker follows it on ``source_id`` in that leader epoch; a
    partition whose answer was an error is skipped until its backoff deadline (or until a
    metadata change replaces its target). Once :meth:`stop` began, the task sends no further
    Fetch and applies no further answer, and it ends at its next await even when the
    cancellation itself is lost (see :meth:`stop`).
    """

    def __init__(
        self,
        source_id: int,
        replicas: ReplicaManager,
        address_of: Callable[[int], str | None],
        broker_epoch: Callable[[], int],
        door_of: DoorOf | None = None,
    ) -> None:
        self.source_id = source_id
        self._replicas = replicas
        self._address_of = address_of
        self._broker_epoch = broker_epoch
        #: Where the leader's direct door is (None: gRPC only; see follower_door_of).
        self._door_of = door_of if door_of is not None and follower_doors_enabled() else None
        #: The leader's door after it could not be reached or refused: gRPC until the
        #: leader's registration changes (a restart) or DOOR_RETRY_AFTER_S passed.
        self._door_fallbacks = DoorFallbacks()
        self.targets: dict[TopicPartition, FollowerTarget] = {}
        self._delayed_until: dict[TopicPartition, float] = {}
        self._changed = asyncio.Event()
        #: The channel (and FetchStream) to the leader, opened at the first fetch, replaced
        #: after a failed fetch or when the leader's address changed.
        self._link: LeaderLink | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: The incremental fetch session with the leader (KIP-227): idle partitions are
        #: neither sent nor answered; any failure starts over with a full fetch.
        self.session: FetchSessionHandler[TopicPartition, FollowerPosition] = (
            FetchSessionHandler()
        )
        #: Each followed partition's position as last computed, and the partitions whose
        #: position may have moved since (in an answer, an error, a new target). Positions of
        #: the others are reused; all are recomputed every ``_recompute_all_s`` (a safety net
        #: for changes outside this fetcher, e.g. the scrubber's truncations).
        self._positions: dict[TopicPartition, FollowerPosition] = {}
        self._stale: set[TopicPartition] = set()
        self._recomputed_all_at = float("-inf")
        self._recompute_all_s = replicas.replication.lag_time_max_ms / 1000

    def set_targets(self, targets: dict[TopicPartition, FollowerTarget]) -> None:
        if targets == self.targets:
            return
        for key, target in targets.items():
            if self.targets.get(key) != target:
                self._delayed_until.pop(key, None)
                self._stale.add(key)
        for key in list(self._delayed_until):
            if key not in targets:
                del self._delayed_until[key]
        for key in list(self._positions):
            if key not in targets:
                del self._positions[key]
        self.targets = dict(targets)
        self._changed.set()

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())
        self._task.set_name(f"replica fetcher from broker {self.source_id}")

    async def stop(self) -> None:
        """End the task and close the channel; returns once the task has ended.

        The stop flag ends the task, the cancellation only hurries it: a cancellation can be
        lost. grpc.aio answers the cancel of a unary call whose failure has just arrived with
        that failure (``_invoke`` swallows the CancelledError and the call raises its
        RpcError), and Python 3.11's ``asyncio.wait_for`` returns the inner result when the
        cancel arrives as it completes. A task that outlived its cancel would keep this await,
        and the metadata applier that called it, waiting forever: the broker stopped applying
        metadata (issue 12's chaos run with seed 81365904). With the flag, every path of
        :meth:`_run` returns at its next check, and the wake-up event makes a pause end at once.
        """
        self._stopping = True
        self.targets = {}
        self._changed.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # asyncio.wait, not ``await task``: a cancel of our caller stays our caller's.
            await asyncio.wait({task})
            if not task.cancelled() and task.exception() is not None:
                log.error("replica fetcher from broker %d failed", self.source_id,
                          exc_info=task.exception())
        await self.close_channel()

    async def close_channel(self) -> None:
        """Close the link to the leader (its stream and channel); the next fetch opens one."""
        link, self._link = self._link, None
        if link is not None:
            await link.close()

    async def _leader_link(self) -> LeaderLink | None:
        """The link to the leader's current address (None while the leader is unregistered)."""
        address = self._address_of(self.source_id)
        if address is None:
            return None
        door: str | None = None
        generation: Hashable = None
        found = self._door_of(self.source_id) if self._door_of is not None else None
        if found is not None and self._door_fallbacks.usable(*found):
            door, generation = found
        if self._link is None or address != self._link.address or door != self._link.door:
            await self.close_channel()
            self._link = LeaderLink(
                address, door, functools.partial(self._door_unavailable, generation)
            )
        return self._link

    def _door_unavailable(self, generation: Hashable, door: str) -> None:
        self._door_fallbacks.mark_unavailable(door, generation)

    async def _pause(self, seconds: float) -> None:
        """Sleep up to ``seconds``, waking early when the followed partitions changed since the
        current pass began."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), max(0.0, seconds))

    def _current_positions(self, now: float) -> dict[TopicPartition, FollowerPosition]:
        """Where to fetch each followed partition that is not backing off (recomputing only
        the stale ones, except every ``_recompute_all_s``)."""
        if not self._replicas.disk_writable:
            return {}
        if now - self._recomputed_all_at >= self._recompute_all_s:
            self._recomputed_all_at = now
            self._positions.clear()
            recompute: set[TopicPartition] | dict[TopicPartition, FollowerTarget] = self.targets
        else:
            self._stale.update(self._replicas.take_moved_follower_logs(self.targets))
            recompute = self._stale
        delayed = self._delayed_until
        done = []
        waiting = []  # backing off: recomputed once the backoff is over
        for key in recompute:
            if delayed and delayed.get(key, 0.0) > now:
                waiting.append(key)
                continue
            target = self.targets.get(key)
            pos = None if target is None else self._replicas.follower_position(key, target)
            if pos is None:
                self._positions.pop(key, None)
            else:
                self._positions[key] = pos
            done.append(key)
        self._stale.difference_update(done)
        self._stale.update(waiting)
        if not delayed:
            return dict(self._positions)
        return {k: p for k, p in self._positions.items() if delayed.get(k, 0.0) <= now}

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        settings = self._replicas.replication
        backoff_s = settings.fetch_backoff_ms / 1000
        while not self._stopping:
            self._changed.clear()  # a change from here on wakes the next pause at once
            now = loop.time()
            positions = self._current_positions(now)
            if not positions:
                wake = min(self._delayed_until.values(), default=now + backoff_s)
                await self._pause(max(0.001, min(backoff_s, wake - now)))
                continue
            link = await self._leader_link()
            if link is None:  # the leader is not registered (yet): wait for metadata
                await self._pause(backoff_s)
                continue
            plan = self.session.build(positions)
            request = build_fetch_request(
                self._replicas.broker_id, self._broker_epoch(), plan.to_send.values(), settings,
                session_id=plan.session_id, session_epoch=plan.epoch, forgotten=plan.forgotten,
            )
            try:
                response = await link.fetch(
                    request, settings.fetch_wait_max_ms / 1000 + FETCH_CALL_MARGIN_S
                )
            except asyncio.CancelledError:
                raise
            except FETCH_FAILURES as exc:
                self.session.reset()
                if self._stopping:  # possibly our own cancel, turned into the call's error
                    return
                log.info(
                    "fetch from broker %d failed (%s); retrying in %.2f s",
                    self.source_id,
                    _failure_text(exc),
                    backoff_s,
                )
                await self.close_channel()
                await self._pause(backoff_s)
                continue
            if self._stopping:  # the answer arrived as the stop began: apply nothing of it
                return
            if not self.session.on_response(plan, response.error.code, response.session_id):
                if response.error.code in SESSION_ERRORS:
                    # Evicted, or the leader restarted: the next fetch (at once) is full.
                    log.info("fetch from broker %d: %s; starting a new fetch session",
                             self.source_id, response.error.message)
                    continue
                log.warning(
                    "fetch from broker %d refused: %s", self.source_id, response.error.message
                )
                await self._pause(backoff_s)
                continue
            wanted = {key: self.targets[key] for key in positions if key in self.targets}
            for topic in response.topics:
                for out in topic.partitions:
                    key = TopicPartition(topic.name, out.partition)
                    fetched_for = wanted.get(key)
                    if fetched_for is None:
                        continue
                    self._stale.add(key)
                    try:
                        result = self._replicas.on_follower_fetch_response(
                            key, fetched_for, out, positions[key].fetch_offset
                        )
                    except Exception:
                        log.exception("%s-%d: handling a fetch response failed", *key)
                        self._delayed_until[key] = loop.time() + backoff_s
                        continue
                    if result.error is not None:
                        log.log(
                            logging.DEBUG if result.quiet else logging.INFO,
                            "%s-%d: fetch from leader %d: %s; backing off",
                            key[0],
                            key[1],
                            self.source_id,
                            result.error,
                        )
                        self._delayed_until[key] = loop.time() + backoff_s


class ReplicaFetcherManager:
    """One :class:`SourceFetcher` per leader broker this broker follows partitions on.

    Invariant: after :meth:`update`, every followed partition is in exactly one fetcher's
    targets (its leader's), and fetchers with nothing to follow are stopped.
    """

    def __init__(
        self,
        replicas: ReplicaManager,
        address_of: Callable[[int], str | None],
        broker_epoch: Callable[[], int],
        door_of: DoorOf | None = None,
    ) -> None:
        self._replicas = replicas
        self._address_of = address_of
        self._broker_epoch = broker_epoch
        self._door_of = door_of
        self.fetchers: dict[int, SourceFetcher] = {}
        self._closed = False
        self._updated_generation = -1  # the replica manager's leadership generation last read

    async def update(self) -> None:
        """Re-read which partitions this broker follows, and where (after every metadata
        change). Nothing to do when no hosted partition was added or dropped and none changed
        leader or leader epoch since the last update (most changes after a restart are ISR
        changes): at 10,000 replicas recomputing every target costs tens of milliseconds of
        the event loop per change."""
        if self._closed:
            return
        generation = self._replicas.leadership_generation
        if generation == self._updated_generation:
            return
        self._updated_generation = generation
        groups = group_by_source(self._replicas.follower_targets())
        for source_id in list(self.fetchers):
            if source_id not in groups:
                await self.fetchers.pop(source_id).stop()
        for source_id, targets in groups.items():
            fetcher = self.fetchers.get(source_id)
            if fetcher is None:
                fetcher = SourceFetcher(
                    source_id, self._replicas, self._address_of, self._broker_epoch,
                    self._door_of,
                )
                self.fetchers[source_id] = fetcher
                fetcher.set_targets(targets)
                fetcher.start()
            else:
                fetcher.set_targets(targets)

    async def close(self) -> None:
        self._closed = True
        fetchers = list(self.fetchers.values())
        self.fetchers.clear()
        await asyncio.gather(*(f.stop() for f in fetchers), return_exceptions=True)
