"""The fjord source and sink against a secure cluster (issue 16's Spark bullet): mutual TLS
settings, and SASL SCRAM settings (the services' SASL gRPC doors), given as Spark's
``kafka.``-prefixed options reach every client the source and sink open (driver and tasks),
and a read and a write succeed; without them the query fails with the
client's error instead of hanging. A private ``fjord local up --secure`` cluster for this module;
the shared ``local[2]`` session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fjord.client import AdminClient, NewTopic
from fjord.local.cluster import LocalCluster
from fjord.security.scram import UserScramCredentialUpsertion
from fjord.testing.waiting import wait_for
from tests.helpers.spark import SPARK_WAIT_S, produce

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    local = LocalCluster(
        tmp_path_factory.mktemp("fjord-spark-secure"),
        brokers=1,
        coordinators=1,
        unsafe_etcd_no_fsync=True,
        secure=True,
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
