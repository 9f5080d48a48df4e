"""Issue 16 proof, SASL SCRAM: one ``fjord local up --secure --sasl`` cluster (real processes,
SASL_SSL:// Kafka listeners). Users are made with ``fjord users`` (kafka-configs.sh's flags);
confluent-kafka logs in with SCRAM-SHA-512 and SCRAM-SHA-256, produces and consumes; a wrong
password is refused; bad SASL input closes that connection and the listener goes on. ACLs are
on: the SASL login is the principal they check (User:alice with ACLs, User:bob without).
Brokers and coordinators also open a second Kafka door, SSL:// with client certificates
(two named listeners): each serves confluent-kafka and answers its own listener's addresses."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import grpc
import pytest
from click.testing import CliRunner, Result
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
)

from fjord._proto import broker_pb2, broker_pb2_grpc, sasl_pb2, sasl_pb2_grpc
from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.errors import ErrorCode, FjordError
from fjord.local.cluster import LocalCluster
from fjord.records import BatchBuilder
from fjord.security.acls import (
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from fjord.security.sasl_sessions import SESSION_METADATA_KEY
from fjord.security.scram import ScramCredentialInfo, UserScramCredentialUpsertion
from fjord.testing.waiting import wait_for
from tests.helpers.sasl import (
    admin_config,
    closed,
    door_client_config,
    frame,
    grpc_login,
    logs_in,
    sasl_conf,
    sasl_grpc_channel,
    tls_socket,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(
        tmp_path_factory.mktemp("fjord-sasl"), brokers=1, coordinators=1,
        unsafe_etcd_no_fsync=True, secure=True, kafka_sasl=True, authorization=True,
        coordinator_config={"group.initial.rebalance.delay.ms": "100"}, mtls_kafka_door=True,
    )
    local.start()
    try:
        with AdminClient(admin_config(local)) as admin:
            admin.create_topics([NewTopic("orders", 1, 1)])
            admin.create_acls([
                AclBinding(ResourcePattern(kind, name, PatternType.PREFIXED),
                           AccessControlEntry("User:alice", "*", AclOperation.ALL,
                                              AclPermissionType.ALLOW))
                for kind, name in ((ResourceType.TOPIC, "orders"), (ResourceType.GROUP, "g-"))
            ])
        yield local
    finally:
        local.stop()


def fjord_users(cluster: LocalCluster, *args: str) -> Result:
    from fjord.cli.main import cli

    return CliRunner().invoke(cli, [
        "users", *args, "--bootstrap-server", cluster.bootstrap_servers,
        "--command-config", str(cluster.client_properties)])


@pytest.fixture(scope="module")
def alice(cluster: LocalCluster) -> str:
    done = fjord_users(cluster, "--alter", "--entity-name", "alice", "--add-config",
                       "SCRAM-SHA-512=[iterations=8192,password=alice-secret],"
                       "SCRAM-SHA-256=[password=alice-256]")
    assert done.exit_code == 0, done.output
    assert "Completed updating config for user alice." in done.output
    wait_for(lambda: logs_in(cluster, "alice", "alice-secret"), "alice's credential on the broker")
    return "alice"


def test_fjord_users_describes_mechanisms_never_secrets(cluster: LocalCluster, alice: str
                                                        ) -> None:
    shown = fjord_users(cluster, "--describe", "--entity-name", alice)
    assert shown.exit_code == 0, shown.output
    assert shown.output.strip() == (
        "SCRAM credential configs for user-principal 'alice' are "
        "SCRAM-SHA-256=iterations=4096,SCRAM-SHA-512=iterations=8192"
    )
    with AdminClient(admin_config(cluster)) as admin:
        assert admin.describe_user_scram_credentials(["alice"]) == {"alice": [
            ScramCredentialInfo("SCRAM-SHA-256", 4096), ScramCredentialInfo("SCRAM-SHA-512", 8192)
        ]}
        with pytest.raises(FjordError) as missing:
            admin.describe_user_scram_credentials(["nobody"])
        assert missing.value.code is ErrorCode.RESOURCE_NOT_FOUND
    bad = fjord_users(cluster, "--alter", "--entity-name", "bob", "--add-config",
                      "SCRAM-SHA-512=[iterations=10,password=x]")
    assert bad.exit_code != 0 and "iterations 10 outside 4096..16384" in bad.output


@pytest.mark.parametrize("mechanism,password", [("SCRAM-SHA-512", "alice-secret"),
                                                ("SCRAM-SHA-256", "alice-256")])
def test_confluent_kafka_produces_and_consumes_with_scram(
    cluster: LocalCluster, alice: str, mechanism: str, password: str
) -> None:
    conf = sasl_conf(cluster, alice, password, mechanism)
    producer = confluent_kafka.Producer(conf)
    delivered: list[object] = []
    value = f"hello {mechanism}".encode()
    producer.produce("orders", value, on_delivery=lambda err, _m: delivered.append(err))
    producer.flush(30)
    assert delivered == [None]
    consumer = confluent_kafka.Consumer({
        **conf, "group.id": f"g-{mechanism}", "auto.offset.reset": "earliest",
    })
    try:
        consumer.subscribe(["orders"])
        seen: list[bytes] = []
        for _ in range(60):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.append(message.value())
            if value in seen:
                break
        assert value in seen
    finally:
        consumer.close()


def _metadata_nodes(conf: dict[str, object]) -> set[str]:
    """``host:port`` of every node a Metadata answer on ``conf``'s door names."""
    admin = confluent_kafka.admin.AdminClient(conf)
    return {f"{b.host}:{b.port}" for b in admin.list_topics(timeout=30).brokers.values()}


