"""Registering a live process under its own etcd lease (``brokers/<id>``, ``coordinators/<id>``):
the key exists only while the process keeps the lease alive, and its create revision is the
process's epoch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from enum import Enum

import aetcd

from fjord.metadata import defaults

log = logging.getLogger(__name__)


async def register_under_lease(
    etcd: aetcd.Client,
    key: bytes,
    value: bytes,
    ttl_s: int,
    *,
    what: str,
    backoff_s: float = defaults.REGISTRATION_RETRY_BACKOFF_S,
    backoff_max_s: float = defaults.REGISTRATION_RETRY_BACKOFF_MAX_S,
    replaceable: Callable[[bytes], bool] | None = None,
) -> tuple[int, int]:
    """Create ``key`` = ``value`` bound to a new lease of ``ttl_s`` seconds, only if the key is
    absent; retry (backoff doubling from ``backoff_s`` to ``backoff_max_s``) while it exists
    (another process, or a previous run whose lease has not expired) or etcd fails. Returns
    (lease id, etcd revision of the registration). ``what`` names the process in logs.

    ``replaceable(existing value)``: True when the registration found is this process's own
    previous run (the caller proves it, e.g. by the incarnation its data directory recorded
    under an exclusive lock): it is deleted at once, guarded by its mod revision so that a
    registration made meanwhile by anyone else is never touched, and the creation retried
    without waiting for the old lease to expire. A registration of anyone else is never
    replaced."""
    backoff = backoff_s
    while True:
        lease = None
        try:
            lease = await etcd.lease(ttl_s)
            ok, responses = await etcd.transaction(
                compare=[etcd.transactions.create(key) == 0],
                success=[etcd.transactions.put(key, value, lease=lease.id)],
                failure=[],
            )
            if ok:
                revision = int(responses[0].response_put.header.revision)
                log.info("%s registered (epoch %d)", what, revision)
                return lease.id, revision
            if replaceable is not None and await take_back_registration(
                etcd, key, replaceable, what
            ):
                await etcd.revoke_lease(lease.id)
                continue
            log.warning(
                "%s is already registered (another process, or a previous run whose lease has "
                "not expired yet); retrying",
                what,
            )
            await etcd.revoke_lease(lease.id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("registering %s failed: %s; retrying in %.1f s", what, exc, backoff)
            if lease is not None:
                with contextlib.suppress(Exception):
                    await etcd.revoke_lease(lease.id)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, backoff_max_s)


class LeaseStatus(Enum):
    """What one keep-alive of a registration's lease learned."""

    HELD = "held"  # etcd renewed it
    UNREACHABLE = "unreachable"  # no answer: etcd is away, nothing is known about the lease
    GONE = "gone"  # etcd says it expired or was revoked: the registration no longer exists


async def take_back_registration(
    etcd: aetcd.Client, key: bytes, replaceable: Callable[[bytes], bool], what: str
) -> bool:
    """Delete the registration at ``key`` if ``replaceable`` says it is our own previous run's
    and nobody changed it since we read it; True when it was deleted."""
    found = await etcd.get(key)
    if found is None or not replaceable(found.value):
        return False
    ok, _ = await etcd.transaction(
        compare=[etcd.transactions.mod(key) == found.mod_revision],
        success=[etcd.transactions.delete(key)],
        failure=[],
    )
    if not ok:
        return False
    log.info("%s: took back the registration of its own previous run (epoch %d) without "
             "waiting for its lease to expire", what, found.create_revision)
    if found.lease:
        with contextlib.suppress(Exception):
            await etcd.revoke_lease(found.lease)
    return True


async def refresh_lease_once(etcd: aetcd.Client, lease_id: int | None, *, what: str) -> LeaseStatus:
    """Refresh the lease once and say what etcd answered (never raises but for cancellation).

    UNREACHABLE is not GONE: while etcd cannot be reached nobody can act on the lease's expiry
    (no controller can write metadata either), so a caller that keeps serving meanwhile only
    has to stop once a newer epoch exists, which it learns from metadata."""
    if lease_id is None:
        return LeaseStatus.GONE
    try:
        reply = await etcd.refresh_lease(lease_id)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning("%s: lease refresh failed: %s", what, exc)
        return LeaseStatus.UNREACHABLE
    if reply is None or reply.TTL <= 0:
        return LeaseStatus.GONE
    return LeaseStatus.HELD


async def lease_still_held(
    etcd: aetcd.Client, lease_id: int | None, last_ok: float, ttl_s: int, *, what: str
) -> float | None:
    """Refresh the lease once. Returns the monotonic time of the last successful refresh (now,
    or ``last_ok`` when etcd could not be reached but the lease cannot have expired yet), or
    None when the lease is gone: etcd says so, or no refresh succeeded for ``ttl_s``."""
    status = await refresh_lease_once(etcd, lease_id, what=what)
    if status is LeaseStatus.HELD:
        return time.monotonic()
    if status is LeaseStatus.UNREACHABLE and time.monotonic() - last_ok < ttl_s:
        return last_ok
    return None
