"""Placement of ``__consumer_offsets``: the topic's settings and which live group coordinator
owns each of its partitions (the ``offsets-owners/<p>`` keys). Pure: no etcd, no clock.

The controller's etcd shell (:class:`~fjord.controller.service.ControllerService`) calls
:func:`plan_offsets_owners` whenever coordinator registrations, the owners or the topic change,
and writes the changed owners in one fenced transaction.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from fjord.controller.defaults import (
    OFFSETS_TOPIC_CONFIG,
    OFFSETS_TOPIC_REPLICATION_FACTOR,
)
from fjord.controller.planner import TopicSpec
from fjord.errors import InvalidRequestError, InvalidTopicError
from fjord.groups.defaults import OFFSETS_TOPIC, OFFSETS_TOPIC_PARTITIONS
from fjord.metadata import OffsetsOwner
from fjord.topic_names import is_internal_topic
from fjord.transactions.defaults import TRANSACTION_STATE_PARTITIONS, TRANSACTION_STATE_TOPIC

#: The internal topics the controller creates with its own settings ({name: partitions}): the
#: group coordinators' and the transaction coordinators' state (``transaction.state.log.*``
#: settings equal the ``offsets.topic.*`` ones: both are placed and owned alike).
COORDINATOR_TOPICS = {
    OFFSETS_TOPIC: OFFSETS_TOPIC_PARTITIONS,
    TRANSACTION_STATE_TOPIC: TRANSACTION_STATE_PARTITIONS,
}


def offsets_topic_spec(requested: TopicSpec, live_brokers: int) -> TopicSpec:
    """The CreateTopics entry the controller actually uses for ``__consumer_offsets`` (and
    ``__transaction_state``, created and replicated the same way).

    Its settings are Fjord's, not the caller's (as Kafka creates it from its
    ``offsets.topic.*`` broker settings): :data:`OFFSETS_TOPIC_PARTITIONS` partitions,
    replication factor ``min(OFFSETS_TOPIC_REPLICATION_FACTOR, live brokers)`` (at least 1),
    config :data:`OFFSETS_TOPIC_CONFIG`. A request that asks for anything else (other counts,
    configs or a manual assignment) is refused with :class:`InvalidRequestError`, so nobody
    believes they created it their way.
    """
    name = requested.name
    if name not in COORDINATOR_TOPICS:
        raise ValueError(f"not a coordinator topic: {name!r}")
    partitions = COORDINATOR_TOPICS[name]
    if requested.num_partitions not in (-1, partitions):
        raise InvalidRequestError(
            f"{name} is an internal topic with {partitions} partitions "
            f"(offsets.topic.num.partitions); got {requested.num_partitions}"
        )
    rf = max(1, min(OFFSETS_TOPIC_REPLICATION_FACTOR, live_brokers))
    if requested.replication_factor not in (-1, rf):
        raise InvalidRequestError(
            f"{name} is an internal topic: its replication factor is "
            f"min(offsets.topic.replication.factor={OFFSETS_TOPIC_REPLICATION_FACTOR}, "
            f"live brokers={live_brokers}) = {rf}; got {requested.replication_factor}"
        )
    if requested.configs or requested.assignments:
        raise InvalidRequestError(
            f"{name} is an internal topic: its configs and replica assignment are "
            "chosen by the controller"
        )
    return TopicSpec(name, partitions, rf, dict(OFFSETS_TOPIC_CONFIG))


def check_user_topic(name: str, action: str) -> None:
    """Refuse ``action`` ("create", "delete", "add partitions to") on an internal topic.

    Names starting with ``__`` are reserved for Fjord. ``__consumer_offsets`` may be created
    (with :func:`offsets_topic_spec`'s settings: brokers do it on the first FindCoordinator),
    nothing else with that prefix; no internal topic may be deleted or grow partitions (that
    would lose or re-home every group's offsets). Raises :class:`InvalidTopicError`.
    """
    if not is_internal_topic(name):
        return
    if action == "create" and name in COORDINATOR_TOPICS:
        return
    raise InvalidTopicError(
        f"cannot {action} {name!r}: topic names starting with '__' are internal to Fjord"
    )


def plan_offsets_owners(
    partitions: int, live: Collection[int], current: Mapping[int, OffsetsOwner]
) -> dict[int, OffsetsOwner]:
    """The owners to write so that every ``__consumer_offsets`` partition has a live owner and
    the coordinators' loads differ by at most one, with the fewest moves; only changed entries.

    - partitions ``0..partitions-1`` whose owner is missing or not in ``live`` go, in partition
      order, to the least-loaded live coordinator (ties: lowest id);
    - then, while the most- and least-loaded coordinators differ by two or more, the
      most-loaded one (ties: lowest id) gives its highest-numbered partition to the
      least-loaded one (ties: lowest id). A partition placed in the first step is never moved
      again, so every partition moves at most once and the number of moves is the minimum
      any within-one balance needs;
    - a moved partition's ``coordinator_epoch`` is its old one + 1 (1 if it had no owner);
    - no live coordinator: nothing changes (the owners' registrations are gone, which is what
      tells FindCoordinator that the group has no coordinator for now).

    Deterministic: the same inputs always give the same plan. Entries of ``current`` beyond
    ``partitions`` are ignored.
    """
    if partitions < 0:
        raise ValueError(f"partition count must be >= 0, got {partitions}")
    coordinators = sorted(set(live))
    if not coordinators:
        return {}
    owned: dict[int, list[int]] = {c: [] for c in coordinators}
    orphans: list[int] = []
    for p in range(partitions):
        owner = current.get(p)
        if owner is not None and owner.coordinator_id in owned:
            owned[owner.coordinator_id].append(p)
        else:
            orphans.append(p)
    changes: dict[int, OffsetsOwner] = {}

    def give(p: int, to: int) -> None:
        old = current.get(p)
        epoch = 1 if old is None else old.coordinator_epoch + 1
        changes[p] = OffsetsOwner(to, epoch)

    def least_loaded() -> int:
        return min(coordinators, key=lambda c: (len(owned[c]), c))

    for p in orphans:
        target = least_loaded()
        owned[target].append(p)
        give(p, target)
    while True:
        donor = min(coordinators, key=lambda c: (-len(owned[c]), c))
        target = least_loaded()
        if len(owned[donor]) - len(owned[target]) < 2:
            break
        p = max(owned[donor])
        owned[donor].remove(p)
        owned[target].append(p)
        give(p, target)
    return changes
