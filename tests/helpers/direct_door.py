"""A direct door (fjord.direct_frames) served in a test: Produce and Fetch frames held until the
test answers them, over a real loopback socket (tests of fjord.direct_client, of the client's
Network and of the follower's link)."""

from __future__ import annotations

import asyncio
from typing import Any

from fjord._proto import broker_pb2
from fjord.direct_client import DirectConnection
from fjord.direct_frames import (
    ACCEPTED,
    HELLO_BYTES,
    HELLO_FETCH,
    KIND_PRODUCE,
    FrameReader,
    answer_prefix,
    hello_kind,
)

#: Bound of every wait on a door: a condition that does not hold by then is a failure.
BOUND_S = 10.0


class Door:
    """A direct door serving Produce and Fetch frames: each connection's hello is answered
    with ``hello_answer`` (None: held until :meth:`accept_held`), and every request is queued
    in ``requests`` as (connection number, ProduceRequest or FetchRequest by the hello's kind)
    until the test answers it."""

    def __init__(self, hello_answer: bytes | None = ACCEPTED) -> None:
        self.hello_answer = hello_answer
        #: The hello kinds (b"P" / b"F") of the connections, in order.
        self.kinds: list[bytes] = []
        self.requests: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.writers: list[asyncio.StreamWriter] = []
        self.closed: list[asyncio.Event] = []
        self.bytes_after_hello: list[int] = []
        self._hello_release = asyncio.Event()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Door:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self._hello_release.set()  # a held connection's handler goes on to see its end
        for writer in self.writers:
            writer.close()
        await self._server.wait_closed()
        await asyncio.wait_for(asyncio.gather(*(c.wait() for c in self.closed)), BOUND_S)

    def connection(self, hello: bytes = HELLO_FETCH, **kwargs: Any) -> DirectConnection[
        broker_pb2.FetchRequest, Any
    ]:
        return DirectConnection(
            "127.0.0.1", self.port, hello, broker_pb2.FetchResponse.FromString,
            name=f"Fetch door of 127.0.0.1:{self.port}", **kwargs,
        )

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = len(self.writers)
        self.writers.append(writer)
        closed = asyncio.Event()
        self.closed.append(closed)
        self.bytes_after_hello.append(0)
        try:
            kind = hello_kind(await reader.readexactly(HELLO_BYTES))
            self.kinds.append(kind)
            request_type = broker_pb2.ProduceRequest if kind == KIND_PRODUCE else (
                broker_pb2.FetchRequest)
            if self.hello_answer is None:
                await self._hello_release.wait()
                writer.write(ACCEPTED)
            else:
                writer.write(self.hello_answer)
            frames = FrameReader()
            while data := await reader.read(65536):
                self.bytes_after_hello[number] += len(data)
                for frame in frames.feed(data):
                    self.requests.put_nowait((number, request_type.FromString(frame)))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            closed.set()
            writer.close()

    def accept_held(self) -> None:
        self._hello_release.set()

    async def next_request(self) -> tuple[int, Any]:
        return await asyncio.wait_for(self.requests.get(), BOUND_S)

    def answer(self, connection: int, response: Any) -> None:
        payload = response.SerializeToString()
        self.writers[connection].writelines([answer_prefix(len(payload)), payload])

    def answer_raw(self, connection: int, data: bytes) -> None:
        self.writers[connection].write(data)
