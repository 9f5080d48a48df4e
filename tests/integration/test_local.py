"""``fjord local up|status|down`` end to end, and the shared ``local_cluster`` fixture."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner, Result

from fjord._proto import broker_pb2, broker_pb2_grpc
from fjord.cli.main import cli
from fjord.local import LocalCluster, read_state
from fjord.local.cluster import pid_alive
from fjord.testing.waiting import wait_for

pytestmark = pytest.mark.integration

FJORD = [sys.executable, "-c", "from fjord.cli.main import main; main()"]
WAIT_S = 60.0


def fjord(*args: str, check: bool = True) -> Result:
    """Run the CLI in-process (the cluster's processes are children either way); this saves
    a Python start-up per command."""
    result = CliRunner().invoke(cli, list(args))
    if check:
        assert result.exit_code == 0, result.output
    return result


def status(data_dir: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(fjord("local", "status", "--data-dir", str(data_dir), "--output",
                            "json").output)


def read_cluster_config(etcd_url: str) -> dict[str, str]:
    """The cluster-config value, read through etcd's JSON gateway."""
    key = base64.b64encode(b"/fjord/local/cluster-config").decode()
    req = urllib.request.Request(f"{etcd_url}/v3/kv/range", data=json.dumps({"key": key}).encode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(base64.b64decode(json.load(resp)["kvs"][0]["value"]))  # type: ignore[no-any-return]


def test_shared_fixture_serves_metadata(local_cluster: LocalCluster, bootstrap: str) -> None:
    addresses = bootstrap.split(",")
    assert len(addresses) == 3
    with grpc.insecure_channel(addresses[0]) as channel:
        response = broker_pb2_grpc.BrokerStub(channel).Metadata(
            broker_pb2.MetadataRequest(all_topics=True), timeout=10
        )
    assert sorted(f"{b.host}:{b.port}" for b in response.brokers) == sorted(addresses)
    assert response.controller.port != 0  # an active controller is known to the brokers


def test_detached_up_status_down_and_restart(tmp_path: Path) -> None:
    data = tmp_path / "c"
    up = fjord("local", "up", "--data-dir", str(data), "--brokers", "1", "--detach",
               "--config", "num.partitions=2", "--config", "retention.ms=60000")
    assert "bootstrap servers: 127.0.0.1:" in up.output
    assert "group coordinators: 1=127.0.0.1:" in up.output
    try:
        state = status(data)
        roles = sorted(p["role"] for p in state["processes"])
        assert roles == ["broker", "controller", "controller", "coordinator", "coordinator", "etcd"]
        assert all(p["alive"] for p in state["processes"])
        broker = next(p for p in state["processes"] if p["role"] == "broker")
        assert state["bootstrap_servers"] == broker["address"]
        # The Kafka door: the broker's listener bootstraps, and Metadata names both
        # coordinators' listeners too (each coordinator opened one).
        assert f"kafka bootstrap servers: {state['kafka_bootstrap_servers']}" in up.output
        from confluent_kafka.admin import AdminClient as CKAdmin

        from fjord.kafka.defaults import COORDINATOR_NODE_ID_BASE

        nodes = CKAdmin({"bootstrap.servers": state["kafka_bootstrap_servers"]}).list_topics(
            timeout=30).brokers
        assert sorted(nodes) == [0, COORDINATOR_NODE_ID_BASE + 1, COORDINATOR_NODE_ID_BASE + 2]
        # A second `up` on a running cluster is refused, naming the way out.
        again = fjord("local", "up", "--data-dir", str(data), "--detach", check=False)
        assert again.exit_code != 0 and "fjord local down" in again.output
        # --config reached cluster-config in etcd.
        assert read_cluster_config(state["etcd_url"]) == {
            "num.partitions": "2", "retention.ms": "60000"
        }
    finally:
        down = fjord("local", "down", "--data-dir", str(data))
    assert "stopped 6 processes" in down.output
    pids = [p["pid"] for p in state["processes"]]
    assert not any(pid_alive(pid) for pid in pids)
    assert "stopped" in fjord("local", "status", "--data-dir", str(data)).output

    # Restart on the same data: etcd comes back on its ports with its data.
    fjord("local", "up", "--data-dir", str(data), "--brokers", "1", "--detach")
    try:
        restarted = status(data)
        assert restarted["etcd_url"] == state["etcd_url"]
        assert read_cluster_config(restarted["etcd_url"]) == {
            "num.partitions": "2", "retention.ms": "60000"
        }
    finally:
        fjord("local", "down", "--data-dir", str(data))


def test_foreground_up_stops_everything_on_down(tmp_path: Path) -> None:
    data = tmp_path / "fg"
    launcher = subprocess.Popen(
        [*FJORD, "local", "up", "--data-dir", str(data), "--brokers", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        def up() -> dict[str, object] | None:
            assert launcher.poll() is None, launcher.stdout.read()  # type: ignore[union-attr]
            state = read_state(data, missing_ok=True)
            ready = state and len(state["processes"]) == 6 and state["bootstrap_servers"]
            return state if ready else None

        state = wait_for(up, "the foreground cluster to be up", WAIT_S, interval=0.1)
        assert state is not None and state["launcher_pid"] == launcher.pid
        down = fjord("local", "down", "--data-dir", str(data))
        assert "foreground launcher" in down.output
        assert launcher.wait(WAIT_S) == 0
        assert not any(pid_alive(p["pid"]) for p in state["processes"])
    finally:
        if launcher.poll() is None:
            os.kill(launcher.pid, 15)
            launcher.wait(WAIT_S)


def test_bad_config_is_refused_before_starting_anything(tmp_path: Path) -> None:
    result = fjord("local", "up", "--data-dir", str(tmp_path / "x"), "--config",
                   "min.insync.replicas=zero", check=False)
    assert result.exit_code != 0 and "min.insync.replicas" in result.output
    assert not (tmp_path / "x").exists()


def test_a_port_taken_after_picking_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process grabs the picked port before the controller binds it: the launcher
    starts the controller again on a fresh port."""
    import fjord.local.cluster as cluster_module

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    real_free_port = cluster_module.free_port
    picks = iter([taken])
    monkeypatch.setattr(cluster_module, "free_port", lambda: next(picks, None) or real_free_port())
    cluster = LocalCluster(
        tmp_path / "ports", brokers=0, controllers=1, coordinators=0, unsafe_etcd_no_fsync=True
    )
    try:
        cluster.start()
        address = cluster.address("controller", 0)
        assert address != f"127.0.0.1:{taken}"
        assert cluster.active_controller() == 0
    finally:
        cluster.stop()
        squatter.close()


@pytest.mark.parametrize("role", ["controller", "broker"])
def test_a_taken_sasl_door_port_is_picked_again(tmp_path: Path, role: str) -> None:
    """Another process holds the port picked for a SASL gRPC door (a free port is only free
    a moment ago: outgoing connections take ports from the same range): the launcher starts
    that process again with every port picked afresh, its SASL door's too."""

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        cluster = LocalCluster(
            tmp_path / "sasl-ports", brokers=1, controllers=1, coordinators=0,
            unsafe_etcd_no_fsync=True, kafka_sasl=True,
        )
        cluster._sasl_grpc_ports[(role, 0)] = taken  # as if free_port() had picked it
        try:
            cluster.start()
            assert cluster.sasl_grpc_address(role, 0) != f"127.0.0.1:{taken}"
            assert cluster.process(role, 0).poll() is None
            assert cluster.active_controller() == 0
        finally:
            cluster.stop()


def assert_door_moved_off(cluster: LocalCluster, taken: str) -> None:
    """Broker 0 runs with its direct door on another port than ``taken``, and its Metadata
    advertises that port."""
    assert cluster.direct_address(0) != taken
    assert cluster.process("broker", 0).poll() is None
    metadata = cluster.broker_metadata(0)
    assert metadata is not None
    assert [b.direct_port for b in metadata.brokers] == [
        int(cluster.direct_address(0).rpartition(":")[2])]


def test_a_taken_direct_door_port_is_picked_again(tmp_path: Path) -> None:
    """The port picked for a broker's direct door is held by another process: the broker's
    start fails naming the bind, and the launcher starts it again with every port picked
    afresh, its direct door's too."""

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        cluster = LocalCluster(
            tmp_path / "direct-ports", brokers=1, controllers=1, coordinators=0,
            unsafe_etcd_no_fsync=True,
        )
        cluster._direct_ports[("broker", 0)] = taken  # as if free_port() had picked it
        try:
            cluster.start()
            assert_door_moved_off(cluster, f"127.0.0.1:{taken}")
        finally:
            cluster.stop()
        assert "direct-listen: cannot bind" in (tmp_path / "direct-ports" / "logs"
                                                 / "broker-0.log").read_text()


def test_a_broker_restarted_after_its_port_was_taken_comes_up_on_new_ports(
    tmp_path: Path,
) -> None:
    """A broker stopped and started again (a kubelet's pod, a test's restart) keeps its ports;
    when another process took one meanwhile (an outgoing connection may get it from the same
    range), start_broker picks every port again instead of failing (CI: a broker scaled in by
    the operator's kubelet harness failed for 150 s on its direct door's port)."""
    cluster = LocalCluster(
        tmp_path / "restart-ports", brokers=1, controllers=1, coordinators=0,
        unsafe_etcd_no_fsync=True,
    )
    cluster.start()
    try:
        cluster.kill("broker", 0, signal.SIGTERM)
        host, _, port = cluster.direct_address(0).rpartition(":")
        with socket.socket() as squatter:
            squatter.bind((host, int(port)))
            squatter.listen()
            cluster.start_broker(0)
            assert_door_moved_off(cluster, f"{host}:{port}")
    finally:
        cluster.stop()
