"""The producer's pure core: record futures, the accumulator (batching, linger, memory,
ordering, expiry) and response handling (complete / retry / fail), with the real BatchBuilder."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord._proto import broker_pb2, common_pb2
from fjord.client import Producer
from fjord.client.accumulator import (
    SPREAD_BATCH_FRACTION,
    BatchPlan,
    BufferExhaustedError,
    IdempotenceState,
    NoRoomYet,
    PartitionResult,
    ProducerBatch,
    RecordAccumulator,
    handle_produce_results,
)
from fjord.client.futures import BatchCompletion, RecordFuture
from fjord.client.metadata import merge_snapshots, snapshot_from_response
from fjord.client.network import KafkaTimeoutError, NetworkError
from fjord.client.producer import linger_wait
from fjord.client.types import RecordMetadata, TopicPartition
from fjord.errors import ErrorCode, FjordError, InvalidRecordError, RecordTooLargeError
from fjord.records.builder import BatchBuilder
from fjord.records.header import Compression, parse_header
from fjord.records.reader import decode_records
from fjord.testing.waiting import wait_for

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def make_accumulator(**overrides: int) -> RecordAccumulator:
    settings = {
        "batch_size": 200,
        "linger_ms": 10,
        "buffer_memory": 10_000,
        "delivery_timeout_ms": 1000,
    }
    settings.update(overrides)
    batch_size = settings["batch_size"]
    return RecordAccumulator(lambda: BatchBuilder(batch_size=batch_size), **settings)


# -- futures ------------------------------------------------------------------------------------


def test_record_futures_share_one_completion() -> None:
    batch = BatchCompletion("t", 3)
    futures = [RecordFuture(batch, i, 1000 + i) for i in range(3)]
    seen: list[RecordMetadata] = []
    futures[1].add_done_callback(lambda f: seen.append(f.result()))
    assert not futures[0].done() and futures[0].running() and not futures[0].cancel()
    with pytest.raises(TimeoutError):
        futures[0].result(timeout=0.01)
    batch.complete(40)
    assert [f.result(0) for f in futures] == [
        RecordMetadata("t", 3, 40, 1000),
        RecordMetadata("t", 3, 41, 1001),
        RecordMetadata("t", 3, 42, 1002),
    ]
    assert seen == [RecordMetadata("t", 3, 41, 1001)]
    assert futures[2].exception() is None
    # Registered after completion: runs at once. Completing twice changes nothing.
    futures[2].add_done_callback(lambda f: seen.append(f.result()))
    batch.complete(99)
    assert seen[-1].offset == 42


def test_log_append_time_and_acks0_offsets() -> None:
    batch = BatchCompletion("t", 0)
    batch.complete(7, log_append_time=5555)
    assert RecordFuture(batch, 1, 1).result() == RecordMetadata("t", 0, 8, 5555)
    unknown = BatchCompletion("t", 0)
    unknown.complete(-1)
    assert RecordFuture(unknown, 3, 9).result().offset == -1


def test_failed_batch_raises_in_every_future_and_callbacks_survive_errors() -> None:
    batch = BatchCompletion("t", 0)
    calls: list[str] = []

    def bad(_: object) -> None:
        calls.append("bad")
        raise RuntimeError("callback bug")

    futures = [RecordFuture(batch, i, 0) for i in range(2)]
    futures[0].add_done_callback(bad)
    futures[1].add_done_callback(lambda f: calls.append(type(f.exception()).__name__))
    batch.fail(RecordTooLargeError("too big"))
    assert calls == ["bad", "RecordTooLargeError"]
    for f in futures:
        with pytest.raises(RecordTooLargeError):
            f.result()
        assert isinstance(f.exception(), RecordTooLargeError)


def test_result_waits_for_another_thread() -> None:
    batch = BatchCompletion("t", 0)
    future = RecordFuture(batch, 0, 0)
    threading.Timer(0.02, batch.complete, args=(5,)).start()
    assert future.result(timeout=5).offset == 5


# -- accumulator --------------------------------------------------------------------------------


def test_records_fill_a_batch_then_open_the_next() -> None:
    acc = make_accumulator()
    futures = []
    wakes = []
    for i in range(20):
        future, wake = acc.append(TP0, 1000 + i, b"k", b"v" * 20, (), now_ms=0)
        assert future is not None
        futures.append(future)
        wakes.append(wake)
    assert wakes[0] is True and wakes[1] is False
    assert wakes.count(True) >= 2  # a later batch opened once the first was full
    ready, _ = acc.ready(now_ms=0)
    assert ready == [TP0]  # a full batch is ready before linger.ms
    drained = acc.drain([TP0], max_request_bytes=10**6, now_ms=10**9)
    assert len(drained) >= 2 and sum(b.record_count for b in drained) == 20
    records = list(decode_records(b"".join(b.close() for b in drained)))
    assert [r.value for r in records] == [b"v" * 20] * 20
    assert [r.timestamp for r in records] == list(range(1000, 1020))
    assert all(f.done() is False for f in futures)


def test_append_many_continues_the_open_batch_then_opens_more_in_order() -> None:
    acc = make_accumulator()
    first, _ = acc.append(TP0, 5, b"k0", b"v" * 20, (), now_ms=0)
    assert first is not None
    keys = [b"k%d" % i for i in range(1, 21)]
    values = [b"v" * 20] * 19 + [None]
    completions, wake = acc.append_many(TP0, 7, keys, values)
    assert wake is True  # the open batch filled up and new ones opened
    assert completions[0] is first._batch  # the open batch took records first
    assert len(completions) == len(set(map(id, completions))) >= 3
    drained = acc.drain([TP0], max_request_bytes=10**6, now_ms=10**9)
    assert [b.completion for b in drained] == completions
    records = list(decode_records(b"".join(b.close() for b in drained)))
    assert [r.key for r in records] == [b"k0", *keys]
    assert [r.value for r in records] == [b"v" * 20, *values]
    assert [r.timestamp for r in records] == [5] + [7] * 20


def test_append_many_into_an_open_batch_with_room_wakes_nobody() -> None:
    acc = make_accumulator(batch_size=10_000)
    completions, wake = acc.append_many(TP0, 1, None, [b"a"])
    assert wake is True
    assert acc.append_many(TP0, 1, [b"k"], [b"b"]) == (completions, False)


def test_append_many_error_keeps_earlier_records_and_no_empty_batch() -> None:
    acc = make_accumulator(batch_size=200)
    with pytest.raises(InvalidRecordError):  # (after the first record, in the same batch)
        acc.append_many(TP0, 1, None, [b"a" * 150, 42])
    with pytest.raises(InvalidRecordError):  # the first record of a new batch
        acc.append_many(TP1, 1, None, [42])
    drained = acc.drain([TP0, TP1], max_request_bytes=10**6, now_ms=10**9)
    assert [(b.tp, b.record_count) for b in drained] == [(TP0, 1)]
    acc.deallocate(drained[0])
    assert acc.append_many(TP0, 1, None, [b"ok"])[1] is True
    assert acc._reserved == 200  # only the new batch's: nothing leaked


def test_linger_makes_a_lone_batch_ready_later() -> None:
    acc = make_accumulator(linger_ms=10)
    acc.append(TP0, 1, None, b"x", (), now_ms=100)
    ready, delay = acc.ready(now_ms=103)
    assert ready == [] and delay == 7
    ready, _ = acc.ready(now_ms=110)
    assert ready == [TP0]


def test_flush_makes_everything_ready_and_returns_the_completions() -> None:
    acc = make_accumulator(linger_ms=10_000)
    acc.append(TP0, 1, None, b"x", (), now_ms=0)
    acc.append(TP1, 1, None, b"y", (), now_ms=0)
    assert acc.ready(now_ms=1)[0] == []
    completions = acc.begin_flush()
    assert len(completions) == 2
    assert sorted(acc.ready(now_ms=1)[0]) == [TP0, TP1]
    acc.end_flush()
    assert acc.ready(now_ms=1)[0] == []


def test_abort_on_new_batch_lets_the_sticky_partitioner_move() -> None:
    acc = make_accumulator(batch_size=100)
    assert acc.append(TP0, 1, None, b"a" * 50, (), now_ms=0)[0] is not None
    future, wake = acc.append(TP0, 1, None, b"b" * 50, (), now_ms=0, abort_on_new_batch=True)
    assert future is None and wake is False
    assert acc.append(TP1, 1, None, b"b" * 50, (), now_ms=0)[0] is not None


def test_sticky_partitioner_moves_on_when_linger_sent_a_partial_batch() -> None:
    """Low traffic: batches never fill, linger.ms sends them half empty. Each new batch must
    still go to another partition (KIP-480), or every null-key record would stay on one."""
    acc = make_accumulator(batch_size=1000)
    assert acc.append(TP0, 1, None, b"a", (), now_ms=0)[0] is not None
    acc.drain([TP0], max_request_bytes=10**6, now_ms=10**9)  # sent: nothing open or queued
    future, _ = acc.append(TP0, 1, None, b"b", (), now_ms=0, abort_on_new_batch=True)
    assert future is None


def test_buffer_memory_blocks_then_fails_and_frees_on_completion() -> None:
    acc = make_accumulator(batch_size=1000, buffer_memory=2000)
    acc.append(TP0, 1, None, b"x" * 900, (), now_ms=0)  # its payload nearly fills batch.size
    acc.append(TP1, 1, None, b"x", (), now_ms=0)
    with pytest.raises(BufferExhaustedError, match=r"buffer\.memory"):
        acc.append(TopicPartition("t", 2), 1, None, b"x", (), now_ms=0, max_block_s=0.01)
    drained = acc.drain([TP0], max_request_bytes=10**6, now_ms=10**9)
    with pytest.raises(BufferExhaustedError):  # the drained payload is still buffered
        acc.append(TopicPartition("t", 2), 1, None, b"x", (), now_ms=0, max_block_s=0.01)
    threading.Timer(0.02, acc.deallocate, args=(drained[0],)).start()
    future, _ = acc.append(TopicPartition("t", 2), 1, None, b"x", (), now_ms=0, max_block_s=5)
    assert future is not None


def test_a_drained_batch_holds_only_its_payload_not_batch_size() -> None:
    """buffer.memory counts what is buffered: an open batch reserves batch.size, a drained
    (built) one only its payload, so records spread over many partitions (a few per batch)
    do not block on memory that holds nothing."""
    acc = make_accumulator(batch_size=1000, buffer_memory=2100)
    acc.append(TP0, 1, None, b"x", (), now_ms=0)
    acc.append(TP1, 1, None, b"x", (), now_ms=0)
    tp2 = TopicPartition("t", 2)
    with pytest.raises(BufferExhaustedError):
        acc.append(tp2, 1, None, b"x", (), now_ms=0, max_block_s=0)
    drained = acc.drain([TP0], max_request_bytes=10**6, now_ms=10**9)
    assert drained[0].reserved_bytes == len(drained[0].close()) < 1000
    future, _ = acc.append(tp2, 1, None, b"x", (), now_ms=0, max_block_s=0)  # no wait
    assert future is not None
    acc.deallocate(drained[0])
    for tp in (TP1, tp2):
        for batch in acc.drain([tp], max_request_bytes=10**6, now_ms=10**9):
            acc.deallocate(batch)
    assert acc._reserved == 0  # everything reserved was given back exactly once


def test_drain_respects_max_request_size_but_takes_at_least_one() -> None:
    acc = make_accumulator(batch_size=1000)
    acc.append(TP0, 1, None, b"x" * 300, (), now_ms=0)
    acc.append(TP1, 1, None, b"y" * 300, (), now_ms=0)
    first = acc.drain([TP0, TP1], max_request_bytes=100, now_ms=10**9)
    assert [b.tp for b in first] == [TP0]
    assert [b.tp for b in acc.drain([TP0, TP1], max_request_bytes=100, now_ms=10**9)] == [TP1]


def test_retry_goes_back_to_the_head_after_backoff_and_order_holds() -> None:
    acc = make_accumulator(batch_size=200, guarantee_order=True)
    futures = [acc.append(TP0, i, None, bytes([65 + i]) * 40, (), now_ms=0)[0] for i in range(6)]
    first = acc.drain([TP0], 10**6, now_ms=10**9)
    assert len(first) == 3  # two records per 200-byte batch, all three in one request
    acc.append(TP0, 9, None, b"late", (), now_ms=0)
    assert acc.drain([TP0], 10**6, now_ms=10**9) == []  # muted while in flight (max.in.flight=1)
    outcome = handle_produce_results(
        acc,
        first,
        {TP0: PartitionResult(ErrorCode.NOT_LEADER_OR_FOLLOWER)},
        now_ms=10,
        retries=3,
        retry_backoff_ms=100,
        make_timeout_error=KafkaTimeoutError,
    )
    assert outcome.retried == 3 and outcome.refresh_metadata
    assert acc.ready(now_ms=50)[0] == []  # backing off
    assert acc.ready(now_ms=110)[0] == [TP0]
    again = acc.drain([TP0], 10**6, now_ms=110)
    assert again[:3] == first and [b.attempts for b in again] == [2, 2, 2, 1]
    handle_produce_results(
        acc,
        again,
        {TP0: PartitionResult(ErrorCode.NONE, base_offset=50)},
        now_ms=120,
        retries=3,
        retry_backoff_ms=100,
        make_timeout_error=KafkaTimeoutError,
    )
    # The batches of one answer get consecutive offsets, in send order.
    assert [f.result(0).offset for f in futures if f is not None] == [50, 51, 52, 53, 54, 55]
    assert again[3].completion.base_offset == 56
    assert not acc.has_pending()


def test_drain_keeps_a_lingering_last_batch() -> None:
    acc = make_accumulator(batch_size=200, linger_ms=10)
    for i in range(3):
        acc.append(TP0, i, None, b"x" * 40, (), now_ms=0)
    assert [b.record_count for b in acc.drain([TP0], 10**6, now_ms=5)] == [2]
    assert acc.drain([TP0], 10**6, now_ms=5) == []  # the open batch lingers until 10
    assert [b.record_count for b in acc.drain([TP0], 10**6, now_ms=10)] == [1]


def _handle(acc: RecordAccumulator, batches: list, results: object, now: int, retries: int = 5):  # type: ignore[no-untyped-def]
    return handle_produce_results(
        acc,
        batches,
        results,  # type: ignore[arg-type]
        now_ms=now,
        retries=retries,
        retry_backoff_ms=0,
        make_timeout_error=KafkaTimeoutError,
    )


def test_non_retriable_error_fails_the_batch_typed() -> None:
    acc = make_accumulator()
    future, _ = acc.append(TP0, 1, None, b"x", (), now_ms=0)
    batches = acc.drain([TP0], 10**6, now_ms=10**9)
    outcome = _handle(acc, batches, {TP0: PartitionResult(ErrorCode.MESSAGE_TOO_LARGE, "big")}, 1)
    assert outcome.failed == 1 and not outcome.refresh_metadata
    assert future is not None
    with pytest.raises(RecordTooLargeError, match="big"):
        future.result(0)
    assert not acc.has_pending()


def test_retries_exhausted_and_delivery_timeout() -> None:
    acc = make_accumulator(delivery_timeout_ms=1000)
    f1, _ = acc.append(TP0, 1, None, b"x", (), now_ms=0)
    batches = acc.drain([TP0], 10**6, now_ms=10**9)
    _handle(acc, batches, {TP0: PartitionResult(ErrorCode.LEADER_NOT_AVAILABLE)}, 1, retries=0)
    assert f1 is not None and f1.exception(0).code is ErrorCode.LEADER_NOT_AVAILABLE  # type: ignore[union-attr]

    f2, _ = acc.append(TP1, 1, None, b"x", (), now_ms=0)
    batches = acc.drain([TP1], 10**6, now_ms=10**9)
    _handle(acc, batches, NetworkError("connection refused"), 2000)
    assert f2 is not None
    error = f2.exception(0)
    assert isinstance(error, KafkaTimeoutError) and isinstance(error, TimeoutError)
    assert "connection refused" in str(error)


def test_transport_error_retries_every_batch_of_the_request() -> None:
    acc = make_accumulator()
    acc.append(TP0, 1, None, b"x", (), now_ms=0)
    acc.append(TP1, 1, None, b"x", (), now_ms=0)
    batches = acc.drain([TP0, TP1], 10**6, now_ms=10**9)
    outcome = _handle(acc, batches, NetworkError("UNAVAILABLE"), 5)
    assert outcome.retried == 2 and outcome.refresh_metadata
    missing = acc.drain([TP0, TP1], 10**6, now_ms=10**9)
    outcome = _handle(acc, missing, {TP0: PartitionResult(ErrorCode.NONE, base_offset=3)}, 6)
    # A partition missing from the answer is a broker bug: failed, not silently retried.
    assert outcome.completed == 1 and outcome.failed == 1


def test_expire_removes_old_queued_batches() -> None:
    acc = make_accumulator(delivery_timeout_ms=100)
    acc.append(TP0, 1, None, b"x", (), now_ms=0)
    acc.append(TP1, 1, None, b"x", (), now_ms=50)
    assert [b.tp for b in acc.expire(now_ms=120)] == [TP0]


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (ErrorCode.NOT_ENOUGH_REPLICAS, "ISR [0, 1] is fewer than min.insync.replicas=3"),
        (ErrorCode.KAFKA_STORAGE_ERROR, "write failed: [Errno 28] No space left on device"),
    ],
)
def test_a_batch_that_expires_after_retries_keeps_its_last_error(
    code: ErrorCode, message: str
) -> None:
    """Issue 12/13: a batch retried until delivery.timeout.ms says why it was not written,
    whether it expires while waiting in the queue (the sender's expire) or at an answer."""
    acc = make_accumulator(delivery_timeout_ms=100)
    in_queue, _ = acc.append(TP0, 1, None, b"x", (), now_ms=0)
    at_answer, _ = acc.append(TP1, 1, None, b"x", (), now_ms=0)
    batches = acc.drain([TP0, TP1], 10**6, now_ms=10**9)
    answer = {tp: PartitionResult(code, message) for tp in (TP0, TP1)}
    assert _handle(acc, batches, answer, now=10).retried == 2
    retried = acc.drain([TP0, TP1], 10**6, now_ms=10**9)
    assert _handle(acc, retried[:1], answer, now=50).retried == 1  # TP0 waits in the queue
    assert _handle(acc, retried[1:], answer, now=150).failed == 1  # TP1 expires at its answer
    (queued,) = acc.expire(now_ms=150)
    assert queued is retried[0]
    expired_in_queue = acc.expiry_error(queued, KafkaTimeoutError)
    assert in_queue is not None and at_answer is not None
    at_answer_error = at_answer.exception(0)
    for error in (expired_in_queue, at_answer_error):
        assert isinstance(error, KafkaTimeoutError)
        assert f"last error: {code.name}: {message}" in str(error), str(error)
        assert "delivery.timeout.ms=100 and 2 attempt(s)" in str(error)
        assert isinstance(error.__cause__, FjordError) and error.__cause__.code is code


def test_a_batch_never_sent_expires_saying_so() -> None:
    acc = make_accumulator(delivery_timeout_ms=100)
    acc.append(TP0, 1, None, b"x", (), now_ms=0)
    (batch,) = acc.expire(now_ms=100)
    error = acc.expiry_error(batch, KafkaTimeoutError)
    assert str(error) == (
        "1 record(s) for t-0 expired after delivery.timeout.ms=100 before they could be sent"
    )
    assert error.__cause__ is None


def test_closed_accumulator_refuses_appends() -> None:
    acc = make_accumulator()
    acc.close()
    with pytest.raises(FjordError, match="closed"):
        acc.append(TP0, 1, None, b"x", (), now_ms=0)


# -- growing while blocked (issue 18) ------------------------------------------------------------


def make_idempotent_accumulator(
    *, batch_size: int = 200, blocked_batch_size: int = 800, buffer_memory: int = 100_000,
    idempotent: bool = True,
) -> RecordAccumulator:
    idem = IdempotenceState(max_window=2) if idempotent else None
    acc = RecordAccumulator(
        lambda: BatchBuilder(batch_size=batch_size), batch_size=batch_size, linger_ms=10,
        buffer_memory=buffer_memory, delivery_timeout_ms=10_000, idempotence=idem,
        sized_builder=lambda size: BatchBuilder(batch_size=size),
        blocked_batch_size=blocked_batch_size,
    )  # fmt: skip
    if idem is not None:
        acc.set_producer_id(7, 0)
    return acc


def fill_and_send(acc: RecordAccumulator, batches: int) -> list[ProducerBatch]:
    """Send ``batches`` batches of TP0, one record each (each leaves after its linger)."""
    sent: list[ProducerBatch] = []
    for _ in range(batches):
        acc.append(TP0, 1, None, b"v" * 40, (), now_ms=0)
        sent += acc.drain([TP0], 1 << 20, now_ms=10**9)
    assert len(sent) == batches and acc.open_batch(TP0) is None
    return sent


def answer(acc: RecordAccumulator, batch: ProducerBatch) -> None:
    handle_produce_results(
        acc, [batch], {TP0: PartitionResult(ErrorCode.NONE, base_offset=0)}, 0,
        retries=0, retry_backoff_ms=0, make_timeout_error=KafkaTimeoutError,
        idempotence=acc.idempotence,
    )  # fmt: skip


def test_a_batch_opened_while_the_window_is_full_grows_and_leaves_when_it_has_room() -> None:
    acc = make_idempotent_accumulator()
    first, second = fill_and_send(acc, 2)  # the window (2 batches) is full now
    assert acc.window_full(TP0)
    # Drained (built), it holds its payload's bytes, not batch.size (buffer.memory counts use).
    assert first.builder.size_in_bytes <= 200 and first.reserved_bytes == len(first.close())
    for _ in range(12):  # 12 x 47 bytes: three batches' worth, into one
        acc.append(TP0, 1, None, b"v" * 40, (), now_ms=0)
    grown = acc.open_batch(TP0)
    assert grown is not None and grown.record_count == 12 and grown.reserved_bytes == 800
    assert grown.builder.size_in_bytes > 200
    assert acc.drain([TP0], 1 << 20, now_ms=0) == []  # still blocked: nothing leaves
    answer(acc, first)
    assert acc.drain([TP0], 1 << 20, now_ms=0) == [grown]  # room: it leaves at once
    # It fills up to blocked_batch_size, never past it: the next record opens a new batch,
    # and that one is normal again while the window has room.
    assert grown.base_sequence == second.base_sequence + second.record_count
    answer(acc, second)
    answer(acc, grown)
    acc.append(TP0, 1, None, b"v" * 40, (), now_ms=0)
    normal = acc.open_batch(TP0)
    assert normal is not None and normal.reserved_bytes == 200 and not acc.window_full(TP0)


def test_a_batch_opened_behind_queued_batches_that_fill_the_window_grows() -> None:
    """One batch unanswered (window of 2) and one full batch queued behind it, not drained
    yet (the sender has not run): the window has room, but the queued batch takes it, so the
    next batch cannot leave before an answer either and grows (it used to open at batch.size
    and leave alone later, holding a window slot for a whole round trip)."""
    acc = make_idempotent_accumulator()
    (first,) = fill_and_send(acc, 1)
    assert not acc.window_full(TP0) and not acc.blocked_behind_window(TP0)
    for _ in range(2):  # 61 + 2 x 47 bytes: a third record would pass 200 bytes
        acc.append(TP0, 1, None, b"v" * 40, (), now_ms=0)
    queued = acc.open_batch(TP0)
    assert queued is not None and queued.reserved_bytes == 200 and queued.record_count == 2
    acc.append(TP0, 1, None, b"v" * 40, (), now_ms=0)  # refused by the full one: a new batch
    grown = acc.open_batch(TP0)
    assert grown is not None and grown is not queued
    assert not acc.window_full(TP0) and acc.blocked_behind_window(TP0)
    assert grown.reserved_bytes == 800  # grown: it may take blocked_batch_size
    for _ in range(8):
        acc.append(TP0, 1, None, b"v" * 40, (), now_ms=0)
    assert acc.open_batch(TP0) is grown and grown.record_count == 9
    # The queued batch takes the window's last place; the grown one waits for an answer,
    # then leaves whole.
    assert acc.drain([TP0], 1 << 20, now_ms=0) == [queued]
    assert acc.drain([TP0], 1 << 20, now_ms=0) == []
    answer(acc, first)
    assert acc.drain([TP0], 1 << 20, now_ms=0) == [grown]


def nearly_full() -> tuple[RecordAccumulator, list[ProducerBatch]]:
    """TP0's window (2 batches) full and buffer.memory with room for a normal batch (200
    bytes) but not for a grown one (800); returns the accumulator and the unanswered batches."""
    acc = make_idempotent_accumulator(buffer_memory=2500)
    sent = fill_and_send(acc, 2)  # the window (2 batches) is full: 2 x 108 bytes held
    for _ in range(30):  # two full grown batches queued behind it, 800 reserved each
        acc.append(TP0, 1, None, b"v" * 40, (), now_ms=0)
    assert acc._reserved + 200 <= 2500 < acc._reserved + 800
    return acc, sent


def test_a_blocked_partition_waits_for_room_for_a_grown_batch() -> None:
    """buffer.memory has room for a normal batch but not for a grown one while the window is
    full: a caller that may wait (send() on the application's thread) waits for the room, as
    for any batch, instead of opening a normal batch (on a nearly full buffer those fed on
    themselves); one that may not (a callback) gets a normal batch at once."""
    acc, sent = nearly_full()
    second_grown = acc.open_batch(TP0)
    opened: list[ProducerBatch | None] = []

    def send() -> None:
        acc.append(TP0, 1, None, b"v" * 40, (), now_ms=0, max_block_s=10)
        opened.append(acc.open_batch(TP0))

    waiting = threading.Thread(target=send)
    waiting.start()
    wait_for(lambda: len(acc._space._waiters) == 1, "send() waiting for buffer.memory", 10)
    assert opened == []
    for batch in sent:
        answer(acc, batch)  # frees 2 x 108 bytes: room for 800 more
    waiting.join(10)
    assert not waiting.is_alive()
    assert opened[0] is not None and opened[0] is not second_grown
    assert opened[0].reserved_bytes == 800  # grown, not a normal batch
    # A caller that cannot wait: a normal batch, at once.
    nowait, _ = nearly_full()
    nowait.append(TP0, 1, None, b"v" * 40, (), now_ms=0, max_block_s=0)
    assert nowait.open_batch(TP0).reserved_bytes == 200  # type: ignore[union-attr]


def test_a_caller_that_awaits_room_is_told_the_batch_a_blocking_one_waits_for() -> None:
    """The AsyncProducer's way (``awaits_room``): where a blocking send() waits for room for a
    grown batch, append raises NoRoomYet at once with that batch's plan and changes nothing
    (no normal batch, no bytes reserved); each freed byte calls ``on_room_freed``; called
    again with the plan once there is room, it opens that grown batch."""
    acc, sent = nearly_full()
    freed: list[int] = []
    acc.on_room_freed = lambda: freed.append(acc._reserved)
    queued, reserved = len(acc._queues[TP0]), acc._reserved
    with pytest.raises(NoRoomYet) as no_room:
        acc.append(TP0, 1, None, b"v" * 40, (), now_ms=0, awaits_room=True)
    assert no_room.value.plan == BatchPlan(TP0, 800, grown=True)
    # Typed as the wait's end would be: a BufferExhaustedError, a KafkaTimeoutError.
    assert isinstance(no_room.value, BufferExhaustedError)
    assert isinstance(no_room.value, KafkaTimeoutError) and isinstance(no_room.value, TimeoutError)
    assert len(acc._queues[TP0]) == queued and acc._reserved == reserved and freed == []
    with pytest.raises(NoRoomYet):  # still no room: the same plan, still nothing appended
        acc.append(TP0, 1, None, b"v" * 40, (), 0, awaits_room=True, plan=no_room.value.plan)
    answer(acc, sent[0])  # frees 108 bytes: not enough yet
    assert freed == [reserved - 108]
    answer(acc, sent[1])
    acc.append(TP0, 1, None, b"v" * 40, (), 0, awaits_room=True, plan=no_room.value.plan)
    opened = acc.open_batch(TP0)
    assert opened is not None and opened.reserved_bytes == 800 and opened.record_count == 1
    assert acc._reserved == reserved - 2 * 108 + 800
    with pytest.raises(ValueError, match="plan"):  # a plan names its partition
        acc.append(TP1, 1, None, b"v" * 200, (), 0, plan=no_room.value.plan)
    acc.close()
    assert len(freed) == 3  # a closed accumulator wakes whoever awaits room (to fail)


def test_the_async_producer_awaits_room_for_a_grown_batch_on_its_loop() -> None:
    """AsyncProducer's shell over the shared rule, without a broker (its sender never runs:
    the test drains and answers): behind a full window with room for a batch.size batch only,
    a record awaits room, the loop going on (an answer handled meanwhile wakes it), and opens
    a grown batch; with nothing answered the wait ends after max.block.ms in
    BufferExhaustedError with nothing appended; with max.block.ms 0 a batch.size batch opens
    at once (it may not wait)."""
    from fjord.client import AsyncProducer

    grown_size, value = 4096, b"v" * 100

    def blocked_producer(max_block_ms: int) -> tuple[AsyncProducer, list[ProducerBatch]]:
        producer = AsyncProducer({
            "bootstrap.servers": "127.0.0.1:9", "batch.size": 1024, "max.block.ms": max_block_ms,
            "blocked.batch.size": grown_size, "buffer.memory": 2 * grown_size,
        })  # fmt: skip
        acc = producer._accumulator
        acc.set_producer_id(7, 0)
        sent = []
        while not acc.window_full(TP0):  # 5 one-record batches unanswered
            acc.append(TP0, 1, None, value, (), now_ms=0)
            sent += acc.drain([TP0], 1 << 20, now_ms=10**9)
        acc.append(TP0, 1, None, value, (), now_ms=0)
        grown = acc.open_batch(TP0)
        assert grown is not None and grown.reserved_bytes == grown_size
        while acc.try_append_open(grown, None, value) is not None:
            pass  # until full: the next record needs a new batch
        assert acc._reserved + grown_size > 2 * grown_size >= acc._reserved + 1024
        return producer, sent

    async def append(producer: AsyncProducer) -> tuple[float, int]:
        producer._sender_task = asyncio.get_running_loop().create_future()  # (no sender)
        producer._sender.partition_counts = {TP0.topic: 1}  # (no metadata request)
        started = time.monotonic()
        try:
            await producer.send(TP0.topic, value, partition=0)
        finally:
            producer._sender_task = None  # (close() then stops nothing)
        opened = producer._accumulator.open_batch(TP0)
        assert opened is not None and opened.record_count == 1
        return time.monotonic() - started, opened.reserved_bytes

    producer, sent = blocked_producer(60_000)

    def answer_all() -> None:
        for batch in sent:
            answer(producer._accumulator, batch)

    async def answered_meanwhile() -> tuple[float, int]:
        asyncio.get_running_loop().call_soon(answer_all)  # runs only once append() waits
        return await append(producer)

    waited, reserved = asyncio.run(answered_meanwhile())
    assert reserved == grown_size and waited < 30  # woken by the answers, not at 60 s
    asyncio.run(producer.close(0))  # (fails what is queued: nothing is sent)
    producer, _ = blocked_producer(200)
    queued, before = len(producer._accumulator._queues[TP0]), producer._accumulator._reserved
    started = time.monotonic()
    with pytest.raises(BufferExhaustedError, match=r"max\.block\.ms \(200 ms\)"):
        asyncio.run(append(producer))
    assert time.monotonic() - started >= 0.2
    assert len(producer._accumulator._queues[TP0]) == queued
    assert producer._accumulator._reserved == before
    asyncio.run(producer.close(0))
    producer, _ = blocked_producer(0)
    waited, reserved = asyncio.run(append(producer))
    assert reserved == 1024
    asyncio.run(producer.close(0))


# One partition's life as operations: append this many 47-byte records (a send() that may
# not wait, skipped when buffer.memory has no room), drain what may leave, answer the oldest.
_operation = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 25)),
    st.tuples(st.just("drain"), st.just(0)),
    st.tuples(st.just("answer"), st.just(0)),
)


