"""Replication end to end on a private local cluster (etcd, 2 controllers, 3 brokers; topics
with replication factor 3 and min.insync.replicas=2): acks=all waits for the ISR, followers
catch up after a restart, a stopped follower leaves the ISR and rejoins, NOT_ENOUGH_REPLICAS,
leader failover without losing acknowledged records, divergent-tail truncation, the
high-watermark checkpoint across restarts, and a follower that comes back below the leader's
log start (retention ran meanwhile) restarting there and rejoining the ISR.

Every test kills or stops processes, so they use their own cluster (never the shared one). The
cluster is shared by the tests of this module, which leave all brokers running when they end.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.broker.direct_door import DIRECT_FETCH
from fjord.broker.fetch_wire import VIEW_MIN_BYTES
from fjord.broker.replica_manager import DEBUGGING_REPLICA_ID
from fjord.broker.service import FETCH_STREAM_METHOD
from fjord.cli.main import cli
from fjord.client import AdminClient, NewTopic
from fjord.errors import ErrorCode
from fjord.local.cluster import LocalCluster
from fjord.records import BatchBuilder, read_batches
from fjord.testing.chaos_cluster import broker_registration
from fjord.testing.waiting import is_value, wait_for
from tests.helpers.metrics import metric_value

pytestmark = pytest.mark.integration


#: Short lag limit so that ISR shrink is observable within seconds, long enough that a leader
#: does not drop followers stopped for the moment a test needs (on a loaded 2-core machine).
LAG_MS = 5_000
WAIT_S = 30.0
BROKERS = (0, 1, 2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("replication"),
        brokers=3,
        cluster_id=f"repl-{uuid.uuid4().hex[:8]}",
        config={"replica.lag.time.max.ms": str(LAG_MS), "log.retention.check.interval.ms": "300"},
        unsafe_etcd_no_fsync=True,
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster) -> Iterator[AdminClient]:
    client = AdminClient(
        {"bootstrap.servers": cluster.bootstrap_servers, "default.api.timeout.ms": 20000}
    )
    yield client
    client.close()


@pytest.fixture(autouse=True)
def all_brokers_running(cluster: LocalCluster) -> Iterator[None]:
    """Each test starts and ends with every broker running (and none stopped), registered as
    the active controller sees it: a topic created before the controller knows a broker that
    was just started again is refused (replication factor above the live brokers)."""
    yield
    for b in BROKERS:
        proc = cluster.process("broker", b)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        else:
            cluster.start_broker(b)
    wait_for(lambda: registered_at_controller(cluster) == set(BROKERS),
             "every broker registered at the active controller")


# --- helpers ------------------------------------------------------------------------------


def stub(cluster: LocalCluster, broker: int) -> broker_pb2_grpc.BrokerStub:
    return broker_pb2_grpc.BrokerStub(grpc.insecure_channel(cluster.address("broker", broker)))


def new_topic(admin: AdminClient, **config: str) -> str:
    name = f"r-{uuid.uuid4().hex[:10]}"
    admin.create_topics([NewTopic(name, 1, 3, {"min.insync.replicas": "2", **config})])
    return name


def partition_state(cluster: LocalCluster, topic: str) -> tuple[int, int, tuple[int, ...]] | None:
    """(leader, leader_epoch, isr) once every running broker that answers has it (None while
    they disagree or none knows the topic): a broker just continued after SIGSTOP, or just
    started, answers from the metadata image it had until its etcd watch catches up, so one
    broker's answer alone can show a state the controller left seconds ago."""
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    for b in live_brokers(cluster):
        try:
            md = stub(cluster, b).Metadata(broker_pb2.MetadataRequest(topics=[topic]), timeout=5)
        except grpc.RpcError:
            continue  # stopped or not serving yet: it has no say
        found = [(p.leader, p.leader_epoch, tuple(sorted(p.isr)))
                 for t in md.topics if t.error.code == 0 for p in t.partitions if p.partition == 0]
        if not found:
            return None
        seen.update(found)
    return seen.pop() if len(seen) == 1 else None


