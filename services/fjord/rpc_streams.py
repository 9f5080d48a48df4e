"""Requests of one kind on one long-lived bidirectional gRPC stream, answered in order.

Why: a grpc.aio unary call costs its set-up on both sides (a call object, HEADERS and
trailers, a handler task, the completion-queue hops that wake each side's threads) on top of
its message. On this machine a bare unary call with 5 ms between calls takes ~0.5 ms from the
client to the handler and ~0.3 ms back; a message on an open stream ~0.28 and ~0.21
(``bench/grpc_floor.py --stream``). Produce and Fetch are the calls a record's way takes, so
the clients send them on the Broker service's ProduceStream and FetchStream (broker.proto).

Both sides keep Kafka's connection rules:

- **Server** (:func:`answer_in_order`): requests are read as they arrive; each starts its
  handler at once (handlers start in arrival order, so Produce appends, which a handler makes
  before it first suspends, are in arrival order too), at most ``in_flight`` are unanswered,
  and answers are written in request order. ``in_flight`` 1 serves one request after the
  other (Fetch: a fetch session's epochs follow each other).
- **Client** (:class:`OrderedStream`): requests are written in the order :meth:`call` was
  entered and the n-th answer belongs to the n-th request still waiting. A request that is
  not answered within its timeout fails with KafkaTimeoutError and closes the stream (the
  answers of the others can no longer be trusted to line up, as a Kafka client closes the
  connection on a request timeout); every request waiting on a closed stream fails with a
  retriable StreamClosedError (NETWORK_EXCEPTION), and the next call opens a new stream.
- **Headers first** (:func:`send_stream_headers`): a server of such a stream sends its
  headers (``STREAM_HEADERS``) when the call starts, before it reads, and the client writes a
  new stream's first request only once they came. That is how the client tells a server
  without the method from one that serves it: the former answers the call's headers with
  UNIMPLEMENTED and no headers of its own (StreamUnimplementedError: fall back to unary
  calls), and a request being written when that status arrives makes grpc end the call as
  INTERNAL instead ("Internal error from Core"), which reads as a broken stream. The headers
  must not be empty: grpc hands a client the (empty) headers of an UNIMPLEMENTED answer a
  moment before its status, and a write in that moment meets the same fate.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar

import grpc
from grpc import aio

from fjord.errors import ErrorCode, FjordError, KafkaTimeoutError

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")


# --- server ---------------------------------------------------------------------------------


async def answer_in_order(
    requests: AsyncIterator[Req],
    handle: Callable[[Req], Awaitable[Resp]],
    in_flight: int,
) -> AsyncIterator[Resp]:
    """The answers to ``requests``, in their order: ``handle(request)`` starts as soon as the
    request is read (while fewer than ``in_flight`` answers are outstanding). A handler that
    raises ends the stream with its exception (the requests after it are cancelled); a
    caller that goes away cancels every handler still running, as it would cancel a unary
    call's."""
    if in_flight < 1:
        raise ValueError(f"in_flight must be at least 1, not {in_flight}")
    if in_flight == 1:
        # One after the other: the handler runs in this task, as a unary call's does (no
        # reader task, queue or hand-over between tasks on the answer's way out).
        async for request in requests:
            yield await handle(request)
        return
    started: asyncio.Queue[asyncio.Future[Resp] | None] = asyncio.Queue()
    room = asyncio.Semaphore(in_flight)

    async def read() -> None:
        try:
            async for request in requests:
                await room.acquire()
                started.put_nowait(asyncio.ensure_future(handle(request)))
        finally:
            started.put_nowait(None)  # the writer ends after the last answer

    reader = asyncio.ensure_future(read())
    try:
        while (answer := await started.get()) is not None:
            try:
                yield await answer
            finally:
                room.release()
        await reader  # a failed read (the caller's stream broke) ends the stream with it
    finally:
        reader.cancel()
        while not started.empty():
            left = started.get_nowait()
            if left is not None:
                left.cancel()


#: The headers a server of an ordered stream sends when the stream starts (see "Headers
#: first" in the module doc): any non-empty headers would do; these name what they mean.
STREAM_HEADERS = (("fjord-stream", "ordered"),)


async def send_stream_headers(context: aio.ServicerContext) -> None:
    """The first thing a stream handler does for an :class:`OrderedStream` client: send its
    headers, the client's sign that the method is served (it writes only after them)."""
    await context.send_initial_metadata(STREAM_HEADERS)


