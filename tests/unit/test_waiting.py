"""fjord.testing.waiting: the one bounded wait of the tests and the chaos harness."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from fjord.testing.waiting import WaitTimeout, is_value, seconds_until, wait_for, wait_for_async


def test_returns_the_first_accepted_answer() -> None:
    answers = iter([None, 0, [], "ready", "later"])
    assert wait_for(lambda: next(answers), "ready", 5, interval=0) == "ready"


def test_is_value_accepts_zero() -> None:
    answers = iter([None, False, 0])
    assert wait_for(lambda: next(answers), "broker 0", 5, interval=0, accept=is_value) == 0


def test_timeout_names_what_and_the_last_answer() -> None:
    with pytest.raises(WaitTimeout, match=r"waiting for the moon \(last answer: 'nope'\)"):
        wait_for(lambda: "nope", "the moon", 0.05, interval=0.01, accept=lambda a: a == "yes")


def test_retried_errors_are_named_others_propagate() -> None:
    def flaky() -> str:
        raise ConnectionError("refused")

    with pytest.raises(WaitTimeout, match="last error: ConnectionError"):
        wait_for(flaky, "a connection", 0.05, interval=0.01, retry_on=(OSError,))
    with pytest.raises(ConnectionError):
        wait_for(flaky, "a connection", 5)
    calls = itertools.count()
    assert wait_for(
        lambda: next(calls) >= 2 or flaky(), "third call", 5, interval=0, retry_on=(OSError,)
    )


def test_async_variant() -> None:
    calls = itertools.count()

    async def probe() -> int:
        return next(calls)

    assert asyncio.run(wait_for_async(probe, "three", 5, interval=0, accept=lambda n: n == 3)) == 3
    with pytest.raises(WaitTimeout):
        asyncio.run(wait_for_async(probe, "never", 0.05, interval=0.01, accept=lambda n: n < 0))


def test_seconds_until_reports_a_timeout_as_none() -> None:
    took = seconds_until(lambda: True, 5)
    assert took is not None and took < 1
    assert seconds_until(lambda: False, 0.05, interval=0.01) is None
