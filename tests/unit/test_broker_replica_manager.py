"""ReplicaManager against real partition logs in a temp dir, driven by metadata images:
produce (acks 0/1/all), long-poll fetch, list offsets, errors, and metadata changes."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from fjord._proto import broker_pb2
from fjord.broker import defaults as broker_defaults
from fjord.broker.fetch import assemble_fetch
from fjord.broker.partition import Partition
from fjord.broker.replica_manager import ReplicaManager
from fjord.broker.server import BrokerOptions, check_data_dir_identity
from fjord.cluster.defaults import DEFAULT_BROKER_PORT
from fjord.errors import ConfigError, ErrorCode
from fjord.metadata import TopicRecord
from fjord.records import decode_records
from fjord.serving import parse_listen
from fjord.storage import LogManager
from fjord.storage.region import FileRegion
from tests.helpers.replica_manager import (
    BROKER,
    Cluster,
    Env,
    batch,
    env,
    fetch_request,
    leader_state,
    one_fetch,
    one_produce,
    produce_request,
    run,
    until_parked,
)

__all__ = ["env"]  # the fixture, used by name

#: Max wait of a parked fetch (and timeout of a parked produce) in the tests that check what
#: answered it: long, so an answer well before it was the event under test (an append, a
#: close), never its deadline, however loaded the machine.
LONG_POLL_MS = 60_000


def test_produce_then_fetch(env: Env) -> None:
    manager, cluster, logs = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state(), leader_state()]))
        assert sorted(manager.partitions) == [("t", 0), ("t", 1)]
        first = one_produce(await manager.produce(produce_request("t", 1, batch(3))))
        second = one_produce(await manager.produce(produce_request("t", 1, batch(2), acks=-1)))
        assert (first.error.code, first.base_offset, first.log_append_time_ms) == (0, 0, -1)
        assert (second.error.code, second.base_offset) == (0, 3)
        none = one_produce(await manager.produce(produce_request("t", 0, batch(1), acks=0)))
        assert none.error.code == 0
        out = one_fetch(await manager.fetch(fetch_request("t", 1, 1)))
        assert out.error.code == 0
        assert (out.high_watermark, out.log_start_offset, out.leader_id) == (5, 0, BROKER)
        assert [r.offset for r in decode_records(out.records)] == [0, 1, 2, 3, 4]
        assert logs.get("t", 1) is not None

    run(scenario())


def test_produce_errors(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state((2, BROKER), leader=2)]))
        cluster.topic("other", [leader_state((2,), leader=2)])
        await manager.apply_metadata(cluster.image)
        codes = {}
        for name, request in {
            "unknown": produce_request("nope", 0, batch()),
            "follower": produce_request("t", 0, batch()),
            "not a replica": produce_request("other", 0, batch()),
            "acks": produce_request("t", 0, batch(), acks=2),
            "illegal name": produce_request("..", 0, batch()),
            "too long": produce_request("x" * 250, 0, batch()),
        }.items():
            result = one_produce(await manager.produce(request))
            codes[name] = result.error.code
            assert result.base_offset == -1
        assert codes == {
            "unknown": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code,
            "follower": ErrorCode.NOT_LEADER_OR_FOLLOWER.code,
            "not a replica": ErrorCode.NOT_LEADER_OR_FOLLOWER.code,
            "acks": ErrorCode.INVALID_REQUIRED_ACKS.code,
            "illegal name": ErrorCode.INVALID_TOPIC_EXCEPTION.code,
            "too long": ErrorCode.INVALID_TOPIC_EXCEPTION.code,
        }

    run(scenario())


def test_disk_full_is_answered_kafka_storage_error_naming_the_cause(env: Env) -> None:
    """A write the kernel refuses with ENOSPC (the segment's descriptor pointed at /dev/full)
    is answered KAFKA_STORAGE_ERROR naming "No space left on device": retriable, so the
    producer retries and, if it gives up, names this as its last error."""
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state()]))
        assert one_produce(await manager.produce(produce_request("t", 0, batch(2)))).error.code == 0
        plog = manager.partitions[("t", 0)].log
        fd = plog.active_segment.fd
        full = os.open("/dev/full", os.O_WRONLY)
        try:
            os.dup2(full, fd)  # the log's own descriptor now refuses every write: ENOSPC
            refused = one_produce(await manager.produce(produce_request("t", 0, batch(1))))
        finally:
            os.close(full)
        # /dev/full cannot be cut back to the old size, so the log also took itself offline
        # (and closed fd); a real full disk cuts back and stays online.
        assert plog.closed
        assert refused.error.code == ErrorCode.KAFKA_STORAGE_ERROR.code
        assert "No space left on device" in refused.error.message, refused.error.message

    run(scenario())


def test_corrupt_and_oversized_batches_append_nothing(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        state = leader_state()
        await manager.apply_metadata(cluster.topic("t", [state], {"max.message.bytes": "200"}))
        corrupt = bytearray(batch(2))
        corrupt[-1] ^= 1
        bad = one_produce(await manager.produce(produce_request("t", 0, bytes(corrupt))))
        assert bad.error.code == ErrorCode.CORRUPT_MESSAGE.code
        assert "CRC" in bad.error.message
        big = one_produce(
            await manager.produce(produce_request("t", 0, batch(1, value=b"x" * 500)))
        )
        assert big.error.code == ErrorCode.MESSAGE_TOO_LARGE.code
        assert manager.partitions[("t", 0)].log_end_offset == 0

    run(scenario())


def test_long_poll_wakes_on_append(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state()]))
        started = time.monotonic()
        waiting = asyncio.ensure_future(
            manager.fetch(fetch_request("t", 0, 0, max_wait_ms=LONG_POLL_MS, min_bytes=1))
        )
        await until_parked(manager, fetches=1)
        assert not waiting.done()
        await manager.produce(produce_request("t", 0, batch(2)))
        out = one_fetch(await waiting)
        assert time.monotonic() - started < LONG_POLL_MS / 2000  # the append answered it
        assert [r.offset for r in decode_records(out.records)] == [0, 1]

    run(scenario())


def test_woken_fetch_answers_before_the_produce_that_woke_it(env: Env) -> None:
    """An append that wakes a parked fetch yields one loop turn before its own answer: the
    fetch (its records on their way to a consumer or follower) is answered first. A produce
    that wakes nothing does not count a wake-up."""
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state()]))
        one_produce(await manager.produce(produce_request("t", 0, batch(1))))
        assert manager.waiters_woken == 0
        waiting = asyncio.ensure_future(
            manager.fetch(fetch_request("t", 0, 1, max_wait_ms=5000, min_bytes=1))
        )
        await until_parked(manager, fetches=1)
        answer = one_produce(await manager.produce(produce_request("t", 0, batch(2))))
        assert answer.base_offset == 1
        assert manager.waiters_woken == 1
        assert waiting.done()  # answered while the produce yielded
        out = one_fetch(waiting.result())
        assert [r.offset for r in decode_records(out.records)] == [1, 2]

    run(scenario())


def test_long_poll_times_out_empty_and_min_bytes_accumulates(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state()]))
        started = time.monotonic()
        out = one_fetch(await manager.fetch(fetch_request("t", 0, 0, max_wait_ms=100, min_bytes=1)))
        elapsed = time.monotonic() - started
        # Not before its max wait (the upper bound only says it returned: no speed target).
        assert 0.09 <= elapsed < 30 and out.records == b"" and out.error.code == 0
        size = len(batch(1))
        waiting = asyncio.ensure_future(
            manager.fetch(fetch_request("t", 0, 0, max_wait_ms=LONG_POLL_MS, min_bytes=2 * size))
        )
        await until_parked(manager, fetches=1)
        await manager.produce(produce_request("t", 0, batch(1)))
        assert manager.parked() == (1, 0)  # the append woke it, but one batch is not min_bytes
        assert not waiting.done()  # one batch is not min_bytes yet
        await manager.produce(produce_request("t", 0, batch(1)))
        assert len(one_fetch(await waiting).records) == 2 * size

    run(scenario())


def test_acks_all_waits_for_follower(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state((BROKER, 2))]))
        producing = asyncio.ensure_future(
            manager.produce(produce_request("t", 0, batch(3), acks=-1))
        )
        await until_parked(manager, produces=1)
        assert not producing.done()
        # The consumer does not see unreplicated data; the follower does.
        consumer = one_fetch(await manager.fetch(fetch_request("t", 0, 0)))
        assert consumer.records == b"" and consumer.high_watermark == 0
        follower = one_fetch(await manager.fetch(fetch_request("t", 0, 0, replica_id=2)))
        assert len(list(decode_records(follower.records))) == 3
        # The follower's next fetch proves it holds offsets 0..2: the produce completes.
        await manager.fetch(fetch_request("t", 0, 3, replica_id=2))
        result = one_produce(await producing)
        assert (result.error.code, result.base_offset) == (0, 0)
        assert manager.partitions[("t", 0)].high_watermark == 3

    run(scenario())


def test_acks_all_timeout_and_not_enough_replicas(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(
            cluster.topic(
                "t",
                [leader_state((BROKER, 2)), leader_state((BROKER, 2), isr=(BROKER,))],
                {"min.insync.replicas": "2"},
            )
        )
        timed_out = one_produce(
            await manager.produce(produce_request("t", 0, batch(), acks=-1, timeout_ms=100))
        )
        assert timed_out.error.code == ErrorCode.REQUEST_TIMED_OUT.code
        assert timed_out.base_offset == 0  # appended, just not replicated in time
        refused = one_produce(await manager.produce(produce_request("t", 1, batch(), acks=-1)))
        assert refused.error.code == ErrorCode.NOT_ENOUGH_REPLICAS.code
        assert manager.partitions[("t", 1)].log_end_offset == 0

    run(scenario())


def test_leadership_loss_fails_waiting_produce(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state((BROKER, 2))]))
        producing = asyncio.ensure_future(
            manager.produce(produce_request("t", 0, batch(), acks=-1))
        )
        await until_parked(manager, produces=1)
        state = leader_state((BROKER, 2), leader=2, epoch=1)
        await manager.apply_metadata(
            cluster.change([(cluster.keys.partition("t", 0), state.to_json())])
        )
        result = one_produce(await producing)
        assert result.error.code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code

    run(scenario())


def test_follower_with_a_newer_leader_epoch_deposes_the_leader(env: Env) -> None:
    """A leader whose metadata lags (etcd away) learns from a follower's fetch that a newer
    leader epoch exists: it answers its parked acks=all produce, refuses new ones and commits
    nothing more until newer metadata arrives."""
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state((BROKER, 2, 3))]))
        producing = asyncio.ensure_future(
            manager.produce(produce_request("t", 0, batch(2), acks=-1))
        )
        await until_parked(manager, produces=1)
        newer = one_fetch(await manager.fetch(fetch_request("t", 0, 0, replica_id=2, epoch=1)))
        assert newer.error.code == ErrorCode.UNKNOWN_LEADER_EPOCH.code
        assert one_produce(await producing).error.code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code
        refused = one_produce(await manager.produce(produce_request("t", 0, batch(), acks=1)))
        assert refused.error.code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code
        # Fetches in our old epoch prove nothing any more: the high watermark stays.
        await manager.fetch(fetch_request("t", 0, 2, replica_id=2, epoch=0))
        await manager.fetch(fetch_request("t", 0, 2, replica_id=3, epoch=0))
        assert manager.partitions[("t", 0)].high_watermark == 0
        # The metadata catches up: broker 2 leads in epoch 1; this broker follows.
        state = leader_state((BROKER, 2, 3), leader=2, epoch=1)
        await manager.apply_metadata(
            cluster.change([(cluster.keys.partition("t", 0), state.to_json())])
        )
        assert manager.partitions[("t", 0)].stale_partition_epoch == -1
        assert not manager.partitions[("t", 0)].is_leader

    run(scenario())


def test_fetch_errors(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state(epoch=4)]))
        await manager.produce(produce_request("t", 0, batch(2)))
        cases = {
            "fenced": fetch_request("t", 0, 0, epoch=3),
            "unknown epoch": fetch_request("t", 0, 0, epoch=5),
            "out of range": fetch_request("t", 0, 3),
            "unknown": fetch_request("x", 0, 0),
        }
        codes = {}
        for name, request in cases.items():
            codes[name] = one_fetch(await manager.fetch(request)).error.code
        assert codes == {
            "fenced": ErrorCode.FENCED_LEADER_EPOCH.code,
            "unknown epoch": ErrorCode.UNKNOWN_LEADER_EPOCH.code,
            "out of range": ErrorCode.OFFSET_OUT_OF_RANGE.code,
            "unknown": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code,
        }
        ok = one_fetch(await manager.fetch(fetch_request("t", 0, 2, epoch=4, max_wait_ms=10)))
        assert (ok.error.code, ok.records, ok.leader_epoch) == (0, b"", 4)
        bad = await manager.fetch(broker_pb2.FetchRequest(max_bytes=-1))
        assert bad.error.code == ErrorCode.INVALID_REQUEST.code

    run(scenario())


def test_list_offsets(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state(epoch=2)]))
        await manager.produce(produce_request("t", 0, batch(2, ts=1000)))
        await manager.produce(produce_request("t", 0, batch(2, ts=5000)))
        await manager.produce(produce_request("t", 0, batch(1, ts=3000)))

        async def ask(ts: int, epoch: int = -1) -> broker_pb2.ListOffsetsPartitionResponse:
            request = broker_pb2.ListOffsetsRequest(
                replica_id=-1,
                topics=[
                    broker_pb2.ListOffsetsTopic(
                        name="t",
                        partitions=[
                            broker_pb2.ListOffsetsPartition(
                                partition=0, timestamp=ts, current_leader_epoch=epoch
                            )
                        ],
                    )
                ],
            )
            return manager.list_offsets(request).topics[0].partitions[0]

        assert (await ask(-2)).offset == 0
        latest = await ask(-1)
        assert (latest.offset, latest.leader_epoch) == (5, 2)
        max_ts = await ask(-3)
        assert (max_ts.offset, max_ts.timestamp) == (2, 5001)
        by_time = await ask(4000)
        assert (by_time.offset, by_time.timestamp) == (2, 5001)
        missing = await ask(10_000)
        assert (missing.offset, missing.timestamp, missing.error.code) == (-1, -1, 0)
        assert (await ask(-7)).error.code == ErrorCode.INVALID_REQUEST.code
        assert (await ask(-1, epoch=1)).error.code == ErrorCode.FENCED_LEADER_EPOCH.code

    run(scenario())


def test_metadata_changes_create_and_delete_logs(env: Env) -> None:
    manager, cluster, logs = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state()]))
        await manager.produce(produce_request("t", 0, batch()))
        directory = logs.get("t", 0).directory  # type: ignore[union-attr]
        assert directory.exists()
        parked = asyncio.ensure_future(
            manager.fetch(fetch_request("t", 0, 1, max_wait_ms=5000, min_bytes=1))
        )
        await until_parked(manager, fetches=1)
        keys = cluster.keys
        await manager.apply_metadata(cluster.change([], (keys.topic("t"), keys.partition("t", 0))))
        assert manager.partitions == {}
        assert logs.get("t", 0) is None and not directory.exists()
        # The parked fetch was woken and answers with the partition gone.
        out = one_fetch(await parked)
        assert out.error.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code

    run(scenario())


def test_fenced_broker_refuses_produce(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state()]))
        manager.fenced = True
        result = one_produce(await manager.produce(produce_request("t", 0, batch())))
        assert result.error.code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code
        manager.fenced = False
        assert one_produce(await manager.produce(produce_request("t", 0, batch()))).error.code == 0

    run(scenario())


def test_follower_fetch_reports_divergence(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state((BROKER, 2), epoch=3)]))
        manager.partitions[("t", 0)].log.append(batch(2), 1)  # offsets 0-1 in epoch 1
        manager.partitions[("t", 0)].log.append(batch(2), 3)  # offsets 2-3 in epoch 3
        request = fetch_request("t", 0, 3, replica_id=2)
        request.topics[0].partitions[0].last_fetched_epoch = 2  # follower wrote 2..3 in epoch 2
        out = one_fetch(await manager.fetch(request))
        assert out.records == b""
        assert (out.diverging_epoch.epoch, out.diverging_epoch.end_offset) == (1, 2)
        assert manager.partitions[("t", 0)].follower_end_offset(2) is None  # proves nothing
        request.topics[0].partitions[0].last_fetched_epoch = 1
        request.topics[0].partitions[0].fetch_offset = 2  # a prefix of ours: no divergence
        out = one_fetch(await manager.fetch(request))
        assert out.diverging_epoch.end_offset == 0 and out.diverging_epoch.epoch == 0
        assert [r.offset for r in decode_records(out.records)] == [2, 3]
        assert manager.partitions[("t", 0)].high_watermark == 2

    run(scenario())


def test_stray_logs_are_deleted_at_first_snapshot(tmp_path: Path) -> None:
    logs = LogManager(tmp_path / "data")
    logs.get_or_create("gone", 0)
    logs.get_or_create("t", 0)
    manager = ReplicaManager(BROKER, logs)
    cluster = Cluster()
    try:
        run(manager.apply_metadata(cluster.topic("t", [leader_state()])))
        assert logs.get("gone", 0) is None and logs.get("t", 0) is not None
        assert not (tmp_path / "data" / "gone-0").exists()
    finally:
        logs.close()


def test_data_dir_identity(tmp_path: Path) -> None:
    check_data_dir_identity(tmp_path, "c1", 1)
    check_data_dir_identity(tmp_path, "c1", 1)
    with pytest.raises(ConfigError, match="data-dir"):
        check_data_dir_identity(tmp_path, "c2", 1)
    with pytest.raises(ConfigError, match="data-dir"):
        check_data_dir_identity(tmp_path, "c1", 2)


def test_broker_options_validation(tmp_path: Path) -> None:
    def options(**overrides: object) -> BrokerOptions:
        base: dict[str, object] = {
            "broker_id": 1,
            "listen_host": "127.0.0.1",
            "listen_port": 0,
            "data_dir": tmp_path,
            "etcd_url": "http://127.0.0.1:2379",
            "cluster_id": "c",
        }
        base.update(overrides)
        return BrokerOptions(**base)  # type: ignore[arg-type]

    assert options().broker_id == 1
    with pytest.raises(ConfigError, match="id"):
        options(broker_id=-1)
    with pytest.raises(ConfigError, match=r"retention\.ms"):
        options(config={"retention.ms": "soon"})
    with pytest.raises(ConfigError, match="cluster-id"):
        options(cluster_id="a/b")
    assert parse_listen("localhost:9093", DEFAULT_BROKER_PORT) == ("localhost", 9093)
    assert parse_listen("[::1]:9093", DEFAULT_BROKER_PORT) == ("::1", 9093)
    assert parse_listen("myhost", DEFAULT_BROKER_PORT) == ("myhost", 9092)
    for bad in ("host:port", ":9092", "h:70000"):
        with pytest.raises(ConfigError, match="listen"):
            parse_listen(bad, DEFAULT_BROKER_PORT)


def test_big_fetch_reads_in_thread_and_read_failures_stay_per_partition(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetch is read in a worker thread when the bytes it may read (its limits, and the
    bytes the log holds from its offsets) exceed READ_IN_THREAD_THRESHOLD_BYTES; one with large
    limits and little to read (a caught-up follower) is read on the event loop."""
    manager, cluster, _ = env
    thread_reads: list[object] = []
    to_thread = asyncio.to_thread

    async def counting_to_thread(func, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        if func is assemble_fetch:  # (opening partitions goes to threads too)
            thread_reads.append(func)
        return await to_thread(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counting_to_thread)

    def two_partition_fetch() -> broker_pb2.FetchRequest:
        request = fetch_request("t", 0, 0, partition_max_bytes=8 << 20)
        request.max_bytes = 16 << 20
        request.topics[0].partitions.add(
            partition=1, fetch_offset=0, partition_max_bytes=8 << 20, current_leader_epoch=-1
        )
        return request

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state(), leader_state()]))
        for partition in (0, 1):
            await manager.produce(produce_request("t", partition, batch(3)))
        small = await manager.fetch(two_partition_fetch())  # limits of 16 MiB, ~200 bytes
        assert [len(list(decode_records(p.records))) for p in small.topics[0].partitions] == [
            3, 3
        ]
        assert thread_reads == []
        value = b"x" * (broker_defaults.READ_IN_THREAD_THRESHOLD_BYTES // 4)
        for partition in (0, 1):
            await manager.produce(produce_request("t", partition, batch(3, value=value)))
        big = await manager.fetch(two_partition_fetch())  # above the threshold: a thread
        assert [len(list(decode_records(p.records))) for p in big.topics[0].partitions] == [
            6, 6
        ]
        assert len(thread_reads) == 1
        # Zero copy: regions of verified segments read only the index, on the event loop.
        regions: list[FileRegion] = []

        def marker(region: FileRegion) -> bytes:
            regions.append(region)
            return b"region %d" % len(regions)

        zero_copy = await manager.fetch(two_partition_fetch(), region_marker=marker)
        assert len(thread_reads) == 1
        assert [p.records for p in zero_copy.topics[0].partitions] == [b"region 1", b"region 2"]
        assert [r.read() for r in regions] == [p.records for p in big.topics[0].partitions]
        for region in regions:
            region.close()
        manager.partitions[("t", 1)].log.close()  # a log that fails under the reader
        out = (await manager.fetch(two_partition_fetch())).topics[0].partitions
        assert out[0].error.code == 0 and len(list(decode_records(out[0].records))) == 6
        assert out[1].error.code == ErrorCode.KAFKA_STORAGE_ERROR.code and out[1].records == b""

    run(scenario())


def test_close_answers_parked_operations(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state((BROKER, 2))]))
        fetching = asyncio.ensure_future(
            manager.fetch(fetch_request("t", 0, 0, max_wait_ms=LONG_POLL_MS, min_bytes=1))
        )
        producing = asyncio.ensure_future(
            manager.produce(produce_request("t", 0, batch(), acks=-1, timeout_ms=LONG_POLL_MS))
        )
        await until_parked(manager, fetches=1, produces=1)
        started = time.monotonic()
        manager.close()
        produced = one_produce(await producing)
        assert produced.error.code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code
        assert one_fetch(await fetching).error.code == 0
        assert time.monotonic() - started < LONG_POLL_MS / 2000  # close answered, not deadlines

    run(scenario())