def _door_addresses(cluster: LocalCluster, door: str) -> set[str]:
    if door == "SSL":
        by_role = [cluster.mtls_kafka_addresses(r) for r in ("broker", "coordinator")]
    else:
        by_role = [cluster.kafka_broker_addresses, cluster.kafka_coordinator_addresses]
    return {address for addresses in by_role for address in addresses.values()}


def test_each_kafka_door_answers_metadata_with_its_own_listener(
    cluster: LocalCluster, alice: str
) -> None:
    mtls = {"bootstrap.servers": cluster.mtls_kafka_bootstrap_servers, **cluster.client_config}
    scram = sasl_conf(cluster, alice, "alice-secret")
    assert _metadata_nodes(mtls) == _door_addresses(cluster, "SSL")
    assert _metadata_nodes(scram) == _door_addresses(cluster, "SASL_SSL")
    assert not _door_addresses(cluster, "SSL") & _door_addresses(cluster, "SASL_SSL")


def test_confluent_kafka_produces_and_consumes_in_a_group_over_the_mtls_door(
    cluster: LocalCluster,
) -> None:
    """A client certificate (User:admin, the super user) on the SSL:// door: FindCoordinator
    must name the coordinator's SSL:// door too, or the group could not join or commit."""
    conf = {"bootstrap.servers": cluster.mtls_kafka_bootstrap_servers, **cluster.client_config}
    with AdminClient(admin_config(cluster)) as admin:
        admin.create_topics([NewTopic("orders-mtls", 1, 1)])
    producer = confluent_kafka.Producer(conf)
    delivered: list[object] = []
    producer.produce("orders-mtls", b"over mtls", on_delivery=lambda e, _m: delivered.append(e))
    producer.flush(30)
    assert delivered == [None]
    consumer = confluent_kafka.Consumer({
        **conf, "group.id": "g-mtls", "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    try:
        consumer.subscribe(["orders-mtls"])
        seen: list[bytes] = []

        def read() -> bool:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.append(message.value())
            return b"over mtls" in seen

        wait_for(read, "the record read back over the SSL:// door", timeout=60)
        committed = consumer.commit(asynchronous=False)
        assert committed is not None and all(tp.error is None for tp in committed)
    finally:
        consumer.close()


def test_wrong_password_is_refused(cluster: LocalCluster, alice: str) -> None:
    errors: list[int] = []
    producer = confluent_kafka.Producer({
        **sasl_conf(cluster, alice, "wrong"),
        "error_cb": lambda err: errors.append(err.code()), "message.timeout.ms": 5000,
    })
    delivered: list[object] = []
    producer.produce("orders", b"never", on_delivery=lambda err, _m: delivered.append(err))
    producer.flush(15)
    assert len(delivered) == 1 and delivered[0] is not None
    assert confluent_kafka.KafkaError._AUTHENTICATION in errors


def test_the_sasl_login_is_the_principal_acls_check(cluster: LocalCluster) -> None:
    with AdminClient(admin_config(cluster)) as admin:
        admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion("bob", "SCRAM-SHA-512", "bob-secret")])
    wait_for(lambda: logs_in(cluster, "bob", "bob-secret"), "bob's credential on the broker")
    producer = confluent_kafka.Producer({**sasl_conf(cluster, "bob", "bob-secret"),
                                         "message.timeout.ms": 10000})
    delivered: list[int] = []
    producer.produce("orders", b"bob", on_delivery=lambda err, _m: delivered.append(
        err.code() if err else 0))
    producer.flush(20)
    assert delivered == [ErrorCode.TOPIC_AUTHORIZATION_FAILED.code]


