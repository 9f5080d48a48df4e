"""SCRAM credentials and one connection's SASL state machine (fjord.kafka.sasl), driven with
real Kafka frames and scramp's client."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from kafka.protocol.metadata.api_versions import ApiVersionsRequest
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from scramp import ScramClient

from fjord.kafka.dispatch import Close, Reply
from fjord.kafka.sasl import ReplyThenClose, SaslConnection, SaslState
from fjord.security import Principal
from fjord.security.sasl_sessions import DEFAULT_CONNECTIONS_MAX_REAUTH_MS, SessionLifetime
from fjord.security.scram import ScramCredential, ScramCredentialError

USERS = {
    ("SCRAM-SHA-512", "alice"): ScramCredential.from_password("SCRAM-SHA-512", "secret"),
    ("SCRAM-SHA-256", "alice"): ScramCredential.from_password("SCRAM-SHA-256", "other"),
    ("SCRAM-SHA-512", "a,b=c"): ScramCredential.from_password("SCRAM-SHA-512", "x"),
}


class ManualClock:
    """An injected monotonic clock (seconds) the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _connection(lifetime_ms: int = DEFAULT_CONNECTIONS_MAX_REAUTH_MS,
                clock: ManualClock | None = None, users: dict[Any, Any] | None = None
                ) -> SaslConnection:
    stored = USERS if users is None else users
    return SaslConnection(["SCRAM-SHA-256", "SCRAM-SHA-512"], lambda m, u: stored.get((m, u)),
                          lifetime=SessionLifetime(lifetime_ms), clock=clock or ManualClock())


def _frame(request: Any, version: int, correlation_id: int = 5) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="unit")
    return bytes(request.encode(version=version, header=True))


def _decode(frame: bytes | bytearray, cls: Any, version: int) -> Any:
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    return cls.decode(frame[4:], version=version, header=True)


def _handshake(conn: SaslConnection, mechanism: str) -> Any:
    answer = conn.on_frame(_frame(SaslHandshakeRequest[1](mechanism=mechanism), 1))
    assert isinstance(answer, (Reply, ReplyThenClose)) and answer.frame is not None
    return answer, _decode(answer.frame, SaslHandshakeResponse, 1)


def _authenticate(conn: SaslConnection, message: str, version: int = 2) -> Any:
    request = SaslAuthenticateRequest[version](auth_bytes=message.encode())
    answer = conn.on_frame(_frame(request, version))
    if isinstance(answer, Close) or answer is None:
        return answer, None
    assert answer.frame is not None
    return answer, _decode(answer.frame, SaslAuthenticateResponse, version)


def _login(conn: SaslConnection, mechanism: str, user: str, password: str, version: int = 2
           ) -> tuple[Any, Any]:
    client = ScramClient([mechanism], user, password)
    _handshake(conn, mechanism)
    answer, first = _authenticate(conn, client.get_client_first(), version)
    assert isinstance(answer, Reply) and first.error_code == 0
    client.set_server_first(first.auth_bytes.decode())
    answer, final = _authenticate(conn, client.get_client_final(), version)
    if final.error_code == 0:
        client.set_server_final(final.auth_bytes.decode())  # the server proved it knows the key
    return answer, final


@pytest.mark.parametrize("mechanism,password", [("SCRAM-SHA-512", "secret"),
                                                ("SCRAM-SHA-256", "other")])
@pytest.mark.parametrize("version", [0, 1, 2])
def test_scram_login_sets_the_principal(mechanism: str, password: str, version: int) -> None:
    conn = _connection()
    assert conn.on_frame(_frame(ApiVersionsRequest[3](
        client_software_name="t", client_software_version="1"), 3)) is None
    answer, final = _login(conn, mechanism, "alice", password, version)
    assert isinstance(answer, Reply) and final.error_code == 0
    assert conn.state is SaslState.DONE and conn.principal == Principal("alice")
    # From now on frames go to the dispatcher, of any size.
    assert conn.on_frame(_frame(MetadataRequest[4](topics=None), 4)) is None
    assert conn.frame_size_allowed(10**8)


