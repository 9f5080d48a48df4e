"""AdminClient group API and ``fjord groups`` against the shared local cluster (controllers,
brokers, coordinators): listing, describing with lag checked against produced counts, offset
resets (dry run vs --execute, every scenario), refusals while a group has an active member,
deletion. The active member speaks the coordinator protocol with raw RPCs, so these tests do
not depend on the Consumer's group code."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner, Result

from fjord._proto import broker_pb2, broker_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc
from fjord.cli.groups_cmd import OFFSET_HEADERS
from fjord.cli.main import cli
from fjord.client import AdminClient, NewTopic, OffsetAndMetadata, Producer, TopicPartition
from fjord.client.admin import ConsumerGroupListing
from fjord.errors import ErrorCode, GroupIdNotFoundError, KafkaTimeoutError, NonEmptyGroupError
from fjord.groups.protocol import (
    Assignment,
    Subscription,
    encode_assignment,
    encode_subscription,
)
from fjord.local.cluster import LocalCluster
from fjord.testing.waiting import wait_for

pytestmark = pytest.mark.integration

WAIT_S = 60.0
#: Records produced per partition of the module's topic, and their timestamps: partition 0
#: has one record per second from BASE_MS, partition 1 likewise (3 records), partition 2 none.
#: BASE_MS is recent (retention must not delete the records) and on a whole second.
COUNTS = {0: 5, 1: 3, 2: 0}
BASE_MS = (int(time.time()) - 600) * 1000
RETRIABLE = {
    ErrorCode.NOT_COORDINATOR.code,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS.code,
    ErrorCode.COORDINATOR_NOT_AVAILABLE.code,
}


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> Iterator[AdminClient]:
    with AdminClient({"bootstrap.servers": bootstrap, "client.id": "g4-admin"}) as client:
        yield client


@pytest.fixture(scope="module")
def topic(admin: AdminClient, bootstrap: str) -> str:
    name = _name("groups-admin")
    admin.create_topics([NewTopic(name, len(COUNTS), 2)])
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 0}) as producer:
        futures = [
            producer.send(name, f"r{i}", partition=p, timestamp_ms=BASE_MS + 1000 * i)
            for p, count in COUNTS.items()
            for i in range(count)
        ]
        producer.flush()
        for future in futures:
            future.result(WAIT_S)
    return name


def run(bootstrap: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["groups", *args, "--bootstrap-server", bootstrap])


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.output, result.stderr, result.exception)
    return result.stdout


def one_line_error(result: Result) -> str:
    assert result.exit_code == 1, (result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr
    assert len(lines) == 1, result.stderr
    return lines[0]


def committed(admin: AdminClient, group: str) -> dict[int, int]:
    return {
        tp.partition: o.offset
        for tp, o in admin.list_consumer_group_offsets(group).items()
        if o is not None
    }


def test_simple_group_list_describe_lag(admin: AdminClient, topic: str, bootstrap: str) -> None:
    group = _name("lag")
    tp0, tp1, tp2 = (TopicPartition(topic, p) for p in range(3))
    assert admin.alter_consumer_group_offsets(
        group, {tp0: 2, tp1: OffsetAndMetadata(3, "note")}
    ) == {tp0: None, tp1: None}

    offsets = admin.list_consumer_group_offsets(group)
    assert offsets == {tp0: OffsetAndMetadata(2, "", None), tp1: OffsetAndMetadata(3, "note")}
    assert admin.list_consumer_group_offsets(group, [tp0, tp2]) == {
        tp0: OffsetAndMetadata(2, "", None),
        tp2: None,
    }

    assert admin.list_offsets({tp0: "earliest", tp1: "latest", tp2: BASE_MS}) == {
        tp0: 0,
        tp1: COUNTS[1],
        tp2: None,  # no record at all, so none that late
    }
    assert admin.list_offsets({tp0: BASE_MS + 1500}) == {tp0: 2}

    listed = admin.list_consumer_groups()
    assert ConsumerGroupListing(group, "Empty", "") in listed
    assert group not in {g.group_id for g in admin.list_consumer_groups(["Stable"])}

    description = admin.describe_consumer_groups([group])[group]
    assert (description.state, description.members) == ("Empty", ())
    before_ms = time.time() * 1000
    rows = admin.describe_consumer_group_lag(group)
    after_ms = time.time() * 1000
    assert [(r.partition, r.current_offset, r.log_end_offset, r.lag) for r in rows] == [
        (0, 2, COUNTS[0], COUNTS[0] - 2),
        (1, 3, COUNTS[1], 0),
    ]
    assert all(r.consumer_id is None for r in rows)
    # Time lag: now minus the timestamp of the first record not committed (offset 2 of
    # partition 0 was stamped BASE_MS + 2000); 0 where the group is caught up.
    first_uncommitted_ms = BASE_MS + 2000
    assert rows[0].time_lag_s is not None
    assert (before_ms - first_uncommitted_ms) / 1000 <= rows[0].time_lag_s
    assert rows[0].time_lag_s <= (after_ms - first_uncommitted_ms) / 1000
    assert rows[1].time_lag_s == 0

    data = json.loads(ok(run(bootstrap, "describe", "--group", group, "-o", "json")))
    assert data["state"] == "Empty" and data["group"] == group
    assert [
        (r["partition"], r["current_offset"], r["log_end_offset"], r["lag"]) for r in data["rows"]
    ] == [(0, 2, 5, 3), (1, 3, 3, 0)]
    assert data["rows"][0]["time_lag_seconds"] >= rows[0].time_lag_s
    assert data["rows"][1]["time_lag_seconds"] == 0
    table = ok(run(bootstrap, "describe", "--group", group))
    assert f"Consumer group '{group}' has no active members." in table
    header, _, *lines = table.splitlines()[1:]
    assert header.split() == list(OFFSET_HEADERS)
    cells = [line.split() for line in lines]
    assert [row[:6] + row[7:] for row in cells] == [
        [group, topic, "0", "2", "5", "3", "-", "-", "-"],
        [group, topic, "1", "3", "3", "0", "-", "-", "-"],
    ]
    assert re.fullmatch(r"\d+d\d\dh|\d+h\d\dm|\d+m\d\ds|[\d.]+s", cells[0][6]), cells[0]
    assert cells[0][6] != "0s" and cells[1][6] == "0s"
    assert group in ok(run(bootstrap, "list")).split()
    assert re.search(rf"^{re.escape(group)}\s+Empty\b", ok(run(bootstrap, "list", "--state")), re.M)
    listed_json = json.loads(ok(run(bootstrap, "list", "--state", "Empty", "-o", "json")))
    assert {"group": group, "state": "Empty", "protocol_type": ""} in listed_json
    every = json.loads(ok(run(bootstrap, "describe", "--all-groups", "-o", "json")))
    assert {"group": group, "state": "Empty"}.items() <= next(
        d for d in every if d["group"] == group
    ).items()
    state = ok(run(bootstrap, "describe", "--group", group, "--state"))
    assert "Empty" in state and "COORDINATOR" in state


def test_cluster_describe_names_the_coordinators(
    admin: AdminClient,
    bootstrap: str,
    local_cluster: LocalCluster,
) -> None:
    """Listing groups asks the coordinators DescribeCluster names: they are the live ones."""
    expected = set(local_cluster.coordinator_addresses.values())
    assert expected
    assert {c.address for c in admin.describe_cluster().coordinators} == expected
    data = json.loads(
        CliRunner()
        .invoke(cli, ["cluster", "describe", "-o", "json", "--bootstrap-server", bootstrap])
        .stdout
    )
    assert {f"{c['host']}:{c['port']}" for c in data["coordinators"]} == expected


def test_unknown_group(admin: AdminClient, bootstrap: str) -> None:
    group = _name("never")
    assert admin.describe_consumer_groups([group])[group].state == "Dead"
    assert admin.list_consumer_group_offsets(group) == {}
    assert "Consumer group" in one_line_error(run(bootstrap, "describe", "--group", group))
    assert "GROUP_ID_NOT_FOUND" in one_line_error(run(bootstrap, "describe", "--group", group))
    assert "GROUP_ID_NOT_FOUND" in one_line_error(run(bootstrap, "delete", "--group", group))
    with pytest.raises(GroupIdNotFoundError):
        admin.delete_consumer_groups([group])


def test_reset_offsets_dry_run_then_execute(admin: AdminClient, topic: str, bootstrap: str) -> None:
    group = _name("reset")
    admin.alter_consumer_group_offsets(
        group, {TopicPartition(topic, 0): 4, TopicPartition(topic, 1): 1}
    )

    def reset(*args: str) -> dict[str, Any]:
        return json.loads(
            ok(run(bootstrap, "reset-offsets", "--group", group, "-o", "json", *args))
        )

    dry = reset("--all-topics", "--to-earliest")
    assert dry["executed"] is False
    assert [(p["partition"], p["current_offset"], p["new_offset"]) for p in dry["plan"]] == [
        (0, 4, 0),
        (1, 1, 0),
        (2, None, 0),  # --all-topics: every partition of the topics with committed offsets
    ]
    assert committed(admin, group) == {0: 4, 1: 1}  # a dry run changes nothing
    table = run(bootstrap, "reset-offsets", "--group", group, "--all-topics", "--to-earliest")
    assert "NEW-OFFSET" in ok(table) and "--execute" in table.stderr

    reset("--topic", f"{topic}:0", "--shift-by", "-3", "--execute")
    assert committed(admin, group) == {0: 1, 1: 1}
    plan = reset("--topic", topic, "--to-offset", "100", "--execute")["plan"]
    assert [p["new_offset"] for p in plan] == [COUNTS[0], COUNTS[1], COUNTS[2]]  # clamped
    assert committed(admin, group) == {0: 5, 1: 3, 2: 0}
    # The first record at or after BASE + 2.5 s: offset 3 in partition 0; partitions 1 and 2
    # have none that late, so they go to their log end.
    when = datetime.fromtimestamp((BASE_MS + 2500) / 1000, UTC).isoformat()
    reset("--topic", topic, "--to-datetime", when, "--execute")
    assert committed(admin, group) == {0: 3, 1: 3, 2: 0}
    reset("--all-topics", "--to-earliest", "--execute")
    assert committed(admin, group) == {0: 0, 1: 0, 2: 0}
    reset("--all-topics", "--to-latest", "--execute")
    assert committed(admin, group) == {0: 5, 1: 3, 2: 0}

    assert "UNKNOWN_TOPIC_OR_PARTITION" in one_line_error(
        run(bootstrap, "reset-offsets", "--group", group, "--topic", _name("nope"), "--to-earliest")
    )
    assert "UNKNOWN_TOPIC_OR_PARTITION" in one_line_error(
        run(bootstrap, "reset-offsets", "--group", group, "--topic", f"{topic}:7", "--to-earliest")
    )


def test_reset_offsets_by_duration_and_from_file(
    admin: AdminClient, topic: str, bootstrap: str, tmp_path: Path
) -> None:
    group = _name("reset-file")
    admin.alter_consumer_group_offsets(group, {TopicPartition(topic, 0): 1})

    def reset(*args: str) -> dict[str, Any]:
        return json.loads(
            ok(run(bootstrap, "reset-offsets", "--group", group, "-o", "json", *args))
        )

    # Now minus an hour is before every record (BASE is 10 minutes ago): the earliest offsets;
    # now minus a minute is after every record: the log ends.
    reset("--topic", topic, "--by-duration", "PT1H", "--execute")
    assert committed(admin, group) == {0: 0, 1: 0, 2: 0}
    reset("--topic", topic, "--by-duration", "PT1M", "--execute")
    assert committed(admin, group) == {0: 5, 1: 3, 2: 0}
    # Just after partition 0's record 2 (BASE + 2 s): its record 3 is the first that late,
    # unless the command's "now" came a whole second after ours.

    def first_at_or_after(timestamp_ms: int) -> int:
        return next((i for i in range(COUNTS[0]) if BASE_MS + 1000 * i >= timestamp_ms), COUNTS[0])

    before_ms = round(time.time() * 1000)
    duration_ms = before_ms - (BASE_MS + 2001)
    reset(
        "--topic",
        f"{topic}:0",
        "--by-duration",
        f"PT{duration_ms // 1000}.{duration_ms % 1000:03d}S",
        "--execute",
    )
    after_ms = round(time.time() * 1000)
    lowest, highest = (first_at_or_after(t - duration_ms) for t in (before_ms, after_ms))
    assert lowest == 3
    assert lowest <= committed(admin, group)[0] <= highest

    # --export writes the plan as CSV; --from-file reads it back (Kafka's tool does the same).
    exported = ok(
        run(
            bootstrap,
            "reset-offsets",
            "--group",
            group,
            "--all-topics",
            "--to-earliest",
            "--export",
        )
    )
    assert exported.splitlines() == [f"{topic},{p},0" for p in range(3)]
    plan_file = tmp_path / "plan.csv"
    plan_file.write_text(f"{topic},1,2\n{topic},0,4\n")
    plan = reset("--from-file", str(plan_file), "--execute")["plan"]
    assert [(p["partition"], p["new_offset"]) for p in plan] == [(0, 4), (1, 2)]
    assert committed(admin, group) == {0: 4, 1: 2, 2: 0}
    plan_file.write_text(exported)
    reset("--from-file", str(plan_file), "--execute")
    assert committed(admin, group) == {0: 0, 1: 0, 2: 0}

    plan_file.write_text(f"{topic},7,0\n")
    assert "UNKNOWN_TOPIC_OR_PARTITION" in one_line_error(
        run(bootstrap, "reset-offsets", "--group", group, "--from-file", str(plan_file))
    )
    plan_file.write_text(f"{topic},0,0\n{topic},one,0\n")
    bad_line = run(bootstrap, "reset-offsets", "--group", group, "--from-file", str(plan_file))
    assert bad_line.exit_code == 2 and "line 2" in bad_line.stderr
    bad_duration = run(
        bootstrap, "reset-offsets", "--group", group, "--all-topics", "--by-duration", "10m"
    )
    assert bad_duration.exit_code == 2 and "ISO 8601 duration" in bad_duration.stderr
    assert committed(admin, group) == {0: 0, 1: 0, 2: 0}  # refused plans changed nothing


# --- a raw member: JoinGroup/SyncGroup/LeaveGroup through the coordinator's RPCs -----------


def _until_ok(call: Callable[[], Any], error_of: Callable[[Any], int], what: str) -> Any:
    """Retry ``call`` while it answers a retriable coordinator error (bounded)."""
    # The coordinator is loading or moving: asking again is the only way to know when it is done.
    return wait_for(
        call,
        f"{what} without a retriable error",
        WAIT_S,
        interval=0.2,
        accept=lambda response: error_of(response) not in RETRIABLE,
    )


class RawMember:
    """One consumer group member driven by hand (session long enough for the test)."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.group = group
        self.topic = topic
        broker = broker_pb2_grpc.BrokerStub(grpc.insecure_channel(bootstrap.split(",")[0]))
        found = _until_ok(
            lambda: broker.FindCoordinator(
                broker_pb2.FindCoordinatorRequest(key=group), timeout=10
            ),
            lambda r: r.error.code,
            "FindCoordinator",
        )
        assert found.error.code == 0, found.error
        address = f"{found.coordinator.host}:{found.coordinator.port}"
        self.channel = grpc.insecure_channel(address)
        self.stub = coordinator_pb2_grpc.CoordinatorStub(self.channel)
        self.member_id = ""
        self.generation = -1

    def join_and_sync(self, partitions: list[int]) -> None:
        metadata = encode_subscription(Subscription((self.topic,)))

        def join() -> coordinator_pb2.JoinGroupResponse:
            return self.stub.JoinGroup(
                coordinator_pb2.JoinGroupRequest(
                    group_id=self.group,
                    session_timeout_ms=120_000,
                    rebalance_timeout_ms=60_000,
                    member_id=self.member_id,
                    protocol_type="consumer",
                    protocols=[coordinator_pb2.JoinGroupProtocol(name="range", metadata=metadata)],
                    client_id="g4-raw-member",
                ),
                timeout=WAIT_S,
            )

        joined = _until_ok(join, lambda r: r.error.code, "JoinGroup")
        if joined.error.code == ErrorCode.MEMBER_ID_REQUIRED.code:
            self.member_id = joined.member_id
            joined = _until_ok(join, lambda r: r.error.code, "JoinGroup")
        assert joined.error.code == 0, joined.error
        assert joined.leader == joined.member_id
        self.member_id, self.generation = joined.member_id, joined.generation_id
        assignment = encode_assignment(Assignment(tuple((self.topic, p) for p in partitions)))
        synced = self.stub.SyncGroup(
            coordinator_pb2.SyncGroupRequest(
                group_id=self.group,
                generation_id=self.generation,
                member_id=self.member_id,
                protocol_type="consumer",
                protocol_name=joined.protocol_name,
                assignments=[
                    coordinator_pb2.SyncGroupAssignment(
                        member_id=self.member_id, assignment=assignment
                    )
                ],
            ),
            timeout=WAIT_S,
        )
        assert synced.error.code == 0, synced.error

    def commit(self, offsets: dict[int, int]) -> None:
        response = self.stub.OffsetCommit(
            coordinator_pb2.OffsetCommitRequest(
                group_id=self.group,
                generation_id=self.generation,
                member_id=self.member_id,
                topics=[
                    coordinator_pb2.OffsetCommitTopic(
                        name=self.topic,
                        partitions=[
                            coordinator_pb2.OffsetCommitPartition(
                                partition=p, committed_offset=o, committed_leader_epoch=-1
                            )
                            for p, o in offsets.items()
                        ],
                    )
                ],
            ),
            timeout=WAIT_S,
        )
        codes = [p.error.code for t in response.topics for p in t.partitions]
        assert response.error.code == 0 and codes == [0] * len(offsets), response

    def leave(self) -> None:
        if self.member_id:
            self.stub.LeaveGroup(
                coordinator_pb2.LeaveGroupRequest(
                    group_id=self.group,
                    members=[coordinator_pb2.MemberIdentity(member_id=self.member_id)],
                ),
                timeout=WAIT_S,
            )
            self.member_id = ""
        self.channel.close()


