"""Issue 17's proof: the seeds' shipping service (orders -> shipments) as an exactly-once
consume -> transform -> produce loop (:mod:`fjord.testing.eos_transformer`, a real process)
on a private cluster (3 brokers, 2 coordinators, RF 3), with SIGKILLs in the middle of its
transactions: of the transformer itself (restarted with the same ``transactional.id``), of the
coordinator serving its transactions and of a partition leader; and a zombie: the transformer
frozen (SIGSTOP) while its successor takes over, then thawed: it is fenced and exits. Under
``read_committed`` the shipments hold every order exactly once, and the group's committed
offsets reach the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import grpc
import pytest

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.local.cluster import LocalCluster
from fjord.testing.eos_transformer import FENCED_EXIT
from fjord.testing.waiting import wait_for

STEP_ORDERS = 300  # orders sent before each fault
WAIT_S = 120.0
TID = "shipper"
GROUP = "shipping"


def send_orders(cluster: LocalCluster, first: int, count: int) -> None:
    with Producer({"bootstrap.servers": cluster.bootstrap_servers}) as producer:
        for i in range(first, first + count):
            producer.send("orders", f"order-{i:04d}".encode(), key=f"{i % 50}".encode())
        producer.flush(60)


def start_transformer(cluster: LocalCluster, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "fjord.testing.eos_transformer",
         "--bootstrap", cluster.bootstrap_servers, "--transactional-id", TID,
         "--group", GROUP, "--source", "orders", "--sink", "shipments", "--batch", "15"],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, env=dict(os.environ),
    )


def committed_so_far(log: Path) -> int:
    lines = [ln for ln in log.read_text(errors="replace").splitlines()
             if ln.startswith("committed ")]
    return int(lines[-1].split()[1]) if lines else 0


def transaction_coordinator(cluster: LocalCluster) -> int | None:
    with grpc.insecure_channel(cluster.broker_addresses[0]) as channel:
        answer = broker_pb2_grpc.BrokerStub(channel).FindCoordinator(
            broker_pb2.FindCoordinatorRequest(key=TID, key_type=1), timeout=10
        )
    return None if answer.error.code else answer.coordinator.id


def group_offsets(cluster: LocalCluster) -> int:
    tps = [TopicPartition("orders", p) for p in range(3)]
    with Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": GROUP,
                   "enable.auto.commit": False}) as consumer:
        return sum(v or 0 for v in consumer.committed(tps, timeout=10).values())


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_every_order_shipped_exactly_once_through_kills_and_a_zombie(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", brokers=3, coordinators=2,
                           cluster_id=f"eos-{uuid.uuid4().hex[:8]}", unsafe_etcd_no_fsync=True,
                           coordinator_config={"group.initial.rebalance.delay.ms": "0"})
    with cluster:
        with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
            admin.create_topics([NewTopic("orders", 3, 3), NewTopic("shipments", 3, 3)])
        sent = 0

        def more_orders(count: int = STEP_ORDERS) -> None:
            # Fresh input before every fault, so the transformer is mid-stream when it hits.
            nonlocal sent
            send_orders(cluster, sent, count)
            sent += count

        def progresses(log: Path, what: str) -> None:
            before = committed_so_far(log)
            wait_for(lambda: committed_so_far(log) > before + 30, what, WAIT_S)

        more_orders()
        logs = tmp_path / "transformer.log"
        transformer = start_transformer(cluster, logs)
        try:
            # 1. SIGKILL the transformer mid-stream (it had committed some), restart it.
            progresses(logs, "first commits")
            transformer.kill()
            transformer.wait(30)
            more_orders()
            transformer = start_transformer(cluster, logs)
            progresses(logs, "commits after the transformer's restart")

            # 2. SIGKILL the coordinator serving its transactions; restart it.
            more_orders()
            victim = wait_for(lambda: transaction_coordinator(cluster), "txn coordinator",
                              WAIT_S)
            cluster.kill("coordinator", victim)
            progresses(logs, "commits after the coordinator's death")
            cluster.start_coordinator(victim)

            # 3. SIGKILL the leader of a shipments partition (markers, appends and offsets
            # move to the new leaders); restart it.
            more_orders()
            with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
                (described,) = admin.describe_topics(["shipments"], timeout=10)
            leader = described.partitions[0].leader
            cluster.kill("broker", leader)
            progresses(logs, "commits after the leader's death")
            cluster.start_broker(leader)

            # 4. A zombie: freeze the transformer, let a successor fence it, thaw it (with
            # fresh input, so that whatever partitions it gets back make it try to write).
            zombie = transformer
            zombie.send_signal(signal.SIGSTOP)
            more_orders()
            successor_log = tmp_path / "successor.log"
            transformer = start_transformer(cluster, successor_log)
            wait_for(lambda: committed_so_far(successor_log) > 0, "the successor's commits",
                     WAIT_S)
            zombie.send_signal(signal.SIGCONT)
            more_orders(60)
            assert zombie.wait(WAIT_S) == FENCED_EXIT, logs.read_text()[-2000:]

            # Everything is shipped and the group's offsets reach the end of the orders.
            wait_for(lambda: group_offsets(cluster), "all orders consumed", WAIT_S,
                     accept=lambda n: n >= sent)
        finally:
            if transformer.poll() is None:
                transformer.kill()
                transformer.wait(30)

        tps = [TopicPartition("shipments", p) for p in range(3)]
        with Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                       "isolation.level": "read_committed", "enable.auto.commit": False,
                       "auto.offset.reset": "earliest"}) as reader:
            reader.assign(tps)
            shipped: list[bytes] = []
            deadline = time.monotonic() + WAIT_S
            ends = reader.end_offsets(tps, timeout=10)
            while any(reader.position(tp) < ends[tp] for tp in tps):
                assert time.monotonic() < deadline, "shipments not read to their LSO"
                shipped.extend(r.value for r in reader.poll(0.5) if r.value is not None)
        counts = Counter(shipped)
        expected = {f"shipped:order-{i:04d}".encode() for i in range(sent)}
        assert set(counts) == expected, f"missing {len(expected - set(counts))}"
        duplicates = {v: n for v, n in counts.items() if n > 1}
        assert not duplicates, f"{len(duplicates)} orders shipped more than once"
