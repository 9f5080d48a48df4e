"""The Kafka listener's request dispatch and version negotiation: pure (no sockets, no clock).

A :class:`KafkaDispatcher` is built from the APIs one door serves (:class:`Api`: key, the
versions implemented, the kafka-python request/response classes and the handler). For each
request frame it decides, Kafka's way:

- ApiVersions is answered by the dispatcher itself from that table (so it advertises exactly
  what is implemented). An ApiVersions version it does not know gets a v0 response with
  UNSUPPORTED_VERSION and the table (KIP-511), so the client retries with a version it has.
- Any other unknown API key or unsupported version, and any frame that does not parse, closes
  the connection (:class:`Close`, with the reason for the log line): Kafka has no error
  response for a request it cannot read.
- Otherwise the decoded request goes to its handler; the handler returns the response message
  (``None``: no response, e.g. Produce with acks=0), encoded here with the request's
  correlation id at the request's version.

The hottest APIs (Produce, Fetch) decode with hand-written codecs (``Api.decoder``,
fjord.kafka.fastpath) and answer with an already encoded body
(:class:`~fjord.kafka.fastpath.EncodedResponse`); both are checked against kafka-python's
classes by property tests. Every other API goes through kafka-python.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse

from fjord.errors import ErrorCode
from fjord.kafka.codec import (
    MalformedFrameError,
    decode_request,
    encode_response,
    peek_prefix,
)
from fjord.kafka.fastpath import EncodedResponse
from fjord.kafka.zerocopy import FileBackedResponse, Part, SpliceError, splice_frame
from fjord.security import ANONYMOUS, Principal
from fjord.security.acls import Caller
from fjord.storage.region import FileRegion

log = logging.getLogger(__name__)

API_VERSIONS_KEY = 18
#: ApiVersions versions this dispatcher answers.
API_VERSIONS_VERSIONS = (0, 4)
UNSUPPORTED_VERSION = ErrorCode.UNSUPPORTED_VERSION.code


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What a handler knows about the request besides its body."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    #: Kafka's ``clientHost`` of the connection (``/127.0.0.1``; "" when unknown).
    client_host: str = ""
    #: Who sent it: ``User:<CN>`` of the connection's verified client certificate (SSL://
    #: doors), else ``User:ANONYMOUS`` (fjord.security.Principal; what ACLs will check).
    principal: Principal = ANONYMOUS
    #: The connection can take records by ``sendfile`` (a plaintext door): a Fetch handler may
    #: answer with a :class:`~fjord.kafka.zerocopy.FileBackedResponse`.
    zero_copy: bool = False
    #: The name of the listener (door) the request came in on, upper-case (``SSL``, ``SCRAM``):
    #: Metadata and FindCoordinator answer the addresses of this listener ("": unknown).
    listener: str = ""

    @property
    def caller(self) -> Caller:
        """Principal and address (without Kafka's ``/``) for the ACL checks."""
        return Caller(self.principal, self.client_host.lstrip("/"))


#: ``handler(request, context) -> response`` (a message of the response class at
#: ``context.api_version``), or None for no response.
Handler = Callable[[Any, RequestContext], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Api:
    """One API a door serves: versions ``min_version..max_version`` (inclusive) are
    implemented, tested and advertised."""

    key: int
    min_version: int
    max_version: int
    request_class: Any
    handler: Handler
    #: ``decoder(frame, version)``: a faster decoder than ``request_class``'s for every
    #: version served (raising MalformedFrameError on bad input); None: kafka-python's.
    decoder: Callable[[bytes | memoryview, int], Any] | None = None

    def __post_init__(self) -> None:
        low, high = self.request_class.valid_versions
        if not low <= self.min_version <= self.max_version <= high:
            raise ValueError(
                f"API {self.key}: versions {self.min_version}..{self.max_version} outside "
                f"the message spec's {low}..{high}"
            )


@dataclass(frozen=True, slots=True)
class Reply:
    """Send ``frame`` (None: nothing to send) and keep reading. ``parts`` (instead of
    ``frame``): a frame in pieces, bytes to write and file regions to ``sendfile``."""

    frame: bytes | bytearray | None
    parts: list[Part] | None = None


@dataclass(frozen=True, slots=True)
class Close:
    """Close the connection; ``reason`` is logged."""

    reason: str


@dataclass(frozen=True, slots=True)
class Call:
    """A decoded request waiting for its handler (:meth:`KafkaDispatcher.run`)."""

    api: Api
    request: Any
    context: RequestContext


class KafkaDispatcher:
    """Routes request frames to handlers. Invariant: every advertised (key, version) has a
    handler, and nothing else is advertised."""

    def __init__(self, apis: Iterable[Api], listener: str = "") -> None:
        #: APIs the connection layer answers itself (SaslHandshake/SaslAuthenticate on a SASL
        #: door): advertised in ApiVersions, never dispatched here.
        self._answered_elsewhere: dict[int, tuple[int, int]] = {}
        #: The listener name every request's context carries (RequestContext.listener).
        self.listener = listener
        self._apis: dict[int, Api] = {}
        for api in apis:
            if api.key in self._apis or api.key == API_VERSIONS_KEY:
                raise ValueError(f"API {api.key} registered twice")
            self._apis[api.key] = api

    def advertising(self, answered_elsewhere: dict[int, tuple[int, int]]) -> KafkaDispatcher:
        """The same dispatcher also advertising ``answered_elsewhere`` (key -> versions) that
        the connection layer serves itself (fjord.kafka.sasl on SASL doors)."""
        overlap = set(answered_elsewhere) & (set(self._apis) | {API_VERSIONS_KEY})
        if overlap:
            raise ValueError(f"APIs {sorted(overlap)} are already dispatched here")
        other = KafkaDispatcher(self._apis.values(), self.listener)
        other._answered_elsewhere = dict(answered_elsewhere)
        return other

    def on_listener(self, listener: str) -> KafkaDispatcher:
        """The same dispatcher for the door named ``listener`` (its requests' contexts carry
        the name)."""
        other = KafkaDispatcher(self._apis.values(), listener)
        other._answered_elsewhere = dict(self._answered_elsewhere)
        return other

    def supported(self) -> dict[int, tuple[int, int]]:
        """api_key -> (min, max) of every advertised API, ApiVersions included."""
        out = {API_VERSIONS_KEY: API_VERSIONS_VERSIONS}
        out.update(self._answered_elsewhere)
        out.update({k: (a.min_version, a.max_version) for k, a in self._apis.items()})
        return dict(sorted(out.items()))

    def api_versions_response(self, version: int, error_code: int = 0) -> Any:
        cls = ApiVersionsResponse[version]
        return cls(
            error_code=error_code,
            api_keys=[
                cls.ApiVersion(api_key=key, min_version=low, max_version=high)
                for key, (low, high) in self.supported().items()
            ],
            throttle_time_ms=0,
        )

    def prepare(
        self, frame: bytes | memoryview, client_host: str = "", principal: Principal = ANONYMOUS,
        zero_copy: bool = False,
    ) -> Reply | Close | Call:
        """Decode one request frame (size prefix excluded) that arrived from ``client_host``,
        without running its handler: the answer when the dispatcher gives it itself
        (ApiVersions, or a Close), else the :class:`Call` to :meth:`run`. ``zero_copy``: the
        connection can ``sendfile`` (see :attr:`RequestContext.zero_copy`)."""
        try:
            prefix = peek_prefix(frame)
        except MalformedFrameError as exc:
            return Close(str(exc))
        key, version = prefix.api_key, prefix.api_version
        if key == API_VERSIONS_KEY:
            low, high = API_VERSIONS_VERSIONS
            if not low <= version <= high:
                # KIP-511: answer in v0 (which every client reads) with the table.
                response = self.api_versions_response(0, UNSUPPORTED_VERSION)
                return Reply(encode_response(response, prefix.correlation_id, 0))
            try:
                decode_request(frame, ApiVersionsRequest, version)
            except MalformedFrameError as exc:
                return Close(str(exc))
            response = self.api_versions_response(version)
            return Reply(encode_response(response, prefix.correlation_id, version))
        api = self._apis.get(key)
        if api is None:
            return Close(f"unsupported API key {key} (version {version})")
        if not api.min_version <= version <= api.max_version:
            return Close(
                f"unsupported version {version} of API key {key} "
                f"(supported {api.min_version}..{api.max_version})"
            )
        try:
            request = (decode_request(frame, api.request_class, version) if api.decoder is None
                       else api.decoder(frame, version))
        except MalformedFrameError as exc:
            return Close(str(exc))
        header = request.header
        context = RequestContext(
            key, version, prefix.correlation_id, header.client_id, client_host, principal,
            zero_copy, self.listener,
        )
        return Call(api, request, context)

    async def run(self, call: Call) -> Reply:
        """Run a prepared request's handler and encode its response."""
        response = await call.api.handler(call.request, call.context)
        if response is None:
            return Reply(None)
        context = call.context
        if isinstance(response, EncodedResponse):
            parts = response.frame_parts(context.correlation_id)
            if len(parts) == 1:
                frame = parts[0]
                assert not isinstance(frame, (FileRegion, memoryview))
                return Reply(frame)
            return Reply(None, parts)
        if isinstance(response, FileBackedResponse):
            frame = encode_response(response.response, context.correlation_id,
                                    context.api_version)
            try:
                return Reply(None, splice_frame(frame, response.regions))
            except SpliceError as exc:
                log.warning("zero-copy fetch answer sent as bytes: %s", exc)
                response.read_back()
                response = response.response
        return Reply(encode_response(response, context.correlation_id, context.api_version))

    async def dispatch(self, frame: bytes | memoryview, client_host: str = "") -> Reply | Close:
        """Handle one request frame (size prefix excluded) that arrived from ``client_host``."""
        prepared = self.prepare(frame, client_host)
        if isinstance(prepared, Call):
            return await self.run(prepared)
        return prepared
