"""What every long-running Fjord service process (broker, coordinator) does the same way:
parsing its ``--listen`` address, binding its gRPC port, the host it advertises, and serving
until SIGTERM/SIGINT with a clean stop."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from grpc import aio

from fjord.errors import ConfigError
from fjord.observability.metrics import record_authorization_denial
from fjord.security import Principal, ServiceSecurity
from fjord.security.acls import AccessControl, AuthorizerSettings, Caller
from fjord.tls import bind_port, grpc_peer_principal

log = logging.getLogger(__name__)

_WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def parse_listen(address: str, default_port: int) -> tuple[str, int]:
    """``HOST:PORT`` (or ``HOST``, or ``[v6]:PORT``, ``default_port`` then: each service passes
    its own) to (host, port); ConfigError names listen."""
    host, sep, port_text = address.rpartition(":")
    if not sep:
        host, port_text = address, str(default_port)
    host = host.strip("[]")
    if not host:
        raise ConfigError(f"listen: expected HOST:PORT, got {address!r}")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"listen: invalid port in {address!r}") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"listen: port {port} out of range 0..65535")
    return host, port


def bind_grpc_port(
    server: aio.Server, host: str, port: int, security: ServiceSecurity | None = None
) -> int:
    """Bind ``server`` to ``host:port`` (port 0: a free one), with TLS when ``security`` is
    given (plaintext otherwise); returns the bound port. Raises ConfigError naming the address
    when it cannot be bound, or the key of a TLS file that cannot be read."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = bind_port(server, address, security)
    except RuntimeError as exc:  # newer grpc raises instead of returning 0
        raise ConfigError(f"listen: cannot bind {address}: {exc}") from exc
    if bound == 0:
        raise ConfigError(f"listen: cannot bind {address}")
    return int(bound)


def advertised_host(advertised: str | None, listen_host: str) -> str:
    """The host others reach the process at: ``advertised`` if set, else the listen host, and
    for a wildcard listen address (all interfaces) the machine's fully qualified name."""
    host = advertised or listen_host
    return socket.getfqdn() if host in _WILDCARD_HOSTS else host


#: Seconds between two cancellations of a background task that has not ended yet.
CANCEL_RETRY_S = 0.5


async def cancel_until_done(
    tasks: Iterable[asyncio.Task[Any]], *, retry_s: float = CANCEL_RETRY_S
) -> None:
    """Cancel ``tasks`` and return once every one has ended (their results and errors are not
    raised). A task still running ``retry_s`` after its cancel is cancelled again, with a
    warning naming it: a cancellation can be lost (grpc.aio answers the cancel of a call whose
    failure has just arrived with that failure; Python 3.11's ``asyncio.wait_for`` returns the
    inner result when the cancel meets its end), and a loop that lost one would otherwise keep
    its service's stop waiting forever."""
    pending = {task for task in tasks if not task.done()}
    for task in pending:
        task.cancel()
    while pending:
        _, pending = await asyncio.wait(pending, timeout=retry_s)
        for task in pending:
            log.warning("task %r outlived its cancellation: cancelling it again",
                        task.get_name())
            task.cancel()


async def run_until_signalled(
    start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]], what: str
) -> None:
    """``start()``, serve until SIGTERM or SIGINT, then ``stop()`` (always, also when start-up
    fails or is interrupted). A signal during start-up (e.g. while a stale registration of the
    same id has not expired yet) interrupts the start instead of waiting for it."""
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)
    starting = asyncio.ensure_future(start())
    stopping = asyncio.ensure_future(stop_requested.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            starting.result()  # start-up failed: raise its error
            await stopping
        log.info("%s: shutdown requested", what)
    finally:
        for task in (starting, stopping):
            task.cancel()
        await asyncio.gather(starting, stopping, return_exceptions=True)
        await stop()


def grpc_peer_host(context: aio.ServicerContext) -> str:
    """The caller's address from gRPC's peer string (``ipv4:127.0.0.1:5`` -> ``127.0.0.1``,
    ``ipv6:[::1]:5`` -> ``::1``; "" when unknown): what an ACL's host is compared with."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host = rest.rpartition(":")[0].replace("%5B", "[").replace("%5D", "]")
        return host.strip("[]")
    return ""


def grpc_caller(context: aio.ServicerContext) -> Caller:
    """Who made a gRPC call: the principal of its verified client certificate (ANONYMOUS in
    plaintext) and its address; what every gRPC door hands the ACL checks."""
    return Caller(grpc_peer_principal(context), grpc_peer_host(context))


#: gRPC metadata a Fjord service adds when it forwards a client's request (the Kafka listener's
#: admin requests to the controller): the client's principal and address, as Kafka's Envelope
#: (KIP-590). Honoured only from the cluster service identity.
FORWARDED_PRINCIPAL = "fjord-forwarded-principal"
FORWARDED_HOST = "fjord-forwarded-host"


def forwarding_metadata(caller: Caller) -> tuple[tuple[str, str], ...]:
    """The metadata that makes the receiving service check ``caller`` instead of us."""
    return ((FORWARDED_PRINCIPAL, str(caller.principal)), (FORWARDED_HOST, caller.host))


def grpc_caller_or_forwarded(context: aio.ServicerContext) -> Caller:
    """:func:`grpc_caller`, except that a call from the cluster service identity carrying
    :data:`FORWARDED_PRINCIPAL` is the forwarded client's (whose ACLs then apply). A client
    certificate that sends the header is still itself: only services may forward."""
    direct = grpc_caller(context)
    if not direct.principal.is_service:
        return direct
    sent = dict(context.invocation_metadata() or ())
    principal = sent.get(FORWARDED_PRINCIPAL)
    if not isinstance(principal, str) or not principal:
        return direct
    try:
        forwarded = Principal.parse(principal)
    except ConfigError:
        log.warning("ignoring malformed %s %r from %s", FORWARDED_PRINCIPAL, principal,
                    direct.principal)
        return direct
    host = sent.get(FORWARDED_HOST)
    return Caller(forwarded, host if isinstance(host, str) else "")


def access_control(settings: AuthorizerSettings | None) -> AccessControl:
    """A service process's authorization (off for None), its denials counted in
    ``fjord_authorization_denials``."""
    return AccessControl(settings, record_authorization_denial)
