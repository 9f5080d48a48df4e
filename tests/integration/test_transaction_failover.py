"""Transactions when things go wrong, on a private cluster (1 broker, 2 coordinators, the
timeout sweep every 300 ms): the transaction coordinator SIGKILLed in the middle of a
transaction (the other coordinator takes the partition over, replays ``__transaction_state``
and the producer commits there, every record exactly once), and a producer that goes silent
(its transaction is aborted on ``transaction.timeout.ms``, the partition's last stable offset
moves on, the producer is fenced when it comes back)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import grpc
import pytest

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.errors import TransactionError
from fjord.local.cluster import LocalCluster
from fjord.testing.waiting import wait_for
from fjord.transactions.defaults import TRANSACTION_STATE_TOPIC
from fjord.transactions.log import encode_key, transaction_partition

pytestmark = pytest.mark.integration

WAIT_S = 60.0
#: transactional.id.expiration.ms here: longer than any pause between a producer's calls.
EXPIRATION_MS = 8000
TOPIC = "txn-failover"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("txn-failover"), brokers=1, coordinators=2,
        cluster_id=f"txnfo-{uuid.uuid4().hex[:8]}", unsafe_etcd_no_fsync=True,
        coordinator_config={
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "300",
            "transactional.id.expiration.ms": str(EXPIRATION_MS),
        },
    )
    c.start()
    try:
        with AdminClient({"bootstrap.servers": c.bootstrap_servers}) as admin:
            admin.create_topics([NewTopic(TOPIC, 2, 1)])
        yield c
    finally:
        c.stop()


def transaction_coordinator(cluster: LocalCluster, tid: str) -> int:
    """The id of the coordinator serving ``tid`` (FindCoordinator key_type 1)."""
    address = cluster.broker_addresses[0]

    def find() -> int | None:
        with grpc.insecure_channel(address) as channel:
            answer = broker_pb2_grpc.BrokerStub(channel).FindCoordinator(
                broker_pb2.FindCoordinatorRequest(key=tid, key_type=1), timeout=10
            )
        return None if answer.error.code else answer.coordinator.id

    found = wait_for(find, f"the coordinator of {tid}", WAIT_S)
    assert found is not None
    return found


def committed_values(cluster: LocalCluster, expect: int, topic: str = TOPIC) -> list[bytes]:
    """What a read_committed consumer reads from the whole topic, once it read ``expect``
    values and reached the last stable offset of every partition."""
    tps = [TopicPartition(topic, p) for p in range(2)]
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    try:
        consumer.assign(tps)
        values: list[bytes] = []

        def done() -> bool:
            values.extend(r.value for r in consumer.poll(0.5) if r.value is not None)
            ends = consumer.end_offsets(tps, timeout=10)
            return len(values) >= expect and all(consumer.position(tp) >= ends[tp] for tp in tps)

        wait_for(done, f"{expect} committed values", WAIT_S)
        return values
    finally:
        consumer.close()


def producer(cluster: LocalCluster, tid: str, timeout_ms: int = 60_000) -> Producer:
    return Producer({"bootstrap.servers": cluster.bootstrap_servers, "transactional.id": tid,
                     "linger.ms": 1, "transaction.timeout.ms": timeout_ms})


def test_commit_survives_a_sigkill_of_the_transaction_coordinator(
    cluster: LocalCluster,
) -> None:
    tid = f"fo-{uuid.uuid4().hex[:8]}"
    p = producer(cluster, tid)
    try:
        p.init_transactions(WAIT_S)
        p.begin_transaction()
        for i in range(20):
            p.send(TOPIC, f"kill-{i}".encode(), key=str(i).encode())
        p.flush(WAIT_S)
        victim = transaction_coordinator(cluster, tid)
        cluster.kill("coordinator", victim)
        p.commit_transaction(WAIT_S)  # at the coordinator that took the partition over
        assert transaction_coordinator(cluster, tid) != victim
        p.begin_transaction()
        p.send(TOPIC, b"after-failover", key=b"x")
        p.commit_transaction(WAIT_S)
    finally:
        p.close(10)
        cluster.start_coordinator(victim)
    values = [v for v in committed_values(cluster, 21) if v.startswith((b"kill-", b"after-"))]
    assert sorted(values) == sorted([f"kill-{i}".encode() for i in range(20)]
                                    + [b"after-failover"])


def test_a_silent_producers_transaction_is_aborted_on_its_timeout(
    cluster: LocalCluster,
) -> None:
    tid = f"silent-{uuid.uuid4().hex[:8]}"
    topic = f"silent-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(topic, 2, 1)])
    silent = producer(cluster, tid, timeout_ms=1500)
    try:
        silent.init_transactions(WAIT_S)
        silent.begin_transaction()
        for i in range(5):
            silent.send(topic, f"silent-{i}".encode(), key=str(i).encode())
        silent.flush(WAIT_S)
        # Another producer's committed records after the silent one's: readable only once
        # the silent transaction is aborted (the last stable offset waits for it).
        other = producer(cluster, f"other-{uuid.uuid4().hex[:8]}")
        try:
            other.init_transactions(WAIT_S)
            other.begin_transaction()
            for i in range(5):
                other.send(topic, f"other-{i}".encode(), key=str(i).encode())
            other.commit_transaction(WAIT_S)
        finally:
            other.close(10)
        values = committed_values(cluster, 5, topic)
        assert sorted(values) == sorted(f"other-{i}".encode() for i in range(5))
        with pytest.raises(TransactionError) as fenced:
            silent.commit_transaction(WAIT_S)
        assert fenced.value.fatal
    finally:
        silent.close(10)


def test_an_idle_transactional_id_expires(cluster: LocalCluster) -> None:
    """``transactional.id.expiration.ms``: an id without a transaction that was not used for
    that long is forgotten (a tombstone in ``__transaction_state``); the next producer with
    that id starts over with a new producer id."""
    tid = f"idle-{uuid.uuid4().hex[:8]}"
    first = producer(cluster, tid)
    try:
        first.init_transactions(WAIT_S)
        first.begin_transaction()
        first.send(TOPIC, b"idle-0")
        first.commit_transaction(WAIT_S)
        old_pid = first._txn._idempotence.producer_id  # type: ignore[union-attr]
    finally:
        first.close(10)
    state = TopicPartition(TRANSACTION_STATE_TOPIC, transaction_partition(tid))
    reader = Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                       "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        reader.assign([state])
        seen: list[bytes | None] = []

        def tombstone() -> bool:
            seen.extend(r.value for r in reader.poll(0.5) if r.key == encode_key(tid))
            return bool(seen) and seen[-1] is None

        wait_for(tombstone, f"the tombstone of {tid}", EXPIRATION_MS / 1000 + WAIT_S)
    finally:
        reader.close()
    second = producer(cluster, tid)
    try:
        second.init_transactions(WAIT_S)
        idem = second._txn._idempotence  # type: ignore[union-attr]
        assert idem.producer_id != old_pid and idem.producer_epoch == 0
    finally:
        second.close(10)