def test_saslname_escapes_are_undone() -> None:
    conn = _connection()
    _answer, final = _login(conn, "SCRAM-SHA-512", "a,b=c", "x")
    assert final.error_code == 0 and conn.principal == Principal("a,b=c")


@pytest.mark.parametrize("user,password", [("alice", "wrong"), ("nobody", "secret")])
def test_wrong_password_or_unknown_user_fails_alike_and_closes(user: str, password: str) -> None:
    conn = _connection()
    client = ScramClient(["SCRAM-SHA-512"], user, password)
    _handshake(conn, "SCRAM-SHA-512")
    answer, first = _authenticate(conn, client.get_client_first())
    if user == "nobody":
        assert isinstance(answer, ReplyThenClose) and first.error_code == 58
        message = first.error_message
    else:
        client.set_server_first(first.auth_bytes.decode())
        answer, final = _authenticate(conn, client.get_client_final())
        assert isinstance(answer, ReplyThenClose) and final.error_code == 58
        message = final.error_message
    assert "invalid credentials" in message and conn.principal is None
    assert conn.state is SaslState.FAILED
    assert isinstance(conn.on_frame(_frame(MetadataRequest[4](topics=None), 4)), Close)


def test_unsupported_mechanism_lists_the_enabled_ones_and_closes() -> None:
    conn = _connection()
    answer, response = _handshake(conn, "PLAIN")
    assert isinstance(answer, ReplyThenClose)
    assert response.error_code == 33
    assert response.mechanisms == ["SCRAM-SHA-256", "SCRAM-SHA-512"]


def test_requests_before_authentication_close_the_connection() -> None:
    conn = _connection()
    assert isinstance(conn.on_frame(_frame(MetadataRequest[4](topics=None), 4)), Close)
    assert conn.principal is None


@pytest.mark.parametrize("step", ["authenticate_first", "handshake_twice", "garbage_scram",
                                  "handshake_v0", "truncated"])
def test_out_of_order_or_malformed_sasl_closes(step: str) -> None:
    conn = _connection()
    if step == "authenticate_first":
        answer, _ = _authenticate(conn, "n,,n=alice,r=abc")
        assert isinstance(answer, Close)
    elif step == "handshake_twice":
        _handshake(conn, "SCRAM-SHA-512")
        answer = conn.on_frame(_frame(SaslHandshakeRequest[1](mechanism="SCRAM-SHA-512"), 1))
        assert isinstance(answer, Close)
    elif step == "garbage_scram":
        _handshake(conn, "SCRAM-SHA-512")
        answer, response = _authenticate(conn, "\x00 not scram")
        assert isinstance(answer, ReplyThenClose) and response.error_code == 58
    elif step == "handshake_v0":
        answer = conn.on_frame(_frame(SaslHandshakeRequest[0](mechanism="SCRAM-SHA-512"), 0))
        assert isinstance(answer, Close)
    else:
        frame = _frame(SaslHandshakeRequest[1](mechanism="SCRAM-SHA-512"), 1)
        assert isinstance(conn.on_frame(frame[:6]), Close)
    assert conn.state is SaslState.FAILED and conn.principal is None


METADATA = MetadataRequest[4](topics=None)


@pytest.mark.parametrize("version,answered", [(0, 0), (1, 5000), (2, 5000)])
def test_session_lifetime_is_answered_with_the_final_message(version: int, answered: Any
                                                              ) -> None:
    conn = _connection(5000)
    client = ScramClient(["SCRAM-SHA-512"], "alice", "secret")
    _handshake(conn, "SCRAM-SHA-512")
    _answer, first = _authenticate(conn, client.get_client_first(), version)
    client.set_server_first(first.auth_bytes.decode())
    _answer, final = _authenticate(conn, client.get_client_final(), version)
    # v0 has no such field on the wire (kafka-python decodes its absence as 0).
    assert getattr(final, "session_lifetime_ms", 0) == answered
    assert getattr(first, "session_lifetime_ms", 0) == 0  # only the final answer carries it


