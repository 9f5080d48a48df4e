"""`fjord broker` refuses bad options before starting anything, naming what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from fjord.cli.broker_cmd import broker


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--config", "bogus.key=1"], "bogus.key"),
        (["--config", "segment.bytes=big"], "segment.bytes"),
        (["--config", "novalue"], "k=v"),
        (["--config", "auto.create.topics.enable=true"], "auto.create.topics.enable"),
        (["--config", "connections.max.reauth.ms=-5"], "connections.max.reauth.ms"),
        (["--id", "-3"], "id"),
        (["--listen", "127.0.0.1:http"], "listen"),
        (["--lease-ttl", "0"], "lease-ttl"),
        (["--loop-stall-limit", "0.5"], "loop-stall-limit"),
        (["--cluster-id", "a/b"], "cluster-id"),
        (["--etcd", "https://etcd"], "etcd"),
    ],
)
def test_bad_options_fail_fast(tmp_path: Path, extra: list[str], message: str) -> None:
    base = {
        "--id": "1",
        "--listen": "127.0.0.1:0",
        "--data-dir": str(tmp_path / "data"),
        "--etcd": "http://127.0.0.1:1",
        "--cluster-id": "c",
    }
    args: list[str] = []
    for key, value in base.items():
        if key not in extra:
            args += [key, value]
    result = CliRunner().invoke(broker, args + extra)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "data").exists()  # nothing was created