def test_active_group_is_described_and_protected(
    admin: AdminClient, topic: str, bootstrap: str
) -> None:
    group = _name("active")
    member = RawMember(bootstrap, group, topic)
    try:
        member.join_and_sync([0, 1])
        member.commit({0: 1, 1: 2})

        description = admin.describe_consumer_groups([group])[group]
        assert (description.state, description.partition_assignor) == ("Stable", "range")
        (described,) = description.members
        assert (described.member_id, described.client_id) == (member.member_id, "g4-raw-member")
        assert described.host
        assert described.assignment == (TopicPartition(topic, 0), TopicPartition(topic, 1))
        rows = admin.describe_consumer_group_lag(group, description=description)
        assert [
            (r.partition, r.current_offset, r.log_end_offset, r.lag, r.consumer_id) for r in rows
        ] == [(0, 1, 5, 4, member.member_id), (1, 2, 3, 1, member.member_id)]
        assert {g.group_id: g.state for g in admin.list_consumer_groups(["Stable"])}[group] == (
            "Stable"
        )
        data = json.loads(ok(run(bootstrap, "describe", "--group", group, "-o", "json")))
        assert data["state"] == "Stable"
        assert [r["consumer_id"] for r in data["rows"]] == [member.member_id] * 2
        assert [r["client_id"] for r in data["rows"]] == ["g4-raw-member"] * 2
        members = ok(run(bootstrap, "describe", "--group", group, "--members", "--verbose"))
        assert member.member_id in members and "is Stable with 1 active member(s)" in members
        assert f"{topic}(0,1)" in members

        # Everything that would overwrite the member's offsets is refused, and changes nothing.
        refused = one_line_error(
            run(
                bootstrap,
                "reset-offsets",
                "--group",
                group,
                "--all-topics",
                "--to-earliest",
                "--execute",
            )
        )
        assert "NON_EMPTY_GROUP" in refused and "inactive" in refused and "Stable" in refused
        with pytest.raises(NonEmptyGroupError):
            admin.alter_consumer_group_offsets(group, {TopicPartition(topic, 0): 0})
        assert committed(admin, group) == {0: 1, 1: 2}
        deleted = run(bootstrap, "delete", "--group", group)
        assert deleted.exit_code == 1
        assert f"Group '{group}' could not be deleted due to: NON_EMPTY_GROUP" in deleted.stderr
        assert admin.delete_consumer_groups([group], raise_on_error=False)[group] is not None
        assert committed(admin, group) == {0: 1, 1: 2}
    finally:
        member.leave()

    assert admin.describe_consumer_groups([group])[group].state == "Empty"
    assert f"('{group}') was successful" in ok(run(bootstrap, "delete", "--group", group))
    assert admin.describe_consumer_groups([group])[group].state == "Dead"
    assert admin.list_consumer_group_offsets(group) == {}
    assert group not in {g.group_id for g in admin.list_consumer_groups()}