def test_an_expired_session_closes_on_its_next_request() -> None:
    clock = ManualClock()
    conn = _connection(5000, clock)
    _login(conn, "SCRAM-SHA-512", "alice", "secret")
    assert conn.expires_at == clock.now + 5.0
    clock.now += 4.999
    assert conn.on_frame(_frame(METADATA, 4)) is None  # still within the lifetime
    assert not conn.closed_expired
    clock.now += 0.001
    closed = conn.on_frame(_frame(METADATA, 4))
    assert conn.closed_expired  # what the listener counts (fjord_sasl_expired_sessions_total)
    assert isinstance(closed, Close) and "expired" in closed.reason
    assert "connections.max.reauth.ms=5000" in closed.reason
    assert conn.state is SaslState.FAILED
    assert isinstance(conn.on_frame(_frame(METADATA, 4)), Close)


def test_lifetime_zero_never_expires() -> None:
    clock = ManualClock()
    conn = _connection(0, clock)
    _answer, final = _login(conn, "SCRAM-SHA-512", "alice", "secret")
    assert final.session_lifetime_ms == 0 and conn.expires_at is None
    clock.now += 10**9
    assert conn.on_frame(_frame(METADATA, 4)) is None


@pytest.mark.parametrize("late", [False, True])
def test_reauthentication_renews_the_session_on_the_same_connection(late: bool) -> None:
    """KIP-368: SaslHandshake + SaslAuthenticate on an authenticated connection, in time or
    after the expiry (a handshake is never refused for lateness), starts a new lifetime."""
    clock = ManualClock()
    conn = _connection(5000, clock)
    _login(conn, "SCRAM-SHA-512", "alice", "secret")
    clock.now += 5.5 if late else 4.5
    answer, final = _login(conn, "SCRAM-SHA-512", "alice", "secret")
    assert isinstance(answer, Reply) and final.error_code == 0
    assert final.session_lifetime_ms == 5000
    assert conn.state is SaslState.DONE and conn.principal == Principal("alice")
    assert conn.authentications == 2 and conn.expires_at == clock.now + 5.0
    clock.now += 4.5
    assert conn.on_frame(_frame(METADATA, 4)) is None
    clock.now += 0.5
    assert isinstance(conn.on_frame(_frame(METADATA, 4)), Close)


def test_requests_during_reauthentication_and_a_bare_authenticate_close() -> None:
    conn = _connection(5000)
    _login(conn, "SCRAM-SHA-512", "alice", "secret")
    _handshake(conn, "SCRAM-SHA-512")
    assert conn.reauthenticating and not conn.frame_size_allowed(10**8)
    assert isinstance(conn.on_frame(_frame(METADATA, 4)), Close)

    other = _connection(5000)
    _login(other, "SCRAM-SHA-512", "alice", "secret")
    answer, _ = _authenticate(other, "n,,n=alice,r=abc")
    assert isinstance(answer, Close) and "without a SaslHandshake" in answer.reason


def test_reauthentication_keeps_the_mechanism_and_the_principal() -> None:
    conn = _connection(5000)
    _login(conn, "SCRAM-SHA-512", "alice", "secret")
    answer, response = _handshake(conn, "SCRAM-SHA-256")
    assert isinstance(answer, ReplyThenClose) and response.error_code == 33
    assert response.mechanisms == ["SCRAM-SHA-512"]
    assert "re-authentication of SCRAM-SHA-512" in answer.reason

    users = {**USERS, ("SCRAM-SHA-512", "bob"): ScramCredential.from_password(
        "SCRAM-SHA-512", "bob-pw")}
    conn = _connection(5000, users=users)
    _login(conn, "SCRAM-SHA-512", "alice", "secret")
    answer, final = _login(conn, "SCRAM-SHA-512", "bob", "bob-pw")
    assert isinstance(answer, ReplyThenClose) and final.error_code == 58
    assert final.error_message \
        == "Cannot change principals during re-authentication from User:alice: User:bob"
    assert conn.principal == Principal("alice") and conn.state is SaslState.FAILED