@settings(max_examples=150)
@given(
    buffer_memory=st.sampled_from([1000, 1700, 2500, 4000]),
    operations=st.lists(_operation, max_size=40),
    value_size=st.integers(1, 300),
)
def test_awaiting_room_and_blocking_for_it_choose_the_same_batch(
    buffer_memory: int, operations: list[tuple[str, int]], value_size: int
) -> None:
    """Property: from any state, a record appended by a caller that awaits room itself (the
    AsyncProducer) and by one that blocks for it (Producer.send) go the same way: both find
    room and open the same batch (grown or normal, the same bytes reserved), or the first is
    told NoRoomYet and the second waits (here: 1 ms, then BufferExhaustedError); appended
    once room came, the awaited plan opens the batch the blocking caller opens then."""
    awaiting, blocking = (make_idempotent_accumulator(buffer_memory=buffer_memory) for _ in "ab")
    in_flight: dict[int, list[ProducerBatch]] = {id(awaiting): [], id(blocking): []}
    for acc in (awaiting, blocking):  # the same history for both
        for operation, count in operations:
            if operation == "append":
                for _ in range(count):
                    with contextlib.suppress(BufferExhaustedError):
                        acc.append(TP0, 1, None, b"v" * 40, (), now_ms=0)
            elif operation == "drain":
                in_flight[id(acc)] += acc.drain([TP0], 1 << 20, now_ms=10**9)
            elif in_flight[id(acc)]:
                answer(acc, in_flight[id(acc)].pop(0))
    value = b"w" * value_size

    def opened(acc: RecordAccumulator, before: ProducerBatch | None) -> int | None:
        batch = acc.open_batch(TP0)
        return None if batch is None or batch is before else batch.reserved_bytes

    before = awaiting.open_batch(TP0), blocking.open_batch(TP0)
    was_blocked = awaiting.blocked_behind_window(TP0)
    plan: BatchPlan | None = None
    try:
        awaiting.append(TP0, 1, None, value, (), 0, awaits_room=True)
    except NoRoomYet as no_room:
        plan = no_room.plan
    try:
        blocking.append(TP0, 1, None, value, (), 0, max_block_s=0.001)
        blocked = False
    except BufferExhaustedError:
        blocked = True
    assert blocked == (plan is not None)
    if plan is None:
        assert opened(awaiting, before[0]) == opened(blocking, before[1])
        return
    assert plan.grown == (plan.reserve == 800) and (not plan.grown or was_blocked)
    # Room comes (everything answered): the plan opens the batch decided before the wait,
    # even though the partition is no longer blocked by then.
    while in_flight[id(awaiting)] or awaiting._queues[TP0]:
        in_flight[id(awaiting)] += awaiting.drain([TP0], 1 << 20, now_ms=10**9)
        answer(awaiting, in_flight[id(awaiting)].pop(0))
    awaiting.append(TP0, 1, None, value, (), 0, awaits_room=True, plan=plan)
    assert opened(awaiting, None) == plan.reserve


