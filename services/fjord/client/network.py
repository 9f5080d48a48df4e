"""The clients' I/O shell: a background asyncio loop thread, cached gRPC channels, metadata.

The synchronous clients (Producer, Consumer, AdminClient) do all network I/O on one private
event loop running in a daemon thread, so the application's thread never blocks on a socket
except where the API says it waits (``result()``, ``flush()``, ``poll()``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

import grpc
from grpc._cython import cygrpc

from fjord._proto import broker_pb2, broker_pb2_grpc, controller_pb2_grpc, coordinator_pb2_grpc
from fjord.client.metadata import (
    EMPTY_SNAPSHOT,
    ClusterSnapshot,
    merge_snapshots,
    snapshot_from_response,
)
from fjord.config import CHANNEL_MAX_MESSAGE_BYTES, METADATA_REFRESH_BACKOFF_MS
from fjord.direct_client import (
    DirectConnection,
    DirectDoorUnavailableError,
    DoorFallbacks,
    direct_door_enabled,
    split_door_address,
)
from fjord.direct_frames import HELLO_FETCH, HELLO_PRODUCE
from fjord.errors import (
    ErrorCode,
    FjordError,
    KafkaTimeoutError,
    error_code_from_number,
    error_for_code,
)
from fjord.rpc_streams import OrderedStream, StreamUnimplementedError
from fjord.runtime import freeze_startup_objects, tighten_thread_timer_slack
from fjord.security import ClientSecurity
from fjord.tls import open_channel, process_client_security

log = logging.getLogger(__name__)

#: Set to ``0`` to send Produce and Fetch as unary calls (see ``Network.rpc_streams``).
RPC_STREAMS_ENV = "FJORD_CLIENT_RPC_STREAMS"

T = TypeVar("T")

_TRANSPORT_RETRIABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
}


class NetworkError(FjordError):
    """A call failed in transport (connection refused, reset, deadline): retriable."""

    code = ErrorCode.NETWORK_EXCEPTION


def transport_error(exc: BaseException, address: str) -> FjordError:
    """A gRPC failure as a typed, retriable error naming the peer; an error that is already
    typed (a SASL login refused by fjord.sasl_login: the user was deleted or the password
    changed) keeps its code, so it is not retried as a network error."""
    if isinstance(exc, FjordError):
        return exc
    if isinstance(exc, grpc.aio.AioRpcError):
        status = exc.code()
        if status is grpc.StatusCode.DEADLINE_EXCEEDED:
            return KafkaTimeoutError(f"request to {address} timed out")
        return NetworkError(f"{address}: {status.name} {exc.details() or ''}".strip())
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return KafkaTimeoutError(f"request to {address} timed out")
    return NetworkError(f"{address}: {exc!r}")


#: What grpc.aio posts to a call's loop when another loop polled the call's completion.
_GRPC_COMPLETION: Any = getattr(cygrpc, "_handle_callback_wrapper", None)


class _ClientEventLoop(asyncio.SelectorEventLoop):
    """An :class:`EventLoopThread`'s loop: drops a gRPC completion posted after it closed.

    grpc.aio has one completion queue per process, and every loop that made a call watches
    it; whichever loop wakes first runs the queued completions and posts the others' to
    their own loops with ``call_soon_threadsafe``. A call cancelled as its client closes
    (a Produce or Fetch stream, a parked Fetch) ends at once on the client's side, but the
    core reports its pending operations a moment later; when that is after this loop closed,
    the post raised "Event loop is closed" in ANOTHER client's loop, which logged it with a
    traceback (a process with an AdminClient open while a Consumer closes). Nothing waits
    for such a completion any more, so it is dropped; anything else posted to a closed loop
    still raises.
    """

    def call_soon_threadsafe(  # type: ignore[override]
        self, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.Handle:
        try:
            return super().call_soon_threadsafe(callback, *args, context=context)
        except RuntimeError:
            if callback is not _GRPC_COMPLETION or not self.is_closed():
                raise
            dropped = asyncio.Handle(callback, args, self, context)
            dropped.cancel()
            return dropped


class EventLoopThread:
    """A daemon thread running one asyncio loop until :meth:`stop`.

    Invariant: every coroutine of the client runs on this loop; other threads only submit.
    The first one in a process freezes the start-up objects out of the cyclic garbage
    collector (:func:`fjord.runtime.freeze_startup_objects`): a full collection would stall
    this thread, and with it every produce and fetch, for tens of milliseconds.
    """

    def __init__(self, name: str) -> None:
        freeze_startup_objects()
        self.loop: asyncio.AbstractEventLoop = _ClientEventLoop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Timers on this thread (the producer's linger wait) fire within microseconds of due.
        tighten_thread_timer_slack()
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        # Let cancelled tasks finish their cleanup before the loop closes.
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Run ``coro`` on the loop and wait for it (``timeout``: KafkaTimeoutError)."""
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            if future.done():
                raise  # the coroutine's own timeout error (TimeoutError is the same class)
            future.cancel()
            raise KafkaTimeoutError(f"operation did not finish within {timeout} s") from None

    def call_soon(self, fn: Callable[[], object]) -> None:
        self.loop.call_soon_threadsafe(fn)

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)

    @property
    def thread_id(self) -> int | None:
        return self._thread.ident

    @property
    def in_loop_thread(self) -> bool:
        return threading.get_ident() == self._thread.ident