@pytest.mark.parametrize("change", ["deleted", "new_password"])
def test_a_deleted_or_changed_credential_fails_at_reauthentication_not_before(change: str
                                                                             ) -> None:
    """Kafka's rule: the live session goes on until its client re-authenticates (or it
    expires); the re-authentication then fails and closes the connection."""
    users = dict(USERS)
    clock = ManualClock()
    conn = _connection(5000, clock, users)
    _login(conn, "SCRAM-SHA-512", "alice", "secret")
    if change == "deleted":
        del users[("SCRAM-SHA-512", "alice")]
    else:
        users[("SCRAM-SHA-512", "alice")] = ScramCredential.from_password(
            "SCRAM-SHA-512", "rotated")
    clock.now += 4.0
    assert conn.on_frame(_frame(METADATA, 4)) is None  # the live session is not cut
    client = ScramClient(["SCRAM-SHA-512"], "alice", "secret")
    _handshake(conn, "SCRAM-SHA-512")
    answer, first = _authenticate(conn, client.get_client_first())
    if change == "new_password":
        assert first.error_code == 0
        client.set_server_first(first.auth_bytes.decode())
        answer, first = _authenticate(conn, client.get_client_final())
    assert isinstance(answer, ReplyThenClose) and first.error_code == 58
    assert conn.state is SaslState.FAILED
    assert isinstance(conn.on_frame(_frame(METADATA, 4)), Close)


def test_huge_frames_refused_only_before_authentication() -> None:
    conn = _connection()
    assert conn.frame_size_allowed(1000) and not conn.frame_size_allowed(524289)


def test_credential_round_trip_holds_no_password() -> None:
    password = "my secret!"  # spaces and "!" never occur in base64, so no false match
    credential = ScramCredential.from_password("scram-sha-256", password, iterations=8192)
    assert credential.mechanism == "SCRAM-SHA-256" and credential.iterations == 8192
    assert ScramCredential.from_json(credential.to_json()) == credential
    assert password not in str(credential.to_json())


@pytest.mark.parametrize("args,message", [
    (("SCRAM-SHA-1", "pw"), "unknown SCRAM mechanism"),
    (("SCRAM-SHA-512", "pw", 100), "iterations 100 outside"),
    (("SCRAM-SHA-512", ""), "must not be empty"),
])
def test_bad_credentials_are_typed_errors(args: Any, message: str) -> None:
    with pytest.raises(ScramCredentialError, match=message):
        ScramCredential.from_password(*args)
    with pytest.raises(ScramCredentialError, match="malformed"):
        ScramCredential.from_json({"mechanism": "SCRAM-SHA-512"})


def test_scram_users_are_watched_into_the_image() -> None:
    from fjord.metadata import MetadataImage
    from fjord.metadata.image import MetadataEvent
    from fjord.metadata.schema import ScramUser

    image = MetadataImage.empty("c1")
    credential = USERS[("SCRAM-SHA-512", "a,b=c")]
    key = image.keys.scram_user("a/b=c")
    assert image.keys.parse(key) is not None and "/" not in key.rsplit("scram-users/", 1)[1]
    put = MetadataEvent.put(key, ScramUser((credential,)).to_json(), 5, 5)
    image = image.apply([put])
    assert image.scram_credential("SCRAM-SHA-512", "a/b=c") == credential
    assert image.scram_credential("SCRAM-SHA-256", "a/b=c") is None
    image = image.apply([MetadataEvent.delete(key, 6)])
    assert image.scram_users == {}


def _upsert(user: str, mechanism_type: int = 2, iterations: int = 4096) -> Any:
    from fjord.security.scram import ScramUpsertion

    c = USERS[("SCRAM-SHA-512", "alice")]
    return ScramUpsertion(user, mechanism_type, iterations, c.salt, c.stored_key, c.server_key)


