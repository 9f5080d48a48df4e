"""fjord.rpc_streams: the server's :func:`answer_in_order` over plain async iterators, and the
client's :class:`OrderedStream` against a real in-process grpc.aio server (bytes in, bytes out).

Handlers and the server hold their answers on asyncio events the test releases, so the order
in which requests finish is chosen by the test, not by timers; the only timers are the
request timeouts under test, and every wait is bounded (``BOUND_S``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import pytest
from grpc import aio
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.errors import KafkaTimeoutError
from fjord.rpc_streams import (
    OrderedStream,
    StreamClosedError,
    StreamUnimplementedError,
    answer_in_order,
    send_stream_headers,
)
from tests.helpers.loops import run_watched

T = TypeVar("T")

#: Bound of every wait in this module: a condition that does not hold by then is a failure.
BOUND_S = 10.0


def run(scenario: Coroutine[Any, Any, T]) -> T:
    """``scenario`` bounded by ``BOUND_S``, failed on an error the loop reported."""
    return run_watched(scenario, BOUND_S)


async def bounded(awaitable: Awaitable[T]) -> T:
    return await asyncio.wait_for(awaitable, BOUND_S)


# --- answer_in_order ------------------------------------------------------------------------


class Feed:
    """An async iterator of requests the test pushes one by one (``end()`` finishes it,
    ``fail(exc)`` breaks it as a caller's broken stream would)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def push(self, *requests: int) -> None:
        for request in requests:
            self._queue.put_nowait(("request", request))

    def end(self) -> None:
        self._queue.put_nowait(("end", None))

    def fail(self, exc: BaseException) -> None:
        self._queue.put_nowait(("fail", exc))

    def __aiter__(self) -> Feed:
        return self

    async def __anext__(self) -> int:
        kind, value = await self._queue.get()
        if kind == "end":
            raise StopAsyncIteration
        if kind == "fail":
            raise value
        return int(value)


@dataclass
class Handlers:
    """``handle(i)`` waits until the test releases request ``i`` (``release(i)``, or
    ``release(i, error)`` to make it raise), after ``turns[i]`` extra loop turns answers
    ``i * 10``. Records start order, the answers the consumer took, the most handlers
    unanswered at once, and which handlers were cancelled."""

    turns: dict[int, int] = field(default_factory=dict)
    started: list[int] = field(default_factory=list)
    consumed: list[int] = field(default_factory=list)
    cancelled: set[int] = field(default_factory=set)
    most_unanswered: int = 0
    _release: dict[int, asyncio.Future[BaseException | None]] = field(default_factory=dict)
    _finished: dict[int, asyncio.Event] = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def _gate(self, request: int) -> asyncio.Future[BaseException | None]:
        if request not in self._release:
            self._release[request] = asyncio.get_running_loop().create_future()
        return self._release[request]

    def finished(self, request: int) -> asyncio.Event:
        return self._finished.setdefault(request, asyncio.Event())

    async def handle(self, request: int) -> int:
        self.started.append(request)
        self.most_unanswered = max(
            self.most_unanswered, len(self.started) - len(self.consumed)
        )
        self._changed.set()
        try:
            error = await self._gate(request)
            for _ in range(self.turns.get(request, 0)):
                await asyncio.sleep(0)  # a loop turn, not a delay: lets others overtake
            if error is not None:
                raise error
            return request * 10
        except asyncio.CancelledError:
            self.cancelled.add(request)
            raise
        finally:
            self.finished(request).set()

    def release(self, request: int, error: BaseException | None = None) -> None:
        self._gate(request).set_result(error)

    async def until_started(self, count: int) -> None:
        while len(self.started) < count:
            self._changed.clear()
            await bounded(self._changed.wait())

    async def changed(self) -> None:
        self._changed.clear()
        await bounded(self._changed.wait())


async def consume(answers: AsyncIterator[int], handlers: Handlers) -> list[int]:
    async for answer in answers:
        handlers.consumed.append(answer)
    return handlers.consumed


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 12).flatmap(
        lambda n: st.tuples(
            st.permutations(range(n)),
            st.lists(st.integers(0, 3), min_size=n, max_size=n),
            st.integers(1, 5),
            st.booleans(),
        )
    )
)
def test_answers_come_in_request_order_whatever_order_handlers_finish(
    case: tuple[list[int], list[int], int, bool],
) -> None:
    """Handlers are released in a random order (each may take extra loop turns after its
    release): the answers still come in request order, handlers start in arrival order, and
    never more than ``in_flight`` are unanswered. Requests arrive all at once or one by one
    (each pushed when the previous one's handler started)."""
    finish_order, turns, in_flight, all_at_once = case
    count = len(finish_order)

    async def scenario() -> None:
        handlers = Handlers(turns=dict(enumerate(turns)))
        feed = Feed()
        consumer = asyncio.ensure_future(
            consume(answer_in_order(feed, handlers.handle, in_flight), handlers)
        )
        if all_at_once:
            feed.push(*range(count))
        else:
            for request in range(min(count, in_flight)):
                feed.push(request)
                await handlers.until_started(request + 1)  # started on arrival
            feed.push(*range(min(count, in_flight), count))
        feed.end()
        waiting = list(finish_order)
        while waiting:
            # Release the first request of the chosen order whose handler runs; if none
            # runs yet, wait until one starts (one always will: the oldest unanswered).
            ready = next((r for r in waiting if r in handlers.started), None)
            if ready is None:
                await handlers.changed()
                continue
            waiting.remove(ready)
            handlers.release(ready)
        assert await bounded(consumer) == [r * 10 for r in range(count)]
        assert handlers.started == list(range(count))
        assert handlers.most_unanswered <= in_flight
        assert not handlers.cancelled

    run(scenario())


