"""The transaction coordinator's gRPC API against the shared local cluster's real processes:
FindCoordinator key_type=1 creates ``__transaction_state`` and names the owner of the id's
partition; InitTransactions gives a producer id and bumps its epoch on every call (fencing the
previous producer); AddPartitionsToTxn and EndTxn follow Kafka's rules and errors."""

from __future__ import annotations

import asyncio
import uuid

import confluent_kafka
import grpc
import pytest

from fjord._proto import (
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
)
from fjord.client import (
    AdminClient,
    AsyncProducer,
    Consumer,
    ConsumerGroupMetadata,
    NewTopic,
    Producer,
    TopicPartition,
)
from fjord.errors import ErrorCode, FjordError, InvalidTxnStateError, TransactionError
from fjord.testing.waiting import wait_for, wait_for_async

pytestmark = pytest.mark.integration

WAIT_S = 60.0


async def coordinator_of(bootstrap: str, transactional_id: str) -> str:
    """The gRPC address of the transaction coordinator serving ``transactional_id``, once
    one serves it (FindCoordinator answers, and the owner is done loading)."""
    broker = bootstrap.split(",")[0]

    async def find() -> str | None:
        async with grpc.aio.insecure_channel(broker) as channel:
            answer = await broker_pb2_grpc.BrokerStub(channel).FindCoordinator(
                broker_pb2.FindCoordinatorRequest(key=transactional_id, key_type=1), timeout=10
            )
        if answer.error.code:
            assert ErrorCode.COORDINATOR_NOT_AVAILABLE.code == answer.error.code, answer
            return None
        return f"{answer.coordinator.host}:{answer.coordinator.port}"

    found = await wait_for_async(find, "a transaction coordinator", WAIT_S)
    assert found is not None
    return found


async def init(
    stub: coordinator_pb2_grpc.CoordinatorStub, tid: str, timeout_ms: int = 60_000
) -> coordinator_pb2.InitTransactionsResponse:
    """InitTransactions, retried while the answer is retriable (the partition loading,
    CONCURRENT_TRANSACTIONS while an abort completes)."""

    async def ask() -> coordinator_pb2.InitTransactionsResponse:
        return await stub.InitTransactions(
            coordinator_pb2.InitTransactionsRequest(
                transactional_id=tid, transaction_timeout_ms=timeout_ms,
                producer_id=-1, producer_epoch=-1,
            ),
            timeout=10,
        )

    retriable = {
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS.code,
        ErrorCode.CONCURRENT_TRANSACTIONS.code,
        ErrorCode.COORDINATOR_NOT_AVAILABLE.code,
    }
    return await wait_for_async(
        ask, f"InitTransactions({tid})", WAIT_S, accept=lambda r: r.error.code not in retriable
    )


def tp(topic: str, partition: int) -> common_pb2.TopicPartition:
    return common_pb2.TopicPartition(topic=topic, partition=partition)


def test_init_fence_add_and_end(bootstrap: str) -> None:
    asyncio.run(init_fence_add_and_end(bootstrap))


async def init_fence_add_and_end(bootstrap: str) -> None:
    tid = f"txn-{uuid.uuid4().hex[:8]}"
    address = await coordinator_of(bootstrap, tid)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        first = await init(stub, tid)
        assert first.error.code == 0, first.error
        assert first.producer_id >= 0 and first.producer_epoch == 0
        second = await init(stub, tid)
        assert (second.producer_id, second.producer_epoch) == (first.producer_id, 1)

        # The zombie (epoch 0) is fenced; the unknown topic fails the whole request.
        fenced = await stub.AddPartitionsToTxn(
            coordinator_pb2.AddPartitionsToTxnRequest(
                transactional_id=tid, producer_id=first.producer_id, producer_epoch=0,
                partitions=[tp("__consumer_offsets", 0)],
            ),
            timeout=10,
        )
        assert fenced.error.code == ErrorCode.PRODUCER_FENCED.code
        unknown = await stub.AddPartitionsToTxn(
            coordinator_pb2.AddPartitionsToTxnRequest(
                transactional_id=tid, producer_id=first.producer_id, producer_epoch=1,
                partitions=[tp("no-such-topic", 0), tp("__consumer_offsets", 0)],
            ),
            timeout=10,
        )
        errors = {(r.partition.topic, r.error.code) for r in unknown.results}
        assert errors == {
            ("no-such-topic", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code),
            ("__consumer_offsets", ErrorCode.OPERATION_NOT_ATTEMPTED.code),
        }

        # Nothing to end yet: INVALID_TXN_STATE; a timeout above the maximum is refused.
        empty = await stub.EndTxn(
            coordinator_pb2.EndTxnRequest(
                transactional_id=tid, producer_id=first.producer_id, producer_epoch=1,
                committed=True,
            ),
            timeout=10,
        )
        assert empty.error.code == ErrorCode.INVALID_TXN_STATE.code
        too_long = await init(stub, tid, timeout_ms=900_001)
        assert too_long.error.code == ErrorCode.INVALID_TRANSACTION_TIMEOUT.code

        # Another coordinator does not serve this id.
        other = await stub.InitTransactions(
            coordinator_pb2.InitTransactionsRequest(transactional_id=""), timeout=10
        )
        assert other.error.code == ErrorCode.INVALID_REQUEST.code