def live_brokers(cluster: LocalCluster) -> list[int]:
    """The brokers whose process runs (neither exited nor stopped by SIGSTOP)."""
    return [b for b in BROKERS
            if cluster.process("broker", b).poll() is None
            and not stopped(cluster.process("broker", b).pid)]


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP): its state in /proc is T. A stopped broker
    answers nothing; asking it costs a whole RPC timeout."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] == "T"


def registered_at_controller(cluster: LocalCluster) -> set[int]:
    """The brokers the active controller counts as live (what topic creation places on)."""
    active = cluster.active_controller()
    described = None if active is None else cluster.describe_cluster(active)
    return set() if described is None else {b.id for b in described.brokers}


def batch(values: list[bytes]) -> bytes:
    builder = BatchBuilder(batch_size=1 << 30)
    for i, v in enumerate(values):
        builder.append(1_000 + i, None, v)
    return builder.build()


def produce(
    cluster: LocalCluster,
    broker: int,
    topic: str,
    values: list[bytes],
    acks: int = -1,
    timeout_ms: int = 15_000,
) -> broker_pb2.ProducePartitionResponse:
    request = broker_pb2.ProduceRequest(acks=acks, timeout_ms=timeout_ms)
    request.topics.add(name=topic).partitions.add(partition=0, records=batch(values))
    response = stub(cluster, broker).Produce(request, timeout=timeout_ms / 1000 + 10)
    return response.topics[0].partitions[0]


def log_end_offset(cluster: LocalCluster, broker: int, topic: str) -> int:
    """Any replica's log end offset (ListOffsets as a debugging replica reads followers too)."""
    request = broker_pb2.ListOffsetsRequest(replica_id=DEBUGGING_REPLICA_ID)
    request.topics.add(name=topic).partitions.add(
        partition=0, timestamp=-1, current_leader_epoch=-1
    )
    out = stub(cluster, broker).ListOffsets(request, timeout=5).topics[0].partitions[0]
    assert out.error.code == 0, out.error.message
    return int(out.offset)


def consume_all(cluster: LocalCluster, broker: int, topic: str) -> list[bytes]:
    """Every record value a consumer can read from ``broker`` (below the high watermark)."""
    values: list[bytes] = []
    offset = 0
    while True:
        request = broker_pb2.FetchRequest(replica_id=-1, max_wait_ms=0, max_bytes=1 << 24)
        request.topics.add(name=topic).partitions.add(
            partition=0, fetch_offset=offset, partition_max_bytes=1 << 24, current_leader_epoch=-1
        )
        out = stub(cluster, broker).Fetch(request, timeout=10).topics[0].partitions[0]
        assert out.error.code == 0, out.error.message
        if not out.records:
            return values
        for b in read_batches(out.records):
            for r in b.records():
                if r.offset >= offset:
                    values.append(bytes(r.value or b""))
            offset = b.last_offset + 1


def leader_of(cluster: LocalCluster, topic: str) -> int:
    """The partition's leader once it serves the partition: the controller names a leader before
    that broker has opened its replica, and until then it answers NOT_LEADER_OR_FOLLOWER."""

    def known() -> int | None:
        state = partition_state(cluster, topic)
        if state is None or state[0] < 0:
            return None
        request = broker_pb2.ListOffsetsRequest(replica_id=-1)
        request.topics.add(name=topic).partitions.add(
            partition=0, timestamp=-1, current_leader_epoch=-1
        )
        try:
            answer = stub(cluster, state[0]).ListOffsets(request, timeout=5)
        except grpc.RpcError:
            return None
        return state[0] if answer.topics[0].partitions[0].error.code == 0 else None

    return wait_for(known, f"a leader of {topic}", accept=is_value)