def test_in_flight_one_serves_one_request_after_the_other() -> None:
    async def scenario() -> None:
        handlers = Handlers()
        feed = Feed()
        feed.push(0, 1, 2)
        feed.end()
        consumer = asyncio.ensure_future(
            consume(answer_in_order(feed, handlers.handle, 1), handlers)
        )
        for request in range(3):
            await handlers.until_started(request + 1)
            # The next request was read but its handler waits for this answer.
            for _ in range(5):
                await asyncio.sleep(0)
            assert handlers.started == list(range(request + 1))
            handlers.release(request)
        assert await bounded(consumer) == [0, 10, 20]
        assert handlers.most_unanswered == 1

    run(scenario())


def test_in_flight_bounds_the_handlers_started_ahead_of_the_oldest_answer() -> None:
    async def scenario() -> None:
        handlers = Handlers()
        feed = Feed()
        feed.push(*range(6))
        consumer = asyncio.ensure_future(
            consume(answer_in_order(feed, handlers.handle, 3), handlers)
        )
        await handlers.until_started(3)
        handlers.release(1)
        handlers.release(2)
        await handlers.finished(2).wait()
        for _ in range(5):
            await asyncio.sleep(0)
        # 1 and 2 are done but unanswered behind 0: no room for a fourth handler.
        assert handlers.started == [0, 1, 2]
        handlers.release(0)
        await handlers.until_started(6)
        assert handlers.consumed == [0, 10, 20]
        for request in range(3, 6):
            handlers.release(request)
        feed.end()
        assert await bounded(consumer) == [0, 10, 20, 30, 40, 50]

    run(scenario())


def test_a_handler_error_ends_the_stream_after_the_answers_before_it() -> None:
    """Request 1 fails while 2 and 3 run: the consumer gets answer 0, then the error; the
    handlers after the failed one are cancelled; the requests iterator is no longer read."""

    async def scenario() -> None:
        handlers = Handlers()
        feed = Feed()
        feed.push(0, 1, 2, 3)
        answers = answer_in_order(feed, handlers.handle, 8)
        consumer = asyncio.ensure_future(consume(answers, handlers))
        await handlers.until_started(4)
        handlers.release(1, ValueError("handler 1 broke"))
        handlers.release(0)
        with pytest.raises(ValueError, match="handler 1 broke"):
            await bounded(consumer)
        assert handlers.consumed == [0]
        await bounded(asyncio.gather(*(handlers.finished(r).wait() for r in (2, 3))))
        assert handlers.cancelled == {2, 3}
        feed.push(4)
        for _ in range(5):
            await asyncio.sleep(0)
        assert 4 not in handlers.started

    run(scenario())