def test_a_grown_batch_stops_at_blocked_batch_size() -> None:
    acc = make_idempotent_accumulator()
    fill_and_send(acc, 2)
    for _ in range(40):
        acc.append(TP0, 1, None, b"v" * 40, (), now_ms=0)
    assert acc.drain([TP0], 1 << 20, now_ms=10**9) == []  # blocked
    grown = acc.open_batch(TP0)
    assert grown is not None and grown.reserved_bytes == 800
    assert grown.builder.size_in_bytes <= 800 and grown.record_count < 40


def test_no_growth_without_idempotence_or_room_in_buffer_memory() -> None:
    plain = make_idempotent_accumulator(idempotent=False)
    for _ in range(20):
        plain.append(TP0, 1, None, b"v" * 40, (), now_ms=0)
    assert plain.open_batch(TP0) is not None
    assert plain.open_batch(TP0).reserved_bytes == 200  # type: ignore[union-attr]
    # No room in buffer.memory for a grown batch without waiting: a normal one opens (send()
    # never waits for the sake of a larger batch).
    full = make_idempotent_accumulator(buffer_memory=1000)  # 2 x 108 in flight + 800 > 1000
    fill_and_send(full, 2)
    full.append(TP0, 1, None, b"v" * 40, (), now_ms=0)
    assert full.open_batch(TP0).reserved_bytes == 200  # type: ignore[union-attr]
    # Open grown batches reserve at most half of buffer.memory (they may be mostly empty):
    # with 3,000 bytes, one partition's open batch grows (800 <= 1,500), a second one's not.
    two = make_idempotent_accumulator(buffer_memory=3000)
    for tp in (TP0, TP1):
        for _ in range(2):  # each partition's window (2 batches) full
            two.append(tp, 1, None, b"v" * 40, (), now_ms=0)
            assert len(two.drain([tp], 1 << 20, now_ms=10**9)) == 1
    two.append(TP0, 1, None, b"v" * 40, (), now_ms=0)
    two.append(TP1, 1, None, b"v" * 40, (), now_ms=0)
    first = two.open_batch(TP0)
    assert first is not None and first.reserved_bytes == 800
    assert two.open_batch(TP1).reserved_bytes == 200  # type: ignore[union-attr]
    # A full grown batch waiting to leave no longer counts as open: the backlog keeps growing
    # its batches although more than half of buffer.memory is reserved by now.
    while two.open_batch(TP0) is first:
        two.append(TP0, 1, None, b"v" * 40, (), now_ms=0)
    assert two.open_batch(TP0).reserved_bytes == 800  # type: ignore[union-attr]
    assert two._reserved > 1500
    # A blocked_batch_size not above batch.size turns growth off.
    off = make_idempotent_accumulator(blocked_batch_size=200)
    fill_and_send(off, 2)
    off.append(TP0, 1, None, b"v" * 40, (), now_ms=0)
    assert off.open_batch(TP0).reserved_bytes == 200  # type: ignore[union-attr]


