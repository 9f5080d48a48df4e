"""The client side of the SASL gRPC door (fjord.sasl_door): log in once per address with
SCRAM over ``fjord.v1.Sasl/Authenticate`` and send the session token with every call.

:class:`SaslLoginInterceptor` sits on every channel :func:`fjord.tls.open_channel` opens for
a client whose ``security.protocol`` is SASL_SSL or SASL_PLAINTEXT. Invariants: at most one
login per channel runs at a time; the session is renewed (a new login, KIP-368's
re-authentication) before the lifetime the server answered ends, at 85-95% of it
(:class:`~fjord.security.sasl_sessions.ClientSession`), so calls never wait on an expired
token; a renewal that fails (the user was deleted, the password changed) fails the call with
SASL_AUTHENTICATION_FAILED, as Kafka's failed re-authentication ends the connection; a call
answered UNAUTHENTICATED (the server forgot the session: it restarted, or evicted it, or the
session expired while the client was paused) logs in again once and is sent once more (it was
refused before any handler ran, so nothing is applied twice); the server's
final SCRAM message is verified (a server that does not know the credential is refused); a
failed login raises :class:`~fjord.errors.FjordError` with SASL_AUTHENTICATION_FAILED (or the
server's code) out of the call, never a partial session.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc import aio
from scramp import ScramClient, ScramException

from fjord._proto import sasl_pb2, sasl_pb2_grpc
from fjord.errors import ErrorCode, FjordError, error_code_from_number
from fjord.security import ClientSecurity
from fjord.security.sasl_sessions import SESSION_METADATA_KEY, ClientSession, Clock

LOGIN_TIMEOUT_S = 15.0


async def sasl_login(address: str, security: ClientSecurity) -> str:
    """One SCRAM login at ``address``'s SASL door: the session token."""
    return (await sasl_login_session(address, security)).token


async def sasl_login_session(address: str, security: ClientSecurity,
                             clock: Clock = time.monotonic) -> ClientSession:
    """One SCRAM login at ``address``'s SASL door: the session (token, lifetime, when to
    renew it; the lifetime counts from before the login was sent, so the client's renewal is
    never later than the server's expiry)."""
    started_at = clock()
    login = security.sasl
    assert login is not None
    if security.uses_tls:
        from fjord.tls import channel_credentials

        assert security.tls is not None
        channel = aio.secure_channel(address, channel_credentials(security.tls))
    else:
        channel = aio.insecure_channel(address)
    async with channel:
        client = ScramClient([login.mechanism], login.username, login.password)
        call = sasl_pb2_grpc.SaslStub(channel).Authenticate(timeout=LOGIN_TIMEOUT_S)
        await call.write(sasl_pb2.SaslAuthenticateRequest(
            mechanism=login.mechanism, auth_bytes=client.get_client_first().encode()))
        first = await call.read()
        _raise_for(first, address)
        try:
            client.set_server_first(first.auth_bytes.decode())
            final_message = client.get_client_final()
        except (ScramException, UnicodeDecodeError) as exc:
            raise _failed(address, f"bad server-first message: {exc}") from exc
        await call.write(sasl_pb2.SaslAuthenticateRequest(auth_bytes=final_message.encode()))
        final = await call.read()
        await call.done_writing()
        _raise_for(final, address)
        try:
            client.set_server_final(final.auth_bytes.decode())
        except (ScramException, UnicodeDecodeError) as exc:
            raise _failed(address, f"the server did not prove it knows the credential: {exc}"
                          ) from exc
        if not final.session_token:
            raise _failed(address, "no session token in the final answer")
        return ClientSession(str(final.session_token), int(final.session_lifetime_ms),
                             started_at)


def _failed(address: str, message: str) -> FjordError:
    return FjordError(f"SASL login at {address}: {message}", ErrorCode.SASL_AUTHENTICATION_FAILED)


def _raise_for(answer: Any, address: str) -> None:
    if answer is aio.EOF or answer is None:
        raise _failed(address, "the server ended the exchange")
    if answer.error.code:
        raise FjordError(f"SASL login at {address}: {answer.error.message}",
                         error_code_from_number(answer.error.code))


def _with_token(details: aio.ClientCallDetails, token: str) -> aio.ClientCallDetails:
    metadata = aio.Metadata(*(details.metadata or ()))
    metadata.add(SESSION_METADATA_KEY, token)
    return aio.ClientCallDetails(details.method, details.timeout, metadata,
                                 details.credentials, details.wait_for_ready)


class SaslLoginInterceptor(aio.UnaryUnaryClientInterceptor):
    """Adds the session token to every unary call of one channel (see the module docstring)."""

    def __init__(self, address: str, security: ClientSecurity,
                 clock: Clock = time.monotonic) -> None:
        self._address = address
        self._security = security
        self._clock = clock
        self._current: ClientSession | None = None
        self._lock: asyncio.Lock | None = None
        #: Logins done (the first and every renewal or re-login).
        self.logins = 0

    async def _session(self, stale: str | None = None) -> str:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            current = self._current
            if current is None or current.token == stale or current.renewal_due(self._clock()):
                current = await sasl_login_session(self._address, self._security, self._clock)
                self._current = current
                self.logins += 1
            return current.token

    async def intercept_unary_unary(
        self,
        continuation: Callable[[aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: aio.ClientCallDetails,
        request: Any,
    ) -> Any:
        token = await self._session()
        call = await continuation(_with_token(client_call_details, token), request)
        if await call.code() is grpc.StatusCode.UNAUTHENTICATED:
            token = await self._session(stale=token)
            call = await continuation(_with_token(client_call_details, token), request)
        return call
