"""The gRPC SASL door's pure core: a SCRAM exchange against stored credentials (scramp's
client on the other side) and the session token table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scramp import ScramClient

from fjord.errors import ConfigError, ErrorCode
from fjord.security import Principal
from fjord.security.sasl_sessions import (
    DEFAULT_CONNECTIONS_MAX_REAUTH_MS,
    MAX_SCRAM_MESSAGE_BYTES,
    ClientSession,
    ExchangeState,
    SaslExchangeError,
    ScramExchange,
    SessionCheck,
    SessionLifetime,
    SessionState,
    SessionTokens,
    connections_max_reauth_ms,
)
from fjord.security.scram import ScramCredential

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
STORED = {("SCRAM-SHA-512", "alice"): ScramCredential.from_password("SCRAM-SHA-512", "secret",
                                                                      iterations=4096)}


def exchange() -> ScramExchange:
    return ScramExchange(MECHANISMS, lambda mechanism, user: STORED.get((mechanism, user)))


def login(password: str, user: str = "alice", mechanism: str = "SCRAM-SHA-512"
          ) -> ScramExchange:
    server, client = exchange(), ScramClient([mechanism], user, password)
    client.set_server_first(server.step(mechanism, client.get_client_first().encode()).decode())
    client.set_server_final(server.step("", client.get_client_final().encode()).decode())
    return server


def test_the_right_password_logs_in_as_the_user() -> None:
    server = login("secret")
    assert server.state is ExchangeState.DONE
    assert server.principal == Principal("alice")
    assert not server.principal.is_service


@pytest.mark.parametrize("user,password,mechanism", [
    ("alice", "wrong", "SCRAM-SHA-512"),
    ("mallory", "secret", "SCRAM-SHA-512"),  # unknown user: the same answer
    ("alice", "secret", "SCRAM-SHA-256"),  # no credential for that mechanism
])
def test_bad_credentials_fail_with_one_message(user: str, password: str, mechanism: str) -> None:
    with pytest.raises(SaslExchangeError) as failed:
        login(password, user, mechanism)
    assert failed.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert "invalid credentials" in str(failed.value)
    assert "mallory" not in str(failed.value) and "alice" not in str(failed.value)


def test_unsupported_mechanism_and_out_of_order_and_garbage() -> None:
    with pytest.raises(SaslExchangeError) as unsupported:
        exchange().step("PLAIN", b"\0alice\0secret")
    assert unsupported.value.code is ErrorCode.UNSUPPORTED_SASL_MECHANISM

    # The client-final first: not a client-first message.
    client = ScramClient(["SCRAM-SHA-512"], "alice", "secret")
    server = exchange()
    with pytest.raises(SaslExchangeError) as garbled:
        server.step("SCRAM-SHA-512", b"c=biws,r=abc,p=xyz")
    assert garbled.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
    with pytest.raises(SaslExchangeError) as after_failure:
        server.step("SCRAM-SHA-512", client.get_client_first().encode())
    assert after_failure.value.code is ErrorCode.ILLEGAL_SASL_STATE
    assert server.principal is None

    done = login("secret")
    with pytest.raises(SaslExchangeError) as again:
        done.step("SCRAM-SHA-512", b"n,,n=alice,r=x")
    assert again.value.code is ErrorCode.ILLEGAL_SASL_STATE

    for junk in (b"\xff\xfe", b"n" * (MAX_SCRAM_MESSAGE_BYTES + 1), b""):
        with pytest.raises(SaslExchangeError) as bad:
            exchange().step("SCRAM-SHA-512", junk)
        assert bad.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED


def test_session_tokens_map_to_principals_and_forget_the_oldest() -> None:
    tokens = SessionTokens(max_sessions=2)
    first = tokens.issue(Principal("alice"))
    second = tokens.issue(Principal("bob"))
    assert first != second and len(first) >= 40
    assert tokens.principal_of(first) == Principal("alice")
    assert tokens.principal_of(None) is None and tokens.principal_of("") is None
    assert tokens.principal_of("forged") is None
    tokens.issue(Principal("carol"))
    assert tokens.principal_of(first) is None and tokens.principal_of(second) == Principal("bob")
    with pytest.raises(ValueError):
        tokens.issue(Principal("broker-0", is_service=True))


class ManualClock:
    """An injected monotonic clock (seconds) the test moves by hand."""

    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def test_session_tokens_expire_after_their_lifetime_and_never_come_back() -> None:
    clock = ManualClock()
    tokens = SessionTokens(lifetime=SessionLifetime(2000), clock=clock)
    token = tokens.issue(Principal("alice"))
    assert tokens.check(token) == SessionCheck(SessionState.VALID, Principal("alice"))
    clock.now += 1.999
    assert tokens.principal_of(token) == Principal("alice")
    clock.now += 0.001
    assert tokens.check(token) == SessionCheck(SessionState.EXPIRED)
    assert tokens.principal_of(token) is None
    assert tokens.check(None).state is SessionState.MISSING
    assert tokens.check("forged").state is SessionState.UNKNOWN
    # A renewal is a new login and a new token, valid for a whole lifetime again.
    renewed = tokens.issue(Principal("alice"))
    assert renewed != token and tokens.principal_of(renewed) == Principal("alice")
    assert "expired (connections.max.reauth.ms=2000)" in \
        tokens.check(token).refusal(tokens.lifetime)
    assert "unknown session token" in tokens.check("forged").refusal(tokens.lifetime)


def test_long_expired_tokens_are_forgotten_and_lifetime_zero_keeps_them() -> None:
    clock = ManualClock()
    tokens = SessionTokens(lifetime=SessionLifetime(1000), clock=clock)
    old = tokens.issue(Principal("alice"))
    clock.now += 1.5  # expired, but within one more lifetime: still told apart as expired
    tokens.issue(Principal("bob"))
    assert tokens.check(old).state is SessionState.EXPIRED and len(tokens) == 2
    clock.now += 0.5
    tokens.issue(Principal("carol"))
    assert tokens.check(old).state is SessionState.UNKNOWN and len(tokens) == 2

    forever = SessionTokens(lifetime=SessionLifetime(0), clock=clock)
    kept = forever.issue(Principal("alice"))
    clock.now += 10**9
    forever.issue(Principal("bob"))
    assert forever.principal_of(kept) == Principal("alice")


def test_lifetime_config_parses_kafkas_key_and_names_bad_values() -> None:
    assert connections_max_reauth_ms({}) == DEFAULT_CONNECTIONS_MAX_REAUTH_MS == 3_600_000
    assert connections_max_reauth_ms({"connections.max.reauth.ms": " 0 "}) == 0
    assert connections_max_reauth_ms({"connections.max.reauth.ms": "5000"}) == 5000
    for bad, message in (("-1", "below the minimum 0"), ("soon", "expected an integer")):
        with pytest.raises(ConfigError, match=f"^connections.max.reauth.ms: .*{message}"):
            connections_max_reauth_ms({"connections.max.reauth.ms": bad})
    with pytest.raises(ValueError):
        SessionLifetime(-1)


@given(lifetime_ms=st.integers(1, 10**9), fraction=st.floats(0.85, 0.95),
       started_at=st.floats(0, 10**6), server_delay=st.floats(0, 10))
def test_a_client_renews_before_the_server_expires_its_token(
    lifetime_ms: int, fraction: float, started_at: float, server_delay: float
) -> None:
    """The client counts from before its login was sent, the server from when it issued the
    token (no earlier): the renewal point is always before the server's expiry."""
    session = ClientSession("t", lifetime_ms, started_at, fraction)
    server_expiry = SessionLifetime(lifetime_ms).expires_at(started_at + server_delay)
    assert session.renew_at is not None and server_expiry is not None
    assert session.renew_at < server_expiry
    assert not session.renewal_due(started_at)
    assert session.renewal_due(session.renew_at)


def test_client_session_without_a_lifetime_never_renews_and_checks_its_fraction() -> None:
    assert not ClientSession("t", 0, 0.0).renewal_due(10**12)
    jittered = {ClientSession("t", 1000, 0.0).renew_at for _ in range(20)}
    assert len(jittered) > 1 and all(r is not None and 0.85 <= r <= 0.95 for r in jittered)
    with pytest.raises(ValueError):
        ClientSession("t", 1000, 0.0, fraction=0.99)