def test_the_producer_caps_blocked_batch_size_at_max_request_size() -> None:
    producer = Producer({"bootstrap.servers": "localhost:1", "max.request.size": 300_000})
    try:
        assert producer._accumulator._blocked_batch_size == 300_000
    finally:
        producer.close(0)
    producer = Producer({"bootstrap.servers": "localhost:1", "acks": "1"})
    try:  # acks=1: not idempotent, so never grows
        assert producer._accumulator._blocked_batch_size == 0
    finally:
        producer.close(0)


def refuse_as_too_large(acc: RecordAccumulator, batch: ProducerBatch) -> int:
    """The leader answers MESSAGE_TOO_LARGE (max.message.bytes below the batch); returns
    how many batches were split."""
    return handle_produce_results(
        acc, [batch], {TP0: PartitionResult(ErrorCode.MESSAGE_TOO_LARGE, "too large")}, 0,
        retries=0, retry_backoff_ms=0, make_timeout_error=KafkaTimeoutError,
        idempotence=acc.idempotence,
    ).split  # fmt: skip


def answer_at(acc: RecordAccumulator, batch: ProducerBatch, base_offset: int) -> None:
    handle_produce_results(
        acc, [batch], {TP0: PartitionResult(ErrorCode.NONE, base_offset=base_offset)}, 0,
        retries=0, retry_backoff_ms=0, make_timeout_error=KafkaTimeoutError,
        idempotence=acc.idempotence,
    )  # fmt: skip