def test_a_broken_request_stream_ends_the_answers_with_its_error() -> None:
    """The caller's stream breaks after two requests: both are answered, then the error."""

    async def scenario() -> None:
        handlers = Handlers()
        feed = Feed()
        feed.push(0, 1)
        feed.fail(ConnectionResetError("the caller's stream broke"))
        consumer = asyncio.ensure_future(
            consume(answer_in_order(feed, handlers.handle, 4), handlers)
        )
        await handlers.until_started(2)
        handlers.release(1)
        handlers.release(0)
        with pytest.raises(ConnectionResetError):
            await bounded(consumer)
        assert handlers.consumed == [0, 10]

    run(scenario())


def test_cancelling_the_consumer_cancels_every_running_handler() -> None:
    async def scenario() -> None:
        handlers = Handlers()
        feed = Feed()
        feed.push(0, 1, 2)
        consumer = asyncio.ensure_future(
            consume(answer_in_order(feed, handlers.handle, 4), handlers)
        )
        await handlers.until_started(3)
        handlers.release(2)  # finished but unanswered behind 0 and 1
        await handlers.finished(2).wait()
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        await bounded(asyncio.gather(*(handlers.finished(r).wait() for r in (0, 1))))
        assert handlers.cancelled == {0, 1}
        assert handlers.consumed == []

    run(scenario())


def test_closing_the_answers_early_cancels_the_handlers_after_them() -> None:
    async def scenario() -> None:
        handlers = Handlers()
        feed = Feed()
        feed.push(0, 1, 2)
        answers = answer_in_order(feed, handlers.handle, 4)
        first = asyncio.ensure_future(answers.__anext__())
        await handlers.until_started(3)
        handlers.release(0)
        assert await bounded(first) == 0
        await answers.aclose()  # type: ignore[attr-defined]
        await bounded(asyncio.gather(*(handlers.finished(r).wait() for r in (1, 2))))
        assert handlers.cancelled == {1, 2}

    run(scenario())


def test_two_failed_handlers_end_the_stream_with_the_first_error() -> None:
    """Requests 1 and 2 both fail before 0 is answered: the stream ends with 1's error, and
    2's error is not left unretrieved on the loop."""

    async def scenario() -> None:
        handlers = Handlers()
        feed = Feed()
        feed.push(0, 1, 2)
        consumer = asyncio.ensure_future(
            consume(answer_in_order(feed, handlers.handle, 4), handlers)
        )
        await handlers.until_started(3)
        handlers.release(2, KeyError("handler 2 broke"))
        handlers.release(1, ValueError("handler 1 broke"))
        await bounded(asyncio.gather(*(handlers.finished(r).wait() for r in (1, 2))))
        handlers.release(0)
        with pytest.raises(ValueError, match="handler 1 broke"):
            await bounded(consumer)
        assert handlers.consumed == [0]

    run(scenario())


@pytest.mark.parametrize("in_flight", [0, -1])
def test_in_flight_below_one_is_refused(in_flight: int) -> None:
    async def scenario() -> None:
        handlers = Handlers()
        answers = answer_in_order(Feed(), handlers.handle, in_flight)
        with pytest.raises(ValueError, match="in_flight must be at least 1"):
            await answers.__anext__()

    run(scenario())


# --- OrderedStream against a real grpc.aio server --------------------------------------------

SERVICE = "test.Ordered"


class _EndStream(Exception):
    """Raised by the test server's handler to end its stream with OK."""


