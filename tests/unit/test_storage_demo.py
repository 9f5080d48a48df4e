"""`fjord demo` (what `make run` runs) on a real directory: its story matches the files."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from fjord.cli.main import cli
from fjord.records import decode_records
from fjord.storage import PartitionLog


def test_demo_writes_recovers_and_leaves_a_clean_log(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["demo", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "log end offset 200, 3 segments" in out
    assert "clean shutdown=False, re-validated 1 segment(s)" in out
    assert "record 57: key=b'order-57'" in out
    log = PartitionLog.open(tmp_path / "orders-0")
    assert log.recovery is not None and log.recovery.clean_shutdown
    assert f"log end offset {log.log_end_offset} (the untorn batch survived" in out
    assert log.log_end_offset == 205
    last = list(decode_records(log.read(log.log_end_offset - 1, 10_000)))
    assert last[-1].key == b"order-204"
    log.close()