def test_a_grown_batch_refused_as_too_large_is_split_into_batch_size_batches() -> None:
    acc = make_idempotent_accumulator()
    first, second = fill_and_send(acc, 2)
    futures = []
    for i in range(12):  # one grown batch of 12 records (about 570 bytes)
        future, _ = acc.append(TP0, i, None, b"%02d" % i + b"v" * 38, (("h", b"x"),), now_ms=0)
        futures.append(future)
    grown = acc.open_batch(TP0)
    assert grown is not None and grown.record_count == 12
    answer(acc, first)
    assert acc.drain([TP0], 1 << 20, now_ms=0) == [grown]
    acc.append(TP0, 99, None, b"later", (), now_ms=0)  # queued behind it, no sequence yet
    idem = acc.idempotence
    assert idem is not None
    base = grown.base_sequence
    assert refuse_as_too_large(acc, grown) == 1
    parts = list(acc._queues[TP0])[:-1]
    # batch.size batches, in order, with the sequences the grown batch had, ahead of the rest.
    assert len(parts) >= 3 and all(len(p.close()) <= 200 for p in parts)
    assert [p.record_count for p in parts] and sum(p.record_count for p in parts) == 12
    sequence = base
    for part in parts:
        assert part.base_sequence == sequence and part.created_ms == grown.created_ms
        assert isinstance(part.last_error, RecordTooLargeError)
        sequence += part.record_count
    assert idem.unacked[TP0] == [second.base_sequence] + [p.base_sequence for p in parts]
    assert acc._queues[TP0][-1].base_sequence < 0  # the later batch stays behind them
    records = [r for p in parts for r in decode_records(p.close())]
    assert [r.value for r in records] == [b"%02d" % i + b"v" * 38 for i in range(12)]
    assert [r.timestamp for r in records] == list(range(12))
    assert all(r.headers == (("h", b"x"),) for r in records)
    assert not any(f.done() for f in futures)  # type: ignore[union-attr]
    # The parts go one at a time, as retries, once the batch before them is answered.
    assert acc.drain([TP0], 1 << 20, now_ms=0) == []
    answer(acc, second)
    offsets = {}
    for at, part in enumerate(parts):
        assert acc.drain([TP0], 1 << 20, now_ms=0) == [part]
        assert acc.drain([TP0], 1 << 20, now_ms=0) == []  # the next waits for its answer
        offsets[part] = 1000 * (at + 1)  # another producer's records may come between them
        answer_at(acc, part, offsets[part])
    position = 0
    for part in parts:
        for i in range(part.record_count):
            assert futures[position].result(0).offset == offsets[part] + i  # type: ignore[union-attr]
            position += 1
    assert grown.completion.done and grown.completion.error is None
    # The topic's batches no longer grow: with the window full again a normal batch opens.
    fill_and_send(acc, 2)
    acc.append(TP0, 1, None, b"v" * 40, (), now_ms=0)
    assert acc.open_batch(TP0).reserved_bytes == 200  # type: ignore[union-attr]
    other = TopicPartition("other", 0)
    for _ in range(2):
        acc.append(other, 1, None, b"v" * 40, (), now_ms=0)
        assert len(acc.drain([other], 1 << 20, now_ms=10**9)) == 1
    acc.append(other, 1, None, b"v" * 40, (), now_ms=0)
    assert acc.open_batch(other).reserved_bytes == 800  # type: ignore[union-attr]


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_a_compressed_batch_is_split_with_its_codec(codec: Compression) -> None:
    idem = IdempotenceState(max_window=1)
    acc = RecordAccumulator(
        lambda: BatchBuilder(compression=codec, batch_size=200), batch_size=200, linger_ms=0,
        buffer_memory=100_000, delivery_timeout_ms=10_000, idempotence=idem,
        sized_builder=lambda size: BatchBuilder(compression=codec, batch_size=size),
        blocked_batch_size=800,
    )  # fmt: skip
    acc.set_producer_id(7, 0)
    acc.append(TP0, 1, None, b"first", (), now_ms=0)
    (first,) = acc.drain([TP0], 1 << 20, now_ms=0)
    values = [b"%02d" % i + bytes(range(38)) for i in range(12)]
    for value in values:
        acc.append(TP0, 1, None, value, (), now_ms=0)
    grown = acc.open_batch(TP0)
    assert grown is not None and grown.record_count == 12
    answer(acc, first)
    assert acc.drain([TP0], 1 << 20, now_ms=0) == [grown]
    assert refuse_as_too_large(acc, grown) == 1
    parts = list(acc._queues[TP0])
    assert len(parts) >= 3
    assert all(parse_header(p.close()).compression is codec for p in parts)
    assert [r.value for p in parts for r in decode_records(p.close())] == values


