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
  dispatcher with that principal. Re-authentication (KIP-368) is not served: a SASL request
  after success closes the connection.
- Before authentication a frame larger than :attr:`max_receive_bytes` (Kafka's
  ``sasl.server.max.receive.size``, 512 KiB) closes the connection without being read.

Invariants: the state only moves forward (HANDSHAKE -> FIRST -> FINAL -> DONE, or FAILED, after
which nothing is accepted); :attr:`principal` is set only in DONE.
"""

from __future__ import annotations

import enum
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
from fjord.security.sasl_sessions import SaslExchangeError, ScramExchange
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
    ) -> None:
        self.mechanisms = tuple(check_mechanism(m) for m in mechanisms)
        if not self.mechanisms:
            raise ValueError("a SASL door needs at least one mechanism")
        self.max_receive_bytes = max_receive_bytes
        self.state = SaslState.HANDSHAKE
        self.principal: Principal | None = None
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
            if key in SASL_API_VERSIONS:
                return self._fail_close("SASL re-authentication is not supported")
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
        if requested not in self.mechanisms:
            self.state = SaslState.FAILED
            response = response_class(
                error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM.code,
                mechanisms=list(self.mechanisms),
            )
            return ReplyThenClose(
                encode_response(response, correlation_id, version),
                f"unsupported SASL mechanism {requested!r}",
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
        if self._exchange.principal is not None:
            self.state = SaslState.DONE
            self.principal = self._exchange.principal
        else:
            self.state = SaslState.FINAL
        response = response_class(
            error_code=0, error_message=None, auth_bytes=answer, **_lifetime(version),
        )
        return Reply(encode_response(response, correlation_id, version))


def _lifetime(version: int) -> dict[str, int]:
    # v1+: session_lifetime_ms; 0 means the session does not expire (no re-authentication).
    return {"session_lifetime_ms": 0} if version >= 1 else {}
