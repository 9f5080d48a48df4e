"""Which partitions of an internal topic a coordinator owns, and at which coordinator epoch.

Shared by the group coordinator (``__consumer_offsets``) and the transaction coordinator
(``__transaction_state``): both own the partitions the controller assigns them, replay each
before serving it, and must stop serving one the moment a newer owner fences them.

Invariants:

- each owned partition is owned at exactly one epoch; :meth:`assign` with another epoch for
  it drops the old one (releasing what it held) and owns a fresh one, to be replayed again;
- a partition whose appends were fenced at epoch E (:meth:`fence`) is never owned again at E
  or an older epoch: this coordinator's view of the assignment lags the partition's leader,
  and only a newer epoch (the controller gave it back) is owned again;
- a dropped partition object is never current again (:meth:`_owns` is False for it), so work
  started for it (a replay, an append, a timer) can tell that its result must be discarded.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)


class OwnedPartition(Protocol):
    """One owned partition at one coordinator epoch; ``loaded`` once its replay is served."""

    number: int
    epoch: int
    loaded: bool


P = TypeVar("P", bound=OwnedPartition)


class PartitionOwnership(Generic[P]):
    """The owned partitions of ``internal_topic``: subclasses make a partition object
    (:meth:`_new_partition`) and release what one held when it is dropped (:meth:`_release`)."""

    internal_topic = ""

    def __init__(self) -> None:
        self._partitions: dict[int, P] = {}
        #: {partition: the newest epoch an append was fenced at}: never owned at it again.
        self._fenced: dict[int, int] = {}

    def _new_partition(self, number: int, epoch: int) -> P:
        raise NotImplementedError

    def _release(self, part: P) -> None:
        """Let go of what ``part`` held (answer its parked requests, cancel its work)."""
        raise NotImplementedError

    def assign(self, owned: Mapping[int, int]) -> list[tuple[int, int]]:
        """Make ``owned`` ({partition: coordinator epoch}) the owned set. Partitions no longer
        owned, or owned at another epoch, are dropped; returns the (partition, epoch) pairs
        that must now be claimed and replayed. Fenced epochs are skipped (module invariants)."""
        owned = {n: e for n, e in owned.items() if e > self._fenced.get(n, 0)}
        dropped = [p for n, p in self._partitions.items() if owned.get(n) != p.epoch]
        for part in dropped:
            self._drop(part)
        if dropped:
            log.info(
                "dropped %s partitions %s",
                self.internal_topic,
                sorted(p.number for p in dropped),
            )
        new = []
        for number, epoch in sorted(owned.items()):
            if number not in self._partitions:
                self._partitions[number] = self._new_partition(number, epoch)
                new.append((number, epoch))
        return new

    def unloaded(self) -> dict[int, int]:
        """Owned partitions still waiting for their replay: {partition: epoch}."""
        return {n: p.epoch for n, p in self._partitions.items() if not p.loaded}

    def owned(self) -> dict[int, int]:
        """Every owned partition: {partition: epoch}."""
        return {n: p.epoch for n, p in self._partitions.items()}

    def drop_all(self) -> None:
        """Stop serving everything (the lease was lost)."""
        self.assign({})

    def fence(self, number: int, epoch: int) -> None:
        """The partition's leader refused ``epoch`` for partition ``number`` (an append or the
        claim before its replay): a newer coordinator owns it. Drops the partition if owned
        at that epoch or an older one; it is not owned again at that epoch or an older one."""
        self._fenced[number] = max(self._fenced.get(number, 0), epoch)
        part = self._partitions.get(number)
        if part is None or part.epoch > epoch:
            return
        log.error(
            "%s partition %d: coordinator epoch %d is fenced (a newer coordinator owns it); "
            "no longer serving it",
            self.internal_topic,
            number,
            part.epoch,
        )
        self._drop(part)

    def _owns(self, part: P) -> bool:
        """True while ``part`` is the current object for its partition (not dropped)."""
        return self._partitions.get(part.number) is part

    def _drop(self, part: P) -> None:
        if self._owns(part):
            del self._partitions[part.number]
        self._release(part)
