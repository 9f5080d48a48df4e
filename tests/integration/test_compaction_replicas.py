"""Every replica's own cleaner gives the same result (issue 17): keyed updates and tombstones
written to a compacted RF-3 topic; the leader and both followers clean their own copies (each
broker's log cleaner, their segment boundaries need not match); once every replica's cleaner
checkpoint is past the keyed data, the three logs, read from disk after the brokers stopped,
hold the same records at the same offsets: the last value of each live key, no tombstone
(``delete.retention.ms`` 0), and the filler records after them.

Records are compared, not batches: a replica keeps the last batch of each of its segments
(emptied to its header when need be), and followers may roll segments elsewhere.

Private cluster (three brokers with a 200 ms cleaner backoff; it is stopped to read the
logs)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from fjord.client import AdminClient, NewTopic, Producer
from fjord.local import LocalCluster
from fjord.records import decode_records, read_batches
from fjord.storage import LogConfig, PartitionLog
from fjord.testing.waiting import wait_for

pytestmark = pytest.mark.integration

WAIT_S = 60.0
BROKERS = 3
KEYS = 25
UPDATES = 20
TOMBSTONED = 6
FILLERS = 150  # unique keys after the keyed data (flushed): the active segment holds them
TOPIC_CONFIG = {
    "cleanup.policy": "compact", "segment.bytes": "2048", "min.cleanable.dirty.ratio": "0.01",
    "delete.retention.ms": "0", "min.insync.replicas": "2",
}

Records = list[tuple[int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]]


def read_log(directory: Path) -> Records:
    """Every record of the (closed) log in ``directory`` with its offset."""
    log = PartitionLog.open(directory, LogConfig.from_dict(TOPIC_CONFIG))
    try:
        out: Records = []
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            data = log.read(offset, 1 << 20)
            assert data, f"{directory}: nothing read at {offset} below {log.log_end_offset}"
            out.extend((r.offset, r.key, r.value, tuple(r.headers))
                       for r in decode_records(data))
            offset = list(read_batches(data))[-1].next_offset
        return out
    finally:
        log.close()


def test_every_replica_cleans_to_the_same_records(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path, brokers=BROKERS, controllers=1, coordinators=0,
        cluster_id="compaction-replicas", unsafe_etcd_no_fsync=True,
        config={"log.cleaner.backoff.ms": "200"},
    )
    cluster.start()
    try:
        topic = f"cr-{uuid.uuid4().hex[:8]}"
        with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
            admin.create_topics([NewTopic(topic, 1, BROKERS, TOPIC_CONFIG)])
            expected: dict[bytes, tuple[int, bytes | None]] = {}
            with Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all",
                           "linger.ms": 0}) as producer:
                futures = []
                for update in range(UPDATES):
                    for k in range(KEYS):
                        key = b"key-%d" % k
                        futures.append((key, b"v-%d-%d" % (k, update),
                                        producer.send(topic, key=key,
                                                      value=b"v-%d-%d" % (k, update),
                                                      partition=0)))
                for k in range(TOMBSTONED):
                    key = b"key-%d" % (k * 3)
                    futures.append((key, None, producer.send(topic, key=key, value=None,
                                                             partition=0)))
                # The fillers go after a flush, in batches of their own: a producer whose
                # in-flight window is full grows one batch (blocked.batch.size, up to 512 KiB)
                # that could otherwise hold the last keyed records and the fillers together, in
                # the active segment, which is never cleaned. The flush also waits for every
                # follower (acks=all), so none appends the keyed tail and the fillers as one
                # fetched chunk into one segment either.
                producer.flush(WAIT_S)
                for i in range(FILLERS):
                    key = b"filler-%d" % i
                    futures.append((key, b"f" * 30,
                                    producer.send(topic, key=key, value=b"f" * 30,
                                                  partition=0)))
                producer.flush(WAIT_S)
                for key, value, future in futures:
                    expected[key] = (int(future.result(0).offset), value)
            keyed_end = KEYS * UPDATES + TOMBSTONED  # offsets below it: keys and tombstones

            def every_replica_cleaned_past_the_keys() -> bool:
                # Cleaned below the first dirty offset: at keyed_end itself when the fillers
                # came as one batch, alone in the active segment (a slow sender thread).
                found = admin.describe_log_dirs(range(BROKERS))
                replicas = [p for d in found for p in d.partitions if p.topic == topic]
                return len(replicas) == BROKERS and all(
                    p.compacted and p.cleaner_first_dirty_offset >= keyed_end for p in replicas)

            wait_for(every_replica_cleaned_past_the_keys,
                     "every replica's cleaner checkpoint past the keyed data", WAIT_S)
    finally:
        cluster.stop()
    logs = {broker: read_log(next((tmp_path / "brokers" / str(broker)).rglob(f"{topic}-0")))
            for broker in range(BROKERS)}
    # Each replica's cleaned part: the last value of each key, tombstoned keys gone.
    want = sorted((offset, key, value) for key, (offset, value) in expected.items()
                  if value is not None)
    for broker, records in logs.items():
        cleaned = [(o, k, v) for o, k, v, _ in records if o < keyed_end]
        assert cleaned == [r for r in want if r[0] < keyed_end], f"broker {broker}"
        assert [(o, k, v) for o, k, v, _ in records] == want, f"broker {broker}"
    assert logs[0] == logs[1] == logs[2]
