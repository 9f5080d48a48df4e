"""fjord.wakeups: a woken waiter resumes on the first loop turn after its wake-up (before a
callback queued right after the wake-up; Python 3.11's asyncio.wait_for resumes it a turn
later, behind that callback), a timeout ends the wait, and cancelling the waiter works."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from fjord.wakeups import wait_event, wait_woken

#: A timeout no test reaches unless the code under test is broken.
NEVER_S = 60.0


def resumed_before_next_callback(
    waiter: object, wake: object, make: object
) -> list[str]:
    """Order in which the woken waiter and a callback queued just after the wake-up ran."""

    async def scenario() -> list[str]:
        order: list[str] = []
        woken = make()  # type: ignore[operator]

        async def wait() -> None:
            await waiter(woken, NEVER_S)  # type: ignore[operator]
            order.append("waiter")

        task = asyncio.ensure_future(wait())
        await asyncio.sleep(0)  # the waiter is parked
        wake(woken)  # type: ignore[operator]
        asyncio.get_running_loop().call_soon(order.append, "next callback")
        await asyncio.wait_for(task, NEVER_S)
        return order

    return asyncio.run(scenario())


def new_future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


def test_woken_future_resumes_on_the_next_turn() -> None:
    order = resumed_before_next_callback(
        wait_woken, lambda f: f.set_result(None), new_future
    )
    assert order == ["waiter", "next callback"]


def test_wait_for_of_python_3_11_resumes_a_turn_later() -> None:
    """What the module avoids (on 3.12+ wait_for awaits directly: then both orders agree)."""
    import sys

    async def via_wait_for(future: asyncio.Future[None], timeout_s: float) -> None:
        await asyncio.wait_for(future, timeout_s)

    order = resumed_before_next_callback(
        via_wait_for, lambda f: f.set_result(None), new_future
    )
    expected = ["next callback", "waiter"] if sys.version_info < (3, 12) else [
        "waiter", "next callback"]
    assert order == expected


def test_set_event_resumes_on_the_next_turn() -> None:
    order = resumed_before_next_callback(wait_event, lambda e: e.set(), asyncio.Event)
    assert order == ["waiter", "next callback"]


def test_timeout_resolves_the_future_and_a_late_waker_sees_it_done() -> None:
    async def scenario() -> None:
        future = new_future()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await wait_woken(future, 0.01)
        assert future.done() and future.result() is None
        assert loop.time() - started >= 0.01 - 0.002  # (the loop's clock resolution)

    asyncio.run(scenario())


def test_timeout_sets_the_event() -> None:
    async def scenario() -> None:
        event = asyncio.Event()
        await wait_event(event, 0.01)
        assert event.is_set()

    asyncio.run(scenario())


def test_already_done_future_returns_at_once() -> None:
    async def scenario() -> None:
        future = new_future()
        future.set_result(None)
        await wait_woken(future, NEVER_S)
        assert not asyncio.get_running_loop()._scheduled  # no timer left behind

    asyncio.run(scenario())


@pytest.mark.parametrize("kind", ["future", "event"])
def test_cancelling_the_waiter_ends_it_and_leaves_no_timer(kind: str) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        future = new_future()
        event = asyncio.Event()
        task = asyncio.ensure_future(
            wait_woken(future, NEVER_S) if kind == "future" else wait_event(event, NEVER_S)
        )
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()
        if kind == "future":
            assert future.cancelled()  # a waker's done() check then skips it
        else:
            assert not event.is_set()
        assert all(h.cancelled() for h in loop._scheduled)  # type: ignore[attr-defined]

    asyncio.run(scenario())
