"""What a broker does about a damaged batch in its own copy of a partition, pure.

A healthy copy always wins: a follower drops its damaged tail and fetches it again from the
leader; a leader first hands leadership to another in-sync replica (then, a follower, it does
the same); only a leader with no other in-sync replica keeps its copy, refuses to serve the
damaged range (CORRUPT_MESSAGE naming partition, offset and the way forward) and serves the
rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum


class DamageAction(StrEnum):
    REFETCH = "truncate at the damage and fetch it again from the leader"
    RESIGN = "hand leadership to a healthy in-sync replica, then re-fetch"
    WAIT_FOR_LEADER = "wait for a leader to re-fetch from"
    NO_HEALTHY_COPY = "keep the copy, refuse the damaged range"


def damage_action(broker_id: int, leader: int, isr: Sequence[int]) -> DamageAction:
    """The action for a damage found in ``broker_id``'s copy of a partition led by ``leader``
    (-1: none) with ``isr``."""
    if leader != broker_id:
        return DamageAction.REFETCH if leader >= 0 else DamageAction.WAIT_FOR_LEADER
    if any(r != broker_id for r in isr):
        return DamageAction.RESIGN
    return DamageAction.NO_HEALTHY_COPY


def no_healthy_copy_message(topic: str, partition: int, offset: int,
                            resume_offset: int | None, broker_id: int, reason: str,
                            *, others_down: bool = False) -> str:
    """What a consumer reading the damaged range of a partition without a healthy copy is told:
    where, why, and the way forward. ``others_down``: other ISR members exist but none is live
    to take over now."""
    past = str(resume_offset) if resume_offset is not None else "the next segment's base offset"
    if others_down:
        return (
            f"{topic}-{partition}: the batch at offset {offset} is damaged on broker "
            f"{broker_id} ({reason}) and no other in-sync replica is live to take over now; "
            f"retry once one is back (leadership then moves to it), or seek past the damage "
            f"to {past}"
        )
    return (
        f"{topic}-{partition}: the batch at offset {offset} is damaged on broker {broker_id} "
        f"({reason}) and no other in-sync replica holds a healthy copy. The records from "
        f"offset {offset} up to {past} are lost: seek past them to {past}, or move the log "
        f"start there (DeleteRecords, e.g. kafka-delete-records.sh against the Kafka listener)"
    )
