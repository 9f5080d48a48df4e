"""A leader cut off from etcd alone (its followers and the controller still reach etcd) serves
on, but can never acknowledge an acks=all write once another leader has been elected, stops
leading altogether once the controller tells it its registration is gone, and gives everything
it appended meanwhile up when it reaches etcd again. The zombie guarantees of
docs/replication.md ("etcd outages") against real processes.

Private cluster (3 brokers, 2 controllers, broker lease TTL 6 s). One broker is replaced by a
process of its own (same id, data dir and port: it takes its registration back at once) whose
etcd connection goes through a TCP forwarder the test can cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.broker.replica_manager import DEBUGGING_REPLICA_ID
from fjord.client import AdminClient, Consumer, NewTopic, TopicPartition
from fjord.errors import ErrorCode
from fjord.local.cluster import LocalCluster
from fjord.records import BatchBuilder
from fjord.testing.chaos_cluster import partition_states, registered_broker
from fjord.testing.waiting import wait_for

pytestmark = pytest.mark.integration

WAIT_S = 40.0


class EtcdLink:
    """A TCP forwarder to etcd on a free loopback port; :meth:`cut` closes every connection
    through it and refuses new ones until :meth:`restore`."""

    def __init__(self, target: str) -> None:
        host, _, port = target.removeprefix("http://").rpartition(":")
        self._target = (host, int(port))
        self._cut = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop).result(10)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def _set(self, cut: bool) -> None:
        self._cut = cut
        if cut:
            for w in list(self._writers):
                w.close()

    def cut(self) -> None:
        self._loop.call_soon_threadsafe(self._set, True)

    def restore(self) -> None:
        self._loop.call_soon_threadsafe(self._set, False)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path / "zombie", brokers=3, coordinators=0,
                     cluster_id=f"zombie-{uuid.uuid4().hex[:8]}", unsafe_etcd_no_fsync=True,
                     config={"min.insync.replicas": "2", "replica.lag.time.max.ms": "3000"})
    c.start()
    try:
        yield c
    finally:
        c.stop()


def stub(address: str) -> broker_pb2_grpc.BrokerStub:
    return broker_pb2_grpc.BrokerStub(grpc.insecure_channel(address))


def produce(address: str, topic: str, value: bytes, acks: int, timeout_ms: int) -> int:
    """One record straight to ``address`` (no client retries); the answer's error code."""
    builder = BatchBuilder(batch_size=1 << 20)
    builder.append(0, None, value)
    request = broker_pb2.ProduceRequest(acks=acks, timeout_ms=timeout_ms)
    request.topics.add(name=topic).partitions.add(partition=0, records=builder.build())
    response = stub(address).Produce(request, timeout=timeout_ms / 1000 + 10)
    return int(response.topics[0].partitions[0].error.code)


def log_end(address: str, topic: str) -> int:
    request = broker_pb2.ListOffsetsRequest(replica_id=DEBUGGING_REPLICA_ID)
    request.topics.add(name=topic).partitions.add(partition=0, timestamp=-1,
                                                   current_leader_epoch=-1)
    out = stub(address).ListOffsets(request, timeout=5).topics[0].partitions[0]
    return int(out.offset)


def test_leader_cut_off_from_etcd_acknowledges_nothing_after_a_new_election(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    topic = f"z-{uuid.uuid4().hex[:6]}"
    with AdminClient({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topics([NewTopic(topic, 1, 3)])
    brokers = sorted(cluster.broker_addresses)

    def state() -> object:
        return (partition_states(cluster, topic, brokers) or {}).get(0)

    first = wait_for(lambda: (s := state()) is not None and len(s.isr) == 3 and s,
                     "a full ISR", WAIT_S)
    zombie = first.leader
    others = [b for b in brokers if b != zombie]
    address = cluster.address("broker", zombie)
    # Replace the leader by a process of its own whose etcd link the test controls.
    argv = next(p.argv for p in cluster.processes() if p.role == "broker" and p.id == zombie)
    link = EtcdLink(cluster.etcd_url)
    argv = tuple(link.url if a == cluster.etcd_url else a for a in argv)
    epoch = registered_broker(cluster, zombie)
    cluster.kill("broker", zombie)
    log = tmp_path / "zombie.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: registered_broker(cluster, zombie) not in (None, epoch),
                 "the replacement registered", WAIT_S)
        # Preferred-leader rebalancing gives it the partition back once it is in the ISR.
        wait_for(lambda: (s := state()) is not None and s.leader == zombie and len(s.isr) == 3,
                 "the replacement leading with a full ISR", WAIT_S)
        assert produce(address, topic, b"before", acks=-1, timeout_ms=10_000) == 0
        committed = log_end(address, topic)

        link.cut()
        # Its lease expires; the controller elects another ISR member, in a new leader epoch.
        moved = wait_for(
            lambda: (s := (partition_states(cluster, topic, others) or {}).get(0)) is not None
            and s.leader in others and s,
            "a new leader elected while the old one cannot reach etcd", WAIT_S)
        assert "cannot reach etcd: serving on" in log.read_text()
        # The zombie still believes it leads: it takes the write, but cannot commit it.
        code = produce(address, topic, b"zombie", acks=-1, timeout_ms=3_000)
        assert code in (ErrorCode.REQUEST_TIMED_OUT.code, ErrorCode.NOT_LEADER_OR_FOLLOWER.code,
                        ErrorCode.NOT_ENOUGH_REPLICAS.code), code
        # Its followers left it, so it asks the controller to shrink the ISR; the controller
        # answers that its registration is not current: it stops leading altogether, acks=1
        # included, although it still cannot reach etcd.
        wait_for(lambda: produce(address, topic, b"zombie-acks-1", acks=1, timeout_ms=3_000)
                 == ErrorCode.NOT_LEADER_OR_FOLLOWER.code,
                 "the zombie to refuse even acks=1 writes", WAIT_S)
        assert "says its registration (epoch" in log.read_text()
        new_leader = cluster.address("broker", moved.leader)
        assert produce(new_leader, topic, b"after", acks=-1, timeout_ms=10_000) == 0

        link.restore()
        # Back in touch: lease gone, registered again, follows the new leader, truncates what
        # it appended as a zombie and catches up.
        wait_for(lambda: "lost its etcd lease" in log.read_text(), "the zombie to notice",
                 WAIT_S)
        wait_for(lambda: log_end(address, topic) == log_end(new_leader, topic)
                 == committed + 1, "the zombie's log to match the new leader's", WAIT_S)
        with Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                       "auto.offset.reset": "earliest"}) as consumer:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            values: list[bytes | None] = []
            wait_for(lambda: values.extend(r.value for r in consumer.poll(0.5)) or
                     len(values) >= committed + 1, "reading everything back", WAIT_S)
        assert values[-2:] == [b"before", b"after"], values
        assert not any(v is not None and v.startswith(b"zombie") for v in values), values
    finally:
        proc.kill()
        proc.wait()
        link.close()
