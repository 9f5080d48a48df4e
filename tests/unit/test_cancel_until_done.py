"""fjord.serving.cancel_until_done: a service's stop ends every background task even when a
cancellation is lost (grpc.aio turns the cancel of a call whose failure just arrived into
that failure; Python 3.11's asyncio.wait_for returns when a cancel meets the end of its wait).
A task that lost its cancel and looped on used to keep the broker's stop waiting forever."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from fjord.serving import cancel_until_done
from tests.helpers.replica_manager import run

#: Between two cancels of a task that has not ended (small: the test runs in milliseconds).
RETRY_S = 0.05


async def loses_one_cancel(cancels_seen: list[int]) -> None:
    """A loop that swallows the first cancellation (as a grpc.aio call answering with its
    error does), then carries on as a service loop would."""
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(3600)
    cancels_seen.append(1)
    while True:
        await asyncio.sleep(0.01)


@pytest.mark.timeout(30)
def test_a_lost_cancel_is_delivered_again() -> None:
    async def scenario() -> None:
        seen: list[int] = []
        lossy = asyncio.ensure_future(loses_one_cancel(seen))
        plain = asyncio.ensure_future(asyncio.sleep(3600))
        await asyncio.sleep(0)
        await asyncio.wait_for(cancel_until_done([lossy, plain], retry_s=RETRY_S), 10)
        assert seen == [1] and lossy.cancelled() and plain.cancelled()

    run(scenario())


def test_tasks_that_end_or_fail_are_awaited_without_raising() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    async def scenario() -> None:
        failed = asyncio.ensure_future(fails())
        done = asyncio.ensure_future(asyncio.sleep(0))
        await asyncio.sleep(0.01)
        await cancel_until_done([failed, done, asyncio.ensure_future(asyncio.sleep(5))])
        assert isinstance(failed.exception(), RuntimeError)
        await cancel_until_done([])

    run(scenario())
