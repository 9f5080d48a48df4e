"""Bookkeeping of delayed operations (Kafka's "purgatory"): long-poll fetches and acks=all
produces waiting for data or for the high watermark.

Pure: operations are plain objects; the asyncio shell waits on them and calls ``notify`` when a
partition's visible data grows. No clocks here: the shell bounds every wait with its timeout.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

Op = TypeVar("Op", bound="DelayedFetch | DelayedProduce")


class DelayedFetch:
    """A fetch that had fewer than ``min_bytes`` to return and waits for more.

    Invariant: ``completed`` becomes True once at least ``min_bytes`` new visible bytes have been
    reported (or an amount is unknown), and then never changes. The shell re-assembles the fetch
    when it completes; when the real bytes still fall short (e.g. per-partition limits) it
    waits again with a new DelayedFetch until its deadline.
    """

    __slots__ = ("_completed", "accumulated_bytes", "for_replica", "keys", "min_bytes")

    def __init__(
        self,
        keys: Iterable[Hashable],
        min_bytes: int,
        bytes_so_far: int = 0,
        *,
        for_replica: bool = False,
    ) -> None:
        self.keys = tuple(keys)
        #: A follower's fetch also sees bytes above the high watermark (up to the log end).
        self.for_replica = for_replica
        self.min_bytes = min_bytes
        self.accumulated_bytes = bytes_so_far
        self._completed = bytes_so_far >= min_bytes

    @property
    def completed(self) -> bool:
        return self._completed

    def on_visible_bytes(self, key: Hashable, nbytes: int | None) -> bool:
        """``nbytes`` more bytes became visible on ``key`` (None: an unknown amount).
        Returns True when this call completed the operation."""
        if self._completed:
            return False
        if nbytes is None:
            self._completed = True
        else:
            self.accumulated_bytes += nbytes
            self._completed = self.accumulated_bytes >= self.min_bytes
        return self._completed


class DelayedProduce:
    """An acks=all produce waiting until each partition's high watermark passes its batches.

    ``required`` maps each partition key to the offset the high watermark must reach (the last
    appended offset + 1). Invariant: ``completed`` iff every key's high watermark reached it.
    """

    __slots__ = ("_pending", "keys", "required")

    def __init__(self, required: dict[Hashable, int]) -> None:
        self.required = dict(required)
        self.keys = tuple(self.required)
        self._pending = set(self.required)

    @property
    def completed(self) -> bool:
        return not self._pending

    def satisfied(self, key: Hashable) -> bool:
        return key not in self._pending

    def on_high_watermark(self, key: Hashable, high_watermark: int) -> bool:
        """Returns True when this call completed the operation."""
        if key in self._pending and high_watermark >= self.required[key]:
            self._pending.discard(key)
            return not self._pending
        return False


class Purgatory(Generic[Op]):
    """Delayed operations indexed by the partition keys they wait on.

    Invariant: an operation is in the index of every one of its keys from ``watch`` until
    ``unwatch`` (the shell unwatches on completion and on timeout), and nowhere after.
    """

    def __init__(self) -> None:
        self._by_key: dict[Hashable, set[Op]] = {}

    def watch(self, op: Op) -> None:
        for key in op.keys:
            self._by_key.setdefault(key, set()).add(op)

    def unwatch(self, op: Op) -> None:
        for key in op.keys:
            waiters = self._by_key.get(key)
            if waiters is not None:
                waiters.discard(op)
                if not waiters:
                    del self._by_key[key]

    def watchers(self, key: Hashable) -> list[Op]:
        """A snapshot of the operations waiting on ``key`` (safe to unwatch while iterating)."""
        waiters = self._by_key.get(key)
        return list(waiters) if waiters else []

    def has_watchers(self, key: Hashable) -> bool:
        return key in self._by_key

    def operations(self) -> set[Op]:
        """Every operation watched now (each once, whatever number of keys it waits on)."""
        return {op for ops in self._by_key.values() for op in ops}

    def __len__(self) -> int:
        return len(self.operations())
