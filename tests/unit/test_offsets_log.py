"""``__consumer_offsets`` records: Kafka's key/value bytes, the group -> partition function,
the loader, and offset retention."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.coordinator.offsets_log import (
    NO_TIMESTAMP,
    GroupMetadataKey,
    GroupMetadataLoader,
    GroupMetadataValue,
    MemberRecord,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_record,
    encode_record,
    offsets_to_expire,
)
from fjord.errors import CorruptRecordError
from fjord.groups.offsets_topic import group_partition, java_string_hash


def java_hash_by_definition(s: str) -> int:
    """s[0]*31^(n-1) + s[1]*31^(n-2) + ... + s[n-1] over UTF-16 code units, then int32."""
    units = []
    for ch in s:
        cp = ord(ch)
        if cp >= 0x10000:  # a surrogate pair in Java's UTF-16 String
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    n = len(units)
    total = sum(u * 31 ** (n - 1 - i) for i, u in enumerate(units))
    total %= 2**32
    return total - 2**32 if total >= 2**31 else total


def test_java_hash_known_values():
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("hello") == 99162322
    # Known overflowing value: "polygenelubricants".hashCode() == Integer.MIN_VALUE.
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert java_string_hash("test-group") == java_hash_by_definition("test-group")


def test_group_partition_known_values_and_min_value():
    # Utils.abs(Integer.MIN_VALUE) == 0, so this group lives in partition 0.
    assert group_partition("polygenelubricants") == 0
    assert group_partition("a") == 97 % 50
    assert group_partition("hello", 7) == 99162322 % 7
    negative = "my-consumer-group-123"
    h = java_hash_by_definition(negative)
    assert group_partition(negative) == abs(h) % 50
    with pytest.raises(ValueError):
        group_partition("g", 0)


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=40), st.integers(1, 200))
def test_group_partition_matches_the_java_definition(group, partitions):
    h = java_hash_by_definition(group)
    assert java_string_hash(group) == h
    expected = 0 if h == -(2**31) else abs(h) % partitions
    assert group_partition(group, partitions) == expected
    assert 0 <= group_partition(group, partitions) < partitions


def test_offset_key_and_value_bytes_match_kafka():
    key, value = encode_record((OffsetCommitKey("g", "t", 2), OffsetCommitValue(5, 3, "m", 1000)))
    assert key == b"\x00\x01\x00\x01g\x00\x01t\x00\x00\x00\x02"
    assert value == (
        b"\x00\x03"
        b"\x00\x00\x00\x00\x00\x00\x00\x05"
        b"\x00\x00\x00\x03"
        b"\x00\x01m"
        b"\x00\x00\x00\x00\x00\x00\x03\xe8"
    )
    assert encode_record((GroupMetadataKey("g"), None)) == (b"\x00\x02\x00\x01g", None)


def test_old_versions_decode():
    key = b"\x00\x00\x00\x01g\x00\x01t\x00\x00\x00\x00"
    v0 = b"\x00\x00" + (7).to_bytes(8, "big") + b"\x00\x00" + (9).to_bytes(8, "big")
    assert decode_record(key, v0) == (OffsetCommitKey("g", "t", 0), OffsetCommitValue(7, -1, "", 9))
    v1 = (
        b"\x00\x01"
        + (7).to_bytes(8, "big")
        + b"\x00\x00"
        + (9).to_bytes(8, "big")
        + (99).to_bytes(8, "big")
    )
    assert decode_record(key, v1)[1] == OffsetCommitValue(7, -1, "", 9, 99)
    # group value v0: no rebalance timeout (= session timeout), no state timestamp.
    member_v0 = (
        b"\x00\x02m1"
        b"\x00\x01c"
        b"\x00\x01h" + (10).to_bytes(4, "big") + b"\x00\x00\x00\x01S" + b"\x00\x00\x00\x01A"
    )
    g0 = (
        b"\x00\x00"
        b"\x00\x08consumer"
        + (4).to_bytes(4, "big")
        + b"\x00\x05range"
        + b"\x00\x02m1"
        + (1).to_bytes(4, "big")
        + member_v0
    )
    _, value = decode_record(b"\x00\x02\x00\x01g", g0)
    assert value == GroupMetadataValue(
        "consumer",
        4,
        "range",
        "m1",
        NO_TIMESTAMP,
        (MemberRecord("m1", None, "c", "h", 10, 10, b"S", b"A"),),
    )


@pytest.mark.parametrize(
    "key, value",
    [
        (b"\x00\x07\x00\x01g", None),
        (b"\x00\x01\x00\x01g", None),
        (b"\x00\x02\x00\x01g!", None),
        (b"\x00\x01\x00\x01g\x00\x01t\x00\x00\x00\x02", b"\x00\x09"),
        (b"\x00\x01\x00\x01g\x00\x01t\x00\x00\x00\x02", b"\x00\x03\x00"),
        (b"\x00\x02\x00\x01g", b"\x00\x03\x00\x01c"),
        (b"\x00\x02\x00\x01g", b"\x00\x05"),
    ],
)
def test_bad_bytes_are_corrupt_record_errors(key, value):
    with pytest.raises(CorruptRecordError):
        decode_record(key, value)


names = st.text(min_size=1, max_size=8)
offset_values = st.builds(
    OffsetCommitValue,
    st.integers(0, 2**63 - 1),
    st.integers(-1, 2**31 - 1),
    st.text(max_size=10),
    st.integers(-1, 2**50),
)
member_records = st.builds(
    MemberRecord,
    names,
    st.none() | names,
    st.text(max_size=5),
    st.text(max_size=5),
    st.integers(0, 2**31 - 1),
    st.integers(0, 2**31 - 1),
    st.binary(max_size=10),
    st.binary(max_size=10),
)
group_values = st.builds(
    GroupMetadataValue,
    st.text(max_size=8),
    st.integers(0, 2**31 - 1),
    st.none() | names,
    st.none() | names,
    st.integers(-1, 2**50),
    st.lists(member_records, max_size=3).map(tuple),
)
records = st.one_of(
    st.tuples(
        st.builds(
            OffsetCommitKey, st.sampled_from(["g1", "g2"]), st.sampled_from("ab"), st.integers(0, 2)
        ),
        st.none() | offset_values,
    ),
    st.tuples(st.builds(GroupMetadataKey, st.sampled_from(["g1", "g2"])), st.none() | group_values),
)


@settings(max_examples=50, deadline=None)
@given(records)
def test_encode_decode_round_trip(record):
    assert decode_record(*encode_record(record)) == record


def replay_model(log):
    """The obvious model: last value per key wins, tombstones delete."""
    last = {}
    for key, value in log:
        last[key] = value
    groups: dict[str, dict] = {}
    for key, value in last.items():
        if value is None:
            continue
        entry = groups.setdefault(key.group, {"metadata": None, "offsets": {}})
        if isinstance(key, OffsetCommitKey):
            entry["offsets"][(key.topic, key.partition)] = value
        else:
            entry["metadata"] = value
    return groups


@settings(max_examples=50, deadline=None)
@given(st.lists(records, max_size=30))
def test_loader_equals_replay_model(log):
    loader = GroupMetadataLoader()
    for record in log:  # through the bytes, as the coordinator reads them
        loader.apply_bytes(*encode_record(record))
    loaded = loader.groups()
    model = replay_model(log)
    assert set(loaded) == set(model)
    for name, group in loaded.items():
        assert group.metadata == model[name]["metadata"]
        assert group.offsets == model[name]["offsets"]


def test_loader_rejects_mismatched_value_type():
    loader = GroupMetadataLoader()
    with pytest.raises(CorruptRecordError):
        loader.apply(OffsetCommitKey("g", "t", 0), GroupMetadataValue("c", 1, None, None))
    with pytest.raises(CorruptRecordError):
        loader.apply(GroupMetadataKey("g"), OffsetCommitValue(1))


DAY = 86_400_000
WEEK = 7 * DAY


def test_retention_rules():
    offsets = {
        ("t", 0): OffsetCommitValue(1, commit_timestamp=0),
        ("u", 0): OffsetCommitValue(1, commit_timestamp=5 * DAY),
        ("v", 0): OffsetCommitValue(1, commit_timestamp=0, expire_timestamp=DAY),
    }
    common = {"retention_ms": WEEK, "empty_since_ms": 6 * DAY}
    # Empty consumer group: everything expires a week after it became empty.
    kw = dict(common, group_is_empty=True, protocol_type="consumer", subscribed_topics=None)
    assert offsets_to_expire(offsets, now_ms=13 * DAY - 1, **kw) == [("v", 0)]
    assert offsets_to_expire(offsets, now_ms=13 * DAY, **kw) == [("t", 0), ("u", 0), ("v", 0)]
    # Simple group (no protocol type): per commit timestamp.
    kw = dict(common, group_is_empty=True, protocol_type=None, subscribed_topics=None)
    assert offsets_to_expire(offsets, now_ms=WEEK, **kw) == [("t", 0), ("v", 0)]
    # Active consumer group: only topics it no longer subscribes to, per commit timestamp.
    kw = dict(
        common, group_is_empty=False, protocol_type="consumer", subscribed_topics=frozenset({"t"})
    )
    assert offsets_to_expire(offsets, now_ms=100 * DAY, **kw) == [("u", 0), ("v", 0)]
    # Active group of another protocol type: nothing (except explicit expiry).
    kw = dict(common, group_is_empty=False, protocol_type="connect", subscribed_topics=None)
    assert offsets_to_expire(offsets, now_ms=100 * DAY, **kw) == [("v", 0)]
