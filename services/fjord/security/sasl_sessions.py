"""SASL SCRAM for Fjord's own gRPC clients, pure: the exchange and the session tokens.

A service's SASL gRPC door (TLS without client certificates, or plaintext for
SASL_PLAINTEXT) serves ``fjord.v1.Sasl/Authenticate``: one bidirectional stream per login
carrying RFC 5802's SCRAM messages, the server side being the ``scramp`` library's fed the
credential the controller stores (never a password), as on the Kafka listener
(:mod:`fjord.kafka.sasl`). Success yields a random session token; the client sends it in
the ``fjord-sasl-session`` metadata of every later call on that door, and the door maps it to
``User:<name>`` (:class:`SessionTokens`).

Session lifetime (KIP-368, Kafka's ``connections.max.reauth.ms``): :class:`SessionLifetime`
decides when a session authenticated at some instant expires, for both the gRPC door's tokens
and a Kafka-protocol connection (:mod:`fjord.kafka.sasl`). Fjord's default is one hour, not
Kafka's 0 (never): a token is a bearer secret that outlives any one connection, so a bounded
lifetime is what makes a deleted user or a changed password take effect (at the session's next
re-login, never by killing it at once, as Kafka). Clients renew at a random point between 85%
and 95% of the lifetime (:class:`ClientSession`, Kafka's client rule), so they never present an
expired token in normal operation.

:class:`ScramExchange` is one login. Invariants: the state only moves forward (FIRST ->
FINAL -> DONE, or FAILED, after which nothing is accepted); :attr:`ScramExchange.principal`
is set only in DONE and is never the cluster service identity; a wrong password, an unknown
user and a malformed message all fail with one message (the answer does not tell which
users exist); a message out of order is ILLEGAL_SASL_STATE.
"""

from __future__ import annotations

import enum
import random
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from scramp import ScramException, ScramMechanism

from fjord.errors import ConfigError, ErrorCode, FjordError

# SASL_SESSION_PRINCIPAL lives with Principal (fjord.tls reads it without importing scramp);
# re-exported here, where the SASL door and the broker found it.
from fjord.security.principal import SASL_SESSION_PRINCIPAL as SASL_SESSION_PRINCIPAL
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
#: Kafka's broker config name for the longest a SASL session lives without re-authenticating.
CONNECTIONS_MAX_REAUTH_MS_KEY = "connections.max.reauth.ms"
#: Fjord's default (Kafka's is 0, never; see the module docstring for why Fjord bounds it).
DEFAULT_CONNECTIONS_MAX_REAUTH_MS = 3_600_000
#: A client renews its session at a random fraction of the lifetime in this range (Kafka's
#: clients: 85% to 95%), so many clients that logged in together do not renew together.
RENEW_FRACTION = (0.85, 0.95)

#: Seconds on a monotonic clock (``time.monotonic``; tests inject their own).
Clock = Callable[[], float]


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


def connections_max_reauth_ms(config: Mapping[str, str]) -> int:
    """``connections.max.reauth.ms`` of a service's config (its default when absent): an
    integer >= 0, 0 meaning sessions never expire (Kafka's default); ConfigError naming the
    key otherwise."""
    raw = config.get(CONNECTIONS_MAX_REAUTH_MS_KEY)
    if raw is None:
        return DEFAULT_CONNECTIONS_MAX_REAUTH_MS
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(
            f"{CONNECTIONS_MAX_REAUTH_MS_KEY}: expected an integer (ms), got {raw!r}"
        ) from None
    if value < 0:
        raise ConfigError(f"{CONNECTIONS_MAX_REAUTH_MS_KEY}: {value} is below the minimum 0")
    return value


@dataclass(frozen=True, slots=True)
class SessionLifetime:
    """How long a SASL session lives after its (re-)authentication: ``max_reauth_ms``
    (Kafka's ``connections.max.reauth.ms``), 0 meaning forever.

    Pure; the instant of authentication comes from the caller's clock. A session
    authenticated at ``t`` is expired at every instant ``>= t + max_reauth_ms / 1000``
    (so a lifetime never lasts longer than configured), never when the lifetime is 0. The
    lifetime answered to a client (SaslAuthenticate's ``session_lifetime_ms``, the door's
    ``session_lifetime_ms``) is ``max_reauth_ms``: SCRAM credentials carry no expiry of their
    own, which in Kafka is the only thing that could shorten it."""

    max_reauth_ms: int = DEFAULT_CONNECTIONS_MAX_REAUTH_MS

    def __post_init__(self) -> None:
        if self.max_reauth_ms < 0:
            raise ValueError(f"{CONNECTIONS_MAX_REAUTH_MS_KEY} must be >= 0")

    @property
    def bounded(self) -> bool:
        return self.max_reauth_ms > 0

    def expires_at(self, authenticated_at: float) -> float | None:
        """The clock instant the session ends (None: never)."""
        return authenticated_at + self.max_reauth_ms / 1000 if self.bounded else None

    @staticmethod
    def expired(expires_at: float | None, now: float) -> bool:
        return expires_at is not None and now >= expires_at


