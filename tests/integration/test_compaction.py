"""Log compaction with a real broker (issue 17): a compacted topic with small segments, many
updates to few keys and some tombstones; the broker's log cleaner (its own worker thread)
compacts it in the background, and a consumer from offset 0 then sees the last value of each
key once, the tombstoned keys gone after delete.retention.ms. A record without a key is refused
on produce (INVALID_RECORD), as Kafka refuses it.

The broker's offset map holds about ten keys (``log.cleaner.dedupe.buffer.size``), so a clean
of the dirty data takes rounds.

Private one-broker cluster (a cleaner backoff of 200 ms is not a setting to share)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from fjord.cli.main import cli
from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.errors import InvalidRecordError
from fjord.local import LocalCluster
from fjord.testing.metrics_probe import scrape_metric
from fjord.testing.waiting import wait_for

pytestmark = pytest.mark.integration

WAIT_S = 45.0
KEYS = 20
UPDATES = 30
TOMBSTONED = 5
FILLERS = 120  # unique keys written last: they fill the active segment and roll the others


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("compaction"), brokers=1, controllers=1, coordinators=0,
        cluster_id="compaction", unsafe_etcd_no_fsync=True,
        # A map of about ten keys: every clean of the dirty data takes several rounds.
        config={"log.cleaner.backoff.ms": "200", "log.cleaner.dedupe.buffer.size": "1200"},
    )
    c.start()
    yield c
    c.stop()


Read = list[tuple[int, bytes, bytes | None]]


def read_all(cluster: LocalCluster, topic: str, last_offset: int) -> Read:
    with Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                   "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got: Read = []
        wait_for(lambda: got.extend((r.offset, r.key or b"", r.value) for r in consumer.poll(0.2))
                 or (bool(got) and got[-1][0] >= last_offset), f"offset {last_offset}", WAIT_S)
    return got


def test_the_cleaner_keeps_the_last_value_per_key_and_drops_tombstones(
    cluster: LocalCluster,
) -> None:
    topic = f"c-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(topic, 1, 1, {
            "cleanup.policy": "compact", "segment.bytes": "2048",
            "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "2000",
        })])
    expected: dict[bytes, bytes | None] = {}
    with Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all",
                   "linger.ms": 0}) as producer:
        keyless = producer.send(topic, value=b"no key", partition=0)
        with pytest.raises(InvalidRecordError, match="without a key"):
            keyless.result(WAIT_S)
        for update in range(UPDATES):
            for k in range(KEYS):
                key, value = b"key-%d" % k, b"value-%d-%d" % (k, update)
                producer.send(topic, key=key, value=value, partition=0)
                expected[key] = value
        for k in range(TOMBSTONED):
            producer.send(topic, key=b"key-%d" % k, value=None, partition=0)
            expected[b"key-%d" % k] = None
        # The fillers go in batches of their own: a producer whose in-flight window is full
        # grows one batch (blocked.batch.size) that could otherwise hold the last updates and
        # the fillers together, and the active segment holding it is never cleaned (as Kafka).
        producer.flush(WAIT_S)
        last_offset = fill(producer, topic, expected, FILLERS)
    produced = KEYS * UPDATES + TOMBSTONED + FILLERS
    assert last_offset == produced - 1

    def compacted_to(want: dict[bytes, bytes | None], last: int) -> bool:
        got = read_all(cluster, topic, last)
        keys = [key for _, key, _ in got]
        offsets = [offset for offset, _, _ in got]
        seen = {k: v for _, k, v in got}
        # A tombstone may be there (within delete.retention.ms) or gone (the clean came
        # later than that, e.g. on a loaded machine); never an older value of its key.
        for key, value in want.items():
            if value is None and key not in seen:
                seen[key] = None
        return len(keys) == len(set(keys)) and offsets == sorted(offsets) and seen == want

    # The first clean: each key once with its last value (tombstones kept, unless the clean
    # came after delete.retention.ms: the unit tests pin the exact horizon).
    wait_for(lambda: compacted_to(expected, last_offset),
             "each key once with its last value", WAIT_S)
    metrics = cluster.metrics_address("broker", 0)
    # The cleaner counts a clean on the broker's event loop after its worker thread swapped
    # the cleaned segments in: a consumer may read the compacted log a moment before.
    wait_for(lambda: scrape_metric(metrics, 'fjord_broker_cleaner_cleans_total{outcome="cleaned"}')
             >= 1 and scrape_metric(metrics, "fjord_broker_cleaner_records_removed_total")
             >= KEYS * (UPDATES - 1), "the cleans and the records they removed counted", WAIT_S)
    # librdkafka reads the compacted log (gaps, rebuilt batches) through the Kafka listener.
    assert read_with_librdkafka(cluster, topic, last_offset) == read_all(cluster, topic,
                                                                         last_offset)
    # fjord log-dirs describe shows the cleaner's state of the replica.
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        (log_dir,) = admin.describe_log_dirs([0])
    (replica,) = [p for p in log_dir.partitions if p.topic == topic]
    assert replica.compacted and 0 < replica.cleaner_first_dirty_offset <= last_offset
    assert 0.0 <= replica.cleaner_dirty_ratio <= 1.0
    assert scrape_metric(metrics, "fjord_broker_cleaner_last_run_timestamp_seconds") > 0
    # The broker's map bound is in force: any clean's map of one key or more is at least a
    # tenth of 1,200 bytes (of the 128 MiB default it would be a millionth). How many rounds
    # it took depends on the producer's batching (a clean always maps its first batch whole),
    # the unit tests count them.
    assert 0.1 <= scrape_metric(metrics, "fjord_broker_cleaner_buffer_utilization") <= 1
    # So does fjord topics describe, for the partition's leader (JSON: every replica's too).
    assert_topics_describe_shows_the_cleaner(cluster, topic, last_offset)
    # A later clean (it needs dirty data, as in Kafka: more writes) after delete.retention.ms
    # (2 s past the tombstones' segment) drops them: the deleted keys are gone.
    deleted = {b"key-%d" % k for k in range(TOMBSTONED)}
    for key in deleted:
        del expected[key]
    with Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all",
                   "linger.ms": 0}) as producer:

        def tombstones_gone() -> bool:
            last = fill(producer, topic, expected, 40)
            return compacted_to(expected, last) and not deleted & {
                key for _, key, _ in read_all(cluster, topic, last)}

        wait_for(tombstones_gone, "tombstoned keys gone", WAIT_S)


def assert_topics_describe_shows_the_cleaner(
    cluster: LocalCluster, topic: str, last_offset: int
) -> None:
    def describe(*args: str) -> str:
        result = CliRunner().invoke(cli, ["topics", "describe", "--bootstrap-server",
                                          cluster.bootstrap_servers, *args])
        assert result.exit_code == 0, (result.output, result.exception)
        return result.stdout

    (described,) = json.loads(describe("--topic", topic, "-o", "json"))
    (partition,) = described["partitions"]
    cleaner = partition["cleaner"]
    assert 0 < cleaner["first_dirty_offset"] <= last_offset
    assert 0.0 <= cleaner["dirty_ratio"] <= 1.0
    assert set(cleaner["replicas"]) == {"0"}
    header, _, row = describe("--topic", topic).splitlines()[1:4]
    assert header.split()[-2:] == ["DirtyRatio", "CleanedBelow"]
    assert 0 < int(row.split()[-1]) <= last_offset
    # A topic that is not compacted has neither.
    plain = f"p-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(plain, 1, 1)])
    (described,) = json.loads(describe("--topic", plain, "-o", "json"))
    assert "cleaner" not in described["partitions"][0]
    assert "DirtyRatio" not in describe("--topic", plain)


def read_with_librdkafka(cluster: LocalCluster, topic: str, last_offset: int) -> Read:
    from confluent_kafka import Consumer as CKConsumer
    from confluent_kafka import TopicPartition as CKTopicPartition

    consumer = CKConsumer({"bootstrap.servers": cluster.kafka_bootstrap_servers,
                           "group.id": f"g-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    got: Read = []
    try:
        consumer.assign([CKTopicPartition(topic, 0, 0)])

        def step() -> bool:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                got.append((message.offset(), message.key() or b"", message.value()))
            return bool(got) and got[-1][0] >= last_offset

        wait_for(step, f"librdkafka at offset {last_offset}", WAIT_S)
    finally:
        consumer.close()
    return got


def fill(producer: Producer, topic: str, expected: dict[bytes, bytes | None], count: int) -> int:
    """Write ``count`` records with new unique keys (dirty data that also rolls segments);
    returns the last offset."""
    futures = []
    for _ in range(count):
        key, value = b"filler-%s" % uuid.uuid4().hex.encode(), b"f" * 20
        futures.append(producer.send(topic, key=key, value=value, partition=0))
        expected[key] = value
    producer.flush(WAIT_S)
    return int(futures[-1].result(0).offset)