def test_one_request_many_partitions(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("a", [leader_state(), leader_state()]))
        await manager.apply_metadata(cluster.topic("b", [leader_state((2,), leader=2)]))
        corrupt = bytearray(batch(1))
        corrupt[-1] ^= 1
        request = broker_pb2.ProduceRequest(
            acks=-1,
            timeout_ms=1000,
            topics=[
                broker_pb2.ProduceTopic(
                    name="a",
                    partitions=[
                        broker_pb2.ProducePartition(partition=1, records=batch(2)),
                        broker_pb2.ProducePartition(partition=0, records=bytes(corrupt)),
                        broker_pb2.ProducePartition(partition=7, records=batch(1)),
                    ],
                ),
                broker_pb2.ProduceTopic(
                    name="b", partitions=[broker_pb2.ProducePartition(partition=0, records=batch())]
                ),
            ],
        )
        response = await manager.produce(request)
        answers = [
            (t.name, p.partition, p.error.code, p.base_offset)
            for t in response.topics
            for p in t.partitions
        ]
        assert answers == [
            ("a", 1, 0, 0),
            ("a", 0, ErrorCode.CORRUPT_MESSAGE.code, -1),
            ("a", 7, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code, -1),
            ("b", 0, ErrorCode.NOT_LEADER_OR_FOLLOWER.code, -1),
        ]
        assert manager.partitions[("a", 1)].log_end_offset == 2
        assert manager.partitions[("a", 0)].log_end_offset == 0

    run(scenario())


