"""The streaming reader's offsets, driven the way Spark's source runner drives it (no JVM: the
reader's methods against the shared cluster). What is checked is what Spark receives: the
initial offset is resolved once and, in a ``Trigger.AvailableNow`` run, never past the run's
end; a query naming several topics fails naming the one that does not exist."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from fjord.client import Consumer, TopicPartition
from fjord.errors import UnknownTopicOrPartitionError
from fjord_spark.arrow import reader_schema
from fjord_spark.offsets import offsets_from_json
from fjord_spark.options import parse_reader_options
from fjord_spark.source import ClusterView, FjordStreamReader
from tests.helpers.spark import produce

pytestmark = pytest.mark.integration


def stream_reader(bootstrap: str, **options: str) -> FjordStreamReader:
    parsed = parse_reader_options({"bootstrap.servers": bootstrap, **options}, streaming=True)
    return FjordStreamReader(parsed, reader_schema(False))


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[TopicPartition, int]:
    with Consumer({"bootstrap.servers": bootstrap}) as consumer:
        return consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])


def test_available_now_start_is_never_past_the_end(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """startingOffsets=latest, records arriving after the run fixed its end and before Spark
    asks for the initial offset: the run starts at the end it fixed (nothing to read), not
    after it (which Spark would plan as an offset that went back: data loss)."""
    topic = new_topic(2)
    produce(bootstrap, topic, 6)
    reader = stream_reader(bootstrap, subscribe=topic, startingOffsets="latest")
    try:
        reader.prepareForTriggerAvailableNow()
        fixed_end = end_offsets(bootstrap, topic, 2)
        produce(bootstrap, topic, 6, start=6)
        assert end_offsets(bootstrap, topic, 2) != fixed_end
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        assert offsets_from_json(start) == fixed_end
        assert offsets_from_json(end) == fixed_end
        assert list(reader.partitions(start, end)) == []
        assert reader.initialOffset() == start
    finally:
        reader.stop()


def test_initial_offset_is_resolved_once(bootstrap: str, new_topic: Callable[..., str]) -> None:
    """Spark asks for the initial offset to find the first batch's end and again to plan the
    batch: both answers are the same, whatever arrived in between."""
    topic = new_topic(1)
    produce(bootstrap, topic, 3)
    reader = stream_reader(bootstrap, subscribe=topic, startingOffsets="latest")
    try:
        first = reader.initialOffset()
        assert first == {topic: {"0": 3}}
        produce(bootstrap, topic, 2, start=3)
        assert reader.initialOffset() == first
        end = reader.latestOffset(first, ReadAllAvailable())
        assert end == {topic: {"0": 5}}
        (task,) = reader.partitions(first, end)
        assert (task.from_offset, task.until_offset) == (3, 5)
    finally:
        reader.stop()


def test_specific_starting_offsets_mix_edges_and_numbers(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    """-2 (earliest), -1 (latest) and a number in one startingOffsets document, partitions it
    does not name falling back to its default (latest for a stream)."""
    topic = new_topic(4)
    for partition in range(4):
        produce(bootstrap, topic, 4, partition=partition)
    starting = json.dumps({topic: {"0": -2, "1": -1, "2": 1}})
    reader = stream_reader(bootstrap, subscribe=topic, startingOffsets=starting)
    try:
        assert reader.initialOffset() == {topic: {"0": 0, "1": 4, "2": 1, "3": 4}}
    finally:
        reader.stop()


def test_several_topics_one_request_and_the_missing_one_named(
    bootstrap: str, new_topic: Callable[..., str]
) -> None:
    first, second = new_topic(2), new_topic(1)
    options = parse_reader_options(
        {"bootstrap.servers": bootstrap, "subscribe": f"{first},{second}"}, streaming=True
    )
    view = ClusterView(options)
    try:
        assert view.partitions() == sorted(
            [TopicPartition(first, 0), TopicPartition(first, 1), TopicPartition(second, 0)]
        )
    finally:
        view.close()
    absent = f"{first}-absent"
    options = parse_reader_options(
        {"bootstrap.servers": bootstrap, "subscribe": f"{first},{absent},{second}"},
        streaming=True,
    )
    view = ClusterView(options)
    try:
        with pytest.raises(UnknownTopicOrPartitionError, match=f"topic '{absent}' does not exist"):
            view.partitions()
    finally:
        view.close()
