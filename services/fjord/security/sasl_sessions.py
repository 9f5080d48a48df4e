"""SASL SCRAM for Fjord's own gRPC clients, pure: the exchange and the session tokens.

A service's SASL gRPC door (TLS without client certificates, or plaintext for
SASL_PLAINTEXT) serves ``fjord.v1.Sasl/Authenticate``: one bidirectional stream per login
carrying RFC 5802's SCRAM messages, the server side being the ``scramp`` library's fed the
credential the controller stores (never a password), as on the Kafka listener
(:mod:`fjord.kafka.sasl`). Success yields a random session token; the client sends it in
the ``fjord-sasl-session`` metadata of every later call on that door, and the door maps it to
``User:<name>`` (:class:`SessionTokens`).

:class:`ScramExchange` is one login. Invariants: the state only moves forward (FIRST ->
FINAL -> DONE, or FAILED, after which nothing is accepted); :attr:`ScramExchange.principal`
is set only in DONE and is never the cluster service identity; a wrong password, an unknown
user and a malformed message all fail with one message (the answer does not tell which
users exist); a message out of order is ILLEGAL_SASL_STATE.
"""

from __future__ import annotations

import contextvars
import enum
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterable

from scramp import ScramException, ScramMechanism

from fjord.errors import ErrorCode, FjordError
from fjord.security.principal import Principal
from fjord.security.scram import CredentialLookup, check_mechanism

#: The gRPC metadata key carrying a session token on a SASL door.
SESSION_METADATA_KEY = "fjord-sasl-session"
#: A SCRAM message is a few hundred bytes; anything above this fails the login unread
#: (Kafka's ``sasl.server.max.receive.size`` is 512 KiB for the whole frame).
MAX_SCRAM_MESSAGE_BYTES = 8192
#: Tokens kept per process; the oldest is forgotten first (its client logs in again).
DEFAULT_MAX_SESSIONS = 65536
AUTHENTICATION_FAILED_MESSAGE = "Authentication failed: invalid credentials"


class SaslExchangeError(FjordError):
    """A login that failed: ``code`` is SASL_AUTHENTICATION_FAILED,
    UNSUPPORTED_SASL_MECHANISM or ILLEGAL_SASL_STATE."""


class ExchangeState(enum.Enum):
    FIRST = "first"  # expecting the mechanism and the client-first message
    FINAL = "final"  # expecting the client-final message
    DONE = "done"
    FAILED = "failed"


def unescape_saslname(name: str) -> str:
    """RFC 5802's saslname: ``=2C`` is ``,`` and ``=3D`` is ``=``."""
    return name.replace("=2C", ",").replace("=3D", "=")


class ScramExchange:
    """One SCRAM login (see the module docstring)."""

    def __init__(self, mechanisms: Iterable[str], lookup: CredentialLookup) -> None:
        self.mechanisms = tuple(check_mechanism(m) for m in mechanisms)
        if not self.mechanisms:
            raise ValueError("a SASL door needs at least one mechanism")
        self._lookup = lookup
        self.state = ExchangeState.FIRST
        self.principal: Principal | None = None
        self.username = ""
        self._mechanism = ""
        self._server: object | None = None

    def step(self, mechanism: str, message: bytes) -> bytes:
        """The server's answer to the next client message (``mechanism`` is read only with
        the first); raises :class:`SaslExchangeError`, after which the exchange is FAILED."""
        if self.state is ExchangeState.FIRST:
            return self._first(mechanism, message)
        if self.state is ExchangeState.FINAL:
            return self._final(message)
        self.state = ExchangeState.FAILED
        raise SaslExchangeError(
            "SASL message after the exchange ended (re-authentication is a new login)",
            ErrorCode.ILLEGAL_SASL_STATE,
        )

    def _fail(self, exc: BaseException | None = None) -> SaslExchangeError:
        self.state = ExchangeState.FAILED
        error = SaslExchangeError(
            f"{AUTHENTICATION_FAILED_MESSAGE} with SASL mechanism {self._mechanism}",
            ErrorCode.SASL_AUTHENTICATION_FAILED,
        )
        error.__cause__ = exc
        return error

    def _decode(self, message: bytes) -> str:
        if len(message) > MAX_SCRAM_MESSAGE_BYTES:
            raise self._fail()
        try:
            return message.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._fail(exc) from exc

    def _first(self, mechanism: str, message: bytes) -> bytes:
        if mechanism not in self.mechanisms:
            self.state = ExchangeState.FAILED
            raise SaslExchangeError(
                f"unsupported SASL mechanism {mechanism!r}; enabled: "
                f"{', '.join(self.mechanisms)}",
                ErrorCode.UNSUPPORTED_SASL_MECHANISM,
            )
        self._mechanism = mechanism
        text = self._decode(message)
        try:
            server = ScramMechanism(mechanism).make_server(self._auth_info)
            server.set_client_first(text)
            answer = server.get_server_first()
        except (ScramException, _UnknownUser, ValueError) as exc:
            raise self._fail(exc) from exc
        self._server = server
        self.state = ExchangeState.FINAL
        return answer.encode("utf-8")

    def _final(self, message: bytes) -> bytes:
        text = self._decode(message)
        server = self._server
        assert server is not None
        try:
            server.set_client_final(text)  # type: ignore[attr-defined]
            answer = server.get_server_final()  # type: ignore[attr-defined]
        except (ScramException, ValueError) as exc:
            raise self._fail(exc) from exc
        self.state = ExchangeState.DONE
        self.principal = Principal(self.username)
        return str(answer).encode("utf-8")

    def _auth_info(self, username: str) -> tuple[bytes, bytes, bytes, int]:
        name = unescape_saslname(username)
        self.username = name
        credential = self._lookup(self._mechanism, name) if name else None
        if credential is None:
            raise _UnknownUser(name)
        return credential.auth_info()


class _UnknownUser(Exception):
    """No credential for the user and mechanism (failed like a wrong password)."""


class SessionTokens:
    """Session token -> principal of one process's SASL door.

    Invariants: a token is 256 random bits (``secrets``), issued only for a completed
    exchange; at most ``max_sessions`` are kept (the oldest issued is forgotten first, its
    client is then UNAUTHENTICATED and logs in again); thread-safe. Sessions do not expire
    otherwise, as Kafka's SASL connections without re-authentication (KIP-368)."""

    def __init__(self, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        self.max_sessions = max_sessions
        self._by_token: OrderedDict[str, Principal] = OrderedDict()
        self._lock = threading.Lock()

    def issue(self, principal: Principal) -> str:
        if principal.is_service:
            raise ValueError("a SASL session is never the cluster service identity")
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._by_token[token] = principal
            while len(self._by_token) > self.max_sessions:
                self._by_token.popitem(last=False)
        return token

    def principal_of(self, token: str | None) -> Principal | None:
        """The principal of ``token``, None for a missing or unknown one."""
        if not token:
            return None
        with self._lock:
            return self._by_token.get(token)

    def __len__(self) -> int:
        return len(self._by_token)


#: The principal of the SASL session whose call is being served (set by the SASL door around
#: each handler, None elsewhere): what :func:`fjord.tls.grpc_peer_principal` answers there.
SASL_SESSION_PRINCIPAL: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "fjord_sasl_session_principal", default=None
)
