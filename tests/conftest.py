"""Shared fixtures for every test directory (all engineers); moved here from
tests/integration/conftest.py so that tests/integration and tests/spark share ONE session cluster.

- ``etcd``: a bare single-member etcd (session scope); use a fresh ``cluster_id`` per test so
  tests never see each other's keys.
- ``local_cluster``: a started :class:`fjord.local.LocalCluster` (etcd, 2 controllers,
  3 brokers, 2 group coordinators with ``group.initial.rebalance.delay.ms`` 300 instead of
  Kafka's 3000) in a temporary directory, shared by the whole session and stopped at the end.
  Tests must not stop its processes; tests that kill processes start their own cluster.
- ``bootstrap``: the shared cluster's bootstrap servers (``host:port,host:port,...``);
  ``kafka_bootstrap``: its brokers' Kafka-protocol listeners, for Kafka clients.
- ``no_global_instrumentation``: for one test, this process as if it had no global tracer
  provider and served no ``/metrics``, whatever earlier tests in the process installed.

Hypothesis runs without its per-example deadline (profile ``fjord``, loaded here before any test
module builds its ``settings``): on a loaded machine one example of a property test can take a
descheduled 300 ms, and Hypothesis then replays it, finds it fast and fails the test as
"Unreliable test timings". The property tests bound their work by their strategies instead.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from fjord.local.etcd import EtcdProcess

settings.register_profile("fjord", deadline=None)
settings.load_profile("fjord")


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    base = tmp_path_factory.mktemp("etcd")
    proc = EtcdProcess(base / "data", base / "etcd.log", unsafe_no_fsync=True)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def cluster_id() -> str:
    """A cluster id no other test uses (its own key prefix in a shared etcd)."""
    return f"test-{uuid.uuid4().hex[:12]}"


def _local_cluster_factory(base: Path):  # type: ignore[no-untyped-def]
    from fjord.local.cluster import LocalCluster

    # Kafka's 3 s initial rebalance delay would only make every new test group wait.
    return LocalCluster(
        base,
        brokers=3,
        unsafe_etcd_no_fsync=True,
        coordinator_config={"group.initial.rebalance.delay.ms": "300"},
    )


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    cluster = _local_cluster_factory(tmp_path_factory.mktemp("fjord-local"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def bootstrap(local_cluster) -> str:  # type: ignore[no-untyped-def]
    return str(local_cluster.bootstrap_servers)


@pytest.fixture
def no_global_instrumentation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hide the process-wide instrumentation that earlier tests may have left (a global tracer
    provider, running /metrics servers) for this test, so that the clients' bare path is
    tested whatever ran before. OpenTelemetry has no API to unset its global provider: its
    module variable is swapped back by ``monkeypatch`` after the test; the /metrics servers keep
    serving, only fjord's registry of them looks empty meanwhile."""
    from opentelemetry import trace

    from fjord.observability import metrics

    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(metrics, "_servers", {})


@pytest.fixture(scope="session")
def kafka_bootstrap(local_cluster) -> str:  # type: ignore[no-untyped-def]
    return str(local_cluster.kafka_bootstrap_servers)
