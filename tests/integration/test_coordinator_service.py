"""The group coordinator service (``fjord coordinator``) through its gRPC API, with raw stubs,
against real processes: the shared local cluster (2 coordinators, real controller assigning
``__consumer_offsets``) for the group protocol, and a private cluster for failovers: a
coordinator SIGKILL (another coordinator takes the partition over, replays it and serves the
same offsets) and a coordinator frozen past its lease (its late writes are fenced).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import signal
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol, TypeVar

import grpc
import pytest

from fjord._proto import broker_pb2, broker_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc
from fjord.client import AdminClient, NewTopic, Producer
from fjord.controller.offsets_owners import plan_offsets_owners
from fjord.coordinator.appender import OffsetsAppender, replay_partitions
from fjord.coordinator.offsets_log import OffsetCommitKey, OffsetCommitValue, encode_record
from fjord.errors import ErrorCode, FjordError
from fjord.groups.assignors import leader_assignments
from fjord.groups.defaults import OFFSETS_TOPIC_PARTITIONS
from fjord.groups.offsets_topic import group_partition
from fjord.groups.protocol import Subscription, decode_assignment, encode_subscription
from fjord.local.cluster import LocalCluster
from fjord.local.etcd import EtcdProcess
from fjord.metadata import Keys, MetadataImage, MetadataWatcher, OffsetsOwner, etcd_client
from fjord.metadata.registration import register_under_lease
from fjord.testing.waiting import wait_for_async

pytestmark = pytest.mark.integration

T = TypeVar("T")

WAIT_S = 60.0  # generous bound of every wait on this loaded 2-core machine
ask_until = functools.partial(
    wait_for_async, timeout=WAIT_S, interval=0.1, retry_on=(grpc.aio.AioRpcError,)
)
"""Poll another process's view until it answers as wanted: there is no way to be told when a
coordinator has loaded a partition except asking it (an RPC error counts as "not yet")."""
RPC_TIMEOUT_S = 30.0  # parked JoinGroups wait for the initial rebalance delay (3 s) and more
SESSION_MS = 10_000
NONE = ErrorCode.NONE.code


async def find_coordinator(broker_address: str, group_id: str) -> str:
    """The coordinator address FindCoordinator gives once it is serving the group (the first
    lookup creates ``__consumer_offsets``; the owner then replays its partition)."""
    async with grpc.aio.insecure_channel(broker_address) as channel:
        broker = broker_pb2_grpc.BrokerStub(channel)

        async def ask() -> broker_pb2.FindCoordinatorResponse:
            return await broker.FindCoordinator(
                broker_pb2.FindCoordinatorRequest(key=group_id), timeout=RPC_TIMEOUT_S
            )

        found = await ask_until(ask, "FindCoordinator", accept=lambda r: r.error.code == NONE)
    address = f"{found.coordinator.host}:{found.coordinator.port}"
    await wait_serving(address, group_id)
    return address


async def wait_serving(address: str, group_id: str) -> None:
    """Until the coordinator at ``address`` answers the group (owned and loaded)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)

        async def fetch() -> coordinator_pb2.OffsetFetchResponse:
            return await stub.OffsetFetch(
                coordinator_pb2.OffsetFetchRequest(group_id=group_id), timeout=RPC_TIMEOUT_S
            )

        await ask_until(
            fetch, f"{address} serving {group_id}", accept=lambda r: r.error.code == NONE
        )


#: What a client retries after finding the coordinator again.
MOVED = {
    ErrorCode.NOT_COORDINATOR.code,
    ErrorCode.COORDINATOR_NOT_AVAILABLE.code,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS.code,
}


class _Answer(Protocol):
    @property
    def error(self) -> Any: ...


A = TypeVar("A", bound=_Answer)


async def on_owner(
    bootstrap: str,
    group_id: str,
    call: Callable[[coordinator_pb2_grpc.CoordinatorStub], Awaitable[A]],
) -> A:
    """``call`` on the group's coordinator, found again while the answer says it moved (group
    level, or every partition of a commit): what a client does while partitions move."""

    async def attempt() -> A:
        address = await find_coordinator(bootstrap, group_id)
        async with grpc.aio.insecure_channel(address) as channel:
            return await call(coordinator_pb2_grpc.CoordinatorStub(channel))

    def settled(answer: A) -> bool:
        codes = {answer.error.code}
        if isinstance(answer, coordinator_pb2.OffsetCommitResponse):
            codes |= set(commit_errors(answer).values())
        return not codes & MOVED

    return await ask_until(attempt, f"an answer from the owner of {group_id}", accept=settled)