class SessionState(enum.Enum):
    VALID = "valid"
    MISSING = "missing"  # no token sent
    UNKNOWN = "unknown"  # never issued here, or forgotten (restart, eviction)
    EXPIRED = "expired"  # issued here, past its lifetime: log in again


@dataclass(frozen=True, slots=True)
class SessionCheck:
    """What :meth:`SessionTokens.check` found: ``principal`` is set only when VALID."""

    state: SessionState
    principal: Principal | None = None

    def refusal(self, lifetime: SessionLifetime) -> str:
        """The message a refused call is aborted with (one per state, naming the way out)."""
        if self.state is SessionState.EXPIRED:
            return (
                f"SASL session expired ({CONNECTIONS_MAX_REAUTH_MS_KEY}="
                f"{lifetime.max_reauth_ms}): log in again with fjord.v1.Sasl/Authenticate"
            )
        return (
            f"SASL authentication required ({self.state.value} session token): log in with "
            "fjord.v1.Sasl/Authenticate and send its session token"
        )


class SessionTokens:
    """Session token -> principal of one process's SASL door, each until its expiry.

    Invariants: a token is 256 random bits (``secrets``), issued only for a completed
    exchange; it is VALID from :meth:`issue` until ``lifetime`` has passed on ``clock``, then
    EXPIRED (it never becomes valid again: a renewal is a new login and a new token); at most
    ``max_sessions`` are kept (the oldest issued is forgotten first, its client is then
    UNKNOWN and logs in again), and a token expired for longer than one lifetime is forgotten
    too (so the table holds only recent sessions); thread-safe."""

    def __init__(
        self,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        lifetime: SessionLifetime | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        self.max_sessions = max_sessions
        self.lifetime = lifetime if lifetime is not None else SessionLifetime()
        self._clock = clock
        # In issue order, which is also expiry order (one lifetime for all).
        self._by_token: OrderedDict[str, tuple[Principal, float | None]] = OrderedDict()
        self._lock = threading.Lock()

    def issue(self, principal: Principal) -> str:
        if principal.is_service:
            raise ValueError("a SASL session is never the cluster service identity")
        token = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            self._forget_long_expired(now)
            self._by_token[token] = (principal, self.lifetime.expires_at(now))
            while len(self._by_token) > self.max_sessions:
                self._by_token.popitem(last=False)
        return token

    def _forget_long_expired(self, now: float) -> None:
        grace = self.lifetime.max_reauth_ms / 1000
        while self._by_token:
            _, expires_at = next(iter(self._by_token.values()))
            if expires_at is None or now < expires_at + grace:
                return
            self._by_token.popitem(last=False)

    def check(self, token: str | None) -> SessionCheck:
        """Whether ``token`` may be used now, and whose it is."""
        if not token:
            return SessionCheck(SessionState.MISSING)
        with self._lock:
            entry = self._by_token.get(token)
        if entry is None:
            return SessionCheck(SessionState.UNKNOWN)
        principal, expires_at = entry
        if SessionLifetime.expired(expires_at, self._clock()):
            return SessionCheck(SessionState.EXPIRED)
        return SessionCheck(SessionState.VALID, principal)

    def principal_of(self, token: str | None) -> Principal | None:
        """The principal of ``token``, None for a missing, unknown or expired one."""
        return self.check(token).principal

    def __len__(self) -> int:
        return len(self._by_token)


class ClientSession:
    """A client's session at one SASL door: its token and when to renew it.

    Pure. Invariant: :meth:`renewal_due` turns true at a fixed random point in
    :data:`RENEW_FRACTION` of the lifetime the server answered (0: never), always before the
    server's expiry (the server's clock started no earlier than the client's login began,
    ``started_at``), so calls made in normal operation never carry an expired token."""

    def __init__(self, token: str, lifetime_ms: int, started_at: float,
                 fraction: float | None = None) -> None:
        if lifetime_ms < 0:
            raise ValueError("lifetime_ms must be >= 0")
        self.token = token
        self.lifetime_ms = lifetime_ms
        low, high = RENEW_FRACTION
        fraction = random.uniform(low, high) if fraction is None else fraction
        if not low <= fraction <= high:
            raise ValueError(f"fraction {fraction} outside {RENEW_FRACTION}")
        self.renew_at = (started_at + lifetime_ms / 1000 * fraction) if lifetime_ms else None

    def renewal_due(self, now: float) -> bool:
        return self.renew_at is not None and now >= self.renew_at
