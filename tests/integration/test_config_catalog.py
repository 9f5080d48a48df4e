"""Walks fjord.cluster.config_catalog (the source of docs/configuration.md) and proves every
key's effect or refusal: each proof below names the keys it covers, and
test_every_key_has_a_proof fails when a key has none.

Proofs are grouped and cheap. Refusals go through the real controller of the shared session
cluster (AdminClient CreateTopics / dynamic broker AlterConfigs: INVALID_CONFIG or Kafka's
INVALID_REQUEST, naming the key), and so does compression.type. Storage, cleaner and
controller-planner effects are observed on the real objects the services run, built from the
config strings through the same path a broker takes (topic_settings): a PartitionLog on real
files, the cleaner's choice and clean, the planner's placement. Broker-only keys of
background tasks are proven where their value lands (the settings objects the broker builds
from its effective config, and the tasks that stop when disabled); their live effect is also
shown in test_dynamic_broker_configs (retention interval, scrubber rate, message.max.bytes).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin.configs import (
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse

from fjord.broker.log_cleaner import LogCleaner
from fjord.broker.partition import Partition, PartitionAssignment
from fjord.broker.scrubber import Scrubber
from fjord.client import AdminClient, NewTopic, Producer, TopicPartition
from fjord.cluster.broker_config import (
    retention_check_interval_s,
    topic_settings,
    validate_broker_config,
)
from fjord.cluster.cleaner_config import CleanerSettings
from fjord.cluster.config_catalog import BY_NAME, CATALOG
from fjord.cluster.dynamic_config import READ_ONLY_BROKER_KEYS, effective_broker_config
from fjord.cluster.replication_config import ReplicationSettings
from fjord.cluster.scrubber_config import ScrubberSettings
from fjord.cluster.topic_config import unclean_election_allowed
from fjord.controller.election import on_liveness_change
from fjord.controller.limits import check_broker_partitions, check_records_per_op
from fjord.controller.planner import TopicSpec, plan_create_topic
from fjord.errors import (
    ConfigError,
    ErrorCode,
    FjordError,
    NotEnoughReplicasError,
    PolicyViolationError,
    RecordTooLargeError,
)
from fjord.metadata import MetadataEvent
from fjord.metadata.schema import ClusterConfig
from fjord.records import BatchBuilder, Compression, TimestampType, read_batches
from fjord.storage.cleaner import clean_log, log_dirty_state
from fjord.storage.compaction import should_clean
from fjord.storage.log import PartitionLog
from fjord.testing.waiting import wait_for
from tests.helpers.kafka_wire import connect, roundtrip
from tests.helpers.metadata_images import K, image_with, state

pytestmark = pytest.mark.integration

WAIT_S = 30
NOW = 1_800_000_000_000
PROOFS: dict[str, Callable[..., None]] = {}


def proves(*keys: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def register(fn: Callable[..., None]) -> Callable[..., None]:
        for key in keys:
            assert key not in PROOFS, f"{key} proven twice"
            PROOFS[key] = fn
        return fn
    return register


def test_every_key_has_a_proof() -> None:
    assert set(PROOFS) == set(BY_NAME), (
        f"no proof: {sorted(set(BY_NAME) - set(PROOFS))}; "
        f"not in the catalog: {sorted(set(PROOFS) - set(BY_NAME))}")


# --- helpers ----------------------------------------------------------------------------------


def open_log(tmp_path: Path, **config: str) -> PartitionLog:
    """A real log whose config comes from Kafka-named strings, the broker's way."""
    settings = topic_settings({}, {}, {k.replace("_", "."): v for k, v in config.items()})
    directory = tmp_path / f"t-{uuid.uuid4().hex[:6]}-0"
    return PartitionLog.open(directory, settings.log_config, now_ms=NOW)


def batch(*records: tuple[bytes | None, bytes | None], timestamp: int = NOW,
          codec: Compression = Compression.NONE) -> bytes:
    builder = BatchBuilder(compression=codec, batch_size=1 << 20)
    for key, value in records:
        builder.append(timestamp, key, value)
    return builder.build()


def append(plog: PartitionLog, data: bytes, now: int = NOW) -> None:
    plog.append(data, 0, now_ms=now)


def refused_at_create(admin: AdminClient, config: dict[str, str], *needles: str) -> None:
    with pytest.raises(FjordError) as caught:
        admin.create_topics([NewTopic(f"cat-{uuid.uuid4().hex[:8]}", 1, 1, config)])
    assert caught.value.code is ErrorCode.INVALID_CONFIG, caught.value
    for needle in needles:
        assert needle in str(caught.value)