def test_resignation_is_asked_once_per_epoch_and_adopted_when_committed(env: Env) -> None:
    from fjord.broker.partition import PartitionAssignment

    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic(
            "t", [leader_state((BROKER, 2)), leader_state((BROKER,)), leader_state((2, BROKER),
                                                                                 leader=2)]))
        # Only t-0 has another ISR member to take over; t-1 is alone, t-2 led elsewhere.
        assert manager.resign_all("disk") == 1
        assert manager.resign_all("disk") == 0  # already asked in this epoch
        (request,) = manager.take_isr_requests()
        assert request.resign and request.reason == "disk" and request.new_isr == (2,)
        assert manager.resigning(("t", 0))
        committed = PartitionAssignment(leader=2, leader_epoch=1, replicas=(BROKER, 2),
                                        isr=(2,), partition_epoch=1)
        manager.on_isr_change_result(request, 0, committed)
        partition = manager.partitions[("t", 0)]
        assert not partition.is_leader and partition.leader_epoch == 1
        assert not manager.resigning(("t", 0))
        out = one_produce(await manager.produce(produce_request("t", 0, batch(1))))
        assert out.error.code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code

    run(scenario())


def test_refused_resignation_keeps_leading_and_may_be_asked_again(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state((BROKER, 2))]))
        assert manager.request_resignation(("t", 0), "damage")
        (request,) = manager.take_isr_requests()
        manager.on_isr_change_result(request, ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE.code, None)
        assert manager.partitions[("t", 0)].is_leader
        assert manager.request_resignation(("t", 0), "damage")

    run(scenario())


