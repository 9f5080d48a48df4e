"""Fetch assembly across partitions: how many bytes each partition may contribute.

Pure: the caller passes one reader per partition (the log's ``read`` bound to its offset and
upper bound); this module only decides the limits, Kafka's way (KIP-74).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass

#: ``reader(max_bytes) -> bytes``: whole batches from the fetch offset, at most ``max_bytes``
#: except that the first batch is returned whole even when it alone is larger. Only the
#: length of what it returns matters here: the bytes, or where they are (a FileRegion).
Reader = Callable[[int], Sized]


#: ``available_bytes`` of a slot whose reader's bound is unknown: only the limits bound it.
UNKNOWN_AVAILABLE = 1 << 62


@dataclass(frozen=True, slots=True)
class FetchSlot:
    """One partition of a fetch that passed its checks and may read data.

    ``available_bytes`` bounds what ``reader`` can return, whatever the limit it is given
    (e.g. the bytes from the fetch offset's index entry to the end of its segment: a read
    never crosses a segment)."""

    partition_max_bytes: int
    reader: Reader
    available_bytes: int = UNKNOWN_AVAILABLE


def read_size_bound(slots: Sequence[FetchSlot], max_bytes: int) -> int:
    """The most bytes :func:`assemble_fetch` may read for ``slots`` (except Kafka's oversized
    first batch, bounded by that slot's ``available_bytes`` alone): each slot at most
    ``min(partition_max_bytes, available_bytes)``, all together at most ``max_bytes``.

    The broker reads a fetch in a worker thread when this exceeds its threshold: a follower
    whose limits allow megabytes but whose leader has only the last few KiB to send reads on
    the event loop (a thread hop costs more than copying a few KiB from the page cache)."""
    total = 0
    for slot in slots:
        total += min(slot.partition_max_bytes, slot.available_bytes)
        if total >= max_bytes:
            return max_bytes
    return total


def assemble_fetch(slots: Sequence[FetchSlot], max_bytes: int) -> list[Sized]:
    """Read each slot in order and return its bytes (same order, ``b""`` for none).

    Rules (Kafka's): the response holds at most ``max_bytes`` in total and each partition at most
    its ``partition_max_bytes``, except that the first batch of the first partition that has data
    is returned whole even when it is larger than either limit, so that a consumer always makes
    progress. Any later partition whose next batch does not fit gets nothing this time.
    Invariant of the result: ``sum(len) <= max_bytes`` unless exactly one slot is non-empty and
    holds a single oversized batch.
    """
    out: list[Sized] = []
    remaining = max_bytes
    have_data = False
    for slot in slots:
        limit = min(slot.partition_max_bytes, remaining)
        if limit <= 0 and have_data:
            out.append(b"")
            continue
        data = slot.reader(max(limit, 1) if not have_data else limit)
        if data and have_data and len(data) > limit:
            data = b""  # an oversized batch only goes first; this one waits for the next fetch
        if data:
            have_data = True
            remaining -= len(data)
        out.append(data)
    return out
