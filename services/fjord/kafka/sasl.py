"""One Kafka connection's SASL authentication (SASL_PLAINTEXT:// and SASL_SSL:// doors), pure.

:class:`SaslConnection` sees every request frame of its connection until the client is
authenticated, Kafka's way (SaslServerAuthenticator):

- Before authentication only ApiVersions (passed on to the dispatcher), SaslHandshake (v1) and
  SaslAuthenticate (v0..2) are allowed; anything else, or a SASL request out of order, closes
  the connection (:class:`~fjord.kafka.dispatch.Close`): Kafka's IllegalSaslStateException.
- SaslHandshake names the mechanism; one not enabled is answered UNSUPPORTED_SASL_MECHANISM
  with the enabled list, then the connection closes.
- SaslAuthenticate carries the SCRAM messages (client-first, then client-final); the exchange
  is :class:`~fjord.security.sasl_sessions.ScramExchange` (the ``scramp`` library's server,
  fed the stored credential, never a password), shared with the SASL gRPC doors. A wrong
  password, unknown user or malformed SCRAM message is answered SASL_AUTHENTICATION_FAILED
  (one message for all, so the answer does not tell which users exist), then the connection
  closes.
- Success sets :attr:`principal` to ``User:<name>``; from then on every frame goes to the
  dispatcher with that principal. SaslAuthenticate v1+ answers ``session_lifetime_ms`` with
  the final message: ``connections.max.reauth.ms`` (:class:`~fjord.security.sasl_sessions.
  SessionLifetime`; 0 when it is 0, sessions then never expire).
- Re-authentication (KIP-368), Kafka's way: a SaslHandshake on an authenticated connection
  starts a new exchange (even after the session expired; the other requests wait for it, the
  client sends none meanwhile). It must name the mechanism of the first login (another one is
  answered UNSUPPORTED_SASL_MECHANISM and the connection closes) and log in as the same user
  ("Cannot change principals during re-authentication": SASL_AUTHENTICATION_FAILED, closed);
  success starts a new session lifetime. A failed re-authentication (the credential was
  deleted or the password changed since) closes the connection: that is when a deleted user
  loses a live connection, never earlier.
- Once the session has expired, the next request that is not a SaslHandshake closes the
  connection (Kafka: "expired connections killed"); a client that does not re-authenticate
  in time reconnects and logs in again.
- Before authentication a frame larger than :attr:`max_receive_bytes` (Kafka's
  ``sasl.server.max.receive.size``, 512 KiB) closes the connection without being read.

Invariants: the state only moves forward (HANDSHAKE -> FIRST -> FINAL -> DONE, or FAILED, after
which nothing is accepted), except that a re-authentication moves DONE back to FIRST;
:attr:`principal` is set by the first success and never changes afterwards; no frame reaches
the dispatcher after the session expired (the clock is injected: tests use their own).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable
from dataclasses import dataclass

from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from fjord.errors import ErrorCode
from fjord.kafka.codec import MalformedFrameError, decode_request, encode_response, peek_prefix
from fjord.kafka.dispatch import API_VERSIONS_KEY, Close, Reply
from fjord.security import Principal
from fjord.security.sasl_sessions import (
    CONNECTIONS_MAX_REAUTH_MS_KEY,
    Clock,
    SaslExchangeError,
    ScramExchange,
    SessionLifetime,
)
from fjord.security.scram import CredentialLookup, check_mechanism

SASL_HANDSHAKE_KEY = 17
SASL_AUTHENTICATE_KEY = 36
#: Versions served and advertised. SaslHandshake v0 (raw SASL tokens without Kafka framing)
#: is not served: every client that speaks SaslAuthenticate uses v1.
SASL_HANDSHAKE_VERSIONS = (1, 1)
SASL_AUTHENTICATE_VERSIONS = (0, 2)
SASL_API_VERSIONS: dict[int, tuple[int, int]] = {
    SASL_HANDSHAKE_KEY: SASL_HANDSHAKE_VERSIONS,
    SASL_AUTHENTICATE_KEY: SASL_AUTHENTICATE_VERSIONS,
}
#: Kafka's ``sasl.server.max.receive.size`` default.
SASL_MAX_RECEIVE_BYTES = 524288
AUTHENTICATION_FAILED_MESSAGE = "Authentication failed: invalid credentials"


class SaslState(enum.Enum):
    HANDSHAKE = "handshake"  # expecting ApiVersions or SaslHandshake
    FIRST = "first"  # expecting SaslAuthenticate with the SCRAM client-first message
    FINAL = "final"  # expecting SaslAuthenticate with the SCRAM client-final message
    DONE = "done"  # authenticated: frames go to the dispatcher
    FAILED = "failed"  # an answer was sent and the connection is closing


@dataclass(frozen=True, slots=True)
class ReplyThenClose:
    """Send ``frame``, then close the connection (``reason`` is logged)."""

    frame: bytes | bytearray
    reason: str


class SaslConnection:
    """The SASL state of one connection; see the module docstring."""

    def __init__(
        self,
        mechanisms: Iterable[str],
        lookup: CredentialLookup,
        max_receive_bytes: int = SASL_MAX_RECEIVE_BYTES,
        lifetime: SessionLifetime | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.mechanisms = tuple(check_mechanism(m) for m in mechanisms)
        if not self.mechanisms:
            raise ValueError("a SASL door needs at least one mechanism")
        self.max_receive_bytes = max_receive_bytes
        self.lifetime = lifetime if lifetime is not None else SessionLifetime()
        self._clock = clock
        self._lookup = lookup
        self.state = SaslState.HANDSHAKE
        self.principal: Principal | None = None
        #: Successful authentications of this connection (the first and re-authentications).
        self.authentications = 0
        #: When the current session ends (clock seconds; None: never, or not authenticated).
        self.expires_at: float | None = None
        #: True once the connection is being closed because its session expired.
        self.closed_expired = False
        self._mechanism = ""
        self._exchange = ScramExchange(self.mechanisms, lookup)

    @property
    def authenticated(self) -> bool:
        return self.state is SaslState.DONE

    def frame_size_allowed(self, size: int) -> bool:
        """Whether a frame of ``size`` bytes may be read (always, once authenticated)."""
        return self.authenticated or size <= self.max_receive_bytes

    def on_frame(self, frame: bytes | memoryview) -> Reply | ReplyThenClose | Close | None:
        """The answer to one request frame, or None: pass it to the dispatcher (ApiVersions
        before authentication, anything but SASL after it)."""
        try:
            prefix = peek_prefix(frame)
        except MalformedFrameError as exc:
            return self._fail_close(str(exc))
        key = prefix.api_key
        if self.state is SaslState.DONE:
            if key == SASL_HANDSHAKE_KEY:
                self._exchange = ScramExchange(self.mechanisms, self._lookup)
                self.state = SaslState.HANDSHAKE
                return self._handshake(frame, prefix.api_version, prefix.correlation_id)
            if key == SASL_AUTHENTICATE_KEY:
                return self._fail_close(
                    "SaslAuthenticate on an authenticated connection without a SaslHandshake"
                )
            if self.session_expired():
                self.closed_expired = True
                return self._fail_close(
                    f"SASL session of {self.principal} expired "
                    f"({CONNECTIONS_MAX_REAUTH_MS_KEY}={self.lifetime.max_reauth_ms}) and the "
                    "client did not re-authenticate"
                )
            return None
        if self.state is SaslState.FAILED:
            return Close("request after a failed SASL authentication")
        if key == API_VERSIONS_KEY and self.state is SaslState.HANDSHAKE:
            return None
        if key == SASL_HANDSHAKE_KEY and self.state is SaslState.HANDSHAKE:
            return self._handshake(frame, prefix.api_version, prefix.correlation_id)
        if key == SASL_AUTHENTICATE_KEY and self.state in (SaslState.FIRST, SaslState.FINAL):
            return self._authenticate(frame, prefix.api_version, prefix.correlation_id)
        return self._fail_close(
            f"API key {key} not allowed in SASL state {self.state.value} "
            "(unexpected request before authentication)"
        )

    @property
    def reauthenticating(self) -> bool:
        return self.authentications > 0 and self.state is not SaslState.DONE

    def session_expired(self) -> bool:
        """Whether the current session has ended (False before the first authentication)."""
        return SessionLifetime.expired(self.expires_at, self._clock())

    def _fail_close(self, reason: str) -> Close:
        self.state = SaslState.FAILED
        return Close(reason)

    def _handshake(
        self, frame: bytes | memoryview, version: int, correlation_id: int
    ) -> Reply | ReplyThenClose | Close:
        low, high = SASL_HANDSHAKE_VERSIONS
        if not low <= version <= high:
            return self._fail_close(f"unsupported SaslHandshake version {version}")
        try:
            request = decode_request(frame, SaslHandshakeRequest, version)
        except MalformedFrameError as exc:
            return self._fail_close(str(exc))
        requested = str(request.mechanism or "")
        response_class = SaslHandshakeResponse[version]
        # Re-authentication keeps the mechanism of the first login (Kafka's rule).
        allowed = (self._mechanism,) if self.reauthenticating else self.mechanisms
        if requested not in allowed:
            self.state = SaslState.FAILED
            response = response_class(
                error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM.code,
                mechanisms=list(allowed),
            )
            return ReplyThenClose(
                encode_response(response, correlation_id, version),
                f"unsupported SASL mechanism {requested!r}"
                + (f" for re-authentication of {self._mechanism}" if self.reauthenticating
                   else ""),
            )
        self._mechanism = requested
        self.state = SaslState.FIRST
        response = response_class(error_code=0, mechanisms=list(self.mechanisms))
        return Reply(encode_response(response, correlation_id, version))

    def _authenticate(
        self, frame: bytes | memoryview, version: int, correlation_id: int
    ) -> Reply | ReplyThenClose | Close:
        low, high = SASL_AUTHENTICATE_VERSIONS
        if not low <= version <= high:
            return self._fail_close(f"unsupported SaslAuthenticate version {version}")
        try:
            request = decode_request(frame, SaslAuthenticateRequest, version)
        except MalformedFrameError as exc:
            return self._fail_close(str(exc))
        response_class = SaslAuthenticateResponse[version]
        try:
            answer = self._exchange.step(self._mechanism, bytes(request.auth_bytes or b""))
        except SaslExchangeError as exc:
            self.state = SaslState.FAILED
            response = response_class(
                error_code=ErrorCode.SASL_AUTHENTICATION_FAILED.code,
                error_message=(
                    f"{AUTHENTICATION_FAILED_MESSAGE} with SASL mechanism {self._mechanism}"
                ),
                auth_bytes=b"",
                **_lifetime(version),
            )
            return ReplyThenClose(
                encode_response(response, correlation_id, version),
                f"SASL {self._mechanism} authentication failed for "
                f"{self._exchange.username or '<no user>'!r}: "
                f"{type(exc.__cause__ or exc).__name__}",
            )
        authenticated = self._exchange.principal
        if authenticated is None:
            self.state = SaslState.FINAL
            response = response_class(
                error_code=0, error_message=None, auth_bytes=answer, **_lifetime(version),
            )
            return Reply(encode_response(response, correlation_id, version))
        if self.principal is not None and authenticated != self.principal:
            self.state = SaslState.FAILED
            message = (f"Cannot change principals during re-authentication from "
                       f"{self.principal}: {authenticated}")
            response = response_class(
                error_code=ErrorCode.SASL_AUTHENTICATION_FAILED.code, error_message=message,
                auth_bytes=b"", **_lifetime(version),
            )
            return ReplyThenClose(encode_response(response, correlation_id, version), message)
        self.state = SaslState.DONE
        self.principal = authenticated
        self.authentications += 1
        self.expires_at = self.lifetime.expires_at(self._clock())
        response = response_class(
            error_code=0, error_message=None, auth_bytes=answer,
            **_lifetime(version, self.lifetime.max_reauth_ms),
        )
        return Reply(encode_response(response, correlation_id, version))


def _lifetime(version: int, lifetime_ms: int = 0) -> dict[str, int]:
    # v1+: session_lifetime_ms, set in the final answer of a success (KIP-368); 0 means the
    # session does not expire (no re-authentication needed).
    return {"session_lifetime_ms": lifetime_ms} if version >= 1 else {}
