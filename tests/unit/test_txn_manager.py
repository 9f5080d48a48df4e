"""TransactionManager, the transaction coordinator's shell, on a real event loop with an
in-memory ``__transaction_state`` (tests.helpers.offsets_log.Log) and a marker writer that
answers as partition leaders would (failing first when the test says so). The processes and the
wire are covered by tests/integration/test_transaction_coordinator.py and _failover.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest
from prometheus_client import REGISTRY

from fjord.coordinator.transactions import TransactionManager
from fjord.errors import (
    ConcurrentTransactionsError,
    ErrorCode,
    FjordError,
    ProducerFencedError,
)
from fjord.groups.defaults import OFFSETS_TOPIC
from fjord.groups.offsets_topic import group_partition
from fjord.testing.waiting import wait_for_async
from fjord.topic_partition import TopicPartition
from fjord.transactions.log import TransactionLogLoader, transaction_partition
from fjord.transactions.state import TxnRecord, TxnState
from tests.helpers.offsets_log import Log

TID = "shipper"
PART = transaction_partition(TID)
TP0, TP1 = TopicPartition("orders", 0), TopicPartition("orders", 1)


class Leaders:
    """WriteTxnMarkers as the partitions' leaders answer it: ``failures[tp]`` errors first."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bool, int, frozenset[TopicPartition]]] = []
        self.failures: dict[TopicPartition, list[ErrorCode]] = {}

    async def __call__(
        self, pid: int, epoch: int, committed: bool, coordinator_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        tps = frozenset(partitions)
        self.calls.append((pid, epoch, committed, coordinator_epoch, tps))
        return {tp: (self.failures.get(tp) or [ErrorCode.NONE]).pop(0) for tp in tps}


class Offsets:
    """The group coordinators' CompleteTxnOffsets: fails ``fail_first`` times, then records."""

    def __init__(self, fail_first: int = 0) -> None:
        self.fail_first = fail_first
        self.completed: list[tuple[int, int, bool]] = []

    async def __call__(self, partition: int, pid: int, epoch: int, committed: bool) -> None:
        if self.fail_first:
            self.fail_first -= 1
            raise FjordError("moving", ErrorCode.NOT_COORDINATOR)
        self.completed.append((partition, pid, committed))


def manager(log: Log, leaders: Leaders, offsets: Offsets | None = None) -> TransactionManager:
    pids = iter(range(100, 200))

    async def new_pid() -> int:
        return next(pids)

    m = TransactionManager(log, leaders, new_pid, offsets or Offsets(),
                           partition_exists=lambda topic, p: topic != "nope")
    m.active = True
    m.assign({PART: 3})
    return m


def state_in_log(log: Log) -> TxnRecord:
    loader = TransactionLogLoader()
    for key, value in log.records.get(PART, []):
        loader.apply_bytes(key, value)
    return loader.records()[TID]


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def ended(outcome: str) -> float:
    return REGISTRY.get_sample_value("fjord_transactions_total", {"outcome": outcome}) or 0.0


def test_commit_writes_markers_until_every_leader_took_them_then_completes() -> None:
    async def body() -> None:
        log, leaders, offsets = Log(), Leaders(), Offsets(fail_first=1)
        m = manager(log, leaders, offsets)
        commits = ended("commit")
        assert m.install(PART, 3, {})
        pid, epoch = await m.init_producer_id(TID, 60_000)
        assert (pid, epoch) == (100, 0)
        group_tp = TopicPartition(OFFSETS_TOPIC, group_partition("g"))
        await m.add_partitions(TID, pid, epoch, [TP0, TP1])
        await m.add_offsets(TID, pid, epoch, "g")
        leaders.failures[TP1] = [ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.NOT_ENOUGH_REPLICAS]
        await m.end_transaction(TID, pid, epoch, committed=True)
        assert state_in_log(log).state is TxnState.PREPARE_COMMIT
        with pytest.raises(ConcurrentTransactionsError):
            await m.add_partitions(TID, pid, epoch, [TP0])  # the markers are being written

        async def completed() -> bool:
            return state_in_log(log).state is TxnState.COMPLETE_COMMIT

        await wait_for_async(completed, "CompleteCommit", 10)
        assert len(leaders.calls) == 3 and leaders.calls[-1][4] == {TP1}
        assert all(c[:4] == (pid, epoch, True, 3) for c in leaders.calls)
        assert offsets.completed == [(group_tp.partition, pid, True)]  # after one retry
        assert not state_in_log(log).partitions
        assert ended("commit") == commits + 1
        await m.close()

    run(body())


def test_a_takeover_completes_what_the_previous_owner_prepared() -> None:
    async def body() -> None:
        log, leaders = Log(), Leaders()
        m = manager(log, leaders)
        prepared = TxnRecord(TID, 7, 2, 60_000, TxnState.PREPARE_ABORT, frozenset({TP0}), 1, 1)
        assert m.install(PART, 3, {TID: prepared})

        async def completed() -> bool:
            return PART in log.records and state_in_log(log).state is TxnState.COMPLETE_ABORT

        await wait_for_async(completed, "CompleteAbort", 10)
        assert leaders.calls == [(7, 2, False, 3, frozenset({TP0}))]
        await m.close()

    run(body())


def test_init_fences_an_ongoing_transaction_by_aborting_it() -> None:
    async def body() -> None:
        log, leaders = Log(), Leaders()
        m = manager(log, leaders)
        m.install(PART, 3, {})
        fenced = ended("fenced")
        pid, _ = await m.init_producer_id(TID, 60_000)
        await m.add_partitions(TID, pid, 0, [TP0])
        with pytest.raises(ConcurrentTransactionsError):
            await m.init_producer_id(TID, 60_000)  # the zombie's transaction is aborted

        async def again() -> tuple[int, int] | None:
            try:
                return await m.init_producer_id(TID, 60_000)
            except ConcurrentTransactionsError:
                return None

        assert await wait_for_async(again, "init after the abort", 10) == (pid, 2)
        assert leaders.calls[0][:3] == (pid, 1, False)  # aborted at the bumped epoch
        assert ended("fenced") == fenced + 1
        with pytest.raises(ProducerFencedError):
            await m.end_transaction(TID, pid, 0, committed=True)
        await m.close()

    run(body())


def test_a_failed_state_write_changes_nothing() -> None:
    async def body() -> None:
        log, leaders = Log(auto=False), Leaders()
        m = manager(log, leaders)
        m.install(PART, 3, {})
        task = asyncio.ensure_future(m.init_producer_id(TID, 60_000))
        await wait_for_async(lambda: _true(bool(log.held)), "the append", 5)
        log.release(ErrorCode.NOT_ENOUGH_REPLICAS)
        with pytest.raises(FjordError) as failed:
            await task
        assert failed.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
        record = m.describe(TID)
        assert record is not None and record.producer_epoch == -1  # nothing written
        await m.close()

    run(body())


def test_a_fenced_append_or_marker_gives_the_partition_up() -> None:
    async def body() -> None:
        log, leaders = Log(auto=False), Leaders()
        m = manager(log, leaders)
        m.install(PART, 3, {})
        task = asyncio.ensure_future(m.init_producer_id(TID, 60_000))
        await wait_for_async(lambda: _true(bool(log.held)), "the append", 5)
        log.release(ErrorCode.TRANSACTION_COORDINATOR_FENCED)
        with pytest.raises(FjordError) as failed:
            await task
        assert failed.value.code is ErrorCode.NOT_COORDINATOR
        assert m.owned() == {}
        assert m.assign({PART: 3}) == []  # not taken back at the fenced epoch
        assert m.assign({PART: 4}) == [(PART, 4)]  # a newer one is owned again
        await m.close()

    run(body())


async def _true(value: bool) -> bool:
    return value


# --- ACLs (AuthorizedTransactions over a real MetadataImage with ACL keys) -------------------


def test_transactional_requests_need_write_on_the_id_and_on_each_topic() -> None:
    from fjord.coordinator.authorization import AuthorizedTransactions
    from fjord.metadata import AclEntries, Keys, MetadataEvent, MetadataImage
    from fjord.security import Principal
    from fjord.security.acls import (
        AccessControl,
        AccessControlEntry,
        AclOperation,
        AclPermissionType,
        AuthorizerSettings,
        Caller,
        PatternType,
        ResourcePattern,
        ResourceType,
    )

    keys = Keys("c1")
    acls = [
        (ResourcePattern(ResourceType.TRANSACTIONAL_ID, "ship", PatternType.PREFIXED),
         AclOperation.WRITE),
        (ResourcePattern(ResourceType.TOPIC, "orders", PatternType.LITERAL), AclOperation.WRITE),
    ]
    image = MetadataImage.empty("c1").apply([
        MetadataEvent.put(
            keys.acl(pattern),
            AclEntries((AccessControlEntry("User:alice", "*", op, AclPermissionType.ALLOW),))
            .to_json(), i + 1, i + 1,
        )
        for i, (pattern, op) in enumerate(acls)
    ])
    alice = Caller(Principal("alice"), "10.0.0.1")
    bob = Caller(Principal("bob"), "10.0.0.2")

    async def body() -> None:
        log, leaders = Log(), Leaders()
        m = manager(log, leaders)
        m.install(PART, 3, {})
        gate = AuthorizedTransactions(m, lambda: image, AccessControl(AuthorizerSettings()))
        with pytest.raises(FjordError) as refused:
            await gate.init_producer_id(bob, TID, 60_000)
        assert refused.value.code is ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert not log.submitted  # nothing written for bob
        pid, epoch = await gate.init_producer_id(alice, TID, 60_000)
        errors = await gate.add_partitions(alice, TID, pid, epoch,
                                           [TP0, TopicPartition("secret", 0)])
        assert errors == {TP0: ErrorCode.OPERATION_NOT_ATTEMPTED,
                          TopicPartition("secret", 0): ErrorCode.TOPIC_AUTHORIZATION_FAILED}
        assert m.describe(TID).state is TxnState.EMPTY  # type: ignore[union-attr]
        assert await gate.add_partitions(alice, TID, pid, epoch, [TP0]) == {
            TP0: ErrorCode.NONE
        }
        with pytest.raises(FjordError) as no_group:
            await gate.add_offsets(alice, TID, pid, epoch, "g")
        assert no_group.value.code is ErrorCode.GROUP_AUTHORIZATION_FAILED
        await m.close()

    run(body())
