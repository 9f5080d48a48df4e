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


@dataclass(frozen=True, slots=True)
class FetchSlot:
    """One partition of a fetch that passed its checks and may read data."""

    partition_max_bytes: int
    reader: Reader


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
