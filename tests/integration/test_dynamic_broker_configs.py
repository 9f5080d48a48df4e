"""Dynamic broker configs against real processes (a 2-broker cluster of this module's own: the
changes would disturb other tests' topics): ``fjord configs --entity-type brokers --alter``
per broker and ``--entity-default``, and confluent-kafka's AdminClient through the Kafka
listener (Incremental/AlterConfigs, DescribeConfigs of BROKER resources). Each change takes
effect without a restart (message.max.bytes refuses a produce, log.retention.ms deletes old
segments, the scrubber's rate changes), DescribeConfigs shows each value's source, and
read-only keys, unknown keys and bad values are refused naming them, nothing changed."""

from __future__ import annotations

import json
import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient as CKAdminClient
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)
from kafka.protocol.admin.configs import (
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)

from fjord.cli.main import cli
from fjord.client import AdminClient, NewTopic, Producer, TopicPartition
from fjord.cluster.scrubber_config import DEFAULT_SCRUBBER_IO_MAX_BYTES_PER_SECOND
from fjord.errors import FjordError
from fjord.local.cluster import LocalCluster
from fjord.local.defaults import LOCAL_REPLICA_LAG_TIME_MAX_MS
from fjord.testing.waiting import wait_for
from tests.helpers.kafka_wire import connect as _connect
from tests.helpers.kafka_wire import roundtrip as _roundtrip

pytestmark = pytest.mark.integration

WAIT_S = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Retention runs every 300 ms (a static, read-only key) so that a dynamic retention change
    # shows within the test's patience.
    c = LocalCluster(tmp_path_factory.mktemp("dynamic-configs"), brokers=2, coordinators=0,
                     unsafe_etcd_no_fsync=True,
                     config={"log.retention.check.interval.ms": "300"})
    c.start()
    try:
        yield c
    finally:
        c.stop()


def configs(cluster: LocalCluster, *args: str) -> Result:
    return CliRunner().invoke(cli, ["configs", "--bootstrap-server",
                                    str(cluster.bootstrap_servers), *args])


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.output, result.stderr)
    return result.stdout


def one_line_error(result: Result, *needles: str) -> None:
    assert result.exit_code != 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def described(cluster: LocalCluster, broker: int) -> dict[str, tuple[str, str]]:
    entries = json.loads(ok(configs(cluster, "--describe", "--all", "--entity-type", "brokers",
                                    "--entity-name", str(broker), "-o", "json")))[str(broker)]
    return {e["name"]: (e["value"], e["source"]) for e in entries}


def new_topic(cluster: LocalCluster, rf: int = 1, first_timestamp: int | None = None,
              **config: str) -> tuple[str, int]:
    """A one-partition topic and its leader, once the leader took a first record."""
    name = f"dyn-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": str(cluster.bootstrap_servers)}) as admin:
        admin.create_topics([NewTopic(name, 1, rf, {k.replace("_", "."): v
                                                    for k, v in config.items()})])
        leader = wait_for(lambda: admin.describe_topics([name])[0].partitions[0].leader,
                          f"a leader of {name}", WAIT_S, accept=lambda x: x is not None
                          and x >= 0)
    with Producer({"bootstrap.servers": str(cluster.bootstrap_servers), "acks": "all"}) as p:
        p.send(name, b"first", partition=0, timestamp_ms=first_timestamp).result(WAIT_S)
    return name, leader


def produce_outcome(cluster: LocalCluster, topic: str, size: int) -> str:
    """'ok', or the error code name of one produce of a ``size``-byte value."""
    with Producer({"bootstrap.servers": str(cluster.bootstrap_servers), "acks": 1,
                   "retries": 0}) as producer:
        try:
            producer.send(topic, b"x" * size, partition=0).result(WAIT_S)
        except FjordError as exc:
            return exc.code.name
    return "ok"


