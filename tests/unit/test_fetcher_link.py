"""The follower's link to a leader (fjord.broker.fetcher.LeaderLink) against real in-process
gRPC servers: Fetch requests go on one FetchStream, answered in order; a leader without
FetchStream (an older broker) gets unary Fetch calls; a stream that breaks fails the waiting
fetch with an error the fetcher treats as a failed call (FETCH_FAILURES). With the leader's
direct door (a loopback door from fjord.direct_frames) the fetches go there instead, and a door
that refuses sends them back to gRPC. And the server side
of a stream: once the broker stops (``closing``), open streams end after answering what they
started, so the server's grace period does not wait for streams the followers keep open."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from fjord._proto import broker_pb2
from fjord.broker.fetcher import (
    FETCH_FAILURES,
    REPLICA_FETCH_STREAMS_ENV,
    LeaderLink,
    SourceFetcher,
)
from fjord.broker.replica_manager import ReplicaManager
from fjord.direct_client import DIRECT_DOOR_ENV
from fjord.direct_frames import ACCEPTED, REFUSED
from fjord.rpc_streams import (
    OpenStreams,
    StreamClosedError,
    answer_in_order,
    send_stream_headers,
)
from fjord.storage import LogManager
from tests.helpers.direct_door import Door
from tests.helpers.replica_manager import BROKER, run

SERVICE = "fjord.v1.Broker"
TIMEOUT_S = 5.0


class Leader:
    """A Broker service with Fetch and (unless ``streams`` is False, as on a broker that
    predates it) FetchStream; every answer echoes its request's session epoch, so order shows."""

    def __init__(self, streams: bool = True) -> None:
        self.unary_calls = 0
        self.streams_opened = 0
        self.streamed_requests = 0
        self.open_streams = OpenStreams()
        #: While set to a not-yet-set event, each Fetch waits for it (a parked fetch).
        self.hold: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.server = aio.server()
        methods: dict[str, grpc.RpcMethodHandler] = {
            "Fetch": grpc.unary_unary_rpc_method_handler(
                self._fetch_call,
                request_deserializer=broker_pb2.FetchRequest.FromString,
                response_serializer=broker_pb2.FetchResponse.SerializeToString,
            )
        }
        if streams:
            methods["FetchStream"] = grpc.stream_stream_rpc_method_handler(
                self._fetch_stream,
                request_deserializer=broker_pb2.FetchRequest.FromString,
                response_serializer=broker_pb2.FetchResponse.SerializeToString,
            )
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, methods),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"

    async def _answer(self, request: broker_pb2.FetchRequest) -> broker_pb2.FetchResponse:
        self.started.set()
        if self.hold is not None:
            await self.hold.wait()
        return broker_pb2.FetchResponse(session_id=request.session_epoch)

    async def _fetch_call(self, request: broker_pb2.FetchRequest, _context: Any) -> Any:
        self.unary_calls += 1
        return await self._answer(request)

    async def _fetch_stream(
        self, requests: AsyncIterator[broker_pb2.FetchRequest], context: Any
    ) -> AsyncIterator[broker_pb2.FetchResponse]:
        self.streams_opened += 1
        await send_stream_headers(context)  # as the broker's: the link writes after them

        async def counted(request: broker_pb2.FetchRequest) -> broker_pb2.FetchResponse:
            self.streamed_requests += 1
            return await self._answer(request)

        with self.open_streams.serving():
            async for answer in answer_in_order(requests, counted, 1):
                yield answer


def fetch_request(epoch: int) -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(replica_id=1, session_epoch=epoch)


def with_leader(
    body: Callable[[Leader, LeaderLink], Awaitable[None]], streams: bool = True
) -> None:
    async def scenario() -> None:
        leader = Leader(streams)
        await leader.server.start()
        link = LeaderLink(leader.address)
        try:
            await body(leader, link)
        finally:
            await link.close()
            await leader.server.stop(0)

    run(scenario())


def test_fetches_go_on_one_fetch_stream_answered_in_order() -> None:
    async def body(leader: Leader, link: LeaderLink) -> None:
        answers = [(await link.fetch(fetch_request(e), TIMEOUT_S)).session_id for e in (1, 2, 3)]
        assert answers == [1, 2, 3]
        assert (leader.streams_opened, leader.streamed_requests, leader.unary_calls) == (1, 3, 0)
        assert link.streaming

    with_leader(body)