class OpenStreams:
    """The server tasks of the streams a servicer is serving, so that a stopping server can
    end them: an open stream never ends by itself, and ``aio.Server.stop(grace)`` would wait
    out the whole grace for it. Ending a stream cancels what its task waits for (the next
    request, a running handler: as the grace's end cancels a unary call) and the stream
    ends with status OK, so the client sees it closed at once and retries elsewhere.

    Cancelling the task is not enough by itself: grpc.aio takes a server task that raised
    CancelledError for a call its client cancelled and sends nothing, so the client would
    wait for its request timeout. Hence :meth:`serving` turns that cancellation into the
    handler's return. (A cancel that lands while an answer is being sent is grpc.aio's, and
    the server's grace applies to that stream: end the streams before waking parked handlers.)
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ended = False

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        """Around the body of a stream handler (it runs in the stream's server task): after
        :meth:`end_all` the body's wait is cancelled and the cancellation ends the body
        quietly. A stream that opens after :meth:`end_all` ends at its first wait."""
        task = asyncio.current_task()
        assert task is not None
        if self._ended:
            task.cancel()
        self._tasks.add(task)
        try:
            yield
        except asyncio.CancelledError:
            if not self._ended:
                raise  # the client went away (or the server's grace ran out)
            task.uncancel()
        finally:
            self._tasks.discard(task)

    def end_all(self) -> int:
        """Cancels every stream being served, and any opened from now on; returns how many
        were open."""
        self._ended = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return len(tasks)

    def __len__(self) -> int:
        return len(self._tasks)


# --- client ---------------------------------------------------------------------------------


class StreamClosedError(FjordError):
    """A request's stream closed before its answer came (the server went away, the stream
    broke, or another request on it timed out): retriable, the request may or may not have
    been handled, as for a Kafka request on a connection that dropped."""

    code = ErrorCode.NETWORK_EXCEPTION


class StreamUnimplementedError(FjordError):
    """The server does not serve the stream method (an older broker): nothing was handled;
    the caller sends the request as a unary call instead."""

    code = ErrorCode.UNSUPPORTED_VERSION


class _Stream(Generic[Resp]):
    """One open call: its writes in order, the futures of the requests waiting for answers."""

    __slots__ = ("call", "closed", "error", "reader", "served", "waiting", "writing")

    def __init__(self, call: Any) -> None:
        self.call = call
        self.waiting: collections.deque[asyncio.Future[Resp]] = collections.deque()
        self.writing = asyncio.Lock()
        self.reader: asyncio.Future[None] | None = None
        self.closed = False
        #: Why the stream closed (the error of the requests that were waiting on it).
        self.error: FjordError | None = None
        #: The server's headers came: it serves the method (see OrderedStream.call).
        self.served = False


class OrderedStream(Generic[Req, Resp]):
    """Requests to one server on one bidirectional stream (``open_call()`` starts it: a
    grpc.aio stream-stream call), opened at the first :meth:`call` and again after one
    closes. All methods run on the loop that owns the channel.

    The server's handler must send its headers first (:func:`send_stream_headers`): a new
    stream's requests are written after them (see "Headers first" in the module doc);
    without them they wait out their timeout.

    A caller cancelled while it waits to write or for its answer leaves the others' answers
    matched; one cancelled during its own write ends the stream (grpc cancels the call when
    a write is cancelled), failing the others with StreamClosedError. The clients cancel
    their requests only when they close."""

    def __init__(self, open_call: Callable[[], Any], address: str, method: str) -> None:
        self._open_call = open_call
        self.address = address
        self.method = method
        self._stream: _Stream[Resp] | None = None
        self._closed = False

    async def call(self, request: Req, timeout_s: float) -> Resp:
        """The answer to ``request``. Raises KafkaTimeoutError after ``timeout_s`` (the
        stream is closed), StreamClosedError when the stream closed first,
        StreamUnimplementedError when the server does not serve the method."""
        if self._closed:
            raise StreamClosedError(f"{self.method} stream to {self.address} is closed")
        stream = self._stream
        if stream is None:
            stream = self._stream = _Stream(self._open_call())
            stream.reader = asyncio.ensure_future(self._read(stream))
        answer: asyncio.Future[Resp] = asyncio.get_running_loop().create_future()
        timer = asyncio.get_running_loop().call_later(timeout_s, self._expire, stream, answer)
        try:
            async with stream.writing:
                if not stream.served:
                    await self._until_served(stream)
                if answer.done():  # timed out before it was written: nothing was sent
                    return answer.result()
                if stream.closed:
                    raise self._unsent(stream)
                stream.waiting.append(answer)
                try:
                    await stream.call.write(request)
                except BaseException as exc:
                    # Written or not, the answers can no longer be matched to requests.
                    if isinstance(exc, asyncio.CancelledError):
                        answer.cancel()
                    self._close(stream, self._failure(exc))
                    if isinstance(exc, asyncio.CancelledError):
                        raise
            return await answer
        finally:
            timer.cancel()

    async def _until_served(self, stream: _Stream[Resp]) -> None:
        """Waits for the server's headers before the stream's first write. A server without
        the method answers the call's headers with UNIMPLEMENTED at once; a request being
        written when that status arrives makes grpc end the call as INTERNAL ("Internal
        error from Core") instead, and the caller would not learn to fall back to unary
        calls. The headers, or the call's end without them, settle it first (the reader
        then closes the stream naming the status)."""
        headers: Any = ()
        with contextlib.suppress(Exception):  # the call failed: the reader names why
            headers = await stream.call.initial_metadata()
        if not headers:
            # No handler answered (no such method, or the call failed before one ran): the
            # call's status follows; the reader closes the stream naming it.
            with contextlib.suppress(Exception):
                await stream.call.code()
            if stream.reader is not None:
                await asyncio.shield(stream.reader)
        stream.served = True

    def close(self) -> None:
        """Ends the stream; requests waiting on it fail with StreamClosedError."""
        self._closed = True
        if self._stream is not None:
            self._close(self._stream, StreamClosedError(
                f"{self.method} stream to {self.address} closed by the client"))

    async def _read(self, stream: _Stream[Resp]) -> None:
        error: FjordError
        try:
            while True:
                answer = await stream.call.read()
                if answer is aio.EOF:
                    error = StreamClosedError(
                        f"{self.method} stream to {self.address} ended by the server")
                    break
                if not stream.waiting:
                    error = StreamClosedError(
                        f"{self.method} stream to {self.address}: an answer to no request")
                    break
                waiter = stream.waiting.popleft()
                if not waiter.done():  # its caller may have been cancelled meanwhile
                    waiter.set_result(answer)
        except asyncio.CancelledError:
            error = StreamClosedError(f"{self.method} stream to {self.address} closed")
        except Exception as exc:
            error = self._failure(exc)
        self._close(stream, error)

    def _unsent(self, stream: _Stream[Resp]) -> FjordError:
        """The error of a request not written because ``stream`` closed first: unimplemented
        when the stream was (nothing was handled), else closed."""
        if isinstance(stream.error, StreamUnimplementedError):
            return StreamUnimplementedError(f"{self.address} does not serve {self.method}")
        return StreamClosedError(
            f"{self.method} stream to {self.address} closed before the request left: "
            f"{stream.error}")

    def _failure(self, exc: BaseException) -> FjordError:
        if isinstance(exc, FjordError):
            return exc
        if isinstance(exc, aio.AioRpcError):
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                return StreamUnimplementedError(
                    f"{self.address} does not serve {self.method}: {exc.details() or ''}")
            return StreamClosedError(
                f"{self.method} stream to {self.address}: {exc.code().name} "
                f"{exc.details() or ''}".strip())
        return StreamClosedError(f"{self.method} stream to {self.address}: {exc!r}")

    def _expire(self, stream: _Stream[Resp], answer: asyncio.Future[Resp]) -> None:
        if answer.done():
            return
        answer.set_exception(KafkaTimeoutError(
            f"request to {self.address} timed out ({self.method} stream closed)"))
        self._close(stream, StreamClosedError(
            f"{self.method} stream to {self.address} closed: an earlier request timed out"))

    def _close(self, stream: _Stream[Resp], error: FjordError) -> None:
        if stream.closed:
            return
        stream.closed = True
        stream.error = error
        if self._stream is stream:
            self._stream = None
        stream.call.cancel()
        if stream.reader is not None and stream.reader is not asyncio.current_task():
            stream.reader.cancel()
        while stream.waiting:
            waiter = stream.waiting.popleft()
            if not waiter.done():
                waiter.set_exception(error)
        log.debug("%s", error)