def test_unwritable_disk_stops_following_and_reports_follower_append_errors(env: Env) -> None:
    from fjord.broker.disk_monitor import DiskMonitor
    from fjord.broker.replication import FollowerTarget

    manager, cluster, logs = env
    monitor = DiskMonitor(logs.data_dir, lambda _condition: None, lambda: None)
    manager.on_write_error = monitor.report

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state((2, BROKER), leader=2)]))
        target = FollowerTarget(2, 0)
        assert manager.follower_position(("t", 0), target) is not None
        manager.disk_writable = False
        assert manager.follower_position(("t", 0), target) is None
        manager.disk_writable = True
        manager.partitions[("t", 0)].log.close()  # every later write fails like a dead disk
        answer = broker_pb2.FetchPartitionResponse(partition=0, high_watermark=1,
                                                   records=batch(1))
        result = manager.on_follower_fetch_response(("t", 0), target, answer)
        # A closed log is no OS write error: logged as before, the disk still counts writable.
        assert result.error is not None and result.quiet is False and monitor.writable

    run(scenario())


async def _led_with_batches(manager: ReplicaManager, cluster: Cluster, batches: int) -> None:
    """Topic t, one partition led by this broker alone, holding ``batches`` batches of 2."""
    await manager.apply_metadata(cluster.topic("t", [leader_state((BROKER,))]))
    for _ in range(batches):
        one_produce(await manager.produce(produce_request("t", 0, batch(2))))


