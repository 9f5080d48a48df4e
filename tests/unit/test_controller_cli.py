"""`fjord controller --config` takes the SASL door's ``connections.max.reauth.ms`` apart from
the cluster defaults, and refuses a bad value naming it before starting anything."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from fjord.cli.controller_cmd import controller


@pytest.mark.parametrize(("value", "message"), [
    ("-5", "connections.max.reauth.ms: -5 is below the minimum 0"),
    ("soon", "connections.max.reauth.ms: expected an integer"),
])
def test_a_bad_session_lifetime_fails_fast(value: str, message: str) -> None:
    result = CliRunner().invoke(controller, [
        "--id", "0", "--listen", "127.0.0.1:0", "--etcd", "http://127.0.0.1:1",
        "--cluster-id", "c", "--config", f"connections.max.reauth.ms={value}",
        "--config", "num.partitions=3"])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_other_keys_are_still_cluster_config() -> None:
    result = CliRunner().invoke(controller, [
        "--id", "0", "--listen", "127.0.0.1:0", "--etcd", "http://127.0.0.1:1",
        "--cluster-id", "c", "--config", "connections.max.reauth.ms=1000",
        "--config", "bogus.key=1"])
    assert result.exit_code == 2 and "bogus.key: unknown cluster config" in result.output
