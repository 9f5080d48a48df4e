"""Waiting on the event loop until woken or a timeout, resumed on the first turn after the
wake-up.

Python 3.11's ``asyncio.wait_for(future, timeout)`` parks the caller on a second future that a
done-callback of the first one resolves: a wake-up (``future.set_result``) runs that callback
on the next loop turn and resumes the caller only on the turn after, behind whatever else was
queued meanwhile; each wait makes two futures, a partial and a timer, and ``wait_for`` of an
``Event.wait()`` also a task. The waits here await the woken object directly (its wake-up
schedules the caller itself) with a plain timer handle for the timeout. Used where a wake-up
carries records: a broker's parked fetches (woken by an append) and a consumer's fetch loop.
"""

from __future__ import annotations

import asyncio


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def wait_woken(future: asyncio.Future[None], timeout_s: float) -> None:
    """Until ``future`` is done or ``timeout_s`` seconds passed. At the timeout this resolves
    ``future`` with None itself, so a waker must check ``future.done()`` before
    ``set_result`` (as it must anyway: the waiter may be gone). Cancelling the caller cancels
    ``future``, as awaiting it directly does."""
    if future.done():
        return
    timer = asyncio.get_running_loop().call_later(max(0.0, timeout_s), _resolve, future)
    try:
        await future
    finally:
        timer.cancel()


async def wait_event(event: asyncio.Event, timeout_s: float) -> None:
    """Until ``event`` is set or ``timeout_s`` seconds passed; at the timeout this sets
    ``event`` itself (for loops that clear their wake-up event at the top of each turn)."""
    timer = asyncio.get_running_loop().call_later(max(0.0, timeout_s), event.set)
    try:
        await event.wait()
    finally:
        timer.cancel()
