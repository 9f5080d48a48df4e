"""The Kafka listener's asyncio-streams shell: sockets in, frames to the dispatcher, frames out.

Per connection, responses always go out in request order, Kafka's way. A Kafka broker also
handles one request per connection at a time (it mutes the connection meanwhile); here
consecutive Produce requests overlap (see PIPELINED_API_KEYS) and every other request waits for
all earlier ones. A frame whose size prefix is negative or above
``socket.request.max.bytes`` closes the connection before anything is read; a connection that
completes no request within ``connections.max.idle.ms`` (also one that sent half a frame and
stalled) is closed. Each such close is logged; the listener and every other connection go on.

On a SASL door (``sasl`` given: SASL_PLAINTEXT:// or SASL_SSL://) each connection has a
:class:`~fjord.kafka.sasl.SaslConnection` that sees every frame first: until the client has
authenticated only ApiVersions and the SASL exchange are served (a larger frame than
``sasl.server.max.receive.size`` closes the connection unread), afterwards requests run as
``User:<name>`` until the session expires (``connections.max.reauth.ms``, KIP-368): a client
re-authenticates on the same connection, or its next request closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fjord.errors import ConfigError
from fjord.kafka import defaults
from fjord.kafka.codec import SIZE_PREFIX_BYTES, read_size
from fjord.kafka.dispatch import Close, KafkaDispatcher, Reply
from fjord.kafka.listeners import KafkaDoor, advertised_kafka_address
from fjord.kafka.sasl import SASL_API_VERSIONS, ReplyThenClose, SaslConnection
from fjord.kafka.zerocopy import Part
from fjord.metadata.schema import KafkaEndpoint
from fjord.observability import metrics
from fjord.security import ANONYMOUS, Principal, ServiceSecurity
from fjord.security.sasl_sessions import SessionLifetime
from fjord.security.scram import SCRAM_MECHANISMS, CredentialLookup
from fjord.storage.region import FileRegion
from fjord.tls import server_ssl_context, ssl_peer_principal

log = logging.getLogger(__name__)

ZERO_COPY_ENV_VAR = "FJORD_KAFKA_ZERO_COPY"
"""Set to ``false`` (or ``0``/``no``) to send Fetch records copied through Python on every
Kafka door instead of from the segment files (``sendfile`` on plaintext doors, a read straight
into the encryption on TLS ones): the A/B switch of bench/bench_zero_copy.py, and a way out
should ``sendfile`` misbehave on some file system. The default is zero copy."""


def zero_copy_enabled() -> bool:
    return os.environ.get(ZERO_COPY_ENV_VAR, "true").strip().lower() not in ("false", "0", "no")


def client_host(peer: object) -> str:
    """Kafka's ``clientHost`` (``/127.0.0.1``) of a socket's peer name."""
    if isinstance(peer, tuple) and peer:
        return f"/{peer[0]}"
    return ""


DEFAULT_SESSION_LIFETIME = SessionLifetime()


@dataclass(frozen=True)
class SaslSettings:
    """A SASL door's mechanisms (Kafka's ``sasl.enabled.mechanisms``; both SCRAM ones by
    default), where the salted credentials come from (the process's metadata image) and how
    long a session lives before the client must re-authenticate (``connections.max.reauth.ms``)."""

    lookup: CredentialLookup
    mechanisms: Iterable[str] = tuple(SCRAM_MECHANISMS)
    lifetime: SessionLifetime = DEFAULT_SESSION_LIFETIME


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
        sasl: SaslSettings | None = None,
        zero_copy: bool | None = None,
    ) -> None:
        self._sasl = sasl
        self._dispatcher = dispatcher.advertising(SASL_API_VERSIONS) if sasl else dispatcher
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
        #: Plaintext doors send Fetch records from the segment files with sendfile (None:
        #: as FJORD_KAFKA_ZERO_COPY says, on by default).
        self._zero_copy = zero_copy_enabled() if zero_copy is None else zero_copy

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
            principal = ssl_peer_principal(writer.get_extra_info("ssl_object"))
            reason = await self._requests(reader, writer, client_host(peer), principal)
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
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        host: str,
        principal: Principal = ANONYMOUS,
    ) -> str:
        """Serve requests until the client closes (returns "") or must be cut off (returns
        the reason). Answers go out in request order (a separate task writes them); see
        :class:`_Pipeline` for which requests overlap."""
        pipeline = _Pipeline(writer)
        try:
            reason = await self._read_requests(reader, host, principal, pipeline)
            await pipeline.finish()  # every earlier request answered before the close
        finally:
            pipeline.abort()
        return reason

    async def _read_requests(
        self, reader: asyncio.StreamReader, host: str, principal: Principal, pipeline: _Pipeline
    ) -> str:
        sasl = (
            SaslConnection(self._sasl.mechanisms, self._sasl.lookup, lifetime=self._sasl.lifetime)
            if self._sasl else None
        )
        # Records as file regions: sent with sendfile on plaintext doors; over TLS read once
        # from the file straight into the encryption (no copy into the encoded frame).
        zero_copy = self._zero_copy
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
                    if sasl is not None and not sasl.frame_size_allowed(size):
                        return (
                            f"request size {size} before SASL authentication is above "
                            f"{sasl.max_receive_bytes} (sasl.server.max.receive.size)"
                        )
                    frame = await reader.readexactly(size)
            except TimeoutError:
                return (
                    f"no complete request for {self._idle_timeout_s:g} s "
                    "(connections.max.idle.ms)"
                )
            if sasl is not None:
                renewals = sasl.authentications
                answer = sasl.on_frame(frame)
                if isinstance(answer, Close):
                    if sasl.closed_expired:
                        metrics.record_sasl_expired_session("kafka")
                    return answer.reason
                if sasl.authentications > max(renewals, 1):
                    metrics.record_sasl_reauthentication()
                    log.info("%s listener: %s re-authenticated from %s (KIP-368)",
                             self._name, sasl.principal, host)
                if isinstance(answer, (Reply, ReplyThenClose)):
                    done_sasl: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
                    done_sasl.set_result(Reply(answer.frame))
                    await pipeline.add(done_sasl, overlaps=False)
                    if isinstance(answer, ReplyThenClose):
                        return answer.reason
                    continue
                if sasl.principal is not None:
                    principal = sasl.principal
            prepared = self._dispatcher.prepare(frame, host, principal, zero_copy)
            if isinstance(prepared, Close):
                return prepared.reason
            if isinstance(prepared, Reply):
                done: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
                done.set_result(prepared)
                await pipeline.add(done, overlaps=False)
                continue
            overlaps = prepared.api.key in PIPELINED_API_KEYS
            if not overlaps and pipeline.idle:
                # The common case of a consumer's Fetch (one at a time per connection): run
                # and answer it here, without a task, a future and the writer's round.
                await pipeline.answer_now(self._dispatcher.run(prepared))
                continue
            await pipeline.wait_turn(overlaps)
            await pipeline.add(
                asyncio.ensure_future(self._dispatcher.run(prepared)), overlaps=overlaps
            )


#: Requests that may overlap on one connection: Produce only. A Kafka broker handles one
#: request per connection at a time; Fjord lets consecutive Produce requests overlap (up to
#: MAX_IN_FLIGHT_PRODUCE), because their appends still happen in arrival order (each handler
#: appends before it first suspends, and handlers start in arrival order) and only the waits
#: for acks overlap. Without it one connection's throughput is one batch per round trip of
#: the whole append path. Every other request waits until all earlier ones are answered.
PIPELINED_API_KEYS = frozenset({0})
MAX_IN_FLIGHT_PRODUCE = 16

#: Record regions up to this size are read on the event loop (page cache), larger ones in a
#: worker thread (TLS doors only; plaintext ones sendfile them).
READ_ON_LOOP_MAX_BYTES = 1 << 20


class _Pipeline:
    """One connection's requests in flight and the task that writes their answers in order.

    Invariants: answers are written in the order the requests were read (by the writer task,
    or by the reader itself when nothing else is in flight: :meth:`answer_now`); a request
    that may not overlap starts only once every earlier one is written; at most
    MAX_IN_FLIGHT_PRODUCE answers are outstanding; a handler that fails ends the connection
    (its exception is raised by :meth:`finish`, :meth:`add` or :meth:`answer_now`, after the
    answers before it were written).
    """

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        #: A TLS connection: file regions are read and written (encrypted), not sendfile'd.
        self._tls = writer.get_extra_info("ssl_object") is not None
        self._answers: asyncio.Queue[asyncio.Future[Reply] | None] = asyncio.Queue()
        self._outstanding = 0
        self._progress = asyncio.Event()
        self._writer_task = asyncio.ensure_future(self._write_answers())

    async def wait_turn(self, overlaps: bool) -> None:
        limit = MAX_IN_FLIGHT_PRODUCE if overlaps else 1
        while self._outstanding >= limit or (not overlaps and self._outstanding):
            self._check_writer()
            self._progress.clear()
            progress = asyncio.ensure_future(self._progress.wait())
            try:
                await asyncio.wait(
                    [progress, self._writer_task], return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                progress.cancel()
        self._check_writer()

    @property
    def idle(self) -> bool:
        """Nothing is in flight or waiting to be written: a request that may not overlap can
        be answered at once by :meth:`answer_now`."""
        return self._outstanding == 0 and self._answers.empty()

    async def answer_now(self, reply: Awaitable[Reply]) -> None:
        """Await ``reply`` and write it, in the caller's task: only when :attr:`idle` (so the
        writer task has nothing to write meanwhile, and no answer can be out of order). A
        failure closes the connection, as a failure in the writer task does."""
        self._check_writer()
        self._outstanding += 1  # the writer task stays idle; nothing is added meanwhile
        try:
            await self._write_reply(await reply)
        except asyncio.CancelledError:
            raise
        except BaseException:
            self._writer.close()
            raise
        finally:
            self._outstanding -= 1

    async def _write_reply(self, reply: Reply) -> None:
        if reply.parts is not None:
            await self._write_parts(reply.parts)
        elif reply.frame is not None:
            self._writer.write(reply.frame)
            await self._writer.drain()

    async def add(self, answer: asyncio.Future[Reply], overlaps: bool) -> None:
        self._check_writer()
        self._outstanding += 1
        self._answers.put_nowait(answer)
        if not overlaps:
            await self.wait_turn(False)  # Kafka's order: nothing overlaps this request

    async def finish(self) -> None:
        """Write every queued answer, then stop the writer (re-raising its failure)."""
        self._answers.put_nowait(None)
        await self._writer_task

    def abort(self) -> None:
        self._writer_task.cancel()
        while not self._answers.empty():
            answer = self._answers.get_nowait()
            if answer is not None:
                answer.cancel()

    def _check_writer(self) -> None:
        if self._writer_task.done():
            self._writer_task.result()  # raises the handler's or the socket's error
            raise ConnectionError("the connection's writer stopped")

    async def _write_parts(self, parts: list[Part]) -> None:
        """Write a frame in pieces: bytes as usual, file regions with ``sendfile`` (the kernel
        sends them from the page cache; see :meth:`_sendfile`). Every region is closed; one
        that comes up short (its segment truncated meanwhile) ends the connection, since the
        frame's size is on the wire already.

        On plaintext doors the socket is corked (``TCP_CORK``) while the pieces go in and
        uncorked after the last: with TCP_NODELAY each piece would leave as its own packet (the
        headers before a region, the region, the bytes after it), and each packet wakes the
        consumer, which can do nothing with part of a frame. Corked, an answer leaves in full
        segments and wakes it once; partial segments wait at most until the uncork here (the
        kernel's own limit is 200 ms)."""
        cork = self._cork_socket()
        try:
            for part in parts:
                if not isinstance(part, FileRegion):
                    self._writer.write(part)
                    continue
                if self._tls:
                    data = (await asyncio.to_thread(part.read)
                            if part.count > READ_ON_LOOP_MAX_BYTES else part.read())
                    self._writer.write(data)
                    sent = len(data)
                    metrics.record_fetch_record_bytes("read", sent)
                    if sent != part.count:
                        raise ConnectionError(
                            f"read {sent} of {part.count} record bytes: the segment shrank"
                        )
                    continue
                sent = await self._sendfile(part)
                metrics.record_sendfile_bytes(sent)
                if sent != part.count:
                    raise ConnectionError(
                        f"sent {sent} of {part.count} record bytes: the segment shrank"
                    )
            _set_cork(cork, False)
            cork = None
            await self._writer.drain()
        finally:
            _set_cork(cork, False)
            for part in parts:
                if isinstance(part, FileRegion):
                    part.close()

    def _cork_socket(self) -> Any:
        """Cork this connection's socket (plaintext TCP on Linux); returns it, or None when
        not corked."""
        if self._tls or not hasattr(socket, "TCP_CORK"):
            return None
        sock = self._writer.transport.get_extra_info("socket")
        return sock if _set_cork(sock, True) else None

    async def _sendfile(self, region: FileRegion) -> int:
        """Send ``region`` on the socket with ``sendfile``; returns the bytes sent (short only
        when the file ended first).

        First straight on the socket, when nothing written before waits in the transport's
        buffer (so the bytes keep their place in the frame): a socket with room takes a whole
        region in one ``os.sendfile`` call, and the answer costs no event-loop round.
        ``loop.sendfile`` alone costs several per region even then (it waits for the
        transport to drain, pauses and resumes reading, registers the socket for writing and
        waits for the next writable event before it sees that everything went). Whatever
        the socket did not take goes with ``loop.sendfile``, which waits for room."""
        transport = self._writer.transport
        sock = transport.get_extra_info("socket")
        sent = 0
        if sock is not None and transport.get_write_buffer_size() == 0:
            try:
                while sent < region.count:
                    chunk = os.sendfile(sock.fileno(), region.fd, region.offset + sent,
                                        region.count - sent)
                    if chunk == 0:
                        return sent  # the file ended: the segment shrank
                    sent += chunk
                metrics.record_sendfile_region(waited=False)
                return sent
            except (BlockingIOError, InterruptedError):
                pass  # the socket is full: wait for room below
            except ConnectionError:
                raise
            except OSError:
                if sent:
                    raise
                # sendfile refused this file (some file systems): loop.sendfile falls back
                # to reading and sending it
        metrics.record_sendfile_region(waited=True)
        await self._writer.drain()
        with open(region.fd, "rb", buffering=0, closefd=False) as file:
            return sent + await asyncio.get_running_loop().sendfile(
                transport, file, region.offset + sent, region.count - sent
            )

    async def _write_answers(self) -> None:
        try:
            while True:
                answer = await self._answers.get()
                if answer is None:
                    return
                await self._write_reply(await answer)
                self._outstanding -= 1
                self._progress.set()
        except asyncio.CancelledError:
            raise
        except BaseException:
            self._writer.close()  # the reader sees the end at once; finish() raises this
            raise


def _set_cork(sock: Any, on: bool) -> bool:
    """Set ``TCP_CORK`` on ``sock`` (None: nothing to do); False when the socket refuses it
    (closed meanwhile, not TCP)."""
    if sock is None:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1 if on else 0)
    except OSError:
        return False
    return True


