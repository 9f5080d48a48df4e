"""Produce and Fetch through a broker's direct door (fjord.direct_frames): the sending side.

A :class:`DirectConnection` is what :class:`fjord.rpc_streams.OrderedStream` is on a gRPC
stream, on one plain TCP connection to one broker's door for one kind of request, with the
same interface and failure semantics, so a caller swaps one for the other:

- Requests are written in the order :meth:`DirectConnection.call` was entered, and the n-th
  answer frame belongs to the n-th request still waiting (the door answers in request order).
- A request not answered within its timeout fails with KafkaTimeoutError and closes the
  connection (the answers of the others can no longer be trusted to line up); every request
  waiting on a closed connection fails with a retriable StreamClosedError
  (NETWORK_EXCEPTION), and the next call opens a new connection.
- An error answer (status 1: the broker's handler raised) fails its request with
  StreamClosedError naming the broker's text, and the connection closes, as a gRPC stream
  ends with its handler's exception.
- **Nothing sent, use gRPC**: when the door cannot be reached (connection refused, the
  connection closed before the hello was answered, no acceptance within
  DOOR_CONNECT_TIMEOUT_S) or refuses the kind, the requests
  waiting for the connection fail with :class:`DirectDoorUnavailableError` before a byte
  of theirs left: the caller sends them on gRPC instead, and remembers the door in a
  :class:`DoorFallbacks` so that not every request tries it again.

The fast path has no task and no lock per request: :meth:`DirectConnection.call` serialises
the request and writes its frame at once (a large payload is not copied to prepend its
length), and the protocol's ``data_received`` resolves the waiting
futures in order, each answer decoded by the caller's ``decode`` (the response class's
``FromString``; the follower's fetch_wire decoder, which leaves a big answer's records as
views of the received frame). Requests made while the connection is being opened wait in
a list and are written, in order, as soon as the door accepted the hello.

All methods run on the event loop that owns the connection.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import struct
import time
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

from fjord.direct_frames import (
    ACCEPTED,
    HELLO_BYTES,
    LENGTH_BYTES,
    MAX_FRAME_BYTES,
    REFUSED,
    STATUS_OK,
    FrameTooLargeError,
    MalformedDirectFrameError,
    frame_prefix,
    split_answer,
)
from fjord.errors import ErrorCode, FjordError, KafkaTimeoutError
from fjord.rpc_streams import StreamClosedError

log = logging.getLogger(__name__)

#: Set to ``0`` so that clients and followers use gRPC even where a broker advertises a
#: direct door (A/B benchmarks, as FJORD_CLIENT_RPC_STREAMS=0 for the streams).
DIRECT_DOOR_ENV = "FJORD_DIRECT_DOOR"

#: How long a door that refused or could not be reached is skipped (unless the metadata
#: changed first: see DoorFallbacks).
DOOR_RETRY_AFTER_S = 30.0

#: How long a new connection may take to be accepted (TCP connect and the hello's answer)
#: before the door counts as unavailable (nothing was sent yet: gRPC takes the requests), at
#: most half the first request's timeout. Without it a door behind a firewall that drops
#: packets would time out every request while gRPC to the same broker works.
DOOR_CONNECT_TIMEOUT_S = 3.0


def direct_door_enabled() -> bool:
    """Whether this process may use direct doors (FJORD_DIRECT_DOOR is not ``0``)."""
    return os.environ.get(DIRECT_DOOR_ENV, "1") != "0"


class DirectDoorUnavailableError(FjordError):
    """The door could not be reached or refused the kind: nothing of the request was sent;
    the caller sends it on gRPC instead."""

    code = ErrorCode.NETWORK_EXCEPTION


class _Message(Protocol):
    def SerializeToString(self) -> bytes: ...


Req = TypeVar("Req", bound=_Message)
Resp = TypeVar("Resp")


class _Link(Generic[Resp]):
    """One TCP connection: its transport once made, the futures of the requests written and
    waiting for answers (in order), and the requests waiting for the hello's answer."""

    __slots__ = ("accepted", "closed", "error", "hello_timer", "opening", "pending", "transport",
                 "waiting")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.accepted = False
        self.closed = False
        #: Why the connection closed (the error of the requests that were waiting on it).
        self.error: FjordError | None = None
        self.waiting: collections.deque[asyncio.Future[Resp]] = collections.deque()
        self.pending: list[tuple[asyncio.Future[Resp], bytes]] = []
        self.opening: asyncio.Task[None] | None = None
        self.hello_timer: asyncio.TimerHandle | None = None


_LENGTH = struct.Struct(">I")

#: The receive buffer of a connection, where answers are split (and a large one's start).
SCRATCH_BYTES = 256 * 1024
#: An answer frame from this size on that is not whole in the receive buffer is received in
#: place: the rest of its bytes go from the socket straight into the frame's own buffer.
IN_PLACE_FROM_BYTES = 64 * 1024


