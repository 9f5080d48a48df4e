"""Which loopback ports a local cluster may listen on, and who holds one that is taken.

Pure of cluster state: ``fjord local up`` and the launcher check every fixed port (etcd's ports
remembered from the last run, ``--port`` for the brokers) *before* starting a process, so a
clash is reported at once and names the port and, when this user can see it, the process that
holds it (a cluster left running by an earlier ``up``, a Kafka broker, ...).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from fjord.cluster.defaults import DEFAULT_BROKER_PORT
from fjord.local.defaults import LOOPBACK_HOST
from fjord.local.etcd import ProcessStartError


class PortInUseError(ProcessStartError):
    """A port the local cluster must listen on is taken; the message names it and its holder.
    A port that was asked for (``--port``, or etcd's remembered ports, which its data directory
    needs) is never swapped for another; ports the launcher picked itself are picked again."""

    port_in_use = True


def port_in_use(port: int, host: str = LOOPBACK_HOST) -> bool:
    """True when something listens on ``host:port`` (or on every address at ``port``).

    Binds with SO_REUSEADDR, as our servers do, so sockets left in TIME_WAIT by a cluster that
    just stopped do not count as "in use"; a listener does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
        return False


def _listening_inodes(port: int) -> set[str]:
    """Inodes of sockets listening on ``port`` (IPv4 and IPv6), from /proc/net/tcp*."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) <= 9 or fields[3] != "0A":  # 0A: LISTEN
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def port_holder(port: int) -> str | None:
    """``pid N (command line)`` of a process of this user listening on ``port``, or None when
    none is visible (another user's process, or no /proc)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in targets:
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    command = " ".join(a.decode(errors="replace") for a in argv if a)
                    return f"pid {entry.name} ({command[:120]})"
        except OSError:
            continue
    return None


def port_clash_message(what: str, port: int, host: str = LOOPBACK_HOST) -> str:
    """``<what> cannot listen on host:port: address already in use by pid N (...)``."""
    holder = port_holder(port)
    by = f" by {holder}" if holder else ""
    return f"{what} cannot listen on {host}:{port}: address already in use{by}"


def check_ports_free(ports: dict[str, int], host: str = LOOPBACK_HOST) -> None:
    """Raise PortInUseError for the first taken port of ``{what: port}`` (port 0: any port,
    never checked)."""
    for what, port in ports.items():
        if port and port_in_use(port, host):
            raise PortInUseError(port_clash_message(what, port, host))


def choose_broker_port(requested: int | None, brokers: int) -> tuple[int, str | None]:
    """The first broker port for ``fjord local up``/``quickstart`` and a note for the user.

    ``requested`` None: :data:`DEFAULT_BROKER_PORT` (9092, Kafka's) when it and the next
    ``brokers - 1`` ports are free, else 0 (free ports picked by the system) with a note naming
    the port that is taken. ``requested`` 0: free ports. Any other value: that port, whether
    free or not (the launcher then refuses a taken one with PortInUseError)."""
    if requested is not None:
        return requested, None
    for offset in range(brokers):
        port = DEFAULT_BROKER_PORT + offset
        if port_in_use(port):
            holder = port_holder(port)
            by = f" by {holder}" if holder else ""
            return 0, (
                f"note: port {port} is in use{by}; the brokers listen on free ports instead "
                f"(give --port N to choose)"
            )
    return DEFAULT_BROKER_PORT, None
