"""The broker lease keep-alive thread's etcd connection (fjord.metadata.etcd.
BlockingLeaseRefresher, fjord.broker.lease_thread.lease_status) against a real etcd: a held
lease is renewed, a revoked one is reported gone, and an etcd that does not answer is reported
unreachable within the request timeout, never as gone."""

from __future__ import annotations

import asyncio
import time

import pytest

from fjord.broker.lease_thread import lease_status
from fjord.local.etcd import EtcdProcess, free_port
from fjord.metadata import etcd_client
from fjord.metadata.etcd import BlockingLeaseRefresher
from fjord.metadata.registration import LeaseStatus

pytestmark = pytest.mark.integration


async def grant(url: str, ttl_s: int) -> int:
    async with etcd_client(url) as client:
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