def test_alter_plan_applies_or_refuses_each_user_as_a_whole() -> None:
    from fjord.errors import ErrorCode
    from fjord.security.scram import ScramDeletion, plan_alter_scram

    current = {"bob": (USERS[("SCRAM-SHA-256", "alice")],)}
    changed, errors = plan_alter_scram(
        current,
        [ScramDeletion("bob", 1), ScramDeletion("carol", 1), ScramDeletion("dave", 2)],
        [_upsert("alice"), _upsert("carol"), _upsert("dave", 9), _upsert("erin", 2, 10),
         _upsert("frank"), _upsert("frank"), _upsert("")],
    )
    codes = {user: error.code if error else None for user, error in errors.items()}
    assert codes == {
        "alice": None, "bob": None,
        "carol": ErrorCode.RESOURCE_NOT_FOUND,  # its upsertion is not applied either
        "dave": ErrorCode.RESOURCE_NOT_FOUND,
        "erin": ErrorCode.UNACCEPTABLE_CREDENTIAL,
        "frank": ErrorCode.DUPLICATE_RESOURCE,
        "": ErrorCode.UNACCEPTABLE_CREDENTIAL,
    }
    assert changed == {"alice": (USERS[("SCRAM-SHA-512", "alice")],), "bob": ()}
    _, errors = plan_alter_scram({}, [], [_upsert("x", 9)])
    assert errors["x"] is not None and errors["x"].code is ErrorCode.UNSUPPORTED_SASL_MECHANISM


@pytest.mark.parametrize("text,expected", [
    ("SCRAM-SHA-512=[iterations=8192,password=pw]", [("SCRAM-SHA-512", "pw", 8192)]),
    ("SCRAM-SHA-256=[password=a=b],scram-sha-512=plain",
     [("SCRAM-SHA-256", "a=b", 4096), ("SCRAM-SHA-512", "plain", 4096)]),
])
def test_add_config_parses_as_kafka_configs(text: str, expected: Any) -> None:
    from fjord.cli.users_cmd import parse_scram_add_config

    assert parse_scram_add_config(text) == expected


@pytest.mark.parametrize("text,message", [
    ("SCRAM-SHA-512=[iterations=x,password=p]", "iterations must be a number"),
    ("SCRAM-SHA-512=[password=p", "unbalanced"),
    ("PLAIN=[password=p]", "unknown SCRAM mechanism"),
    ("SCRAM-SHA-512=[iterations=8192]", "a password is required"),
    ("SCRAM-SHA-512", "expected MECHANISM"),
])
def test_add_config_errors_name_the_problem(text: str, message: str) -> None:
    from fjord.cli.users_cmd import parse_scram_add_config

    with pytest.raises(ScramCredentialError, match=message):
        parse_scram_add_config(text)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_credential_from_salted_password_matches_scramp(mechanism: str) -> None:
    from scramp import ScramMechanism
    from scramp.core import hi

    salt = b"0123456789abcdef"
    expected = ScramCredential.from_password(mechanism, "pw", 4096, salt=salt)
    salted = hi(ScramMechanism(mechanism).hf, b"pw", salt, 4096)
    assert ScramCredential.from_salted_password(mechanism, salt, salted, 4096) == expected


def test_sasl_listener_names_parse_and_need_tls_settings_for_sasl_ssl() -> None:
    from fjord.broker.server import BrokerOptions
    from fjord.errors import ConfigError
    from fjord.kafka.listeners import (
        kafka_listener_uses_sasl,
        kafka_listener_uses_tls,
        parse_listeners,
        resolve_listeners,
    )

    assert parse_listeners("sasl_ssl://:9094,GRPC://:9093")["SASL_SSL"] == ("0.0.0.0", 9094)
    assert kafka_listener_uses_sasl("SASL_SSL://h:1") and kafka_listener_uses_tls("SASL_SSL://h:1")
    assert kafka_listener_uses_sasl("SASL_PLAINTEXT://h:1")
    assert not kafka_listener_uses_tls("SASL_PLAINTEXT://h:1")
    assert not kafka_listener_uses_sasl("SSL://h:1")
    with pytest.raises(ConfigError, match="one Kafka-protocol listener"):
        resolve_listeners(None, "SSL://h:1,SASL_SSL://h:2,GRPC://h:3", "", 9093)
    with pytest.raises(ConfigError, match="SASL_SSL:// listener needs --security-config"):
        BrokerOptions(broker_id=0, listen_host="h", listen_port=1, data_dir="d",  # type: ignore[arg-type]
                      etcd_url="http://e", cluster_id="c", kafka_tls=True, kafka_sasl=True)
