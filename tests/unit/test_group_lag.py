"""Lag rows (``kafka-consumer-groups.sh --describe``) and the ``--reset-offsets`` planner."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.errors import InvalidRequestError, NonEmptyGroupError, UnknownTopicOrPartitionError
from fjord.groups.lag import (
    ByDuration,
    FromFile,
    LagRow,
    MemberPartitions,
    PartitionReset,
    ShiftBy,
    ToDatetime,
    ToEarliest,
    ToLatest,
    ToOffset,
    export_csv,
    lag_rows,
    parse_duration_ms,
    parse_reset_csv,
    parse_topic_selector,
    plan_offset_reset,
    reset_scope,
    time_lag_seconds,
    total_lag,
)
from fjord.topic_partition import TopicPartition


def test_describe_rows():
    committed = {("orders", 0): 10, ("orders", 1): 5, ("old", 0): 3}
    ends = {("orders", 0): 15, ("orders", 1): 5, ("orders", 2): 9}
    members = [MemberPartitions("c-1", "/10.0.0.1", "svc", (("orders", 0), ("orders", 2)))]
    rows = lag_rows(committed, ends, members)
    assert rows == [
        LagRow("old", 0, 3, None, None, None, None, None),
        LagRow("orders", 0, 10, 15, 5, "c-1", "/10.0.0.1", "svc"),
        LagRow("orders", 1, 5, 5, 0, None, None, None),
        LagRow("orders", 2, None, 9, None, "c-1", "/10.0.0.1", "svc"),
    ]
    assert total_lag(rows) == 5
    # OffsetFetch's -1 is "nothing committed"; a committed offset past the end shows lag 0.
    assert lag_rows({("t", 0): -1, ("t", 1): 20}, {("t", 0): 4, ("t", 1): 10}) == [
        LagRow("t", 0, None, 4, None, None, None, None),
        LagRow("t", 1, 20, 10, 0, None, None, None),
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(
        st.tuples(st.sampled_from("ab"), st.integers(0, 3)),
        st.tuples(st.integers(0, 100), st.integers(0, 100)),
        max_size=8,
    )
)
def test_lag_is_end_minus_committed(data):
    committed = {tp: c for tp, (c, _) in data.items()}
    ends = {tp: c + extra for tp, (c, extra) in data.items()}
    rows = lag_rows(committed, ends)
    assert [(r.topic, r.partition) for r in rows] == sorted(data)
    assert all(r.lag == ends[(r.topic, r.partition)] - r.current_offset for r in rows)
    assert total_lag(rows) == sum(extra for _, extra in data.values())


EARLIEST = {("t", 0): 10, ("t", 1): 0}
LATEST = {("t", 0): 100, ("t", 1): 50}
COMMITTED = {("t", 0): 40, ("t", 1): 45}
TPS = [("t", 0), ("t", 1)]


def plan(spec, **kw):
    args = dict(
        group_state="Empty", active_members=0, committed=COMMITTED, earliest=EARLIEST, latest=LATEST
    )
    args.update(kw)
    return {(r.topic, r.partition): r.new_offset for r in plan_offset_reset("g", spec, TPS, **args)}


def test_reset_specs():
    assert plan(ToEarliest()) == {("t", 0): 10, ("t", 1): 0}
    assert plan(ToLatest()) == {("t", 0): 100, ("t", 1): 50}
    assert plan(ToOffset(20)) == {("t", 0): 20, ("t", 1): 20}
    assert plan(ToOffset(5)) == {("t", 0): 10, ("t", 1): 5}  # clamped to earliest
    assert plan(ShiftBy(10)) == {("t", 0): 50, ("t", 1): 50}  # clamped to latest
    assert plan(ShiftBy(-45)) == {("t", 0): 10, ("t", 1): 0}
    times = {("t", 0): 70, ("t", 1): None}  # no record that late in t-1: its end
    assert plan(ToDatetime(1_700_000_000_000), offsets_for_times=times) == {
        ("t", 0): 70,
        ("t", 1): 50,
    }
    rows = plan_offset_reset(
        "g",
        ToEarliest(),
        TPS,
        group_state="Dead",
        active_members=0,
        committed={},
        earliest=EARLIEST,
        latest=LATEST,
    )
    assert rows[0] == PartitionReset("t", 0, None, 10)


def test_reset_refusals_are_typed():
    with pytest.raises(NonEmptyGroupError, match=r"inactive.*Stable"):
        plan(ToEarliest(), group_state="Stable", active_members=2)
    with pytest.raises(InvalidRequestError, match="no committed offset"):
        plan(ShiftBy(1), committed={("t", 0): 1})
    with pytest.raises(InvalidRequestError, match="offsets_for_times"):
        plan(ToDatetime(0))
    with pytest.raises(InvalidRequestError, match="earliest/latest"):
        plan(ToEarliest(), latest={})


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 50), st.integers(0, 50), st.integers(-200, 200), st.integers(-10, 200))
def test_reset_always_lands_in_range(low, width, shift, offset):
    high = low + width
    for spec in (ShiftBy(shift), ToOffset(offset)):
        rows = plan_offset_reset(
            "g",
            spec,
            [("t", 0)],
            group_state="Empty",
            active_members=0,
            committed={("t", 0): low},
            earliest={("t", 0): low},
            latest={("t", 0): high},
        )
        assert low <= rows[0].new_offset <= high


def test_scope_selection():
    counts = {"t": 3, "u": 2}
    assert reset_scope(
        topics=None, all_topics=True, partitions_per_topic=counts, committed={("u", 1): 4}
    ) == [("u", 0), ("u", 1)]
    assert reset_scope(
        topics=["t:0,2", "u"], all_topics=False, partitions_per_topic=counts, committed={}
    ) == [("t", 0), ("t", 2), ("u", 0), ("u", 1)]
    assert parse_topic_selector("t") == ("t", None)
    with pytest.raises(InvalidRequestError, match="exactly one"):
        reset_scope(topics=["t"], all_topics=True, partitions_per_topic=counts, committed={})
    with pytest.raises(InvalidRequestError, match="exactly one"):
        reset_scope(topics=None, all_topics=False, partitions_per_topic=counts, committed={})
    with pytest.raises(UnknownTopicOrPartitionError, match="does not exist"):
        reset_scope(topics=["nope"], all_topics=False, partitions_per_topic=counts, committed={})
    with pytest.raises(UnknownTopicOrPartitionError, match="3 partitions"):
        reset_scope(topics=["t:3"], all_topics=False, partitions_per_topic=counts, committed={})
    for bad in ("t:x", ":1", "t:", "t:-1"):
        with pytest.raises(InvalidRequestError):
            parse_topic_selector(bad)


# --- --by-duration and --from-file -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("PT10M", 600_000),
        ("P1DT2H", 93_600_000),
        ("PT0.5S", 500),
        ("pt1m30s", 90_000),
        ("P2D", 172_800_000),
        ("PT1.0019S", 1_001),  # below a millisecond: dropped
        ("-PT1H", -3_600_000),  # Java's Duration.parse takes signs (the future: the log end)
        ("PT-6H3M", -21_420_000),
        (" PT5S ", 5_000),
    ],
)
def test_parse_duration_as_java_reads_it(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["10m", "P1M", "P1Y", "PT", "P", "", "P1DT", "PT1H2", "1D", "P1W"])
def test_bad_durations_are_refused_with_a_typed_error(text):
    with pytest.raises(InvalidRequestError, match="ISO 8601 duration"):
        parse_duration_ms(text)


def test_by_duration_plans_like_to_datetime():
    times = {("t", 0): 70, ("t", 1): None}
    assert plan(ByDuration(600_000), offsets_for_times=times) == {("t", 0): 70, ("t", 1): 50}
    with pytest.raises(InvalidRequestError, match="--by-duration needs"):
        plan(ByDuration(1))


def test_reset_csv_round_trips_kafkas_export_format():
    spec = parse_reset_csv("t,1,30\n\nt,0,5\n")
    assert spec == FromFile((("t", 0, 5), ("t", 1, 30)))
    assert plan(spec) == {("t", 0): 10, ("t", 1): 30}  # clamped to earliest, as every strategy
    rows = [PartitionReset("t", 0, 40, 12), PartitionReset("u", 3, None, 0)]
    assert export_csv(rows) == "t,0,12\nu,3,0\n"
    assert parse_reset_csv(export_csv(rows)).as_mapping() == {("t", 0): 12, ("u", 3): 0}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("t,0", r"line 1 .*expected topic,partition,offset"),
        ("g,t,0,5", "several-group export"),
        ("t,0,5\nt,x,5", r"line 2 .*integers"),
        ("t,0,-1", ">= 0"),
        ("t,-1,0", ">= 0"),
        (",0,1", "empty topic"),
        ("t,0,1\nt,0,2", r"line 2 .*t-0 is given twice"),
        ("\n\n", "names no partition"),
    ],
)
def test_bad_reset_csv_lines_are_refused_naming_the_line(text, message):
    with pytest.raises(InvalidRequestError, match=message):
        parse_reset_csv(text)


def test_from_file_scope_is_the_files_partitions():
    counts = {"t": 3, "u": 2}
    spec = parse_reset_csv("u,1,4\nt,2,0\n")
    assert reset_scope(
        topics=None, all_topics=False, partitions_per_topic=counts, committed={}, from_file=spec
    ) == [("t", 2), ("u", 1)]
    with pytest.raises(UnknownTopicOrPartitionError, match="3 partitions"):
        reset_scope(
            topics=None,
            all_topics=False,
            partitions_per_topic=counts,
            committed={},
            from_file=parse_reset_csv("t,3,0"),
        )
    with pytest.raises(UnknownTopicOrPartitionError, match="does not exist"):
        reset_scope(
            topics=None,
            all_topics=False,
            partitions_per_topic=counts,
            committed={},
            from_file=parse_reset_csv("nope,0,0"),
        )
    with pytest.raises(InvalidRequestError, match="neither"):
        reset_scope(
            topics=["t"],
            all_topics=False,
            partitions_per_topic=counts,
            committed={},
            from_file=spec,
        )
    with pytest.raises(InvalidRequestError, match="not in the --from-file plan"):
        plan(parse_reset_csv("t,0,20"))  # TPS has t-1 too


# -- time lag ------------------------------------------------------------------------------------


def test_time_lag_is_now_minus_the_first_uncommitted_records_timestamp() -> None:
    now = 1_700_000_100_000
    assert time_lag_seconds(5, 9, now - 42_500, now) == 42.5
    assert time_lag_seconds(9, 9, None, now) == 0.0  # caught up: nothing waits
    assert time_lag_seconds(12, 9, None, now) == 0.0  # committed past the end (truncation)
    assert time_lag_seconds(5, 9, now + 3_000, now) == 0.0  # producer clock ahead: never < 0
    assert time_lag_seconds(None, 9, now, now) is None  # nothing committed
    assert time_lag_seconds(-1, 9, now, now) is None
    assert time_lag_seconds(5, None, now, now) is None  # partition gone
    assert time_lag_seconds(5, 9, None, now) is None  # record not read
    assert time_lag_seconds(5, 9, -1, now) is None  # record without a timestamp


@given(
    st.integers(0, 1000), st.integers(0, 1000), st.integers(0, 10**13), st.integers(0, 10**13)
)
def test_time_lag_is_zero_exactly_when_caught_up(
    committed: int, end: int, stamp: int, now: int
) -> None:
    lag = time_lag_seconds(committed, end, stamp, now)
    assert lag is not None and lag >= 0
    if committed >= end:
        assert lag == 0
    else:
        assert lag == max(now - stamp, 0) / 1000


def test_lag_rows_carry_time_lag_only_when_asked() -> None:
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    plain = lag_rows({tp0: 3, tp1: 5}, {tp0: 8, tp1: 5})
    assert [r.time_lag_s for r in plain] == [None, None]
    timed = lag_rows({tp0: 3, tp1: 5}, {tp0: 8, tp1: 5}, (), {tp0: 1_000}, now_ms=61_000)
    assert [(r.lag, r.time_lag_s) for r in timed] == [(5, 60.0), (0, 0.0)]
