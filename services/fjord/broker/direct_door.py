"""The broker's direct door: Produce and Fetch as protobuf frames on plain TCP.

The wire format is fjord.direct_frames'.

Why: gRPC's per-message floor (~0.28 ms client -> handler and ~0.21 ms back on an open stream,
against ~0.1 ms each way on plain asyncio TCP; 240-600 us of CPU per message over both ends)
dominates the rest of a record's end-to-end latency and of acks=all replication's CPU
(docs/performance.md; docs/direct-door.md). The door serves exactly the Broker service's
Produce and Fetch, with the same protobuf messages and the same handlers as the gRPC methods
(:meth:`BrokerServicer.produce_from` / :meth:`BrokerServicer.fetch_from`); everything else
stays on gRPC.

Per connection (:class:`DirectConnection`, an asyncio Protocol: no reader task, no stream
objects between the socket and the handlers):

- the hello (``FJD1`` + kind): bytes that are not a hello close the connection unanswered;
  a kind this door does not serve is answered REFUSED, then closed; Produce and Fetch are
  ACCEPTED;
- each request frame is parsed with ``FromString`` and handled at once, Produce up to
  MAX_IN_FLIGHT_PRODUCE at a time, Fetch one after the other (a fetch session's epochs
  follow each other), answers written in request order (:class:`RequestWindow`: the rules of
  fjord.rpc_streams.answer_in_order). A frame that is not a request of the kind (protobuf
  DecodeError) and a handler that raises are answered with an error frame (status 1) in their
  turn, after which the connection closes, as a gRPC stream ends with its handler's
  exception; a frame longer than the broker's gRPC message bound closes it at once;
- back-pressure: reading pauses while requests wait for room in the window and while the
  socket's write buffer is above its high-water mark (a client that does not read its
  answers cannot make the broker buffer more than that plus the answers in flight).

The door has no identity: every request runs as User:ANONYMOUS from the peer's address, so
a broker opens one only without TLS and without authorization (BrokerOptions refuses it
otherwise). A stopping broker closes every direct connection first (:meth:`DirectDoor.close`)
and never waits for them, as it ends its gRPC streams.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from fjord._proto import broker_pb2
from fjord.broker.fetch_wire import DetachedFetchResponse, serialize_fetch_response
from fjord.broker.service import FETCH_METHOD, PRODUCE_METHOD, counted_requests
from fjord.direct_frames import (
    ACCEPTED,
    HELLO_BYTES,
    KIND_FETCH,
    KIND_PRODUCE,
    MAGIC,
    REFUSED,
    STATUS_ERROR,
    STATUS_OK,
    FrameReader,
    FrameTooLargeError,
    MalformedDirectFrameError,
    answer_prefix,
    hello_kind,
)
from fjord.errors import ConfigError
from fjord.observability.metrics import open_stream
from fjord.security.acls import Caller
from fjord.security.principal import ANONYMOUS

log = logging.getLogger(__name__)

T = TypeVar("T")
A = TypeVar("A")

#: How the door's connections show in fjord_broker_open_streams (beside the gRPC streams).
DIRECT_PRODUCE = "fjord.direct/Produce"
DIRECT_FETCH = "fjord.direct/Fetch"

#: Above this many bytes in a connection's write buffer the connection stops reading (and
#: starting requests) until the client has read its answers down to a quarter of it.
WRITE_BUFFER_HIGH_BYTES = 1024 * 1024

#: Answers up to this size go out as one write of prefix + payload (one send, one copy of a
#: small payload); larger ones as two writes, so a large Fetch answer is not copied to
#: prepend 5 bytes (Python 3.11's writelines joins its parts).
_JOIN_BELOW_BYTES = 64 * 1024


# --- pure: the order of one connection's requests and answers --------------------------------


class RequestWindow(Generic[T, A]):
    """The requests of one connection: which may start now and which answers may go out
    (pure: no I/O, no tasks).

    Invariants: requests start in arrival order; at most ``in_flight`` started requests have
    an answer not yet released (an answer that comes early still takes its room until every
    earlier one went out, as fjord.rpc_streams.answer_in_order's semaphore does);
    :meth:`ready` releases every answer exactly once, in arrival order.
    """

    __slots__ = ("_answers", "_in_flight", "_next_released", "_next_started", "_waiting")

    def __init__(self, in_flight: int) -> None:
        if in_flight < 1:
            raise ValueError(f"in_flight must be at least 1, not {in_flight}")
        self._in_flight = in_flight
        self._waiting: collections.deque[T] = collections.deque()
        self._answers: dict[int, A] = {}
        self._next_started = 0
        self._next_released = 0

    def arrive(self, request: T) -> None:
        """A request read from the connection (it starts when :meth:`start` hands it out)."""
        self._waiting.append(request)

    def start(self) -> list[tuple[int, T]]:
        """The waiting requests that may start now, each with its sequence number (what
        :meth:`finish` names it by), in arrival order."""
        started: list[tuple[int, T]] = []
        while self._waiting and self._next_started - self._next_released < self._in_flight:
            started.append((self._next_started, self._waiting.popleft()))
            self._next_started += 1
        return started

    def finish(self, seq: int, answer: A) -> None:
        """The answer of started request ``seq``. ValueError for a request not started or
        already answered."""
        if not self._next_released <= seq < self._next_started or seq in self._answers:
            raise ValueError(f"request {seq} is not started and unanswered")
        self._answers[seq] = answer

    def ready(self) -> list[A]:
        """The answers that may go out now, in request order (each only once)."""
        out: list[A] = []
        while self._next_released in self._answers:
            out.append(self._answers.pop(self._next_released))
            self._next_released += 1
        return out

    @property
    def waiting(self) -> int:
        """Requests read but not started (no room in the window)."""
        return len(self._waiting)

    @property
    def unanswered(self) -> int:
        """Started requests whose answer has not been released."""
        return self._next_started - self._next_released


@dataclass(frozen=True, slots=True)
class Answer:
    """One answer frame: its status (direct_frames.STATUS_OK / STATUS_ERROR) and payload."""

    status: int
    payload: bytes

    @classmethod
    def error(cls, why: str) -> Answer:
        return cls(STATUS_ERROR, why.encode("utf-8", "replace"))


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A request frame that did not parse: answered with an error frame in its turn."""

    why: str


# --- the handlers the door serves ------------------------------------------------------------


class DirectHandlers(Protocol):
    """What the door calls: the Broker servicer's checked Produce and Fetch
    (fjord.broker.service.BrokerServicer), each request counted in the RPC metrics."""

    async def produce_from(
        self, caller: Caller, request: broker_pb2.ProduceRequest
    ) -> broker_pb2.ProduceResponse: ...

    async def fetch_from(
        self, caller: Caller, request: broker_pb2.FetchRequest
    ) -> broker_pb2.FetchResponse | DetachedFetchResponse: ...


@dataclass(frozen=True)
class _Kind:
    """How one kind of request is served on a connection."""

    parse: Callable[[bytes], Any]
    handle: Callable[[DirectHandlers, Caller], Callable[[Any], Coroutine[Any, Any, Any]]]
    serialize: Callable[[Any], bytes]
    in_flight: int
    stream_method: str
    name: str


def _kinds(max_in_flight_produce: int) -> dict[bytes, _Kind]:
    """The kinds a door serves, by hello kind byte; each request is counted under the unary
    method it replaces (as a gRPC stream's are)."""
    return {
        KIND_PRODUCE: _Kind(
            broker_pb2.ProduceRequest.FromString,
            lambda handlers, caller: counted_requests(
                PRODUCE_METHOD, lambda request: handlers.produce_from(caller, request)),
            lambda answer: answer.SerializeToString(),
            max_in_flight_produce, DIRECT_PRODUCE, "ProduceRequest",
        ),
        KIND_FETCH: _Kind(
            broker_pb2.FetchRequest.FromString,
            lambda handlers, caller: counted_requests(
                FETCH_METHOD, lambda request: handlers.fetch_from(caller, request)),
            serialize_fetch_response,
            1, DIRECT_FETCH, "FetchRequest",
        ),
    }


# --- the I/O shell ---------------------------------------------------------------------------


class DirectConnection(asyncio.Protocol):
    """One client connection of a :class:`DirectDoor` (see the module doc for its rules)."""

    def __init__(self, door: DirectDoor) -> None:
        self._door = door
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._hello = b""
        self._kind: _Kind | None = None
        self._handle: Callable[[Any], Coroutine[Any, Any, Any]] | None = None
        self._window: RequestWindow[Any, Answer] = RequestWindow(1)
        self._reader = FrameReader(door.max_request_bytes)
        self._tasks: dict[int, asyncio.Task[Any]] = {}
        self._caller = Caller(ANONYMOUS, "")
        self._peer: object = None
        #: No more requests are read (a frame did not parse, a handler failed, closing).
        self._ending = False
        #: No more requests are started (a handler failed: its error frame ends the
        #: connection, as the gRPC stream's requests after a failed one are cancelled).
        self._failed = False
        #: The client half-closed: the connection closes after its last answer.
        self._eof = False
        self._writing_paused = False
        self._gauge: Any = None

    @property
    def writing_paused(self) -> bool:
        """The write buffer is above its high-water mark (nothing is read or started)."""
        return self._writing_paused

    @property
    def reading(self) -> bool:
        return self._transport is not None and self._transport.is_reading()

    @property
    def buffered_bytes(self) -> int:
        """Answer bytes written to the transport but not yet taken by the socket."""
        return 0 if self._transport is None else self._transport.get_write_buffer_size()

    # asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._peer = transport.get_extra_info("peername")
        host = self._peer[0] if isinstance(self._peer, tuple) and self._peer else ""
        self._caller = Caller(ANONYMOUS, str(host))
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH_BYTES)
        if not self._door.track(self):
            self._ending = True
            transport.close()  # the door is closing: no new connections

    def connection_lost(self, exc: Exception | None) -> None:
        self._ending = True
        self._door.untrack(self)
        for task in self._tasks.values():
            task.cancel()  # as a gRPC stream's handlers are when its client goes away
        self._tasks.clear()
        if self._gauge is not None:
            self._gauge.__exit__(None, None, None)
            self._gauge = None

    def data_received(self, data: bytes) -> None:
        if self._ending:
            return
        if self._kind is None:
            data = self._read_hello(data)
            if self._kind is None or not data:
                return
        try:
            frames = self._reader.feed(data)
        except FrameTooLargeError as exc:
            self._abandon(f"{exc}")
            return
        for frame in frames:
            self._arrive(frame)
            if self._ending:
                break
        self._start_ready()

    def eof_received(self) -> bool:
        """A client that shut its side down still gets the answers of what it sent."""
        self._eof = True
        if self._window.unanswered or self._window.waiting:
            return True  # keep the transport open: _finish closes it after the last answer
        self._ending = True
        return False  # nothing owed: the transport closes

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._start_ready()

    # the hello ------------------------------------------------------------------------------

    def _read_hello(self, data: bytes) -> bytes:
        """Consumes the hello's bytes from ``data``; returns what follows it."""
        assert self._transport is not None
        need = HELLO_BYTES - len(self._hello)
        self._hello += data[:need]
        rest = data[need:]
        seen = self._hello[:len(MAGIC)]
        if not MAGIC.startswith(seen):  # another protocol (an HTTP/2 preface, Kafka): close
            self._abandon(f"not a direct-door hello: {self._hello[:16]!r}")
            return b""
        if len(self._hello) < HELLO_BYTES:
            return b""
        try:
            kind = hello_kind(self._hello)
        except MalformedDirectFrameError as exc:
            self._abandon(str(exc))
            return b""
        served = self._door.kinds.get(kind)
        if served is None:
            log.info("%s: refused a connection from %s for kind %r", self._door.name,
                     self._peer, kind)
            self._ending = True
            self._transport.write(REFUSED)
            self._transport.close()
            return b""
        self._kind = served
        self._handle = served.handle(self._door.handlers, self._caller)
        self._window = RequestWindow(served.in_flight)
        self._gauge = open_stream(served.stream_method)
        self._gauge.__enter__()
        self._transport.write(ACCEPTED)
        return rest

    # requests -------------------------------------------------------------------------------

    def _arrive(self, frame: bytes) -> None:
        assert self._kind is not None
        try:
            request = self._kind.parse(frame)
        except DecodeError as exc:
            # Nothing after a frame that is not a request can be trusted to line up.
            self._window.arrive(Unreadable(f"malformed {self._kind.name}: {exc}"))
            self._ending = True
            return
        self._window.arrive(request)

    def _start_ready(self) -> None:
        """Start what the window lets start (not while the write buffer is full), then read on
        only if nothing is left waiting."""
        if not (self._writing_paused or self._failed) and self._transport is not None \
                and not self._transport.is_closing():
            for seq, request in self._window.start():
                if isinstance(request, Unreadable):
                    self._finish(seq, Answer.error(request.why))
                    continue
                assert self._handle is not None and self._loop is not None
                # loop.create_task: ensure_future's checks cost ~5% of a small request here.
                task = self._loop.create_task(self._handle(request))
                self._tasks[seq] = task
                task.add_done_callback(functools.partial(self._handled, seq))
        self._update_reading()

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._ending or self._writing_paused or self._window.waiting:
            transport.pause_reading()
        else:
            transport.resume_reading()

    def _handled(self, seq: int, task: asyncio.Task[Any]) -> None:
        if self._tasks.pop(seq, None) is None:
            return  # the connection closed meanwhile (close() forgets the tasks it cancels)
        assert self._kind is not None
        # A handler cancelled by something else than this connection (what it awaited was
        # cancelled) has no answer: as a failure, else the answers after it would wait forever.
        exc: BaseException | None = (
            asyncio.CancelledError("the request's handler was cancelled") if task.cancelled()
            else task.exception()
        )
        if exc is None:
            try:
                answer = Answer(STATUS_OK, self._kind.serialize(task.result()))
            except Exception as serialize_exc:  # a bug: as a handler's exception
                exc = serialize_exc
        if exc is not None:
            if not self._failed:  # logged once: the connection ends with this error
                log.error("%s: %s handler failed for %s; answering an error and closing",
                          self._door.name, self._kind.name, self._peer, exc_info=exc)
            self._ending = self._failed = True
            answer = Answer.error(f"{type(exc).__name__}: {exc}")
        self._finish(seq, answer)
        self._start_ready()

    def _finish(self, seq: int, answer: Answer) -> None:
        self._window.finish(seq, answer)
        transport = self._transport
        assert transport is not None
        for ready in self._window.ready():
            if transport.is_closing():
                return
            payload = ready.payload
            prefix = answer_prefix(len(payload), ready.status)
            if len(payload) < _JOIN_BELOW_BYTES:
                transport.write(prefix + payload)
            else:
                transport.write(prefix)
                transport.write(payload)
            if ready.status == STATUS_ERROR:
                self.close()  # after its error frame, as a gRPC stream ends with the error
                return
        if self._eof and not (self._window.unanswered or self._window.waiting):
            self.close()  # the half-closed client has every answer

    # ending ---------------------------------------------------------------------------------

    def _abandon(self, why: str) -> None:
        """Close at once, unanswered (bytes that are not this protocol, an over-long frame)."""
        log.warning("%s: closing the connection from %s: %s", self._door.name, self._peer, why)
        self.close()

    def close(self) -> None:
        """Stop reading and starting, cancel running handlers, close (what was written still
        goes out first; nothing waits for it)."""
        self._ending = True
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()
        if self._transport is not None:
            self._transport.close()