def test_a_leader_without_fetch_stream_gets_unary_fetches() -> None:
    async def body(leader: Leader, link: LeaderLink) -> None:
        # The refused stream handled nothing: the same request goes as a unary call.
        assert (await link.fetch(fetch_request(7), TIMEOUT_S)).session_id == 7
        assert not link.streaming
        assert (await link.fetch(fetch_request(8), TIMEOUT_S)).session_id == 8
        assert leader.unary_calls == 2

    with_leader(body, streams=False)


def test_fetch_streams_turned_off_send_unary_fetches(monkeypatch: pytest.MonkeyPatch) -> None:
    """FJORD_REPLICA_FETCH_STREAMS=0: unary Fetch calls to a leader that serves the stream."""
    monkeypatch.setenv(REPLICA_FETCH_STREAMS_ENV, "0")

    async def body(leader: Leader, link: LeaderLink) -> None:
        assert not link.streaming
        assert (await link.fetch(fetch_request(1), TIMEOUT_S)).session_id == 1
        assert (leader.unary_calls, leader.streams_opened) == (1, 0)

    with_leader(body)


def test_a_stream_the_leader_ends_fails_the_waiting_fetch_as_a_failed_call() -> None:
    async def body(leader: Leader, link: LeaderLink) -> None:
        assert (await link.fetch(fetch_request(1), TIMEOUT_S)).session_id == 1
        leader.hold = asyncio.Event()
        leader.started.clear()
        waiting = asyncio.ensure_future(link.fetch(fetch_request(2), TIMEOUT_S))
        await asyncio.wait_for(leader.started.wait(), TIMEOUT_S)
        await leader.server.stop(0)  # the leader goes away with the fetch parked
        with pytest.raises(FETCH_FAILURES) as failed:
            await asyncio.wait_for(waiting, TIMEOUT_S)
        assert isinstance(failed.value, StreamClosedError)

    with_leader(body)


def test_a_fetch_timeout_fails_as_a_failed_call() -> None:
    async def body(leader: Leader, link: LeaderLink) -> None:
        leader.hold = asyncio.Event()  # never set: the answer never comes
        with pytest.raises(FETCH_FAILURES):
            await link.fetch(fetch_request(1), 0.2)

    with_leader(body)


def test_a_stopping_leader_ends_the_stream_under_a_parked_fetch() -> None:
    async def body(leader: Leader, link: LeaderLink) -> None:
        assert (await link.fetch(fetch_request(1), TIMEOUT_S)).session_id == 1
        leader.hold = asyncio.Event()  # never set: the fetch stays parked
        leader.started.clear()
        parked = asyncio.ensure_future(link.fetch(fetch_request(2), TIMEOUT_S))
        await asyncio.wait_for(leader.started.wait(), TIMEOUT_S)
        assert leader.open_streams.end_all() == 1  # the broker stops
        with pytest.raises(FETCH_FAILURES) as failed:  # at once, not after TIMEOUT_S
            await asyncio.wait_for(parked, TIMEOUT_S / 2)
        assert isinstance(failed.value, StreamClosedError)
        # A stream opened after that ends at once, and the grace waits for nothing.
        with pytest.raises(StreamClosedError):
            await asyncio.wait_for(link.fetch(fetch_request(3), TIMEOUT_S), TIMEOUT_S / 2)
        began = time.perf_counter()
        await leader.server.stop(TIMEOUT_S)
        assert time.perf_counter() - began < TIMEOUT_S / 2
        assert (leader.streamed_requests, leader.unary_calls) == (2, 0)

    with_leader(body)


# --- through the leader's direct door -------------------------------------------------------


def with_leader_and_door(
    body: Callable[[Leader, Door, LeaderLink, list[str]], Awaitable[None]],
    hello_answer: bytes | None = ACCEPTED,
) -> None:
    """``body`` with a gRPC leader, a direct door beside it and a link to both; the list
    collects the doors the link reported unavailable."""

    async def scenario() -> None:
        leader = Leader()
        await leader.server.start()
        unavailable: list[str] = []
        async with Door(hello_answer) as door:
            link = LeaderLink(leader.address, f"127.0.0.1:{door.port}", unavailable.append)
            try:
                await body(leader, door, link, unavailable)
            finally:
                await link.close()
                await leader.server.stop(0)

    run(scenario())


