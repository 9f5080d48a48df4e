"""The safe rolling-restart planner, pure: which broker may go down next without costing any
partition its ``min.insync.replicas``, or why to wait.

A rolling change (a config or image change, a certificate renewal) restarts brokers one at a
time. The caller (the operator, which deletes broker pods; ``fjord.local``'s driver, which
stops and starts processes) calls :func:`next_roll_step` with what it observes now and acts on
the answer:

- ``RESTART b``: take broker ``b`` down and bring it back (the caller remembers
  :class:`InFlight` ``(b, step.left_isr)`` until a later step reports it back);
- ``WAIT``: do nothing now, observe again later (``reason`` says which partition and which
  ISR hold it up);
- ``DONE``: nothing is left to restart and the last restarted broker is back.

Rules (each property-tested in ``tests/unit/test_rolling_restart.py``):

1. One broker at a time: while a restarted broker is not back, nothing else is restarted. It
   is back once it is live again (registered, its pod ready), no longer needs a restart, and is
   in the ISR of every partition whose ISR it was in when it went down (``left_isr``; a
   partition that no longer exists or no longer lists it as a replica does not count).
2. A live broker ``b`` may go down only if every partition whose ISR holds ``b`` keeps at
   least ``min.insync.replicas`` live ISR members without it. Brokers already down (not in
   ``live``) do not count even while the ISR still lists them (the controller has not removed
   them yet): down brokers are accounted for. A partition whose ``min.insync.replicas`` is at
   least its replica count (replication factor 1, or min.insync = RF) cannot take an
   ``acks=all`` write during *any* broker's restart, so it never blocks a roll (as Strimzi's
   roller decides); the step names such partitions in ``unavoidable``.
3. A broker to restart that is down already goes first, without a check: it serves nothing,
   so restarting it costs nothing (a crash-looping pod gets its new config or image).
4. Otherwise the first broker in the caller's order that rule 2 allows; when none is allowed,
   ``WAIT`` naming, for the first candidate, the partition and ISR that hold it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from fjord.topic_partition import TopicPartition


@dataclass(frozen=True, slots=True)
class PartitionIsr:
    """One partition as the planner needs it: replicas, committed ISR, and its effective
    ``min.insync.replicas`` (the topic's, else the cluster default)."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    min_isr: int


@dataclass(frozen=True, slots=True)
class RollObservation:
    """What the caller sees now. ``live``: brokers that serve (registered with the controller
    and, on Kubernetes, their pod ready and not terminating)."""

    partitions: Mapping[TopicPartition, PartitionIsr]
    live: frozenset[int]


@dataclass(frozen=True, slots=True)
class InFlight:
    """The broker restarted last and the partitions whose ISR it was in when it went down."""

    broker: int
    left_isr: frozenset[TopicPartition] = frozenset()


class RollAction(StrEnum):
    RESTART = "Restart"
    WAIT = "Wait"
    DONE = "Done"


@dataclass(frozen=True, slots=True)
class Blocker:
    """Why one broker may not go down now: ``partition`` would keep ``remaining`` live ISR
    members of ``isr`` without it, fewer than ``min_isr``."""

    broker: int
    partition: TopicPartition
    isr: tuple[int, ...]
    min_isr: int
    remaining: int

    def describe(self, live: frozenset[int]) -> str:
        down = sorted(b for b in self.isr if b not in live and b != self.broker)
        also = f"; {_brokers(down)} down already" if down else ""
        return (
            f"broker {self.broker} must wait: {_name(self.partition)} would keep "
            f"{self.remaining} in-sync replica(s) of isr {list(self.isr)} without it, "
            f"below min.insync.replicas={self.min_isr}{also}"
        )


@dataclass(frozen=True, slots=True)
class RollStep:
    """The planner's answer. For ``RESTART``: ``broker`` and ``left_isr`` (remember both as
    :class:`InFlight`). For ``WAIT``: ``reason``, and ``partition``/``isr`` when a partition
    holds the roll up. ``back``: the in-flight broker this step found back (forget it)."""

    action: RollAction
    reason: str
    broker: int | None = None
    left_isr: frozenset[TopicPartition] = frozenset()
    partition: TopicPartition | None = None
    isr: tuple[int, ...] = ()
    back: int | None = None
    blockers: tuple[Blocker, ...] = ()
    unavoidable: tuple[TopicPartition, ...] = field(default=())

    @property
    def in_flight(self) -> InFlight | None:
        """What the caller remembers after acting on this step."""
        if self.action is RollAction.RESTART and self.broker is not None:
            return InFlight(self.broker, self.left_isr)
        return None


def _name(tp: TopicPartition) -> str:
    return f"{tp[0]}-{tp[1]}"


def _brokers(ids: Sequence[int]) -> str:
    return ("broker " if len(ids) == 1 else "brokers ") + ", ".join(map(str, ids))


def can_never_stay_available(state: PartitionIsr) -> bool:
    """A partition no single restart can leave writable with acks=all (rule 2's exception)."""
    return state.min_isr >= len(state.replicas)


def blocker_for(broker: int, observation: RollObservation) -> Blocker | None:
    """The first partition (in sorted order) that ``broker`` going down would take below its
    ``min.insync.replicas``, or None when it may go (rule 2)."""
    live = observation.live
    for tp in sorted(observation.partitions):
        state = observation.partitions[tp]
        if broker not in state.isr or can_never_stay_available(state):
            continue
        remaining = sum(1 for b in state.isr if b != broker and b in live)
        if remaining < max(state.min_isr, 1):
            return Blocker(broker, tp, state.isr, state.min_isr, remaining)
    return None


def isr_held_by(broker: int, observation: RollObservation) -> frozenset[TopicPartition]:
    """The partitions whose ISR lists ``broker`` now (what it leaves when it goes down)."""
    return frozenset(tp for tp, s in observation.partitions.items() if broker in s.isr)


def missing_from_isr(
    in_flight: InFlight, observation: RollObservation
) -> list[tuple[TopicPartition, tuple[int, ...]]]:
    """The partitions of ``in_flight.left_isr`` whose ISR does not list the broker again yet
    (partitions gone or no longer replicated on it are not waited for)."""
    out = []
    for tp in sorted(in_flight.left_isr):
        state = observation.partitions.get(tp)
        if state is None or in_flight.broker not in state.replicas:
            continue
        if in_flight.broker not in state.isr:
            out.append((tp, state.isr))
    return out


def next_roll_step(
    to_restart: Sequence[int],
    observation: RollObservation,
    in_flight: InFlight | None = None,
) -> RollStep:
    """The next step of a rolling restart (see the module docstring for the rules).

    ``to_restart``: brokers that still need a restart, in the caller's preferred order (the
    operator: pods whose revision is not the StatefulSet's; the in-flight broker stays in it
    until its restart has happened). ``in_flight``: the broker restarted last, from the step
    that restarted it, or None.
    """
    live = observation.live
    pending = list(dict.fromkeys(to_restart))  # keep the order, drop repeats
    back: int | None = None
    if in_flight is not None:
        b = in_flight.broker
        if b in pending and b not in live:
            return RollStep(
                RollAction.WAIT,
                f"broker {b} is restarting (down, its restart not finished)",
                broker=b,
            )
        if b not in pending:
            if b not in live:
                return RollStep(
                    RollAction.WAIT, f"broker {b} was restarted and is not back yet", broker=b
                )
            missing = missing_from_isr(in_flight, observation)
            if missing:
                tp, isr = missing[0]
                more = f" (and {len(missing) - 1} more partitions)" if len(missing) > 1 else ""
                return RollStep(
                    RollAction.WAIT,
                    f"broker {b} was restarted and is not back in the isr of {_name(tp)} "
                    f"(isr {list(isr)}){more}",
                    broker=b,
                    partition=tp,
                    isr=isr,
                )
            back = b
        # else: b is live and still needs its restart (the restart never happened, e.g. the
        # caller stopped before acting): b is an ordinary candidate again, first in line.
        elif pending[0] != b:
            pending.remove(b)
            pending.insert(0, b)
    if not pending:
        return RollStep(RollAction.DONE, "every broker restarted", back=back)
    unavoidable = tuple(
        tp for tp in sorted(observation.partitions)
        if can_never_stay_available(observation.partitions[tp])
    )
    for b in pending:
        if b not in live:
            return RollStep(
                RollAction.RESTART,
                f"restarting broker {b}: it is down already",
                broker=b,
                left_isr=isr_held_by(b, observation),
                back=back,
                unavoidable=unavoidable,
            )
    blockers: list[Blocker] = []
    for b in pending:
        blocker = blocker_for(b, observation)
        if blocker is None:
            return RollStep(
                RollAction.RESTART,
                f"restarting broker {b}: every partition keeps min.insync.replicas without it",
                broker=b,
                left_isr=isr_held_by(b, observation),
                back=back,
                blockers=tuple(blockers),
                unavoidable=unavoidable,
            )
        blockers.append(blocker)
    first = blockers[0]
    others = f" (brokers {[x.broker for x in blockers[1:]]} are held too)" if blockers[1:] else ""
    return RollStep(
        RollAction.WAIT,
        first.describe(live) + others,
        broker=first.broker,
        partition=first.partition,
        isr=first.isr,
        back=back,
        blockers=tuple(blockers),
        unavoidable=unavoidable,
    )