def _damage_stored_batch(manager: ReplicaManager, key: tuple[str, int], batch_index: int) -> int:
    """Flip a byte inside the records of one stored batch and forget the segment was verified
    (as after a restart); returns the batch's base offset."""
    import os

    from fjord.records.header import iter_batches

    segment = manager.partitions[key].log.segments[0]
    data = segment.read(0, segment.size)
    pos, header = list(iter_batches(data))[batch_index]
    fd = os.open(segment.path(".log"), os.O_WRONLY)  # not the log's O_APPEND descriptor
    try:
        os.pwrite(fd, bytes([data[pos + header.size - 2] ^ 0xFF]), pos + header.size - 2)
    finally:
        os.close(fd)
    segment.verified = False
    return header.base_offset


def test_damaged_leader_serves_the_intact_prefix_then_hands_over(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await _led_with_batches(manager, cluster, 4)
        # Now replicated: a second ISR member holds a healthy copy.
        await manager.apply_metadata(cluster.topic("t", [leader_state((BROKER, 2))]))
        bad = _damage_stored_batch(manager, ("t", 0), 2)
        first = one_fetch(await manager.fetch(fetch_request("t", 0, 0)))
        assert first.error.code == 0
        assert [r.offset for r in decode_records(first.records)] == list(range(bad))
        again = one_fetch(await manager.fetch(fetch_request("t", 0, bad)))
        assert again.error.code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code and not again.records
        (request,) = manager.take_isr_requests()
        assert request.resign and request.reason == "damage"
        assert manager.damage_found == 1

    run(scenario())


def test_damage_without_a_healthy_copy_names_offset_and_way_forward(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await _led_with_batches(manager, cluster, 4)
        bad = _damage_stored_batch(manager, ("t", 0), 1)
        one_fetch(await manager.fetch(fetch_request("t", 0, 0)))  # finds it
        out = one_fetch(await manager.fetch(fetch_request("t", 0, bad)))
        assert out.error.code == ErrorCode.CORRUPT_MESSAGE.code
        assert f"t-0: the batch at offset {bad} is damaged" in out.error.message
        assert "DeleteRecords" in out.error.message
        assert manager.take_isr_requests() == []  # nobody to hand over to
        after = one_fetch(await manager.fetch(fetch_request("t", 0, bad + 2)))
        assert after.error.code == 0 and after.records  # past the damage reads go on

    run(scenario())


def test_damaged_follower_truncates_and_counts_the_repair_when_caught_up(env: Env) -> None:
    from fjord.broker.replication import FollowerTarget
    from fjord.storage.scrub import LogDamage

    manager, cluster, _ = env

    async def scenario() -> None:
        await _led_with_batches(manager, cluster, 3)
        await manager.apply_metadata(cluster.topic("t", [leader_state((2, BROKER), leader=2,
                                                                      epoch=1)]))
        partition = manager.partitions[("t", 0)]
        partition.log.note_damage(LogDamage(2, 4, "CRC mismatch"))
        target = FollowerTarget(2, 1)
        position = manager.follower_position(("t", 0), target)
        assert position is not None and position.fetch_offset == 2  # truncated there
        assert ("t", 0) in manager.repairs and partition.log.damage is None
        healthy = bytearray(batch(4))
        from fjord.records.header import stamp_batch

        stamp_batch(healthy, 0, 2, 0)
        answer = broker_pb2.FetchPartitionResponse(partition=0, high_watermark=6,
                                                   records=bytes(healthy))
        result = manager.on_follower_fetch_response(("t", 0), target, answer)
        assert result.error is None and partition.log_end_offset == 6
        assert manager.repairs == {} and manager.repairs_done == 1

    run(scenario())


def test_follower_reports_a_batch_that_failed_its_check_once(env: Env) -> None:
    from fjord.broker.replication import FollowerTarget
    from fjord.records.header import stamp_batch

    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state((2, BROKER), leader=2)]))
        rotten = bytearray(batch(2))
        stamp_batch(rotten, 0, 0, 0)
        rotten[-1] ^= 0xFF
        target = FollowerTarget(2, 0)
        answer = broker_pb2.FetchPartitionResponse(partition=0, high_watermark=2,
                                                   records=bytes(rotten))
        result = manager.on_follower_fetch_response(("t", 0), target, answer)
        assert result.error is not None and "CRC" in str(result.error)
        first = manager.follower_position(("t", 0), target)
        assert first is not None and first.damaged_at_fetch_offset and first.fetch_offset == 0
        again = manager.follower_position(("t", 0), target)
        assert again is not None and not again.damaged_at_fetch_offset  # said once

    run(scenario())


