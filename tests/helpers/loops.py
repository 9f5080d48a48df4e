"""Running an asyncio scenario in a test: bounded, and failed when the loop reported an error
nobody handled."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_watched(scenario: Coroutine[Any, Any, T], bound_s: float) -> T:
    """``scenario`` on a fresh loop, failed (not hung) after ``bound_s``; fails too when the
    loop reported an error nobody handled (a task's exception never retrieved)."""
    unhandled: list[dict[str, Any]] = []

    async def watched() -> T:
        asyncio.get_running_loop().set_exception_handler(lambda _, c: unhandled.append(c))
        try:
            return await asyncio.wait_for(scenario, bound_s)
        finally:
            gc.collect()  # a dropped task reports its unretrieved exception when collected

    result = asyncio.run(watched())
    assert not unhandled, unhandled
    return result