class InPlaceFrameReader:
    """Splits a byte stream into frames (fjord.direct_frames' u32 length + bytes), receiving
    into buffers of its own (pure: an asyncio.BufferedProtocol asks :meth:`buffer` where to
    receive, then tells :meth:`filled` how many bytes came).

    Why not FrameReader: it joins what each read returned into its buffer and copies every
    frame out of it twice; an answer of megabytes (a consumer's or a follower's Fetch) would
    cost three copies more than the socket's. Here small frames are split from one receive
    buffer (one copy each), and a frame from ``in_place_from`` bytes on that is not whole yet
    gets a buffer of its exact size, into which the socket writes the rest.

    Invariant: :meth:`filled` returns every complete frame of the bytes received so far, in
    order, each exactly once, as a bytearray of its own (never reused: a decoder may keep
    views of it); with ``lead_bytes`` the first ``lead_bytes`` bytes of the stream come first,
    unframed and alone (the door's answer to the hello; ``filled(0)`` then splits what came
    after them). A length over ``max_frame_bytes`` raises
    FrameTooLargeError as soon as its prefix is complete.
    """

    __slots__ = ("_frame", "_frame_filled", "_frame_view", "_held", "_in_place_from", "_lead",
                 "_max", "_scratch", "_view")

    def __init__(
        self,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        *,
        lead_bytes: int = 0,
        scratch_bytes: int = SCRATCH_BYTES,
        in_place_from: int = IN_PLACE_FROM_BYTES,
    ) -> None:
        if not (in_place_from > 0 and in_place_from + LENGTH_BYTES <= scratch_bytes
                and lead_bytes < scratch_bytes):
            raise ValueError("the receive buffer must hold any frame not received in place")
        self._max = max_frame_bytes
        self._lead = lead_bytes
        self._in_place_from = in_place_from
        self._scratch = bytearray(scratch_bytes)
        self._view = memoryview(self._scratch)
        self._held = 0  # bytes at the receive buffer's start not split yet
        self._frame: bytearray | None = None  # a large frame being received in place
        self._frame_view: memoryview | None = None
        self._frame_filled = 0

    def buffer(self) -> memoryview:
        """Where the next bytes go (never empty)."""
        if self._frame_view is not None:
            return self._frame_view[self._frame_filled:]
        return self._view[self._held:]

    def filled(self, count: int) -> list[bytearray]:
        """``count`` bytes were written to the last :meth:`buffer`: the frames now complete."""
        if self._frame is not None:
            self._frame_filled += count
            if self._frame_filled < len(self._frame):
                return []
            frame = self._frame
            self._frame = self._frame_view = None
            self._frame_filled = 0
            return [frame]
        scratch = self._scratch
        end = self._held + count
        position = 0
        frames: list[bytearray] = []
        if self._lead:
            if end < self._lead:
                self._held = end
                return frames
            # The lead alone: what follows it is read (``filled(0)``) only if the caller wants
            # it (a server that answered the hello in another protocol sends no frames).
            frames.append(scratch[:self._lead])
            rest = end - self._lead
            if rest:
                scratch[:rest] = self._view[self._lead:end]
            self._held, self._lead = rest, 0
            return frames
        while end - position >= LENGTH_BYTES:
            (length,) = _LENGTH.unpack_from(scratch, position)
            if length > self._max:
                raise FrameTooLargeError(
                    f"a frame of {length} bytes announced; at most {self._max} are accepted")
            start = position + LENGTH_BYTES
            if end - start >= length:
                frames.append(scratch[start:start + length])
                position = start + length
                continue
            if length >= self._in_place_from:
                frame = bytearray(length)
                have = end - start
                frame[:have] = self._view[start:end]
                self._frame, self._frame_view, self._frame_filled = frame, memoryview(frame), have
                self._held = 0
                return frames
            break
        rest = end - position
        if rest and position:
            scratch[:rest] = self._view[position:end]  # the same size: no resize
        self._held = rest
        return frames


