"""The local etcd's ports: picked ones are picked again when taken before etcd binds them;
ports that were asked for are never swapped for others."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from fjord.local import etcd as local_etcd
from fjord.local.etcd import EtcdProcess
from fjord.local.ports import PortInUseError

pytestmark = pytest.mark.integration


@pytest.fixture
def taken() -> Iterator[int]:
    """A free loopback port with a listener on it: etcd cannot bind it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_picked_port_taken_before_etcd_binds_it_is_picked_again(
    tmp_path: Path, taken: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a busy machine does between the pick and the bind (another process's listener,
    or an outgoing connection's ephemeral port), made certain: the first pick is taken."""
    picks = iter([taken])
    real_free_port = local_etcd.free_port

    def free_port_taken_first() -> int:
        return next(picks, None) or real_free_port()

    monkeypatch.setattr(local_etcd, "free_port", free_port_taken_first)
    proc = EtcdProcess(tmp_path / "data", tmp_path / "etcd.log", unsafe_no_fsync=True)
    try:
        proc.start()
        assert proc.healthy()
        assert taken not in (proc.client_port, proc.peer_port)
        assert "address already in use" in (tmp_path / "etcd.log").read_text()
    finally:
        proc.stop()


def test_a_port_asked_for_and_taken_is_refused_naming_it(tmp_path: Path, taken: int) -> None:
    peer = local_etcd.free_port()
    proc = EtcdProcess(tmp_path / "data", tmp_path / "etcd.log", client_port=taken,
                       peer_port=peer, unsafe_no_fsync=True)
    with pytest.raises(PortInUseError, match=f"etcd cannot listen on 127.0.0.1:{taken}"):
        proc.start()
    assert proc.client_port == taken