class OrderedServer:
    """A real grpc.aio server on a free loopback port whose ``/test.Ordered/Echo`` stream
    reads requests as they arrive (``seen``) and answers them in order through
    :func:`answer_in_order`: ``echo:x`` -> ``x``; ``hold:x`` -> ``x`` once the test calls
    ``release("x")``; ``end`` ends the stream (OK, no answer to it or after it); ``abort``
    aborts it with INTERNAL. ``/test.Ordered/Missing`` is not served. A stream sends its
    headers at once (OrderedStream writes once it has them), unless ``hold_headers`` is set:
    then once the test calls ``release("headers")``."""

    def __init__(self) -> None:
        self.server = aio.server()
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            SERVICE, {"Echo": grpc.stream_stream_rpc_method_handler(self._echo)}
        ),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.seen: list[bytes] = []
        self.hold_headers = False
        self.streams_opened = 0
        #: Set when a stream's handler ended, by stream number (1 = the first opened).
        self.stream_ended: dict[int, asyncio.Event] = {}
        self._held: dict[str, asyncio.Event] = {}
        self._seen_changed = asyncio.Event()

    def held(self, key: str) -> asyncio.Event:
        return self._held.setdefault(key, asyncio.Event())

    def release(self, key: str) -> None:
        self.held(key).set()

    async def until_seen(self, request: bytes) -> None:
        while request not in self.seen:
            self._seen_changed.clear()
            await bounded(self._seen_changed.wait())

    async def until_streams_opened(self, count: int) -> None:
        while self.streams_opened < count:
            self._seen_changed.clear()
            await bounded(self._seen_changed.wait())

    async def _echo(
        self, requests: AsyncIterator[bytes], context: aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        self.streams_opened += 1
        self._seen_changed.set()
        ended = self.stream_ended.setdefault(self.streams_opened, asyncio.Event())
        if self.hold_headers:
            await self.held("headers").wait()
        await send_stream_headers(context)

        async def handle(request: bytes) -> bytes:
            self.seen.append(request)
            self._seen_changed.set()
            kind, _, value = request.decode().partition(":")
            if kind == "hold":
                await self.held(value).wait()
            elif kind == "end":
                raise _EndStream
            elif kind == "abort":
                await context.abort(grpc.StatusCode.INTERNAL, "aborted by the test")
            return value.encode()

        try:
            async for answer in answer_in_order(requests, handle, 64):
                yield answer
        except _EndStream:
            return
        finally:
            ended.set()


@contextlib.asynccontextmanager
async def ordered_server() -> AsyncIterator[tuple[OrderedServer, aio.Channel]]:
    served = OrderedServer()
    await served.server.start()
    channel = aio.insecure_channel(f"127.0.0.1:{served.port}")
    try:
        yield served, channel
    finally:
        await channel.close()
        await served.server.stop(None)


def ordered_stream(channel: aio.Channel, method: str = "Echo") -> OrderedStream[bytes, bytes]:
    """An OrderedStream of bytes on ``/test.Ordered/<method>`` (no serializers: bytes pass)."""
    open_call: Callable[[], Any] = lambda: channel.stream_stream(f"/{SERVICE}/{method}")()  # noqa: E731
    return OrderedStream(open_call, "test-server", method)


def test_concurrent_calls_get_their_own_answers_in_call_order() -> None:
    async def scenario() -> None:
        async with ordered_server() as (server, channel):
            stream = ordered_stream(channel)
            # The first answer waits on the server: every later request queues behind it.
            first = asyncio.ensure_future(stream.call(b"hold:first", BOUND_S))
            rest = [asyncio.ensure_future(stream.call(b"echo:%d" % i, BOUND_S)) for i in range(40)]
            await server.until_seen(b"hold:first")
            server.release("first")
            assert await bounded(first) == b"first"
            assert await bounded(asyncio.gather(*rest)) == [b"%d" % i for i in range(40)]
            assert server.seen == [b"hold:first"] + [b"echo:%d" % i for i in range(40)]
            assert server.streams_opened == 1

    run(scenario())


def test_a_timeout_fails_that_request_and_the_others_waiting_then_a_fresh_stream_serves() -> None:
    async def scenario() -> None:
        async with ordered_server() as (server, channel):
            stream = ordered_stream(channel)
            assert await stream.call(b"echo:warm", BOUND_S) == b"warm"
            late = asyncio.ensure_future(stream.call(b"hold:late", 0.2))
            behind = asyncio.ensure_future(stream.call(b"echo:behind", BOUND_S))
            await server.until_seen(b"echo:behind")  # both written, both waiting
            with pytest.raises(KafkaTimeoutError, match="timed out"):
                await bounded(late)
            with pytest.raises(StreamClosedError, match="earlier request timed out") as closed:
                await bounded(behind)
            assert closed.value.retriable
            await bounded(server.stream_ended[1].wait())  # the server saw the stream go
            assert await stream.call(b"echo:again", BOUND_S) == b"again"
            assert server.streams_opened == 2

    run(scenario())


def test_requests_wait_for_the_servers_headers_and_time_out_unwritten() -> None:
    """A fresh stream's requests are written once the server's headers came (its sign that
    it serves the method); one whose timeout passes first fails with KafkaTimeoutError, the
    one queued behind it with StreamClosedError, and nothing reached the server's handler."""

    async def scenario() -> None:
        async with ordered_server() as (server, channel):
            server.hold_headers = True
            stream = ordered_stream(channel)
            first = asyncio.ensure_future(stream.call(b"echo:first", 0.2))
            queued = asyncio.ensure_future(stream.call(b"echo:queued", BOUND_S))
            with pytest.raises(KafkaTimeoutError):
                await bounded(first)
            with pytest.raises(StreamClosedError, match="closed before the request left"):
                await bounded(queued)
            assert server.seen == []
            server.hold_headers = False
            server.release("headers")  # (grpc does not cancel a handler that reads nothing)
            assert await stream.call(b"echo:again", BOUND_S) == b"again"
            assert server.streams_opened == 2

    run(scenario())


@pytest.mark.parametrize("ending", [b"end", b"abort"])
def test_a_stream_the_server_ends_fails_its_waiting_requests(ending: bytes) -> None:
    """The server ends the stream (OK) or aborts it: the request waiting gets
    StreamClosedError saying so, as do requests written behind it (their message may only
    say INTERNAL: a write racing with the server's status makes grpc end the call so), and
    the next call opens a fresh stream."""

    async def scenario() -> None:
        async with ordered_server() as (server, channel):
            stream = ordered_stream(channel)
            assert await stream.call(b"echo:warm", BOUND_S) == b"warm"
            expected = "ended by the server" if ending == b"end" else "INTERNAL aborted by the test"
            with pytest.raises(StreamClosedError, match=expected) as closed:
                await bounded(stream.call(ending, BOUND_S))
            assert closed.value.retriable
            assert await stream.call(b"echo:again", BOUND_S) == b"again"
            ended = asyncio.ensure_future(stream.call(ending, BOUND_S))
            behind = asyncio.ensure_future(stream.call(b"echo:behind", BOUND_S))
            for waiting in (ended, behind):
                with pytest.raises(StreamClosedError):
                    await bounded(waiting)
            assert await stream.call(b"echo:last", BOUND_S) == b"last"
            assert server.streams_opened == 3

    run(scenario())


def test_unimplemented_fails_every_request_of_the_stream_as_unimplemented() -> None:
    """A server without the method: each of several concurrent requests (a producer's
    in-flight batches) gets StreamUnimplementedError, the signal to fall back to unary calls
    (a request written after the server's status arrived must not turn it into INTERNAL)."""

    async def scenario() -> None:
        async with ordered_server() as (server, channel):
            for _ in range(10):
                stream = ordered_stream(channel, "Missing")
                answers = await bounded(asyncio.gather(
                    *(stream.call(b"echo:%d" % i, BOUND_S) for i in range(8)),
                    return_exceptions=True,
                ))
                assert all(isinstance(a, StreamUnimplementedError) for a in answers), answers
                assert not answers[0].retriable
            assert server.streams_opened == 0

    run(scenario())


def test_close_fails_the_waiting_and_every_later_call() -> None:
    async def scenario() -> None:
        async with ordered_server() as (server, channel):
            stream = ordered_stream(channel)
            assert await stream.call(b"echo:warm", BOUND_S) == b"warm"
            waiting = asyncio.ensure_future(stream.call(b"hold:never", BOUND_S))
            await server.until_seen(b"hold:never")
            stream.close()
            with pytest.raises(StreamClosedError, match="closed by the client"):
                await bounded(waiting)
            with pytest.raises(StreamClosedError, match="is closed"):
                await stream.call(b"echo:after", BOUND_S)
            await bounded(server.stream_ended[1].wait())
            assert server.streams_opened == 1

    run(scenario())


def test_a_cancelled_caller_does_not_shift_the_later_answers() -> None:
    """A caller cancelled before its request was written (waiting for the server's headers)
    and one cancelled while its answer is pending: every other caller gets its own answer,
    on the same stream."""

    async def scenario() -> None:
        async with ordered_server() as (server, channel):
            server.hold_headers = True
            stream = ordered_stream(channel)
            unwritten = asyncio.ensure_future(stream.call(b"echo:unwritten", BOUND_S))
            first = asyncio.ensure_future(stream.call(b"echo:first", BOUND_S))
            await server.until_streams_opened(1)
            unwritten.cancel()
            with pytest.raises(asyncio.CancelledError):
                await unwritten
            server.release("headers")
            assert await bounded(first) == b"first"
            gone = asyncio.ensure_future(stream.call(b"hold:gone", BOUND_S))
            behind = asyncio.ensure_future(stream.call(b"echo:behind", BOUND_S))
            await server.until_seen(b"echo:behind")
            gone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gone
            server.release("gone")
            assert await bounded(behind) == b"behind"
            assert await stream.call(b"echo:next", BOUND_S) == b"next"
            assert server.seen == [b"echo:first", b"hold:gone", b"echo:behind", b"echo:next"]
            assert server.streams_opened == 1

    run(scenario())


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.booleans(), min_size=1, max_size=6),
    st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=8),
    st.randoms(use_true_random=False),
)
def test_answers_stay_matched_whatever_callers_are_cancelled(
    unwritten_cancels: list[bool], pending: list[tuple[bool, bool]], rng: Any
) -> None:
    """Callers cancelled before their request was written (the stream waits for the
    server's headers) and callers cancelled while their answers wait on the server, in any
    mix, with the held answers released in any order: every other caller gets its own
    answer, on one stream, and the server saw exactly the requests that were written."""

    async def scenario() -> None:
        async with ordered_server() as (server, channel):
            server.hold_headers = True
            stream = ordered_stream(channel)
            early = [
                asyncio.ensure_future(stream.call(b"echo:early%d" % i, BOUND_S))
                for i in range(len(unwritten_cancels))
            ]
            await server.until_streams_opened(1)
            for task, cancel in zip(early, unwritten_cancels, strict=True):
                if cancel:
                    task.cancel()
            server.release("headers")
            # Pending: behind a held "gate" answer, each held itself or echoed on the server;
            # some callers then cancelled.
            gate = asyncio.ensure_future(stream.call(b"hold:gate", BOUND_S))
            late = [
                asyncio.ensure_future(stream.call(
                    (b"hold:late%d" if held else b"echo:late%d") % i, BOUND_S
                ))
                for i, (held, _) in enumerate(pending)
            ]
            await server.until_seen(b"%s:late%d" % (
                b"hold" if pending[-1][0] else b"echo", len(pending) - 1
            ))
            # The server has the last request, but the client may still be in its write:
            # the writers hold the stream's lock in turn, so taking it waits for them all.
            # (A caller cancelled during its write ends the stream: grpc cancels the call.)
            open_stream = stream._stream
            assert open_stream is not None
            async with open_stream.writing:
                pass
            for task, (_, cancel) in zip(late, pending, strict=True):
                if cancel:
                    task.cancel()
            held = ["gate"] + [f"late{i}" for i, (h, _) in enumerate(pending) if h]
            rng.shuffle(held)
            for key in held:
                server.release(key)
                await asyncio.sleep(0)
            assert await bounded(gate) == b"gate"
            results = await bounded(asyncio.gather(*early, *late, return_exceptions=True))
            cancels = unwritten_cancels + [cancel for _, cancel in pending]
            names = [b"early%d" % i for i in range(len(early))]
            names += [b"late%d" % i for i in range(len(late))]
            for name, cancelled, result in zip(names, cancels, results, strict=True):
                if cancelled:
                    assert isinstance(result, asyncio.CancelledError), (name, result)
                else:
                    assert result == name
            written = [
                b"echo:" + name for name, c in zip(names, unwritten_cancels, strict=False)
                if not c
            ] + [b"hold:gate"] + [
                (b"hold:" if h else b"echo:") + b"late%d" % i for i, (h, _) in enumerate(pending)
            ]
            assert server.seen == written
            assert server.streams_opened == 1

    run(scenario())
