"""``fjord topics reassign|elect-leaders|alter --replication-factor``: argument errors are
refused before any connection is made (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from fjord.cli.main import cli

# Nothing listens here: a command that got past its argument checks would time out instead.
NOWHERE = ["--bootstrap-server", "127.0.0.1:1"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topic", "t", "--partition", "0", "--replicas", "1"], "--execute, --verify"),
        (["--execute"], "--reassignment-json-file"),
        (["--topic", "t", "--execute", "--replicas", "1"], "--reassignment-json-file"),
        (["--topic", "t", "--partition", "0", "--replicas", "1,x", "--execute"], "broker ids"),
    ],
)
def test_reassign_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["topics", "reassign", *NOWHERE, *args])
    assert result.exit_code == 2
    assert message in result.output


def test_reassign_file_with_topic_is_refused(tmp_path: Path) -> None:
    plan = tmp_path / "p.json"
    plan.write_text('{"partitions":[{"topic":"t","partition":0,"replicas":[1]}]}')
    result = CliRunner().invoke(
        cli,
        ["topics", "reassign", *NOWHERE, "--reassignment-json-file", str(plan), "--topic", "t",
         "--execute"],
    )
    assert result.exit_code == 2 and "either" in result.output


def test_reassign_bad_file_is_a_typed_error(tmp_path: Path) -> None:
    plan = tmp_path / "p.json"
    plan.write_text('{"partitions": "no"}')
    result = CliRunner().invoke(
        cli, ["topics", "reassign", *NOWHERE, "--reassignment-json-file", str(plan), "--verify"]
    )
    assert result.exit_code == 1
    assert "INVALID_REPLICA_ASSIGNMENT" in result.output


def test_alter_needs_something_to_change_and_elect_partition_needs_topic() -> None:
    result = CliRunner().invoke(cli, ["topics", "alter", *NOWHERE, "--topic", "t"])
    assert result.exit_code == 1 and "--replication-factor" in result.output
    result = CliRunner().invoke(cli, ["topics", "elect-leaders", *NOWHERE, "--partition", "0"])
    assert result.exit_code == 2 and "--partition needs --topic" in result.output
