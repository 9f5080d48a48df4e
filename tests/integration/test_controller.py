"""The controller as real processes against a real etcd: admin RPCs, standby answers,
broker liveness, AlterPartition, producer ids, and fail-over with fencing (last test).

Brokers are represented by their etcd registrations (``brokers/<id>`` on a lease), which is
all the controller sees of them; that keeps this module independent of the broker service.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from fjord._proto import controller_pb2, controller_pb2_grpc
from fjord.controller.defaults import KEEPALIVE_FRACTION
from fjord.controller.service import create_revision_is, etcd_txn, put_op
from fjord.errors import ErrorCode
from fjord.local import LocalCluster
from fjord.metadata import (
    BrokerRegistration,
    Keys,
    MetadataImage,
    MetadataWatcher,
    PartitionState,
    TopicRecord,
    etcd_client,
)
from fjord.testing.waiting import wait_for_async

pytestmark = pytest.mark.integration

CLUSTER = "ctl"
LEASE_TTL_S = 3
#: The in-process controller whose lease is revoked: long, so its keep-alive cannot notice first.
LOST_LEASE_TTL_S = 120
WAIT_S = 15.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("ctl"),
        brokers=0,
        controllers=2,
        coordinators=0,
        cluster_id=CLUSTER,
        controller_lease_ttl_s=LEASE_TTL_S,
        unsafe_etcd_no_fsync=True,
    )
    c.start()
    yield c
    c.stop()


def run(coro_fn: Callable[[Any], Any], cluster: LocalCluster) -> Any:
    """Run ``coro_fn(client)`` with a fresh etcd client."""

    async def main() -> Any:
        async with etcd_client(cluster.etcd_url) as client:
            return await coro_fn(client)

    return asyncio.run(main())


def register_broker(cluster: LocalCluster, broker_id: int, rack: str | None = None) -> int:
    """Register a broker the way a broker does (own lease); returns the lease id."""
    keys = Keys(CLUSTER)

    async def go(client: Any) -> int:
        lease = await client.lease(60)
        reg = BrokerRegistration(broker_id, "127.0.0.1", 1000 + broker_id, rack)
        await client.put(keys.broker(broker_id).encode(), reg.to_json(), lease=lease)
        return int(lease.id)

    return int(run(go, cluster))


def snapshot(cluster: LocalCluster) -> MetadataImage:
    async def go(client: Any) -> MetadataImage:
        watcher = MetadataWatcher(client, CLUSTER)
        image = await watcher.start()
        await watcher.stop()
        return image

    return run(go, cluster)  # type: ignore[no-any-return]


def wait_image(cluster: LocalCluster, predicate: Callable[[MetadataImage], bool]) -> MetadataImage:
    async def go(client: Any) -> MetadataImage:
        watcher = MetadataWatcher(client, CLUSTER)
        await watcher.start()
        try:
            return await watcher.wait_for(predicate, WAIT_S)
        finally:
            await watcher.stop()

    return run(go, cluster)  # type: ignore[no-any-return]


def stub(cluster: LocalCluster, controller_id: int) -> controller_pb2_grpc.ControllerStub:
    channel = grpc.insecure_channel(cluster.address("controller", controller_id))
    return controller_pb2_grpc.ControllerStub(channel)


@pytest.fixture(scope="module")
def brokers(cluster: LocalCluster) -> dict[int, int]:
    """Three live brokers (ids 1..3); values are their lease ids."""
    leases = {b: register_broker(cluster, b) for b in (1, 2, 3)}
    wait_image(cluster, lambda i: set(i.brokers) == {1, 2, 3})
    return leases


@pytest.fixture
def active(cluster: LocalCluster, brokers: dict[int, int]) -> controller_pb2_grpc.ControllerStub:
    return stub(cluster, cluster.wait_active_controller(WAIT_S))


def create(
    ctl: controller_pb2_grpc.ControllerStub, name: str, partitions: int = 1, rf: int = 1,
    validate_only: bool = False, **configs: str,
) -> controller_pb2.CreateTopicResult:
    request = controller_pb2.CreateTopicsRequest(
        topics=[controller_pb2.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=rf,
            configs={k.replace("_", "."): v for k, v in configs.items()},
        )],
        validate_only=validate_only,
    )
    return ctl.CreateTopics(request, timeout=WAIT_S).results[0]


def test_create_topic_places_leaders_evenly_and_writes_metadata(
    cluster: LocalCluster, active: controller_pb2_grpc.ControllerStub
) -> None:
    result = create(active, "orders", partitions=6, retention_ms="60000")
    assert result.error.code == 0, result.error.message
    assert (result.num_partitions, result.replication_factor) == (6, 1)
    image = snapshot(cluster)
    record = image.topic("orders")
    assert record == TopicRecord(result.topic_id, 6, 1, {"retention.ms": "60000"})
    states = image.partitions("orders")
    assert sorted(states) == list(range(6))
    leaders = [s.leader for s in states.values()]
    assert sorted(leaders) == [1, 1, 2, 2, 3, 3]
    assert all(s == PartitionState((s.leader,), (s.leader,), s.leader, 0, 0)
               for s in states.values())


@pytest.mark.parametrize(
    ("name", "partitions", "rf", "configs", "code", "text"),
    [
        ("orders", 1, 1, {}, ErrorCode.TOPIC_ALREADY_EXISTS, "already exists"),
        ("bad/name", 1, 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "illegal"),
        ("..", 1, 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "cannot be"),
        ("x" * 250, 1, 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "249"),
        ("zero", 0, 1, {}, ErrorCode.INVALID_PARTITIONS, "at least 1"),
        ("rf4", 1, 4, {}, ErrorCode.INVALID_REPLICATION_FACTOR, "3 live brokers"),
        ("cfg", 1, 1, {"retention_ms": "soon"}, ErrorCode.INVALID_CONFIG, "retention.ms"),
        ("cfg", 1, 1, {"no_such_key": "1"}, ErrorCode.INVALID_CONFIG, "no.such.key"),
    ],
)
def test_create_topic_refusals(
    cluster: LocalCluster, active: controller_pb2_grpc.ControllerStub,
    name: str, partitions: int, rf: int, configs: dict[str, str], code: ErrorCode, text: str,
) -> None:
    before = snapshot(cluster)
    result = create(active, name, partitions, rf, **configs)
    assert result.error.code == code.code
    assert text in result.error.message
    after = snapshot(cluster)
    assert dict(after.topics) == dict(before.topics)  # nothing was written


def test_colliding_names_and_validate_only(
    cluster: LocalCluster, active: controller_pb2_grpc.ControllerStub
) -> None:
    assert create(active, "a.b").error.code == 0
    result = create(active, "a_b")
    assert result.error.code == ErrorCode.INVALID_TOPIC_EXCEPTION.code
    assert "collides" in result.error.message
    dry = create(active, "dry", partitions=3, validate_only=True)
    assert dry.error.code == 0 and dry.num_partitions == 3
    assert snapshot(cluster).topic("dry") is None


def test_create_partitions_only_grows(
    cluster: LocalCluster, active: controller_pb2_grpc.ControllerStub
) -> None:
    assert create(active, "grow", partitions=2).error.code == 0

    def grow(count: int) -> controller_pb2.TopicResult:
        request = controller_pb2.CreatePartitionsRequest(
            topics=[controller_pb2.PartitionCount(name="grow", count=count)]
        )
        return active.CreatePartitions(request, timeout=WAIT_S).results[0]

    assert grow(1).error.code == ErrorCode.INVALID_PARTITIONS.code
    assert grow(2).error.code == ErrorCode.INVALID_PARTITIONS.code
    assert grow(5).error.code == 0
    image = snapshot(cluster)
    assert image.topic("grow").partitions == 5  # type: ignore[union-attr]
    assert sorted(image.partitions("grow")) == list(range(5))
    missing = controller_pb2.CreatePartitionsRequest(
        topics=[controller_pb2.PartitionCount(name="nope", count=3)]
    )
    assert active.CreatePartitions(missing, timeout=WAIT_S).results[0].error.code == (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code
    )


def test_alter_and_describe_configs(
    cluster: LocalCluster, active: controller_pb2_grpc.ControllerStub
) -> None:
    assert create(active, "conf").error.code == 0

    def alter(set_: dict[str, str], delete: list[str]) -> controller_pb2.TopicResult:
        request = controller_pb2.AlterConfigsRequest(
            topics=[controller_pb2.AlterTopicConfig(name="conf", set=set_, delete=delete)]
        )
        return active.AlterConfigs(request, timeout=WAIT_S).results[0]

    def describe() -> dict[str, tuple[str, str]]:
        result = active.DescribeConfigs(
            controller_pb2.DescribeConfigsRequest(topics=["conf"]), timeout=WAIT_S
        ).results[0]
        assert result.error.code == 0
        return {e.name: (e.value, e.source) for e in result.entries}

    assert describe()["retention.ms"] == ("604800000", "DEFAULT")
    assert alter({"retention.ms": "1000"}, []).error.code == 0
    assert describe()["retention.ms"] == ("1000", "TOPIC")
    bad = alter({"segment.bytes": "1"}, [])
    assert bad.error.code == ErrorCode.INVALID_CONFIG.code and "segment.bytes" in bad.error.message
    assert describe()["retention.ms"] == ("1000", "TOPIC")  # the bad change lost nothing
    assert alter({}, ["retention.ms"]).error.code == 0
    assert describe()["retention.ms"] == ("604800000", "DEFAULT")
    unknown = active.DescribeConfigs(
        controller_pb2.DescribeConfigsRequest(topics=["nope"]), timeout=WAIT_S
    ).results[0]
    assert unknown.error.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code


def test_delete_topic(cluster: LocalCluster, active: controller_pb2_grpc.ControllerStub) -> None:
    assert create(active, "gone", partitions=3).error.code == 0
    response = active.DeleteTopics(
        controller_pb2.DeleteTopicsRequest(names=["gone", "never"]), timeout=WAIT_S
    )
    codes = {r.name: r.error.code for r in response.results}
    assert codes == {"gone": 0, "never": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code}

    async def remaining(client: Any) -> int:
        return len(await client.get_prefix(Keys(CLUSTER).topic_partitions_prefix("gone").encode()))

    assert run(remaining, cluster) == 0
    assert snapshot(cluster).topic("gone") is None


def test_acls_are_created_described_deleted_and_stored_in_etcd(
    cluster: LocalCluster, active: controller_pb2_grpc.ControllerStub
) -> None:
    from fjord.cluster.acl_wire import binding_from_pb, binding_to_pb, filter_to_pb
    from fjord.security.acls import (
        AccessControlEntry,
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        PatternType,
        ResourcePattern,
        ResourceType,
    )

    def binding(kind: ResourceType, name: str, op: AclOperation,
                pattern: PatternType = PatternType.LITERAL) -> AclBinding:
        return AclBinding(ResourcePattern(kind, name, pattern),
                          AccessControlEntry("User:alice", "*", op, AclPermissionType.ALLOW))

    read = binding(ResourceType.TOPIC, "orders", AclOperation.READ)
    prefixed = binding(ResourceType.TOPIC, "ord", AclOperation.WRITE, PatternType.PREFIXED)
    group = binding(ResourceType.GROUP, "team/billing", AclOperation.READ)
    bad = binding_to_pb(read)
    bad.operation = AclOperation.CLUSTER_ACTION.code  # Topic does not take ClusterAction
    created = active.CreateAcls(controller_pb2.CreateAclsRequest(
        creations=[binding_to_pb(read), bad, binding_to_pb(prefixed), binding_to_pb(group),
                   binding_to_pb(read)]), timeout=WAIT_S)
    codes = [r.error.code for r in created.results]
    assert codes == [0, ErrorCode.INVALID_REQUEST.code, 0, 0, 0]
    assert "ClusterAction" in created.results[1].error.message
    # Stored by the controller in etcd, where every service's watcher sees them.
    assert snapshot(cluster).acl_bindings() == sorted([read, prefixed, group])

    def describe(selector: AclBindingFilter) -> list[AclBinding]:
        response = active.DescribeAcls(
            controller_pb2.DescribeAclsRequest(filter=filter_to_pb(selector)), timeout=WAIT_S
        )
        assert response.error.code == 0
        return [binding_from_pb(b) for b in response.bindings]

    assert describe(AclBindingFilter()) == sorted([read, prefixed, group])
    assert describe(AclBindingFilter(ResourceType.TOPIC, "orders", PatternType.MATCH)) == \
        sorted([read, prefixed])
    bad_filter = filter_to_pb(AclBindingFilter())
    bad_filter.operation = 99
    deleted = active.DeleteAcls(controller_pb2.DeleteAclsRequest(filters=[
        filter_to_pb(AclBindingFilter(ResourceType.TOPIC)), bad_filter]), timeout=WAIT_S)
    assert [binding_from_pb(b) for b in deleted.results[0].deleted] == sorted([read, prefixed])
    assert deleted.results[1].error.code == ErrorCode.INVALID_REQUEST.code
    assert snapshot(cluster).acl_bindings() == [group]
    active.DeleteAcls(controller_pb2.DeleteAclsRequest(
        filters=[filter_to_pb(AclBindingFilter())]), timeout=WAIT_S)
    assert snapshot(cluster).acls == {}


def test_producer_id_blocks_are_disjoint_and_fenced_by_broker_epoch(
    cluster: LocalCluster, active: controller_pb2_grpc.ControllerStub
) -> None:
    epoch = snapshot(cluster).broker_epoch(1)
    assert epoch is not None

    def allocate(broker_epoch: int) -> controller_pb2.AllocateProducerIdsResponse:
        return active.AllocateProducerIds(
            controller_pb2.AllocateProducerIdsRequest(broker_id=1, broker_epoch=broker_epoch),
            timeout=WAIT_S,
        )

    first, second = allocate(epoch), allocate(epoch)
    assert first.error.code == 0 and second.error.code == 0
    assert first.count == second.count == 1000
    assert second.first_producer_id == first.first_producer_id + 1000
    assert allocate(epoch - 1).error.code == ErrorCode.STALE_BROKER_EPOCH.code


def test_alter_partition_is_fenced_by_epochs(
    cluster: LocalCluster, active: controller_pb2_grpc.ControllerStub
) -> None:
    assert create(active, "isr").error.code == 0
    image = snapshot(cluster)
    state = image.partition("isr", 0)
    assert state is not None
    leader = state.leader

    def alter(broker: int, leader_epoch: int, partition_epoch: int, isr: list[int]) -> Any:
        return active.AlterPartition(
            controller_pb2.AlterPartitionRequest(
                broker_id=broker,
                broker_epoch=image.broker_epoch(broker) or 0,
                partitions=[controller_pb2.AlterPartitionItem(
                    topic="isr", partition=0, leader_epoch=leader_epoch,
                    partition_epoch=partition_epoch, new_isr=isr)],
            ),
            timeout=WAIT_S,
        )

    other = next(b for b in (1, 2, 3) if b != leader)
    assert alter(other, 0, 0, [other]).partitions[0].error.code == (
        ErrorCode.NOT_LEADER_OR_FOLLOWER.code
    )
    assert alter(leader, 5, 0, [leader]).partitions[0].error.code == (
        ErrorCode.FENCED_LEADER_EPOCH.code
    )
    assert alter(leader, 0, 7, [leader]).partitions[0].error.code == (
        ErrorCode.INVALID_UPDATE_VERSION.code
    )
    assert alter(leader, 0, 0, [leader, other]).partitions[0].error.code == (
        ErrorCode.INVALID_REQUEST.code  # not a replica of this RF 1 partition
    )
    ok = alter(leader, 0, 0, [leader]).partitions[0]
    assert ok.error.code == 0 and list(ok.isr) == [leader] and ok.partition_epoch == 0


def test_standby_answers_not_controller(
    cluster: LocalCluster, active: controller_pb2_grpc.ControllerStub
) -> None:
    active_id = cluster.wait_active_controller(WAIT_S)
    standby = stub(cluster, 1 - active_id)
    result = create(standby, "from-standby")
    assert result.error.code == ErrorCode.NOT_CONTROLLER.code
    described = standby.DescribeCluster(controller_pb2.DescribeClusterRequest(), timeout=WAIT_S)
    assert described.error.code == ErrorCode.NOT_CONTROLLER.code
    assert described.controller.id == active_id  # tells the caller where to go
    assert {c.id for c in described.controllers} == {0, 1}
    assert {b.id for b in described.brokers} == {1, 2, 3}


def test_dead_broker_partitions_go_offline_and_come_back(
    cluster: LocalCluster, active: controller_pb2_grpc.ControllerStub, brokers: dict[int, int]
) -> None:
    assert create(active, "live", partitions=3).error.code == 0
    image = snapshot(cluster)
    victim = image.partition("live", 0).leader  # type: ignore[union-attr]
    led = {r.partition: r.state for r in image.partitions_led_by(victim) if r.topic == "live"}

    async def revoke(client: Any) -> None:
        await client.revoke_lease(brokers[victim])

    run(revoke, cluster)
    offline = wait_image(
        cluster,
        lambda i: all(i.partition("live", p).leader == -1 for p in led),  # type: ignore[union-attr]
    )
    for p, before in led.items():
        after = offline.partition("live", p)
        assert after == PartitionState(
            before.replicas, before.isr, -1, before.leader_epoch + 1, before.partition_epoch + 1
        )
    # Partitions led by other brokers are untouched; all of the victim's are offline.
    for ref in image.all_partitions():
        now = offline.partition(ref.topic, ref.partition)
        assert now is not None
        assert (now.leader == -1) == (ref.state.leader == victim)
        if ref.state.leader != victim:
            assert now == ref.state

    brokers[victim] = register_broker(cluster, victim)
    back = wait_image(
        cluster,
        lambda i: all(i.partition("live", p).leader == victim for p in led),  # type: ignore[union-attr]
    )
    for p, before in led.items():
        after = back.partition("live", p)
        assert after is not None
        assert (after.leader_epoch, after.partition_epoch) == (
            before.leader_epoch + 2, before.partition_epoch + 2
        )


def test_paused_controller_resumes_as_standby(
    cluster: LocalCluster, brokers: dict[int, int]
) -> None:
    """A controller frozen past its lease (GC pause, SIGSTOP) must not act when it wakes up."""
    paused_id = cluster.wait_active_controller(WAIT_S)
    cluster.process("controller", paused_id).send_signal(signal.SIGSTOP)
    try:
        successor = cluster.wait_active_controller(WAIT_S, exclude=paused_id)
    finally:
        cluster.process("controller", paused_id).send_signal(signal.SIGCONT)
    woken = stub(cluster, paused_id)
    result = create(woken, "from-zombie")
    assert result.error.code == ErrorCode.NOT_CONTROLLER.code
    assert snapshot(cluster).topic("from-zombie") is None
    assert cluster.active_controller() == successor


def test_lost_lease_stops_an_in_process_controller_at_once(cluster: LocalCluster) -> None:
    """Revoking the active controller's lease (what expiry does) makes it stop acting."""
    from fjord.controller.service import ControllerService
    from fjord.errors import NotControllerError

    cluster_id = "ctl-lease"

    async def scenario() -> None:
        async with etcd_client(cluster.etcd_url) as client:
            service = ControllerService(
                client, cluster_id, 7, "127.0.0.1", 1, lease_ttl_s=LOST_LEASE_TTL_S
            )
            await service.start()
            try:
                epoch = await service.wait_active(WAIT_S)
                await client.revoke_lease(service._lease_id)

                async def stopped() -> bool:
                    return not service.is_active()

                # "At once" means through the watcher, not the keep-alive: its first refresh
                # comes a third of the TTL after the grant, later than this wait's bound, so
                # stopping within the bound is the watcher seeing the key go (no speed target:
                # a loaded machine may take seconds).
                assert WAIT_S + WAIT_S < LOST_LEASE_TTL_S * KEEPALIVE_FRACTION
                await wait_for_async(
                    stopped, "the controller to stop acting after its lease was revoked",
                    WAIT_S, interval=0.01,
                )
                with pytest.raises(NotControllerError):
                    await service.fenced_write([put_op(Keys(cluster_id).topic("t"), b"{}")])
                # It campaigns again with a new lease and gets a new, higher epoch.
                assert await service.wait_active(WAIT_S) > epoch
            finally:
                await service.stop()

    asyncio.run(scenario())


