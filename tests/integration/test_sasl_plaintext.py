"""SASL_PLAINTEXT on real processes: one ``fjord local up --sasl`` cluster without TLS (one
broker, one coordinator, one controller), so every process's SASL gRPC door is plaintext
(bind_sasl_port without a --security-config) and its Kafka listener is SASL_PLAINTEXT://.

Fjord's own Producer, Consumer (in a group) and AdminClient with
``security.protocol=SASL_PLAINTEXT`` log in with SCRAM on the doors and produce, consume,
commit and create topics; a wrong password fails with SASL_AUTHENTICATION_FAILED;
confluent-kafka logs in on the SASL_PLAINTEXT:// Kafka listener. The doors refuse calls
without a session, so every call that succeeds here went through a login. The SASL_SSL
counterparts (and the ACLs a login is checked against) are in test_sasl.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import confluent_kafka
import grpc
import pytest

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.errors import ErrorCode, FjordError
from fjord.local.cluster import LocalCluster
from fjord.security.scram import UserScramCredentialUpsertion
from fjord.testing.waiting import wait_for
from tests.helpers.sasl import door_client_config, grpc_login, sasl_grpc_channel

pytestmark = pytest.mark.integration

TOPIC = "plain-orders"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(
        tmp_path_factory.mktemp("fjord-sasl-plaintext"), brokers=1, coordinators=1,
        unsafe_etcd_no_fsync=True, kafka_sasl=True,
        coordinator_config={"group.initial.rebalance.delay.ms": "100"},
    )
    local.start()
    try:
        # The plaintext gRPC port takes anyone (no TLS, no login): the operator's way in.
        with AdminClient({"bootstrap.servers": local.bootstrap_servers}) as admin:
            admin.create_topics([NewTopic(TOPIC, 1, 1)])
            admin.alter_user_scram_credentials([
                UserScramCredentialUpsertion("alice", "SCRAM-SHA-512", "alice-secret")])
        yield local
    finally:
        local.stop()


@pytest.fixture(scope="module")
def alice(cluster: LocalCluster) -> str:
    """User alice, once every door (broker, coordinator, controller) knows her credential."""
    for role, node_id in (("broker", 0), ("coordinator", 1), ("controller", 0)):
        with sasl_grpc_channel(cluster, role, node_id) as channel:
            wait_for(lambda ch=channel: grpc_login(ch, "alice", "alice-secret").session_token,
                     f"alice's credential at the {role}'s plaintext SASL door")
    return "alice"


def _send(producer: Producer, value: bytes) -> Any:
    """The record's metadata, or None on a retriable error (the fresh leader not serving)."""
    try:
        return producer.send(TOPIC, value=value).result(15)
    except FjordError as exc:
        if exc.retriable:
            return None
        raise


def test_the_plaintext_door_refuses_calls_without_a_session(cluster: LocalCluster, alice: str
                                                           ) -> None:
    with sasl_grpc_channel(cluster) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            broker_pb2_grpc.BrokerStub(channel).Metadata(
                broker_pb2.MetadataRequest(all_topics=True), timeout=15)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED


def test_fjord_clients_produce_and_consume_in_a_group_with_sasl_plaintext(
    cluster: LocalCluster, alice: str
) -> None:
    """Metadata through a broker's door names the doors, FindCoordinator the coordinator's:
    the producer, the group consumer and the AdminClient stay on them and log in at each."""
    value = b"over-sasl-plaintext"
    with Producer(door_client_config(cluster, alice, "alice-secret")) as producer:
        written = wait_for(lambda: _send(producer, value), "a produce over the plaintext door",
                           accept=lambda r: r is not None)
    group = "g-sasl-plaintext"
    with Consumer(door_client_config(cluster, alice, "alice-secret", **{
        "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
    })) as consumer:
        consumer.subscribe([TOPIC])
        wait_for(lambda: any(r.value == value for r in consumer.poll(1.0)),
                 "alice's record through the group")
        consumer.commit()
    tp = TopicPartition(TOPIC, written.partition)
    with AdminClient(door_client_config(cluster, alice, "alice-secret")) as admin:
        committed = admin.list_consumer_group_offsets(group, [tp], timeout=15)[tp]
    assert committed is not None and committed.offset > written.offset


def test_fjord_admin_creates_a_topic_through_the_controllers_plaintext_door(
    cluster: LocalCluster, alice: str
) -> None:
    with AdminClient(door_client_config(cluster, alice, "alice-secret")) as admin:
        assert admin.create_topics([NewTopic("plain-by-sasl", 1, 1)],
                                   raise_on_error=False) == {"plain-by-sasl": None}
        assert "plain-by-sasl" in admin.list_topics(timeout=15)


def test_fjord_client_with_a_wrong_password_gets_sasl_authentication_failed(
    cluster: LocalCluster, alice: str
) -> None:
    config = door_client_config(cluster, alice, "wrong")
    with Producer({**config, "max.block.ms": 5000}) as producer, \
            pytest.raises(FjordError) as failed:
        producer.send(TOPIC, value=b"never").result(15)
    assert failed.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
    with AdminClient(config) as admin, pytest.raises(FjordError) as refused:
        admin.list_topics(timeout=15)
    assert refused.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED


def test_confluent_kafka_produces_on_the_sasl_plaintext_listener(
    cluster: LocalCluster, alice: str
) -> None:
    """A Kafka client's SCRAM login on SASL_PLAINTEXT://; a Fjord consumer on the doors reads
    the record back."""
    producer = confluent_kafka.Producer({
        "bootstrap.servers": cluster.kafka_bootstrap_servers,
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": alice, "sasl.password": "alice-secret",
    })
    delivered: list[Any] = []
    producer.produce(TOPIC, b"from-kafka-over-sasl-plaintext",
                     on_delivery=lambda err, message: delivered.append((err, message)))
    producer.flush(30)
    assert len(delivered) == 1 and delivered[0][0] is None
    message = delivered[0][1]
    tp = TopicPartition(TOPIC, message.partition())
    with Consumer(door_client_config(cluster, alice, "alice-secret",
                                     **{"enable.auto.commit": False})) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, message.offset())
        wait_for(lambda: any(r.value == b"from-kafka-over-sasl-plaintext"
                             for r in consumer.poll(1.0)),
                 "the Kafka client's record read over the plaintext door")