class _DoorProtocol(asyncio.BufferedProtocol, Generic[Req, Resp]):
    __slots__ = ("_link", "_owner", "_reader")

    def __init__(
        self, owner: DirectConnection[Req, Resp], link: _Link[Resp], max_frame_bytes: int
    ) -> None:
        self._owner = owner
        self._link = link
        self._reader = InPlaceFrameReader(max_frame_bytes, lead_bytes=HELLO_BYTES)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if self._link.closed:  # closed while connecting
            transport.abort()
            return
        self._link.transport = transport
        transport.write(self._owner.hello)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.buffer()

    def buffer_updated(self, nbytes: int) -> None:
        link = self._link
        if link.closed:
            return
        owner = self._owner
        try:
            frames = self._reader.filled(nbytes)
        except MalformedDirectFrameError as exc:  # FrameTooLargeError
            owner._close(link, StreamClosedError(f"{owner.name}: {exc}"))
            return
        if not frames:
            return
        if not link.accepted:
            if not owner._on_hello_answer(link, bytes(frames[0])):
                return
            try:
                frames = self._reader.filled(0)  # what came with the hello's answer
            except MalformedDirectFrameError as exc:
                owner._close(link, StreamClosedError(f"{owner.name}: {exc}"))
                return
        if frames:
            owner._on_answers(link, frames)

    def connection_lost(self, exc: Exception | None) -> None:
        link = self._link
        if link.closed:
            return
        owner = self._owner
        why = f": {exc}" if exc is not None else ""
        if not link.accepted:
            owner._close(link, DirectDoorUnavailableError(
                f"{owner.name} closed before answering the hello{why}"))
        else:
            owner._close(link, StreamClosedError(f"{owner.name} closed by the broker{why}"))


