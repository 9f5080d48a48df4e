"""Partition choice for produced records: Kafka's murmur2 for keys, sticky for null keys."""

from __future__ import annotations

import random
import struct

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` as an unsigned 32-bit int (Java's int, read as unsigned).

    Same function as Kafka's Java client (and kafka-python): the partition of a key must be the
    one a Kafka producer picks, so that mixed clients agree on where a key lives.
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    whole = length & ~3
    for (k,) in struct.iter_unpack("<I", data[:whole]):
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    extra = length & 3
    if extra >= 3:
        h ^= data[whole + 2] << 16
    if extra >= 2:
        h ^= data[whole + 1] << 8
    if extra >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """Kafka's keyed partition: ``toPositive(murmur2(key)) % numPartitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


class StickyPartitioner:
    """Partition choice for records without a key (Kafka's sticky partitioner, KIP-480).

    Invariant: all null-key records of a topic go to the same partition until
    :meth:`on_new_batch` reports that the batch they were filling was closed (full or sent); then
    a different partition is picked at random (when there is more than one), so each batch fills
    up before the next one starts, instead of spreading tiny batches over every partition.
    """

    __slots__ = ("_current", "_random")

    def __init__(self, rng: random.Random | None = None) -> None:
        self._current: dict[str, int] = {}
        self._random = rng or random.Random()

    def partition(self, topic: str, num_partitions: int) -> int:
        current = self._current.get(topic)
        if current is None or current >= num_partitions:
            current = self._random.randrange(num_partitions)
            self._current[topic] = current
        return current

    def on_new_batch(self, topic: str, num_partitions: int, previous: int) -> int:
        """The batch being filled on ``previous`` is closed: move to another partition."""
        if self._current.get(topic) != previous:
            return self._current.get(topic, previous)
        if num_partitions <= 1:
            chosen = 0
        else:
            chosen = self._random.randrange(num_partitions - 1)
            if chosen >= previous:
                chosen += 1
        self._current[topic] = chosen
        return chosen