def test_admin_rediscovers_a_killed_coordinator(tmp_path: Path) -> None:
    """A private cluster: SIGKILL the coordinator of a group. The admin client's next calls
    (started at once, while FindCoordinator still names the dead one) retry with rediscovery
    and get the same offsets from the coordinator that took the partition over; listing skips
    nothing; with no coordinator left, calls fail with a timeout naming the reason."""
    cluster = LocalCluster(
        tmp_path,
        brokers=1,
        controllers=1,
        coordinators=2,
        coordinator_lease_ttl_s=3,
        unsafe_etcd_no_fsync=True,
    )
    cluster.start()
    try:
        config = {"bootstrap.servers": cluster.bootstrap_servers, "client.id": "g4-failover"}
        with AdminClient(config) as admin:
            topic = _name("failover")
            admin.create_topics([NewTopic(topic, 1, 1)])
            group = _name("failover")
            tp = TopicPartition(topic, 0)
            admin.alter_consumer_group_offsets(group, {tp: 7})
            before = admin.describe_consumer_groups([group])[group].coordinator
            (killed,) = [i for i, a in cluster.coordinator_addresses.items() if a == before]
            cluster.kill("coordinator", killed)

            assert admin.list_consumer_group_offsets(group) == {tp: OffsetAndMetadata(7)}
            after = admin.describe_consumer_groups([group])[group]
            assert after.state == "Empty" and after.coordinator != before
            assert ConsumerGroupListing(group, "Empty", "") in admin.list_consumer_groups()

            (survivor,) = [i for i in cluster.coordinator_addresses if i != killed]
            cluster.kill("coordinator", survivor)
            with pytest.raises(KafkaTimeoutError, match="no group coordinator is running"):
                # Both leases (3 s) run out well within the 10 s: the last error says why.
                admin.list_consumer_groups(timeout=10)
            with pytest.raises(KafkaTimeoutError, match=r"DescribeGroups\('.+'\) did not succeed"):
                admin.describe_consumer_groups([group], timeout=3)
    finally:
        cluster.stop()
