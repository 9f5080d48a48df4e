"""KIP-368 on real processes: SASL sessions live ``connections.max.reauth.ms`` (a few seconds
here) on a ``fjord local up --secure --sasl`` cluster (one broker, one coordinator, both with
the short lifetime; SASL_SSL:// Kafka listeners and SASL gRPC doors).

- confluent-kafka (librdkafka re-authenticates, KIP-368) and fjord's own clients (they renew
  their door session at 85-95% of its lifetime) produce and consume through a consumer group
  for several lifetimes: every record arrives exactly once and in order, and the broker and
  the coordinator logged the re-authentications and the door's renewed logins.
- A connection that does not re-authenticate is closed on its first request after the expiry.
- A deleted user keeps its live session until the next re-authentication, which fails.

The pure rules (expiry instants, renewal points, re-authentication's state machine) are
unit-tested with an injected clock: tests/unit/test_sasl.py, test_sasl_sessions.py,
test_sasl_door.py."""

from __future__ import annotations

import time
from collections.abc import Iterator

import confluent_kafka
import pytest
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse

from fjord.client import AdminClient, Consumer, NewTopic, Producer
from fjord.errors import ErrorCode, FjordError
from fjord.local.cluster import LocalCluster
from fjord.security.scram import UserScramCredentialDeletion, UserScramCredentialUpsertion
from fjord.testing.waiting import wait_for
from tests.helpers.metrics import metric_value
from tests.helpers.sasl import (
    admin_config,
    closed,
    door_client_config,
    frame,
    grpc_login,
    logs_in,
    read_frame,
    sasl_conf,
    sasl_grpc_channel,
    scram_login,
    tls_socket,
)

pytestmark = pytest.mark.integration

#: connections.max.reauth.ms of the cluster: short, so a test sees several lifetimes, yet
#: long enough that on a loaded 2-core machine a credential's deletion reaches the broker
#: well before 85% of it (the deleted-user test needs that window; ~1 s is typical).
LIFETIME_MS = 5000
LIFETIME_S = LIFETIME_MS / 1000
TOPIC = "reauth"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    lifetime = {"connections.max.reauth.ms": str(LIFETIME_MS)}
    local = LocalCluster(
        tmp_path_factory.mktemp("fjord-reauth"), brokers=1, coordinators=1,
        unsafe_etcd_no_fsync=True, secure=True, kafka_sasl=True, config=lifetime,
        coordinator_config={"group.initial.rebalance.delay.ms": "100"},
    )
    # `fjord local up --config connections.max.reauth.ms=...` reaches the coordinators too.
    assert local.coordinator_config["connections.max.reauth.ms"] == str(LIFETIME_MS)
    local.start()
    try:
        with AdminClient(admin_config(local)) as admin:
            admin.create_topics([NewTopic(TOPIC, 1, 1)])
            admin.alter_user_scram_credentials([
                UserScramCredentialUpsertion(user, "SCRAM-SHA-512", f"{user}-secret")
                for user in ("alice", "dave", "erin")])
        for user in ("alice", "dave", "erin"):
            wait_for(lambda u=user: logs_in(local, u, f"{u}-secret"),  # type: ignore[misc]
                     f"{user}'s credential on the broker")
        yield local
    finally:
        local.stop()


def log_lines(cluster: LocalCluster, process: str, needle: str) -> list[str]:
    """The lines of ``process``'s log (``broker-0``, ``coordinator-1``) holding ``needle``."""
    return [line for line in (cluster.logs_dir / f"{process}.log").read_text().splitlines()
            if needle in line]