@pytest.mark.parametrize("bad", ["authenticate_first", "huge_frame", "metadata_first"])
def test_bad_sasl_input_closes_the_connection_and_the_listener_goes_on(
    cluster: LocalCluster, alice: str, bad: str
) -> None:
    with tls_socket(cluster) as sock:
        if bad == "authenticate_first":
            sock.sendall(frame(SaslAuthenticateRequest[2](auth_bytes=b"n,,n=alice,r=x"), 2))
        elif bad == "huge_frame":
            sock.sendall(struct.pack(">i", 10_000_000) + b"\0" * 1024)
        else:
            sock.sendall(struct.pack(">ihhih", 10, 3, 4, 1, -1) + b"\xff\xff\xff\xff")
        assert closed(sock)
    # A handshake then garbage in SaslAuthenticate: answered SASL_AUTHENTICATION_FAILED, closed.
    with tls_socket(cluster) as sock:
        sock.sendall(frame(SaslHandshakeRequest[1](mechanism="SCRAM-SHA-512"), 1))
        sock.sendall(frame(SaslAuthenticateRequest[2](auth_bytes=b"\x00garbage"), 2))
        assert closed(sock)
    # Others go on.
    test_confluent_kafka_produces_and_consumes_with_scram(
        cluster, alice, "SCRAM-SHA-512", "alice-secret")


def test_confluent_kafka_admin_alters_and_describes_scram_credentials(
    cluster: LocalCluster, alice: str
) -> None:
    from confluent_kafka.admin import AdminClient as KafkaAdmin
    from confluent_kafka.admin import (
        ScramCredentialInfo as KafkaScramInfo,
    )
    from confluent_kafka.admin import (
        ScramMechanism,
        UserScramCredentialDeletion,
    )
    from confluent_kafka.admin import (
        UserScramCredentialUpsertion as KafkaUpsertion,
    )

    with AdminClient(admin_config(cluster)) as admin:  # User:admin, the super user
        admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion("admin", "SCRAM-SHA-512", "admin-secret")])
    wait_for(lambda: logs_in(cluster, "admin", "admin-secret"), "admin's credential")
    kafka_admin = KafkaAdmin(sasl_conf(cluster, "admin", "admin-secret"))
    futures = kafka_admin.alter_user_scram_credentials([
        KafkaUpsertion("carol", KafkaScramInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                       b"carol-secret"),
        UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_256),
    ])
    futures["carol"].result(20)
    with pytest.raises(confluent_kafka.KafkaException) as missing:
        futures["nobody"].result(20)
    assert missing.value.args[0].code() == ErrorCode.RESOURCE_NOT_FOUND.code
    wait_for(lambda: logs_in(cluster, "carol", "carol-secret"), "carol's credential")
    described = kafka_admin.describe_user_scram_credentials(["carol"])["carol"].result(20)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_512, 8192)]
    # alice may not: Alter on the cluster is the super user's here.
    alice_admin = KafkaAdmin(sasl_conf(cluster, alice, "alice-secret"))
    denied = alice_admin.alter_user_scram_credentials([UserScramCredentialDeletion(
        "carol", ScramMechanism.SCRAM_SHA_512)])
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        denied["carol"].result(20)
    assert refused.value.args[0].code() == ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code


# --- The SASL gRPC door (Fjord's own SASL clients) ---------------------------------------------


def produce_on_door(channel: grpc.Channel, token: str | None, topic: str) -> int:
    builder = BatchBuilder()
    builder.append(0, None, b"over-the-sasl-door")
    request = broker_pb2.ProduceRequest(acks=-1, timeout_ms=15000)
    request.topics.add(name=topic).partitions.add(partition=0, records=builder.build())
    metadata = [(SESSION_METADATA_KEY, token)] if token is not None else []
    answer = broker_pb2_grpc.BrokerStub(channel).Produce(request, metadata=metadata, timeout=15)
    return answer.topics[0].partitions[0].error.code


