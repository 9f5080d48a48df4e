"""A service's SASL gRPC door: the shell around :mod:`fjord.security.sasl_sessions`.

Why a second port: gRPC Python's ``ssl_server_credentials(require_client_auth=False)`` does
not ask for a client certificate at all, so one port cannot both require certificates of
services and take certificate-less SASL clients. The door is a second ``aio.Server`` of the
same process serving the same servicers, bound with TLS without client certificates (or
plaintext, SASL_PLAINTEXT, when the service has no ``--security-config``), plus
``fjord.v1.Sasl/Authenticate``.

Invariants: every call but ``Sasl/Authenticate`` needs a session token this process issued
(``fjord-sasl-session`` metadata), else it is aborted UNAUTHENTICATED before any servicer
runs; during the call :data:`~fjord.security.sasl_sessions.SASL_SESSION_PRINCIPAL` holds the
session's ``User:<name>``, which is what the ACLs see and which is never the cluster service
identity (so inter-broker requests through this door are CLUSTER_AUTHORIZATION_FAILED).
A session lives ``connections.max.reauth.ms`` (:class:`~fjord.security.sasl_sessions.
SessionLifetime`, told to the client in the login's last answer); a call with an expired token
is refused like one without a token, its trailing metadata ``fjord-sasl-session-state`` saying
``expired`` (``unknown``, ``missing`` otherwise), so a client tells them apart. A credential
deleted or changed meanwhile takes effect at the client's next login, never on a live session.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import grpc
from grpc import aio

from fjord._proto import common_pb2, sasl_pb2, sasl_pb2_grpc
from fjord.observability import metrics
from fjord.security import ServiceSecurity
from fjord.security.principal import Principal
from fjord.security.sasl_sessions import (
    SASL_SESSION_PRINCIPAL,
    SESSION_METADATA_KEY,
    SaslExchangeError,
    ScramExchange,
    SessionLifetime,
    SessionState,
    SessionTokens,
)
from fjord.security.scram import SCRAM_MECHANISMS, CredentialLookup
from fjord.tls import load_tls

log = logging.getLogger(__name__)

AUTHENTICATE_METHOD = "/fjord.v1.Sasl/Authenticate"
#: Trailing metadata of a refused call: the :class:`SessionState` that refused it.
SESSION_STATE_METADATA_KEY = "fjord-sasl-session-state"


class SaslServicer(sasl_pb2_grpc.SaslServicer):
    """``Sasl/Authenticate``: one :class:`ScramExchange` per stream."""

    def __init__(self, lookup: CredentialLookup, sessions: SessionTokens, name: str) -> None:
        self._lookup = lookup
        self._sessions = sessions
        self._name = name

    async def Authenticate(
        self,
        request_iterator: AsyncIterator[sasl_pb2.SaslAuthenticateRequest],
        context: aio.ServicerContext,
    ) -> AsyncIterator[sasl_pb2.SaslAuthenticateResponse]:
        exchange = ScramExchange(SCRAM_MECHANISMS, self._lookup)
        async for request in request_iterator:
            try:
                answer = exchange.step(request.mechanism, bytes(request.auth_bytes))
            except SaslExchangeError as exc:
                log.warning("%s: SASL login from %s failed (%s): %s", self._name,
                            context.peer(), exc.code.name, exc.__cause__ or exc)
                yield sasl_pb2.SaslAuthenticateResponse(
                    error=common_pb2.Error(code=exc.code.code, message=str(exc)))
                return
            response = sasl_pb2.SaslAuthenticateResponse(auth_bytes=answer)
            if exchange.principal is not None:
                response.session_token = self._sessions.issue(exchange.principal)
                response.session_lifetime_ms = self._sessions.lifetime.max_reauth_ms
                log.info("%s: %s logged in with SASL from %s", self._name,
                         exchange.principal, context.peer())
            yield response


def _with_principal(handler: grpc.RpcMethodHandler, principal: Principal
                    ) -> grpc.RpcMethodHandler:
    """``handler`` with :data:`SASL_SESSION_PRINCIPAL` set to ``principal`` while it runs."""
    kinds = (
        ("unary_unary", grpc.unary_unary_rpc_method_handler, False),
        ("unary_stream", grpc.unary_stream_rpc_method_handler, True),
        ("stream_unary", grpc.stream_unary_rpc_method_handler, False),
        ("stream_stream", grpc.stream_stream_rpc_method_handler, True),
    )
    for attribute, make, streams in kinds:
        behaviour = getattr(handler, attribute)
        if behaviour is None:
            continue
        if streams:
            async def streaming(request: Any, context: Any, inner: Any = behaviour
                                ) -> AsyncIterator[Any]:
                token = SASL_SESSION_PRINCIPAL.set(principal)
                try:
                    async for item in inner(request, context):
                        yield item
                finally:
                    SASL_SESSION_PRINCIPAL.reset(token)
            wrapped: Callable[..., Any] = streaming
        else:
            async def unary(request: Any, context: Any, inner: Any = behaviour) -> Any:
                token = SASL_SESSION_PRINCIPAL.set(principal)
                try:
                    return await inner(request, context)
                finally:
                    SASL_SESSION_PRINCIPAL.reset(token)
            wrapped = unary
        return make(wrapped, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)
    return handler


def _refusal(handler: grpc.RpcMethodHandler, message: str, state: SessionState
             ) -> grpc.RpcMethodHandler:
    """A handler of ``handler``'s kind that aborts UNAUTHENTICATED without reading."""
    async def abort(request: Any, context: aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message,
                            trailing_metadata=((SESSION_STATE_METADATA_KEY, state.value),))

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort)
    return grpc.unary_unary_rpc_method_handler(abort)