# --- the transactional producer of fjord.client, end to end --------------------------------


def read_committed(bootstrap: str, topic: str, partitions: int, expect: int) -> list[bytes]:
    """Every value a read_committed consumer reads from ``topic`` (from the start up to the
    last stable offset), waiting until at least ``expect`` values were read."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        values: list[bytes] = []

        def poll() -> int:
            values.extend(r.value for r in consumer.poll(0.5) if r.value is not None)
            return len(values)

        wait_for(poll, f"{expect} committed records of {topic}", WAIT_S,
                 accept=lambda n: n >= expect)
        # Everything up to the last stable offset is read: nothing more can come.
        ends = consumer.end_offsets(tps, timeout=10)
        wait_for(lambda: all(consumer.position(tp) >= ends[tp] for tp in tps) or poll() < 0,
                 f"{topic} read to its last stable offset", WAIT_S)
        return values
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def txn_topic(bootstrap: str) -> str:
    name = f"txn-out-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(name, 3, 3)])
    return name


def txn_producer(bootstrap: str, tid: str) -> Producer:
    return Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 1}
    )


def test_commit_is_seen_abort_is_not_and_a_zombie_is_fenced(
    bootstrap: str, txn_topic: str
) -> None:
    tid = f"tx-{uuid.uuid4().hex[:8]}"
    producer = txn_producer(bootstrap, tid)
    try:
        with pytest.raises(InvalidTxnStateError):
            producer.send(txn_topic, b"outside")  # no init_transactions() yet
        producer.init_transactions(WAIT_S)
        with pytest.raises(InvalidTxnStateError):
            producer.send(txn_topic, b"outside")  # no begin_transaction()
        producer.begin_transaction()
        for i in range(30):
            producer.send(txn_topic, f"committed-{i}".encode(), key=str(i).encode())
        producer.commit_transaction(WAIT_S)

        producer.begin_transaction()
        for i in range(30):
            producer.send(txn_topic, f"aborted-{i}".encode(), key=str(i).encode())
        producer.flush(WAIT_S)  # written to the partitions, then aborted
        producer.abort_transaction(WAIT_S)

        producer.begin_transaction()
        producer.send(txn_topic, b"after-abort", key=b"0")
        producer.commit_transaction(WAIT_S)

        # A second instance with the same transactional.id fences the first.
        successor = txn_producer(bootstrap, tid)
        try:
            producer.begin_transaction()
            producer.send(txn_topic, b"zombie", key=b"1")
            successor.init_transactions(WAIT_S)  # aborts the zombie's open transaction
            with pytest.raises(TransactionError) as fenced:
                producer.commit_transaction(WAIT_S)
            assert fenced.value.fatal and not fenced.value.txn_requires_abort()
            successor.begin_transaction()
            successor.send(txn_topic, b"successor", key=b"2")
            successor.commit_transaction(WAIT_S)
        finally:
            successor.close(10)
    finally:
        producer.close(10)

    values = read_committed(bootstrap, txn_topic, 3, 32)
    assert sorted(values) == sorted(
        [f"committed-{i}".encode() for i in range(30)] + [b"after-abort", b"successor"]
    )


def test_the_async_producer_commits_and_aborts_as_the_producer_does(bootstrap: str) -> None:
    """AsyncProducer's transactional calls, awaited: committed records are read, aborted
    ones (written, then aborted) are not, and the producer goes on after an abort."""
    topic = f"txn-async-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 1, 3)])
    config = {"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}",
              "linger.ms": 1}

    async def produce() -> None:
        async with AsyncProducer(config) as producer:
            with pytest.raises(InvalidTxnStateError):
                await producer.send(topic, b"outside")  # no init_transactions() yet
            await producer.init_transactions(WAIT_S)
            await producer.begin_transaction()
            for i in range(10):
                await producer.send(topic, f"committed-{i}".encode())
            await producer.commit_transaction(WAIT_S)
            await producer.begin_transaction()
            aborted = [await producer.send(topic, f"aborted-{i}".encode()) for i in range(10)]
            await producer.flush(WAIT_S)  # written to the partition, then aborted
            assert all(not f.exception() for f in aborted)
            await producer.abort_transaction(WAIT_S)
            await producer.begin_transaction()
            await producer.send(topic, b"after-abort")
            await producer.commit_transaction(WAIT_S)

    asyncio.run(produce())
    values = read_committed(bootstrap, topic, 1, 11)
    assert values == [f"committed-{i}".encode() for i in range(10)] + [b"after-abort"]


def test_offsets_sent_to_a_transaction_count_only_when_it_commits(
    bootstrap: str, kafka_bootstrap: str, txn_topic: str
) -> None:
    source = f"txn-in-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(source, 1, 3)])
    with Producer({"bootstrap.servers": bootstrap}) as plain:
        for i in range(10):
            plain.send(source, f"in-{i}".encode(), partition=0)
        plain.flush(WAIT_S)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    producer = txn_producer(bootstrap, f"tx-{uuid.uuid4().hex[:8]}")
    source_tp = TopicPartition(source, 0)
    try:
        consumer.subscribe([source])
        records: list = []
        wait_for(lambda: records.extend(consumer.poll(0.5)) or len(records) >= 10,
                 "10 input records", WAIT_S)
        producer.init_transactions(WAIT_S)

        # Aborted: neither the output nor the offsets count.
        producer.begin_transaction()
        producer.send(txn_topic, b"out-aborted")
        producer.send_offsets_to_transaction({source_tp: 5}, consumer.consumer_group_metadata())
        producer.abort_transaction(WAIT_S)
        assert consumer.committed([source_tp], timeout=10)[source_tp] is None

        # Committed: the offsets become the group's committed offsets.
        producer.begin_transaction()
        producer.send(txn_topic, b"out-committed")
        producer.send_offsets_to_transaction(
            {source_tp: 10}, consumer.consumer_group_metadata()
        )
        # While the transaction is open its offsets are pending: read_uncommitted sees the
        # old committed offset, read_committed asks for stable offsets (KIP-447) on both doors
        # and is answered UNSTABLE_OFFSET_COMMIT until the transaction ends.
        assert consumer.committed([source_tp], timeout=10)[source_tp] is None
        with Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                       "isolation.level": "read_committed"}) as stable_reader, \
                pytest.raises(FjordError) as stable_error:
            stable_reader.committed([source_tp], timeout=2)
        assert f"OffsetFetch {source}-0" in str(stable_error.value)  # the partition's error
        kafka_reader = confluent_kafka.Consumer({
            "bootstrap.servers": kafka_bootstrap, "group.id": group,
            "isolation.level": "read_committed",
        })
        try:
            with pytest.raises(confluent_kafka.KafkaException) as unstable:
                kafka_reader.committed([confluent_kafka.TopicPartition(source, 0)], timeout=3)
            # librdkafka retries UNSTABLE_OFFSET_COMMIT itself until its timeout.
            assert "Timed out" in str(unstable.value)
        finally:
            kafka_reader.close()
        producer.commit_transaction(WAIT_S)
        wait_for(lambda: consumer.committed([source_tp], timeout=10)[source_tp],
                 "the transaction's offsets committed", WAIT_S, accept=lambda o: o == 10)

        # A stale generation is refused and the transaction must be aborted.
        producer.begin_transaction()
        stale = ConsumerGroupMetadata(group, 9999, "not-a-member")
        with pytest.raises(TransactionError) as refused:
            producer.send_offsets_to_transaction({source_tp: 10}, stale)
        assert refused.value.txn_requires_abort()
        producer.abort_transaction(WAIT_S)
    finally:
        producer.close(10)
        consumer.close()


def test_confluent_kafka_transactional_producer(kafka_bootstrap: str, bootstrap: str) -> None:
    """librdkafka's transactional producer through the Kafka listeners: init_transactions,
    a committed and an aborted transaction, send_offsets_to_transaction; what a
    read_committed consumer sees is exactly the committed records."""
    source = f"ck-in-{uuid.uuid4().hex[:8]}"
    txn_topic = f"ck-out-{uuid.uuid4().hex[:8]}"
    group = f"ck-g-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(source, 1, 3), NewTopic(txn_topic, 3, 3)])
    tid = f"ck-{uuid.uuid4().hex[:8]}"
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": tid, "linger.ms": 1}
    )
    producer.init_transactions(WAIT_S)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(txn_topic, f"ck-committed-{i}".encode(), key=str(i).encode())
    producer.send_offsets_to_transaction(
        [confluent_kafka.TopicPartition(source, 0, 3)],
        confluent_kafka.Consumer(
            {"bootstrap.servers": kafka_bootstrap, "group.id": group}
        ).consumer_group_metadata(),
        WAIT_S,
    )
    producer.commit_transaction(WAIT_S)
    producer.begin_transaction()
    producer.produce(txn_topic, b"ck-aborted", key=b"0")
    producer.flush(WAIT_S)
    producer.abort_transaction(WAIT_S)
    producer.begin_transaction()
    producer.produce(txn_topic, b"ck-last", key=b"1")
    producer.commit_transaction(WAIT_S)
    producer.flush(10)

    values = read_committed(bootstrap, txn_topic, 3, 6)
    assert sorted(values) == sorted(
        [f"ck-committed-{i}".encode() for i in range(5)] + [b"ck-last"]
    )
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        committed = consumer.committed([TopicPartition(source, 0)], timeout=10)
        assert committed[TopicPartition(source, 0)] == 3
    finally:
        consumer.close()


def test_kafka_python_lists_and_describes_transactions(
    kafka_bootstrap: str, bootstrap: str, txn_topic: str
) -> None:
    """DescribeTransactions (65) and ListTransactions (66) as kafka-python's admin client asks
    them: an open transaction is listed Ongoing with its partitions, then CompleteCommit."""
    from kafka.admin import KafkaAdminClient

    tid = f"listed-{uuid.uuid4().hex[:8]}"
    producer = txn_producer(bootstrap, tid)
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        producer.init_transactions(WAIT_S)
        producer.begin_transaction()
        producer.send(txn_topic, b"listed", partition=1)
        producer.flush(WAIT_S)
        (described,) = admin.describe_transactions([tid]).values()
        assert described.state.value == "Ongoing" and described.producer_epoch == 0
        assert {(tp.topic, tp.partition) for tp in described.topic_partitions} == {
            (txn_topic, 1)
        }
        listed = {
            t.transactional_id: t.state.value
            for node in admin.list_transactions().values() for t in node
        }
        assert listed[tid] == "Ongoing"
        producer.commit_transaction(WAIT_S)

        def completed() -> bool:
            (after,) = admin.describe_transactions([tid]).values()
            return after.state.value == "CompleteCommit"

        wait_for(completed, "CompleteCommit", WAIT_S)
    finally:
        admin.close()
        producer.close(10)


def test_fjord_transactions_lists_and_describes(bootstrap: str, txn_topic: str) -> None:
    """``fjord transactions list`` and ``describe`` (AdminClient.list_transactions over every
    coordinator's gRPC ListTransactions): an open transaction with its partition; an unknown
    id is a one-line error."""
    import json

    from click.testing import CliRunner

    from fjord.cli.main import cli

    tid = f"cli-{uuid.uuid4().hex[:8]}"
    producer = txn_producer(bootstrap, tid)
    try:
        producer.init_transactions(WAIT_S)
        producer.begin_transaction()
        producer.send(txn_topic, b"cli", partition=2)
        producer.flush(WAIT_S)
        runner = CliRunner()
        listed = runner.invoke(cli, ["transactions", "list", "--bootstrap-server", bootstrap,
                                     "--state", "Ongoing", "--output", "json"])
        assert listed.exit_code == 0, listed.output
        assert tid in {t["transactional_id"] for t in json.loads(listed.output)}
        described = runner.invoke(cli, ["transactions", "describe", "--bootstrap-server",
                                        bootstrap, "--transactional-id", tid])
        assert described.exit_code == 0, described.output
        assert "Ongoing" in described.output and f"{txn_topic}-2" in described.output
        unknown = runner.invoke(cli, ["transactions", "describe", "--bootstrap-server",
                                      bootstrap, "--transactional-id", "no-such-id"])
        assert unknown.exit_code == 1 and "unknown" in unknown.output
        producer.commit_transaction(WAIT_S)
    finally:
        producer.close(10)
