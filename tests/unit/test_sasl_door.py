"""The SASL gRPC door's shells against a real in-process gRPC server (plaintext,
SASL_PLAINTEXT): fjord.sasl_login's interceptor logs in, the door maps its token to the
principal a handler sees, a forgotten session is logged in again once, and sessions expire
and are renewed on an injected clock; a fjord.client Network configured with SASL_PLAINTEXT
logs in on the door."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest
from grpc import aio

from fjord.client.network import Network
from fjord.errors import ErrorCode, FjordError
from fjord.sasl_door import (
    SESSION_STATE_METADATA_KEY,
    SaslSessionInterceptor,
    bind_sasl_port,
    sasl_door_server,
)
from fjord.sasl_login import SaslLoginInterceptor, sasl_login
from fjord.security import ClientSecurity, SecurityProtocol
from fjord.security.config import SaslLogin
from fjord.security.sasl_sessions import (
    SASL_SESSION_PRINCIPAL,
    SESSION_METADATA_KEY,
    SessionLifetime,
    SessionTokens,
)
from fjord.security.scram import ScramCredential
from fjord.tls import open_channel

STORED = {("SCRAM-SHA-256", "alice"): ScramCredential.from_password(
    "SCRAM-SHA-256", "secret", iterations=4096)}
WHOAMI = "/test.Door/WhoAmI"


def whoami_handler() -> grpc.GenericRpcHandler:
    async def whoami(request: bytes, context: Any) -> bytes:
        return str(SASL_SESSION_PRINCIPAL.get()).encode()

    return grpc.method_handlers_generic_handler("test.Door", {
        "WhoAmI": grpc.unary_unary_rpc_method_handler(whoami)})


def client(password: str) -> ClientSecurity:
    return ClientSecurity(SecurityProtocol.SASL_PLAINTEXT,
                          sasl=SaslLogin("SCRAM-SHA-256", "alice", password))


@asynccontextmanager
async def running_door(stored: dict[Any, ScramCredential], sessions: SessionTokens
                       ) -> AsyncIterator[tuple[str, SaslSessionInterceptor]]:
    """A plaintext door on a free port serving WhoAmI: (its address, its session guard)."""
    server, guard = sasl_door_server(lambda m, u: stored.get((m, u)), "test door",
                                     sessions=sessions)
    server.add_generic_rpc_handlers((whoami_handler(),))
    port = bind_sasl_port(server, "127.0.0.1:0", None)
    await server.start()
    try:
        yield f"127.0.0.1:{port}", guard
    finally:
        await server.stop(None)


async def door_round_trips() -> None:
    sessions = SessionTokens(max_sessions=1)
    async with running_door(STORED, sessions) as (address, guard):
        first = open_channel(address, client("secret"))
        second = open_channel(address, client("secret"))
        ask_first = first.unary_unary(WHOAMI)
        ask_second = second.unary_unary(WHOAMI)
        assert await ask_first(b"", timeout=10) == b"User:alice"
        # The second login evicts the first session (max 1): the first client is refused
        # UNAUTHENTICATED once, logs in again and is answered.
        assert await ask_second(b"", timeout=10) == b"User:alice"
        refused_before = guard.refused
        assert await ask_first(b"", timeout=10) == b"User:alice"
        assert guard.refused == refused_before + 1

        # Without the interceptor (no token) the door refuses before the handler runs.
        async with aio.insecure_channel(address) as bare:
            with pytest.raises(aio.AioRpcError) as refused:
                await bare.unary_unary(WHOAMI)(b"", timeout=10)
            assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED

        wrong = open_channel(address, client("wrong"))
        with pytest.raises(FjordError) as failed:
            await wrong.unary_unary(WHOAMI)(b"", timeout=10)
        assert failed.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
        for channel in (first, second, wrong):
            await channel.close()


def test_door_login_principal_and_relogin_after_a_forgotten_session() -> None:
    asyncio.run(door_round_trips())


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def door_session_lifetimes(change: str) -> None:
    """One clock for the door and the client: the client renews at 85-95% of the lifetime
    the door answered; a token past its lifetime is refused as expired (typed in the trailing
    metadata); a deleted or changed credential keeps its live session and fails the renewal."""
    clock = ManualClock()
    stored = dict(STORED)
    sessions = SessionTokens(lifetime=SessionLifetime(10_000), clock=clock)
    async with running_door(stored, sessions) as (address, guard):
        login = SaslLoginInterceptor(address, client("secret"), clock)
        async with aio.insecure_channel(address, interceptors=[login]) as channel:
            ask = channel.unary_unary(WHOAMI)
            assert await ask(b"", timeout=10) == b"User:alice" and login.logins == 1
            clock.now += 8.4  # before 85%: the same session
            assert await ask(b"", timeout=10) == b"User:alice" and login.logins == 1
            clock.now += 1.2  # past 95%: renewed before the call, never refused
            refused_before = guard.refused
            assert await ask(b"", timeout=10) == b"User:alice" and login.logins == 2
            assert guard.refused == refused_before

            # The door's own view: the first token, replayed after its lifetime, is expired.
            first = await sasl_login(address, client("secret"))
            clock.now += 10.0
            async with aio.insecure_channel(address) as bare:
                with pytest.raises(aio.AioRpcError) as expired:
                    await bare.unary_unary(WHOAMI)(
                        b"", timeout=10, metadata=((SESSION_METADATA_KEY, first),))
            assert expired.value.code() is grpc.StatusCode.UNAUTHENTICATED
            assert "SASL session expired (connections.max.reauth.ms=10000)" in \
                str(expired.value.details())
            assert (SESSION_STATE_METADATA_KEY, "expired") in \
                tuple(expired.value.trailing_metadata() or ())
            assert guard.expired >= 1

            # The client slept past its renewal and past the expiry: renewed all the same.
            assert await ask(b"", timeout=10) == b"User:alice" and login.logins == 3

            # The credential is deleted or its password changed: the live session goes on
            # until its renewal, which fails with a typed error (Kafka: the
            # re-authentication fails).
            if change == "deleted":
                del stored[("SCRAM-SHA-256", "alice")]
            else:
                stored[("SCRAM-SHA-256", "alice")] = ScramCredential.from_password(
                    "SCRAM-SHA-256", "rotated", iterations=4096)
            assert await ask(b"", timeout=10) == b"User:alice"
            clock.now += 9.6
            with pytest.raises(FjordError) as failed:
                await ask(b"", timeout=10)
            assert failed.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED


@pytest.mark.parametrize("change", ["deleted", "new_password"])
def test_door_sessions_expire_and_clients_renew_before(change: str) -> None:
    asyncio.run(door_session_lifetimes(change))


async def client_network_on_the_door(password: str) -> bytes:
    """What WhoAmI answers on the channel a client's Network dials to a plaintext door, the
    client configured as an application configures it (Kafka's keys)."""
    async with running_door(STORED, SessionTokens()) as (address, _guard):
        host, _, port = address.rpartition(":")
        network = Network([(host, int(port))], client_id="t", request_timeout_ms=10_000,
                          security=ClientSecurity.from_config({
                              "security.protocol": "SASL_PLAINTEXT",
                              "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice",
                              "sasl.password": password}))
        try:
            # A session is checked when a call starts: never Produce/Fetch streams with SASL.
            assert not network.rpc_streams
            return bytes(await network._channel(address).unary_unary(WHOAMI)(b"", timeout=10))
        finally:
            await network.close()


def test_client_network_with_sasl_plaintext_logs_in_on_a_plaintext_door() -> None:
    """SASL_PLAINTEXT is not TLS, yet the client's Network keeps its SASL settings (it once
    kept only TLS ones and dialed as the process, with no login: every call UNAUTHENTICATED)."""
    assert asyncio.run(client_network_on_the_door("secret")) == b"User:alice"
    with pytest.raises(FjordError) as failed:
        asyncio.run(client_network_on_the_door("wrong"))
    assert failed.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
