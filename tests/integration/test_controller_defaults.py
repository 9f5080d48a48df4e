"""``num.partitions`` and ``default.replication.factor`` take effect where topics are created: a
real ``fjord controller --config ...`` process (as the operator starts one from a FjordCluster's
``spec.brokers.config``) gives them to CreateTopics asking for -1, etcd's ``cluster-config``
overrides them key by key, and a bad value stops the controller before it starts, naming the key.

Brokers are their etcd registrations (all the controller sees of them), as in test_controller.
"""

from __future__ import annotations

import asyncio
import functools
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import grpc
import pytest

from fjord._proto import controller_pb2, controller_pb2_grpc
from fjord.local.cluster import _FJORD
from fjord.local.etcd import EtcdProcess, free_port, stop_process
from fjord.metadata import BrokerRegistration, ClusterConfig, Keys, etcd_client
from fjord.testing.waiting import wait_for

pytestmark = pytest.mark.integration

RPC_TIMEOUT_S = 10.0


PORT_ATTEMPTS = 3


def serving_or_exited(proc: subprocess.Popen[bytes], log_path: Path) -> bool:
    return proc.poll() is not None or b"serving on" in log_path.read_bytes()


def start_controller(
    etcd: EtcdProcess, cluster_id: str, tmp_path: Path
) -> tuple[subprocess.Popen[bytes], str, IO[bytes]]:
    """A controller with cluster defaults, serving: (process, address, its open log). A port
    from free_port() was only free a moment ago (outgoing connections take ports from the same
    range): a controller that exited because it could not bind is started again on a new
    port, at most PORT_ATTEMPTS times."""
    for attempt in range(PORT_ATTEMPTS):
        address = f"127.0.0.1:{free_port()}"
        log_path = tmp_path / f"controller-{attempt}.log"
        log = log_path.open("wb")
        proc = subprocess.Popen(
            [*_FJORD, "controller", "--id", "0", "--listen", address, "--etcd", etcd.url,
             "--cluster-id", cluster_id, "--lease-ttl", "3",
             "--config", "num.partitions=4", "--config", "default.replication.factor=2",
             "--config", "retention.ms=60000"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        wait_for(functools.partial(serving_or_exited, proc, log_path),
                 "the controller to serve or exit")
        if proc.poll() is None:
            return proc, address, log
        log.close()
        output = log_path.read_text(errors="replace")
        if "cannot bind" not in output or attempt == PORT_ATTEMPTS - 1:
            raise AssertionError(f"controller exited with {proc.returncode}:\n{output}")
    raise AssertionError("unreachable")


@pytest.fixture
def controller(
    etcd: EtcdProcess, cluster_id: str, tmp_path: Path
) -> Iterator[controller_pb2_grpc.ControllerStub]:
    """One controller started with cluster defaults, three registered brokers."""
    proc, address, log = start_controller(etcd, cluster_id, tmp_path)
    keys = Keys(cluster_id)

    async def register_brokers() -> None:
        async with etcd_client(etcd.url) as client:
            lease = await client.lease(60)
            for broker_id in (1, 2, 3):
                registration = BrokerRegistration(broker_id, "127.0.0.1", 1000 + broker_id, None)
                await client.put(
                    keys.broker(broker_id).encode(), registration.to_json(), lease=lease
                )

    asyncio.run(register_brokers())
    channel = grpc.insecure_channel(address)
    try:
        yield controller_pb2_grpc.ControllerStub(channel)
    finally:
        channel.close()
        stop_process(proc)
        log.close()


def create_with_defaults(
    stub: controller_pb2_grpc.ControllerStub, name: str
) -> controller_pb2.CreateTopicResult:
    """CreateTopics asking for the cluster defaults (-1, -1), once the controller is active
    and sees the three brokers."""

    def attempt() -> controller_pb2.CreateTopicResult | None:
        request = controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(name=name, num_partitions=-1,
                                                  replication_factor=-1)]
        )
        try:
            result = stub.CreateTopics(request, timeout=RPC_TIMEOUT_S).results[0]
        except grpc.RpcError:
            return None  # not serving yet
        return result if result.error.code == 0 else None

    return wait_for(attempt, f"topic {name!r} created with the cluster defaults")


def test_controller_config_gives_new_topics_their_defaults(
    controller: controller_pb2_grpc.ControllerStub, etcd: EtcdProcess, cluster_id: str
) -> None:
    result = create_with_defaults(controller, "defaults")
    assert (result.num_partitions, result.replication_factor) == (4, 2)
    assert retention_of(controller, "defaults") == "60000"  # a topic default of --config

    # etcd's cluster-config (fjord local up --config) wins key by key; the rest stays.
    async def put_cluster_config() -> None:
        async with etcd_client(etcd.url) as client:
            await client.put(
                Keys(cluster_id).cluster_config.encode(),
                ClusterConfig({"num.partitions": "6", "retention.ms": "120000"}).to_json(),
            )

    asyncio.run(put_cluster_config())
    wait_for(lambda: retention_of(controller, "defaults") == "120000",
             "the controller to see the new cluster-config")
    result = create_with_defaults(controller, "wider")
    assert (result.num_partitions, result.replication_factor) == (6, 2)


def retention_of(stub: controller_pb2_grpc.ControllerStub, topic: str) -> str:
    described = stub.DescribeConfigs(
        controller_pb2.DescribeConfigsRequest(topics=[topic]), timeout=RPC_TIMEOUT_S
    )
    return next(e.value for e in described.results[0].entries if e.name == "retention.ms")


@pytest.mark.parametrize(
    ("item", "named"),
    [
        ("num.partitions=0", "num.partitions: 0 is below the minimum 1"),
        ("replica.lag.time.max.ms=10", "replica.lag.time.max.ms: unknown cluster config"),
        ("num.partitions", "expected k=v"),
    ],
)
def test_a_bad_controller_config_stops_it_naming_the_key(item: str, named: str) -> None:
    done = subprocess.run(
        [*_FJORD, "controller", "--id", "0", "--listen", "127.0.0.1:0",
         "--etcd", "http://127.0.0.1:1", "--cluster-id", "x", "--config", item],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert named in done.stderr
