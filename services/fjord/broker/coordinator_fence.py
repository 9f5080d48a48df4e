"""Coordinator-epoch fencing of ``__consumer_offsets`` appends (and ``__transaction_state``
ones: that topic's partition p is owned by the same coordinator at the same epoch, one fence per
topic), decided by the partition leader.

A group coordinator owns a ``__consumer_offsets`` partition at a coordinator epoch (its
``offsets-owners/<p>`` entry; the controller adds one every time the partition changes owner).
A coordinator whose lease ran out keeps believing it owns its partitions until it notices, and
may append meanwhile. Every coordinator append carries its epoch, and the leader refuses one
older than the newest it knows, as brokers fence a zombie leader by leader epoch. Pure: no I/O,
no clock; the broker's ReplicaManager asks it before every append to the topic.
"""

from __future__ import annotations

from fjord.errors import CoordinatorFencedError, InvalidTopicError
from fjord.groups.defaults import OFFSETS_TOPIC

#: ``ProducePartition.coordinator_epoch`` when the producer is not a group coordinator.
NO_COORDINATOR_EPOCH = 0


class CoordinatorEpochFence:
    """The newest coordinator epoch seen per ``__consumer_offsets`` partition on this leader.

    Invariants:
    - an append is admitted only with an epoch >= max(the epoch in the metadata the caller
      passes, every epoch admitted before for that partition); a lower one raises
      :class:`CoordinatorFencedError` and changes nothing;
    - an append without an epoch (:data:`NO_COORDINATOR_EPOCH` or below) raises
      :class:`InvalidTopicError`: only coordinators write the topic (Kafka refuses appends
      to internal topics from clients the same way);
    - the newest epoch per partition never decreases until :meth:`forget` (the broker no
      longer hosts the partition; the metadata then carries the epoch again).

    The "admitted before" half covers a broker whose metadata still lags the takeover: the new
    owner's first append teaches the leader its epoch, and any later append of the old owner is
    refused even before the metadata arrives.
    """

    def __init__(self, topic: str = OFFSETS_TOPIC) -> None:
        self.topic = topic
        self._newest: dict[int, int] = {}

    def admit(self, partition: int, epoch: int, known_epoch: int | None) -> None:
        """Check an append to ``__consumer_offsets``-``partition`` carrying ``epoch``;
        ``known_epoch`` is the owner's epoch in the leader's metadata (None: no owner)."""
        if epoch <= NO_COORDINATOR_EPOCH:
            raise InvalidTopicError(
                f"cannot append to internal topic {self.topic}: only its coordinator "
                "writes it (the append carries no coordinator epoch)"
            )
        newest = max(self._newest.get(partition, NO_COORDINATOR_EPOCH), known_epoch or 0)
        if epoch < newest:
            raise CoordinatorFencedError(
                f"{self.topic}-{partition}: coordinator epoch {epoch} is fenced, the "
                f"partition's owner is at epoch {newest}"
            )
        self._newest[partition] = epoch

    def newest(self, partition: int) -> int | None:
        """The newest epoch admitted for ``partition`` (None: none yet)."""
        return self._newest.get(partition)

    def forget(self, partition: int) -> None:
        self._newest.pop(partition, None)
