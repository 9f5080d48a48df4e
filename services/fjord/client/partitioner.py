"""Partition choice for produced records: Kafka's murmur2 for keys, sticky for null keys.

:func:`py_murmur2` is the reference; with fjord's C extension (fjord.records.speedups)
:func:`murmur2` and :func:`group_by_partition` run in C and give the same answers.
"""

from __future__ import annotations

import random
import struct
from typing import Any

from fjord.records.speedups import EXTENSION, IMPLEMENTATION

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def py_murmur2(data: bytes) -> int:
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


def py_group_by_partition(
    keys: list[bytes | None], values: list[Any], num_partitions: int, null_key_partition: int
) -> list[tuple[list[bytes | None], list[Any]] | None]:
    """Records ``(keys[i], values[i])`` split by partition (None where a partition gets none):
    a key goes to :func:`partition_for_key`, a None key to ``null_key_partition``; the order
    within a partition is kept."""
    if len(keys) != len(values):
        raise ValueError("group_by_partition(): keys and values differ in length")
    if num_partitions < 1 or not 0 <= null_key_partition < num_partitions:
        raise ValueError(
            "group_by_partition(): need num_partitions >= 1 and "
            "0 <= null_key_partition < num_partitions"
        )
    groups: list[tuple[list[bytes | None], list[Any]] | None] = [None] * num_partitions
    for key, value in zip(keys, values, strict=True):
        if key is None:
            p = null_key_partition
        elif isinstance(key, bytes):
            p = (murmur2(key) & 0x7FFFFFFF) % num_partitions
        else:
            raise TypeError(f"group_by_partition(): key is {type(key).__name__}, not bytes or None")
        group = groups[p]
        if group is None:
            group = groups[p] = ([], [])
        group[0].append(key)
        group[1].append(value)
    return groups


_C_PARTITIONER = IMPLEMENTATION == "c" and hasattr(EXTENSION, "group_by_partition")
_c_murmur2 = EXTENSION.murmur2 if _C_PARTITIONER and EXTENSION is not None else None


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` as an unsigned 32-bit int (:func:`py_murmur2`; in C for
    ``bytes`` with the extension)."""
    if _c_murmur2 is not None and type(data) is bytes:
        return int(_c_murmur2(data))
    return py_murmur2(data)


group_by_partition = (
    EXTENSION.group_by_partition
    if _C_PARTITIONER and EXTENSION is not None
    else py_group_by_partition
)


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """Kafka's keyed partition: ``toPositive(murmur2(key)) % numPartitions``."""
    if _c_murmur2 is not None and type(key) is bytes:
        return (_c_murmur2(key) & 0x7FFFFFFF) % num_partitions
    return (py_murmur2(key) & 0x7FFFFFFF) % num_partitions


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
