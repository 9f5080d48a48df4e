"""A replica fetcher's stop ends its task even when the cancellation is lost.

Issue 12's chaos run with seed 81365904: one broker stopped applying metadata for good. Its log
shows why: the controller moved the last partitions this broker followed on broker 1 (then
dead) away, the metadata applier stopped that fetcher (``ReplicaFetcherManager.update``), and
the fetcher logged one more "fetch from broker 1 failed (UNAVAILABLE)" 3 ms after the change,
then nothing; no later metadata reached the broker (it acted as leader of a partition it had
lost 4 s before) and its shutdown never finished. ``SourceFetcher.stop`` cancelled the task
and awaited it; the cancel was lost, the task looped on, and the applier awaited it forever.

A cancellation is lost in two ways these tests reproduce deterministically: grpc.aio's unary
call swallows the CancelledError in ``_invoke`` and, when the call's failure has just arrived,
raises that RpcError instead (the call ``FailingAsCancelled`` below behaves exactly so); and
Python 3.11's ``asyncio.wait_for`` returns the inner result when the cancel arrives as the
inner wait completes (the fetcher's pause, woken by a target change in the same loop step).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from fjord.broker.fetcher import SourceFetcher
from fjord.broker.replica_manager import ReplicaManager
from fjord.broker.replication import FollowerTarget
from fjord.broker.server import MetadataApplier
from fjord.metadata import PartitionState
from fjord.storage import LogManager
from fjord.testing.waiting import wait_for_async
from fjord.topic_partition import TopicPartition
from tests.helpers.replica_manager import BROKER, Cluster, run

LEADER = 2
#: How long stop() may take in these tests: the fetcher's task ends at its next check, at once.
STOP_BOUND_S = 2.0


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[ReplicaManager]:
    logs = LogManager(tmp_path / "data")
    yield ReplicaManager(BROKER, logs)
    logs.close()


class FailingAsCancelled:
    """A leader link whose fetch behaves as grpc.aio's unary call does (the fetcher's call to
    a leader without FetchStream) when it is cancelled just as its UNAVAILABLE failure
    arrives: the await raises that AioRpcError, not CancelledError (grpc/aio/_call.py:
    ``_invoke`` catches the CancelledError, ``cancel()`` finds the call done, ``__await__``
    raises the call's status)."""

    def __init__(self) -> None:
        self.calls = 0
        self.in_flight = asyncio.Event()
        self.address = "127.0.0.1:1"

    async def fetch(self, _request: Any, timeout_s: float) -> Any:
        self.calls += 1
        self.in_flight.set()
        with contextlib.suppress(asyncio.CancelledError):  # as grpc.aio's _invoke does
            await asyncio.sleep(timeout_s)
        raise aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE, aio.Metadata(), aio.Metadata(), "connection refused"
        )


class StubbedFetcher(SourceFetcher):
    def __init__(self, manager: ReplicaManager, stub: FailingAsCancelled) -> None:
        super().__init__(LEADER, manager, lambda _id: "127.0.0.1:1", lambda: 1)
        self.stub = stub

    async def _leader_link(self) -> Any:
        return self.stub


async def stop_within_bound(fetcher: SourceFetcher) -> None:
    stopping = asyncio.ensure_future(fetcher.stop())
    done, _ = await asyncio.wait({stopping}, timeout=STOP_BOUND_S)
    assert done, f"the fetcher's stop did not return within {STOP_BOUND_S} s"
    stopping.result()


async def followed(manager: ReplicaManager) -> dict[TopicPartition, FollowerTarget]:
    state = PartitionState((BROKER, LEADER), (BROKER, LEADER), LEADER, 3, 3)
    await manager.apply_metadata(Cluster().topic("t", [state]))
    targets = manager.follower_targets()
    assert targets == {TopicPartition("t", 0): FollowerTarget(LEADER, 3)}
    return targets


# Before the fix a lost cancel left the fetcher's task running forever (asyncio.run then waits
# for it at the end): the timeout turns that hang into a failure.
@pytest.mark.timeout(30)
def test_stop_ends_a_fetcher_whose_cancel_grpc_turned_into_the_calls_error(
    manager: ReplicaManager,
) -> None:
    async def scenario() -> None:
        stub = FailingAsCancelled()
        fetcher = StubbedFetcher(manager, stub)
        fetcher.set_targets(await followed(manager))
        fetcher.start()
        await asyncio.wait_for(stub.in_flight.wait(), STOP_BOUND_S)
        # Before the fix this waited forever: the task took the RpcError for a failed fetch,
        # backed off and fetched again.
        await stop_within_bound(fetcher)
        assert stub.calls == 1  # no Fetch sent after the stop began

    run(scenario())


@pytest.mark.timeout(30)
def test_stop_ends_a_fetcher_whose_pause_swallowed_the_cancel(manager: ReplicaManager) -> None:
    async def scenario() -> None:
        # Targets this broker does not follow: the task only pauses, woken by target changes.
        fetcher = SourceFetcher(LEADER, manager, lambda _id: None, lambda: 1)
        fetcher.set_targets({TopicPartition("t", 0): FollowerTarget(LEADER, 1)})
        fetcher.start()
        task = fetcher._task
        assert task is not None
        for _ in range(3):  # let it reach its pause (nothing to fetch)
            await asyncio.sleep(0)
        assert not task.done()
        # A target change and the stop in the same loop step (two metadata changes applied
        # back to back): on Python 3.11, wait_for sees its inner wait done and returns.
        fetcher.set_targets({TopicPartition("t", 0): FollowerTarget(LEADER, 2)})
        await stop_within_bound(fetcher)
        assert task.done()

    run(scenario())


def test_the_pause_race_is_real_on_this_python() -> None:
    """Guards the test above: on Python before 3.12, wait_for loses a cancel that arrives as
    its inner wait completes (if this starts failing, the interpreter fixed it)."""

    async def scenario() -> bool:
        event = asyncio.Event()

        async def pause() -> None:
            await asyncio.wait_for(event.wait(), 10)

        task = asyncio.ensure_future(pause())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        event.set()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return False
        return True

    lost = run(scenario())
    assert lost == (sys.version_info < (3, 12))


def test_a_slow_metadata_apply_is_logged_with_where_it_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A stuck apply holds every later metadata change back: the applier says so, naming the
    revision and the await it is stuck in, then carries on once the apply ends."""

    async def scenario() -> None:
        release = asyncio.Event()

        async def stuck_in_a_fetcher_stop() -> None:
            await release.wait()

        async def apply(_image: Any) -> None:
            await stuck_in_a_fetcher_stop()

        applier = MetadataApplier(apply, slow_after_s=0.05)
        runner = asyncio.ensure_future(applier.run())
        image = Cluster().topic("t", [PartitionState((BROKER,), (BROKER,), BROKER, 0, 0)])
        applier.offer(image, image)
        with caplog.at_level(logging.WARNING, logger="fjord.broker.server"):
            await wait_for_async(
                lambda: asyncio.sleep(0, "has taken" in caplog.text), "the slow-apply warning",
                STOP_BOUND_S,
            )
        assert f"applying metadata revision {image.revision} has taken" in caplog.text
        assert "stuck_in_a_fetcher_stop (test_fetcher_stop.py:" in caplog.text
        release.set()
        await applier.wait_applied(image.revision, STOP_BOUND_S)
        runner.cancel()
        await asyncio.wait({runner})

    run(scenario())