# --- topic keys: storage ------------------------------------------------------------------------


@proves("segment.bytes", "segment.ms")
def proof_segment_rolls(tmp_path: Path, **_: Any) -> None:
    small = open_log(tmp_path, segment_bytes="200")
    for i in range(4):
        append(small, batch((b"k", b"v" * 100 + bytes([i]))))
    assert len(small.segments) == 4  # each 180-byte batch would grow the segment past 200
    default = open_log(tmp_path)
    for _ in range(4):
        append(default, batch((b"k", b"v" * 100)))
    assert len(default.segments) == 1
    timed = open_log(tmp_path, segment_ms="1000")
    append(timed, batch((b"k", b"v")))
    assert not timed.maybe_roll(NOW + 999) and timed.maybe_roll(NOW + 1000)
    append(default, batch((b"k", b"v")))
    assert not default.maybe_roll(NOW + 1000)


@proves("segment.index.bytes", "index.interval.bytes")
def proof_index(tmp_path: Path, **_: Any) -> None:
    dense = open_log(tmp_path, index_interval_bytes="0")
    sparse = open_log(tmp_path)
    for _ in range(6):
        append(dense, batch((b"k", b"v" * 50)))
        append(sparse, batch((b"k", b"v" * 50)))
    assert len(dense.active_segment.offset_index) == 5  # an entry per batch after the first
    assert len(sparse.active_segment.offset_index) == 0  # 4096 bytes not reached
    tiny = open_log(tmp_path, index_interval_bytes="0", segment_index_bytes="16")
    for _ in range(6):
        append(tiny, batch((b"k", b"v" * 50)))
    assert len(tiny.segments) > 1  # a full 16-byte index (2 entries) rolls the segment


@proves("retention.ms", "retention.bytes", "cleanup.policy")
def proof_retention(tmp_path: Path, **_: Any) -> None:
    def three_segments(**config: str) -> PartitionLog:
        plog = open_log(tmp_path, segment_bytes="150", **config)
        for i in range(3):
            append(plog, batch((b"k%d" % i, b"v" * 100), timestamp=NOW - 3_600_000 + i))
        assert len(plog.segments) == 3
        return plog

    by_time = three_segments(retention_ms="60000")
    assert by_time.apply_retention(NOW) == 2 and by_time.log_start_offset == 2
    kept = three_segments()
    assert kept.apply_retention(NOW) == 0
    by_size = three_segments(retention_bytes="100")  # 3 x 170 bytes: two must go
    assert by_size.apply_retention(NOW) == 2
    compacted = three_segments(retention_ms="60000", cleanup_policy="compact")
    assert compacted.apply_retention(NOW) == 0  # compact alone: retention never deletes
    both = three_segments(retention_ms="60000", cleanup_policy="compact,delete")
    assert both.apply_retention(NOW) == 2


@proves("flush.messages", "flush.ms")
def proof_flush(tmp_path: Path, **_: Any) -> None:
    by_count = open_log(tmp_path, flush_messages="2")
    append(by_count, batch((b"k", b"v")))
    assert not by_count.needs_flush(NOW)
    append(by_count, batch((b"k", b"v")))
    assert by_count.needs_flush(NOW)
    by_age = open_log(tmp_path, flush_ms="100")
    append(by_age, batch((b"k", b"v")))
    assert not by_age.needs_flush(NOW + 99) and by_age.needs_flush(NOW + 100)
    default = open_log(tmp_path)
    append(default, batch((b"k", b"v")))
    assert not default.needs_flush(NOW + 10**9)


@proves("max.message.bytes")
def proof_max_message_bytes(tmp_path: Path, **_: Any) -> None:
    plog = open_log(tmp_path, max_message_bytes="500")
    append(plog, batch((b"k", b"v" * 300)))
    with pytest.raises(RecordTooLargeError, match=re.escape("max.message.bytes=500")):
        append(plog, batch((b"k", b"v" * 600)))
    assert plog.log_end_offset == 1


@proves("message.timestamp.type")
def proof_timestamp_type(tmp_path: Path, **_: Any) -> None:
    plog = open_log(tmp_path, message_timestamp_type="LogAppendTime")
    append(plog, batch((b"k", b"v"), timestamp=5), now=NOW + 42)
    [stored] = read_batches(plog.read(0, 1 << 20))
    assert stored.header.timestamp_type == TimestampType.LOG_APPEND_TIME
    assert stored.header.max_timestamp == NOW + 42