def test_long_producers_and_consumers_survive_several_reauth_periods(
    cluster: LocalCluster
) -> None:
    """confluent-kafka on the Kafka listeners and fjord.client on the SASL gRPC doors, side by
    side for more than three lifetimes, each through a consumer group: every record once, in
    order; re-authentications and door logins logged. A fjord AdminClient creates a topic
    before and after (its controller session renewed in between)."""
    kafka_conf = sasl_conf(cluster, "alice", "alice-secret")
    kafka_producer = confluent_kafka.Producer({**kafka_conf, "enable.idempotence": True})
    kafka_consumer = confluent_kafka.Consumer({
        **kafka_conf, "group.id": "g-reauth-kafka", "auto.offset.reset": "earliest",
        "enable.auto.commit": True, "auto.commit.interval.ms": 500,
    })
    kafka_consumer.subscribe([TOPIC])
    door = door_client_config(cluster, "alice", "alice-secret")
    fjord_producer = Producer(door)  # idempotent by default
    fjord_admin = AdminClient(door)  # Metadata at a broker's door, CreateTopics at the
    # controller's: the second call comes lifetimes after the first login
    fjord_consumer = Consumer({**door, "group.id": "g-reauth-fjord",
                               "auto.offset.reset": "earliest"})
    fjord_consumer.subscribe([TOPIC])
    sent: list[bytes] = []
    acked: list[object] = []
    kafka_seen: list[bytes] = []
    fjord_seen: list[bytes] = []

    def poll_both() -> None:
        kafka_seen.extend(m.value() for m in kafka_consumer.consume(1000, 0.05)
                          if m.error() is None)
        fjord_seen.extend(r.value for r in fjord_consumer.poll(0.05) if r.value is not None)

    try:
        fjord_admin.create_topics([NewTopic("reauth-admin-1", 1, 1)])
        started = time.monotonic()
        number = 0
        # A paced, long-running workload: running for a while is the point, not a stand-in.
        while time.monotonic() - started < 3.5 * LIFETIME_S:
            for producer_name in ("kafka", "fjord"):
                value = f"{producer_name}-{number:05d}".encode()
                sent.append(value)
                if producer_name == "kafka":
                    kafka_producer.produce(TOPIC, value, on_delivery=lambda e, _m: acked.append(e))
                    kafka_producer.poll(0)
                else:
                    acked.append(fjord_producer.send(TOPIC, value=value))
            number += 1
            poll_both()
        assert kafka_producer.flush(30) == 0
        fjord_admin.create_topics([NewTopic("reauth-admin-2", 1, 1)])
        assert {"reauth-admin-1", "reauth-admin-2"} <= set(fjord_admin.list_topics(timeout=15))
        for item in acked:
            if not isinstance(item, (confluent_kafka.KafkaError, type(None))):
                item.result(30)  # type: ignore[attr-defined]  # a fjord send future
        assert [e for e in acked if isinstance(e, confluent_kafka.KafkaError)] == []
        def missing() -> tuple[int, int, int]:
            poll_both()
            return (len(sent), len(set(sent) - set(kafka_seen)), len(set(sent) - set(fjord_seen)))

        wait_for(missing, "every record read back by both consumer groups (sent, missing "
                 "from the Kafka group, missing from the fjord group)", timeout=30,
                 accept=lambda counts: counts[1:] == (0, 0))
    finally:
        kafka_consumer.close()
        fjord_consumer.close()
        fjord_producer.close()
        fjord_admin.close()
    for seen in (kafka_seen, fjord_seen):
        assert len(seen) == len(sent) and set(seen) == set(sent), "each record exactly once"
        for name in ("kafka", "fjord"):  # one partition: each producer's records in order
            own = [v for v in seen if v.startswith(name.encode())]
            assert own == sorted(own)
    # The sessions were renewed: librdkafka re-authenticated on its Kafka connections;
    # fjord's clients logged in again at the broker's and coordinator's doors. (A renewal
    # that reaches a loaded server after the expiry costs a reconnect or a re-sent call,
    # never a record: that is what the exactly-once check above covers.)
    assert len(log_lines(cluster, "broker-0", "alice re-authenticated")) >= 3
    assert len(log_lines(cluster, "coordinator-1", "alice re-authenticated")) >= 2
    for process in (("broker", 0), ("coordinator", 1)):
        assert metric_value(cluster.metrics_address(*process),
                            "fjord_sasl_reauthentications_total") >= 2
    assert len(log_lines(cluster, "broker-0", "User:alice logged in with SASL")) >= 4
    # The group's calls to the coordinator (heartbeats, commits) are seconds apart: a first
    # login and at least one renewal.
    assert len(log_lines(cluster, "coordinator-1", "User:alice logged in with SASL")) >= 2
    assert len(log_lines(cluster, "controller-0", "User:alice logged in with SASL")) + \
        len(log_lines(cluster, "controller-1", "User:alice logged in with SASL")) >= 2


@pytest.mark.parametrize(("role", "node_id"), [("broker", 0), ("coordinator", 1),
                                              ("controller", 0)])
