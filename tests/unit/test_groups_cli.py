"""``fjord groups``: option parsing, rendering, and the admin client's pure group helpers
(error extraction, member decoding, commit requests). No cluster: usage errors are raised
before any connection is made."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click
import pytest
from click.testing import CliRunner

from fjord._proto import common_pb2, coordinator_pb2
from fjord.cli.groups_cmd import (
    OFFSET_HEADERS,
    describe_json,
    format_assignment,
    format_time_lag,
    group_summary,
    member_rows,
    offset_rows,
    parse_datetime_ms,
    parse_states,
    plan_json,
    plan_rows,
    require_existing,
    reset_spec,
    state_row,
)
from fjord.cli.main import cli
from fjord.client import AdminClient, OffsetAndMetadata, TopicPartition
from fjord.client.admin import (
    ConsumerGroupDescription,
    ConsumerGroupListing,
    MemberDescription,
    _coordinator_errors,
    _decode_member,
    _group_error,
    _group_states,
    _offset_request_topics,
)
from fjord.errors import (
    CorruptRecordError,
    ErrorCode,
    FjordError,
    GroupIdNotFoundError,
    InvalidGroupIdError,
    InvalidRequestError,
    NonEmptyGroupError,
)
from fjord.groups.lag import (
    ByDuration,
    FromFile,
    LagRow,
    PartitionReset,
    ShiftBy,
    ToDatetime,
    ToEarliest,
    ToLatest,
    ToOffset,
)
from fjord.groups.protocol import Assignment, encode_assignment

MEMBER = MemberDescription("c-1", None, "app", "/10.0.0.1", (TopicPartition("orders", 0),))
STABLE = ConsumerGroupDescription("g", "Stable", "consumer", "range", (MEMBER,), "h:1")
EMPTY = ConsumerGroupDescription("g", "Empty", "consumer", "", (), "h:1")
ROWS = [
    LagRow("orders", 0, 5, 9, 4, "c-1", "/10.0.0.1", "app", 192.5),
    LagRow("orders", 1, None, 7, None, None, None, None),
]


def _spec(**given: object) -> object:
    options: dict[str, object] = {
        "to_earliest": False,
        "to_latest": False,
        "to_offset": None,
        "to_datetime": None,
        "shift_by": None,
    }
    options.update(given)
    return reset_spec(**options)  # type: ignore[arg-type]


def test_reset_spec_picks_exactly_one_scenario() -> None:
    assert _spec(to_earliest=True) == ToEarliest()
    assert _spec(to_latest=True) == ToLatest()
    assert _spec(to_offset=7) == ToOffset(7)
    assert _spec(shift_by=-3) == ShiftBy(-3)
    assert _spec(to_datetime="2026-01-02T03:04:05.678Z") == ToDatetime(
        int(datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC).timestamp() * 1000)
    )
    with pytest.raises(click.UsageError, match="exactly one"):
        _spec()
    with pytest.raises(click.UsageError, match="exactly one"):
        _spec(to_earliest=True, shift_by=1)
    with pytest.raises(click.BadParameter, match=">= 0"):
        _spec(to_offset=-1)
    assert _spec(by_duration="PT10M") == ByDuration(600_000)
    assert _spec(from_file="t,0,5\n") == FromFile((("t", 0, 5),))
    with pytest.raises(click.UsageError, match="exactly one"):
        _spec(by_duration="PT1H", to_latest=True)
    with pytest.raises(click.BadParameter, match="ISO 8601 duration"):
        _spec(by_duration="10 minutes")
    with pytest.raises(click.BadParameter, match="line 2"):
        _spec(from_file="t,0,5\nt,zero,5\n")


def test_parse_datetime_zones() -> None:
    assert parse_datetime_ms("1970-01-01T00:00:01Z") == 1000
    assert parse_datetime_ms("1970-01-01T02:00:00.250+02:00") == 250
    naive = parse_datetime_ms("2026-05-01T12:00:00")
    assert naive == round(datetime(2026, 5, 1, 12).timestamp() * 1000)  # local time, as Kafka
    with pytest.raises(click.BadParameter, match="ISO 8601"):
        parse_datetime_ms("yesterday")


def test_time_lag_reads_as_a_person_reads_it() -> None:
    cases = [(None, "-"), (0.0, "0s"), (4.25, "4.2s"), (59.9, "59.9s"), (192.5, "3m12s"),
             (7500, "2h05m"), (3 * 86400 + 4 * 3600 + 5, "3d04h")]
    assert [format_time_lag(s) for s, _ in cases] == [text for _, text in cases]


def test_parse_states() -> None:
    assert parse_states("Stable, Empty,") == ["Stable", "Empty"]
    assert parse_states("") == []


def test_offset_rows_and_json() -> None:
    assert offset_rows("g", ROWS) == [
        ("g", "orders", 0, 5, 9, 4, "3m12s", "c-1", "/10.0.0.1", "app"),
        ("g", "orders", 1, "-", 7, "-", "-", "-", "-", "-"),
    ]
    assert len(OFFSET_HEADERS) == len(offset_rows("g", ROWS)[0])
    data = describe_json(STABLE, ROWS)
    assert data["state"] == "Stable" and data["group"] == "g"
    assert data["rows"][1] == {
        "topic": "orders",
        "partition": 1,
        "current_offset": None,
        "log_end_offset": 7,
        "lag": None,
        "time_lag_seconds": None,
        "consumer_id": None,
        "host": None,
        "client_id": None,
    }
    assert data["members"][0]["assignment"] == [{"topic": "orders", "partition": 0}]
    json.dumps(data)  # serializable as the command prints it


def test_summary_member_and_state_rows() -> None:
    assert group_summary(EMPTY) == "Consumer group 'g' has no active members."
    assert group_summary(STABLE) == (
        "Consumer group 'g' is Stable with 1 active member(s), assignor range."
    )
    assert member_rows(STABLE) == [("g", "c-1", "-", "/10.0.0.1", "app", 1)]
    assert member_rows(STABLE, verbose=True)[0][-1] == "orders(0)"
    assert format_assignment([("orders", 1), ("audit", 2), ("orders", 0)]) == (
        "audit(2),orders(0,1)"
    )
    assert format_assignment([]) == "-"
    assert state_row(STABLE) == ("g", "h:1", "range", "Stable", 1)
    assert state_row(EMPTY) == ("g", "h:1", "-", "Empty", 0)


def test_require_existing() -> None:
    require_existing(EMPTY)
    dead = ConsumerGroupDescription("nope", "Dead", "", "", (), "h:1")
    with pytest.raises(GroupIdNotFoundError, match="Consumer group 'nope' does not exist"):
        require_existing(dead)


def test_plan_rendering() -> None:
    plan = [PartitionReset("orders", 0, 5, 0), PartitionReset("orders", 1, None, 3)]
    assert plan_rows("g", plan) == [("g", "orders", 0, 0), ("g", "orders", 1, 3)]
    assert plan_json("g", plan, False) == {
        "group": "g",
        "executed": False,
        "plan": [
            {"topic": "orders", "partition": 0, "current_offset": 5, "new_offset": 0},
            {"topic": "orders", "partition": 1, "current_offset": None, "new_offset": 3},
        ],
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["reset-offsets", "--group", "g", "--to-earliest"],
            "--topic (repeatable) or --all-topics",
        ),
        (
            ["reset-offsets", "--group", "g", "--all-topics", "--topic", "t", "--to-earliest"],
            "--topic (repeatable) or --all-topics",
        ),
        (["reset-offsets", "--group", "g", "--all-topics"], "exactly one of --to-earliest"),
        (
            ["reset-offsets", "--group", "g", "--all-topics", "--to-latest", "--shift-by", "1"],
            "exactly one of --to-earliest",
        ),
        (
            [
                "reset-offsets",
                "--group",
                "g",
                "--all-topics",
                "--to-latest",
                "--dry-run",
                "--execute",
            ],
            "not both",
        ),
        (
            ["reset-offsets", "--group", "g", "--all-topics", "--to-datetime", "soon"],
            "ISO 8601",
        ),
        (["reset-offsets", "--all-topics", "--to-latest"], "Missing option '--group'"),
        (["describe"], "--group G (repeatable) or --all-groups"),
        (["describe", "--group", "g", "--all-groups"], "--group G (repeatable) or --all-groups"),
        (["delete"], "Missing option '--group'"),
    ],
)
def test_usage_errors_exit_2_before_connecting(args: list[str], message: str) -> None:
    result = CliRunner().invoke(
        cli, ["groups", *args, "--bootstrap-server", "127.0.0.1:1"], catch_exceptions=False
    )
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_coordinator_errors_walks_every_level() -> None:
    def err(code: ErrorCode) -> common_pb2.Error:
        return common_pb2.Error(code=code.code, message=code.name.lower())

    commit = coordinator_pb2.OffsetCommitResponse(
        error=err(ErrorCode.NONE),
        topics=[
            coordinator_pb2.OffsetCommitTopicResponse(
                name="t",
                partitions=[
                    coordinator_pb2.OffsetCommitPartitionResponse(
                        partition=0, error=err(ErrorCode.NOT_COORDINATOR)
                    ),
                    coordinator_pb2.OffsetCommitPartitionResponse(partition=1),
                ],
            )
        ],
    )
    assert _coordinator_errors(commit) == [(ErrorCode.NOT_COORDINATOR, "not_coordinator")]
    described = coordinator_pb2.DescribeGroupsResponse(
        groups=[coordinator_pb2.DescribedGroup(error=err(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))]
    )
    assert _coordinator_errors(described)[0][0] is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    deleted = coordinator_pb2.DeleteGroupsResponse(
        results=[coordinator_pb2.DeletableGroupResult(group_id="g")]
    )
    assert _coordinator_errors(deleted) == []
    listed = coordinator_pb2.ListGroupsResponse(
        error=err(ErrorCode.COORDINATOR_NOT_AVAILABLE),
        groups=[coordinator_pb2.ListedGroup(group_id="g", group_state="Empty")],
    )
    assert _coordinator_errors(listed) == [
        (ErrorCode.COORDINATOR_NOT_AVAILABLE, "coordinator_not_available")
    ]


def test_group_error_messages() -> None:
    assert _group_error("g", common_pb2.Error()) is None
    error = _group_error("g", common_pb2.Error(code=ErrorCode.NON_EMPTY_GROUP.code))
    assert isinstance(error, NonEmptyGroupError) and "The group is not empty." in str(error)
    error = _group_error("g", common_pb2.Error(code=ErrorCode.GROUP_ID_NOT_FOUND.code))
    assert isinstance(error, GroupIdNotFoundError) and "'g' does not exist" in str(error)
    error = _group_error("g", common_pb2.Error(code=ErrorCode.INVALID_GROUP_ID.code, message="x"))
    assert error is not None and error.code is ErrorCode.INVALID_GROUP_ID


def test_decode_member_assignment() -> None:
    raw = encode_assignment(Assignment((("orders", 2), ("audit", 0))))
    member = coordinator_pb2.DescribedGroupMember(
        member_id="m",
        group_instance_id="",
        client_id="c",
        client_host="/h",
        member_assignment=raw,
    )
    decoded = _decode_member(member, "consumer")
    assert decoded == MemberDescription(
        "m", None, "c", "/h", (TopicPartition("audit", 0), TopicPartition("orders", 2))
    )
    # Another protocol's bytes are not ConsumerProtocol: not decoded.
    assert _decode_member(member, "connect").assignment == ()
    static = coordinator_pb2.DescribedGroupMember(member_id="m", group_instance_id="i-1")
    assert _decode_member(static, "consumer").group_instance_id == "i-1"
    broken = coordinator_pb2.DescribedGroupMember(member_id="m", member_assignment=b"\x00")
    with pytest.raises(CorruptRecordError):
        _decode_member(broken, "consumer")


def test_offset_request_topics_groups_by_topic() -> None:
    topics = _offset_request_topics(
        {
            TopicPartition("b", 1): 10,
            TopicPartition("a", 0): OffsetAndMetadata(3, "why", 4),
            TopicPartition("b", 0): 0,
        }
    )
    assert [t.name for t in topics] == ["a", "b"]
    assert [(p.partition, p.committed_offset) for p in topics[1].partitions] == [(0, 0), (1, 10)]
    a0 = topics[0].partitions[0]
    assert (a0.committed_offset, a0.committed_metadata, a0.committed_leader_epoch) == (3, "why", 4)
    assert topics[1].partitions[0].committed_leader_epoch == -1


def test_group_states_are_checked_and_normalized() -> None:
    assert _group_states([" stable", "EMPTY", "PreparingRebalance"]) == [
        "Stable",
        "Empty",
        "PreparingRebalance",
    ]
    with pytest.raises(InvalidRequestError, match=r"unknown group state 'Stabel'.*Stable"):
        _group_states(["Stabel"])


def test_listing_simple_group_flag() -> None:
    assert ConsumerGroupListing("g", "Empty", "").is_simple_consumer_group
    assert not ConsumerGroupListing("g", "Stable", "consumer").is_simple_consumer_group


def test_admin_refuses_bad_group_input_before_any_request() -> None:
    """Nothing listens on port 1: each of these must fail on its own input, typed."""
    tp = TopicPartition("orders", 0)
    with AdminClient({"bootstrap.servers": "127.0.0.1:1", "default.api.timeout.ms": 2000}) as admin:
        with pytest.raises(FjordError, match="must be >= 0") as negative:
            admin.alter_consumer_group_offsets("g", {tp: -1})
        assert negative.value.code is ErrorCode.INVALID_COMMIT_OFFSET_SIZE
        with pytest.raises(InvalidGroupIdError, match="must not be empty"):
            admin.list_consumer_group_offsets("")
        with pytest.raises(InvalidGroupIdError):
            admin.describe_consumer_groups(["ok", ""])
        with pytest.raises(FjordError, match="'earliest', 'latest' or a timestamp") as spec:
            admin.list_offsets({tp: "soon"})  # type: ignore[dict-item]
        assert spec.value.code is ErrorCode.INVALID_REQUEST
        with pytest.raises(FjordError, match="must be >= 0"):
            admin.list_offsets({tp: -5})
        with pytest.raises(InvalidRequestError, match="unknown group state"):
            admin.list_consumer_groups(["Running"])
        assert admin.list_offsets({}) == {}