def test_cli_per_broker_and_cluster_default_without_restart(cluster: LocalCluster) -> None:
    topic, leader = new_topic(cluster)
    other = 1 - leader
    assert produce_outcome(cluster, topic, 3000) == "ok"

    # The cluster-wide default: the leader refuses a batch over 2000 bytes from now on.
    assert ok(configs(cluster, "--alter", "--entity-type", "brokers", "--entity-default",
                      "--add-config", "message.max.bytes=2000")).startswith(
        "Completed updating config for default broker.")
    wait_for(lambda: produce_outcome(cluster, topic, 3000), "MESSAGE_TOO_LARGE from the "
             "default", WAIT_S, accept=lambda o: o == "MESSAGE_TOO_LARGE")
    # The leader's own value wins over the default (Kafka's precedence).
    ok(configs(cluster, "--alter", "--entity-type", "brokers", "--entity-name", str(leader),
               "--add-config", "message.max.bytes=100000,log.retention.ms=86400000"))
    wait_for(lambda: produce_outcome(cluster, topic, 3000), "the per-broker value", WAIT_S,
             accept=lambda o: o == "ok")

    mine, theirs = described(cluster, leader), described(cluster, other)
    assert mine["message.max.bytes"] == ("100000", "DYNAMIC_BROKER_CONFIG")
    assert mine["log.retention.ms"] == ("86400000", "DYNAMIC_BROKER_CONFIG")
    assert theirs["message.max.bytes"] == ("2000", "DYNAMIC_DEFAULT_BROKER_CONFIG")
    assert theirs["log.retention.ms"] == (str(7 * 24 * 3600 * 1000), "DEFAULT_CONFIG")
    assert mine["replica.lag.time.max.ms"] == (str(LOCAL_REPLICA_LAG_TIME_MAX_MS),
                                               "STATIC_BROKER_CONFIG")
    default = json.loads(ok(configs(cluster, "--describe", "--entity-type", "brokers",
                                    "--entity-default", "-o", "json")))["default"]
    assert [(e["name"], e["value"], e["source"]) for e in default] == [
        ("message.max.bytes", "2000", "DYNAMIC_DEFAULT_BROKER_CONFIG")]
    table = ok(configs(cluster, "--describe", "--entity-type", "brokers", "--entity-name",
                       str(leader)))
    assert "message.max.bytes" in table and "DYNAMIC_BROKER_CONFIG" in table

    # Bad input: refused naming the key, nothing changed.
    before = described(cluster, leader)
    for change, needles in (
        ("replica.lag.time.max.ms=1000",
         ("INVALID_REQUEST", "Cannot update these configs dynamically: replica.lag.time.max.ms")),
        ("log.retention.hours=1", ("INVALID_CONFIG", "log.retention.hours: unknown broker")),
        ("log.retention.ms=soon", ("INVALID_CONFIG", "retention.ms", "'soon'")),
        ("log.preallocate=true", ("INVALID_CONFIG", "preallocate", "not supported")),
        ("message.max.bytes=500,num.partitions=3", ("INVALID_REQUEST", "num.partitions")),
    ):
        one_line_error(configs(cluster, "--alter", "--entity-type", "brokers", "--entity-name",
                               str(leader), "--add-config", change), *needles)
    one_line_error(configs(cluster, "--alter", "--entity-type", "brokers", "--entity-default",
                           "--add-config", "auto.create.topics.enable=true"),
                   "INVALID_REQUEST", "auto.create.topics.enable")
    assert described(cluster, leader) == before

    # Deleting the per-broker value brings the default back; deleting that, the built-in one.
    ok(configs(cluster, "--alter", "--entity-type", "brokers", "--entity-name", str(leader),
               "--delete-config", "message.max.bytes,log.retention.ms"))
    wait_for(lambda: produce_outcome(cluster, topic, 3000), "the default again", WAIT_S,
             accept=lambda o: o == "MESSAGE_TOO_LARGE")
    ok(configs(cluster, "--alter", "--entity-type", "brokers", "--entity-default",
               "--delete-config", "message.max.bytes"))
    wait_for(lambda: produce_outcome(cluster, topic, 3000), "the built-in default", WAIT_S,
             accept=lambda o: o == "ok")
    assert described(cluster, leader)["message.max.bytes"][1] == "DEFAULT_CONFIG"


def test_dynamic_retention_deletes_old_segments(cluster: LocalCluster) -> None:
    """log.retention.ms (the issue's example) as a cluster-wide default: segments an hour old
    go at the next retention check, no restart."""
    hour_ago = int(time.time() * 1000) - 3600_000
    topic, _ = new_topic(cluster, rf=2, first_timestamp=hour_ago, segment_bytes="100")
    with Producer({"bootstrap.servers": str(cluster.bootstrap_servers), "acks": "all",
                   "linger.ms": 0}) as producer:
        for i in range(5):
            producer.send(topic, b"old %d" % i, partition=0,
                          timestamp_ms=hour_ago + i).result(WAIT_S)
        producer.send(topic, b"now", partition=0).result(WAIT_S)
    with AdminClient({"bootstrap.servers": str(cluster.bootstrap_servers)}) as admin:
        tp = TopicPartition(topic, 0)
        assert admin.list_offsets({tp: "earliest"})[tp] == 0  # a week's retention keeps them
        admin.alter_broker_configs({None: {"log.retention.ms": "600000"}})
        try:
            wait_for(lambda: admin.list_offsets({tp: "earliest"})[tp], "retention to move the "
                     "log start past the hour-old records", WAIT_S,
                     accept=lambda start: start is not None and start >= 6)
        finally:
            admin.alter_broker_configs({None: {"log.retention.ms": None}})


def _ck_error(future: Any) -> Any:
    with pytest.raises(KafkaException) as caught:
        future.result(WAIT_S)
    return caught.value.args[0]


