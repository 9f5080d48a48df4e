"""Kafka request/response framing and headers, on kafka-python's generated message classes.

Wire format (Kafka's): every request and response is a frame ``INT32 size`` + ``size`` bytes.
A request frame starts with the request header (v1: ``INT16 api_key, INT16 api_version,
INT32 correlation_id, NULLABLE_STRING client_id``; v2 adds tagged fields, used by the flexible
versions of each API); the body follows in the layout of that API and version. A response frame
is the response header (v0: ``INT32 correlation_id``; v1 adds tagged fields for flexible
versions, except ApiVersions whose response header is always v0) then the body.

Bodies and headers are decoded and encoded by ``kafka.protocol`` (Kafka's JSON message specs and
classes generated from them), except Produce and Fetch: fjord.kafka.fastpath's hand-written
codecs, which property tests check against these classes at every version.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Any

from fjord.errors import FjordError, InvalidRequestError

_PREFIX = struct.Struct(">hhi")
#: Bytes of the fixed start of every request header: api_key, api_version, correlation_id.
HEADER_PREFIX_BYTES = _PREFIX.size
_SIZE = struct.Struct(">i")
#: Bytes of a frame's size prefix.
SIZE_PREFIX_BYTES = _SIZE.size


class MalformedFrameError(InvalidRequestError):
    """A frame that is not a Kafka request (too short, or a body that does not parse): Kafka's
    answer is to close the connection."""


@dataclass(frozen=True, slots=True)
class RequestPrefix:
    """The version-independent start of a request header."""

    api_key: int
    api_version: int
    correlation_id: int


def read_size(prefix: bytes) -> int:
    """The size announced by a 4-byte frame prefix (may be negative: the caller refuses it)."""
    return int(_SIZE.unpack(prefix)[0])


def peek_prefix(frame: bytes | memoryview) -> RequestPrefix:
    """api_key, api_version and correlation_id of a request frame (size prefix excluded)."""
    if len(frame) < HEADER_PREFIX_BYTES:
        raise MalformedFrameError(
            f"request of {len(frame)} bytes is shorter than a request header"
        )
    api_key, api_version, correlation_id = _PREFIX.unpack_from(frame)
    return RequestPrefix(api_key, api_version, correlation_id)


def decode_request(frame: bytes | memoryview, request_class: Any, version: int) -> Any:
    """Decode header + body of ``frame`` as ``request_class`` at ``version``; the header is on
    the result's ``.header``. Raises MalformedFrameError when the bytes do not parse (bytes
    after the body are ignored, as kafka-python's decoder does)."""
    try:
        return request_class.decode(frame, version=version, header=True)
    except FjordError:
        raise
    except Exception as exc:  # struct.error, ValueError, IndexError, UnicodeDecodeError, ...
        raise MalformedFrameError(
            f"{request_class.__name__} v{version} does not parse: {type(exc).__name__}: {exc}"
        ) from exc


def encode_response(response: Any, correlation_id: int, version: int) -> bytearray:
    """A complete response frame (size prefix, response header, body) for ``response``, which
    must have been built at ``version`` (``ResponseClass[version](...)``): kafka-python cannot
    re-version a message that has a response header. The encoder's own buffer slice is
    returned as is (no copy: a Fetch answer carries megabytes of records)."""
    if version != response.API_VERSION:
        raise ValueError(f"response built at v{response.API_VERSION}, expected v{version}")
    response.with_header(correlation_id=correlation_id)
    return response.encode(header=True, framed=True)


def topic_uuid(topic_id: str) -> uuid.UUID:
    """Fjord's topic id (32 hex digits) as the UUID Kafka's messages carry (zero if it is not
    one)."""
    try:
        return uuid.UUID(hex=topic_id)
    except ValueError:
        return uuid.UUID(int=0)
