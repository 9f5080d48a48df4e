"""Transactions while partition leaders die (issue 17's proof, the broker side): fjord.client's
transactional producer writes transactions over two partitions (RF 3, min.insync.replicas 2) of
a private cluster (3 brokers, a coordinator); the leader of a partition is SIGKILLed once with
the transaction's records in flight and once after they were flushed, before the commit (its
marker then goes to the new leader); every fourth transaction is aborted on purpose. Under
read_committed every committed record is read exactly once and no aborted one ever; every
transaction ends (the last stable offset reaches the high watermark on both partitions).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.errors import TransactionError
from fjord.local.cluster import LocalCluster
from fjord.testing.waiting import WaitTimeout, is_value, wait_for

pytestmark = pytest.mark.integration

BROKERS = (0, 1, 2)
PARTITIONS = 2
TRANSACTIONS = 12
RECORDS_PER_TXN = 10
WAIT_S = 120.0
TOPIC = "txn-leader-kill"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("txn-leader-kill"), brokers=3, controllers=1, coordinators=1,
        cluster_id=f"txk-{uuid.uuid4().hex[:8]}", broker_lease_ttl_s=2,
        unsafe_etcd_no_fsync=True,
        # A dead broker leaves the ISRs within seconds: acks=all and markers go on without it.
        config={"replica.lag.time.max.ms": "5000"},
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()


def leader_of(cluster: LocalCluster, partition: int) -> int:
    """The partition's leader once it serves (a ListOffsets without error)."""

    def serving() -> int | None:
        for b in BROKERS:
            if cluster.process("broker", b).poll() is not None:
                continue
            request = broker_pb2.ListOffsetsRequest(replica_id=-1)
            request.topics.add(name=TOPIC).partitions.add(partition=partition, timestamp=-1,
                                                          current_leader_epoch=-1)
            try:
                with grpc.insecure_channel(cluster.address("broker", b)) as channel:
                    out = broker_pb2_grpc.BrokerStub(channel).ListOffsets(request, timeout=5)
            except grpc.RpcError:
                continue
            if out.topics[0].partitions[0].error.code == 0:
                return b
        return None

    return wait_for(serving, f"a serving leader of {TOPIC}-{partition}", WAIT_S, accept=is_value)


def full_isr(cluster: LocalCluster) -> bool:
    """Whether every partition of the topic has all three brokers in its ISR (so a kill leaves
    min.insync.replicas in-sync replicas)."""
    for b in BROKERS:
        if cluster.process("broker", b).poll() is not None:
            continue
        try:
            with grpc.insecure_channel(cluster.address("broker", b)) as channel:
                md = broker_pb2_grpc.BrokerStub(channel).Metadata(
                    broker_pb2.MetadataRequest(topics=[TOPIC]), timeout=5
                )
        except grpc.RpcError:
            continue
        partitions = [p for t in md.topics for p in t.partitions]
        return len(partitions) == PARTITIONS and all(len(p.isr) == 3 for p in partitions)
    return False


def stable(cluster: LocalCluster, partition: int) -> bool:
    """Whether the partition's last stable offset equals its high watermark (every
    transaction on it has ended and its marker is replicated)."""
    leader = leader_of(cluster, partition)
    ends = []
    for isolation in (0, 1):
        request = broker_pb2.ListOffsetsRequest(replica_id=-1, isolation_level=isolation)
        request.topics.add(name=TOPIC).partitions.add(partition=partition, timestamp=-1,
                                                      current_leader_epoch=-1)
        with grpc.insecure_channel(cluster.address("broker", leader)) as channel:
            out = broker_pb2_grpc.BrokerStub(channel).ListOffsets(request, timeout=5)
        ends.append(out.topics[0].partitions[0].offset)
    return ends[0] == ends[1]


def test_committed_exactly_once_and_aborted_never_while_leaders_die(
    cluster: LocalCluster,
) -> None:
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})])
    for p in range(PARTITIONS):
        leader_of(cluster, p)
    producer = Producer({
        "bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 5,
        "transactional.id": f"leader-kill-{uuid.uuid4().hex[:6]}",
        "delivery.timeout.ms": 120_000, "request.timeout.ms": 10_000,
    })
    committed: list[bytes] = []
    aborted: list[bytes] = []
    killed: list[int] = []
    try:
        producer.init_transactions(WAIT_S)
        for txn in range(TRANSACTIONS):
            attempt = 0
            while True:
                values = [f"t{txn}-a{attempt}-r{r}".encode() for r in range(RECORDS_PER_TXN)]
                producer.begin_transaction()
                for r, value in enumerate(values):
                    producer.send(TOPIC, value, partition=r % PARTITIONS)
                if txn == 2:  # records in flight: the leader of partition 0 dies
                    killed.append(leader_of(cluster, 0))
                    cluster.kill("broker", killed[-1])
                producer.flush(WAIT_S)
                if txn == 6:  # flushed, not committed: the leader of partition 1 dies
                    killed.append(leader_of(cluster, 1))
                    cluster.kill("broker", killed[-1])
                if txn % 4 == 3:
                    producer.abort_transaction(WAIT_S)
                    aborted.extend(values)
                    break
                try:
                    _commit(producer, txn)
                except TransactionError as exc:  # a record failed: abort, send it again
                    assert exc.txn_requires_abort(), exc
                    producer.abort_transaction(WAIT_S)
                    aborted.extend(values)
                    attempt += 1
                    continue
                committed.extend(values)
                break
            if txn in (4, 9):  # the killed broker comes back (it catches up as a follower)
                cluster.start_broker(killed[-1])
                wait_for(lambda: full_isr(cluster), "the restarted broker back in the ISRs",
                         WAIT_S)
    finally:
        producer.close(30)
    assert len(killed) == 2
    wait_for(lambda: all(stable(cluster, p) for p in range(PARTITIONS)),
             "every transaction ended on both partitions", WAIT_S)

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                         "isolation.level": "read_committed"})
    try:
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps, timeout=30)
        read: list[bytes] = []

        def caught_up() -> bool:
            read.extend(r.value for r in consumer.poll(0.5) if r.value is not None)
            return all(consumer.position(tp) >= ends[tp] for tp in tps)

        wait_for(caught_up, "read_committed to the last stable offsets", WAIT_S)
    finally:
        consumer.close()
    counts = Counter(read)
    assert not [v for v, n in counts.items() if n > 1], "a committed record was read twice"
    assert set(read) == set(committed), (
        f"missing {sorted(set(committed) - set(read))[:5]}, "
        f"unexpected {sorted(set(read) - set(committed))[:5]}"
    )
    assert not set(read) & set(aborted)
    assert len(aborted) >= (TRANSACTIONS // 4) * RECORDS_PER_TXN


def _commit(producer: Producer, txn: int) -> None:
    """commit_transaction, called again while it fails retriably (Kafka's rule: a retriable
    commit is retried, never abandoned), for at most WAIT_S seconds in all: a commit that never
    completes fails the test naming the transaction and the last error, before pytest's own
    timeout would kill the test without saying what it waited for."""
    deadline = time.monotonic() + WAIT_S
    failures = 0
    while True:
        try:
            producer.commit_transaction(max(deadline - time.monotonic(), 1.0))
            return
        except TransactionError as exc:
            if not exc.retriable:
                raise
            failures += 1
            if time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"timed out after {WAIT_S} s waiting for commit_transaction of transaction"
                    f" {txn} to complete ({failures} retriable failures, last: {exc!r})"
                ) from exc
