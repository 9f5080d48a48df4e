"""Rack awareness beyond topic creation, on a private cluster of 5 brokers in 3 zones
(brokers 0 and 3 in zone-a, 1 and 4 in zone-b, 2 in zone-c; ``fjord broker --rack``):

- a topic is created with each partition's 3 replicas in 3 zones (the controller's placement);
- a replication-factor change (``AdminClient.alter_replication_factor``: a reassignment planned
  by :func:`fjord.cluster.reassignment_plan.plan_reassignment` with the brokers' racks) keeps
  a partition's replicas in distinct zones;
- the operator's drain of broker 4 (a scale-in from 5 to 4: ``decide_scaling`` on what
  ``FjordAdmin`` observes, racks included, submitted through ``FjordAdmin.reassign``) moves
  every replica off broker 4 and keeps each partition in 3 zones: broker 4's replicas go to
  broker 1, the other zone-b broker, though broker 0 or 3 would balance as well (without
  racks the planner put some on them: checked by hand);
- ``fjord topics describe`` shows each replica's rack (table and JSON).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from fjord.cli.main import cli as cli_main
from fjord.client import AdminClient, NewTopic
from fjord.local.cluster import LocalCluster
from fjord.testing.waiting import wait_for
from fjord_operator.decisions import ClusterObservation, ScalingPhase, decide_scaling
from fjord_operator.handlers import FjordAdmin

pytestmark = pytest.mark.integration

RACKS = {0: "zone-a", 1: "zone-b", 2: "zone-c", 3: "zone-a", 4: "zone-b"}
WAIT_S = 60


@pytest.fixture(scope="module")
def racked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        tmp_path_factory.mktemp("racks"), brokers=5, coordinators=0,
        unsafe_etcd_no_fsync=True, racks=RACKS,
    )
    with cluster:
        yield cluster


def _replicas(admin: AdminClient, topic: str) -> dict[int, tuple[int, ...]]:
    (description,) = admin.describe_topics([topic])
    return {p.partition: tuple(p.replicas) for p in description.partitions}


def _zones(replicas: tuple[int, ...]) -> list[str]:
    return sorted(RACKS[b] for b in replicas)


def _settled(admin: AdminClient) -> bool:
    return not admin.list_partition_reassignments()


def test_the_brokers_register_their_racks(racked: LocalCluster) -> None:
    with AdminClient({"bootstrap.servers": racked.bootstrap_servers}) as admin:
        brokers = admin.describe_cluster().brokers
    assert {b.id: b.rack for b in brokers} == RACKS


def test_a_replication_factor_change_keeps_replicas_in_distinct_zones(
    racked: LocalCluster,
) -> None:
    with AdminClient({"bootstrap.servers": racked.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic("grown", 8, 1)])
        admin.alter_replication_factor("grown", 3)
        # Done at the controller first; the broker answering describe_topics learns it from
        # its metadata a moment later.
        wait_for(lambda: _settled(admin) and all(
            len(r) == 3 for r in _replicas(admin, "grown").values()
        ), "the reassignments done and seen by the brokers", WAIT_S)
        for partition, replicas in _replicas(admin, "grown").items():
            assert len(replicas) == 3
            assert _zones(replicas) == ["zone-a", "zone-b", "zone-c"], (partition, replicas)


def test_the_operators_drain_keeps_replicas_in_distinct_zones(racked: LocalCluster) -> None:
    bootstrap = racked.bootstrap_servers
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic("drained", 8, 3)])
        placed = _replicas(admin, "drained")
        # Created rack-aware: 3 replicas in 3 zones; broker 4 holds some of them.
        assert all(_zones(r) == ["zone-a", "zone-b", "zone-c"] for r in placed.values())
        assert any(4 in r for r in placed.values())

        async def drain() -> None:
            fjord = FjordAdmin(bootstrap, 10.0)
            try:
                registered, assignment, reassigning = await fjord.observe_cluster()
                racks = await fjord.observe_racks()
                assert racks == RACKS
                decision = decide_scaling(ClusterObservation(
                    desired=4, statefulset_replicas=5, registered=registered,
                    assignment=assignment, reassigning=reassigning, racks=racks,
                ))
                assert decision.phase is ScalingPhase.DRAINING, decision
                assert decision.reassign, decision
                await fjord.reassign(decision.reassign)
            finally:
                await asyncio.to_thread(fjord.close)

        asyncio.run(drain())
        wait_for(lambda: _settled(admin) and not any(
            4 in r for topic in ("drained", "grown") for r in _replicas(admin, topic).values()
        ), "the drain done and seen by the brokers", WAIT_S)
        for topic in ("drained", "grown"):
            for partition, replicas in _replicas(admin, topic).items():
                assert 4 not in replicas, (topic, partition, replicas)
                assert _zones(replicas) == ["zone-a", "zone-b", "zone-c"], (
                    topic, partition, replicas
                )


def test_topics_describe_shows_the_racks(racked: LocalCluster, tmp_path: Path) -> None:
    bootstrap = racked.bootstrap_servers
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic("shown", 2, 3)])
        replicas = _replicas(admin, "shown")
    runner = CliRunner()
    table = runner.invoke(
        cli_main, ["topics", "describe", "--bootstrap-server", bootstrap, "--topic", "shown"]
    )
    assert table.exit_code == 0, table.output
    assert "Racks" in table.output
    for partition, members in replicas.items():
        assert ",".join(RACKS[b] for b in members) in table.output, (partition, table.output)
    described = runner.invoke(
        cli_main,
        ["topics", "describe", "--bootstrap-server", bootstrap, "--topic", "shown", "-o", "json"],
    )
    assert described.exit_code == 0, described.output
    (topic,) = json.loads(described.output)
    for p in topic["partitions"]:
        assert p["replica_racks"] == [RACKS[b] for b in p["replicas"]]