def test_leader_told_of_a_bad_batch_checks_its_copy_and_hands_over(env: Env) -> None:
    from fjord.broker.replication import FollowerPosition, build_fetch_request
    from fjord.cluster.replication_config import ReplicationSettings

    manager, cluster, _ = env

    async def scenario() -> None:
        await _led_with_batches(manager, cluster, 4)
        await manager.apply_metadata(cluster.topic("t", [leader_state((BROKER, 2))]))
        # Rot after the write: the segment was verified when written, so reads trust it...
        bad = _damage_stored_batch(manager, ("t", 0), 1)
        manager.partitions[("t", 0)].log.segments[0].verified = True
        sent = one_fetch(await manager.fetch(fetch_request("t", 0, bad, replica_id=2)))
        assert sent.error.code == 0 and sent.records  # ...and the damaged batch goes out.
        report = FollowerPosition("t", 0, bad, 0, 0, 0, damaged_at_fetch_offset=True)
        request = build_fetch_request(2, -1, [report], ReplicationSettings())
        answer = one_fetch(await manager.fetch(request))
        # The leader checked its copy again, found the damage, and hands leadership over.
        assert answer.error.code == ErrorCode.NOT_LEADER_OR_FOLLOWER.code and not answer.records
        assert manager.damage_found == 1
        (resign,) = manager.take_isr_requests()
        assert resign.resign and resign.reason == "damage"

    run(scenario())


