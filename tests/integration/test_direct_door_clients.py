"""Clients and followers through the brokers' direct doors (docs/direct-door.md), on the shared
local cluster (its brokers open doors: it is not secured).

Which way the records went is observed, not assumed: on the clients, the door connections'
answers and no gRPC stream opened; on the brokers, the door's open Fetch connections in
``fjord_broker_open_streams`` (method ``fjord.direct/Fetch``), which the followers hold on
their leaders. FJORD_DIRECT_DOOR=0 sends the same records over gRPC.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest

from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.client.network import Network
from fjord.direct_client import DIRECT_DOOR_ENV
from fjord.local.cluster import LocalCluster
from fjord.testing.waiting import wait_for
from tests.helpers.metrics import metric_value

pytestmark = pytest.mark.integration

WAIT_S = 30.0
RECORDS = 200


@pytest.fixture(scope="module")
def admin(bootstrap: str) -> Iterator[AdminClient]:
    client = AdminClient({"bootstrap.servers": bootstrap, "default.api.timeout.ms": 20000})
    yield client
    client.close()


@pytest.fixture(autouse=True)
def bare_clients(no_global_instrumentation: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Doors on, whatever the environment says, and no instrumentation (an instrumented
    client keeps to gRPC calls: a span per call)."""
    monkeypatch.delenv(DIRECT_DOOR_ENV, raising=False)


def replicated_topic(admin: AdminClient) -> str:
    name = f"door-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(name, 3, 3, {"min.insync.replicas": "2"})])
    return name


def door_answers(network: Network, method: str) -> int:
    return sum(c.answers for (_, m), c in network.door_connections().items() if m == method)


def grpc_streams(network: Network) -> list[tuple[str, str]]:
    return list(network._streams)


def round_trip(bootstrap: str, topic: str) -> tuple[dict[str, object], dict[str, object]]:
    """RECORDS acks=all records produced and consumed back; what the producer's and the
    consumer's networks saw, read before they closed (closing forgets the connections)."""

    def seen_by(network: Network, method: str) -> dict[str, object]:
        return {"doors on": network.direct_doors, "door answers": door_answers(network, method),
                "grpc streams": grpc_streams(network)}

    with Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 1,
                   "enable.idempotence": True}) as producer:
        futures = [producer.send(topic, key=str(i % 7).encode(), value=str(i).encode())
                   for i in range(RECORDS)]
        producer.flush(timeout=WAIT_S)
        assert all(f.exception(0) is None for f in futures)
        produced = seen_by(producer._network, "Produce")
    consumer = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"})
    try:
        partitions = wait_for(lambda: consumer.partitions_for_topic(topic),
                              "the topic's partitions", WAIT_S)
        consumer.assign([TopicPartition(topic, p) for p in sorted(partitions)])
        seen: list[bytes] = []

        def all_read() -> bool:
            for record in consumer.poll(0.2):
                assert record.value is not None
                seen.append(record.value)
            return len(seen) >= RECORDS

        wait_for(all_read, f"the {RECORDS} records consumed", WAIT_S)
        assert sorted(seen, key=int) == [str(i).encode() for i in range(RECORDS)]
        consumed = seen_by(consumer._network, "Fetch")
    finally:
        consumer.close()
    return produced, consumed


def test_records_go_through_the_doors(
    bootstrap: str, admin: AdminClient, local_cluster: LocalCluster
) -> None:
    produced, consumed = round_trip(bootstrap, replicated_topic(admin))
    # Everything through the doors, no gRPC stream (Metadata and the rest stay gRPC calls).
    assert produced["doors on"] and consumed["doors on"]
    assert produced["door answers"] and consumed["door answers"], (produced, consumed)
    assert produced["grpc streams"] == [] and consumed["grpc streams"] == []


def test_followers_fetch_through_their_leaders_doors(
    bootstrap: str, admin: AdminClient, local_cluster: LocalCluster
) -> None:
    """Each leader of a 3x3 topic's partitions holds door Fetch connections from its two
    followers once they follow (other tests' consumers may add some)."""
    topic = replicated_topic(admin)

    def leaders() -> set[int]:
        (described,) = admin.describe_topics([topic])
        found = {p.leader for p in described.partitions}
        return found if -1 not in found else set()

    def door_fetch_connections() -> dict[int, float]:
        return {b: metric_value(local_cluster.metrics_address("broker", b),
                                "fjord_broker_open_streams", method="fjord.direct/Fetch")
                for b in wait_for(leaders, "the topic's leaders", WAIT_S)}

    wait_for(door_fetch_connections, "two followers on each leader's door", WAIT_S,
             accept=lambda counts: all(c >= 2 for c in counts.values()))


def test_doors_turned_off_send_the_records_over_grpc(
    bootstrap: str, admin: AdminClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DIRECT_DOOR_ENV, "0")
    produced, consumed = round_trip(bootstrap, replicated_topic(admin))
    assert not produced["doors on"] and not consumed["doors on"]
    assert produced["door answers"] == 0 and consumed["door answers"] == 0
    assert produced["grpc streams"] and consumed["grpc streams"], (produced, consumed)


def test_clients_closing_with_requests_on_the_doors_leave_no_error(
    bootstrap: str, admin: AdminClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Consumers closed with a Fetch parked on a door and producers closed right after their
    last Produce, while another client (the module's AdminClient) keeps its loop running:
    nothing is logged at ERROR by either loop (a callback on a closed loop, an exception
    never retrieved)."""
    topic = replicated_topic(admin)
    tp = TopicPartition(topic, 0)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            with Producer({"bootstrap.servers": bootstrap, "acks": "all"}) as producer:
                producer.send(topic, value=b"v", partition=0).result(timeout=WAIT_S)
                assert door_answers(producer._network, "Produce") >= 1
            consumer = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "latest",
                                 "fetch.max.wait.ms": 5000})
            try:
                consumer.assign([tp])
                consumer.poll(0.3)  # nothing new: its Fetch is parked on the leader
                network = consumer._network
                wait_for(lambda n=network: bool(n.door_connections()), "a fetch on the door",
                         WAIT_S)
            finally:
                consumer.close()
        admin.describe_topics([topic])  # the other client's loop still serves
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