def test_whoever_sees_the_last_part_done_sees_the_split_batch_done() -> None:
    """flush() waits for the parts' completions, send_many()'s future and the records' futures
    for the split batch's: the batch must be done before its last part is seen done."""
    batch, first, last = (BatchCompletion("t", 0) for _ in range(3))
    batch.split_into([(0, first), (2, last)])
    seen: list[bool] = []
    last.add_callback(lambda _: seen.append(batch.done), RecordFuture(last, 0, 0))
    first.complete(10)
    assert not batch.done
    last.complete(20)
    assert seen == [True] and batch.done and batch.error is None
    assert [RecordFuture(batch, i, 0).result(0).offset for i in range(4)] == [10, 11, 20, 21]


def test_a_part_that_fails_fails_only_its_own_records() -> None:
    acc = make_idempotent_accumulator()
    first, second = fill_and_send(acc, 2)
    futures = [acc.append(TP0, 1, None, b"v" * 40, (), now_ms=0)[0] for _ in range(12)]
    grown = acc.open_batch(TP0)
    answer(acc, first)
    answer(acc, second)
    assert acc.drain([TP0], 1 << 20, now_ms=0) == [grown]
    assert grown is not None and refuse_as_too_large(acc, grown) == 1
    head = acc.drain([TP0], 1 << 20, now_ms=0)[0]
    handle_produce_results(
        acc, [head], {TP0: PartitionResult(ErrorCode.INVALID_RECORD, "bad")}, 0,
        retries=0, retry_backoff_ms=0, make_timeout_error=KafkaTimeoutError,
        idempotence=acc.idempotence,
    )  # fmt: skip
    # The records of a split batch are done together, once every part is.
    assert not futures[0].done() and not futures[-1].done()  # type: ignore[union-attr]
    assert acc.idempotence is not None and acc.idempotence.bump_needed  # a hole: new epoch
    assert acc.bump_epoch_if_needed()
    for at in range(20):
        drained = acc.drain([TP0], 1 << 20, now_ms=0)
        if not drained:
            break
        assert drained[0].base_sequence == (0 if at == 0 else drained[0].base_sequence)
        answer_at(acc, drained[0], 100 * at)
    assert isinstance(futures[0].exception(0), InvalidRecordError)  # type: ignore[union-attr]
    with pytest.raises(InvalidRecordError):
        futures[0].result(0)  # type: ignore[union-attr]
    assert futures[-1].exception(0) is None  # type: ignore[union-attr]
    assert futures[-1].result(0).offset >= 100  # type: ignore[union-attr]
    assert isinstance(grown.completion.error, InvalidRecordError)  # (send_many's view)