def test_scrubber_finding_damage_in_a_led_copy_hands_leadership_over(env: Env) -> None:
    from fjord.broker.scrubber import Scrubber
    from fjord.cluster.scrubber_config import ScrubberSettings
    from fjord.storage.scrub import SegmentRef

    manager, cluster, _ = env

    async def scenario() -> None:
        await _led_with_batches(manager, cluster, 4)
        plog = manager.partitions[("t", 0)].log
        plog.roll()
        await manager.apply_metadata(cluster.topic("t", [leader_state((BROKER, 2))]))
        bad = _damage_stored_batch(manager, ("t", 0), 2)
        (segment,) = plog.closed_segments()
        scrubber = Scrubber(manager, ScrubberSettings())
        ref = SegmentRef("t", 0, segment.base_offset, segment.size)
        assert not await scrubber.verify(ref, plog, segment)
        assert plog.damage is not None and plog.damage.offset == bad
        assert not segment.verified
        (resign,) = manager.take_isr_requests()
        assert resign.resign and resign.reason == "damage"
        # Refused (no other live ISR member): reads of the damage name it instead of
        # sending clients after a leader that stays.
        manager.on_isr_change_result(resign, ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE.code, None)
        out = one_fetch(await manager.fetch(fetch_request("t", 0, bad)))
        assert out.error.code == ErrorCode.CORRUPT_MESSAGE.code
        assert f"offset {bad} is damaged" in out.error.message

    run(scenario())


