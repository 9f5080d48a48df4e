"""What the consumer's parts share (Kafka's ``SubscriptionState``): the assignment, each
partition's position or pending reset, the paused set, and the errors waiting for ``poll()``.

The :class:`~fjord.client.consumer.Consumer` (application thread), the
:class:`~fjord.client.fetcher.Fetcher` and :class:`~fjord.client.offset_fetcher.OffsetFetcher`
(loop thread) and the :class:`~fjord.client.consumer_coordinator.ConsumerCoordinator` (both)
read and change it only while holding ``lock``; ``arrived`` (a condition on that lock) wakes a
``poll()`` that waits for records, group events or errors.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Literal

from fjord.client.types import TopicPartition
from fjord.errors import FjordError

SubscriptionMode = Literal["assign", "subscribe"] | None
"""None (nothing to consume), "assign" (``assign()``) or "subscribe" (group membership)."""


class SubscriptionState:
    """Invariants (under ``lock``): every key of ``positions`` and ``resets`` is in
    ``assignment``, and an assigned partition has a position or a reset strategy ("earliest",
    "latest", "none" or "committed"), never both once a reset has completed; ``paused`` is a
    subset of ``assignment``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.mode: SubscriptionMode = None
        self.assignment: list[TopicPartition] = []
        self.positions: dict[TopicPartition, int] = {}
        self.resets: dict[TopicPartition, str] = {}
        self.paused: set[TopicPartition] = set()
        self.errors: list[FjordError] = []
        self.closed = False
        #: ``poll()`` calls waiting on ``arrived`` now (the loop thread hands them the GIL
        #: after storing records: :meth:`Fetcher._store_fetch`).
        self.polls_waiting = 0

    def raise_pending_error(self) -> None:
        """Raise the oldest error posted for ``poll()`` (called with the lock held)."""
        if self.errors:
            raise self.errors.pop(0)

    def without_position(
        self, tps: Iterable[TopicPartition] | None = None
    ) -> TopicPartition | None:
        """The first of ``tps`` (default: the assignment) that has no position and reset
        policy "none" (called with the lock held): ``poll()`` and ``position()`` raise
        NoOffsetForPartitionError for it when they run, so a ``seek()`` that came before them
        always wins (the loop thread never decides it in advance)."""
        for tp in self.assignment if tps is None else tps:
            if self.resets.get(tp) == "none":
                return tp
        return None

    def post_error(self, error: FjordError) -> None:
        """Queue ``error`` for the next ``poll()`` and wake it (called with the lock held)."""
        self.errors.append(error)
        self.arrived.notify_all()

    def notify(self) -> None:
        """Wake a ``poll()`` waiting on ``arrived`` (called with the lock held)."""
        self.arrived.notify_all()