def test_every_sasl_grpc_door_answers_the_configured_lifetime(
    cluster: LocalCluster, role: str, node_id: int
) -> None:
    """`fjord local up --config connections.max.reauth.ms=...` reaches every process's door
    (the controllers' too)."""
    with sasl_grpc_channel(cluster, role, node_id) as channel:
        login = grpc_login(channel, "erin", "erin-secret")
    assert login.error.code == 0 and login.session_token
    assert login.session_lifetime_ms == LIFETIME_MS


def test_a_connection_that_does_not_reauthenticate_is_closed_after_its_lifetime(
    cluster: LocalCluster
) -> None:
    with tls_socket(cluster) as sock:
        logged_in_at = time.monotonic()
        final = scram_login(sock, "erin", "erin-secret")
        assert final is not None and final.session_lifetime_ms == LIFETIME_MS  # type: ignore[attr-defined]

        def metadata_answered() -> bool:
            try:
                sock.sendall(frame(MetadataRequest[4](topics=None), 4))
                MetadataResponse.decode(read_frame(sock)[4:], version=4, header=True)
                return True
            except (ConnectionError, OSError):
                return False

        assert metadata_answered()  # within the lifetime: served
        wait_for(lambda: not metadata_answered(), "the expired connection closed",
                 timeout=LIFETIME_S + 15, interval=0.2)
        assert time.monotonic() - logged_in_at >= LIFETIME_S
        assert closed(sock)
    assert log_lines(cluster, "broker-0", "session of User:erin expired")
    assert metric_value(cluster.metrics_address("broker", 0),
                        "fjord_sasl_expired_sessions_total", door="kafka") >= 1


def test_a_deleted_user_keeps_its_session_until_the_next_reauthentication(
    cluster: LocalCluster
) -> None:
    """fjord.client on the door and confluent-kafka on the Kafka listener, both logged in as
    dave; dave's credential is deleted: a request right after still runs on the live
    session (the deletion already reached the broker), and within a lifetime the renewal
    fails: SASL_AUTHENTICATION_FAILED for the fjord client, an authentication error for
    librdkafka (its re-authentication failed, it reconnected and was refused)."""
    door = door_client_config(cluster, "dave", "dave-secret", **{"max.block.ms": 5000})
    kafka_errors: list[int] = []
    kafka_producer = confluent_kafka.Producer({
        **sasl_conf(cluster, "dave", "dave-secret"), "message.timeout.ms": 20000,
        "error_cb": lambda err: kafka_errors.append(err.code())})
    kafka_producer.produce(TOPIC, b"dave-kafka-before")
    assert kafka_producer.flush(15) == 0
    with AdminClient(admin_config(cluster)) as admin, Producer(door) as producer:
        admin.list_topics(timeout=15)  # connected before the clock below starts
        logged_in = time.monotonic()
        producer.send(TOPIC, value=b"dave-before").result(15)  # the door login
        admin.alter_user_scram_credentials(
            [UserScramCredentialDeletion("dave", "SCRAM-SHA-512")])
        wait_for(lambda: not logs_in(cluster, "dave", "dave-secret"),
                 "the deletion reached the broker", interval=0.05)
        # Served: with the credential gone a new login would fail, so this ran on the live
        # session (the client renews only from 85% of the lifetime after its login).
        try:
            producer.send(TOPIC, value=b"dave-after-delete").result(15)
        except FjordError as exc:
            raise AssertionError(
                f"refused {time.monotonic() - logged_in:.2f} s after the login (the renewal "
                f"is due from {0.85 * LIFETIME_S:.2f} s): the machine was too slow for "
                "this check, or the live session was cut") from exc

        def refused() -> bool:
            try:
                producer.send(TOPIC, value=b"dave-refused").result(15)
            except FjordError as exc:
                assert exc.code is ErrorCode.SASL_AUTHENTICATION_FAILED
                return True
            return False

        wait_for(refused, "dave's renewal refused", timeout=LIFETIME_S + 15, interval=0.2)
    wait_for(lambda: (kafka_producer.poll(0.2),
                      confluent_kafka.KafkaError._AUTHENTICATION in kafka_errors)[1],
             "librdkafka's re-authentication refused", timeout=LIFETIME_S + 20)
