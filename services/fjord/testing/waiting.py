"""One bounded wait for tests and the chaos harness: poll a condition until it holds or a deadline
passes. Polling is the only way a test can wait on another process's view (a broker's metadata, a
coordinator's group state); every wait is bounded so that a missing condition fails the test
naming what it waited for instead of hanging it.

The condition is called at once and then every ``interval`` seconds until its answer is
accepted (by default: truthy) or ``timeout`` seconds passed; exceptions of the types in
``retry_on`` count as "not yet" (the last one is named in the failure), any other exception
propagates. A probe whose real answer can be falsy (broker id 0, offset 0) passes
``accept=is_value`` (anything but None and False).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

WAIT_S = 30.0
"""Default bound of a wait: long enough for a loaded 2-core machine to elect, replicate and
rebalance, short enough that a missing condition fails the run in reasonable time."""
POLL_INTERVAL_S = 0.05
"""Default pause between two calls of the condition."""


class WaitTimeout(AssertionError):
    """The condition did not hold within the bound; the message names what was awaited, the
    bound, and the last answer or retried error. An AssertionError, so pytest reports it as a
    failed expectation."""


def is_value(result: object) -> bool:
    """Accept anything but None and False (for probes that answer 0 or an empty value)."""
    return result is not None and result is not False


def _timed_out(what: str, timeout: float, last: object, last_error: BaseException | None) -> str:
    detail = f"last error: {last_error!r}" if last_error is not None else f"last answer: {last!r}"
    return f"timed out after {timeout} s waiting for {what} ({detail})"


def wait_for(
    condition: Callable[[], T],
    what: str,
    timeout: float = WAIT_S,
    *,
    interval: float = POLL_INTERVAL_S,
    accept: Callable[[T], object] = bool,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``condition`` until ``accept(answer)`` holds and return that answer; raise
    :class:`WaitTimeout` naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    last_error: BaseException | None = None
    while True:
        try:
            last = condition()
            last_error = None
            if accept(last):
                return last
        except retry_on as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(_timed_out(what, timeout, last, last_error))
        time.sleep(interval)


async def wait_for_async(
    condition: Callable[[], Awaitable[T]],
    what: str,
    timeout: float = WAIT_S,
    *,
    interval: float = POLL_INTERVAL_S,
    accept: Callable[[T], object] = bool,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """:func:`wait_for` for a coroutine condition, sleeping on the event loop between calls."""
    deadline = time.monotonic() + timeout
    last: Any = None
    last_error: BaseException | None = None
    while True:
        try:
            last = await condition()
            last_error = None
            if accept(last):
                return last
        except retry_on as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(_timed_out(what, timeout, last, last_error))
        await asyncio.sleep(interval)


def seconds_until(
    condition: Callable[[], object], timeout: float, *, interval: float = POLL_INTERVAL_S
) -> float | None:
    """How many seconds it took until ``condition()`` was truthy, or None if it was not within
    ``timeout`` (for callers that report a timeout as a finding rather than fail on it)."""
    start = time.monotonic()
    try:
        wait_for(condition, "the condition", timeout, interval=interval)
    except WaitTimeout:
        return None
    return time.monotonic() - start
