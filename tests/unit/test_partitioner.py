"""Kafka's murmur2 key partitioner (checked against kafka-python) and the sticky partitioner."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_murmur2

from fjord.client.partitioner import (
    StickyPartitioner,
    group_by_partition,
    murmur2,
    partition_for_key,
    py_group_by_partition,
    py_murmur2,
)


@given(st.binary(max_size=300))
def test_murmur2_equals_kafka_python(key: bytes) -> None:
    assert murmur2(key) == kafka_murmur2(key)


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=1000))
def test_partition_for_key_equals_kafka_python(key: bytes, partitions: int) -> None:
    assert partition_for_key(key, partitions) == (kafka_murmur2(key) & 0x7FFFFFFF) % partitions


def test_known_java_values() -> None:
    # Values from Kafka's own UtilsTest (Java ints, read as unsigned here).
    assert murmur2(b"21") & 0xFFFFFFFF == (-973932308) & 0xFFFFFFFF
    assert murmur2(b"foobar") & 0xFFFFFFFF == (-790332482) & 0xFFFFFFFF
    assert murmur2(b"a-little-bit-long-string") & 0xFFFFFFFF == (-985981536) & 0xFFFFFFFF
    assert murmur2(b"") & 0xFFFFFFFF == 275646681


def test_sticky_stays_until_new_batch_then_moves() -> None:
    sticky = StickyPartitioner(random.Random(7))
    first = sticky.partition("t", 6)
    assert all(sticky.partition("t", 6) == first for _ in range(100))
    second = sticky.on_new_batch("t", 6, first)
    assert second != first
    assert sticky.partition("t", 6) == second
    # A stale report (another thread already moved on) does not move it again.
    assert sticky.on_new_batch("t", 6, first) == second


def test_sticky_single_partition_and_shrinking_count() -> None:
    sticky = StickyPartitioner(random.Random(1))
    assert sticky.partition("one", 1) == 0
    assert sticky.on_new_batch("one", 1, 0) == 0
    for _ in range(20):
        p = sticky.partition("t", 8)
        sticky.on_new_batch("t", 8, p)
    assert 0 <= sticky.partition("t", 2) < 2


def test_sticky_spreads_over_all_partitions() -> None:
    sticky = StickyPartitioner(random.Random(3))
    seen = set()
    p = sticky.partition("t", 4)
    for _ in range(200):
        seen.add(p)
        p = sticky.on_new_batch("t", 4, p)
    assert seen == {0, 1, 2, 3}


@given(st.binary(max_size=300))
def test_murmur2_in_c_and_python_agree(key: bytes) -> None:
    assert murmur2(key) == py_murmur2(key) == kafka_murmur2(key)
    assert py_murmur2(bytearray(key)) == murmur2(bytearray(key))  # bytes-likes: the Python one


@given(
    st.lists(st.one_of(st.none(), st.binary(max_size=20)), max_size=80),
    st.integers(min_value=1, max_value=12),
    st.data(),
)
def test_group_by_partition_is_kafkas_partitioner_order_kept(
    keys: list[bytes | None], partitions: int, data: st.DataObject
) -> None:
    """Both implementations split records as partition_for_key would, null keys to the given
    partition, each partition's records in their order."""
    null_partition = data.draw(st.integers(min_value=0, max_value=partitions - 1))
    values = list(range(len(keys)))
    expected: list[tuple[list[bytes | None], list[int]] | None] = [None] * partitions
    for key, value in zip(keys, values, strict=True):
        p = null_partition if key is None else partition_for_key(key, partitions)
        group = expected[p] = expected[p] or ([], [])
        group[0].append(key)
        group[1].append(value)
    assert py_group_by_partition(keys, values, partitions, null_partition) == expected
    assert group_by_partition(keys, values, partitions, null_partition) == expected


@pytest.mark.parametrize("split", [py_group_by_partition, group_by_partition])
def test_group_by_partition_refuses_bad_input(split: Any) -> None:
    with pytest.raises(TypeError, match="not bytes or None"):
        split([b"k", "text"], [1, 2], 3, 0)
    with pytest.raises(ValueError, match="differ in length"):
        split([b"k"], [1, 2], 3, 0)
    with pytest.raises(ValueError, match="null_key_partition"):
        split([None], [1], 3, 3)
    with pytest.raises(ValueError, match="num_partitions"):
        split([], [], 0, 0)