def test_failover_on_sigkill_and_fencing_of_the_old_epoch(
    cluster: LocalCluster, brokers: dict[int, int]
) -> None:
    """Runs last in this module: it kills the active controller."""
    old_id = cluster.wait_active_controller(WAIT_S)
    old_epoch = snapshot(cluster).controller.epoch  # type: ignore[union-attr]
    cluster.kill("controller", old_id, signal.SIGKILL)
    # Another controller takes over once the killed one's lease expires (LEASE_TTL_S); how fast
    # is a figure for a benchmark, not a bound here (a loaded machine adds seconds): the wait's
    # bound only says the take-over happened.
    new_id = cluster.wait_active_controller(WAIT_S, exclude=old_id)
    assert new_id != old_id
    image = snapshot(cluster)
    assert image.controller is not None and image.controller.epoch > old_epoch

    # Fencing: a write guarded by the old epoch fails and changes nothing.
    keys = Keys(CLUSTER)

    async def zombie_write(client: Any) -> bool:
        response = await etcd_txn(
            client,
            [create_revision_is(keys.controller, old_epoch)],
            [put_op(keys.topic("zombie"), TopicRecord("z" * 32, 1, 1).to_json())],
        )
        return bool(response.succeeded)

    assert run(zombie_write, cluster) is False
    assert snapshot(cluster).topic("zombie") is None

    # The new controller serves, and the restarted old one comes back as a standby.
    new = stub(cluster, new_id)
    assert create(new, "after-failover").error.code == 0
    cluster.start_controller(old_id)
    assert create(stub(cluster, old_id), "x").error.code == ErrorCode.NOT_CONTROLLER.code
    assert cluster.active_controller() == new_id


def test_sigterm_revokes_the_lease_for_an_immediate_take_over(
    cluster: LocalCluster, brokers: dict[int, int]
) -> None:
    """A clean stop revokes the lease: the keys are gone when the process exits, so the
    standby does not wait for the TTL."""
    old_id = cluster.wait_active_controller(WAIT_S)
    proc = cluster.process("controller", old_id)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(WAIT_S) == 0
    keys = Keys(CLUSTER)

    async def registration_left(client: Any) -> bool:
        return await client.get(keys.controller_member(old_id).encode()) is None

    assert run(registration_left, cluster)
    assert cluster.wait_active_controller(WAIT_S, exclude=old_id) != old_id
    cluster.start_controller(old_id)