def test_grpc_sasl_door_logs_in_and_the_session_is_the_principal(
    cluster: LocalCluster, alice: str
) -> None:
    with sasl_grpc_channel(cluster) as channel:
        login = grpc_login(channel, alice, "alice-secret")
        assert login.error.code == 0 and login.session_token
        token = login.session_token
        # User:alice may write orders (ACL), not ledger (no ACL): the session is the principal.
        wait_for(lambda: produce_on_door(channel, token, "orders") == 0,
                 "alice's produce over the SASL door (orders leader serving)")
        assert produce_on_door(channel, token, "ledger") == \
            ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
        assert grpc_login(channel, alice, "alice-256", "SCRAM-SHA-256").session_token

        # A session is never the service identity: a follower fetch is refused.
        fetch = broker_pb2.FetchRequest(replica_id=0, max_wait_ms=0, min_bytes=0)
        fetch.topics.add(name="orders").partitions.add(partition=0, fetch_offset=0,
                                                        partition_max_bytes=1024)
        refused = broker_pb2_grpc.BrokerStub(channel).Fetch(
            fetch, metadata=[(SESSION_METADATA_KEY, token)], timeout=15)
        assert refused.error.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code


def test_grpc_sasl_door_refuses_bad_logins_and_calls_without_a_session(
    cluster: LocalCluster, alice: str
) -> None:
    with sasl_grpc_channel(cluster) as channel:
        for user, password in ((alice, "wrong"), ("mallory", "alice-secret")):
            failed = grpc_login(channel, user, password)
            assert failed.error.code == ErrorCode.SASL_AUTHENTICATION_FAILED.code
            assert not failed.session_token
        unsupported = sasl_pb2_grpc.SaslStub(channel).Authenticate(
            iter([sasl_pb2.SaslAuthenticateRequest(mechanism="PLAIN", auth_bytes=b"\0a\0b")]),
            timeout=15)
        assert [a.error.code for a in unsupported] == \
            [ErrorCode.UNSUPPORTED_SASL_MECHANISM.code]
        # Out of order: a client-final message first; then anything after the failure.
        garbled = sasl_pb2_grpc.SaslStub(channel).Authenticate(iter([
            sasl_pb2.SaslAuthenticateRequest(mechanism="SCRAM-SHA-512",
                                             auth_bytes=b"c=biws,r=abc,p=xyz"),
            sasl_pb2.SaslAuthenticateRequest(auth_bytes=b"n,,n=alice,r=abc"),
        ]), timeout=15)
        assert [a.error.code for a in garbled] == [ErrorCode.SASL_AUTHENTICATION_FAILED.code]

        for token in (None, "", "forged-token"):
            with pytest.raises(grpc.RpcError) as unauthenticated:
                produce_on_door(channel, token, "orders")
            assert unauthenticated.value.code() is grpc.StatusCode.UNAUTHENTICATED
        # The door and a good login go on.
        assert grpc_login(channel, alice, "alice-secret").session_token


def test_fjord_client_produces_and_reads_over_the_sasl_door(
    cluster: LocalCluster, alice: str
) -> None:
    """Metadata asked through the door names the brokers' doors, so the producer and the
    consumer stay on it; ACLs see User:alice."""
    value = b"fjord-client-over-sasl"
    with Producer(door_client_config(cluster, alice, "alice-secret")) as producer:
        written = wait_for(lambda: _send(producer, value), "a produce over the SASL door",
                           accept=lambda r: r is not None)
    with Consumer(door_client_config(cluster, alice, "alice-secret",
                                     **{"enable.auto.commit": False})) as consumer:
        consumer.assign([TopicPartition("orders", written.partition)])
        consumer.seek(TopicPartition("orders", written.partition), written.offset)
        records = wait_for(lambda: consumer.poll(1.0), "alice's record read back",
                           accept=lambda polled: any(r.value == value for r in polled))
        assert any(r.value == value for r in records)


def _send(producer: Producer, value: bytes) -> Any:
    try:
        return producer.send("orders", value=value).result(15)
    except FjordError as exc:
        if exc.retriable:
            return None
        raise


def test_fjord_client_with_a_wrong_password_gets_sasl_authentication_failed(
    cluster: LocalCluster, alice: str
) -> None:
    config = door_client_config(cluster, alice, "wrong", **{"max.block.ms": 5000})
    with Producer(config) as producer, pytest.raises(FjordError) as failed:
        producer.send("orders", value=b"never").result(15)
    assert failed.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED


def test_fjord_client_consumer_group_over_the_sasl_doors(cluster: LocalCluster, alice: str
                                                         ) -> None:
    """FindCoordinator asked through a broker's door names the coordinator's door: a group
    of User:alice joins, reads and commits there, and an AdminClient on the doors reads the
    commit back."""
    value = b"grouped-over-sasl"
    with Producer(door_client_config(cluster, alice, "alice-secret")) as producer:
        written = wait_for(lambda: _send(producer, value), "a produce over the SASL door",
                           accept=lambda r: r is not None)
    group = "g-sasl-door"
    with Consumer(door_client_config(cluster, alice, "alice-secret", **{
        "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
    })) as consumer:
        consumer.subscribe(["orders"])
        wait_for(lambda: any(r.value == value for r in consumer.poll(1.0)),
                 "alice's record through the group")
        consumer.commit()
    tp = TopicPartition("orders", written.partition)
    with AdminClient(door_client_config(cluster, alice, "alice-secret")) as admin:
        committed = admin.list_consumer_group_offsets(group, [tp], timeout=15)[tp]
    assert committed is not None and committed.offset > written.offset


def test_fjord_client_transaction_over_the_sasl_doors(cluster: LocalCluster, alice: str) -> None:
    """A transactional producer of User:alice finds its transaction coordinator's door and
    commits; a read_committed consumer on the doors sees the record."""
    with AdminClient(admin_config(cluster)) as admin:
        admin.create_acls([AclBinding(
            ResourcePattern(ResourceType.TRANSACTIONAL_ID, "alice-sasl-txn", PatternType.LITERAL),
            AccessControlEntry("User:alice", "*", AclOperation.WRITE, AclPermissionType.ALLOW))])
    config = door_client_config(cluster, alice, "alice-secret",
                                **{"transactional.id": "alice-sasl-txn"})

    def initialised() -> Producer | None:
        producer = Producer(config)
        try:
            producer.init_transactions(15)
        except FjordError as exc:
            producer.close()
            if exc.code is ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                return None  # the ACL has not reached the coordinator yet
            raise
        return producer

    producer = wait_for(initialised, "alice's transactional producer initialised",
                        accept=lambda p: p is not None)
    with producer:
        producer.begin_transaction()
        written = producer.send("orders", value=b"committed-over-sasl").result(15)
        producer.commit_transaction(15)
    tp = TopicPartition("orders", written.partition)
    with Consumer(door_client_config(cluster, alice, "alice-secret", **{
        "isolation.level": "read_committed", "enable.auto.commit": False,
    })) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, written.offset)
        wait_for(lambda: any(r.value == b"committed-over-sasl" for r in consumer.poll(1.0)),
                 "the committed record under read_committed")


def test_fjord_client_admin_reaches_the_controller_over_its_sasl_door(
    cluster: LocalCluster, alice: str
) -> None:
    """Metadata through a door names the active controller's door: User:alice creates a
    topic her ACLs allow (ALL on orders*) and is refused one they do not."""
    with AdminClient(door_client_config(cluster, alice, "alice-secret")) as admin:
        created = admin.create_topics([NewTopic("orders-by-sasl", 1, 1),
                                       NewTopic("not-alices", 1, 1)], raise_on_error=False)
        assert created["orders-by-sasl"] is None
        refused = created["not-alices"]
        assert refused is not None and refused.code is ErrorCode.TOPIC_AUTHORIZATION_FAILED
        assert "orders-by-sasl" in admin.list_topics(timeout=15)


def test_fjord_commands_log_in_with_sasl_through_command_config(
    cluster: LocalCluster, alice: str, tmp_path: Path
) -> None:
    from fjord.cli.main import cli

    props = tmp_path / "alice-sasl.properties"
    props.write_text(
        "security.protocol=SASL_SSL\n"
        f"ssl.ca.location={cluster.data_dir / 'tls' / 'ca.pem'}\n"
        "sasl.mechanism=SCRAM-SHA-256\nsasl.username=alice\nsasl.password=alice-256\n")
    listed = CliRunner().invoke(cli, [
        "topics", "list", "--bootstrap-server", cluster.sasl_grpc_bootstrap_servers,
        "--command-config", str(props)])
    assert listed.exit_code == 0, listed.output
    assert "orders" in listed.output.split()