def client_interceptors_if_enabled(
    service: str, tracer_provider: Any | None
) -> list[grpc.aio.ClientInterceptor] | None:
    """Fjord's tracing/metrics interceptors when someone can see what they record (a tracer
    provider is configured or this process serves /metrics), else None: bare channels. See
    :mod:`fjord.observability.clients` for why."""
    if (
        tracer_provider is None
        and "opentelemetry.trace" not in sys.modules
        and "fjord.observability.metrics" not in sys.modules
    ):
        # Nobody set up tracing or metrics without importing them: skip loading both.
        return None
    from fjord.observability import client_interceptors
    from fjord.observability.clients import client_instrumentation_enabled

    if not client_instrumentation_enabled(tracer_provider):
        return None
    return client_interceptors(service, tracer_provider)


class Network:
    """gRPC channels (one per address, cached) and the cluster metadata, on one event loop.

    Invariants: all methods except the constructor run on the owning loop; ``snapshot`` only
    moves forward by whole answers; refreshes are coalesced (concurrent callers share one
    request) and spaced by at least ``METADATA_REFRESH_BACKOFF_MS``; every channel gets the
    same interceptors, chosen once at construction (``service`` labels their metrics).
    """

    def __init__(
        self,
        bootstrap: Iterable[tuple[str, int]],
        *,
        client_id: str,
        request_timeout_ms: int,
        allow_auto_topic_creation: bool = False,
        service: str = "client",
        tracer_provider: Any | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        self.bootstrap = [f"{h}:{p}" for h, p in bootstrap]
        self.interceptors = client_interceptors_if_enabled(service, tracer_provider)
        self.client_id = client_id
        #: How channels dial: the client's own settings when they say TLS or SASL (SASL_SSL
        #: and SASL_PLAINTEXT: open_channel puts the SCRAM login on each channel), else
        #: (PLAINTEXT, None) as this process (fjord.tls.open_channel): plaintext in an
        #: application, the service's own certificate inside a secured broker or coordinator
        #: (its internal clients).
        self.security = (
            security
            if security is not None and (security.uses_tls or security.sasl is not None)
            else None
        )
        self.request_timeout_s = request_timeout_ms / 1000
        self.allow_auto_topic_creation = allow_auto_topic_creation
        self.snapshot: ClusterSnapshot = EMPTY_SNAPSHOT
        self.topics_of_interest: set[str] = set()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._brokers: dict[str, broker_pb2_grpc.BrokerStub] = {}
        self._controllers: dict[str, controller_pb2_grpc.ControllerStub] = {}
        self._coordinators: dict[str, coordinator_pb2_grpc.CoordinatorStub] = {}
        self._refresh: asyncio.Task[ClusterSnapshot] | None = None
        self._last_refresh = 0.0
        self.closed = False
        #: Produce and Fetch go on one stream per broker and kind (fjord.rpc_streams) unless
        #: the channels are instrumented (a span and a traceparent per call need the call) or
        #: log in with SASL (a session token is checked when a call starts, and a stream would
        #: outlive the session); FJORD_CLIENT_RPC_STREAMS=0 turns them off (benchmarks' A/B).
        self.rpc_streams = (
            not self.interceptors
            and (self.security is None or self.security.sasl is None)
            and os.environ.get(RPC_STREAMS_ENV, "1") != "0"
        )
        self._streams: dict[tuple[str, str], OrderedStream[Any, Any]] = {}
        self._unary_only: set[str] = set()  # brokers that do not serve the streams
        #: Produce and Fetch go through a broker's direct door (fjord.direct_client) when its
        #: metadata advertises one, unless the client has security configured (the door has
        #: no TLS and no login: a secured client keeps them), this process dials with TLS or
        #: SASL (a secured service's internal client), the channels are instrumented (as for
        #: the streams: a span per call needs the call) or FJORD_DIRECT_DOOR=0.
        process_security = process_client_security()
        self.direct_doors = (
            not self.interceptors
            and self.security is None
            and not process_security.uses_tls
            and process_security.sasl is None
            and direct_door_enabled()
        )
        #: The open door connections by (gRPC address, method), each with its door's address.
        self._doors: dict[tuple[str, str], tuple[str, DirectConnection[Any, Any]]] = {}
        #: Doors that refused or could not be reached: gRPC for them until the metadata
        #: changes or DOOR_RETRY_AFTER_S passed.
        self._door_fallbacks = DoorFallbacks()

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = open_channel(
                address,
                self.security,
                options=[
                    ("grpc.max_send_message_length", CHANNEL_MAX_MESSAGE_BYTES),
                    ("grpc.max_receive_message_length", CHANNEL_MAX_MESSAGE_BYTES),
                    ("grpc.primary_user_agent", f"fjord-client/{self.client_id}"),
                    # Reconnect fast after a broker restart instead of gRPC's long backoff.
                    ("grpc.initial_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000),
                    ("grpc.enable_retries", 0),
                ],
                interceptors=self.interceptors,
            )
            self._channels[address] = channel
        return channel

    def broker(self, address: str) -> broker_pb2_grpc.BrokerStub:
        stub = self._brokers.get(address)
        if stub is None:
            stub = self._brokers[address] = broker_pb2_grpc.BrokerStub(self._channel(address))
        return stub

    async def produce(
        self, address: str, request: broker_pb2.ProduceRequest, timeout_s: float
    ) -> broker_pb2.ProduceResponse:
        """A Produce to the broker at ``address``: through its direct door when it opens one
        and the client may use it (see ``direct_doors``), else on its ProduceStream when
        streams are on (see ``rpc_streams``), else a unary call. Raises a typed FjordError
        (retriable NetworkError / StreamClosedError, KafkaTimeoutError) on a transport
        failure."""
        return await self._broker_call(address, "Produce", request, timeout_s)

    async def fetch(
        self, address: str, request: broker_pb2.FetchRequest, timeout_s: float
    ) -> broker_pb2.FetchResponse:
        """A Fetch to the broker at ``address``, as :meth:`produce` sends a Produce."""
        return await self._broker_call(address, "Fetch", request, timeout_s)

    async def _broker_call(self, address: str, method: str, request: Any, timeout_s: float) -> Any:
        if self.direct_doors and not self.closed:
            snapshot = self.snapshot
            door = snapshot.direct_doors.get(address)
            if door is not None and self._door_fallbacks.usable(door, snapshot.version):
                try:
                    return await self._door(address, door, method).call(request, timeout_s)
                except DirectDoorUnavailableError as exc:
                    # Nothing was sent: this request and the next ones go on gRPC.
                    log.info("%s; %s to %s on gRPC for now", exc, method, address)
                    self._door_fallbacks.mark_unavailable(door, snapshot.version)
        if self.rpc_streams and address not in self._unary_only:
            try:
                return await self._stream(address, method).call(request, timeout_s)
            except StreamUnimplementedError:
                # Nothing was handled: this broker predates the streams; unary from now on.
                log.info("%s serves no %sStream: unary calls from now on", address, method)
                self._unary_only.add(address)
        try:
            return await getattr(self.broker(address), method)(request, timeout=timeout_s)
        except Exception as exc:
            raise transport_error(exc, address) from exc

    def _door(self, address: str, door: str, method: str) -> DirectConnection[Any, Any]:
        """The connection to the direct door ``door`` of the broker at ``address`` for
        ``method`` (a new one when the broker's door moved)."""
        known = self._doors.get((address, method))
        if known is not None:
            if known[0] == door:
                return known[1]
            known[1].close()
        host, port = split_door_address(door)
        if method == "Produce":
            hello, decode = HELLO_PRODUCE, broker_pb2.ProduceResponse.FromString
        else:
            hello, decode = HELLO_FETCH, broker_pb2.FetchResponse.FromString
        connection: DirectConnection[Any, Any] = DirectConnection(
            host, port, hello, decode, name=f"{method} door {door} of {address}"
        )
        self._doors[(address, method)] = (door, connection)
        return connection

    def _close_departed_doors(self) -> None:
        """Closes the idle door connections of brokers the metadata no longer names with
        that door (a broker that left the cluster, or closed or moved its door): they would
        otherwise stay for the client's life. A connection with requests waiting is left to
        them; the next refresh closes it once idle."""
        doors = self.snapshot.direct_doors
        for key, (door, connection) in list(self._doors.items()):
            if doors.get(key[0]) != door and connection.idle:
                del self._doors[key]
                connection.close()

    def door_connections(self) -> dict[tuple[str, str], DirectConnection[Any, Any]]:
        """The direct-door connections made so far, by (gRPC address, method) (for tests and
        diagnostics)."""
        return {key: connection for key, (_, connection) in self._doors.items()}

    def _stream(self, address: str, method: str) -> OrderedStream[Any, Any]:
        stream = self._streams.get((address, method))
        if stream is None:
            open_call = getattr(self.broker(address), method + "Stream")
            stream = OrderedStream(open_call, address, method + "Stream")
            self._streams[(address, method)] = stream
        return stream

    def controller(self, address: str) -> controller_pb2_grpc.ControllerStub:
        stub = self._controllers.get(address)
        if stub is None:
            stub = controller_pb2_grpc.ControllerStub(self._channel(address))
            self._controllers[address] = stub
        return stub

    def coordinator(self, address: str) -> coordinator_pb2_grpc.CoordinatorStub:
        stub = self._coordinators.get(address)
        if stub is None:
            stub = coordinator_pb2_grpc.CoordinatorStub(self._channel(address))
            self._coordinators[address] = stub
        return stub

    async def find_coordinator(self, group_id: str) -> str:
        """The address of the coordinator serving ``group_id``, from the first broker that
        answers FindCoordinator. Raises the typed (retriable) error the broker reports, e.g.
        COORDINATOR_NOT_AVAILABLE while ``__consumer_offsets`` or its owner is missing, or
        NetworkError when no broker answers; wrap in :meth:`call_with_retries` to wait."""
        request = broker_pb2.FindCoordinatorRequest(key=group_id, key_type=0)
        errors: list[str] = []
        for address in self.candidate_addresses():
            try:
                response = await self.broker(address).FindCoordinator(
                    request, timeout=self.request_timeout_s
                )
            except (TimeoutError, grpc.aio.AioRpcError) as exc:
                errors.append(str(transport_error(exc, address)))
                continue
            code = error_code_from_number(response.error.code)
            if code is not ErrorCode.NONE:
                raise error_for_code(
                    code, f"FindCoordinator({group_id!r}): {response.error.message}"
                )
            return f"{response.coordinator.host}:{response.coordinator.port}"
        raise NetworkError(
            f"no broker answered FindCoordinator({group_id!r}): " + "; ".join(errors[-3:])
        )

    def candidate_addresses(self) -> list[str]:
        known = [n.address for n in self.snapshot.brokers.values()]
        return known + [a for a in self.bootstrap if a not in known]

    async def refresh_metadata(
        self, topics: Iterable[str] | None = None, *, spaced: bool = True
    ) -> ClusterSnapshot:
        """Ask one broker (known brokers first, then bootstrap) for metadata of the topics of
        interest plus ``topics`` (None and no interest: all topics). ``spaced``: wait until
        ``METADATA_REFRESH_BACKOFF_MS`` have passed since the last answer (refreshes a client
        makes on its own, after errors); False for a request the application made itself
        (``AdminClient.describe_topics``: Kafka's admin client sends it at once), which the
        caller's retries space instead. A refresh in flight is shared either way."""
        if topics:
            self.topics_of_interest.update(topics)
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.ensure_future(self._do_refresh(spaced))
        return await asyncio.shield(self._refresh)

    async def _do_refresh(self, spaced: bool = True) -> ClusterSnapshot:
        wait = self._last_refresh + METADATA_REFRESH_BACKOFF_MS / 1000 - time.monotonic()
        if spaced and wait > 0:
            await asyncio.sleep(wait)
        all_topics = not self.topics_of_interest
        request = broker_pb2.MetadataRequest(
            topics=sorted(self.topics_of_interest),
            all_topics=all_topics,
            allow_auto_topic_creation=self.allow_auto_topic_creation,
        )
        errors: list[str] = []
        for address in self.candidate_addresses():
            try:
                response = await self.broker(address).Metadata(
                    request, timeout=self.request_timeout_s
                )
            except (TimeoutError, grpc.aio.AioRpcError) as exc:
                errors.append(str(transport_error(exc, address)))
                continue
            self._last_refresh = time.monotonic()
            new = snapshot_from_response(response)
            self.snapshot = merge_snapshots(self.snapshot, new, replace_all=all_topics)
            self._close_departed_doors()
            return self.snapshot
        self._last_refresh = time.monotonic()
        raise NetworkError(
            "no broker answered a Metadata request (tried "
            + ", ".join(self.candidate_addresses())
            + "): "
            + "; ".join(errors[-3:])
        )

    async def call_with_retries(
        self,
        attempt: Callable[[], Awaitable[T]],
        *,
        deadline: float,
        backoff_s: float,
        what: str,
    ) -> T:
        """Run ``attempt`` until it succeeds, a non-retriable FjordError is raised, or the
        monotonic ``deadline`` passes (KafkaTimeoutError naming the last error). Metadata is
        refreshed between attempts."""
        last: BaseException | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaTimeoutError(f"{what} did not succeed in time; last error: {last}")
            try:
                return await asyncio.wait_for(attempt(), remaining)
            except FjordError as exc:
                if not exc.retriable:
                    raise
                last = exc
            except (TimeoutError, grpc.aio.AioRpcError) as exc:
                # An attempt cut short by the deadline says less than the error before it
                # (e.g. "connection refused" from every broker): keep that one.
                if not (isinstance(exc, TimeoutError) and last is not None):
                    last = transport_error(exc, what)
            await asyncio.sleep(min(backoff_s, max(deadline - time.monotonic(), 0)))
            try:
                await asyncio.wait_for(
                    self.refresh_metadata(), max(deadline - time.monotonic(), 0.001)
                )
            except (TimeoutError, FjordError) as exc:
                last = last or exc

    async def close(self) -> None:
        self.closed = True
        if self._refresh is not None and not self._refresh.done():
            self._refresh.cancel()
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.close()
        doors, self._doors = list(self._doors.values()), {}
        for _, door in doors:
            door.close()
        channels, self._channels = list(self._channels.values()), {}
        self._brokers.clear()
        self._controllers.clear()
        self._coordinators.clear()
        for channel in channels:
            await channel.close(grace=None)


def is_transport_error(exc: BaseException) -> bool:
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code() in _TRANSPORT_RETRIABLE
    return isinstance(exc, asyncio.TimeoutError | TimeoutError | NetworkError)
