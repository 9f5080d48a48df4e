"""Issue 16 proof, authorization: one ``fjord local up --secure`` cluster with Kafka's ACL
authorizer on in every service (real processes, real mutual TLS: each principal is the CN of a
certificate the cluster CA issued; ``User:admin`` of client.properties is the super user).

Each decision of Kafka's authorizer is observed on the wire, on the gRPC door and on the SSL://
Kafka listener: no ACL (denied), allow, deny wins, prefixed pattern, super user; denials are
TOPIC_/GROUP_/CLUSTER_AUTHORIZATION_FAILED and counted in ``fjord_authorization_denials``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import confluent_kafka
import pytest

from fjord._proto import (
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
)
from fjord.client import AdminClient, NewTopic, Producer
from fjord.cluster.acl_wire import binding_to_pb, filter_to_pb
from fjord.errors import ErrorCode, FjordError, GroupAuthorizationError
from fjord.groups.lag import PartitionReset, ToEarliest
from fjord.local.certs import load_ca, write_private
from fjord.local.cluster import LocalCluster
from fjord.records import BatchBuilder
from fjord.security import ClientSecurity, SecurityProtocol, TlsFiles
from fjord.security.acls import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from fjord.testing.waiting import wait_for
from fjord.tls import open_blocking_channel
from fjord.topic_partition import TopicPartition
from tests.helpers.metrics import metric_value

pytestmark = pytest.mark.integration

TOPIC_DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED.code
GROUP_DENIED = ErrorCode.GROUP_AUTHORIZATION_FAILED.code
CLUSTER_DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED.code
Principals = dict[str, ClientSecurity]
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
Op = AclOperation


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(
        tmp_path_factory.mktemp("fjord-acls"),
        brokers=1,
        coordinators=1,
        unsafe_etcd_no_fsync=True,
        coordinator_config={"group.initial.rebalance.delay.ms": "100"},
        secure=True,
        authorization=True,
    )
    local.start()
    try:
        with AdminClient(admin_config(local)) as admin:
            admin.create_topics([NewTopic(t, 1, 1) for t in
                                 ("orders", "payments", "pay-eu", "secret", "ledger")])
        yield local
    finally:
        local.stop()


def admin_config(cluster: LocalCluster, **extra: object) -> dict[str, object]:
    return {"bootstrap.servers": cluster.bootstrap_servers, **cluster.client_config, **extra}


@pytest.fixture(scope="module")
def principals(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
               ) -> dict[str, ClientSecurity]:
    """Client certificates of the cluster's CA for User:alice and User:bob (and admin's)."""
    directory = tmp_path_factory.mktemp("principals")
    ca = load_ca(cluster.data_dir / "tls")
    ca_path = str(cluster.data_dir / "tls" / "ca.pem")
    out = {"admin": ClientSecurity.from_config(cluster.client_config)}
    for name in ("alice", "bob"):
        cert, key = ca.issue(name)
        write_private(directory / f"{name}.pem", cert)
        write_private(directory / f"{name}.key", key)
        out[name] = ClientSecurity(SecurityProtocol.SSL, TlsFiles(
            ca_path, str(directory / f"{name}.pem"), str(directory / f"{name}.key")))
    return out


def acl(kind: ResourceType, name: str, op: AclOperation, who: str,
        permission: AclPermissionType = ALLOW,
        pattern: PatternType = PatternType.LITERAL) -> AclBinding:
    return AclBinding(ResourcePattern(kind, name, pattern),
                      AccessControlEntry(f"User:{who}", "*", op, permission))


def controller(cluster: LocalCluster) -> controller_pb2_grpc.ControllerStub:
    """The active controller, dialled as the super user."""
    address = cluster.address("controller", cluster.wait_active_controller(30))
    security = ClientSecurity.from_config(cluster.client_config)
    return controller_pb2_grpc.ControllerStub(open_blocking_channel(address, security))


def add_acls(cluster: LocalCluster, *bindings: AclBinding) -> None:
    response = controller(cluster).CreateAcls(controller_pb2.CreateAclsRequest(
        creations=[binding_to_pb(b) for b in bindings]), timeout=15)
    assert [r.error.code for r in response.results] == [0] * len(bindings)


def remove_acls(cluster: LocalCluster, *bindings: AclBinding) -> None:
    filters = [AclBindingFilter(b.pattern.resource_type, b.pattern.name, b.pattern.pattern_type,
                                b.entry.principal, b.entry.host, b.entry.operation,
                                b.entry.permission) for b in bindings]
    response = controller(cluster).DeleteAcls(controller_pb2.DeleteAclsRequest(
        filters=[filter_to_pb(f) for f in filters]), timeout=15)
    assert all(r.error.code == 0 and len(r.deleted) == 1 for r in response.results)


def config_of(cluster: LocalCluster, security: ClientSecurity, **extra: object
              ) -> dict[str, object]:
    assert security.tls is not None
    return {
        "bootstrap.servers": cluster.bootstrap_servers, "security.protocol": "SSL",
        "ssl.ca.location": security.tls.ca, "ssl.certificate.location": security.tls.certificate,
        "ssl.key.location": security.tls.key, **extra,
    }


def produce_code(cluster: LocalCluster, security: ClientSecurity, topic: str) -> int:
    """The error code of one acks=all write of ``topic`` by ``security``'s principal (0: it
    was appended)."""
    with Producer(config_of(cluster, security, retries=0, **{"max.block.ms": 5000})) as producer:
        try:
            producer.send(topic, value=b"v").result(15)
        except FjordError as exc:
            return exc.code.code
    return 0


def eventually(check: Callable[[], int], expected: int, what: str) -> None:
    """ACLs reach the broker through its etcd watch: wait (bounded) until it decides so."""
    wait_for(lambda: check() == expected, what)


def denials(cluster: LocalCluster, **labels: str) -> float:
    return metric_value(cluster.metrics_address("broker", 0), "fjord_authorization_denials_total",
                        **labels)


def test_no_acl_is_denied_and_counted(cluster: LocalCluster, principals: Principals) -> None:
    # The producer asks Metadata for the topic first: Describe is refused there, as in Kafka.
    before = denials(cluster, operation="Describe", resource_type="Topic")
    assert produce_code(cluster, principals["alice"], "orders") == TOPIC_DENIED
    assert denials(cluster, operation="Describe", resource_type="Topic") > before


def test_allow_then_removed(cluster: LocalCluster, principals: Principals) -> None:
    write = acl(ResourceType.TOPIC, "orders", Op.WRITE, "alice")
    add_acls(cluster, write)
    eventually(lambda: produce_code(cluster, principals["alice"], "orders"), 0,
               "alice may write orders")
    assert produce_code(cluster, principals["bob"], "orders") == TOPIC_DENIED
    remove_acls(cluster, write)
    eventually(lambda: produce_code(cluster, principals["alice"], "orders"), TOPIC_DENIED,
               "alice may no longer write orders")


def test_prefixed_allow_and_deny_wins(cluster: LocalCluster, principals: Principals) -> None:
    add_acls(
        cluster,
        acl(ResourceType.TOPIC, "pay", Op.ALL, "alice", pattern=PatternType.PREFIXED),
        acl(ResourceType.TOPIC, "payments", Op.WRITE, "alice", DENY),
    )
    eventually(lambda: produce_code(cluster, principals["alice"], "pay-eu"), 0,
               "alice may write pay-eu (prefixed pay*)")
    assert produce_code(cluster, principals["alice"], "payments") == TOPIC_DENIED
    assert produce_code(cluster, principals["alice"], "orders") == TOPIC_DENIED  # no prefix


def test_super_user_needs_no_acl_and_a_deny_does_not_stop_it(
    cluster: LocalCluster, principals: Principals
) -> None:
    add_acls(cluster, acl(ResourceType.TOPIC, "secret", Op.ALL, "*", DENY))
    assert produce_code(cluster, principals["admin"], "secret") == 0


def test_metadata_hides_what_the_principal_may_not_describe(
    cluster: LocalCluster, principals: Principals
) -> None:
    add_acls(cluster, acl(ResourceType.TOPIC, "orders", Op.READ, "bob"))
    stub = broker_pb2_grpc.BrokerStub(
        open_blocking_channel(cluster.broker_addresses[0], principals["bob"])
    )

    def visible() -> list[str]:
        answer = stub.Metadata(broker_pb2.MetadataRequest(all_topics=True), timeout=10)
        return sorted(t.name for t in answer.topics)

    wait_for(lambda: visible() == ["orders"], "bob sees only orders (Read implies Describe)")
    named = stub.Metadata(broker_pb2.MetadataRequest(topics=["orders", "secret"]), timeout=10)
    assert {t.name: t.error.code for t in named.topics} == {"orders": 0, "secret": TOPIC_DENIED}


def create_topic_code(cluster: LocalCluster, security: ClientSecurity, name: str,
                      metadata: tuple[tuple[str, str], ...] = ()) -> int:
    address = cluster.address("controller", cluster.wait_active_controller(30))
    stub = controller_pb2_grpc.ControllerStub(open_blocking_channel(address, security))
    request = controller_pb2.CreateTopicsRequest(topics=[controller_pb2.CreatableTopic(
        name=name, num_partitions=1, replication_factor=1)], validate_only=True)
    return int(stub.CreateTopics(request, timeout=15, metadata=metadata).results[0].error.code)


def test_create_topics_needs_create_and_a_client_cannot_forward_as_another(
    cluster: LocalCluster, principals: Principals
) -> None:
    assert create_topic_code(cluster, principals["bob"], "bob-new") == TOPIC_DENIED
    # Only the cluster's services may forward a client's request: a client certificate that
    # claims to forward for the super user is still itself.
    forged = (("fjord-forwarded-principal", "User:admin"), ("fjord-forwarded-host", "x"))
    assert create_topic_code(cluster, principals["bob"], "bob-new", forged) == TOPIC_DENIED
    add_acls(cluster, acl(ResourceType.TOPIC, "bob-", Op.CREATE, "bob",
                          pattern=PatternType.PREFIXED))
    assert create_topic_code(cluster, principals["bob"], "bob-new") == 0
    assert create_topic_code(cluster, principals["bob"], "other") == TOPIC_DENIED


def test_the_kafka_listener_forwards_admin_requests_for_the_client(
    cluster: LocalCluster, principals: Principals
) -> None:
    from confluent_kafka.admin import AdminClient as KafkaAdmin
    from confluent_kafka.admin import NewTopic as KafkaNewTopic

    def kafka_conf(security: ClientSecurity) -> dict[str, object]:
        assert security.tls is not None
        return {"bootstrap.servers": cluster.kafka_bootstrap_servers,
                "security.protocol": "SSL", "ssl.ca.location": security.tls.ca,
                "ssl.certificate.location": security.tls.certificate,
                "ssl.key.location": security.tls.key}

    def create(security: ClientSecurity, name: str) -> int:
        admin = KafkaAdmin(kafka_conf(security))  # kept: its futures die with it
        futures = admin.create_topics(
            [KafkaNewTopic(name, 1, 1)], operation_timeout=10, request_timeout=15)
        try:
            futures[name].result(20)
        except confluent_kafka.KafkaException as exc:
            return int(exc.args[0].code())
        return 0

    # The broker forwards CreateTopics to the controller as the Kafka client, not as itself.
    assert create(principals["alice"], "kafka-made") == TOPIC_DENIED
    assert create(principals["admin"], "kafka-made") == 0
    producer = confluent_kafka.Producer(kafka_conf(principals["alice"]))
    errors: list[int] = []
    producer.produce("kafka-made", b"v", on_delivery=lambda err, _: errors.append(
        err.code() if err else 0))
    producer.flush(20)
    assert errors == [TOPIC_DENIED]


def test_a_consumer_group_needs_read_on_the_group_and_the_topic(
    cluster: LocalCluster, principals: Principals
) -> None:
    with Producer(admin_config(cluster)) as producer:
        producer.send("ledger", value=b"entry").result(30)
    add_acls(cluster, acl(ResourceType.TOPIC, "ledger", Op.READ, "alice"))
    tls = principals["alice"].tls
    assert tls is not None
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": cluster.kafka_bootstrap_servers, "security.protocol": "SSL",
        "ssl.ca.location": tls.ca, "ssl.certificate.location": tls.certificate,
        "ssl.key.location": tls.key, "group.id": "billing", "auto.offset.reset": "earliest",
    })
    try:
        consumer.subscribe(["ledger"])
        seen: list[int | bytes] = []

        def poll_until(wanted: Callable[[int | bytes], bool]) -> bool:
            message = consumer.poll(0.5)
            if message is not None:
                error = message.error()
                seen.append(error.code() if error else message.value())
            return any(wanted(s) for s in seen)

        wait_for(lambda: poll_until(lambda s: s == GROUP_DENIED),
                 "GROUP_AUTHORIZATION_FAILED without Read on the group")
        add_acls(cluster, acl(ResourceType.GROUP, "bill", Op.READ, "alice",
                              pattern=PatternType.PREFIXED))
        wait_for(lambda: poll_until(lambda s: s == b"entry"),
                 "the record once alice may read the group (prefixed bill*)")
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()


def test_fjord_acls_cli_adds_lists_and_removes_as_kafka_acls_sh(cluster: LocalCluster) -> None:
    from click.testing import CliRunner

    from fjord.cli.main import cli

    base = ["--bootstrap-server", cluster.bootstrap_servers,
            "--command-config", str(cluster.client_properties)]

    def run(*args: str) -> str:
        result = CliRunner().invoke(cli, ["acls", *args, *base])
        assert result.exit_code == 0, result.output
        return result.output

    added = run("--add", "--allow-principal", "User:carol", "--operation", "Read",
                "--topic", "audit", "--group", "auditors")
    assert "Added 2 ACLs." in added
    assert "(principal=User:carol, host=*, operation=READ, permissionType=ALLOW)" in added
    run("--add", "--deny-principal", "User:carol", "--operation", "Write", "--topic", "aud",
        "--resource-pattern-type", "prefixed")
    listed = run("--list", "--topic", "audit", "--resource-pattern-type", "match")
    assert "name=audit, patternType=LITERAL" in listed and "name=aud, patternType=PREFIXED" \
        in listed and "auditors" not in listed
    with AdminClient(admin_config(cluster)) as admin:
        mine = admin.describe_acls(AclBindingFilter(principal="User:carol"))
        assert {(b.pattern.name, b.entry.operation) for b in mine} == {
            ("audit", Op.READ), ("auditors", Op.READ), ("aud", Op.WRITE)}
    removed = run("--remove", "--group", "auditors")
    assert "Removed 1 ACLs." in removed
    assert "auditors" not in run("--list", "--principal", "User:carol")
    shortcut = run("--add", "--allow-principal", "User:erin", "--consumer", "--topic", "events",
                   "--group", "readers")
    assert "Added 3 ACLs." in shortcut
    with AdminClient(admin_config(cluster)) as admin:
        erin = admin.describe_acls(AclBindingFilter(principal="User:erin"))
        assert {(b.pattern.name, b.entry.operation) for b in erin} == {
            ("events", Op.READ), ("events", Op.DESCRIBE), ("readers", Op.READ)}
    assert "Added 4 ACLs." in run("--add", "--allow-principal", "User:erin", "--producer",
                                  "--idempotent", "--topic", "events")
    assert "Removed 3 ACLs." in run("--remove", "--allow-principal", "User:erin",
                                    "--consumer", "--topic", "events", "--group", "readers")
    bad = CliRunner().invoke(cli, ["acls", "--add", "--allow-principal", "User:carol",
                                   "--operation", "ClusterAction", "--topic", "audit", *base])
    assert bad.exit_code != 0 and "Topic does not take operation ClusterAction" in bad.output


def test_admin_client_acls_need_alter_on_the_cluster(
    cluster: LocalCluster, principals: Principals
) -> None:
    from fjord.errors import ClusterAuthorizationError

    with AdminClient(config_of(cluster, principals["bob"])) as bob:
        with pytest.raises(ClusterAuthorizationError):
            bob.create_acls([acl(ResourceType.TOPIC, "*", Op.ALL, "bob")])
        with pytest.raises(ClusterAuthorizationError):
            bob.describe_acls()


def test_confluent_kafka_admin_client_creates_describes_and_deletes_acls(
    cluster: LocalCluster, principals: Principals
) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AclBinding as KafkaAclBinding
    from confluent_kafka.admin import AclBindingFilter as KafkaAclBindingFilter
    from confluent_kafka.admin import AclOperation as KafkaOp
    from confluent_kafka.admin import AclPermissionType as KafkaPermission
    from confluent_kafka.admin import AdminClient as KafkaAdmin
    from confluent_kafka.admin import ResourcePatternType
    from confluent_kafka.admin import ResourceType as KafkaResourceType

    def conf(security: ClientSecurity) -> dict[str, object]:
        assert security.tls is not None
        return {"bootstrap.servers": cluster.kafka_bootstrap_servers,
                "security.protocol": "SSL", "ssl.ca.location": security.tls.ca,
                "ssl.certificate.location": security.tls.certificate,
                "ssl.key.location": security.tls.key}

    admin = KafkaAdmin(conf(principals["admin"]))
    binding = KafkaAclBinding(KafkaResourceType.TOPIC, "kafka-acl", ResourcePatternType.PREFIXED,
                              "User:dave", "*", KafkaOp.READ, KafkaPermission.ALLOW)
    for future in admin.create_acls([binding], request_timeout=15).values():
        future.result(20)
    with AdminClient(admin_config(cluster)) as fjord_admin:
        assert acl(ResourceType.TOPIC, "kafka-acl", Op.READ, "dave",
                   pattern=PatternType.PREFIXED) in fjord_admin.describe_acls()
    selector = KafkaAclBindingFilter(KafkaResourceType.ANY, None, ResourcePatternType.ANY,
                                     "User:dave", None, KafkaOp.ANY, KafkaPermission.ANY)
    found = admin.describe_acls(selector, request_timeout=15).result(20)
    assert [(b.name, b.resource_pattern_type, b.operation) for b in found] == [
        ("kafka-acl", ResourcePatternType.PREFIXED, KafkaOp.READ)]
    # Forwarded for the client: bob (no Alter on the cluster) is refused by the controller.
    bob = KafkaAdmin(conf(principals["bob"]))
    with pytest.raises(KafkaException) as refused:
        for future in bob.create_acls([binding], request_timeout=15).values():
            future.result(20)
    assert refused.value.args[0].code() == CLUSTER_DENIED
    deleted = admin.delete_acls([selector], request_timeout=15)
    assert [len(f.result(20)) for f in deleted.values()] == [1]
    assert admin.describe_acls(selector, request_timeout=15).result(20) == []


def test_grpc_offset_commit_needs_read_on_each_topic_and_a_group_deny_wins(
    cluster: LocalCluster, principals: Principals
) -> None:
    from fjord._proto import coordinator_pb2, coordinator_pb2_grpc

    add_acls(cluster,
             acl(ResourceType.GROUP, "reports", Op.READ, "bob"),
             acl(ResourceType.TOPIC, "ledger", Op.READ, "bob"))
    (address,) = cluster.coordinator_addresses.values()
    stub = coordinator_pb2_grpc.CoordinatorStub(open_blocking_channel(address, principals["bob"]))

    def commit(group: str) -> dict[str, int]:
        request = coordinator_pb2.OffsetCommitRequest(group_id=group, generation_id=-1)
        for topic in ("ledger", "secret"):
            request.topics.add(name=topic).partitions.add(partition=0, committed_offset=0)
        answer = stub.OffsetCommit(request, timeout=15)
        if answer.error.code:
            return {"group": answer.error.code}
        return {t.name: t.partitions[0].error.code for t in answer.topics}

    wait_for(lambda: commit("reports") == {"ledger": 0, "secret": TOPIC_DENIED},
             "bob commits ledger (Read) but not secret (no ACL)")
    add_acls(cluster, acl(ResourceType.GROUP, "rep", Op.ALL, "bob", DENY,
                          pattern=PatternType.PREFIXED))
    wait_for(lambda: commit("reports") == {"group": GROUP_DENIED},
             "a prefixed Deny on the group wins over the literal Read")


def coordinator_stub(cluster: LocalCluster, security: ClientSecurity) -> Any:
    from fjord._proto import coordinator_pb2_grpc

    (address,) = cluster.coordinator_addresses.values()
    return coordinator_pb2_grpc.CoordinatorStub(open_blocking_channel(address, security))


def test_a_group_of_one_principal_cannot_be_touched_by_another(
    cluster: LocalCluster, principals: Principals
) -> None:
    """alice owns group ``alice-team`` (Read, Delete); bob may read the topic but holds no ACL
    on the group: every group request of his is GROUP_AUTHORIZATION_FAILED and alice's offsets
    stay as she committed them."""
    from fjord._proto import coordinator_pb2

    group, ledger = "alice-team", TopicPartition("ledger", 0)
    add_acls(cluster,
             acl(ResourceType.GROUP, group, Op.READ, "alice"),
             acl(ResourceType.GROUP, group, Op.DELETE, "alice"),
             acl(ResourceType.TOPIC, "ledger", Op.READ, "alice"),
             acl(ResourceType.TOPIC, "ledger", Op.READ, "bob"))
    alice = AdminClient(config_of(cluster, principals["alice"]))
    bob = AdminClient(config_of(cluster, principals["bob"]))
    try:
        def alice_commits() -> bool:
            try:
                alice.alter_consumer_group_offsets(group, {ledger: 1}, timeout=10)
            except GroupAuthorizationError:
                return False  # her ACLs have not reached the coordinator yet
            return True

        wait_for(alice_commits, "alice commits offsets of her group")
        assert alice.list_consumer_group_offsets(group, timeout=10)[ledger].offset == 1
        assert alice.describe_consumer_groups([group], timeout=10)[group].state == "Empty"

        refusals: dict[str, Callable[[], object]] = {
            "OffsetFetch": lambda: bob.list_consumer_group_offsets(group, timeout=10),
            "OffsetCommit": lambda: bob.alter_consumer_group_offsets(group, {ledger: 0},
                                                                      timeout=10),
            "plan a reset": lambda: bob.plan_consumer_group_offsets_reset(
                group, ToEarliest(), topics=["ledger"], timeout=10),
            "reset offsets": lambda: bob.reset_consumer_group_offsets(
                group, [PartitionReset("ledger", 0, 1, 0)], timeout=10),
            "DescribeGroups": lambda: bob.describe_consumer_groups([group], timeout=10),
            "DeleteGroups": lambda: bob.delete_consumer_groups([group], timeout=10),
        }
        for what, call in refusals.items():
            with pytest.raises(GroupAuthorizationError):
                call()
                pytest.fail(f"bob's {what} of alice's group was served")
        assert group not in [g.group_id for g in bob.list_consumer_groups(timeout=10)]

        stub = coordinator_stub(cluster, principals["bob"])
        joined = stub.JoinGroup(coordinator_pb2.JoinGroupRequest(
            group_id=group, session_timeout_ms=10000, rebalance_timeout_ms=10000,
            protocol_type="consumer",
            protocols=[coordinator_pb2.JoinGroupProtocol(name="range", metadata=b"")]),
            timeout=15)
        assert joined.error.code == GROUP_DENIED
        for name, request in (
            ("Heartbeat", coordinator_pb2.HeartbeatRequest(group_id=group, generation_id=0,
                                                          member_id="m")),
            ("SyncGroup", coordinator_pb2.SyncGroupRequest(group_id=group, generation_id=0,
                                                          member_id="m")),
        ):
            assert getattr(stub, name)(request, timeout=15).error.code == GROUP_DENIED, name

        # Nothing of bob's reached the group: alice's commit and the group stand.
        assert alice.list_consumer_group_offsets(group, timeout=10)[ledger].offset == 1
        assert alice.delete_consumer_groups([group], timeout=10) == {group: None}
    finally:
        alice.close()
        bob.close()


def transactional_producer(cluster: LocalCluster, security: ClientSecurity, tid: str
                           ) -> Producer:
    """A transactional producer of ``tid``, initialised once its Write ACL has reached the
    coordinator (a refused init is fatal for a producer: each attempt is a new one)."""
    def attempt() -> Producer | None:
        producer = Producer(config_of(cluster, security, **{"transactional.id": tid}))
        try:
            producer.init_transactions(15)
        except FjordError as exc:
            producer.close()
            if exc.code is ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                return None
            raise
        return producer

    return wait_for(attempt, f"{tid} initialised", accept=lambda p: p is not None)


def test_a_transactional_id_of_one_principal_cannot_be_used_by_another(
    cluster: LocalCluster, principals: Principals
) -> None:
    """alice holds Write on TransactionalId ``alice-txn``; bob may write the topic but holds
    nothing on the id: he cannot find its coordinator, initialise (so fence) it, add to its
    transaction, commit offsets in it, end it, or produce transactional records for it —
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED each time, nothing written — and alice's producer
    goes on at the same epoch."""
    from fjord._proto import coordinator_pb2

    tid, orders = "alice-txn", TopicPartition("orders", 0)
    add_acls(cluster,
             acl(ResourceType.TRANSACTIONAL_ID, tid, Op.WRITE, "alice"),
             acl(ResourceType.TOPIC, "orders", Op.WRITE, "alice"),
             acl(ResourceType.TOPIC, "orders", Op.WRITE, "bob"),
             acl(ResourceType.GROUP, "bob-group", Op.READ, "bob"))
    alice = transactional_producer(cluster, principals["alice"], tid)
    try:
        alice.begin_transaction()
        alice.send("orders", value=b"alice-1", partition=0).result(15)
        idempotence = alice._accumulator.idempotence
        assert idempotence is not None
        pid, epoch = idempotence.producer_id, idempotence.producer_epoch
        txn_denied = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code
        bob = coordinator_stub(cluster, principals["bob"])
        part = common_pb2.TopicPartition(topic="orders", partition=0)
        answers = {
            "InitTransactions": bob.InitTransactions(coordinator_pb2.InitTransactionsRequest(
                transactional_id=tid, transaction_timeout_ms=60000, producer_id=-1,
                producer_epoch=-1), timeout=15).error.code,
            "AddPartitionsToTxn": bob.AddPartitionsToTxn(
                coordinator_pb2.AddPartitionsToTxnRequest(
                    transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                    partitions=[part]), timeout=15).error.code,
            "AddOffsetsToTxn": bob.AddOffsetsToTxn(coordinator_pb2.AddOffsetsToTxnRequest(
                transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                group_id="bob-group"), timeout=15).error.code,
            "TxnOffsetCommit": bob.TxnOffsetCommit(coordinator_pb2.TxnOffsetCommitRequest(
                transactional_id=tid, group_id="bob-group", producer_id=pid,
                producer_epoch=epoch, generation_id=-1), timeout=15).error.code,
            "EndTxn abort": bob.EndTxn(coordinator_pb2.EndTxnRequest(
                transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                committed=False), timeout=15).error.code,
            "EndTxn commit": bob.EndTxn(coordinator_pb2.EndTxnRequest(
                transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                committed=True), timeout=15).error.code,
        }
        assert answers == dict.fromkeys(answers, txn_denied)

        broker = broker_pb2_grpc.BrokerStub(
            open_blocking_channel(cluster.address("broker", 0), principals["bob"]))
        found = broker.FindCoordinator(broker_pb2.FindCoordinatorRequest(key=tid, key_type=1),
                                       timeout=15)
        assert found.error.code == txn_denied
        with AdminClient(admin_config(cluster)) as admin:
            end_before = admin.list_offsets({orders: "latest"}, timeout=10)[orders]
        batch = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=1,
                             is_transactional=True)
        batch.append(0, None, b"bob-forged")
        for claimed in (tid, "", "bob-txn"):
            request = broker_pb2.ProduceRequest(acks=-1, timeout_ms=15000,
                                                transactional_id=claimed)
            request.topics.add(name="orders").partitions.add(partition=0, records=batch.build())
            answer = broker.Produce(request, timeout=15)
            assert answer.topics[0].partitions[0].error.code == txn_denied, claimed

        impostor = Producer(config_of(cluster, principals["bob"], **{"transactional.id": tid}))
        with impostor, pytest.raises(FjordError) as refused:
            impostor.init_transactions(15)
        assert refused.value.code is ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED

        # alice was neither fenced nor ended: she commits, at the same epoch.
        alice.send("orders", value=b"alice-2", partition=0).result(15)
        alice.commit_transaction(15)
        assert (idempotence.producer_id, idempotence.producer_epoch) == (pid, epoch)
        with AdminClient(admin_config(cluster)) as admin:
            end_after = admin.list_offsets({orders: "latest"}, timeout=10)[orders]
        # alice's two records and her commit marker; none of bob's forged batches.
        assert end_after is not None and end_before is not None
        assert end_after == end_before + 2
    finally:
        alice.close()


def test_transactions_need_write_on_the_transactional_id(
    cluster: LocalCluster, principals: dict[str, ClientSecurity]
) -> None:
    """On the mutual-TLS cluster with ACLs: without an ACL on its transactional id alice's
    transactional producer is refused (fatal, TRANSACTIONAL_ID_AUTHORIZATION_FAILED); with
    Describe and Write on the ``ship-`` prefix and Write on the topic it commits, which also
    proves the coordinator's service identity writes the state, the markers and completes."""
    from fjord.client import Consumer, TopicPartition
    from fjord.errors import TransactionError

    alice = config_of(cluster, principals["alice"], **{"transactional.id": "ship-1"})
    refused = Producer(alice)
    try:
        with pytest.raises(TransactionError) as denied:
            refused.init_transactions(30)
        assert denied.value.fatal
        assert denied.value.code is ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    finally:
        refused.close(5)
    bindings = (
        acl(ResourceType.TRANSACTIONAL_ID, "ship-", AclOperation.WRITE, "alice",
            pattern=PatternType.PREFIXED),
        acl(ResourceType.TRANSACTIONAL_ID, "ship-", AclOperation.DESCRIBE, "alice",
            pattern=PatternType.PREFIXED),
        acl(ResourceType.TOPIC, "ledger", AclOperation.WRITE, "alice"),
    )
    add_acls(cluster, *bindings)
    try:
        def committed() -> bool:
            producer = Producer(alice)
            try:
                producer.init_transactions(30)
                producer.begin_transaction()
                producer.send("ledger", b"txn-entry", partition=0)
                producer.commit_transaction(30)
                return True
            except TransactionError as exc:  # the ACLs reach every node a moment later
                if exc.code not in (ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                    ErrorCode.TOPIC_AUTHORIZATION_FAILED):
                    raise
                return False
            finally:
                producer.close(5)

        wait_for(committed, "alice's committed transaction", 60)
        with Consumer(admin_config(cluster, **{"isolation.level": "read_committed",
                                               "auto.offset.reset": "earliest"})) as reader:
            tp = TopicPartition("ledger", 0)
            reader.assign([tp])
            values: list[bytes] = []
            wait_for(lambda: values.extend(r.value for r in reader.poll(0.5)) or
                     b"txn-entry" in values, "the committed entry", 60)
    finally:
        remove_acls(cluster, *bindings)