class DirectConnection(Generic[Req, Resp]):
    """Requests of one kind to one broker's direct door (see the module doc), on one TCP
    connection opened at the first :meth:`call` and again after one closed.

    ``hello`` is the kind's hello (fjord.direct_frames.HELLO_PRODUCE / HELLO_FETCH);
    ``decode`` reads an answer's payload (a memoryview of the answer frame) into the response.
    A caller cancelled while it waits leaves the others' answers matched (its answer, when it
    comes, is dropped)."""

    def __init__(
        self,
        host: str,
        port: int,
        hello: bytes,
        decode: Callable[[memoryview], Resp],
        *,
        name: str,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        self.host = host
        self.port = port
        self.hello = hello
        self.name = name
        self._decode = decode
        self._max_frame_bytes = max_frame_bytes
        self._link: _Link[Resp] | None = None
        self._closed = False
        #: Connections opened (a new one after each failure) and answers received: for tests
        #: and diagnostics.
        self.connections_opened = 0
        self.answers = 0

    @property
    def connected(self) -> bool:
        """Whether a connection is open and its hello accepted."""
        return self._link is not None and self._link.accepted

    @property
    def idle(self) -> bool:
        """Whether no request waits on this connection (closing it now fails none)."""
        link = self._link
        return link is None or not (link.waiting or link.pending)

    async def call(self, request: Req, timeout_s: float) -> Resp:
        """The answer to ``request``. Raises KafkaTimeoutError after ``timeout_s`` (the
        connection is closed), StreamClosedError when the connection closed first or the
        broker failed the request, DirectDoorUnavailableError when the door could not be
        reached or refused (nothing was sent: send it on gRPC), FrameTooLargeError for a
        request larger than a frame may be (nothing was sent)."""
        if self._closed:
            raise StreamClosedError(f"{self.name} is closed")
        payload = request.SerializeToString()
        prefix = frame_prefix(len(payload))
        loop = asyncio.get_running_loop()
        link = self._link
        if link is None:
            link = self._open(loop, min(DOOR_CONNECT_TIMEOUT_S, timeout_s / 2))
        answer: asyncio.Future[Resp] = loop.create_future()
        if link.accepted:
            link.waiting.append(answer)
            assert link.transport is not None
            _write_frame(link.transport, prefix, payload)
        else:
            link.pending.append((answer, payload))
        timer = loop.call_later(timeout_s, self._expire, link, answer)
        try:
            return await answer
        finally:
            timer.cancel()

    def close(self) -> None:
        """Closes the connection for good; requests waiting on it fail with
        StreamClosedError."""
        self._closed = True
        if self._link is not None:
            self._close(self._link, StreamClosedError(f"{self.name} closed by the client"))

    def _open(self, loop: asyncio.AbstractEventLoop, accept_within_s: float) -> _Link[Resp]:
        link: _Link[Resp] = _Link()
        self._link = link
        self.connections_opened += 1
        link.opening = loop.create_task(self._connect(loop, link))
        link.hello_timer = loop.call_later(accept_within_s, self._not_accepted, link,
                                           accept_within_s)
        return link

    def _not_accepted(self, link: _Link[Resp], waited_s: float) -> None:
        if not link.accepted:
            self._close(link, DirectDoorUnavailableError(
                f"{self.name} did not accept a connection within {waited_s:.3g} s"))

    async def _connect(self, loop: asyncio.AbstractEventLoop, link: _Link[Resp]) -> None:
        try:
            await loop.create_connection(
                lambda: _DoorProtocol(self, link, self._max_frame_bytes), self.host, self.port)
        except asyncio.CancelledError:
            return  # closed while connecting (_close cancelled us)
        except OSError as exc:
            self._close(link, DirectDoorUnavailableError(f"{self.name}: {exc}"))

    def _on_hello_answer(self, link: _Link[Resp], answer: bytes) -> bool:
        """The door's answer to the hello: True when it accepted (the pending requests are
        written), else the connection is closed."""
        if link.hello_timer is not None:
            link.hello_timer.cancel()
        if answer != ACCEPTED:
            what = "refused" if answer == REFUSED else f"answered {answer!r} to"
            self._close(link, DirectDoorUnavailableError(f"{self.name} {what} the hello"))
            return False
        link.accepted = True
        pending, link.pending = link.pending, []
        transport = link.transport
        assert transport is not None
        for answer_future, payload in pending:
            if answer_future.done():  # cancelled before it was written: nothing to send
                continue
            link.waiting.append(answer_future)
            _write_frame(transport, frame_prefix(len(payload)), payload)
        return True

    def _on_answers(self, link: _Link[Resp], frames: list[bytearray]) -> None:
        waiting = link.waiting
        decode = self._decode
        for frame in frames:
            if not waiting:
                self._close(link, StreamClosedError(f"{self.name}: an answer to no request"))
                return
            waiter = waiting.popleft()
            try:
                status, payload = split_answer(frame)
            except MalformedDirectFrameError as exc:
                waiting.appendleft(waiter)  # fails with the others
                self._close(link, StreamClosedError(f"{self.name}: {exc}"))
                return
            if status != STATUS_OK:
                text = bytes(payload).decode("utf-8", "replace")
                error = StreamClosedError(f"{self.name}: the broker failed the request: {text}")
                if not waiter.done():
                    waiter.set_exception(error)
                self._close(link, StreamClosedError(
                    f"{self.name} closed after a failed request: {text}"))
                return
            if waiter.done():  # its caller was cancelled meanwhile
                continue
            try:
                response = decode(payload)
            except Exception as exc:
                error = StreamClosedError(f"{self.name}: an answer that does not decode: {exc}")
                waiter.set_exception(error)
                self._close(link, error)
                return
            waiter.set_result(response)
            self.answers += 1

    def _expire(self, link: _Link[Resp], answer: asyncio.Future[Resp]) -> None:
        if answer.done():
            return
        answer.set_exception(KafkaTimeoutError(
            f"request to {self.name} timed out (connection closed)"))
        self._close(link, StreamClosedError(
            f"{self.name} closed: an earlier request timed out"))

    def _close(self, link: _Link[Resp], error: FjordError) -> None:
        if link.closed:
            return
        link.closed = True
        link.error = error
        if link.hello_timer is not None:
            link.hello_timer.cancel()
        if self._link is link:
            self._link = None
        if link.transport is not None:
            link.transport.abort()  # nothing left to flush: the waiters fail now
        if link.opening is not None and link.opening is not asyncio.current_task():
            link.opening.cancel()
        failed = list(link.waiting) + [answer for answer, _ in link.pending]
        link.waiting.clear()
        link.pending.clear()
        for waiter in failed:
            if not waiter.done():
                waiter.set_exception(error)
        log.debug("%s", error)


#: Payloads from this size on are written in a second write after their length prefix instead
#: of joined to it: Python 3.11's ``writelines`` joins its parts, a copy of the whole payload
#: (a second write adds a send only when the socket takes the first at once).
_JOIN_BELOW_BYTES = 16 * 1024


def _write_frame(transport: asyncio.Transport, prefix: bytes, payload: bytes) -> None:
    if len(payload) < _JOIN_BELOW_BYTES:
        transport.write(prefix + payload)
    else:
        transport.write(prefix)
        transport.write(payload)


class DoorFallbacks:
    """Doors to skip for now: each door that refused or could not be reached, with when and
    under which ``generation`` (what the caller's metadata said of the broker then).

    Invariant: :meth:`usable` is False for a door only while it was marked under the same
    generation less than ``retry_after_s`` ago; a new generation (a restarted broker's new
    registration, a client's newer metadata) or the time passing makes it usable again, so
    a broker that opens its door later is used without restarting the caller."""

    def __init__(
        self, retry_after_s: float = DOOR_RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._marked: dict[str, tuple[float, Hashable]] = {}

    def mark_unavailable(self, door: str, generation: Hashable) -> None:
        self._marked[door] = (self._clock(), generation)

    def usable(self, door: str, generation: Hashable) -> bool:
        marked = self._marked.get(door)
        if marked is None:
            return True
        at, marked_generation = marked
        if marked_generation != generation or self._clock() - at >= self._retry_after_s:
            del self._marked[door]
            return True
        return False

    def __len__(self) -> int:
        return len(self._marked)


def door_address(host: str, port: int) -> str | None:
    """A door's ``host:port``, None when none is advertised (port 0 or an empty host)."""
    return f"{host}:{port}" if host and port else None


def split_door_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)