@proves("min.cleanable.dirty.ratio", "min.compaction.lag.ms", "max.compaction.lag.ms",
        "delete.retention.ms")
def proof_compaction(tmp_path: Path, **_: Any) -> None:
    def keyed_log(**config: str) -> PartitionLog:
        plog = open_log(tmp_path, cleanup_policy="compact", segment_bytes="150", **config)
        for i in range(6):  # two keys, three values each, a segment per batch
            append(plog, batch((b"k%d" % (i % 2), b"v%d" % i + b"x" * 90),
                               timestamp=NOW - 10_000 + i))
        append(plog, batch((b"k0", None), timestamp=NOW - 5_000))  # a tombstone
        plog.roll(NOW)  # the tombstone's segment is closed, so cleanable
        append(plog, batch((b"k9", b"active")))
        return plog

    def due(plog: PartitionLog, now: int = NOW) -> bool:
        config = plog.config
        dirty = log_dirty_state(plog, now, config.min_compaction_lag_ms, None)
        return should_clean(dirty, config.min_cleanable_dirty_ratio,
                            config.max_compaction_lag_ms, now)

    assert due(keyed_log())  # never cleaned: everything dirty, ratio 1 >= 0.5
    # min.compaction.lag.ms: records younger than an hour are never cleanable.
    assert not due(keyed_log(min_compaction_lag_ms="3600000"))
    # A ratio above 1 is never reached, but max.compaction.lag.ms forces a clean anyway.
    never = keyed_log(min_cleanable_dirty_ratio="1")
    lagging = keyed_log(min_cleanable_dirty_ratio="1", max_compaction_lag_ms="1000")
    cleaned = clean_log(never, now_ms=NOW, delete_retention_ms=86_400_000)
    assert cleaned is not None  # the first clean (ratio 1 = 1)
    append(never, batch((b"k1", b"again" + b"x" * 90), timestamp=NOW - 4_000))
    append(lagging, batch((b"k1", b"again" + b"x" * 90), timestamp=NOW - 4_000))
    clean_log(lagging, now_ms=NOW, delete_retention_ms=86_400_000)
    never.roll(NOW)
    lagging.roll(NOW)
    append(never, batch((b"k1", b"later" + b"x" * 90), timestamp=NOW - 3_000))
    append(lagging, batch((b"k1", b"later" + b"x" * 90), timestamp=NOW - 3_000))
    never.roll(NOW)
    lagging.roll(NOW)
    assert not due(never) and due(lagging)

    # delete.retention.ms: a tombstone outlives its segment's newest record by this long.
    def keys_after_two_cleans(delete_retention_ms: int) -> set[bytes | None]:
        plog = keyed_log()
        clean_log(plog, now_ms=NOW, delete_retention_ms=delete_retention_ms)
        clean_log(plog, now_ms=NOW, delete_retention_ms=delete_retention_ms)
        out = set()
        data = b"".join(p.read_bytes() for p in sorted(plog.directory.glob("*.log")))
        for b in read_batches(data):
            out |= {(r.key if r.value is not None else b"tombstone:" + (r.key or b""))
                    for r in b.records()}
        return out

    assert b"tombstone:k0" in keys_after_two_cleans(86_400_000)
    assert b"tombstone:k0" not in keys_after_two_cleans(1)


# --- topic keys: through the shared cluster and the broker's cores ----------------------------


@proves("compression.type")
def proof_compression(bootstrap: str, local_cluster: Any, **_: Any) -> None:
    topic = f"cat-codec-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 1, 1, {"compression.type": "gzip"})])
        refused_at_create(admin, {"compression.type": "brotli"}, "compression.type")
    with Producer({"bootstrap.servers": bootstrap, "acks": "all"}) as producer:
        producer.send(topic, b"plain", partition=0).result(WAIT_S)

    def stored() -> list[Compression]:
        data = b"".join(p.read_bytes() for p in
                        local_cluster.data_dir.glob(f"brokers/*/{topic}-0/*.log"))
        return [b.header.compression for b in read_batches(data)]

    assert wait_for(stored, "the batch on disk", WAIT_S) == [Compression.GZIP]


