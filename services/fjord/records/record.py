"""One record of a RecordBatch v2, as a consumer sees it."""

from __future__ import annotations

from dataclasses import dataclass

Header = tuple[str, bytes | None]
Headers = tuple[Header, ...]


@dataclass(frozen=True, slots=True)
class Record:
    """A decoded record. Invariants: ``offset`` is absolute (the batch's base offset plus the
    record's offset delta); ``timestamp`` is in milliseconds since the epoch (the batch's max
    timestamp for every record of a LOG_APPEND_TIME batch, as Kafka reports it); ``key`` and
    ``value`` are ``None`` when null, which is distinct from ``b""``; header keys are strings
    (UTF-8 on the wire) and header values are bytes or ``None``, in wire order (keys may repeat).
    """

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