def test_a_batch_that_cannot_be_split_further_fails_as_before() -> None:
    acc = make_idempotent_accumulator(idempotent=False)
    single = acc.append(TP0, 1, None, b"v" * 40, (), now_ms=0)[0]
    (one,) = acc.drain([TP0], 1 << 20, now_ms=10**9)
    assert refuse_as_too_large(acc, one) == 0
    assert isinstance(single.exception(0), RecordTooLargeError)  # type: ignore[union-attr]
    # Several records within batch.size: a split would resend the same batch.
    many = [acc.append(TP0, 1, None, b"v" * 40, (), now_ms=0)[0] for _ in range(2)]
    (full,) = acc.drain([TP0], 1 << 20, now_ms=10**9)
    assert full.record_count == 2 and refuse_as_too_large(acc, full) == 0
    assert all(isinstance(f.exception(0), RecordTooLargeError) for f in many)  # type: ignore[union-attr]
    assert not acc.has_pending()


# -- metadata -----------------------------------------------------------------------------------


def _metadata(topics: list[broker_pb2.TopicMetadata]) -> broker_pb2.MetadataResponse:
    return broker_pb2.MetadataResponse(
        cluster_id="c",
        brokers=[common_pb2.BrokerInfo(id=i, host="h", port=9000 + i) for i in (1, 2)],
        controller=common_pb2.ControllerInfo(id=7, host="h", port=7000, epoch=3),
        topics=topics,
        metadata_version=12,
    )


def test_snapshot_translation_and_merge() -> None:
    response = _metadata(
        [
            common_pb2.TopicMetadata(
                name="a",
                topic_id="id-a",
                partitions=[
                    common_pb2.PartitionMetadata(partition=1, leader=2, leader_epoch=4),
                    common_pb2.PartitionMetadata(partition=0, leader=-1),
                ],
            ),
            common_pb2.TopicMetadata(
                name="gone", error=common_pb2.Error(code=3, message="unknown topic")
            ),
        ]
    )
    snap = snapshot_from_response(response)
    assert snap.controller is not None and snap.controller.address == "h:7000"
    assert snap.partition_count("a") == 2
    assert [p.partition for p in snap.topics["a"].partitions] == [0, 1]
    assert snap.leaders == {TopicPartition("a", 1): 2}
    assert snap.leader_of(TopicPartition("a", 1)).port == 9002  # type: ignore[union-attr]
    assert snap.leader_epoch_of(TopicPartition("a", 1)) == 4
    assert snap.topic_errors["gone"][0] is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    other = snapshot_from_response(
        _metadata(
            [
                common_pb2.TopicMetadata(
                    name="b", partitions=[common_pb2.PartitionMetadata(partition=0, leader=1)]
                )
            ]
        )
    )
    merged = merge_snapshots(snap, other, replace_all=False)
    assert set(merged.topics) == {"a", "b"} and TopicPartition("a", 1) in merged.leaders
    assert set(merge_snapshots(snap, other, replace_all=True).topics) == {"b"}


def test_snapshot_maps_brokers_grpc_addresses_to_their_direct_doors() -> None:
    response = _metadata([])
    del response.brokers[:]
    response.brokers.add(id=1, host="a", port=9001, direct_host="a", direct_port=9101)
    response.brokers.add(id=2, host="b", port=9002)  # no door: "" / 0
    snap = snapshot_from_response(response)
    assert snap.direct_doors == {"a:9001": "a:9101"}
    # A newer answer's brokers replace the doors too (a restarted broker's new door, or none).
    del response.brokers[:]
    response.brokers.add(id=1, host="a", port=9001)
    response.brokers.add(id=2, host="b", port=9002, direct_host="b", direct_port=9202)
    merged = merge_snapshots(snap, snapshot_from_response(response), replace_all=False)
    assert merged.direct_doors == {"b:9002": "b:9202"}


# -- consumer's fetched data --------------------------------------------------------------------


def _stamped_batches(*counts: int) -> bytes:
    """Batches as a broker serves them: base offsets stamped, consecutive."""
    from fjord.records.header import stamp_batch

    out = bytearray()
    offset = 0
    for count in counts:
        builder = BatchBuilder()
        for i in range(count):
            builder.append(1000 + offset + i, None, f"v{offset + i}".encode())
        raw = bytearray(builder.build())
        stamp_batch(raw, 0, offset, 0)
        out += raw
        offset += count
    return bytes(out)


def test_completed_fetch_takes_from_the_position_in_chunks() -> None:
    from fjord.client.fetcher import CompletedFetch
    from fjord.records.header import end_of_whole_batches

    data = _stamped_batches(3, 4, 2)
    assert end_of_whole_batches(data) == 9
    assert end_of_whole_batches(data[:-5]) == 7  # a cut last batch does not count
    assert end_of_whole_batches(b"") == -1
    cf = CompletedFetch(TP0, 4, data, high_watermark=9)  # a fetch from inside batch 2
    assert cf.end_offset == 9
    first = cf.take(2)
    assert [r.offset for r in first] == [4, 5] and cf.next_offset == 6
    assert first[0].value == b"v4" and first[0].timestamp == 1004 and first[0].topic == "t"
    assert not cf.exhausted
    rest = cf.take(10)
    assert [r.offset for r in rest] == [6, 7, 8] and cf.next_offset == 9
    assert cf.exhausted and cf.take(5) == []


# -- the producer's fast path (issue 18) ----------------------------------------------------------


def test_fast_path_appends_only_to_the_open_batch_with_room() -> None:
    acc = make_accumulator(batch_size=220)  # 61 + 3 records of 47 bytes; a fourth overflows
    first, wake = acc.append(TP0, 1000, None, b"a" * 40, (), 0)
    assert first is not None and wake
    batch = acc.open_batch(TP0)
    assert batch is not None
    fast = [acc.try_append_open(batch, 1001 + i, b"b" * 40) for i in range(3)]
    assert [f is not None for f in fast] == [True, True, False]  # the third does not fit
    # The locked path closes the full batch (sealed: no fast append either, even a tiny one).
    locked, _ = acc.append(TP0, 1005, None, b"c" * 40, (), 0)
    assert locked is not None and acc.open_batch(TP0) is not batch
    assert acc.try_append_open(batch, 1006, b"") is None
    # The new open batch takes fast appends; once drained (built) it refuses them.
    second = acc.open_batch(TP0)
    assert second is not None
    tail = acc.try_append_open(second, 1007, b"d")
    assert tail is not None
    drained = acc.drain([TP0], 1 << 20, now_ms=10_000)
    assert [b.record_count for b in drained] == [3, 2]
    assert acc.try_append_open(second, 1008, b"e") is None
    records = [r for b in drained for r in decode_records(b.payload)]
    assert [(r.offset, r.timestamp, r.value) for r in records] == [
        (0, 1000, b"a" * 40), (1, 1001, b"b" * 40), (2, 1002, b"b" * 40),
        (0, 1005, b"c" * 40), (1, 1007, b"d"),
    ]  # fmt: skip
    # Every future reports its own record's offset.
    handle_produce_results(
        acc, drained[:1], {TP0: PartitionResult(ErrorCode.NONE, base_offset=100)}, 10_000,
        retries=0, retry_backoff_ms=0, make_timeout_error=KafkaTimeoutError,
    )  # fmt: skip
    assert [f.result(0).offset for f in (first, fast[0], fast[1])] == [100, 101, 102]
    assert not tail.done()  # its batch was not answered


def test_fast_path_refused_after_close_and_for_another_epoch() -> None:
    acc = make_accumulator(batch_size=1000)
    acc.append(TP0, 1, None, b"v", (), 0)
    batch = acc.open_batch(TP0)
    assert batch is not None
    acc.append(TP0, 2, None, b"v", (), 0, coordinator_epoch=3)  # closes the epoch-0 batch
    assert acc.try_append_open(batch, 3, b"v") is None
    epoch3 = acc.open_batch(TP0)
    assert epoch3 is not None and epoch3.coordinator_epoch == 3
    acc.close()
    assert acc.try_append_open(epoch3, 4, b"v") is None


