"""``FJORD_METRICS_HOST`` decides where /metrics binds when a service gives no host: loopback by
default, ``0.0.0.0`` in the container image (so Kubernetes probes and Prometheus reach pods)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest

from fjord.errors import ConfigError
from fjord.observability import metrics
from fjord.observability.defaults import METRICS_HOST, METRICS_HOST_ENV


@pytest.fixture
def started() -> Iterator[list[int]]:
    ports: list[int] = []
    yield ports
    for port in ports:
        metrics.stop_metrics_server(port)


def bound_host(port: int) -> str:
    return str(metrics._servers[port].server_address[0])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def test_without_the_variable_metrics_bind_loopback(
    monkeypatch: pytest.MonkeyPatch, started: list[int]
) -> None:
    monkeypatch.delenv(METRICS_HOST_ENV, raising=False)
    started.append(metrics.start_metrics_server(0))
    assert bound_host(started[0]) == METRICS_HOST == "127.0.0.1"


def test_the_variable_makes_metrics_bind_every_interface(
    monkeypatch: pytest.MonkeyPatch, started: list[int]
) -> None:
    monkeypatch.setenv(METRICS_HOST_ENV, "0.0.0.0")
    started.append(metrics.start_metrics_server(0))
    assert bound_host(started[0]) == "0.0.0.0"
    assert "fjord_build_info" in scrape(started[0])


def test_an_explicit_host_wins_over_the_variable(
    monkeypatch: pytest.MonkeyPatch, started: list[int]
) -> None:
    monkeypatch.setenv(METRICS_HOST_ENV, "0.0.0.0")
    started.append(metrics.start_metrics_server(0, host="127.0.0.1"))
    assert bound_host(started[0]) == "127.0.0.1"


def test_a_host_that_cannot_be_bound_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(METRICS_HOST_ENV, "192.0.2.1")  # TEST-NET-1: never a local address
    with pytest.raises(ConfigError, match=r"cannot serve metrics on 192\.0\.2\.1:0"):
        metrics.start_metrics_server(0)
