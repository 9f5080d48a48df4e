"""The gRPC SASL door's pure core: a SCRAM exchange against stored credentials (scramp's
client on the other side) and the session token table."""

from __future__ import annotations

import pytest
from scramp import ScramClient

from fjord.errors import ErrorCode
from fjord.security import Principal
from fjord.security.sasl_sessions import (
    MAX_SCRAM_MESSAGE_BYTES,
    ExchangeState,
    SaslExchangeError,
    ScramExchange,
    SessionTokens,
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