def test_fetches_go_through_the_leaders_door_when_it_has_one() -> None:
    async def body(leader: Leader, door: Door, link: LeaderLink, unavailable: list[str]) -> None:
        for epoch in (1, 2):
            waiting = asyncio.ensure_future(link.fetch(fetch_request(epoch), TIMEOUT_S))
            number, seen = await door.next_request()
            assert (number, seen.session_epoch, seen.replica_id) == (0, epoch, 1)
            door.answer(0, broker_pb2.FetchResponse(session_id=epoch))
            assert (await asyncio.wait_for(waiting, TIMEOUT_S)).session_id == epoch
        assert (leader.streams_opened, leader.unary_calls, unavailable) == (0, 0, [])
        assert link.door == f"127.0.0.1:{door.port}"

    with_leader_and_door(body)


def test_a_refusing_door_sends_the_fetch_on_grpc_and_is_reported() -> None:
    async def body(leader: Leader, door: Door, link: LeaderLink, unavailable: list[str]) -> None:
        assert (await link.fetch(fetch_request(4), TIMEOUT_S)).session_id == 4
        assert unavailable == [f"127.0.0.1:{door.port}"]
        assert link.door is None
        assert (await link.fetch(fetch_request(5), TIMEOUT_S)).session_id == 5
        assert (leader.streams_opened, leader.streamed_requests) == (1, 2)
        assert door.bytes_after_hello == [0]  # nothing was sent to the door

    with_leader_and_door(body, hello_answer=REFUSED)


def test_a_door_the_leader_closes_fails_the_fetch_as_a_failed_call() -> None:
    async def body(leader: Leader, door: Door, link: LeaderLink, unavailable: list[str]) -> None:
        waiting = asyncio.ensure_future(link.fetch(fetch_request(1), TIMEOUT_S))
        await door.next_request()
        door.writers[0].close()  # the leader stops with the fetch parked
        with pytest.raises(FETCH_FAILURES) as failed:
            await asyncio.wait_for(waiting, TIMEOUT_S)
        assert isinstance(failed.value, StreamClosedError)
        assert unavailable == []  # a broken connection is a failed fetch, not a missing door

    with_leader_and_door(body)


def test_the_fetcher_skips_an_unavailable_door_until_the_leader_registers_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SourceFetcher's link to a leader whose door refuses: the fetch goes on gRPC, and the
    fetcher keeps that gRPC link until the leader's registration (the generation) changes."""
    monkeypatch.delenv(DIRECT_DOOR_ENV, raising=False)
    logs = LogManager(tmp_path / "data")
    registration: list[object] = ["first"]

    async def scenario() -> None:
        leader = Leader()
        await leader.server.start()
        async with Door(REFUSED) as door:
            address = f"127.0.0.1:{door.port}"
            fetcher = SourceFetcher(
                0, ReplicaManager(BROKER, logs), lambda _id: leader.address, lambda: 1,
                lambda _id: (address, registration[0]),
            )
            try:
                link = await fetcher._leader_link()
                assert link is not None and link.door == address
                assert (await link.fetch(fetch_request(1), TIMEOUT_S)).session_id == 1
                assert link.door is None and leader.streamed_requests == 1  # on gRPC
                assert await fetcher._leader_link() is link  # the door is skipped
                registration[0] = "restarted"
                relinked = await fetcher._leader_link()
                assert relinked is not link and relinked is not None
                assert relinked.door == address  # tried again
            finally:
                await fetcher.close_channel()
                await leader.server.stop(0)

    try:
        run(scenario())
    finally:
        logs.close()


def test_doors_turned_off_keep_the_fetcher_on_grpc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DIRECT_DOOR_ENV, "0")
    logs = LogManager(tmp_path / "data")

    async def scenario() -> None:
        fetcher = SourceFetcher(0, ReplicaManager(BROKER, logs), lambda _id: "127.0.0.1:2",
                                lambda: 1, lambda _id: ("127.0.0.1:1", "registration"))
        link = await fetcher._leader_link()
        assert link is not None and link.door is None
        await fetcher.close_channel()

    try:
        run(scenario())
    finally:
        logs.close()
