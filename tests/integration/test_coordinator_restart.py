"""Coordinator restarts in seconds, fencing kept: a group coordinator SIGKILLed and started
again at once with the same id and ``--state-dir`` takes its own registration back without
waiting for the old lease to expire, and serves its groups again (a commit and its fetch go
through the restarted process); a second live process with the same id is still refused, with
its own state dir (another incarnation) and with the same one (the lock). See docs/groups.md
("Coordinator restarts").

A private cluster (1 broker, 1 coordinator, coordinator lease TTL 20 s): the tests kill the
coordinator. The long TTL makes a restart that waited for the old lease fail the bound.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fjord.client import AdminClient, Consumer, NewTopic, TopicPartition
from fjord.local.cluster import LocalCluster
from fjord.testing.chaos_cluster import registered_coordinator
from fjord.testing.waiting import seconds_until, wait_for

pytestmark = pytest.mark.integration

WAIT_S = 30.0
LEASE_TTL_S = 20
COORDINATOR = 1
TOPIC = "restart-topic"
FJORD = [sys.executable, "-c", "from fjord.cli.main import main; main()"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("coordinator-restart"), brokers=1, coordinators=1,
                     cluster_id=f"crestart-{uuid.uuid4().hex[:8]}", unsafe_etcd_no_fsync=True,
                     coordinator_lease_ttl_s=LEASE_TTL_S)
    c.start()
    try:
        with AdminClient({"bootstrap.servers": c.bootstrap_servers}) as admin:
            admin.create_topics([NewTopic(TOPIC, 1, 1)])
        yield c
    finally:
        c.stop()


def commit_and_fetch(cluster: LocalCluster, group: str, offset: int) -> int | None:
    """Commit ``offset`` for partition 0 of the test topic in ``group`` and read it back
    (both go through the coordinator owning the group's __consumer_offsets partition)."""
    tp = TopicPartition(TOPIC, 0)
    with Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group,
                   "enable.auto.commit": False}) as consumer:
        consumer.commit({tp: offset})
        return consumer.committed([tp])[tp]


def test_killed_coordinator_restarts_without_waiting_for_its_lease(
    cluster: LocalCluster,
) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    assert commit_and_fetch(cluster, group, 5) == 5
    before = registered_coordinator(cluster, COORDINATOR)
    assert before is not None and before[1].incarnation is not None
    cluster.kill("coordinator", COORDINATOR)
    killed = time.monotonic()
    cluster.start_coordinator(COORDINATOR, wait=False)
    took = seconds_until(
        lambda: (found := registered_coordinator(cluster, COORDINATOR)) is not None
        and found[0] != before[0], WAIT_S, interval=0.05)
    assert took is not None
    registered_after = time.monotonic() - killed
    after = registered_coordinator(cluster, COORDINATOR)
    assert after is not None and after[1].incarnation != before[1].incarnation
    log = (cluster.data_dir / "logs" / f"coordinator-{COORDINATOR}.log").read_text()
    assert "took back the registration of its own previous run" in log
    print(f"\ncoordinator SIGKILLed and restarted at once: registered again "
          f"{registered_after:.2f} s after the kill (lease TTL {LEASE_TTL_S} s)", flush=True)
    # An order, not a speed target: registered before the old lease could have expired
    # (waiting for it would take the TTL; process start-up takes 1-3 s here, more under load).
    assert registered_after < LEASE_TTL_S, registered_after
    # The restarted process serves the group: what was committed before, and a new commit
    # (its claim of the __consumer_offsets partition was admitted by the partition's leader).
    assert wait_for(lambda: commit_and_fetch(cluster, group, 9), "a commit through the "
                    "restarted coordinator", WAIT_S, retry_on=(Exception,)) == 9


def spawn_coordinator(cluster: LocalCluster, state_dir: Path, log: Path
                      ) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*FJORD, "coordinator", "--id", str(COORDINATOR), "--listen", "127.0.0.1:0",
             "--state-dir", str(state_dir), "--etcd", cluster.etcd_url,
             "--cluster-id", cluster.cluster_id, "--lease-ttl", "6"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def test_second_live_coordinator_with_the_same_id_is_refused(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    held = wait_for(lambda: registered_coordinator(cluster, COORDINATOR),
                    "the coordinator registered", WAIT_S)
    # Its own state dir: another incarnation, so the live registration is never taken.
    log = tmp_path / "intruder.log"
    intruder = spawn_coordinator(cluster, tmp_path / "other-state", log)
    try:
        wait_for(lambda: "already registered" in log.read_text() or intruder.poll() is not None,
                 "the second process to find the id registered", WAIT_S)
        assert intruder.poll() is None, log.read_text()
        assert registered_coordinator(cluster, COORDINATOR) == held
    finally:
        intruder.kill()
        intruder.wait()
    # The same state dir while the coordinator runs: refused at start by the lock.
    log = tmp_path / "sharer.log"
    sharer = spawn_coordinator(cluster, cluster.data_dir / "coordinators" / str(COORDINATOR),
                               log)
    try:
        code = sharer.wait(timeout=WAIT_S)
    finally:
        sharer.kill()
    text = log.read_text()
    assert code != 0 and "in use by another coordinator process" in text, text
    assert f"pid {cluster.process('coordinator', COORDINATOR).pid}" in text, text
    assert registered_coordinator(cluster, COORDINATOR) == held