def fetch_request(
    group_id: str,
) -> Callable[
    [coordinator_pb2_grpc.CoordinatorStub], Awaitable[coordinator_pb2.OffsetFetchResponse]
]:
    def call(
        stub: coordinator_pb2_grpc.CoordinatorStub,
    ) -> Awaitable[coordinator_pb2.OffsetFetchResponse]:
        return stub.OffsetFetch(
            coordinator_pb2.OffsetFetchRequest(group_id=group_id), timeout=RPC_TIMEOUT_S
        )

    return call


def join_request(
    group_id: str, topic: str, member_id: str = "", client_id: str = "client"
) -> coordinator_pb2.JoinGroupRequest:
    metadata = encode_subscription(Subscription((topic,)))
    return coordinator_pb2.JoinGroupRequest(
        group_id=group_id,
        session_timeout_ms=SESSION_MS,
        rebalance_timeout_ms=SESSION_MS,
        member_id=member_id,
        protocol_type="consumer",
        protocols=[coordinator_pb2.JoinGroupProtocol(name="range", metadata=metadata)],
        client_id=client_id,
    )


async def join(
    stub: coordinator_pb2_grpc.CoordinatorStub, group_id: str, topic: str, client_id: str
) -> coordinator_pb2.JoinGroupResponse:
    """KIP-394's two-step join: the first JoinGroup gets MEMBER_ID_REQUIRED and an id."""
    first = await stub.JoinGroup(
        join_request(group_id, topic, client_id=client_id), timeout=RPC_TIMEOUT_S
    )
    assert first.error.code == ErrorCode.MEMBER_ID_REQUIRED.code, first
    assert first.member_id.startswith(f"{client_id}-")
    return await stub.JoinGroup(
        join_request(group_id, topic, first.member_id, client_id), timeout=RPC_TIMEOUT_S
    )


