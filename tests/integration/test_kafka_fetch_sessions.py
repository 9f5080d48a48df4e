"""Kafka's incremental fetch sessions (KIP-227) on the Kafka listener, against the shared local
cluster: raw FetchRequest v12 frames (a full fetch opens a session; an incremental one names
only changed partitions and is answered only with news; a wrong epoch, an unknown session and
epoch -1 behave as Kafka's), and kafka-python's consumer, which uses sessions, reading several
partitions while they are written."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kafka import KafkaConsumer
from kafka import TopicPartition as KPTopicPartition
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse

from fjord.client import AdminClient, NewTopic, Producer
from fjord.testing.waiting import wait_for
from tests.helpers.kafka_wire import connect as _connect
from tests.helpers.kafka_wire import roundtrip as _roundtrip
from tests.helpers.kafka_wire import wait_for_topic as _wait_for_topic

pytestmark = pytest.mark.integration

WAIT_S = 30.0
VERSION = 12
FETCH = FetchRequest[VERSION]


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> Any:
    client = AdminClient({"bootstrap.servers": bootstrap, "default.api.timeout.ms": 20000})
    yield client
    client.close()


def fetch(sock: Any, session_id: int, epoch: int, offsets: dict[tuple[str, int], int],
          forgotten: dict[str, list[int]] | None = None, max_wait_ms: int = 0) -> Any:
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        by_topic.setdefault(topic, []).append(FETCH.FetchTopic.FetchPartition(
            partition=partition, fetch_offset=offset, partition_max_bytes=1 << 20,
            current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1))
    request = FETCH(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
        isolation_level=0, session_id=session_id, session_epoch=epoch,
        topics=[FETCH.FetchTopic(topic=t, partitions=ps) for t, ps in by_topic.items()],
        forgotten_topics_data=[FETCH.ForgottenTopic(topic=t, partitions=ps)
                               for t, ps in (forgotten or {}).items()],
        rack_id="",
    )
    return _roundtrip(sock, request, FetchResponse, VERSION)


def answered(response: Any) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(topic, partition) -> (error, high watermark, records in the answer)."""
    return {
        (t.topic, p.partition_index): (p.error_code, p.high_watermark,
                                       bytes(p.records or b"").count(b"value"))
        for t in response.responses
        for p in t.partitions
    }


def produce(bootstrap: str, topic: str, partition: int, n: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    try:
        for i in range(n):
            producer.send(topic, value=f"value {i}".encode(), partition=partition)
        producer.flush()
    finally:
        producer.close()


def test_raw_session_answers_only_news(local_cluster: Any, bootstrap: str,
                                       admin: AdminClient) -> None:
    topic = f"sess-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 6, 1, {})])
    described = admin.describe_topics([topic])[0]
    leader = described.partitions[0].leader
    mine = [p.partition for p in described.partitions if p.leader == leader]
    for partition in mine:
        produce(bootstrap, topic, partition, 2)
    offsets = {(topic, p): 0 for p in mine}
    with _connect(local_cluster.kafka_broker_addresses[leader]) as sock:
        _wait_for_topic(sock, topic, 6)
        opened = fetch(sock, 0, 0, offsets)
        assert opened.error_code == 0 and opened.session_id != 0
        assert answered(opened) == {k: (0, 2, 2) for k in offsets}  # full: every partition
        session = opened.session_id
        offsets = dict.fromkeys(offsets, 2)
        # Positions moved, nothing new: the incremental answer is empty.
        moved = fetch(sock, session, 1, offsets)
        assert (moved.error_code, moved.session_id, answered(moved)) == (0, session, {})
        assert answered(fetch(sock, session, 2, {})) == {}
        # News on one partition: only it is answered (long poll woken by the append).
        produce(bootstrap, topic, mine[0], 3)
        news = fetch(sock, session, 3, {}, max_wait_ms=5000)
        assert answered(news) == {(topic, mine[0]): (0, 5, 3)}
        # A forgotten partition is no longer answered, whatever happens to it.
        if len(mine) > 1:
            assert answered(fetch(sock, session, 4, {(topic, mine[0]): 5},
                                  forgotten={topic: [mine[1]]})) == {}
            produce(bootstrap, topic, mine[1], 1)
            assert answered(fetch(sock, session, 5, {})) == {}
            epoch = 6
        else:
            epoch = 4
        # Kafka's session errors: a wrong epoch, an unknown session.
        wrong = fetch(sock, session, epoch + 7, {})
        assert (wrong.error_code, wrong.responses) == (71, [])  # INVALID_FETCH_SESSION_EPOCH
        unknown = fetch(sock, session + 1 if session < 2**31 - 1 else 1, 1, {})
        assert unknown.error_code == 70  # FETCH_SESSION_ID_NOT_FOUND
        # Epoch -1 closes the session: a sessionless full answer; the id is gone after.
        closed = fetch(sock, session, -1, {(topic, mine[0]): 0})
        assert closed.session_id == 0 and answered(closed) == {(topic, mine[0]): (0, 5, 5)}
        assert fetch(sock, session, epoch, {}).error_code == 70


def test_kafka_python_consumer_reads_partitions_written_while_it_polls(
    kafka_bootstrap: str, bootstrap: str, admin: AdminClient
) -> None:
    """kafka-python (which fetches in sessions) reads every record of 4 partitions written
    in waves while it polls, in order per partition."""
    topic = f"sess-kp-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 4, 1, {})])
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=200)
    got: dict[int, list[bytes]] = {p: [] for p in range(4)}
    expected: dict[int, list[bytes]] = {p: [] for p in range(4)}
    try:
        consumer.assign([KPTopicPartition(topic, p) for p in range(4)])
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        try:
            for wave in range(4):
                for partition in ((wave,) if wave < 3 else range(4)):
                    for i in range(5):
                        value = f"w{wave}p{partition}i{i}".encode()
                        producer.send(topic, value=value, partition=partition)
                        expected[partition].append(value)
                producer.flush()
                total = sum(len(v) for v in expected.values())

                def caught_up(total: int = total) -> bool:
                    for tp, records in consumer.poll(timeout_ms=200).items():
                        got[tp.partition].extend(r.value for r in records)
                    return sum(len(v) for v in got.values()) >= total

                wait_for(caught_up, f"wave {wave} read", WAIT_S)
        finally:
            producer.close()
    finally:
        consumer.close()
    assert got == expected
