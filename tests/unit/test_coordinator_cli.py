"""`fjord coordinator` refuses bad options before starting anything, naming what is wrong; its
settings parse to the GroupConfig the machines obey; the gRPC peer becomes Kafka's client
host."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from fjord.cli.coordinator_cmd import coordinator
from fjord.coordinator import defaults
from fjord.coordinator.server import parse_coordinator_config
from fjord.coordinator.service import client_host
from fjord.errors import ConfigError


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--config", "bogus.key=1"], "bogus.key"),
        (["--config", "group.max.size=many"], "group.max.size"),
        (["--config", "offsets.commit.timeout.ms=0"], "offsets.commit.timeout.ms"),
        (["--config", "group.min.session.timeout.ms=-1"], "group.min.session.timeout.ms"),
        (["--config", "novalue"], "k=v"),
        (["--id", "-3"], "id"),
        (["--listen", "127.0.0.1:http"], "listen"),
        (["--lease-ttl", "0"], "lease-ttl"),
        (["--lag-refresh-interval", "0"], "lag-refresh-interval"),
        (["--cluster-id", "a/b"], "cluster-id"),
        (["--etcd", "https://etcd"], "etcd"),
    ],
)
def test_bad_options_fail_fast(extra: list[str], message: str) -> None:
    base = {
        "--id": "1",
        "--listen": "127.0.0.1:0",
        "--etcd": "http://127.0.0.1:1",
        "--cluster-id": "c",
    }
    args: list[str] = []
    for key, value in base.items():
        if key not in extra:
            args += [key, value]
    result = CliRunner().invoke(coordinator, args + extra)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_settings_reach_the_group_config() -> None:
    group, service = parse_coordinator_config(
        {
            "group.initial.rebalance.delay.ms": "0",
            "group.min.session.timeout.ms": "100",
            "offsets.retention.minutes": "2",
            "offsets.retention.check.interval.ms": "1000",
            "transaction.max.timeout.ms": "60000",
        }
    )
    assert group.initial_rebalance_delay_ms == 0
    assert group.min_session_timeout_ms == 100
    assert group.offsets_retention_ms == 120_000
    assert group.max_session_timeout_ms == defaults.GROUP_MAX_SESSION_TIMEOUT_MS
    assert service == {
        "offsets.retention.check.interval.ms": 1000,
        "offsets.commit.timeout.ms": defaults.OFFSETS_COMMIT_TIMEOUT_MS,
        "transaction.max.timeout.ms": 60_000,
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": 10_000,
        "transactional.id.expiration.ms": 7 * 24 * 3600 * 1000,
        "connections.max.reauth.ms": 3_600_000,
    }
    with pytest.raises(ConfigError, match=r"group\.min\.session\.timeout\.ms"):
        parse_coordinator_config(
            {"group.min.session.timeout.ms": "10", "group.max.session.timeout.ms": "5"}
        )


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:127.0.0.1:53211", "/127.0.0.1"),
        ("ipv6:[::1]:53211", "/::1"),
        ("ipv6:%5B::1%5D:53211", "/::1"),
        ("unix:/tmp/sock", "/unix:/tmp/sock"),
        ("", ""),
    ],
)
def test_client_host_is_kafkas_form(peer: str, host: str) -> None:
    class Context:
        def peer(self) -> str:
            return peer

    assert client_host(Context()) == host
