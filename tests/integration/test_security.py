"""Issue 16 proof, encryption and identity: one ``fjord local up --secure`` cluster (real
processes, real TLS, etcd over https with client certificates) shared by this module.

- mutual TLS works for fjord.client and confluent-kafka (gRPC and the SSL:// Kafka listener);
- refused: no certificate, a certificate of another CA, an expired one of the cluster's CA;
- a client certificate (not the cluster service identity) that forges a follower Fetch (unary
  or on the FetchStream), AlterPartition or a __consumer_offsets append gets
  CLUSTER_AUTHORIZATION_FAILED and the high watermark does not move; so does one that writes
  transaction markers (gRPC and Kafka door);
- garbage in a TLS handshake closes that connection only; the service goes on.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import grpc
import pytest
from kafka.protocol.producer.transaction import WriteTxnMarkersRequest as KafkaWriteTxnMarkers
from kafka.protocol.producer.transaction import (
    WriteTxnMarkersResponse as KafkaWriteTxnMarkersResponse,
)

from fjord._proto import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc
from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.errors import ErrorCode, KafkaTimeoutError
from fjord.groups.defaults import OFFSETS_TOPIC
from fjord.local.certs import load_ca, make_ca, write_private
from fjord.local.cluster import LocalCluster
from fjord.security import ClientSecurity, SecurityProtocol, TlsFiles
from fjord.testing.waiting import wait_for
from fjord.tls import client_ssl_context, open_blocking_channel
from tests.helpers.kafka_wire import connect, roundtrip

CLUSTER_AUTHORIZATION_FAILED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(
        tmp_path_factory.mktemp("fjord-secure"),
        brokers=2,
        coordinators=1,
        unsafe_etcd_no_fsync=True,
        coordinator_config={"group.initial.rebalance.delay.ms": "100"},
        secure=True,
        # The forged-fetch test stops a follower (SIGSTOP) for a moment: on a loaded machine
        # that moment must not cost the follower its registration or its ISR place, or the
        # high watermark would move for that reason instead of the one tested.
        broker_lease_ttl_s=30,
        config={"replica.lag.time.max.ms": "30000"},
    )
    local.start()
    try:
        yield local
    finally:
        local.stop()


def client_config(cluster: LocalCluster, **extra: object) -> dict[str, object]:
    return {"bootstrap.servers": cluster.bootstrap_servers, **cluster.client_config, **extra}


def admin_security(cluster: LocalCluster) -> ClientSecurity:
    return ClientSecurity.from_config(cluster.client_config)


def create_topic(cluster: LocalCluster, name: str, replication_factor: int = 2) -> None:
    with AdminClient(client_config(cluster)) as admin:
        admin.create_topics([NewTopic(name, 1, replication_factor)])


def test_fjord_client_produces_and_consumes_over_mutual_tls(cluster: LocalCluster) -> None:
    create_topic(cluster, "tls-fjord")
    with Producer(client_config(cluster)) as producer:
        for i in range(20):
            producer.send("tls-fjord", value=b"v%d" % i)
        producer.flush(30)
    consumer = Consumer(
        client_config(cluster, **{"group.id": "tls-g", "auto.offset.reset": "earliest"})
    )
    try:
        consumer.subscribe(["tls-fjord"])
        got: list[bytes] = []
        wait_for(lambda: got.extend(r.value for r in consumer.poll(0.5)) or len(got) >= 20,
                 "20 records read back over TLS")
        assert sorted(got) == sorted(b"v%d" % i for i in range(20))
        consumer.commit()
    finally:
        consumer.close()


def test_confluent_kafka_with_ssl_and_a_client_certificate(cluster: LocalCluster) -> None:
    create_topic(cluster, "tls-kafka")
    conf = {"bootstrap.servers": cluster.kafka_bootstrap_servers, **cluster.client_config}
    producer = confluent_kafka.Producer(conf)
    for i in range(10):
        producer.produce("tls-kafka", b"k%d" % i)
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer(
        {**conf, "group.id": "tls-kafka-g", "auto.offset.reset": "earliest"}
    )
    try:
        consumer.subscribe(["tls-kafka"])
        got: list[bytes] = []

        def poll() -> bool:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())
            return len(got) >= 10

        wait_for(poll, "10 records through the SSL:// Kafka listener")
        assert sorted(got) == sorted(b"k%d" % i for i in range(10))
    finally:
        consumer.close()


def _write_cert(directory: Path, name: str, cert: bytes, key: bytes) -> TlsFiles:
    directory.mkdir(exist_ok=True)
    write_private(directory / f"{name}.pem", cert)
    write_private(directory / f"{name}.key", key)
    return TlsFiles(None, str(directory / f"{name}.pem"), str(directory / f"{name}.key"))


def _bad_clients(cluster: LocalCluster, tmp_path: Path) -> dict[str, ClientSecurity]:
    ca_path = str(cluster.data_dir / "tls" / "ca.pem")
    other = _write_cert(tmp_path, "mallory", *make_ca("another CA").issue("mallory"))
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)
    expired = _write_cert(
        tmp_path, "expired",
        *load_ca(cluster.data_dir / "tls").issue(
            "expired", not_before=past - datetime.timedelta(days=1), not_after=past
        ),
    )
    ssl_ = SecurityProtocol.SSL
    return {
        "no certificate": ClientSecurity(ssl_, TlsFiles(ca_path)),
        "another CA": ClientSecurity(ssl_, TlsFiles(ca_path, other.certificate, other.key)),
        "expired": ClientSecurity(ssl_, TlsFiles(ca_path, expired.certificate, expired.key)),
        "plaintext": ClientSecurity(),
    }


def test_refused_without_a_valid_client_certificate(cluster: LocalCluster, tmp_path: Path) -> None:
    broker = cluster.broker_addresses[0]
    kafka_host, _, kafka_port = cluster.kafka_broker_addresses[0].rpartition(":")
    for what, security in _bad_clients(cluster, tmp_path).items():
        request = broker_pb2.MetadataRequest(all_topics=True)
        with (
            open_blocking_channel(broker, security) as channel,
            pytest.raises(grpc.RpcError) as info,
        ):
            broker_pb2_grpc.BrokerStub(channel).Metadata(request, timeout=5)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE, what
        if not security.uses_tls:
            continue
        assert security.tls is not None
        context = ssl.create_default_context(cafile=security.tls.ca)
        if security.tls.certificate and security.tls.key:
            context.load_cert_chain(security.tls.certificate, security.tls.key)
        # The Kafka listener ends the handshake (TLS 1.3: the first read) with an alert.
        with (
            pytest.raises((ssl.SSLError, ConnectionError)),
            socket.create_connection((kafka_host, int(kafka_port)), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=kafka_host) as tls,
        ):
            tls.sendall(b"\x00\x00\x00\x00")
            if not tls.recv(1):
                raise ConnectionError("closed")
    # The fjord client with the right CA but no certificate gives up with a typed error.
    config = client_config(cluster, **{"request.timeout.ms": 2000, "default.api.timeout.ms": 4000})
    del config["ssl.certificate.location"], config["ssl.key.location"]
    with AdminClient(config) as admin, pytest.raises(KafkaTimeoutError, match="UNAVAILABLE"):
        admin.list_topics()


def _leader_and_follower(cluster: LocalCluster, topic: str) -> tuple[int, int, int]:
    """(leader id, follower id, leader epoch) of ``topic``-0 once it has two in-sync replicas."""

    def state() -> tuple[int, int, int] | None:
        response = cluster.broker_metadata(0)
        for t in response.topics if response else ():
            for p in t.partitions if t.name == topic else ():
                if p.leader >= 0 and len(p.isr) == 2:
                    follower = next(r for r in p.replicas if r != p.leader)
                    return p.leader, follower, p.leader_epoch
        return None

    found = wait_for(state, f"{topic}-0 with a leader and two in-sync replicas")
    assert found is not None
    return found


def test_a_client_certificate_cannot_act_as_a_broker(cluster: LocalCluster) -> None:
    topic = "tls-forged"
    create_topic(cluster, topic)
    leader, follower, leader_epoch = _leader_and_follower(cluster, topic)
    tp = TopicPartition(topic, 0)
    with Producer(client_config(cluster)) as producer:
        producer.send(topic, value=b"acked by both").result(30)
    consumer = Consumer(client_config(cluster))
    acks_one = Producer(client_config(cluster, acks=1))
    follower_process = cluster.process("broker", follower)
    try:
        acks_one.partitions_for(topic)  # connected, metadata known: a short stop below
        high_watermark = consumer.end_offsets([tp])[tp]
        assert high_watermark == 1
        # The follower stops fetching (SIGSTOP, shorter than its lease and the ISR lag bound):
        # a record acknowledged by the leader alone is above the high watermark.
        os.kill(follower_process.pid, signal.SIGSTOP)
        try:
            acks_one.send(topic, value=b"leader only").result(10)
            security = admin_security(cluster)
            with open_blocking_channel(cluster.address("broker", leader), security) as channel:
                fetch = broker_pb2.FetchRequest(
                    replica_id=follower, max_wait_ms=0, max_bytes=1 << 20
                )
                fetch.topics.add(name=topic).partitions.add(
                    partition=0, fetch_offset=2, partition_max_bytes=1 << 20,
                    current_leader_epoch=leader_epoch, last_fetched_epoch=leader_epoch,
                )
                answer = broker_pb2_grpc.BrokerStub(channel).Fetch(fetch, timeout=5)
                assert answer.error.code == CLUSTER_AUTHORIZATION_FAILED
                assert not answer.topics
                # The same on the FetchStream the real followers use: checked per request.
                streamed = list(broker_pb2_grpc.BrokerStub(channel).FetchStream(
                    iter([fetch, fetch]), timeout=5
                ))
                assert [a.error.code for a in streamed] == [CLUSTER_AUTHORIZATION_FAILED] * 2
                assert not any(a.topics for a in streamed)
                append = broker_pb2.ProduceRequest(acks=-1, timeout_ms=5000)
                append.topics.add(name=OFFSETS_TOPIC).partitions.add(
                    partition=0, records=b"", coordinator_epoch=1 << 30
                )
                produced = broker_pb2_grpc.BrokerStub(channel).Produce(append, timeout=5)
                codes = {p.error.code for t in produced.topics for p in t.partitions}
                assert codes == {CLUSTER_AUTHORIZATION_FAILED}
            assert consumer.end_offsets([tp])[tp] == high_watermark, "the high watermark moved"
            controller = cluster.wait_active_controller(10)
            with open_blocking_channel(cluster.address("controller", controller), security) as ch:
                alter = controller_pb2.AlterPartitionRequest(broker_id=leader, broker_epoch=1)
                alter.partitions.add(
                    topic=topic, partition=0, leader_epoch=leader_epoch, new_isr=[leader]
                )
                refused = controller_pb2_grpc.ControllerStub(ch).AlterPartition(alter, timeout=5)
                assert refused.error.code == CLUSTER_AUTHORIZATION_FAILED
                ids = controller_pb2.AllocateProducerIdsRequest(broker_id=leader, broker_epoch=1)
                allocated = controller_pb2_grpc.ControllerStub(ch).AllocateProducerIds(
                    ids, timeout=5
                )
                assert allocated.error.code == CLUSTER_AUTHORIZATION_FAILED
        finally:
            os.kill(follower_process.pid, signal.SIGCONT)
        # The real follower (the cluster service identity) moves it.
        wait_for(lambda: consumer.end_offsets([tp])[tp] == 2, "the follower's fetch moves the HW")
    finally:
        acks_one.close()
        consumer.close()


def test_garbage_in_a_tls_handshake_closes_only_that_connection(cluster: LocalCluster) -> None:
    targets = [cluster.broker_addresses[0], cluster.kafka_broker_addresses[0],
               cluster.address("controller", 0)]
    for target in targets:
        host, _, port = target.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.sendall(b"\x16\x03\x01\x00\x05garbage that is no ClientHello" * 10)
            raw.settimeout(10)
            try:
                while raw.recv(4096):  # an alert, then the close
                    pass
            except ConnectionError:
                pass
    create_topic(cluster, "tls-after-garbage", replication_factor=1)
    with Producer(client_config(cluster)) as producer:
        assert producer.send("tls-after-garbage", value=b"still serving").result(30).offset == 0


def test_fjord_commands_take_kafkas_command_config(cluster: LocalCluster, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fjord.cli.main import cli

    props = str(cluster.client_properties)
    bootstrap = ["--bootstrap-server", cluster.bootstrap_servers]

    def run(*args: str, input: str | None = None) -> Any:
        return CliRunner().invoke(cli, [*args, *bootstrap], input=input)

    created = run("topics", "create", "--topic", "tls-cli", "--partitions", "1",
                  "--replication-factor", "1", "--command-config", props)
    assert created.exit_code == 0, created.output
    produced = run("produce", "--topic", "tls-cli", "--command-config", props, input="one\ntwo\n")
    assert produced.exit_code == 0, produced.output
    consumed = run("consume", "--topic", "tls-cli", "--from-beginning", "--max-messages", "2",
                   "--command-config", props)
    assert consumed.exit_code == 0 and consumed.output.split()[:2] == ["one", "two"], (
        consumed.output
    )
    listed = run("topics", "list", "--command-config", props)
    assert "tls-cli" in listed.output
    bad = tmp_path / "bad.properties"
    bad.write_text("security.protocol=SASL_SSL\n")
    refused = run("topics", "list", "--command-config", str(bad))
    # SASL without its login settings is refused, naming the missing key.
    assert refused.exit_code != 0 and "sasl.mechanism" in refused.output
    broken = tmp_path / "broken.properties"
    broken.write_text("no separator here\n")
    unreadable = run("topics", "list", "--command-config", str(broken))
    assert unreadable.exit_code == 2 and "line 1" in unreadable.output


def test_a_client_certificate_cannot_write_transaction_markers(cluster: LocalCluster) -> None:
    """WriteTxnMarkers is the transaction coordinator's (the service identity): a client
    certificate is refused on the gRPC door and on the SSL:// Kafka door, nothing written."""
    topic = "tls-markers"
    create_topic(cluster, topic)
    leader, _, _ = _leader_and_follower(cluster, topic)
    tp = TopicPartition(topic, 0)
    consumer = Consumer(client_config(cluster))
    try:
        end = consumer.end_offsets([tp])[tp]
        security = admin_security(cluster)
        with open_blocking_channel(cluster.address("broker", leader), security) as channel:
            request = broker_pb2.WriteTxnMarkersRequest()
            request.markers.add(producer_id=77, producer_epoch=0, committed=False,
                                coordinator_epoch=0).partitions.add(topic=topic, partition=0)
            answer = broker_pb2_grpc.BrokerStub(channel).WriteTxnMarkers(request, timeout=10)
            assert [p.error.code for p in answer.markers[0].partitions] == [
                CLUSTER_AUTHORIZATION_FAILED
            ]
        cls = KafkaWriteTxnMarkers[1]
        marker = cls.WritableTxnMarker(
            producer_id=77, producer_epoch=0, transaction_result=False, coordinator_epoch=0,
            topics=[cls.WritableTxnMarker.WritableTxnMarkerTopic(name=topic,
                                                                 partition_indexes=[0])],
        )
        context = client_ssl_context(security)
        address = cluster.kafka_broker_addresses[leader]
        with context.wrap_socket(connect(address), server_hostname=address.rpartition(":")[0]) \
                as sock:
            answer = roundtrip(sock, cls(markers=[marker]), KafkaWriteTxnMarkersResponse, 1)
        assert answer.markers[0].topics[0].partitions[0].error_code == (
            CLUSTER_AUTHORIZATION_FAILED
        )
        assert consumer.end_offsets([tp])[tp] == end  # nothing was appended
    finally:
        consumer.close()
