"""The fjord source and sink against a secure cluster (issue 16's Spark bullet): mutual TLS
settings, and SASL SCRAM settings (the services' SASL gRPC doors), given as Spark's
``kafka.``-prefixed options reach every client the source and sink open (driver and tasks),
and a read and a write succeed; without them the query fails with the
client's error instead of hanging. And a job of fjord_jobs (orders -> shipments, exactly once) run
through its command line with ``--command-config`` as the Kubernetes manifests run it: connected
as its FjordUser (spark/k8s/fjorduser-orders-shipments.yaml: a certificate of the cluster CA,
the operator's client.properties, exactly the user's ACLs). A private ``fjord local up --secure``
cluster with authorization on for this module; the shared ``local[2]`` session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fjord.client import AdminClient, NewTopic, Producer
from fjord.errors import ErrorCode, FjordError
from fjord.local.certs import load_ca
from fjord.local.cluster import LocalCluster
from fjord.security.acls import (
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from fjord.security.scram import UserScramCredentialUpsertion
from fjord.testing.waiting import wait_for
from fjord_jobs import orders_shipments
from tests.helpers.spark import SPARK_WAIT_S, order, produce, read_all, send_orders

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(
        tmp_path_factory.mktemp("fjord-spark-secure"),
        brokers=1,
        coordinators=1,
        unsafe_etcd_no_fsync=True,
        secure=True,
        authorization=True,  # the super user is the cluster's client.properties identity
        kafka_sasl=True,  # SASL gRPC doors for the SCRAM test (the SSL test uses the mTLS ports)
    )
    local.start()
    try:
        yield local
    finally:
        local.stop()


def kafka_options(cluster: LocalCluster) -> dict[str, str]:
    """The cluster's client security settings as Spark's Kafka source spells them."""
    options = {f"kafka.{k}": str(v) for k, v in cluster.client_config.items()}
    options["kafka.bootstrap.servers"] = cluster.bootstrap_servers
    return options


def test_read_and_write_over_mutual_tls(
    spark: Any, secure_cluster: LocalCluster, tmp_path: Path
) -> None:
    security = dict(secure_cluster.client_config)
    assert security["security.protocol"] == "SSL" and security["ssl.certificate.location"]
    config = {"bootstrap.servers": secure_cluster.bootstrap_servers, **security}
    with AdminClient(config) as admin:
        admin.create_topics([NewTopic("spark-tls-in", 2, 1), NewTopic("spark-tls-out", 2, 1)])
    sent = produce(secure_cluster.bootstrap_servers, "spark-tls-in", 50, **security)
    options = kafka_options(secure_cluster)

    source = spark.read.format("fjord").options(**options).option("subscribe", "spark-tls-in")
    rows = source.load().select("key", "value", "partition").collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(f"v{i}".encode() for i in range(50))

    source.load().select("key", "value", "partition").write.format("fjord").options(
        **options
    ).option("topic", "spark-tls-out").mode("append").save()
    back = spark.read.format("fjord").options(**options).option("subscribe", "spark-tls-out")
    got = sorted((r.partition, bytes(r.value)) for r in back.load().collect())
    assert got == sorted((m.partition, f"v{i}".encode()) for i, m in enumerate(sent))

    # A streaming read reporting to its group over TLS: the last batch is reported at stop.
    group = "spark-tls-group"
    query = (
        spark.readStream.format("fjord")
        .options(**options)
        .option("subscribe", "spark-tls-in")
        .option("startingOffsets", "earliest")
        .option("kafka.group.id", group)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(SPARK_WAIT_S), "AvailableNow did not finish"
    assert query.exception() is None
    with AdminClient(config) as admin:
        rows = admin.describe_consumer_group_lag(group)
    ends = {p: max(m.offset for m in sent if m.partition == p) + 1 for p in (0, 1)}
    assert {r.partition: r.current_offset for r in rows} == ends
    assert all(r.lag == 0 and r.time_lag_s == 0 for r in rows)

    plain = {k: v for k, v in options.items() if not k.startswith("kafka.ssl.")}
    with pytest.raises(Exception, match="no broker answered a Metadata request"):
        spark.read.format("fjord").options(
            **{**plain, "kafka.security.protocol": "PLAINTEXT", "kafka.request.timeout.ms": "3000"}
        ).option("subscribe", "spark-tls-in").load().collect()
    with pytest.raises(Exception, match=r"ssl\.key\.locaton' \(did you mean 'ssl\.key\.location'"):
        spark.read.format("fjord").options(**options).option("kafka.ssl.key.locaton", "/x").option(
            "subscribe", "spark-tls-in"
        ).load().collect()


def test_read_and_write_with_scram_over_the_sasl_doors(
    spark: Any, secure_cluster: LocalCluster
) -> None:
    config = {"bootstrap.servers": secure_cluster.bootstrap_servers,
              **secure_cluster.client_config}
    with AdminClient(config) as admin:
        admin.create_topics([NewTopic("spark-sasl-in", 2, 1), NewTopic("spark-sasl-out", 2, 1)])
        admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion("spark", "SCRAM-SHA-512", "spark-secret")])
        admin.create_acls([
            AclBinding(ResourcePattern(ResourceType.TOPIC, "spark-sasl-", PatternType.PREFIXED),
                       AccessControlEntry("User:spark", "*", op, AclPermissionType.ALLOW))
            for op in (AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE_CONFIGS)
        ])
    sent = produce(secure_cluster.bootstrap_servers, "spark-sasl-in", 20,
                   **secure_cluster.client_config)
    sasl = {
        "bootstrap.servers": secure_cluster.sasl_grpc_bootstrap_servers,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(secure_cluster.data_dir / "tls" / "ca.pem"),
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "spark",
        "sasl.password": "spark-secret",
    }

    def logs_in() -> bool:
        with AdminClient(sasl) as admin:
            try:
                return "spark-sasl-in" in admin.list_topics(timeout=5)
            except Exception:  # the credential has not reached the doors' processes yet
                return False

    wait_for(logs_in, "the spark user's SCRAM credential on the doors")
    options = {f"kafka.{k}": v for k, v in sasl.items()}
    source = spark.read.format("fjord").options(**options).option("subscribe", "spark-sasl-in")
    source.load().select("key", "value", "partition").write.format("fjord").options(
        **options
    ).option("topic", "spark-sasl-out").mode("append").save()
    back = spark.read.format("fjord").options(**options).option("subscribe", "spark-sasl-out")
    got = sorted((r.partition, bytes(r.value)) for r in back.load().collect())
    assert got == sorted((m.partition, f"v{i}".encode()) for i, m in enumerate(sent))

    wrong = {**options, "kafka.sasl.password": "wrong", "kafka.request.timeout.ms": "5000"}
    with pytest.raises(Exception, match=r"SASL_AUTHENTICATION_FAILED|invalid credentials"):
        spark.read.format("fjord").options(**wrong).option(
            "subscribe", "spark-sasl-in").load().collect()


def test_orders_shipments_job_runs_as_its_fjord_user(
    spark: Any, secure_cluster: LocalCluster, tmp_path: Path
) -> None:
    """The job as spark/k8s runs it on the chart's secure cluster: its FjordUser's Secret
    (a client certificate of the cluster CA, ca.crt and the operator's own client.properties,
    laid out as the Secret is mounted), exactly the ACLs of spark/k8s/fjorduser-*.yaml (read
    by the operator's parser), the job's command line with --command-config. Every order is
    shipped or dead-lettered exactly once; the user is refused what its ACLs do not grant."""
    from fjord_operator.security import user_acls, user_client_properties

    user = yaml.safe_load((ROOT / "spark/k8s/fjorduser-orders-shipments.yaml").read_text())
    name = user["metadata"]["name"]
    secret = tmp_path / "fjord-user"  # what the Secret volume holds, as the operator writes it
    secret.mkdir()
    certificate, key = load_ca(secure_cluster.data_dir / "tls").issue(name)
    (secret / "ca.crt").write_bytes((secure_cluster.data_dir / "tls" / "ca.pem").read_bytes())
    (secret / "user.crt").write_bytes(certificate)
    (secret / "user.key").write_bytes(key)
    (secret / "client.properties").write_bytes(
        user_client_properties("tls", name, None, str(secret))
    )
    admin_config = {"bootstrap.servers": secure_cluster.bootstrap_servers,
                    **secure_cluster.client_config}
    orders, shipments, dead = "orders", "shipments", "orders.dlq"  # the job's defaults
    with AdminClient(admin_config) as admin:
        admin.create_topics([NewTopic(orders, 2, 1), NewTopic(shipments, 2, 1),
                             NewTopic(dead, 1, 1), NewTopic("logs", 1, 1)])
        admin.create_acls(sorted(user_acls(name, user["spec"]), key=str))
    sent = [order("o-1", "SKU-BOOK", 2), order("o-2", "SKU-PHONE"),
            order("o-3", "SKU-NOT-STOCKED"), ("o-4", "{broken json")]
    send_orders(secure_cluster.bootstrap_servers, orders, sent, **secure_cluster.client_config)
    as_user = {"bootstrap.servers": secure_cluster.bootstrap_servers,
               "security.protocol": "SSL", "ssl.ca.location": str(secret / "ca.crt"),
               "ssl.certificate.location": str(secret / "user.crt"),
               "ssl.key.location": str(secret / "user.key")}

    def user_sees_its_acls() -> bool:  # the broker has the new ACLs in its image
        with AdminClient(as_user) as admin:
            return orders in admin.list_topics(timeout=5)

    wait_for(user_sees_its_acls, f"User:{name}'s ACLs on the broker")

    exit_code = orders_shipments.main([
        "--bootstrap-servers", secure_cluster.bootstrap_servers,
        "--command-config", str(secret / "client.properties"),
        "--checkpoint", str(tmp_path / "checkpoint"),
        "--available-now",
    ])
    assert exit_code == 0
    committed = {"isolation.level": "read_committed", **secure_cluster.client_config}
    shipped = read_all(secure_cluster.bootstrap_servers, shipments, **committed)
    assert sorted((r.key or b"").decode() for r in shipped) == ["o-1", "o-2"]
    rejected = read_all(secure_cluster.bootstrap_servers, dead, **committed)
    assert sorted((r.key or b"").decode() for r in rejected) == ["o-3", "o-4"]

    # Exactly what it needs: a topic its ACLs do not name is refused to it.
    config = {**as_user, "retries": 0, "max.block.ms": 5000}
    with Producer(config) as producer, pytest.raises(FjordError) as refused:
        producer.send("logs", value=b"x").result(15)
    assert refused.value.code is ErrorCode.TOPIC_AUTHORIZATION_FAILED
