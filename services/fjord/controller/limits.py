"""The limits that keep one request from taking the cluster down, pure.

``max.records.per.user.op`` bounds the metadata records one operation writes (Kafka's
controller limit); ``max.broker.partitions`` bounds the partition replicas one broker hosts
(Kafka's KIP-578 name). Defaults and reasons: :mod:`fjord.controller.defaults`. Both are
checked before anything is written and refused with :class:`PolicyViolationError`, whose
message names the limit, the figure that broke it and how to go on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from fjord.cluster.topic_config import max_broker_partitions, max_records_per_user_op
from fjord.errors import PolicyViolationError
from fjord.metadata import MetadataImage

RAISE_HINT = "raise it in the cluster config (e.g. `fjord local up --config {key}=N`)"


def topic_records(new_partitions: int, configs: int) -> int:
    """Metadata records of creating a topic or adding partitions, counted as Kafka's controller
    counts them: one per new partition, one for the topic record, one per topic config."""
    return new_partitions + 1 + configs


def check_records_per_op(
    cluster_config: Mapping[str, str], what: str, records: int, new_partitions: int
) -> None:
    """Refuse an operation writing more than ``max.records.per.user.op`` records."""
    limit = max_records_per_user_op(cluster_config)
    if records <= limit:
        return
    fits = max(limit - (records - new_partitions), 0)
    raise PolicyViolationError(
        f"{what} needs {records} metadata records, more than max.records.per.user.op="
        f"{limit} allows in one operation: create at most {fits} partitions per request and "
        f"add the rest with `fjord topics alter --partitions`, or "
        + RAISE_HINT.format(key="max.records.per.user.op")
    )


def replicas_per_broker(image: MetadataImage) -> Counter[int]:
    """How many partition replicas each broker hosts (including replicas being added)."""
    counts: Counter[int] = Counter()
    for ref in image.all_partitions():
        counts.update(ref.state.replicas)
    return counts


def check_broker_partitions(
    image: MetadataImage, what: str, new_replicas: Iterable[Iterable[int]]
) -> None:
    """Refuse placing ``new_replicas`` (one replica list per new partition) when any broker
    would then host more than ``max.broker.partitions`` replicas. Only brokers receiving new
    replicas are checked (one already over the limit does not block unrelated requests)."""
    limit = max_broker_partitions(image.cluster_config)
    added: Counter[int] = Counter()
    for replicas in new_replicas:
        added.update(replicas)
    if not added:
        return
    current = replicas_per_broker(image)
    over = sorted(b for b in added if current[b] + added[b] > limit)
    if not over:
        return
    worst = max(over, key=lambda b: current[b] + added[b])
    room = min(max(limit - current[b], 0) for b in added)
    raise PolicyViolationError(
        f"{what} would put {current[worst] + added[worst]} partition replicas on broker "
        f"{worst} ({current[worst]} now), more than max.broker.partitions={limit}"
        f"{'' if len(over) == 1 else f' (brokers over the limit: {over})'}: "
        f"every broker it places replicas on has room for {room} more; use fewer partitions, "
        f"add brokers, or " + RAISE_HINT.format(key="max.broker.partitions")
    )