async def open_kafka_listener(
    dispatcher: KafkaDispatcher,
    listener: tuple[str, int],
    tls: ssl.SSLContext | None,
    name: str,
    sasl: SaslSettings | None = None,
    listener_name: str = "",
) -> KafkaListener:
    """Start a process's Kafka-protocol door (``KAFKA://``, ``SSL://`` with ``tls``,
    ``SASL_PLAINTEXT://`` with ``sasl``, ``SASL_SSL://`` with both), its requests tagged with
    ``listener_name`` (RequestContext.listener); a port that cannot be bound is a ConfigError
    naming the listener."""
    host, port = listener
    kafka = KafkaListener(dispatcher.on_listener(listener_name), host, port, name=name,
                          ssl_context=tls, sasl=sasl)
    try:
        await kafka.start()
    except OSError as exc:
        door = ("SASL_" if sasl else "") + ("SSL" if tls is not None else "PLAINTEXT")
        door = "KAFKA" if door == "PLAINTEXT" else door
        named = f" (listener {listener_name})" if listener_name and listener_name != door else ""
        raise ConfigError(
            f"listeners: cannot bind {door}://{host}:{port}{named}: {exc}"
        ) from exc
    return kafka


class KafkaDoors:
    """Every Kafka-protocol door of one process (a broker or a coordinator), one listening
    socket per :class:`~fjord.kafka.listeners.KafkaDoor`, all on one dispatcher; each door's
    requests carry its listener name. Invariant: after :meth:`open` every door listens (a
    door that cannot bind stops the ones already open and raises the ConfigError)."""

    def __init__(self, doors: Sequence[KafkaDoor], name: str) -> None:
        self.doors = tuple(doors)
        self._name = name
        self._listeners: list[KafkaListener] = []

    async def open(
        self,
        dispatcher: KafkaDispatcher,
        security: ServiceSecurity | None,
        sasl: Callable[[], SaslSettings],
    ) -> None:
        """Open every door: TLS ones with ``security``'s server context (client certificates
        not required on SASL_SSL ones), SASL ones with ``sasl()``."""
        try:
            for door in self.doors:
                if door.tls and security is None:
                    raise ConfigError(
                        f"listeners: {door.name} ({door.protocol}) needs --security-config"
                    )
                tls = server_ssl_context(security, sasl=door.sasl) if door.tls and security \
                    else None
                self._listeners.append(await open_kafka_listener(
                    dispatcher, door.listener, tls, f"{self._name} {door.name.lower()}",
                    sasl=sasl() if door.sasl else None, listener_name=door.name,
                ))
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        for listener in self._listeners:
            await listener.stop()
        self._listeners.clear()

    @property
    def is_open(self) -> bool:
        return bool(self._listeners)

    def bound_ports(self) -> list[int]:
        return [listener.port for listener in self._listeners]

    def endpoints(self, advertised_host_option: str | None) -> tuple[KafkaEndpoint, ...]:
        """Each open door's advertised (name, host, port): see
        fjord.kafka.listeners.advertised_kafka_address."""
        return tuple(
            KafkaEndpoint(door.name, *advertised_kafka_address(
                door.listener, door.advertised, advertised_host_option, listener.port))
            for door, listener in zip(self.doors, self._listeners, strict=False)
        )