def commit_request(
    group_id: str,
    generation_id: int,
    member_id: str,
    offsets: dict[tuple[str, int], int],
) -> coordinator_pb2.OffsetCommitRequest:
    topics: dict[str, list[coordinator_pb2.OffsetCommitPartition]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        topics.setdefault(topic, []).append(
            coordinator_pb2.OffsetCommitPartition(
                partition=partition,
                committed_offset=offset,
                committed_leader_epoch=-1,
                committed_metadata=f"m{offset}",
            )
        )
    return coordinator_pb2.OffsetCommitRequest(
        group_id=group_id,
        generation_id=generation_id,
        member_id=member_id,
        topics=[coordinator_pb2.OffsetCommitTopic(name=t, partitions=p) for t, p in topics.items()],
    )


def commit_errors(response: coordinator_pb2.OffsetCommitResponse) -> dict[tuple[str, int], int]:
    return {(t.name, p.partition): p.error.code for t in response.topics for p in t.partitions}


def fetched(response: coordinator_pb2.OffsetFetchResponse) -> dict[tuple[str, int], int]:
    assert response.error.code == NONE, response
    return {
        (t.name, p.partition): p.committed_offset for t in response.topics for p in t.partitions
    }


def scrape(metrics_address: str) -> str:
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as response:
        text: str = response.read().decode()
        return text


def coordinator_id_of(cluster: LocalCluster, address: str) -> int:
    return next(i for i, a in cluster.coordinator_addresses.items() if a == address)


def new_topic(bootstrap: str, partitions: int) -> str:
    topic = f"coord-{uuid.uuid4().hex[:10]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    return topic


def test_two_member_group_assigns_commits_and_fetches(local_cluster: LocalCluster) -> None:
    bootstrap = local_cluster.bootstrap_servers
    topic = new_topic(bootstrap, 4)
    group_id = f"g2-{uuid.uuid4().hex[:10]}"
    stamped_ms = int(time.time() * 1000) - 3_600_000  # record i is stamped an hour ago + i s
    with Producer({"bootstrap.servers": bootstrap, "linger.ms": 0}) as producer:
        for i in range(10):
            producer.send(topic, value=b"v%d" % i, partition=0, timestamp_ms=stamped_ms + 1000 * i)
        producer.flush(30)

    async def scenario() -> None:
        address = await find_coordinator(bootstrap.split(",")[0], group_id)
        async with grpc.aio.insecure_channel(address) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            a, b = await asyncio.gather(
                join(stub, group_id, topic, "alice"), join(stub, group_id, topic, "bob")
            )
            assert a.error.code == NONE and b.error.code == NONE, (a, b)
            assert a.generation_id == b.generation_id >= 1
            assert a.leader == b.leader and a.protocol_name == "range"
            leader, follower = (a, b) if a.leader == a.member_id else (b, a)
            assert {m.member_id for m in leader.members} == {a.member_id, b.member_id}
            assert not follower.members  # only the leader sees the members

            # The leader assigns with the real assignor; both get their share from SyncGroup.
            assignments = leader_assignments(
                "range",
                [(m.member_id, m.group_instance_id or None, m.metadata) for m in leader.members],
                {topic: 4},
            )
            synced = await asyncio.gather(
                stub.SyncGroup(
                    coordinator_pb2.SyncGroupRequest(
                        group_id=group_id,
                        generation_id=leader.generation_id,
                        member_id=leader.member_id,
                        protocol_type="consumer",
                        protocol_name="range",
                        assignments=[
                            coordinator_pb2.SyncGroupAssignment(member_id=m, assignment=x)
                            for m, x in assignments.items()
                        ],
                    ),
                    timeout=RPC_TIMEOUT_S,
                ),
                stub.SyncGroup(
                    coordinator_pb2.SyncGroupRequest(
                        group_id=group_id,
                        generation_id=follower.generation_id,
                        member_id=follower.member_id,
                    ),
                    timeout=RPC_TIMEOUT_S,
                ),
            )
            shares = [set(decode_assignment(s.assignment).partitions) for s in synced]
            assert all(s.error.code == NONE for s in synced), synced
            assert shares[0] | shares[1] == {(topic, p) for p in range(4)}
            assert not shares[0] & shares[1] and len(shares[0]) == len(shares[1]) == 2

            generation = leader.generation_id
            for member in (leader, follower):
                beat = await stub.Heartbeat(
                    coordinator_pb2.HeartbeatRequest(
                        group_id=group_id, generation_id=generation, member_id=member.member_id
                    ),
                    timeout=RPC_TIMEOUT_S,
                )
                assert beat.error.code == NONE

            # Commits: the member's generation is accepted, a stale one fenced.
            offsets = {(topic, 0): 4, (topic, 1): 0, (topic, 2): 7}
            committed = await stub.OffsetCommit(
                commit_request(group_id, generation, leader.member_id, offsets),
                timeout=RPC_TIMEOUT_S,
            )
            assert commit_errors(committed) == dict.fromkeys(offsets, NONE)
            stale = await stub.OffsetCommit(
                commit_request(group_id, generation - 1, leader.member_id, {(topic, 3): 1}),
                timeout=RPC_TIMEOUT_S,
            )
            assert commit_errors(stale) == {(topic, 3): ErrorCode.ILLEGAL_GENERATION.code}

            every = await stub.OffsetFetch(
                coordinator_pb2.OffsetFetchRequest(group_id=group_id), timeout=RPC_TIMEOUT_S
            )
            assert fetched(every) == offsets
            some = await stub.OffsetFetch(
                coordinator_pb2.OffsetFetchRequest(
                    group_id=group_id,
                    topics=[coordinator_pb2.OffsetFetchTopic(name=topic, partitions=[2, 3])],
                ),
                timeout=RPC_TIMEOUT_S,
            )
            assert fetched(some) == {(topic, 2): 7, (topic, 3): -1}
            assert some.topics[0].partitions[0].metadata == "m7"

            described = await stub.DescribeGroups(
                coordinator_pb2.DescribeGroupsRequest(group_ids=[group_id]), timeout=RPC_TIMEOUT_S
            )
            group = described.groups[0]
            assert (group.error.code, group.group_state, group.protocol_data) == (
                NONE,
                "Stable",
                "range",
            )
            assert {m.client_id for m in group.members} == {"alice", "bob"}
            assert all(m.client_host == "/127.0.0.1" and m.member_assignment for m in group.members)
            listed = await stub.ListGroups(
                coordinator_pb2.ListGroupsRequest(states_filter=["stable"]), timeout=RPC_TIMEOUT_S
            )
            assert (group_id, "consumer", "Stable") in {
                (g.group_id, g.protocol_type, g.group_state) for g in listed.groups
            }

            # Lag gauge: partition 0 has 10 records, 4 committed.
            metrics = local_cluster.metrics_address(
                "coordinator", coordinator_id_of(local_cluster, address)
            )
            sample = f'fjord_group_lag{{group="{group_id}",partition="0",topic="{topic}"}} 6.0'

            async def metrics_text() -> str:
                return await asyncio.to_thread(scrape, metrics)

            await ask_until(metrics_text, "the lag gauge", accept=lambda text: sample in text)
            # Time lag: now minus the timestamp of the first uncommitted record (offset 4).
            seconds = re.compile(
                rf'^fjord_group_lag_seconds{{group="{group_id}",partition="0",topic="{topic}"}} '
                r"(\S+)$",
                re.M,
            )
            before_s = time.time()
            text = await ask_until(
                metrics_text, "the time lag gauge", accept=lambda text: seconds.search(text)
            )
            match = seconds.search(text)
            assert match is not None
            first_uncommitted_s = (stamped_ms + 4000) / 1000
            # Set by a refresh at most one interval (5 s) before the scrape.
            assert before_s - first_uncommitted_s - 10 <= float(match.group(1))
            assert float(match.group(1)) <= time.time() - first_uncommitted_s

            # Both leave: Empty; delete: tombstones written, the group is gone.
            left = await stub.LeaveGroup(
                coordinator_pb2.LeaveGroupRequest(
                    group_id=group_id,
                    members=[
                        coordinator_pb2.MemberIdentity(member_id=m.member_id)
                        for m in (leader, follower)
                    ],
                ),
                timeout=RPC_TIMEOUT_S,
            )
            assert [m.error.code for m in left.members] == [NONE, NONE]
            deleted = await stub.DeleteGroups(
                coordinator_pb2.DeleteGroupsRequest(group_ids=[group_id]), timeout=RPC_TIMEOUT_S
            )
            assert deleted.results[0].error.code == NONE
            after = await stub.DescribeGroups(
                coordinator_pb2.DescribeGroupsRequest(group_ids=[group_id]), timeout=RPC_TIMEOUT_S
            )
            assert after.groups[0].group_state == "Dead"
            gone = await stub.OffsetFetch(
                coordinator_pb2.OffsetFetchRequest(group_id=group_id), timeout=RPC_TIMEOUT_S
            )
            assert fetched(gone) == {}
            again = await stub.DeleteGroups(
                coordinator_pb2.DeleteGroupsRequest(group_ids=[group_id]), timeout=RPC_TIMEOUT_S
            )
            assert again.results[0].error.code == ErrorCode.GROUP_ID_NOT_FOUND.code

            # The deleted group's lag series goes away with it.
            await ask_until(
                metrics_text, "lag series removed", accept=lambda text: sample not in text
            )

    asyncio.run(scenario())


def test_bad_requests_get_typed_errors(local_cluster: LocalCluster) -> None:
    bootstrap = local_cluster.bootstrap_servers
    topic = new_topic(bootstrap, 1)
    group_id = f"g2-bad-{uuid.uuid4().hex[:10]}"

    async def scenario() -> None:
        address = await find_coordinator(bootstrap.split(",")[0], group_id)
        other = next(a for a in local_cluster.coordinator_addresses.values() if a != address)
        async with (
            grpc.aio.insecure_channel(address) as channel,
            grpc.aio.insecure_channel(other) as other_channel,
        ):
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)

            empty = await stub.JoinGroup(join_request("", topic), timeout=RPC_TIMEOUT_S)
            assert empty.error.code == ErrorCode.INVALID_GROUP_ID.code
            no_group = await stub.OffsetFetch(
                coordinator_pb2.OffsetFetchRequest(group_id=""), timeout=RPC_TIMEOUT_S
            )
            assert no_group.error.code == ErrorCode.INVALID_GROUP_ID.code

            too_short = join_request(group_id, topic)
            too_short.session_timeout_ms = 10
            answer = await stub.JoinGroup(too_short, timeout=RPC_TIMEOUT_S)
            assert answer.error.code == ErrorCode.INVALID_SESSION_TIMEOUT.code
            negative = join_request(group_id, topic)
            negative.rebalance_timeout_ms = -5
            answer = await stub.JoinGroup(negative, timeout=RPC_TIMEOUT_S)
            assert answer.error.code == ErrorCode.INVALID_REQUEST.code
            no_protocol = join_request(group_id, topic)
            del no_protocol.protocols[:]
            answer = await stub.JoinGroup(no_protocol, timeout=RPC_TIMEOUT_S)
            assert answer.error.code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL.code

            # The group's partition is not the other coordinator's.
            elsewhere = await coordinator_pb2_grpc.CoordinatorStub(other_channel).JoinGroup(
                join_request(group_id, topic), timeout=RPC_TIMEOUT_S
            )
            assert elsewhere.error.code == ErrorCode.NOT_COORDINATOR.code

            beat = await stub.Heartbeat(
                coordinator_pb2.HeartbeatRequest(group_id=group_id, member_id="x"),
                timeout=RPC_TIMEOUT_S,
            )
            assert beat.error.code == ErrorCode.UNKNOWN_MEMBER_ID.code
            leave = await stub.LeaveGroup(
                coordinator_pb2.LeaveGroupRequest(group_id=group_id), timeout=RPC_TIMEOUT_S
            )
            assert leave.error.code == ErrorCode.INVALID_REQUEST.code

            # A simple commit (generation -1): bad offsets and unknown topics per partition,
            # nothing else lost; a member commit to an unknown group is stale.
            simple = commit_request(
                group_id, -1, "", {(topic, 0): 5, ("no-such-topic", 0): 1, (topic, 9): 1}
            )
            simple.topics[0].partitions.add(partition=0, committed_offset=-3)  # duplicate tp
            dup = await stub.OffsetCommit(simple, timeout=RPC_TIMEOUT_S)
            assert dup.error.code == ErrorCode.INVALID_REQUEST.code
            del simple.topics[0].partitions[-1]
            mixed = await stub.OffsetCommit(simple, timeout=RPC_TIMEOUT_S)
            assert commit_errors(mixed) == {
                (topic, 0): NONE,
                ("no-such-topic", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code,
                (topic, 9): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code,
            }
            negative_offset = await stub.OffsetCommit(
                commit_request(group_id, -1, "", {(topic, 0): -2}), timeout=RPC_TIMEOUT_S
            )
            assert commit_errors(negative_offset) == {
                (topic, 0): ErrorCode.INVALID_COMMIT_OFFSET_SIZE.code
            }
            unknown = next(  # an unknown group served by the same coordinator
                g
                for g in (f"{group_id}-{i}" for i in range(10_000))
                if group_partition(g) == group_partition(group_id)
            )
            member_commit = await stub.OffsetCommit(
                commit_request(unknown, 3, "m-1", {(topic, 0): 1}), timeout=RPC_TIMEOUT_S
            )
            assert commit_errors(member_commit) == {(topic, 0): ErrorCode.ILLEGAL_GENERATION.code}
            kept = await stub.OffsetFetch(
                coordinator_pb2.OffsetFetchRequest(group_id=group_id), timeout=RPC_TIMEOUT_S
            )
            assert fetched(kept) == {(topic, 0): 5}

            # A parked JoinGroup whose caller gives up leaves the coordinator answering. The
            # join phase lasts at least group.initial.rebalance.delay.ms (300 ms in the shared
            # cluster), so a 0.1 s deadline always ends the call first.
            first = await stub.JoinGroup(join_request(group_id, topic), timeout=RPC_TIMEOUT_S)
            assert first.error.code == ErrorCode.MEMBER_ID_REQUIRED.code
            with pytest.raises(grpc.aio.AioRpcError) as cancelled:
                await stub.JoinGroup(join_request(group_id, topic, first.member_id), timeout=0.1)
            assert cancelled.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            rejoined = await stub.JoinGroup(
                join_request(group_id, topic, first.member_id), timeout=RPC_TIMEOUT_S
            )
            assert rejoined.error.code == NONE and rejoined.leader == first.member_id

    asyncio.run(scenario())


@pytest.fixture(scope="module")
def _failover_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A private cluster (1 broker, 2 coordinators) for the tests that kill or freeze a
    coordinator; each leaves both coordinators running again."""
    cluster = LocalCluster(
        tmp_path_factory.mktemp("failover"),
        brokers=1,
        controllers=1,
        coordinators=2,
        unsafe_etcd_no_fsync=True,
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def failover_cluster(_failover_cluster: LocalCluster) -> LocalCluster:
    """The failover cluster once its coordinators have settled after the previous test's
    restart, so that who owns a group does not change under a test that reads it."""
    asyncio.run(coordinators_settled(_failover_cluster))
    return _failover_cluster


async def coordinators_settled(cluster: LocalCluster) -> None:
    """Until every coordinator of ``cluster`` is registered and, once ``__consumer_offsets``
    exists, the controller has nothing left to move: a restarted coordinator registers a
    moment after it starts, and then the controller gives it back its share of partitions
    (:func:`plan_offsets_owners`), so until then the owner of a group may change."""
    expected = set(cluster.coordinator_addresses)

    def settled(image: MetadataImage) -> bool:
        live, owners = set(image.coordinators), image.offsets_owners
        moves = plan_offsets_owners(OFFSETS_TOPIC_PARTITIONS, live, owners) if owners else {}
        return live == expected and not moves

    async with etcd_client(cluster.etcd_url) as client:
        watcher = MetadataWatcher(client, cluster.cluster_id)
        await watcher.start()
        try:
            await watcher.wait_for(settled, WAIT_S)
        except TimeoutError:
            raise AssertionError(f"coordinators not settled: {watcher.image!r}") from None
        finally:
            await watcher.stop()


def test_killed_coordinator_partition_is_replayed_by_the_other(
    failover_cluster: LocalCluster,
) -> None:
    """SIGKILL the coordinator of a group with committed offsets and a Stable membership: the
    controller hands its partitions to the other coordinator within the lease TTL, which
    replays ``__consumer_offsets`` and serves the same offsets and members."""
    cluster = failover_cluster
    bootstrap = cluster.bootstrap_servers
    topic = new_topic(bootstrap, 3)
    group_id = f"g2-failover-{uuid.uuid4().hex[:8]}"
    simple_group = f"g2-simple-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        address = await find_coordinator(bootstrap, group_id)
        async with grpc.aio.insecure_channel(address) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            joined = await join(stub, group_id, topic, "solo")
            assert joined.error.code == NONE
            synced = await stub.SyncGroup(
                coordinator_pb2.SyncGroupRequest(
                    group_id=group_id,
                    generation_id=joined.generation_id,
                    member_id=joined.member_id,
                    assignments=[
                        coordinator_pb2.SyncGroupAssignment(member_id=m, assignment=x)
                        for m, x in leader_assignments(
                            "range",
                            [(joined.member_id, None, m.metadata) for m in joined.members],
                            {topic: 3},
                        ).items()
                    ],
                ),
                timeout=RPC_TIMEOUT_S,
            )
            assert synced.error.code == NONE
            offsets = {(topic, 0): 11, (topic, 1): 22, (topic, 2): 33}
            committed = await stub.OffsetCommit(
                commit_request(group_id, joined.generation_id, joined.member_id, offsets),
                timeout=RPC_TIMEOUT_S,
            )
            assert commit_errors(committed) == dict.fromkeys(offsets, NONE)

        killed = coordinator_id_of(cluster, address)
        cluster.kill("coordinator", killed)
        started = time.monotonic()
        survivor = cluster.coordinator_addresses[3 - killed]
        # The survivor serves the group once the controller moved the partition (after
        # the dead coordinator's lease TTL) and the replay is done.
        await wait_serving(survivor, group_id)
        took = time.monotonic() - started
        async with grpc.aio.insecure_channel(survivor) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            answer = await stub.OffsetFetch(
                coordinator_pb2.OffsetFetchRequest(group_id=group_id), timeout=RPC_TIMEOUT_S
            )
            assert fetched(answer) == offsets
            described = await stub.DescribeGroups(
                coordinator_pb2.DescribeGroupsRequest(group_ids=[group_id]),
                timeout=RPC_TIMEOUT_S,
            )
            group = described.groups[0]
            assert group.group_state == "Stable"
            assert [m.member_id for m in group.members] == [joined.member_id]
            # The loaded member is fenced by generation like before the failover.
            beat = await stub.Heartbeat(
                coordinator_pb2.HeartbeatRequest(
                    group_id=group_id,
                    generation_id=joined.generation_id,
                    member_id=joined.member_id,
                ),
                timeout=RPC_TIMEOUT_S,
            )
            assert beat.error.code == NONE
        assert await find_coordinator(bootstrap, group_id) == survivor
        # Lease TTL (6 s) + replay, with room for a loaded machine.
        assert took < cluster.coordinator_lease_ttl_s + 30, took

        # The killed coordinator comes back; partitions the controller gives it are
        # replayed too: every group keeps its offsets wherever it lives now.
        cluster.start_coordinator(killed)
        # (The controller may move partitions to it meanwhile: ask the owner, as clients
        # do, again after NOT_COORDINATOR.)
        done = await on_owner(
            bootstrap,
            simple_group,
            lambda stub: stub.OffsetCommit(
                commit_request(simple_group, -1, "", {(topic, 0): 5}), timeout=RPC_TIMEOUT_S
            ),
        )
        assert commit_errors(done) == {(topic, 0): NONE}
        answer = await on_owner(bootstrap, group_id, fetch_request(group_id))
        assert fetched(answer) == offsets

    asyncio.run(scenario())


def test_kafka_client_group_survives_its_coordinator_sigkill(
    failover_cluster: LocalCluster,
) -> None:
    """A confluent-kafka group member (Kafka protocol end to end) whose coordinator is
    SIGKILLed: librdkafka finds the new coordinator through FindCoordinator (its Kafka
    listener), the membership and the committed offsets survive, and later commits land."""
    from confluent_kafka import Consumer as CKConsumer
    from confluent_kafka import KafkaException
    from confluent_kafka import Producer as CKProducer
    from confluent_kafka import TopicPartition as CKTopicPartition

    from fjord.kafka.defaults import COORDINATOR_NODE_ID_BASE

    cluster = failover_cluster
    kafka = cluster.kafka_bootstrap_servers
    topic = new_topic(cluster.bootstrap_servers, 2)
    group_id = f"g2-kafka-{uuid.uuid4().hex[:8]}"
    producer = CKProducer({"bootstrap.servers": kafka, "acks": "all"})

    def produce(values: range) -> None:
        for i in values:
            producer.produce(topic, value=f"v{i}".encode(), partition=i % 2)
        assert producer.flush(WAIT_S) == 0

    consumer = CKConsumer({
        "bootstrap.servers": kafka, "group.id": group_id, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "session.timeout.ms": SESSION_MS,
        "heartbeat.interval.ms": 500,
    })
    read: list[bytes] = []

    def read_until(n: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while len(read) < n:
            assert time.monotonic() < deadline, f"read {len(read)} of {n}"
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                read.append(message.value())

    def committed() -> int:
        answer = consumer.committed([CKTopicPartition(topic, p) for p in (0, 1)],
                                    timeout=WAIT_S)
        return sum(tp.offset for tp in answer)

    try:
        consumer.subscribe([topic])
        produce(range(20))
        read_until(20)
        consumer.commit(asynchronous=False)
        assert committed() == 20
        # Both coordinators are Kafka nodes of the cluster metadata.
        nodes = consumer.list_topics(timeout=WAIT_S).brokers
        assert sorted(n for n in nodes if n >= COORDINATOR_NODE_ID_BASE) == [
            COORDINATOR_NODE_ID_BASE + c for c in sorted(cluster.coordinator_addresses)
        ]
        address = asyncio.run(find_coordinator(cluster.bootstrap_servers, group_id))
        killed = coordinator_id_of(cluster, address)
        cluster.kill("coordinator", killed)
        produce(range(20, 40))
        read_until(40)  # fetching never needed the coordinator
        deadline = time.monotonic() + WAIT_S
        while True:  # the commit succeeds once librdkafka found the new coordinator
            try:
                consumer.commit(asynchronous=False)
                break
            except KafkaException:
                assert time.monotonic() < deadline, "no commit after the coordinator died"
                consumer.poll(0.2)
        assert committed() == 40
        assert sorted(read) == sorted(f"v{i}".encode() for i in range(40))
    finally:
        consumer.close()
        if cluster.process("coordinator", 1).poll() is not None:
            cluster.start_coordinator(1)
        if cluster.process("coordinator", 2).poll() is not None:
            cluster.start_coordinator(2)


async def offsets_owner(cluster: LocalCluster, partition: int) -> OffsetsOwner:
    """The ``offsets-owners/<partition>`` entry as etcd has it now."""
    async with etcd_client(cluster.etcd_url) as client:
        got = await client.get(Keys(cluster.cluster_id).offsets_owner(partition).encode())
    assert got is not None, f"__consumer_offsets-{partition} has no owner"
    return OffsetsOwner.from_json(got.value)


def test_frozen_coordinators_late_writes_are_fenced(failover_cluster: LocalCluster) -> None:
    """A coordinator frozen (SIGSTOP) past its lease keeps believing it owns its partitions.
    The other one takes the group over (a newer coordinator epoch in ``offsets-owners``) and
    commits; the old one, thawed, answers the commit that waited for it with a moved error,
    the coordinator's own appender at the old epoch is refused TRANSACTION_COORDINATOR_FENCED
    by the partition's leader, and the committed offset, served and in the log, is the new
    owner's: nothing goes backwards."""
    cluster = failover_cluster
    bootstrap = cluster.bootstrap_servers
    topic = new_topic(bootstrap, 1)
    group_id = f"g2-zombie-{uuid.uuid4().hex[:8]}"
    partition = group_partition(group_id)
    tp = (topic, 0)

    def simple_commit(offset: int) -> coordinator_pb2.OffsetCommitRequest:
        return commit_request(group_id, -1, "", {tp: offset})

    async def scenario() -> None:
        owner = await find_coordinator(bootstrap, group_id)
        frozen = coordinator_id_of(cluster, owner)
        old = await offsets_owner(cluster, partition)
        assert old.coordinator_id == frozen
        async with grpc.aio.insecure_channel(owner) as channel:
            zombie = coordinator_pb2_grpc.CoordinatorStub(channel)
            first = await zombie.OffsetCommit(simple_commit(10), timeout=RPC_TIMEOUT_S)
            assert commit_errors(first) == {tp: NONE}

            cluster.process("coordinator", frozen).send_signal(signal.SIGSTOP)
            try:
                # A commit of an older offset reaches the frozen coordinator (its connection
                # is open: the bytes wait in its socket) and is handled only after the thaw.
                late_commit = asyncio.ensure_future(
                    zombie.OffsetCommit(simple_commit(5), timeout=3 * WAIT_S)
                )

                async def taken_over() -> OffsetsOwner:
                    return await offsets_owner(cluster, partition)

                new = await ask_until(
                    taken_over,
                    "the lease to expire and the controller to move the partition",
                    accept=lambda o: o.coordinator_id != frozen,
                )
                assert new.coordinator_epoch > old.coordinator_epoch
                other = cluster.coordinator_addresses[new.coordinator_id]
                await wait_serving(other, group_id)
                async with grpc.aio.insecure_channel(other) as other_channel:
                    newer = await coordinator_pb2_grpc.CoordinatorStub(other_channel).OffsetCommit(
                        simple_commit(20), timeout=RPC_TIMEOUT_S
                    )
                assert commit_errors(newer) == {tp: NONE}
            finally:
                cluster.process("coordinator", frozen).send_signal(signal.SIGCONT)

            # The thawed coordinator either noticed first (no append) or appended at its old
            # epoch and was refused: the client is told to find the coordinator again.
            answer = await asyncio.wait_for(late_commit, 3 * WAIT_S)
            per_partition = set(commit_errors(answer).values())
            assert answer.error.code in MOVED or (per_partition and per_partition <= MOVED), answer

            # What a zombie's append does, deterministically: the coordinator's own appender
            # at the old epoch, against the real broker.
            appender = OffsetsAppender(lambda: bootstrap, "zombie-coordinator", timeout_ms=10_000)
            stale = encode_record((OffsetCommitKey(group_id, *tp), OffsetCommitValue(offset=5)))
            try:
                with pytest.raises(FjordError) as fenced:
                    await asyncio.wait_for(
                        appender.submit(partition, old.coordinator_epoch, [stale]), WAIT_S
                    )
            finally:
                await appender.close()
            assert fenced.value.code is ErrorCode.TRANSACTION_COORDINATOR_FENCED, fenced.value

            async def fetch_from_thawed() -> tuple[
                coordinator_pb2.OffsetFetchResponse, OffsetsOwner
            ]:
                answer = await zombie.OffsetFetch(
                    coordinator_pb2.OffsetFetchRequest(group_id=group_id), timeout=RPC_TIMEOUT_S
                )
                return answer, await offsets_owner(cluster, partition)

            def gave_up(seen: tuple[coordinator_pb2.OffsetFetchResponse, OffsetsOwner]) -> bool:
                """Moved away, or owned again at a newer epoch (the controller evens the load
                out once the thawed one re-registers, so the partition may come back to it) and
                loaded from the log with the new owner's commit: never its own stale state."""
                answer, owner = seen
                if answer.error.code in MOVED:
                    return True
                regained = (
                    owner.coordinator_id == frozen
                    and owner.coordinator_epoch > new.coordinator_epoch
                )
                return regained and answer.error.code == NONE and fetched(answer) == {tp: 20}

            await ask_until(
                fetch_from_thawed, "the thawed coordinator to give the group up", accept=gave_up
            )

            async def list_thawed() -> coordinator_pb2.ListGroupsResponse:
                return await zombie.ListGroups(
                    coordinator_pb2.ListGroupsRequest(), timeout=RPC_TIMEOUT_S
                )

            await ask_until(
                list_thawed, "the thawed one to re-register", accept=lambda r: r.error.code == NONE
            )

        served = await on_owner(bootstrap, group_id, fetch_request(group_id))
        assert fetched(served) == {tp: 20}
        # The log's last word, which every later owner replays, is the new owner's too.
        replayed = await asyncio.to_thread(
            replay_partitions, bootstrap, [partition], "zombie-test-replay", WAIT_S
        )
        assert replayed[partition][group_id].offsets[tp].offset == 20

    asyncio.run(scenario())


def test_registration_waits_until_a_stale_registration_is_gone(
    etcd: EtcdProcess, cluster_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``register_under_lease`` (what a restarted coordinator does while its previous run's
    lease has not expired) retries until the key is free, then owns it under its own lease."""
    key = Keys(cluster_id).coordinator(7).encode()
    caplog.set_level(logging.WARNING, logger="fjord.metadata.registration")

    async def scenario() -> None:
        async with etcd_client(etcd.url) as client:
            stale = await client.lease(60)
            await client.put(key, b"old", lease=stale.id)
            registering = asyncio.ensure_future(
                register_under_lease(
                    client, key, b"new", 5, what="coordinator 7", backoff_s=0.05, backoff_max_s=0.2
                )
            )

            async def refusals() -> int:
                return sum(
                    "coordinator 7 is already registered" in r.getMessage()
                    for r in caplog.records
                )

            # Several attempts, all refused while the key exists.
            await wait_for_async(
                refusals, "three refused attempts", WAIT_S, accept=lambda n: n >= 3
            )
            assert not registering.done()
            assert (await client.get(key)).value == b"old"
            await client.revoke_lease(stale.id)
            lease_id, revision = await asyncio.wait_for(registering, WAIT_S)
            current = await client.get(key)
            assert current.value == b"new" and current.create_revision == revision
            assert current.lease == lease_id
            await client.revoke_lease(lease_id)
            assert await client.get(key) is None

    asyncio.run(scenario())
