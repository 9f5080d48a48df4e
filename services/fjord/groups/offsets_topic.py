"""Which ``__consumer_offsets`` partition holds a group: Kafka's hash, so a group lands in the
same partition number as it would on Kafka. The broker answers FindCoordinator with it, the
coordinator routes a group's records with it."""

from __future__ import annotations

from fjord.groups.defaults import OFFSETS_TOPIC_PARTITIONS


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()``: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, in
    signed 32-bit arithmetic."""
    data = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def group_partition(group_id: str, partitions: int = OFFSETS_TOPIC_PARTITIONS) -> int:
    """The ``__consumer_offsets`` partition of a group: Kafka's
    ``Utils.abs(groupId.hashCode()) % partitions`` (``Utils.abs`` maps Integer.MIN_VALUE to 0)."""
    if partitions <= 0:
        raise ValueError(f"offsets topic partition count must be positive, got {partitions}")
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions
