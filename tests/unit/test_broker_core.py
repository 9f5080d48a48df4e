"""Pure cores of the broker: produce validation, epochs, partition state and high watermark,
fetch assembly, delayed operations, metadata answers and topic config layering."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord._proto import broker_pb2
from fjord.broker.fetch import FetchSlot, assemble_fetch, read_size_bound
from fjord.broker.partition import (
    Partition,
    PartitionAssignment,
    check_leader_epoch,
)
from fjord.broker.purgatory import DelayedFetch, DelayedProduce, Purgatory
from fjord.cluster.broker_config import topic_settings, validate_broker_config
from fjord.errors import (
    ConfigError,
    CorruptRecordError,
    ErrorCode,
    FencedLeaderEpochError,
    InvalidRecordError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    UnknownLeaderEpochError,
)
from fjord.metadata import (
    BrokerRegistration,
    ClusterConfig,
    ControllerRegistration,
    Keys,
    MetadataEvent,
    MetadataImage,
    PartitionState,
    TopicRecord,
)
from fjord.metadata.view import MetadataResponder, build_metadata_response
from fjord.records import BatchBuilder, crc32c, stamp_batch
from fjord.records.header import CRC_START
from fjord.storage import LogConfig, PartitionLog


def stamped(raw: bytes, base_offset: int, epoch: int) -> bytes:
    out = bytearray(raw)
    stamp_batch(out, 0, base_offset, epoch)
    return bytes(out)


def batch(n: int = 1, value_size: int = 10, ts: int = 1_000) -> bytes:
    builder = BatchBuilder(batch_size=1 << 30)
    for i in range(n):
        builder.append(ts + i, f"k{i}".encode(), b"v" * value_size)
    return builder.build()


def make_partition(
    directory: Path,
    *,
    broker_id: int = 1,
    leader: int = 1,
    epoch: int = 5,
    replicas: tuple[int, ...] = (1,),
    isr: tuple[int, ...] | None = None,
    min_isr: int = 1,
    max_message_bytes: int = 1 << 20,
) -> Partition:
    assignment = PartitionAssignment(leader, epoch, replicas, isr if isr is not None else replicas)
    plog = PartitionLog.open(directory / "t-0", LogConfig(max_message_bytes=max_message_bytes))
    return Partition("t", 0, broker_id, plog, assignment, min_insync_replicas=min_isr)


# --- produce validation (by the log, in the append) ---------------------------------------


def test_append_counts_batches_and_records(tmp_path: Path) -> None:
    part = make_partition(tmp_path)
    first, second = batch(3), batch(2)
    outcome = part.append_as_leader(first + second, acks=1)
    info = outcome.info
    assert (info.first_offset, info.last_offset, info.batch_count, info.record_count) == (
        0,
        4,
        2,
        5,
    )
    # Stored as sent, only base offset and leader epoch stamped (outside the CRC).
    assert part.log.read(0, 1 << 20) == stamped(first, 0, 5) + stamped(second, 3, 5)


def test_bad_crc_is_refused_and_nothing_appended(tmp_path: Path) -> None:
    part = make_partition(tmp_path)
    raw = bytearray(batch(1) + batch(2))
    raw[-1] ^= 0xFF  # the second batch is corrupt: the first must not be appended either
    with pytest.raises(CorruptRecordError, match="CRC") as info:
        part.append_as_leader(bytes(raw), acks=1)
    assert info.value.code is ErrorCode.CORRUPT_MESSAGE
    assert part.log_end_offset == 0


def test_truncated_and_garbage_are_corrupt(tmp_path: Path) -> None:
    part = make_partition(tmp_path)
    with pytest.raises(CorruptRecordError):
        part.append_as_leader(batch(2)[:-3], acks=1)
    with pytest.raises(CorruptRecordError):
        part.append_as_leader(b"\x00" * 80, acks=1)
    assert part.log_end_offset == 0


def test_empty_payload_is_invalid(tmp_path: Path) -> None:
    with pytest.raises(InvalidRecordError) as info:
        make_partition(tmp_path).append_as_leader(b"", acks=1)
    assert info.value.code is ErrorCode.INVALID_RECORD


def test_too_large_batch(tmp_path: Path) -> None:
    part = make_partition(tmp_path, max_message_bytes=1000)
    with pytest.raises(RecordTooLargeError) as info:
        part.append_as_leader(batch(1, value_size=2000), acks=1)
    assert info.value.code is ErrorCode.MESSAGE_TOO_LARGE
    assert part.log_end_offset == 0


def test_record_count_mismatch_is_invalid(tmp_path: Path) -> None:
    raw = bytearray(batch(3))
    struct.pack_into(">i", raw, 57, 7)  # record_count, inside the CRC: recompute it
    struct.pack_into(">I", raw, 17, crc32c(bytes(raw[CRC_START:])))
    with pytest.raises(InvalidRecordError):
        make_partition(tmp_path).append_as_leader(bytes(raw), acks=1)


# --- epochs and leadership ---


def test_leader_epoch_checks() -> None:
    check_leader_epoch(-1, 5)
    check_leader_epoch(5, 5)
    with pytest.raises(FencedLeaderEpochError):
        check_leader_epoch(4, 5)
    with pytest.raises(UnknownLeaderEpochError):
        check_leader_epoch(6, 5)


def test_follower_refuses_produce_and_consumer_fetch(tmp_path: Path) -> None:
    part = make_partition(tmp_path, broker_id=2, leader=1, replicas=(1, 2))
    with pytest.raises(NotLeaderOrFollowerError):
        part.append_as_leader(batch(), acks=1)
    with pytest.raises(NotLeaderOrFollowerError):
        part.check_leader()
    assert part.log_end_offset == 0


def test_epoch_is_checked_before_leadership(tmp_path: Path) -> None:
    part = make_partition(tmp_path, broker_id=2, leader=1, replicas=(1, 2), epoch=3)
    with pytest.raises(FencedLeaderEpochError):
        part.check_leader(2)


def test_single_replica_high_watermark_follows_appends(tmp_path: Path) -> None:
    part = make_partition(tmp_path)
    outcome = part.append_as_leader(batch(3), acks=-1)
    assert (outcome.info.first_offset, outcome.info.last_offset) == (0, 2)
    assert outcome.high_watermark_advanced
    assert part.high_watermark == part.log_end_offset == 3


def test_acks_all_refused_below_min_insync_and_nothing_appended(tmp_path: Path) -> None:
    part = make_partition(tmp_path, replicas=(1, 2, 3), isr=(1,), min_isr=2)
    with pytest.raises(NotEnoughReplicasError):
        part.append_as_leader(batch(), acks=-1)
    assert part.log_end_offset == 0
    part.append_as_leader(batch(), acks=1)  # acks=1 does not care about the ISR size
    assert part.log_end_offset == 1


def test_high_watermark_is_min_over_isr(tmp_path: Path) -> None:
    part = make_partition(tmp_path, replicas=(1, 2, 3), isr=(1, 2, 3))
    part.append_as_leader(batch(5), acks=1)
    assert part.high_watermark == 0
    assert not part.record_follower_fetch(2, 3)
    assert part.record_follower_fetch(3, 2)
    assert part.high_watermark == 2
    assert part.record_follower_fetch(3, 5)
    assert part.high_watermark == 3
    assert not part.record_follower_fetch(9, 5)  # not a replica: ignored
    assert part.follower_end_offset(9) is None
    # Shrinking the ISR to the leader alone exposes everything it holds.
    assert part.update_assignment(PartitionAssignment(1, 5, (1, 2, 3), (1, 3)))
    assert part.high_watermark == 5


def test_new_leader_epoch_forgets_follower_progress(tmp_path: Path) -> None:
    part = make_partition(tmp_path, replicas=(1, 2), isr=(1, 2))
    part.append_as_leader(batch(4), acks=1)
    part.record_follower_fetch(2, 4)
    assert part.high_watermark == 4
    part.update_assignment(PartitionAssignment(1, 6, (1, 2), (1, 2)))
    assert part.follower_end_offset(2) is None
    assert part.high_watermark == 4  # never moves back within leadership


def test_fetch_bounds(tmp_path: Path) -> None:
    part = make_partition(tmp_path, replicas=(1, 2), isr=(1, 2))
    part.append_as_leader(batch(4), acks=1)
    assert part.fetch_upper_bound(0, -1) == 0  # consumers: high watermark
    assert part.fetch_upper_bound(0, 2) == 4  # followers: log end
    assert part.fetch_upper_bound(4, -1) == 0
    with pytest.raises(OffsetOutOfRangeError):
        part.fetch_upper_bound(5, -1)
    with pytest.raises(OffsetOutOfRangeError):
        part.fetch_upper_bound(-1, -1)


def test_follower_high_watermark_capped_at_log_end(tmp_path: Path) -> None:
    part = make_partition(tmp_path, broker_id=2, leader=1, replicas=(1, 2))
    assert not part.update_follower_high_watermark(10)
    assert part.high_watermark == 0
    part.log.append_as_follower(stamped(batch(3), 0, 5))
    assert part.update_follower_high_watermark(10)
    assert part.high_watermark == 3


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(1, 4)),
            st.tuples(st.just("fetch"), st.sampled_from([2, 3]), st.integers(0, 40)),
            st.tuples(st.just("isr"), st.sampled_from([(1,), (1, 2), (1, 3), (1, 2, 3)])),
        ),
        max_size=30,
    )
)
def test_high_watermark_invariants(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as tmp:
        check_high_watermark_invariants(make_partition(Path(tmp), replicas=(1, 2, 3)), ops)


def check_high_watermark_invariants(part: Partition, ops: list[tuple]) -> None:  # type: ignore[type-arg]
    previous = part.high_watermark
    for op in ops:
        if op[0] == "append":
            part.append_as_leader(batch(op[1]), acks=1)
        elif op[0] == "fetch":
            part.record_follower_fetch(op[1], min(op[2], part.log_end_offset))
        else:
            part.update_assignment(PartitionAssignment(1, 5, (1, 2, 3), op[1]))
        hw = part.high_watermark
        assert part.log_start_offset <= hw <= part.log_end_offset
        assert hw >= previous
        followers = [r for r in part.assignment.isr if r != 1]
        proven = [part.follower_end_offset(r) or 0 for r in followers]
        assert hw <= min([part.log_end_offset, *proven]) or hw == previous
        previous = hw


# --- fetch assembly ---


def sized_reader(sizes: list[int]):  # type: ignore[no-untyped-def]
    """A reader over batches of the given sizes: whole batches up to the limit, and the first
    one whole even when it alone is larger (PartitionLog.read's contract)."""
    calls: list[int] = []

    def read(limit: int) -> bytes:
        calls.append(limit)
        out = b""
        for size in sizes:
            if out and len(out) + size > limit:
                break
            out += b"x" * size
        return out

    read.calls = calls  # type: ignore[attr-defined]
    return read


def test_fetch_respects_partition_and_total_limits() -> None:
    slots = [
        FetchSlot(250, sized_reader([100, 100, 100])),
        FetchSlot(1000, sized_reader([100] * 10)),
        FetchSlot(1000, sized_reader([100])),
    ]
    out = assemble_fetch(slots, max_bytes=500)
    assert [len(b) for b in out] == [200, 300, 0]


def test_oversized_first_batch_is_returned_whole() -> None:
    out = assemble_fetch([FetchSlot(100, sized_reader([5000, 10]))], max_bytes=200)
    assert [len(b) for b in out] == [5000]


def test_oversized_batch_after_data_waits() -> None:
    slots = [FetchSlot(100, sized_reader([50])), FetchSlot(100, sized_reader([5000]))]
    assert [len(b) for b in assemble_fetch(slots, max_bytes=1000)] == [50, 0]


def test_empty_partitions_do_not_count_as_first() -> None:
    slots = [FetchSlot(100, sized_reader([])), FetchSlot(100, sized_reader([5000]))]
    assert [len(b) for b in assemble_fetch(slots, max_bytes=1000)] == [0, 5000]


def test_read_size_bound_uses_the_bytes_there_are_not_only_the_limits() -> None:
    # A caught-up follower: limits of 1 MiB per partition and 10 MiB in all, a few KiB new.
    follower = [FetchSlot(1 << 20, sized_reader([4000]), 4096) for _ in range(3)]
    assert read_size_bound(follower, 10 << 20) == 3 * 4096
    # A lagging one: the limits bind.
    lagging = [FetchSlot(1 << 20, sized_reader([]), 1 << 30) for _ in range(3)]
    assert read_size_bound(lagging, 10 << 20) == 3 << 20
    assert read_size_bound(lagging, 2 << 20) == 2 << 20
    # Unknown availability (the default): the limits alone, as before.
    assert read_size_bound([FetchSlot(5 << 20, sized_reader([]))], 10 << 20) == 5 << 20
    assert read_size_bound([], 10 << 20) == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 500), st.lists(st.integers(1, 300), max_size=6),
                  st.integers(0, 400)),
        min_size=1,
        max_size=6,
    ),
    st.integers(1, 1500),
)
def test_read_size_bound_bounds_what_assembly_reads(
    parts: list[tuple[int, list[int], int]], max_bytes: int
) -> None:
    """With each slot's available_bytes at least what its reader holds, assembly never returns
    more than the bound, except Kafka's oversized first batch (at most its slot's bytes)."""
    slots = [FetchSlot(pmax, sized_reader(sizes), sum(sizes) + slack)
             for pmax, sizes, slack in parts]
    bound = read_size_bound(slots, max_bytes)
    assert bound <= min(max_bytes, sum(pmax for pmax, _, _ in parts))  # never above the limits
    out = assemble_fetch(slots, max_bytes)
    total = sum(len(data) for data in out)
    non_empty = [i for i, data in enumerate(out) if data]
    excess = 0
    if non_empty:  # the first partition with data may return one batch beyond its limits
        first = non_empty[0]
        pmax, sizes, slack = parts[first]
        excess = max(0, sizes[0] - min(pmax, sum(sizes) + slack, max_bytes))
    assert total <= bound + excess


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 500), st.lists(st.integers(1, 300), max_size=6)),
        min_size=1,
        max_size=6,
    ),
    st.integers(1, 1500),
)
def test_fetch_assembly_bounds(parts: list[tuple[int, list[int]]], max_bytes: int) -> None:
    out = assemble_fetch([FetchSlot(pmax, sized_reader(sizes)) for pmax, sizes in parts], max_bytes)
    assert len(out) == len(parts)
    non_empty = [i for i, data in enumerate(out) if data]
    if non_empty:
        first = non_empty[0]
        rest = sum(len(out[i]) for i in non_empty[1:])
        first_size = len(out[first])
        first_batch = parts[first][1][0]
        # Only the first non-empty partition may exceed its limits, and only by one batch.
        assert first_size <= max(min(parts[first][0], max_bytes), first_batch)
        assert first_size + rest <= max(max_bytes, first_batch)
        for i in non_empty[1:]:
            assert len(out[i]) <= parts[i][0]
    # A partition with data is never skipped while the response is still empty.
    for i, (_, sizes) in enumerate(parts):
        if sizes and not non_empty:
            raise AssertionError(f"partition {i} had data but nothing was returned")


# --- delayed operations ---


def test_delayed_fetch_completes_at_min_bytes() -> None:
    op = DelayedFetch([("t", 0), ("t", 1)], min_bytes=100, bytes_so_far=10)
    assert not op.completed
    assert not op.on_visible_bytes(("t", 0), 50)
    assert op.on_visible_bytes(("t", 1), 40)
    assert op.completed
    assert not op.on_visible_bytes(("t", 1), 40)  # completes once
    unknown = DelayedFetch([("t", 0)], min_bytes=10**9)
    assert unknown.on_visible_bytes(("t", 0), None)


def test_delayed_produce_needs_every_partition() -> None:
    op = DelayedProduce({("t", 0): 10, ("t", 1): 3})
    assert not op.on_high_watermark(("t", 0), 9)
    assert not op.on_high_watermark(("t", 0), 10)
    assert op.satisfied(("t", 0))
    assert not op.on_high_watermark(("x", 0), 100)
    assert op.on_high_watermark(("t", 1), 3)
    assert op.completed


def test_purgatory_watch_unwatch() -> None:
    purgatory: Purgatory[DelayedFetch] = Purgatory()
    a = DelayedFetch([("t", 0), ("t", 1)], 1)
    b = DelayedFetch([("t", 1)], 1)
    purgatory.watch(a)
    purgatory.watch(b)
    assert len(purgatory) == 2
    assert set(purgatory.watchers(("t", 1))) == {a, b}
    purgatory.unwatch(a)
    assert purgatory.watchers(("t", 0)) == []
    assert not purgatory.has_watchers(("t", 0))
    purgatory.unwatch(b)
    assert len(purgatory) == 0


# --- metadata answers ---


def image_with_topic() -> MetadataImage:
    keys = Keys("c1")
    revision = 0

    def put(key: str, value: bytes) -> MetadataEvent:
        nonlocal revision
        revision += 1
        return MetadataEvent.put(key, value, revision, revision)

    events = [
        put(keys.controller, ControllerRegistration(7, "h", 1).to_json()),
        put(keys.broker(1), BrokerRegistration(1, "b1", 9001, "r1").to_json()),
        put(keys.broker(2), BrokerRegistration(2, "b2", 9002, direct_host="d2",
                                               direct_port=9102).to_json()),
        put(keys.topic("orders"), TopicRecord("a" * 32, 2, 2).to_json()),
        put(keys.partition("orders", 0), PartitionState((1, 2), (1, 2), 1, 3, 4).to_json()),
        put(keys.partition("orders", 1), PartitionState((2, 3), (3,), 3, 1, 1).to_json()),
    ]
    return MetadataImage.empty("c1").apply(events)


def test_metadata_response_lists_topic_state() -> None:
    image = image_with_topic()
    response = build_metadata_response(
        image, broker_pb2.MetadataRequest(topics=["orders", "missing", "", "..", "a b", "x" * 250])
    )
    assert response.cluster_id == "c1"
    assert response.metadata_version == image.revision
    assert [(b.id, b.host, b.port, b.rack) for b in response.brokers] == [
        (1, "b1", 9001, "r1"),
        (2, "b2", 9002, ""),
    ]
    # Broker 2 opens a direct door (fjord.direct_frames), broker 1 none.
    assert [(b.direct_host, b.direct_port) for b in response.brokers] == [("", 0), ("d2", 9102)]
    assert (response.controller.id, response.controller.epoch) == (7, 1)
    orders, missing, *illegal = response.topics
    assert orders.error.code == 0 and orders.topic_id == "a" * 32
    p0, p1 = orders.partitions
    assert (p0.leader, p0.leader_epoch, list(p0.replicas), list(p0.isr)) == (1, 3, [1, 2], [1, 2])
    # Broker 3 is not registered: its partition has no live leader.
    assert p1.leader == -1 and p1.error.code == ErrorCode.LEADER_NOT_AVAILABLE.code
    assert list(p1.offline_replicas) == [3]
    assert missing.error.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code
    assert [t.error.code for t in illegal] == [ErrorCode.INVALID_TOPIC_EXCEPTION.code] * 4
    assert "249" in illegal[-1].error.message


def test_metadata_all_topics_cached_per_revision() -> None:
    image = image_with_topic()
    responder = MetadataResponder()
    request = broker_pb2.MetadataRequest(all_topics=True, allow_auto_topic_creation=True)
    first = responder.respond(image, request)
    assert [t.name for t in first.topics] == ["orders"]
    assert responder.respond(image, request) is first
    newer = image.apply(
        [MetadataEvent.put(image.keys.topic("b"), TopicRecord("b" * 32, 1, 1).to_json(), 99, 99)]
    )
    assert [t.name for t in responder.respond(newer, request).topics] == ["b", "orders"]


# --- config layering ---


def test_topic_settings_layering() -> None:
    settings_ = topic_settings(
        {"max.message.bytes": "100", "min.insync.replicas": "2"},
        ClusterConfig({"max.message.bytes": "200", "num.partitions": "3"}).values,
        {"segment.bytes": "1048576"},
    )
    assert settings_.log_config.max_message_bytes == 200
    assert settings_.log_config.segment_bytes == 1048576
    assert settings_.min_insync_replicas == 2


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"min\.insync\.replicas"):
        topic_settings({}, {}, {"min.insync.replicas": "0"})
    with pytest.raises(ConfigError, match="bogus"):
        validate_broker_config({"bogus": "1"})
    with pytest.raises(ConfigError, match=r"auto\.create\.topics\.enable"):
        validate_broker_config({"auto.create.topics.enable": "true"})
    with pytest.raises(ConfigError, match=r"segment\.bytes"):
        validate_broker_config({"segment.bytes": "abc"})
    assert validate_broker_config({"retention.ms": "1000"}) == {"retention.ms": "1000"}
    # Read where topics are created: the broker names where they belong.
    with pytest.raises(ConfigError, match=r"num\.partitions: a controller config"):
        validate_broker_config({"num.partitions": "3"})


def test_a_cluster_config_splits_by_who_reads_it() -> None:
    from fjord.cluster.topic_config import split_cluster_config

    controllers, brokers = split_cluster_config(
        {"num.partitions": "12", "default.replication.factor": "3", "retention.ms": "1000",
         "replica.fetch.max.bytes": "2097152"}
    )
    assert controllers == {"num.partitions": "12", "default.replication.factor": "3",
                           "retention.ms": "1000"}
    assert brokers == {"retention.ms": "1000", "replica.fetch.max.bytes": "2097152"}
    with pytest.raises(ConfigError, match=r"num\.partitions: 0 is below the minimum 1"):
        split_cluster_config({"num.partitions": "0"})
    with pytest.raises(ConfigError, match="bogus: unknown cluster config"):
        split_cluster_config({"bogus": "1"})


def test_metadata_through_a_sasl_door_names_the_doors_and_leaves_out_the_rest() -> None:
    """brokers_by_sasl_door: brokers and the controller by their door; a broker or controller
    without one is left out; the (maybe cached) answer it copies is unchanged."""
    from fjord.metadata.view import brokers_by_sasl_door

    keys = Keys("c1")
    events = [
        MetadataEvent.put(keys.controller,
                          ControllerRegistration(7, "h", 1, "h", 101).to_json(), 1, 1),
        MetadataEvent.put(keys.broker(1), BrokerRegistration(
            1, "b1", 9001, "r1", None, None, None, "b1", 9101, (), "b1", 9201).to_json(), 2, 2),
        MetadataEvent.put(keys.broker(2), BrokerRegistration(2, "b2", 9002).to_json(), 3, 3),
    ]
    image = MetadataImage.empty("c1").apply(events)
    answer = build_metadata_response(image, broker_pb2.MetadataRequest(all_topics=True))
    before = answer.SerializeToString()
    door = brokers_by_sasl_door(answer, image)
    assert [(b.id, b.host, b.port, b.rack) for b in door.brokers] == [(1, "b1", 9101, "r1")]
    # A client that came in through SASL is not sent to the identity-less direct door.
    assert [(b.direct_host, b.direct_port) for b in door.brokers] == [("", 0)]
    assert (door.controller.id, door.controller.host, door.controller.port) == (7, "h", 101)
    assert answer.SerializeToString() == before

    without = MetadataImage.empty("c1").apply([
        MetadataEvent.put(keys.controller, ControllerRegistration(7, "h", 1).to_json(), 1, 1)])
    bare = build_metadata_response(without, broker_pb2.MetadataRequest(all_topics=True))
    assert not brokers_by_sasl_door(bare, without).HasField("controller")