@proves("min.insync.replicas")
def proof_min_insync(bootstrap: str, tmp_path: Path, **_: Any) -> None:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        refused_at_create(admin, {"min.insync.replicas": "2"}, "min.insync.replicas",
                          "replication factor 1")
    settings = topic_settings({}, {}, {"min.insync.replicas": "2"})
    plog = PartitionLog.open(tmp_path / "isr-0", settings.log_config, now_ms=NOW)
    partition = Partition("isr", 0, 1, plog, PartitionAssignment(1, 0, (1, 2), (1,), 0),
                          min_insync_replicas=settings.min_insync_replicas)
    partition.check_produce(1)  # acks=1 does not care
    with pytest.raises(NotEnoughReplicasError, match=re.escape("min.insync.replicas=2")):
        partition.check_produce(-1)


@proves("unclean.leader.election.enable")
def proof_unclean_election(**_: Any) -> None:
    lost = state([1, 2], [1], leader=1)  # the only ISR member died; 2 is alive
    assert on_liveness_change(lost, {2}, False).leader == -1
    assert on_liveness_change(lost, {2}, True).leader == 2
    # The controller reads it from the topic, else the cluster-wide default.
    image = image_with({2: None}, MetadataEvent.put(
        K.cluster_config, ClusterConfig({"unclean.leader.election.enable": "true"}).to_json(),
        2, 2))
    assert unclean_election_allowed({}, image.cluster_config)
    assert not unclean_election_allowed({"unclean.leader.election.enable": "false"},
                                        image.cluster_config)


@proves("preallocate")
def proof_refused_values(bootstrap: str, **_: Any) -> None:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        refused_at_create(admin, {"preallocate": "true"}, "preallocate", "not supported")
        name = f"cat-defaults-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(name, 1, 1, {"preallocate": "false"})])
        assert admin.alter_configs({name: {"preallocate": "true"}},
                                   raise_on_error=False)[name].code is ErrorCode.INVALID_CONFIG
    with pytest.raises(ConfigError, match="preallocate"):
        validate_broker_config({"preallocate": "true"})


@proves("message.timestamp.difference.max.ms")
def proof_timestamp_difference(bootstrap: str, **_: Any) -> None:
    """A record an hour old is refused on a topic allowing a minute (nothing appended), taken
    on one allowing the default; LogAppendTime topics are not checked."""
    names = {setting: f"cat-ts-{uuid.uuid4().hex[:8]}" for setting in ("minute", "default",
                                                                       "append")}
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([
            NewTopic(names["minute"], 1, 1, {"message.timestamp.difference.max.ms": "60000"}),
            NewTopic(names["default"], 1, 1, {}),
            NewTopic(names["append"], 1, 1, {"message.timestamp.difference.max.ms": "60000",
                                             "message.timestamp.type": "LogAppendTime"}),
        ])
        refused_at_create(admin, {"message.timestamp.difference.max.ms": "-1"},
                          "message.timestamp.difference.max.ms")
        hour_ago = int(time.time() * 1000) - 3_600_000
        # Default retries: a new topic's leader may answer NOT_LEADER_OR_FOLLOWER for a
        # moment; INVALID_TIMESTAMP is not retriable, so it comes back at once.
        with Producer({"bootstrap.servers": bootstrap, "acks": "all"}) as p:
            p.send(names["minute"], b"now", partition=0).result(WAIT_S)
            with pytest.raises(FjordError) as caught:
                p.send(names["minute"], b"old", partition=0,
                       timestamp_ms=hour_ago).result(WAIT_S)
            assert caught.value.code is ErrorCode.INVALID_TIMESTAMP
            assert "message.timestamp.difference.max.ms=60000" in str(caught.value)
            p.send(names["default"], b"old", partition=0, timestamp_ms=hour_ago).result(WAIT_S)
            p.send(names["append"], b"old", partition=0, timestamp_ms=hour_ago).result(WAIT_S)
        tp = TopicPartition(names["minute"], 0)
        assert admin.list_offsets({tp: "latest"})[tp] == 1  # the old record was not appended


# --- broker keys ---------------------------------------------------------------------------


@proves(*sorted(READ_ONLY_BROKER_KEYS - {"auto.create.topics.enable", "log.cleaner.enable",
                                         "log.scrubber.enable", "num.partitions",
                                         "default.replication.factor",
                                         "max.records.per.user.op", "max.broker.partitions",
                                         "connections.max.reauth.ms"}))