def test_fast_and_locked_appends_from_threads_get_their_own_offsets() -> None:
    """Appends without the lock (C builder) and under it (another thread) interleave; every
    future still names its own record: each record's index comes from the step appending it."""
    acc = make_accumulator(batch_size=1 << 20, buffer_memory=1 << 24)
    acc.append(TP0, 0, None, b"seed", (), 0)
    batch = acc.open_batch(TP0)
    assert batch is not None
    futures: dict[bytes, RecordFuture] = {}

    def fast(tag: bytes) -> None:
        for i in range(2000):
            value = tag + b"%d" % i
            future = acc.try_append_open(batch, 1, value)
            assert future is not None
            futures[value] = future

    def locked(tag: bytes) -> None:
        for i in range(2000):
            value = tag + b"%d" % i
            future, _ = acc.append(TP0, 1, None, value, (), 0)
            assert future is not None
            futures[value] = future

    threads = [
        threading.Thread(target=fast, args=(b"f",)),
        threading.Thread(target=locked, args=(b"l",)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    drained = acc.drain([TP0], 1 << 30, now_ms=10_000)
    assert len(drained) == 1
    handle_produce_results(
        acc, drained, {TP0: PartitionResult(ErrorCode.NONE, base_offset=0)}, 10_000,
        retries=0, retry_backoff_ms=0, make_timeout_error=KafkaTimeoutError,
    )  # fmt: skip
    stored = {r.value: r.offset for r in decode_records(drained[0].payload)}
    assert len(stored) == 4001
    assert all(stored[value] == future.result(0).offset for value, future in futures.items())


def test_a_completion_wakes_a_waiter_that_came_first() -> None:
    """The completion's event is made by the first wait(): a waiter that started before the
    batch completed is woken by it; after completion wait() returns at once."""
    batch = BatchCompletion("t", 0)
    future = RecordFuture(batch, 2, 5)
    results: list[RecordMetadata] = []
    waiter = threading.Thread(target=lambda: results.append(future.result(timeout=30)))
    waiter.start()
    assert not batch.wait(0.01)  # (also makes the event if the waiter has not yet)
    batch.complete(10)
    waiter.join(30)
    assert results == [RecordMetadata("t", 0, 12, 5)]
    assert batch.done and batch.wait(0) and BatchCompletion("t", 1).wait(0) is False


def test_linger_wait_never_wakes_late_on_the_loop_timer_nor_early() -> None:
    """The sender waits whole milliseconds on the event loop's timer (epoll rounds a timeout
    up to whole ms, so a fraction there wakes late) and the last fraction by a precise sleep;
    the two never add up to more than asked."""
    assert linger_wait(4.3) == (0.004, 0.0)
    assert linger_wait(1000) == (1.0, 0.0)
    timer_s, precise_s = linger_wait(0.7)
    assert timer_s == 0.0 and precise_s == pytest.approx(0.0007)
    assert linger_wait(0) == (0.0, 0.0) and linger_wait(-3) == (0.0, 0.0)
    for delay in (0.01, 0.999, 1.0, 1.5, 4.999, 5.0, 250.25):
        timer_s, precise_s = linger_wait(delay)
        assert (timer_s == 0) != (precise_s == 0)
        assert timer_s + precise_s <= delay / 1000 + 1e-12
        assert precise_s < 0.001


def test_records_spread_over_many_partitions_open_smaller_batches_not_wait() -> None:
    """Once open batches alone would take over half of buffer.memory at batch.size each, a new
    batch reserves batch.size / SPREAD_BATCH_FRACTION (and may fill only that): send() goes on
    instead of waiting for memory no record uses; few partitions keep batch.size."""
    acc = make_idempotent_accumulator(
        batch_size=800, buffer_memory=8000, blocked_batch_size=0, idempotent=False
    )
    tps = [TopicPartition("t", n) for n in range(20)]
    for tp in tps[:7]:  # while buffer.memory stays within 3/4 (6,000): full-sized
        acc.append(tp, 1, None, b"x", (), now_ms=0)
        batch = acc.open_batch(tp)
        assert batch is not None and batch.reserved_bytes == 800
    small = 800 // SPREAD_BATCH_FRACTION
    for tp in tps[7:]:  # 13 more would need 10,400 at 800 each: each takes 100, no wait
        future, _ = acc.append(tp, 1, None, b"x", (), now_ms=0, max_block_s=0)
        batch = acc.open_batch(tp)
        assert future is not None and batch is not None and batch.reserved_bytes == small
    # A small batch fills up to its reservation only; the next record opens the next batch.
    last = acc.open_batch(tps[-1])
    for _ in range(3):
        acc.append(tps[-1], 1, None, b"y" * 20, (), now_ms=0, max_block_s=0)
    assert last is not None and last.builder.size_in_bytes <= small
    assert acc.open_batch(tps[-1]) is not last
    # A record larger than the small size still gets a batch of its own size.
    acc.append(tps[7], 1, None, b"z" * 300, (), now_ms=0, max_block_s=0)
    big = acc.open_batch(tps[7])
    assert big is not None and big.reserved_bytes >= 300
    # Memory given back exactly: everything drained and answered leaves nothing reserved.
    for batch in acc.drain(tps, 1 << 20, now_ms=10**9):
        acc.deallocate(batch)
    assert acc._reserved == 0


def test_back_pressure_from_sent_batches_keeps_full_sized_batches() -> None:
    """When sent (unanswered) batches hold the memory, a new batch is full-sized and waits
    (Kafka's back-pressure): small batches only replace waiting caused by open ones."""
    acc = make_idempotent_accumulator(
        batch_size=800, buffer_memory=8000, blocked_batch_size=0, idempotent=False
    )
    sent = []
    for _ in range(10):  # 10 nearly full batches of one partition, sent, not answered
        tp = TopicPartition("t", 0)
        acc.append(tp, 1, None, b"x" * 700, (), now_ms=0)
        sent += acc.drain([tp], 1 << 20, now_ms=10**9)
    assert len(sent) == 10 and acc._reserved > 7200
    with pytest.raises(BufferExhaustedError):
        acc.append(TopicPartition("t", 1), 1, None, b"x", (), now_ms=0, max_block_s=0.01)
    acc.deallocate(sent[0])
    acc.append(TopicPartition("t", 1), 1, None, b"x", (), now_ms=0, max_block_s=0)
    batch = acc.open_batch(TopicPartition("t", 1))
    assert batch is not None and batch.reserved_bytes == 800


def test_only_the_producers_own_loop_may_block_for_the_last_fraction_of_a_linger() -> None:
    """AsyncProducer's sender runs on the application's loop, which it must never block: the
    precise sub-millisecond sleep is the threaded Producer's (its own I/O loop) only."""
    from fjord.client.producer import AsyncProducer, Producer

    producer = Producer({"bootstrap.servers": "127.0.0.1:9"})
    try:
        assert producer._sender.owns_loop
    finally:
        producer.close(1)
    assert not AsyncProducer({"bootstrap.servers": "127.0.0.1:9"})._sender.owns_loop


def test_a_grpc_completion_posted_to_a_closed_client_loop_is_dropped() -> None:
    """grpc.aio passes a completion to its call's loop with call_soon_threadsafe from whichever
    loop polled it; one for a call cancelled as its client closed can come after that client's
    loop closed. It is dropped instead of raising "Event loop is closed" in the polling loop
    (which logged it with a traceback); anything else posted to a closed loop still raises."""
    from fjord.client import network

    assert network._GRPC_COMPLETION is not None, "grpc.aio renamed its completion callback"
    io = network.EventLoopThread("test-closed-loop")
    io.stop()
    assert io.loop.is_closed()
    handle = io.loop.call_soon_threadsafe(network._GRPC_COMPLETION, object(), 1)
    assert handle.cancelled()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        io.loop.call_soon_threadsafe(lambda: None)