class SaslSessionInterceptor(aio.ServerInterceptor):
    """Lets a call through only with a known session token (see the module docstring)."""

    def __init__(self, sessions: SessionTokens, name: str) -> None:
        self._sessions = sessions
        self._name = name
        self.refused = 0
        self.expired = 0  # of which carried an expired token

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method == AUTHENTICATE_METHOD:
            return handler
        token = dict(details.invocation_metadata or ()).get(SESSION_METADATA_KEY)
        found = self._sessions.check(token if isinstance(token, str) else None)
        if found.principal is None:
            self.refused += 1
            if found.state is SessionState.EXPIRED:
                self.expired += 1
                metrics.record_sasl_expired_session("grpc")
                log.info("%s: refused %s on the SASL door: session expired", self._name,
                         details.method)
            else:
                log.warning("%s: refused %s on the SASL door: %s session token", self._name,
                            details.method, found.state.value)
            return _refusal(handler, found.refusal(self._sessions.lifetime), found.state)
        return _with_principal(handler, found.principal)


def bind_sasl_port(server: aio.Server, address: str, security: ServiceSecurity | None) -> int:
    """Bind the door: TLS with the service's certificate and no client certificate asked
    (``security``), else plaintext (SASL_PLAINTEXT). Returns the port (0: not bound)."""
    if security is None:
        return int(server.add_insecure_port(address))
    material = load_tls(security.server_files, "ssl.keystore.location")
    assert material.key is not None and material.chain is not None
    credentials = grpc.ssl_server_credentials(
        [(material.key, material.chain)], require_client_auth=False
    )
    return int(server.add_secure_port(address, credentials))


def sasl_door_server(
    lookup: CredentialLookup,
    name: str,
    interceptors: Iterable[aio.ServerInterceptor] = (),
    options: Iterable[tuple[str, Any]] = (),
    sessions: SessionTokens | None = None,
    lifetime: SessionLifetime | None = None,
) -> tuple[aio.Server, SaslSessionInterceptor]:
    """A new ``aio.Server`` for the door with ``Sasl/Authenticate`` registered; the caller
    registers its servicers on it and binds it with :func:`bind_sasl_port`. ``sessions``:
    the token table (default: a new one of the default size, its sessions living
    ``lifetime``, by default ``connections.max.reauth.ms``'s default)."""
    sessions = sessions if sessions is not None else SessionTokens(lifetime=lifetime)
    guard = SaslSessionInterceptor(sessions, name)
    server = aio.server(interceptors=[*interceptors, guard], options=list(options))
    sasl_pb2_grpc.add_SaslServicer_to_server(SaslServicer(lookup, sessions, name), server)
    return server, guard
