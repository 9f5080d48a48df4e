"""The Kafka listener's asyncio-streams shell: sockets in, frames to the dispatcher, frames out.

Per connection, Kafka's way: requests are read and answered one at a time, in order (a Kafka
broker mutes a connection while one of its requests is in progress), so responses always go
out in request order. A frame whose size prefix is negative or above
``socket.request.max.bytes`` closes the connection before anything is read; a connection that
completes no request within ``connections.max.idle.ms`` (also one that sent half a frame and
stalled) is closed. Each such close is logged; the listener and every other connection go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl

from fjord.kafka import defaults
from fjord.kafka.codec import SIZE_PREFIX_BYTES, read_size
from fjord.kafka.dispatch import Close, KafkaDispatcher

log = logging.getLogger(__name__)


def client_host(peer: object) -> str:
    """Kafka's ``clientHost`` (``/127.0.0.1``) of a socket's peer name."""
    if isinstance(peer, tuple) and peer:
        return f"/{peer[0]}"
    return ""


class KafkaListener:
    """One listening socket speaking Kafka's protocol to ``dispatcher``.

    Invariant: every connection task is tracked from accept to close and cancelled by
    :meth:`stop`; an exception while serving one connection closes only that connection.
    """

    def __init__(
        self,
        dispatcher: KafkaDispatcher,
        host: str,
        port: int,
        *,
        max_request_bytes: int = defaults.SOCKET_REQUEST_MAX_BYTES,
        idle_timeout_ms: int = defaults.CONNECTIONS_MAX_IDLE_MS,
        name: str = "kafka",
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._host = host
        self.port = port
        self._max_request_bytes = max_request_bytes
        self._idle_timeout_s = idle_timeout_ms / 1000
        self._name = name
        #: TLS for every connection (SSL:// listener) or None (KAFKA://, plaintext). A failed
        #: handshake (garbage, an untrusted or expired certificate) closes that connection only.
        self._ssl = ssl_context
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Bind and listen; returns the bound port (port 0 picks a free one)."""
        self._server = await asyncio.start_server(
            self._serve, self._host, self.port, reuse_address=True, backlog=1024,
            ssl=self._ssl,
            ssl_handshake_timeout=self._idle_timeout_s if self._ssl else None,
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), defaults.SHUTDOWN_GRACE_S)
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            reason = await self._requests(reader, writer, client_host(peer))
            if reason:
                log.warning("%s listener: closing connection from %s: %s", self._name, peer, reason)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s listener: connection from %s failed; closing it", self._name, peer)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str
    ) -> str:
        """Serve requests until the client closes (returns "") or must be cut off (returns
        the reason)."""
        while True:
            try:
                async with asyncio.timeout(self._idle_timeout_s):
                    try:
                        prefix = await reader.readexactly(SIZE_PREFIX_BYTES)
                    except asyncio.IncompleteReadError as exc:
                        return "" if not exc.partial else "connection closed inside a size prefix"
                    size = read_size(prefix)
                    if size < 0 or size > self._max_request_bytes:
                        return (
                            f"request size {size} outside 0..{self._max_request_bytes} "
                            "(socket.request.max.bytes)"
                        )
                    frame = await reader.readexactly(size)
            except TimeoutError:
                return (
                    f"no complete request for {self._idle_timeout_s:g} s "
                    "(connections.max.idle.ms)"
                )
            outcome = await self._dispatcher.dispatch(frame, host)
            if isinstance(outcome, Close):
                return outcome.reason
            if outcome.frame is not None:
                writer.write(outcome.frame)
                await writer.drain()
