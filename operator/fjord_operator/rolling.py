"""Rolling restarts of brokers, the shell around the pure planner
(:mod:`fjord.cluster.rolling_restart`): observe, plan, restart one broker.

One code path for every roller: :func:`roll_step` observes the partitions' ISR and
``min.insync.replicas`` and the live brokers through the admin API, asks
:func:`~fjord.cluster.rolling_restart.next_roll_step`, and on a RESTART step calls the
caller's ``restart(broker)``. The operator calls it once per reconciliation (its ``restart``
deletes the broker's pod; the step's in-flight broker is kept in ``status.rolling``);
:func:`roll_brokers` calls it in a loop until done (its ``restart`` stops and starts a local
process: ``tests/chaos/test_rolling_restart.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol

from fjord.cluster.rolling_restart import (
    InFlight,
    PartitionIsr,
    RollAction,
    RollObservation,
    RollStep,
    next_roll_step,
)
from fjord.errors import FjordError, KafkaTimeoutError
from fjord.topic_partition import TopicPartition

log = logging.getLogger(__name__)

MIN_INSYNC_REPLICAS = "min.insync.replicas"


class RollAdmin(Protocol):
    """What :func:`roll_step` needs of the admin API (``handlers.FjordAdmin`` has it)."""

    async def observe_roll(self) -> tuple[frozenset[int], dict[TopicPartition, PartitionIsr]]:
        """(registered broker ids, every partition's replicas, ISR and min.insync.replicas)."""
        ...


def partitions_for_roll(
    topics: Iterable[Any], configs: Mapping[str, Iterable[Any]]
) -> dict[TopicPartition, PartitionIsr]:
    """The planner's view of ``describe_topics`` results and each topic's ``describe_configs``
    entries (the effective ``min.insync.replicas``, whatever its source; 1 when absent)."""
    out: dict[TopicPartition, PartitionIsr] = {}
    for topic in topics:
        min_isr = 1
        for entry in configs.get(topic.name, ()):
            if entry.name == MIN_INSYNC_REPLICAS:
                min_isr = int(entry.value)
        for p in topic.partitions:
            out[TopicPartition(topic.name, p.partition)] = PartitionIsr(
                tuple(p.replicas), tuple(p.isr), min_isr
            )
    return out


async def roll_step(
    admin: RollAdmin,
    to_restart: Sequence[int],
    in_flight: InFlight | None,
    restart: Callable[[int], Awaitable[None]],
    *,
    not_serving: Collection[int] = (),
) -> RollStep:
    """Observe, plan, and restart the broker a RESTART step names (awaiting ``restart``).
    ``not_serving``: brokers the caller knows are not serving although still registered
    (their pods terminating or not ready): they count as down."""
    registered, partitions = await admin.observe_roll()
    live = frozenset(registered) - frozenset(not_serving)
    step = next_roll_step(to_restart, RollObservation(partitions, live), in_flight)
    if step.action is RollAction.RESTART:
        assert step.broker is not None
        log.info("rolling restart: %s", step.reason)
        await restart(step.broker)
    elif step.action is RollAction.WAIT:
        log.debug("rolling restart: %s", step.reason)
    return step


async def roll_brokers(
    admin: RollAdmin,
    brokers: Sequence[int],
    restart: Callable[[int], Awaitable[None]],
    *,
    timeout_s: float,
    poll_s: float = 0.2,
) -> list[RollStep]:
    """Restart every broker of ``brokers`` safely, one at a time, through :func:`roll_step`;
    returns the steps taken (consecutive identical waits once). ``restart(b)`` returns once
    broker ``b`` runs again. Retriable admin errors (a broker just went away) are retried.
    Raises KafkaTimeoutError naming the last wait reason after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pending = list(brokers)
    in_flight: InFlight | None = None
    steps: list[RollStep] = []
    while True:
        try:
            step = await roll_step(admin, pending, in_flight, restart)
        except FjordError as exc:
            if not exc.retriable:
                raise
            step = RollStep(RollAction.WAIT, f"the cluster did not answer: {exc}")
        if step.back is not None:
            in_flight = None
        if not steps or step != steps[-1]:
            steps.append(step)
        if step.action is RollAction.DONE:
            return steps
        if step.action is RollAction.RESTART:
            assert step.broker is not None
            in_flight = step.in_flight
            pending.remove(step.broker)
            continue
        if time.monotonic() > deadline:
            raise KafkaTimeoutError(
                f"rolling restart not done after {timeout_s:g} s "
                f"(left: {pending}); waiting because {step.reason}"
            )
        await asyncio.sleep(poll_s)  # observe again: the wait's condition is the ISR


def in_flight_to_status(in_flight: InFlight | None) -> dict[str, Any] | None:
    """``status.rolling.restarting`` of a FjordCluster (None: nothing in flight)."""
    if in_flight is None:
        return None
    return {
        "broker": in_flight.broker,
        "leftIsr": [
            {"topic": tp.topic, "partition": tp.partition} for tp in sorted(in_flight.left_isr)
        ],
    }


def in_flight_from_status(value: Any) -> InFlight | None:
    """The inverse of :func:`in_flight_to_status` (None for a missing or malformed value: a
    broker then counts as back once its ISRs are full, see the planner)."""
    if not isinstance(value, Mapping) or not isinstance(value.get("broker"), int):
        return None
    left = frozenset(
        TopicPartition(str(item["topic"]), int(item["partition"]))
        for item in value.get("leftIsr") or ()
        if isinstance(item, Mapping) and "topic" in item and "partition" in item
    )
    return InFlight(int(value["broker"]), left)