def wait_isr(
    cluster: LocalCluster, topic: str, isr: tuple[int, ...], timeout: float = WAIT_S
) -> None:
    wait_for(
        lambda: (s := partition_state(cluster, topic)) is not None and s[2] == tuple(sorted(isr)),
        f"ISR {isr} of {topic}",
        timeout,
    )


def fetch_connections(cluster: LocalCluster, broker: int) -> float:
    """Fetch connections ``broker`` serves now: its direct door's and its open FetchStreams
    (in this module only the followers hold them)."""
    address = cluster.metrics_address("broker", broker)
    return sum(metric_value(address, "fjord_broker_open_streams", method=method)
               for method in (DIRECT_FETCH, FETCH_STREAM_METHOD))


def wait_replicated(cluster: LocalCluster, topic: str, brokers: list[int], end: int) -> None:
    wait_for(
        lambda: all(log_end_offset(cluster, b, topic) == end for b in brokers),
        f"{topic} replicated to {end} on {brokers}",
    )


# --- tests --------------------------------------------------------------------------------


def test_acks_all_completes_only_when_every_isr_member_has_it(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    topic = new_topic(admin)
    leader = leader_of(cluster, topic)
    wait_isr(cluster, topic, BROKERS)
    for i in range(5):
        out = produce(cluster, leader, topic, [f"v{i}-{j}".encode() for j in range(10)])
        assert out.error.code == 0, out.error.message
        assert out.base_offset == 10 * i
        # Acknowledged: the high watermark passed it, so every ISR member holds it already.
        for b in BROKERS:
            assert log_end_offset(cluster, b, topic) >= 10 * (i + 1)
    assert len(consume_all(cluster, leader, topic)) == 50


def test_large_batches_replicate_through_the_followers_zero_copy_decoding(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    """Answers of at least fetch_wire.VIEW_MIN_BYTES reach the followers' logs as views of the
    received message: each follower checks every batch's CRC as it appends, so acks=all
    completing (both followers hold the batches) and equal log ends mean the bytes arrived
    whole."""
    topic = new_topic(admin)
    leader = leader_of(cluster, topic)
    wait_isr(cluster, topic, BROKERS)
    values = [os.urandom(1000) for _ in range(3 * VIEW_MIN_BYTES // 1000)]
    for i in range(3):
        out = produce(cluster, leader, topic, values)
        assert out.error.code == 0, out.error.message
        assert out.base_offset == i * len(values)
    wait_replicated(cluster, topic, list(BROKERS), 3 * len(values))
    assert consume_all(cluster, leader, topic) == values * 3


def test_follower_catches_up_after_restart_and_rejoins_the_isr(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    topic = new_topic(admin)
    leader = leader_of(cluster, topic)
    wait_isr(cluster, topic, BROKERS)
    follower = next(b for b in BROKERS if b != leader)
    # The followers fetch through the leader's direct door or on its FetchStream; each holds
    # one connection while it lasts (fjord_broker_open_streams). Once the stopped follower's
    # has ended at the leader, at most the other follower's is left. (Counting down from a
    # number read before the stop raced with the follower's connection opening after it.)
    cluster.kill("broker", follower, signal.SIGTERM)  # clean stop: its lease goes at once
    wait_for(lambda: fetch_connections(cluster, leader) <= len(BROKERS) - 2,
             f"broker {follower}'s connection to the leader ended")
    for i in range(20):  # acks=1: nothing waits for the dead follower
        assert produce(cluster, leader, topic, [f"a{i}".encode()] * 5, acks=1).error.code == 0
    others = [b for b in BROKERS if b != follower]
    wait_isr(cluster, topic, tuple(others))
    cluster.start_broker(follower)
    wait_replicated(cluster, topic, list(BROKERS), 100)
    wait_isr(cluster, topic, BROKERS)
    out = produce(cluster, leader_of(cluster, topic), topic, [b"after"])
    assert out.error.code == 0 and out.base_offset == 100


def test_followers_whose_fetch_streams_break_fetch_again_and_catch_up(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    """The leader SIGKILLed and started again at once: the followers' open FetchStreams (or
    direct-door connections) to it break under them; each fails its waiting fetch as a failed
    call (session reset, backoff) and fetches again on a new one, so every replica holds what
    is written afterwards."""
    topic = new_topic(admin)
    leader = leader_of(cluster, topic)
    wait_isr(cluster, topic, BROKERS)
    assert produce(cluster, leader, topic, [b"before"] * 5).error.code == 0
    followers = [b for b in BROKERS if b != leader]
    logs = {b: cluster.data_dir / "logs" / f"broker-{b}.log" for b in followers}
    logged = {b: logs[b].stat().st_size for b in followers}
    cluster.kill("broker", leader)
    cluster.start_broker(leader)
    # On the leader's FetchStream ("FetchStream stream to ...") or through its direct door
    # ("Fetch door ... of leader ..."), alike.
    broke = f"fetch from broker {leader} failed (StreamClosedError: Fetch"
    for b in followers:
        wait_for(lambda b=b: broke in logs[b].read_bytes()[logged[b]:].decode(errors="replace"),
                 f"broker {b} to see its connection to broker {leader} break")
    # acks=1: appended once answered (a retried acks=all write could be in the log twice).
    assert produce(cluster, leader_of(cluster, topic), topic, [b"after"] * 5, acks=1
                   ).error.code == 0
    wait_replicated(cluster, topic, list(BROKERS), 10)
    wait_isr(cluster, topic, BROKERS)


def test_stopped_follower_leaves_the_isr_and_rejoins_after_sigcont(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    """A follower stopped (SIGSTOP) for longer than replica.lag.time.max.ms leaves the ISR,
    acks=all goes on with the rest, and once continued the follower rejoins.

    A local broker's lease TTL (LOCAL_BROKER_LEASE_TTL_S, 6 s) is about the lag limit, so the
    stopped follower loses its registration too, before or after the leader's AlterPartition
    drops it (whichever comes first takes it out of the ISR). The test waits for that lapse
    before it continues the follower, and for its new registration after: continued at the
    moment etcd drops its lease, it could rejoin the ISR under the old registration and leave
    it again a moment later, in the next test's time (a fresh topic then created on it loses
    its leader or a replica to the liveness reconcile)."""
    topic = new_topic(admin)
    leader = leader_of(cluster, topic)
    wait_isr(cluster, topic, BROKERS)
    follower = next(b for b in BROKERS if b != leader)
    registered = broker_registration(cluster, follower)
    assert registered is not None
    stopped_at = time.monotonic()
    os.kill(cluster.process("broker", follower).pid, signal.SIGSTOP)
    try:
        produce(cluster, leader, topic, [b"x"], acks=1)
        others = tuple(b for b in BROKERS if b != follower)
        # Out of the ISR after replica.lag.time.max.ms (the leader's AlterPartition, or the
        # controller when the lease lapses). Its last fetch may have been parked up to
        # replica.fetch.wait.max.ms before the stop: 1 s of slack.
        wait_isr(cluster, topic, others)
        assert time.monotonic() - stopped_at >= LAG_MS / 1000 - 1.0
        out = produce(cluster, leader, topic, [b"y"] * 3)  # acks=all works with ISR 2 >= 2
        assert out.error.code == 0, out.error.message
        wait_for(lambda: broker_registration(cluster, follower) is None,
                 f"the stopped broker {follower}'s lease to lapse")
    finally:
        os.kill(cluster.process("broker", follower).pid, signal.SIGCONT)
    wait_for(lambda: broker_registration(cluster, follower) not in (None, registered),
             f"broker {follower} to register anew")
    wait_isr(cluster, topic, BROKERS)
    wait_replicated(cluster, topic, list(BROKERS), 4)


def test_not_enough_replicas_when_two_followers_are_down(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    topic = new_topic(admin)
    leader = leader_of(cluster, topic)
    wait_isr(cluster, topic, BROKERS)
    assert produce(cluster, leader, topic, [b"ok"]).error.code == 0
    followers = [b for b in BROKERS if b != leader]
    for b in followers:
        cluster.kill("broker", b, signal.SIGTERM)
    wait_isr(cluster, topic, (leader,))
    out = produce(cluster, leader, topic, [b"refused"])
    assert out.error.code == ErrorCode.NOT_ENOUGH_REPLICAS.code, out.error.message
    assert log_end_offset(cluster, leader, topic) == 1  # nothing was appended
    assert produce(cluster, leader, topic, [b"acks-1"], acks=1).error.code == 0
    for b in followers:
        cluster.start_broker(b)
    wait_isr(cluster, topic, BROKERS)
    wait_replicated(cluster, topic, list(BROKERS), 2)


def test_cli_producer_giving_up_names_not_enough_replicas(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    """Issues 12 and 13: min.insync.replicas=3 on RF 3 with a broker stopped. ``fjord produce``
    with a short delivery.timeout.ms retries, gives up and says why (NOT_ENOUGH_REPLICAS as
    its last error), not a bare timeout."""
    topic = new_topic(admin, **{"min.insync.replicas": "3"})
    leader = leader_of(cluster, topic)
    wait_isr(cluster, topic, BROKERS)
    follower = next(b for b in BROKERS if b != leader)
    cluster.kill("broker", follower, signal.SIGTERM)
    wait_isr(cluster, topic, tuple(b for b in BROKERS if b != follower))
    started = time.monotonic()
    result = CliRunner().invoke(
        cli,
        ["produce", "--bootstrap-server", cluster.bootstrap_servers, "--topic", topic,
         "--producer-property", "delivery.timeout.ms=3000",
         "--producer-property", "request.timeout.ms=2000"],
        input="refused\n",
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert time.monotonic() - started < WAIT_S
    assert "expired after delivery.timeout.ms=3000" in result.output, result.output
    assert "last error: NOT_ENOUGH_REPLICAS" in result.output, result.output
    assert "Traceback" not in result.output


def test_cli_shows_a_brokers_static_config(cluster: LocalCluster) -> None:
    """`fjord configs --describe --entity-type brokers` names what this module's brokers were
    started with (--config replica.lag.time.max.ms) as STATIC_BROKER_CONFIG."""
    result = CliRunner().invoke(
        cli,
        ["configs", "--bootstrap-server", cluster.bootstrap_servers, "--describe",
         "--entity-type", "brokers", "--entity-name", "2", "-o", "json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    entries = {e["name"]: (e["value"], e["source"]) for e in json.loads(result.stdout)["2"]}
    assert entries["replica.lag.time.max.ms"] == (str(LAG_MS), "STATIC_BROKER_CONFIG")


def test_leader_failover_keeps_acknowledged_records_and_truncates_the_old_leader(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    topic = new_topic(admin)
    old_leader = leader_of(cluster, topic)
    wait_isr(cluster, topic, BROKERS)
    acked = [f"acked-{i}".encode() for i in range(30)]
    for i in range(0, 30, 10):
        out = produce(cluster, old_leader, topic, acked[i : i + 10])
        assert out.error.code == 0, out.error.message
    followers = [b for b in BROKERS if b != old_leader]
    for b in followers:
        os.kill(cluster.process("broker", b).pid, signal.SIGSTOP)
    try:
        # A tail only the leader gets (acks=1, never acknowledged as committed): at most the
        # first batch reaches a follower (through a fetch it had parked before it stopped).
        tail = [f"tail-{i}".encode() for i in range(3)]
        for i, value in enumerate(tail):
            out = produce(cluster, old_leader, topic, [value], acks=1)
            assert (out.error.code, out.base_offset) == (0, 30 + i)
        cluster.kill("broker", old_leader)  # SIGKILL: its lease expires, the controller elects
    finally:
        for b in followers:
            os.kill(cluster.process("broker", b).pid, signal.SIGCONT)

    def new_leader() -> int | None:
        state = partition_state(cluster, topic)
        return state[0] if state is not None and state[0] in followers else None

    wait_for(new_leader, "a new leader", accept=is_value)
    # The broker that answered names the new leader before that one may serve it (it opens
    # the partition as leader when its own metadata catches up): wait until it does.
    elected = leader_of(cluster, topic)
    assert elected in followers
    more = [f"more-{i}".encode() for i in range(5)]
    out = produce(cluster, elected, topic, more)
    assert out.error.code == 0, out.error.message

    cluster.start_broker(old_leader)
    wait_isr(cluster, topic, BROKERS)
    final_end = log_end_offset(cluster, elected, topic)
    wait_replicated(cluster, topic, list(BROKERS), final_end)
    values = consume_all(cluster, leader_of(cluster, topic), topic)
    assert values[:30] == acked  # nothing acknowledged is lost, order kept
    assert values[-5:] == more
    assert tail[-1] not in values  # the old leader's divergent tail is gone everywhere
    assert len(values) == final_end
    log_text = Path(cluster.logs_dir / f"broker-{old_leader}.log").read_text()
    assert "diverged" in log_text


def test_high_watermark_checkpoint_written_on_clean_shutdown(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    topic = new_topic(admin)
    leader = leader_of(cluster, topic)
    wait_isr(cluster, topic, BROKERS)
    assert produce(cluster, leader, topic, [b"c"] * 7).error.code == 0  # acks=all: HW is 7
    cluster.kill("broker", leader, signal.SIGTERM)
    path = cluster.data_dir / "brokers" / str(leader) / "replication-offset-checkpoint"
    assert f"{topic} 0 7" in path.read_text().splitlines()
    cluster.start_broker(leader)
    wait_isr(cluster, topic, BROKERS)
    wait_replicated(cluster, topic, list(BROKERS), 7)


def test_follower_back_below_the_leaders_log_start_restarts_there_and_rejoins(
    cluster: LocalCluster, admin: AdminClient
) -> None:
    # Small segments and a byte limit, so that retention on the leader deletes what the
    # stopped follower never fetched.
    topic = new_topic(
        admin, **{"min.insync.replicas": "1", "segment.bytes": "4096", "retention.bytes": "8192"}
    )
    leader = leader_of(cluster, topic)
    wait_isr(cluster, topic, BROKERS)
    follower = next(b for b in BROKERS if b != leader)
    assert produce(cluster, leader, topic, [b"before"] * 5).error.code == 0
    wait_replicated(cluster, topic, list(BROKERS), 5)
    cluster.kill("broker", follower)
    wait_isr(cluster, topic, tuple(b for b in BROKERS if b != follower))
    for _ in range(40):
        assert produce(cluster, leader, topic, [b"x" * 500] * 4).error.code == 0
    end = log_end_offset(cluster, leader, topic)

    def leader_log_start() -> int | None:
        request = broker_pb2.ListOffsetsRequest(replica_id=-1)
        request.topics.add(name=topic).partitions.add(
            partition=0, timestamp=-2, current_leader_epoch=-1
        )
        out = stub(cluster, leader).ListOffsets(request, timeout=5).topics[0].partitions[0]
        return int(out.offset) if out.error.code == 0 and out.offset > 5 else None

    start = wait_for(leader_log_start, "retention on the leader to pass the follower's log end")
    cluster.start_broker(follower)
    wait_isr(cluster, topic, BROKERS)
    wait_replicated(cluster, topic, list(BROKERS), end)
    request = broker_pb2.ListOffsetsRequest(replica_id=DEBUGGING_REPLICA_ID)
    request.topics.add(name=topic).partitions.add(
        partition=0, timestamp=-2, current_leader_epoch=-1
    )
    out = stub(cluster, follower).ListOffsets(request, timeout=5).topics[0].partitions[0]
    assert out.error.code == 0 and out.offset >= start
