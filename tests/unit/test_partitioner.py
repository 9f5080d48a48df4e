"""Kafka's murmur2 key partitioner (checked against kafka-python) and the sticky partitioner."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_murmur2

from fjord.client.partitioner import StickyPartitioner, murmur2, partition_for_key


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
