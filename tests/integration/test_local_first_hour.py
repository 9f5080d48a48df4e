"""A new user's first hour with ``fjord local`` (issue 13), through the CLI as a user runs it:
a refused start orphans nothing, a cluster is found from a subdirectory (or FJORD_DATA_DIR),
``up`` restarts a broker that died, a taken port is reported at once naming its holder, and a
command without a reachable cluster fails fast naming the addresses and the cause.

Each test starts its own small cluster (it kills processes or needs one in its own directory).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fjord.cli.main import cli
from fjord.local import read_state
from fjord.local.cluster import pid_alive
from fjord.local.defaults import DATA_DIR_ENV_VAR

pytestmark = pytest.mark.integration

FAST_S = 10.0  # "at once": far below the 30 s start timeout and the 15 s API timeout


def fjord(*args: str, check: bool = True) -> Result:
    result = CliRunner().invoke(cli, list(args))
    if check:
        assert result.exit_code == 0, (result.output, result.exception)
    return result


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A project directory with a running detached cluster (1 broker per default port rule
    off: free ports) in ``.fjord``; the test runs in ``project/src/deep``."""
    monkeypatch.delenv("FJORD_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv(DATA_DIR_ENV_VAR, raising=False)
    root = tmp_path / "project"
    deep = root / "src" / "deep"
    deep.mkdir(parents=True)
    monkeypatch.chdir(root)
    fjord("local", "up", "--detach", "--port", "0", "--brokers", "2", "--coordinators", "1")
    monkeypatch.chdir(deep)
    try:
        yield root
    finally:
        fjord("local", "down", "--data-dir", str(root / ".fjord"), check=False)


def alive_pids(data_dir: Path) -> dict[tuple[str, int], int]:
    state = read_state(data_dir)
    assert state is not None
    return {(p["role"], p["id"]): p["pid"] for p in state["processes"] if pid_alive(p["pid"])}


def hold_port(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_refused_start_orphans_nothing_and_up_restarts_a_dead_broker(project: Path) -> None:
    data = project / ".fjord"
    before = alive_pids(data)
    assert len(before) == 6  # etcd, 2 controllers, 2 brokers, 1 coordinator

    # Found from a subdirectory, the way git finds its repository.
    status = json.loads(fjord("local", "status", "--output", "json").output)
    assert all(p["alive"] for p in status["processes"])
    fjord("topics", "create", "--topic", "found", "--partitions", "1")
    assert "found" in fjord("topics", "list").output

    # `make run` (the quickstart) while the cluster runs: refused at once, nothing touched.
    started = time.monotonic()
    refused = fjord("quickstart", "--no-wait", check=False)
    assert refused.exit_code == 1 and "already running" in refused.output
    assert time.monotonic() - started < FAST_S
    assert alive_pids(data) == before
    again = fjord("local", "up", "--detach", check=False)
    assert again.exit_code != 0 and "fjord local down" in again.output
    assert alive_pids(data) == before

    # A broker dies: status says so, `up` starts it again on its port.
    broker = before[("broker", 1)]
    os.kill(broker, signal.SIGKILL)
    deadline = time.monotonic() + FAST_S
    while pid_alive(broker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "not running: broker 1" in fjord("local", "status").output
    address = next(p["address"] for p in status["processes"] if p["role"] == "broker"
                   and p["id"] == 1)
    filled = fjord("local", "up")
    assert "restarted broker 1 (pid " in filled.output and address in filled.output
    after = alive_pids(data)
    assert len(after) == 6 and after[("broker", 1)] != broker
    assert {k: v for k, v in after.items() if k != ("broker", 1)} == {
        k: v for k, v in before.items() if k != ("broker", 1)
    }

    # Consuming a partition whose only replica is down says so and fails, instead of
    # "Processed a total of 0 messages" and status 0.
    fjord("topics", "create", "--topic", "lonely", "--partitions", "2",
          "--replication-factor", "1")
    (described,) = json.loads(fjord("topics", "describe", "--topic", "lonely", "-o",
                                    "json").output)
    leader = described["partitions"][0]["leader"]
    os.kill(after[("broker", leader)], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        (described,) = json.loads(fjord("topics", "describe", "--topic", "lonely", "-o",
                                        "json").output)
        if described["partitions"][0]["leader"] < 0:
            break
        assert time.monotonic() < deadline, described
        time.sleep(0.2)
    stuck = fjord("consume", "--topic", "lonely", "--partition", "0", "--timeout-ms", "500",
                  check=False)
    assert stuck.exit_code == 1
    assert "warning: lonely-0 has no leader" in stuck.stderr
    assert "LEADER_NOT_AVAILABLE: lonely-0 had no leader" in stuck.stderr
    assert f"restarted broker {leader}" in fjord("local", "up").output
    after = alive_pids(data)

    # `down` stops every process, the restarted ones included.
    assert "stopped 6 processes" in fjord("local", "down").output
    assert not any(pid_alive(pid) for pid in after.values())

    # A taken port is reported at once, naming it and its holder, and nothing starts.
    state = read_state(data)
    assert state is not None and state["processes"] == []
    etcd_port = state["etcd_ports"][0]
    with hold_port(etcd_port):
        started = time.monotonic()
        clash = fjord("local", "up", "--detach", check=False)
        assert time.monotonic() - started < FAST_S
    assert clash.exit_code != 0
    assert f"etcd (client port) cannot listen on 127.0.0.1:{etcd_port}" in clash.output
    assert f"address already in use by pid {os.getpid()}" in clash.output
    with hold_port(0) as held:
        port = held.getsockname()[1]
        clash = fjord("local", "up", "--detach", "--port", str(port), check=False)
    assert clash.exit_code != 0
    assert f"broker 0 cannot listen on 127.0.0.1:{port}" in clash.output
    state = read_state(data)
    assert state is not None and state["processes"] == []


def test_data_dir_from_the_environment(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert "no local cluster" in fjord("local", "status", check=False).output
    monkeypatch.setenv(DATA_DIR_ENV_VAR, str(project / ".fjord"))
    status = json.loads(fjord("local", "status", "-o", "json").output)
    assert len(status["processes"]) == 6
    fjord("topics", "list")


def test_no_cluster_fails_fast_naming_addresses_and_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FJORD_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv(DATA_DIR_ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    with hold_port(0) as held:  # a port nobody listens on once closed
        port = held.getsockname()[1]
    address = f"127.0.0.1:{port}"
    # The default (localhost:9092) may be taken on a shared machine: point it elsewhere.
    monkeypatch.setattr("fjord.cli.client_common.DEFAULT_BOOTSTRAP_SERVERS", address)
    for command in (["topics", "list"], ["groups", "list"], ["cluster", "describe"],
                    ["consume", "--topic", "t"], ["produce", "--topic", "t"]):
        started = time.monotonic()
        result = fjord(*command, check=False)
        assert time.monotonic() - started < FAST_S, command
        assert result.exit_code == 1, (command, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert f"{address} (connection refused)" in lines[0]
        assert "bootstrap servers from the default" in lines[0]
        assert "fjord local up" in lines[0]
    explicit = fjord("topics", "list", "--bootstrap-server", f"{address},{address}", check=False)
    assert explicit.exit_code == 1 and "from --bootstrap-server" in explicit.stderr
    assert "fjord local up" not in explicit.stderr