def test_kafka_listener_broker_resources_with_confluent_admin(cluster: LocalCluster) -> None:
    ck = CKAdminClient({"bootstrap.servers": str(cluster.kafka_bootstrap_servers)})
    rate_key = "log.scrubber.io.max.bytes.per.second"

    def scrub_rate(admin: AdminClient) -> int:
        return admin.describe_log_dirs([0])[0].scrub.io_max_bytes_per_second

    incremental = ConfigResource(ResourceType.BROKER, "0", incremental_configs=[
        ConfigEntry(rate_key, "12345", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("log.retention.bytes", "1073741824",
                    incremental_operation=AlterConfigOpType.SET),
    ])
    [done] = ck.incremental_alter_configs([incremental]).values()
    done.result(WAIT_S)
    with AdminClient({"bootstrap.servers": str(cluster.bootstrap_servers)}) as admin:
        # The scrubber of broker 0 reads at the new rate, no restart (DescribeLogDirs).
        wait_for(lambda: scrub_rate(admin), "broker 0's scrubber at 12345 B/s", WAIT_S,
                 accept=lambda r: r == 12345)
        [entries] = ck.describe_configs([ConfigResource(ResourceType.BROKER, "0")]).values()
        got = entries.result(WAIT_S)
        assert (got[rate_key].value, got[rate_key].source) == (
            "12345", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        assert got["log.retention.bytes"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
        assert got["replica.lag.time.max.ms"].is_read_only
        assert not got[rate_key].is_read_only

        # Read-only and unknown keys: Kafka's errors, nothing changed.
        bad = ConfigResource(ResourceType.BROKER, "0", incremental_configs=[
            ConfigEntry("replica.fetch.max.bytes", "1",
                        incremental_operation=AlterConfigOpType.SET)])
        error = _ck_error(next(iter(ck.incremental_alter_configs([bad]).values())))
        assert error.name() == "INVALID_REQUEST" and "replica.fetch.max.bytes" in error.str()
        unknown = ConfigResource(ResourceType.BROKER, "0", incremental_configs=[
            ConfigEntry("no.such.key", "1", incremental_operation=AlterConfigOpType.SET)])
        error = _ck_error(next(iter(ck.incremental_alter_configs([unknown]).values())))
        assert error.name() == "INVALID_CONFIG" and "no.such.key" in error.str()
        assert scrub_rate(admin) == 12345

        # Kafka's non-incremental AlterConfigs replaces the broker's whole dynamic set: the
        # rate not named goes back to the built-in default.
        whole = ConfigResource(ResourceType.BROKER, "0", set_config={
            "log.cleaner.backoff.ms": "5000"})
        with warnings.catch_warnings():  # deprecated by confluent-kafka, still Kafka's API
            warnings.simplefilter("ignore", DeprecationWarning)
            next(iter(ck.alter_configs([whole]).values())).result(WAIT_S)
        wait_for(lambda: scrub_rate(admin), "the default scrub rate again", WAIT_S,
                 accept=lambda r: r == DEFAULT_SCRUBBER_IO_MAX_BYTES_PER_SECOND)
        [entries] = ck.describe_configs([ConfigResource(ResourceType.BROKER, "0")]).values()
        got = entries.result(WAIT_S)
        assert got["log.cleaner.backoff.ms"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
        assert got["log.retention.bytes"].source == ConfigSource.DEFAULT_CONFIG.value

        # The cluster-wide default is the BROKER resource with an empty name, which
        # librdkafka refuses to send: kafka-python's message classes on a socket instead.
        first_door = str(cluster.kafka_bootstrap_servers).split(",")[0]
        with _connect(first_door) as sock:
            icls = IncrementalAlterConfigsRequest[1]
            res = icls.AlterConfigsResource
            altered = _roundtrip(sock, icls(validate_only=False, resources=[res(
                resource_type=4, resource_name="", configs=[res.AlterableConfig(
                    name="log.cleaner.backoff.ms", config_operation=0, value="7000")])]),
                IncrementalAlterConfigsResponse, 1)
            assert altered.responses[0].error_code == 0, altered
            dcls = DescribeConfigsRequest[4]
            described = _roundtrip(sock, dcls(resources=[dcls.DescribeConfigsResource(
                resource_type=4, resource_name="", configuration_keys=None)],
                include_synonyms=False, include_documentation=False),
                DescribeConfigsResponse, 4, correlation_id=2)
            assert [(e.name, e.value, e.config_source)
                    for e in described.results[0].configs] == [
                ("log.cleaner.backoff.ms", "7000",
                 ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)]
        # Broker 0's own value still wins over the default.
        assert {e.name: (e.value, e.source) for e in admin.describe_broker_configs([0])[0]}[
            "log.cleaner.backoff.ms"] == ("5000", "DYNAMIC_BROKER")
        admin.alter_broker_configs({None: {"log.cleaner.backoff.ms": None},
                                    0: {"log.cleaner.backoff.ms": None}})
