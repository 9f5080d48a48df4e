"""FindCoordinator and coordinator placement against the shared local cluster's real controller
and brokers: the first lookup creates ``__consumer_offsets``, the controller gives its partitions
to the live coordinators and moves them when one goes away.

The coordinators here are registrations bound to etcd leases the test owns: exactly what a
``fjord coordinator`` process writes (``coordinators/<id>``, lease-bound), so killing one is
revoking (clean stop) or no longer refreshing (crash) its lease. Their ids (900+) cannot clash
with real coordinators; every lease is revoked at the end, so the cluster is left as found.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable

import aetcd
import grpc
import pytest
from click.testing import CliRunner

from fjord._proto import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc
from fjord.cli.main import cli
from fjord.controller.defaults import OFFSETS_TOPIC_CONFIG
from fjord.errors import ErrorCode
from fjord.groups.defaults import OFFSETS_TOPIC, OFFSETS_TOPIC_PARTITIONS
from fjord.groups.offsets_topic import group_partition
from fjord.local.cluster import LocalCluster
from fjord.metadata import (
    CoordinatorRegistration,
    Keys,
    MetadataImage,
    MetadataWatcher,
    OffsetsOwner,
    etcd_client,
)
from fjord.testing.waiting import wait_for_async

pytestmark = pytest.mark.integration

WAIT_S = 30.0  # generous bound of every wait on this loaded machine
LONG_TTL_S = 60  # coordinators that must outlive the test's steps
SHORT_TTL_S = 3  # the coordinator that "crashes" (stops refreshing its lease)
FAKE_IDS = (900, 901, 902)


async def find(
    stub: broker_pb2_grpc.BrokerStub, key: str, key_type: int = 0
) -> broker_pb2.FindCoordinatorResponse:
    return await stub.FindCoordinator(
        broker_pb2.FindCoordinatorRequest(key=key, key_type=key_type), timeout=10
    )


async def wait_image(
    watcher: MetadataWatcher, predicate: Callable[[MetadataImage], bool], what: str
) -> MetadataImage:
    try:
        return await watcher.wait_for(predicate, WAIT_S)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}: {watcher.image!r}") from None


def owned_by(image: MetadataImage, coordinator_id: int) -> dict[int, OffsetsOwner]:
    return {p: o for p, o in image.offsets_owners.items() if o.coordinator_id == coordinator_id}


def all_owned_by_live(image: MetadataImage) -> bool:
    owners = image.offsets_owners
    return all(
        p in owners and owners[p].coordinator_id in image.coordinators
        for p in range(OFFSETS_TOPIC_PARTITIONS)
    )


def balanced(image: MetadataImage) -> bool:
    """Every partition owned by a live coordinator, and their loads within one."""
    loads = [len(owned_by(image, c)) for c in image.coordinators]
    return all_owned_by_live(image) and bool(loads) and max(loads) - min(loads) <= 1


def group_owned_by(image: MetadataImage, coordinator_id: int) -> str:
    """A group id whose partition ``coordinator_id`` owns."""
    mine = owned_by(image, coordinator_id)
    return next(g for g in (f"group-{i}" for i in range(10_000)) if group_partition(g) in mine)


@contextlib.asynccontextmanager
async def refreshed(client: aetcd.Client, lease: aetcd.Lease) -> AsyncIterator[list[float]]:
    """Keep ``lease`` alive until the block ends; yields [monotonic time at which etcd's answer
    to the last refresh arrived]. The lease's TTL counts from when etcd got that refresh, which
    lies between sending it and this time (the coordinator "died" there)."""
    last = [time.monotonic()]

    async def loop() -> None:
        while True:
            await asyncio.sleep(lease.ttl / 3)
            await client.refresh_lease(lease.id)
            last[0] = time.monotonic()

    task = asyncio.ensure_future(loop())
    try:
        yield last
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_find_coordinator_creates_offsets_topic_and_follows_coordinator_liveness(
    local_cluster: LocalCluster,
) -> None:
    keys = Keys(local_cluster.cluster_id)
    broker_address = sorted(local_cluster.broker_addresses.values())[0]

    async def scenario() -> None:
        async with etcd_client(local_cluster.etcd_url) as client:
            watcher = MetadataWatcher(client, local_cluster.cluster_id)
            await watcher.start()
            leases: list[aetcd.Lease] = []
            try:
                async with grpc.aio.insecure_channel(broker_address) as channel:
                    stub = broker_pb2_grpc.BrokerStub(channel)
                    await steps(client, watcher, stub, leases)
            finally:
                for lease in leases:
                    with contextlib.suppress(Exception):
                        await client.revoke_lease(lease.id)
                await watcher.stop()

    async def steps(
        client: aetcd.Client,
        watcher: MetadataWatcher,
        stub: broker_pb2_grpc.BrokerStub,
        leases: list[aetcd.Lease],
    ) -> None:
        # A bad key type is a typed, non-retriable error; so is an empty group id (and neither
        # creates the topic).
        had_topic = watcher.image.topic(OFFSETS_TOPIC) is not None
        bad = await find(stub, "g", key_type=2)
        assert bad.error.code == ErrorCode.INVALID_REQUEST.code and "key_type" in bad.error.message
        empty = await find(stub, "")
        assert empty.error.code == ErrorCode.INVALID_GROUP_ID.code

        # The first lookup creates the topic (unless an earlier test did); until it has an owner
        # the answer is COORDINATOR_NOT_AVAILABLE.
        first = await find(stub, "g")
        if not had_topic:
            assert first.error.code == ErrorCode.COORDINATOR_NOT_AVAILABLE.code
            assert "does not exist" in first.error.message
        image = await wait_image(
            watcher, lambda i: i.topic(OFFSETS_TOPIC) is not None, "__consumer_offsets"
        )
        record = image.topic(OFFSETS_TOPIC)
        assert record is not None
        assert record.partitions == OFFSETS_TOPIC_PARTITIONS
        assert record.replication_factor == min(3, len(image.brokers))
        assert record.config == OFFSETS_TOPIC_CONFIG

        # Three coordinators register; the controller spreads the partitions over every live
        # coordinator within one.
        for cid in FAKE_IDS:
            lease = await client.lease(SHORT_TTL_S if cid == 901 else LONG_TTL_S)
            leases.append(lease)
            registration = CoordinatorRegistration(cid, "127.0.0.1", 40_000 + cid)
            await client.put(keys.coordinator(cid).encode(), registration.to_json(), lease=lease.id)
        short_lease = leases[1]
        async with refreshed(client, short_lease):
            # (Waited for, not asserted at the first image: a real coordinator of the shared
            # cluster may come or go meanwhile, and each change is one more controller write.)
            image = await wait_image(
                watcher,
                lambda i: set(FAKE_IDS) <= set(i.coordinators) and balanced(i),
                "owners on the new coordinators, balanced",
            )

            # FindCoordinator answers the owner of the group's partition.
            group = group_owned_by(image, 900)
            found = await wait_for_async(
                lambda: find(stub, group),
                f"FindCoordinator({group!r})",
                WAIT_S,
                accept=lambda r: r.coordinator.id == 900,
            )
            assert found.error.code == 0
            assert (found.coordinator.id, found.coordinator.port) == (900, 40_900)
            assert found.partition == group_partition(group)

            # Clean stop of 900 (lease revoked): its partitions move at once, epochs bumped.
            before = owned_by(image, 900)
            revoked_at = time.monotonic()
            await client.revoke_lease(leases[0].id)
            image = await wait_image(
                watcher,
                lambda i: (
                    900 not in i.coordinators and not owned_by(i, 900) and all_owned_by_live(i)
                ),
                "900's partitions to move",
            )
            # Kept: an ORDER, not a speed target: the partitions moved because of the revoke,
            # long before the lease (LONG_TTL_S) could have expired.
            elapsed = time.monotonic() - revoked_at
            assert elapsed < LONG_TTL_S, f"moved {elapsed:.1f} s after the revoke"
            for p, old in before.items():
                new = image.offsets_owners[p]
                assert new.coordinator_id != 900
                assert new.coordinator_epoch == old.coordinator_epoch + 1
            # The controller may rebalance again after the move (another coordinator of the
            # shared cluster coming or going): the answer must name the owner of the moment.
            def current_owner() -> int:
                return watcher.image.offsets_owners[group_partition(group)].coordinator_id

            moved = await wait_for_async(
                lambda: find(stub, group),
                f"FindCoordinator({group!r}) to name the partition's current owner",
                WAIT_S,
                accept=lambda r: r.error.code == 0 and r.coordinator.id == current_owner(),
            )
            assert moved.coordinator.id != 900

            # Crash of 901 (its lease is no longer refreshed): its partitions move to live
            # coordinators once the lease expires. How soon after SHORT_TTL_S is a speed figure
            # (a loaded machine adds seconds), not bounded here: the wait's bound (WAIT_S, ten
            # times the TTL) only says the replacement happened.
            before = owned_by(image, 901)
        image = await wait_image(
            watcher,
            lambda i: not owned_by(i, 901) and all_owned_by_live(i),
            "901's partitions to move after its lease expired",
        )
        for p, old in before.items():
            assert image.offsets_owners[p].coordinator_epoch == old.coordinator_epoch + 1

        # The last one goes: with no live coordinator left the owners stay, and FindCoordinator
        # says COORDINATOR_NOT_AVAILABLE (retriable) because the owner is not registered.
        group = group_owned_by(image, 902)
        await client.revoke_lease(leases[2].id)
        image = await wait_image(watcher, lambda i: 902 not in i.coordinators, "902 to go")
        if not image.coordinators:  # no real coordinator runs in this cluster
            gone = await wait_for_async(
                lambda: find(stub, group),
                f"FindCoordinator({group!r})",
                WAIT_S,
                accept=lambda r: r.error.code != 0,
            )
            assert gone.error.code == ErrorCode.COORDINATOR_NOT_AVAILABLE.code
            assert "not live" in gone.error.message

    asyncio.run(scenario())

    # Kafka's tools list the internal topic and describe it; Metadata marks it internal.
    runner = CliRunner()
    listed = runner.invoke(
        cli, ["topics", "list", "--bootstrap-server", local_cluster.bootstrap_servers,
              "--output", "json"],
    )  # fmt: skip
    assert listed.exit_code == 0, listed.output
    assert {"name": OFFSETS_TOPIC, "partitions": OFFSETS_TOPIC_PARTITIONS} in json.loads(
        listed.stdout
    )
    without = runner.invoke(
        cli, ["topics", "list", "--bootstrap-server", local_cluster.bootstrap_servers,
              "--exclude-internal"],
    )  # fmt: skip
    assert without.exit_code == 0, without.output
    assert OFFSETS_TOPIC not in without.stdout
    described = runner.invoke(
        cli, ["topics", "describe", "--bootstrap-server", local_cluster.bootstrap_servers,
              "--topic", OFFSETS_TOPIC, "--output", "json"],
    )  # fmt: skip
    assert described.exit_code == 0, described.output
    (topic,) = json.loads(described.stdout)
    assert topic["internal"] is True
    assert topic["partition_count"] == OFFSETS_TOPIC_PARTITIONS
    assert topic["configs"]["segment.bytes"] == "104857600"
    # Compacted: each partition shows its cleaner's state (the leader's and every replica's).
    for partition in topic["partitions"]:
        cleaner = partition["cleaner"]
        assert set(cleaner["replicas"]) <= {str(b) for b in partition["replicas"]}
        if str(partition["leader"]) in cleaner["replicas"]:
            assert cleaner["first_dirty_offset"] >= 0 and 0 <= cleaner["dirty_ratio"] <= 1


def test_internal_topics_cannot_be_deleted_or_made_by_users(local_cluster: LocalCluster) -> None:
    controller = local_cluster.address("controller", local_cluster.wait_active_controller(WAIT_S))

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(controller) as channel:
            stub = controller_pb2_grpc.ControllerStub(channel)
            deleted = await stub.DeleteTopics(
                controller_pb2.DeleteTopicsRequest(names=[OFFSETS_TOPIC, "__other"]), timeout=10
            )
            codes = {r.name: r.error.code for r in deleted.results}
            assert codes[OFFSETS_TOPIC] == ErrorCode.INVALID_TOPIC_EXCEPTION.code
            assert codes["__other"] == ErrorCode.INVALID_TOPIC_EXCEPTION.code
            created = await stub.CreateTopics(
                controller_pb2.CreateTopicsRequest(
                    topics=[
                        controller_pb2.CreatableTopic(
                            name="__mine", num_partitions=1, replication_factor=1
                        ),
                        controller_pb2.CreatableTopic(
                            name=OFFSETS_TOPIC, num_partitions=3, replication_factor=1
                        ),
                    ],
                    validate_only=True,
                ),
                timeout=10,
            )
            by_name = {r.name: r.error for r in created.results}
            assert by_name["__mine"].code == ErrorCode.INVALID_TOPIC_EXCEPTION.code
            assert "internal" in by_name["__mine"].message
            assert by_name[OFFSETS_TOPIC].code == ErrorCode.INVALID_REQUEST.code

    asyncio.run(scenario())

    # The CLI says so in one line and a non-zero exit.
    refused = CliRunner().invoke(
        cli, ["topics", "delete", "--bootstrap-server", local_cluster.bootstrap_servers,
              "--topic", OFFSETS_TOPIC],
    )  # fmt: skip
    assert refused.exit_code != 0
    assert "INVALID_TOPIC_EXCEPTION" in refused.stderr and "internal" in refused.stderr