class DirectDoor:
    """One broker's direct-door listener and its connections.

    Invariant: every connection is tracked from its start to its end; after :meth:`close` no
    connection is served (open ones are closed, new ones closed as they come).
    """

    def __init__(
        self,
        handlers: DirectHandlers,
        name: str,
        *,
        max_request_bytes: int,
        max_in_flight_produce: int,
    ) -> None:
        self.handlers = handlers
        self.name = name
        self.max_request_bytes = max_request_bytes
        self.kinds = _kinds(max_in_flight_produce)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._connections: set[DirectConnection] = set()
        self._closed = False

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port); returns the bound port. ConfigError
        naming the address when it cannot be bound."""
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                lambda: DirectConnection(self), host, port, reuse_address=True, backlog=1024,
            )
        except OSError as exc:
            raise ConfigError(f"direct-listen: cannot bind {host}:{port}: {exc}") from exc
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def track(self, connection: DirectConnection) -> bool:
        """Called by a new connection: False when the door is closing (close it)."""
        if self._closed:
            return False
        self._connections.add(connection)
        return True

    def untrack(self, connection: DirectConnection) -> None:
        self._connections.discard(connection)

    @property
    def connections(self) -> tuple[DirectConnection, ...]:
        return tuple(self._connections)

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def close(self) -> int:
        """Stop listening and close every connection (their running handlers cancelled), without
        waiting for any; returns how many were open. Idempotent."""
        self._closed = True
        if self._server is not None:
            self._server.close()
            self._server = None
        connections = list(self._connections)
        for connection in connections:
            connection.close()
        return len(connections)