def proof_read_only_broker_settings(bootstrap: str, **_: Any) -> None:
    """replica.* and log.retention.check.interval.ms land in the settings the broker runs
    with, and a dynamic change of any read-only key is refused (Kafka's error, all named)."""
    static = {"replica.lag.time.max.ms": "7001", "replica.fetch.wait.max.ms": "7002",
              "replica.fetch.min.bytes": "7003", "replica.fetch.max.bytes": "7004",
              "replica.fetch.response.max.bytes": "7005", "replica.fetch.backoff.ms": "7006",
              "replica.high.watermark.checkpoint.interval.ms": "7007",
              "log.retention.check.interval.ms": "7008"}
    validate_broker_config(static)
    assert ReplicationSettings.from_config(static) == ReplicationSettings(
        7001, 7002, 7003, 7004, 7005, 7006, 7007)
    assert retention_check_interval_s(static) == 7.008
    with AdminClient({"bootstrap.servers": bootstrap}) as admin, \
            pytest.raises(FjordError) as caught:
        admin.alter_broker_configs({0: dict(static)})
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    assert "Cannot update these configs dynamically" in str(caught.value)
    assert all(key in str(caught.value) for key in static)


@proves("connections.max.reauth.ms")
def proof_connections_max_reauth(bootstrap: str, **_: Any) -> None:
    """Validated (an integer >= 0, the key named), read-only, and the lifetime the SASL doors
    run with. Its effect on real processes (sessions expire, clients re-authenticate, a
    deleted user fails at the next re-authentication) is proven by
    tests/integration/test_sasl_reauth.py."""
    from fjord.security.sasl_sessions import SessionLifetime, connections_max_reauth_ms

    assert validate_broker_config({"connections.max.reauth.ms": "5000"})
    assert SessionLifetime(connections_max_reauth_ms({"connections.max.reauth.ms": "5000"})
                           ).expires_at(10.0) == 15.0
    for bad in ("-1", "soon"):
        with pytest.raises(ConfigError, match=r"^connections\.max\.reauth\.ms: "):
            validate_broker_config({"connections.max.reauth.ms": bad})
    with AdminClient({"bootstrap.servers": bootstrap}) as admin, \
            pytest.raises(FjordError) as caught:
        admin.alter_broker_configs({0: {"connections.max.reauth.ms": "1000"}})
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    assert "connections.max.reauth.ms" in str(caught.value)


@proves("auto.create.topics.enable")
def proof_auto_create(bootstrap: str, **_: Any) -> None:
    with pytest.raises(ConfigError, match=re.escape("auto.create.topics.enable")):
        validate_broker_config({"auto.create.topics.enable": "true"})
    name = f"cat-absent-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        with pytest.raises(FjordError) as caught:
            admin.describe_topics([name])
        assert caught.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert name not in admin.list_topics()


@proves("log.cleaner.enable", "log.cleaner.io.max.bytes.per.second", "log.cleaner.backoff.ms",
        "log.scrubber.enable", "log.scrubber.io.max.bytes.per.second",
        "log.scrubber.backoff.ms")
def proof_background_tasks(**_: Any) -> None:
    """Disabled tasks end at once; the rates and backoffs of the effective config (static <
    cluster default < the broker's own) are what the running tasks use, and a dynamic change
    reaches them (reconfigure, what the broker calls on every metadata change)."""
    off = {"log.cleaner.enable": "false", "log.scrubber.enable": "false"}
    cleaner = LogCleaner(None, CleanerSettings.from_config(off))  # type: ignore[arg-type]
    scrubber = Scrubber(None, ScrubberSettings.from_config(off))  # type: ignore[arg-type]

    async def both_end() -> None:
        await asyncio.wait_for(asyncio.gather(cleaner.run(), scrubber.run()), 5)

    asyncio.run(both_end())
    effective = effective_broker_config(
        {"log.cleaner.backoff.ms": "1", "log.scrubber.backoff.ms": "2"},
        {"log.cleaner.backoff.ms": "10", "log.cleaner.io.max.bytes.per.second": "20"},
        {"log.cleaner.backoff.ms": "100", "log.scrubber.io.max.bytes.per.second": "200"},
    )
    on = LogCleaner(None, CleanerSettings())  # type: ignore[arg-type]
    on.reconfigure(CleanerSettings.from_config(effective))
    assert (on.settings.backoff_ms, on.settings.io_max_bytes_per_second) == (100, 20)
    assert on._throttle.rate == 20  # the next read is throttled at the new rate
    scrub = Scrubber(None, ScrubberSettings())  # type: ignore[arg-type]
    scrub.reconfigure(ScrubberSettings.from_config(effective))
    assert (scrub.settings.backoff_ms, scrub._throttle.rate) == (2, 200)


