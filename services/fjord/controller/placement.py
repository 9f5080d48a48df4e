"""Replica placement for new topics and partitions: Kafka's algorithm, pure.

Brokers are spread round-robin from a start index, and the second replica's shift grows by one
after every full round, so leaders and followers both spread evenly. With racks on every broker
the broker list is first interleaved rack by rack and each partition's replicas land on distinct
racks while racks remain (Kafka's ``RackAwareMode.Safe``: if only some brokers have a rack, the
rack-unaware placement is used, as Kafka's CreateTopics does).
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from fjord.errors import InvalidReplicaAssignmentError, InvalidReplicationFactorError


def rack_alternated_brokers(racks: Mapping[int, str]) -> list[int]:
    """Brokers ordered so consecutive entries are on different racks (racks sorted, brokers
    sorted within a rack, then taken one per rack in turn)."""
    by_rack: dict[str, list[int]] = {}
    for broker, rack in sorted(racks.items()):
        by_rack.setdefault(rack, []).append(broker)
    queues = [by_rack[r] for r in sorted(by_rack)]
    out: list[int] = []
    for i in range(max(len(q) for q in queues)):
        out.extend(q[i] for q in queues if i < len(q))
    return out


def _replica_index(first: int, shift: int, j: int, n: int) -> int:
    return (first + 1 + (shift + j) % (n - 1)) % n


def assign_replicas(
    brokers: Mapping[int, str | None],
    num_partitions: int,
    replication_factor: int,
    *,
    start_partition: int = 0,
    start_index: int | None = None,
    replica_shift: int | None = None,
    rng: random.Random | None = None,
) -> dict[int, list[int]]:
    """Replica lists for partitions ``start_partition .. start_partition + num_partitions - 1``.

    ``brokers`` maps each live broker id to its rack (``None`` when unset). ``start_index`` and
    ``replica_shift`` are random (from ``rng``) unless given, as in Kafka; the first replica
    of each list is the preferred leader. Raises :class:`InvalidReplicationFactorError` when
    the replication factor is below 1 or above the number of brokers.
    """
    n = len(brokers)
    if replication_factor < 1:
        raise InvalidReplicationFactorError(
            f"replication factor must be at least 1, got {replication_factor}"
        )
    if replication_factor > n:
        raise InvalidReplicationFactorError(
            f"replication factor {replication_factor} is larger than the {n} available brokers"
        )
    if num_partitions < 0:
        raise ValueError("num_partitions must be >= 0")
    rng = rng or random.Random()
    if start_index is None:
        start_index = rng.randrange(n)
    if replica_shift is None:
        replica_shift = rng.randrange(n)
    racks = {b: r for b, r in brokers.items() if r is not None}
    rack_aware = len(racks) == n and len(set(racks.values())) > 1
    ordered = rack_alternated_brokers(racks) if rack_aware else sorted(brokers)
    num_racks = len(set(racks.values())) if rack_aware else 1
    out: dict[int, list[int]] = {}
    shift = replica_shift
    for partition in range(start_partition, start_partition + num_partitions):
        if partition > 0 and partition % n == 0:
            shift += 1
        first = (partition + start_index) % n
        replicas = [ordered[first]]
        if not rack_aware:
            replicas += [
                ordered[_replica_index(first, shift, j, n)] for j in range(replication_factor - 1)
            ]
        else:
            used_racks = {racks[ordered[first]]}
            k = 0
            while len(replicas) < replication_factor:
                broker = ordered[_replica_index(first, shift * num_racks, k, n)]
                k += 1
                rack = racks[broker]
                if (rack not in used_racks or len(used_racks) == num_racks) and (
                    broker not in replicas
                ):
                    replicas.append(broker)
                    used_racks.add(rack)
        out[partition] = replicas
    return out


def validate_manual_assignment(
    assignments: Mapping[int, list[int]],
    expected_partitions: range,
    live_brokers: Mapping[int, str | None],
    replication_factor: int | None,
) -> dict[int, list[int]]:
    """Check a manual assignment: exactly the expected partitions, no duplicate broker within a
    partition, every broker live, one replication factor for all. Returns it as lists."""
    if sorted(assignments) != list(expected_partitions):
        raise InvalidReplicaAssignmentError(
            f"assignment must cover partitions {expected_partitions.start}.."
            f"{expected_partitions.stop - 1} exactly, got {sorted(assignments)}"
        )
    sizes = {len(r) for r in assignments.values()}
    if len(sizes) > 1 or (replication_factor is not None and sizes != {replication_factor}):
        raise InvalidReplicaAssignmentError("every partition must have the same number of replicas")
    for partition, replicas in assignments.items():
        if not replicas:
            raise InvalidReplicaAssignmentError(f"partition {partition} has no replicas")
        if len(set(replicas)) != len(replicas):
            raise InvalidReplicaAssignmentError(f"partition {partition} repeats a broker")
        unknown = [b for b in replicas if b not in live_brokers]
        if unknown:
            raise InvalidReplicaAssignmentError(
                f"partition {partition} names brokers that are not live: {unknown}"
            )
    return {p: list(r) for p, r in assignments.items()}
