"""The client side of the SASL gRPC door (fjord.sasl_door): log in once per address with
SCRAM over ``fjord.v1.Sasl/Authenticate`` and send the session token with every call.

:class:`SaslLoginInterceptor` sits on every channel :func:`fjord.tls.open_channel` opens for
a client whose ``security.protocol`` is SASL_SSL or SASL_PLAINTEXT. Invariants: at most one
login per channel runs at a time; a call answered UNAUTHENTICATED (the server forgot the
session: it restarted, or evicted it) logs in again once and is sent once more; the server's
final SCRAM message is verified (a server that does not know the credential is refused); a
failed login raises :class:`~fjord.errors.FjordError` with SASL_AUTHENTICATION_FAILED (or the
server's code) out of the call, never a partial session.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc import aio
from scramp import ScramClient, ScramException

from fjord._proto import sasl_pb2, sasl_pb2_grpc
from fjord.errors import ErrorCode, FjordError, error_code_from_number
from fjord.security import ClientSecurity
from fjord.security.sasl_sessions import SESSION_METADATA_KEY

LOGIN_TIMEOUT_S = 15.0


async def sasl_login(address: str, security: ClientSecurity) -> str:
    """One SCRAM login at ``address``'s SASL door: the session token."""
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
        return str(final.session_token)


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

    def __init__(self, address: str, security: ClientSecurity) -> None:
        self._address = address
        self._security = security
        self._token: str | None = None
        self._lock: asyncio.Lock | None = None

    async def _session(self, stale: str | None = None) -> str:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._token is None or self._token == stale:
                self._token = None
                self._token = await sasl_login(self._address, self._security)
            return self._token

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