# --- controller keys --------------------------------------------------------------------------


@proves("num.partitions", "default.replication.factor", "max.records.per.user.op",
        "max.broker.partitions")
def proof_controller_keys(bootstrap: str, **_: Any) -> None:
    config = {"num.partitions": "3", "default.replication.factor": "2",
              "max.broker.partitions": "4"}
    image = image_with({0: None, 1: None, 2: None}, MetadataEvent.put(
        K.cluster_config, ClusterConfig(config).to_json(), 2, 2))
    plan = plan_create_topic(image, TopicSpec("t"), "id", random.Random(1))
    assert len(plan.partitions) == 3
    assert all(len(s.replicas) == 2 for s in plan.partitions.values())
    with pytest.raises(PolicyViolationError, match=re.escape("max.broker.partitions")):
        check_broker_partitions(image, "t", [[0, 1]] * 5)
    with pytest.raises(PolicyViolationError, match=re.escape("max.records.per.user.op")):
        check_records_per_op({"max.records.per.user.op": "5"}, "t", 6, 5)
    check_records_per_op({"max.records.per.user.op": "5"}, "t", 5, 4)
    with AdminClient({"bootstrap.servers": bootstrap}) as admin, \
            pytest.raises(FjordError) as caught:
        admin.alter_broker_configs({None: {"num.partitions": "3"}})
    assert caught.value.code is ErrorCode.INVALID_REQUEST


@pytest.mark.parametrize("proof", sorted(set(PROOFS.values()), key=lambda f: f.__name__),
                         ids=lambda f: f.__name__)
def test_proof(proof: Callable[..., None], bootstrap: str, local_cluster: Any,
               tmp_path: Path) -> None:
    keys = sorted(k for k, f in PROOFS.items() if f is proof)
    assert keys and all(k in BY_NAME for k in keys)
    # No bound on the proof's duration: its waits are bounded and name what they wait for, and
    # how long a proof takes on a loaded machine is no part of what the key does.
    proof(bootstrap=bootstrap, local_cluster=local_cluster, tmp_path=tmp_path)


def test_catalog_order_is_stable() -> None:
    assert [k.scope for k in CATALOG] == sorted((k.scope for k in CATALOG),
                                                key=["topic", "broker", "controller"].index)


def test_kafka_listener_refuses_null_config_values(kafka_bootstrap: str, bootstrap: str) -> None:
    """A Kafka client can send a config key with a null value, which no Fjord client can:
    CreateTopics refuses the topic (Kafka's "Null value not supported for topic configs",
    INVALID_CONFIG) instead of creating it without the key; an incremental SET of null is
    refused naming the key. The other topic of the same request is created."""
    good, bad = f"cat-null-ok-{uuid.uuid4().hex[:6]}", f"cat-null-{uuid.uuid4().hex[:6]}"
    with connect(kafka_bootstrap.split(",")[0]) as sock:
        cls = CreateTopicsRequest[5]
        config = cls.CreatableTopic.CreatableTopicConfig
        answer = roundtrip(sock, cls(timeout_ms=10000, validate_only=False, topics=[
            cls.CreatableTopic(name=bad, num_partitions=1, replication_factor=1,
                               assignments=[], configs=[config(name="retention.ms", value=None)]),
            cls.CreatableTopic(name=good, num_partitions=1, replication_factor=1,
                               assignments=[], configs=[config(name="retention.ms",
                                                               value="7200000")]),
        ]), CreateTopicsResponse, 5)
        results = {t.name: (t.error_code, t.error_message) for t in answer.topics}
        assert results[bad] == (ErrorCode.INVALID_CONFIG.code,
                                "Null value not supported for topic configs: retention.ms")
        assert results[good][0] == 0
        icls = IncrementalAlterConfigsRequest[1]
        res = icls.AlterConfigsResource
        altered = roundtrip(sock, icls(validate_only=False, resources=[res(
            resource_type=2, resource_name=good, configs=[res.AlterableConfig(
                name="segment.ms", config_operation=0, value=None)])]),
            IncrementalAlterConfigsResponse, 1, correlation_id=2)
        assert altered.responses[0].error_code == ErrorCode.INVALID_CONFIG.code
        assert "segment.ms" in altered.responses[0].error_message
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        assert bad not in admin.list_topics()
        assert admin.describe_configs([good])[good]  # created, segment.ms untouched
        assert {e.name: e.source for e in admin.describe_configs([good])[good]}[
            "segment.ms"] == "DEFAULT"