def test_a_metadata_apply_updates_only_what_changed_and_lets_the_loop_run(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change to one partition of a big topic updates that partition alone (the image shares
    the others' state objects), and a pass over many partitions yields to the event loop
    (lease keep-alives run meanwhile): a 3 x 10,000-partition cluster at load 11 otherwise
    lost broker leases to passes of several seconds, each lapse bringing more changes."""
    manager, cluster, _ = env
    monkeypatch.setattr(broker_defaults, "APPLY_YIELD_EVERY", 20)
    count = 60

    async def scenario() -> None:
        states = [leader_state(epoch=1)] * count
        await manager.apply_metadata(cluster.topic("big", states))
        assert len(manager.partitions) == count
        updated: list[int] = []  # partitions the apply looked at beyond the identity check
        real = Partition.update_config

        def counted(self: Partition, **settings: Any) -> None:
            updated.append(self.partition)
            real(self, **settings)

        monkeypatch.setattr(Partition, "update_config", counted)
        image = cluster.change([(cluster.keys.partition("big", 7),
                                 leader_state(epoch=2).to_json())])
        ran_during: list[bool] = []
        applying = asyncio.ensure_future(manager.apply_metadata(image))

        async def keep_alive() -> None:
            await asyncio.sleep(0)
            ran_during.append(not applying.done())

        await asyncio.gather(applying, keep_alive())
        assert updated == [7] and manager.partitions[("big", 7)].leader_epoch == 2
        assert ran_during == [True]
        # the same image again: nothing to update; a topic config change: every partition
        updated.clear()
        await manager.apply_metadata(image)
        assert updated == []
        image = cluster.change([(cluster.keys.topic("big"), TopicRecord(
            "0" * 32, count, 1, {"min.insync.replicas": "1", "retention.ms": "1000"}).to_json())])
        await manager.apply_metadata(image)
        assert sorted(updated) == list(range(count))
        assert all(p.log.config.retention_ms == 1000 for p in manager.partitions.values())

    run(scenario())
