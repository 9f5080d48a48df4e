"""The transaction coordinator's gRPC API against the shared local cluster's real processes:
FindCoordinator key_type=1 creates ``__transaction_state`` and names the owner of the id's
partition; InitTransactions gives a producer id and bumps its epoch on every call (fencing the
previous producer); AddPartitionsToTxn and EndTxn follow Kafka's rules and errors."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from fjord._proto import (
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
)
from fjord.errors import ErrorCode
from fjord.testing.waiting import wait_for_async

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
