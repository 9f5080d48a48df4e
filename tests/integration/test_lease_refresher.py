"""The broker lease keep-alive thread's etcd connection (fjord.metadata.etcd.
BlockingLeaseRefresher, fjord.broker.lease_thread.lease_status) against a real etcd: a held
lease is renewed, a revoked one is reported gone, and an etcd that does not answer is reported
unreachable within the request timeout, never as gone."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from fjord.broker.lease_thread import lease_status
from fjord.local.cluster import LocalCluster
from fjord.local.etcd import EtcdProcess, free_port
from fjord.metadata import etcd_client
from fjord.metadata.etcd import BlockingLeaseRefresher
from fjord.metadata.registration import LeaseStatus
from fjord.security import ClientSecurity

pytestmark = pytest.mark.integration


async def grant(url: str, ttl_s: int, security: ClientSecurity | None = None) -> int:
    async with etcd_client(url, security=security) as client:
        return int((await client.lease(ttl_s)).id)


async def revoke(url: str, lease_id: int) -> None:
    async with etcd_client(url) as client:
        await client.revoke_lease(lease_id)


def test_held_then_gone(etcd: EtcdProcess) -> None:
    lease_id = asyncio.run(grant(etcd.url, 30))
    refresher = BlockingLeaseRefresher(etcd.url)
    try:
        assert refresher.refresh(lease_id) == 30
        assert lease_status(refresher, lease_id, "test") is LeaseStatus.HELD
        asyncio.run(revoke(etcd.url, lease_id))
        assert lease_status(refresher, lease_id, "test") is LeaseStatus.GONE
    finally:
        refresher.close()


def test_unreachable_within_the_timeout() -> None:
    refresher = BlockingLeaseRefresher(f"http://127.0.0.1:{free_port()}", timeout_s=1.0)
    try:
        start = time.monotonic()
        assert lease_status(refresher, 1234, "test") is LeaseStatus.UNREACHABLE
        assert time.monotonic() - start < 10  # bounded by the timeout, not hanging
    finally:
        refresher.close()


def test_renews_over_tls(tmp_path: Path) -> None:
    """A secured cluster's etcd takes only clients with a certificate of the cluster CA: the
    refresher dials with TLS and that certificate, as the broker's thread does with the
    process's own."""
    cluster = LocalCluster(tmp_path / "secure", brokers=0, coordinators=0, secure=True,
                           unsafe_etcd_no_fsync=True)
    cluster.start()
    try:
        assert cluster.etcd_url.startswith("https://")
        security = ClientSecurity.from_config(cluster.client_config)
        lease_id = asyncio.run(grant(cluster.etcd_url, 30, security))
        refresher = BlockingLeaseRefresher(cluster.etcd_url, security=security)
        try:
            assert refresher.refresh(lease_id) == 30
        finally:
            refresher.close()
        without_certificate = BlockingLeaseRefresher(
            cluster.etcd_url.replace("https://", "http://"), timeout_s=2.0)
        try:  # plaintext against the TLS port: no answer, reported unreachable, not gone
            assert lease_status(without_certificate, lease_id, "test") is LeaseStatus.UNREACHABLE
        finally:
            without_certificate.close()
    finally:
        cluster.stop()
