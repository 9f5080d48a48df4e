"""A busy broker keeps its lease, a wedged one loses it (fjord.broker.lease_keeper), with real
processes: the lease is renewed from a thread of the broker's own while its event loop shows
progress within the stall limit.

Private cluster (2 brokers, 1 controller; broker lease TTL 4 s, so renewals every 1.3 s; loop
stall limit 8 s). The brokers start with the test-only stall hook on
(fjord.broker.loop_stall_hook): SIGUSR2 makes the event loop spin for a given time, holding the
GIL between switch intervals as a long metadata apply does.

- A stall longer than the lease TTL (which, with the keep-alive on the loop as before, lapsed
  the lease every time) but shorter than the stall limit: same registration, same leader and
  leader epoch afterwards.
- A stall past the limit plus the TTL: renewals stop, etcd drops the registration, the
  controller moves the leadership, and once the loop moves again the broker registers anew.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fjord.broker.loop_stall_hook import LOOP_STALL_HOOK_ENV, stall_loop
from fjord.client import AdminClient, NewTopic
from fjord.local.cluster import LocalCluster
from fjord.testing.chaos_cluster import broker_registration
from fjord.testing.metrics_probe import scrape_metric
from fjord.testing.waiting import wait_for

pytestmark = pytest.mark.integration

LEASE_TTL_S = 4
STALL_LIMIT_S = 8.0
WAIT_S = 40.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv(LOOP_STALL_HOOK_ENV, "1")  # the brokers inherit it
        c = LocalCluster(tmp_path_factory.mktemp("lease") / "cluster", brokers=2,
                         coordinators=0, cluster_id=f"lease-{uuid.uuid4().hex[:8]}",
                         unsafe_etcd_no_fsync=True, broker_lease_ttl_s=LEASE_TTL_S,
                         broker_loop_stall_limit_s=STALL_LIMIT_S)
        c.start()
    try:
        yield c
    finally:
        c.stop()


def leadership(cluster: LocalCluster, topic: str, ask: int) -> tuple[int, int, int] | None:
    """(leader, leader epoch, ISR size) of ``topic``'s partition 0 as broker ``ask`` sees it."""
    response = cluster.broker_metadata(ask)
    for t in response.topics if response is not None else ():
        if t.name == topic and t.error.code == 0 and t.partitions:
            p = t.partitions[0]
            return p.leader, p.leader_epoch, len(p.isr)
    return None


def led_topic(cluster: LocalCluster) -> tuple[str, int, int, tuple[int, int, int]]:
    """A new topic (1 partition, RF 2) with a full ISR: (topic, its leader, the other broker,
    the leadership as the other broker sees it)."""
    topic = f"lease-{uuid.uuid4().hex[:6]}"
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(topic, 1, 2)])
    first = wait_for(lambda: (s := leadership(cluster, topic, 0)) is not None and s[0] >= 0
                     and s[2] == 2 and s, "a leader with a full ISR", WAIT_S)
    leader = first[0]
    other = 1 - leader
    seen = wait_for(lambda: (s := leadership(cluster, topic, other)) == first and s,
                    "the other broker's metadata to agree", WAIT_S)
    return topic, leader, other, seen


def broker_log(cluster: LocalCluster, broker_id: int) -> str:
    info = next(p for p in cluster.processes() if p.role == "broker" and p.id == broker_id)
    return Path(info.log).read_text()


def stall(cluster: LocalCluster, broker_id: int, seconds: float) -> None:
    info = next(p for p in cluster.processes() if p.role == "broker" and p.id == broker_id)
    stall_loop(info.pid, cluster.data_dir / "brokers" / str(broker_id), seconds)


def test_a_busy_loop_keeps_the_lease(cluster: LocalCluster) -> None:
    topic, leader, other, before = led_topic(cluster)
    epoch = broker_registration(cluster, leader)
    ended = broker_log(cluster, leader).count("event loop stall of")
    stall(cluster, leader, LEASE_TTL_S + 2.0)  # longer than the lease itself
    wait_for(lambda: broker_log(cluster, leader).count("event loop stall of") > ended,
             "the stall to end", WAIT_S)
    # The keep-alive thread saw the loop stand still, renewed meanwhile, and says where the
    # loop was stuck.
    report = wait_for(
        lambda: next((line for line in broker_log(cluster, leader).splitlines()
                      if "renewed from the keep-alive thread" in line), None),
        "the keep-alive thread to report the slow loop", WAIT_S)
    assert "_stall (loop_stall_hook.py:" in report, report
    metrics = cluster.metrics_address("broker", leader)
    assert scrape_metric(metrics, 'fjord_broker_event_loop_stalls_total{lease="renewed"}') >= 1
    assert scrape_metric(metrics, "fjord_broker_event_loop_last_stall_seconds") > LEASE_TTL_S
    assert broker_registration(cluster, leader) == epoch  # never re-registered
    assert leadership(cluster, topic, other) == before  # same leader, same leader epoch
    assert leadership(cluster, topic, leader) == before
    assert "lost its etcd lease" not in broker_log(cluster, leader)


def test_a_wedged_loop_loses_the_lease(cluster: LocalCluster) -> None:
    topic, leader, other, before = led_topic(cluster)
    epoch = broker_registration(cluster, leader)
    stall(cluster, leader, STALL_LIMIT_S + LEASE_TTL_S + 4.0)
    # Renewals stop at the limit; etcd drops the registration a TTL later and the controller
    # elects the other ISR member, in a newer leader epoch, while the loop still spins.
    moved = wait_for(lambda: (s := leadership(cluster, topic, other)) is not None
                     and s[0] == other and s, "the leadership to move to the other broker",
                     WAIT_S)
    assert moved[1] > before[1]
    stalled = [line for line in broker_log(cluster, leader).splitlines()
               if "no more lease renewals until it does" in line]
    assert stalled and "_stall (loop_stall_hook.py:" in stalled[0], stalled
    # Once the loop moves, the broker learns its lease is gone and registers anew.
    wait_for(lambda: broker_registration(cluster, leader) not in (None, epoch),
             "the wedged broker to register anew", WAIT_S)
    wait_for(lambda: "re-registered (epoch" in broker_log(cluster, leader),
             "the wedged broker to be unfenced", WAIT_S)
    assert "lost its etcd lease" in broker_log(cluster, leader)
