"""The direct door's wire format: Produce and Fetch as protobuf frames on a plain TCP connection.

Why: gRPC's per-message floor on this machine is ~0.28 ms client -> handler and ~0.21 ms back
on an open stream, against ~0.1 ms each way on a plain asyncio TCP connection
(``bench/grpc_floor.py --stream`` / ``--raw``), and a grpc.aio call or stream message costs
both ends 240-600 us of CPU. Produce and Fetch are the requests a record's way takes (client
-> leader -> followers -> consumer), so a broker may open a *direct door* serving exactly
those two requests, with the same protobuf messages and the same handlers as its gRPC
Produce/Fetch (nothing is translated; every field keeps its meaning). Everything else stays
on gRPC. See docs/direct-door.md.

Connection (one per (broker, kind), as the gRPC streams of fjord.rpc_streams):

- The client opens TCP and writes a hello: ``b"FJD1"`` + one kind byte, ``b"P"`` (Produce)
  or ``b"F"`` (Fetch). The server answers ``b"FJD1"`` + one status byte: ``0`` accepted;
  ``1`` refused (kind not served), after which it closes the connection.
- Then the client writes request frames and the server writes one answer frame per request,
  in request order (Kafka's rule for one connection).
- **Request frame**: ``u32`` big-endian length ``L``, then ``L`` bytes: the serialised
  ``ProduceRequest`` or ``FetchRequest``.
- **Answer frame**: ``u32`` big-endian length ``L`` (``L >= 1``), then one status byte and
  ``L - 1`` bytes: status ``0`` the serialised ``ProduceResponse`` / ``FetchResponse``;
  status ``1`` UTF-8 text of why the request failed (the handler raised; the server closes
  the connection after it, as a gRPC stream ends with its handler's exception).
- A frame longer than :data:`MAX_FRAME_BYTES` is refused (FrameTooLargeError) and the
  connection closed: the bound keeps a corrupt or hostile length from buffering gigabytes.
"""

from __future__ import annotations

import struct

from fjord.config import CHANNEL_MAX_MESSAGE_BYTES
from fjord.errors import InvalidRequestError

MAGIC = b"FJD1"
KIND_PRODUCE = b"P"
KIND_FETCH = b"F"
#: What a client writes first on a new connection, by kind.
HELLO_PRODUCE = MAGIC + KIND_PRODUCE
HELLO_FETCH = MAGIC + KIND_FETCH
HELLO_BYTES = len(HELLO_PRODUCE)
#: The server's answer to a hello it serves / does not serve.
ACCEPTED = MAGIC + b"\x00"
REFUSED = MAGIC + b"\x01"

STATUS_OK = 0
STATUS_ERROR = 1

#: The largest frame a client accepts: its gRPC channels' message bound plus the status byte.
#: A broker reads requests with its own, smaller bound (FrameReader(max_frame_bytes)).
MAX_FRAME_BYTES = CHANNEL_MAX_MESSAGE_BYTES + 1

_LENGTH = struct.Struct(">I")
LENGTH_BYTES = _LENGTH.size


class MalformedDirectFrameError(InvalidRequestError):
    """Bytes on a direct-door connection that are not a frame of this format (a bad hello, an
    empty answer frame, a status byte other than 0 or 1): the connection is closed."""


class FrameTooLargeError(MalformedDirectFrameError):
    """A frame announced longer than :data:`MAX_FRAME_BYTES`."""


def frame_prefix(length: int) -> bytes:
    """The 4-byte length prefix of a frame of ``length`` bytes (written before the payload
    with ``writelines``, so a large payload is not copied to prepend it)."""
    if length > MAX_FRAME_BYTES:
        raise FrameTooLargeError(f"a frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    return _LENGTH.pack(length)


def answer_prefix(payload_length: int, status: int = STATUS_OK) -> bytes:
    """Length prefix and status byte of an answer frame whose payload is ``payload_length``
    bytes."""
    return frame_prefix(payload_length + 1) + bytes((status,))


def split_answer(frame: bytes | bytearray) -> tuple[int, memoryview]:
    """An answer frame's (status, payload). MalformedDirectFrameError for an empty frame or an
    unknown status."""
    if not frame:
        raise MalformedDirectFrameError("an empty answer frame (no status byte)")
    status = frame[0]
    if status not in (STATUS_OK, STATUS_ERROR):
        raise MalformedDirectFrameError(f"unknown answer status {status}")
    return status, memoryview(frame)[1:]


def hello_kind(hello: bytes) -> bytes:
    """The kind byte of a client's hello. MalformedDirectFrameError if it is not one (a client
    speaking another protocol, say HTTP/2's preface or a Kafka request)."""
    if len(hello) != HELLO_BYTES or not hello.startswith(MAGIC):
        raise MalformedDirectFrameError(f"not a direct-door hello: {bytes(hello[:16])!r}")
    return hello[len(MAGIC):]


class FrameReader:
    """Splits a byte stream into frames (pure: the caller feeds what the socket gave).

    Invariant: :meth:`feed` returns every complete frame in the bytes fed so far, in order,
    each exactly once; the bytes of an incomplete frame stay buffered. A length over
    ``max_frame_bytes`` raises FrameTooLargeError as soon as its prefix is complete.

    Each frame's payload is copied once: a frame whole in one feed is sliced out of it; the
    pieces of one that spans feeds are kept as views of the fed bytes (never copied into a
    growing buffer) and joined when the last one comes. (A bytearray buffer copied a
    550 KB frame that came in 256 KiB reads about three times over: ~0.5 ms.)
    """

    __slots__ = ("_head", "_max", "_need", "_parts", "_size")

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._max = max_frame_bytes
        #: The bytes of a length prefix not complete yet (fewer than LENGTH_BYTES).
        self._head = b""
        #: The payload length of the frame being read, -1 while its prefix is not complete.
        self._need = -1
        #: The pieces of that frame's payload read so far, and their total size.
        self._parts: list[memoryview] = []
        self._size = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        if not isinstance(data, bytes):
            data = bytes(data)  # pieces are kept as views: never of a buffer the caller reuses
        frames: list[bytes] = []
        position, available = 0, len(data)
        while position < available:
            if self._need < 0:
                if not self._head and available - position >= LENGTH_BYTES:
                    (length,) = _LENGTH.unpack_from(data, position)
                    position += LENGTH_BYTES
                else:
                    take = min(LENGTH_BYTES - len(self._head), available - position)
                    self._head += data[position:position + take]
                    position += take
                    if len(self._head) < LENGTH_BYTES:
                        break
                    (length,) = _LENGTH.unpack(self._head)
                    self._head = b""
                if length > self._max:
                    raise FrameTooLargeError(
                        f"a frame of {length} bytes announced; at most {self._max} are accepted"
                    )
                if available - position >= length:  # whole in this feed: one slice
                    frames.append(data[position:position + length])
                    position += length
                    continue
                self._need = length
            take = min(self._need - self._size, available - position)
            self._parts.append(memoryview(data)[position:position + take])
            self._size += take
            position += take
            if self._size == self._need:
                frames.append(b"".join(self._parts))
                self._parts.clear()
                self._need, self._size = -1, 0
        return frames

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held back (its prefix included)."""
        return len(self._head) + (LENGTH_BYTES + self._size if self._need >= 0 else 0)
