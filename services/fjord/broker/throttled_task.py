"""What the broker's throttled background tasks share (the log cleaner, the scrubber): their
settings (``<prefix>.enable``, ``.io.max.bytes.per.second``, ``.backoff.ms``), a read
throttle, and a backoff that a dynamic broker config change ends."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Generic, Protocol, TypeVar

from fjord.storage.scrub import ScrubThrottle


class TaskSettings(Protocol):
    @property
    def enable(self) -> bool: ...

    @property
    def io_max_bytes_per_second(self) -> int: ...

    @property
    def backoff_ms(self) -> int: ...


S = TypeVar("S", bound=TaskSettings)


class ThrottledTask(Generic[S]):
    """Invariants: ``settings.enable`` never changes after construction (read-only, as
    Kafka's ``log.cleaner.enable``); ``_throttle.rate`` is ``settings.io_max_bytes_per_second``."""

    def __init__(self, settings: S, now_s: float) -> None:
        self.settings = settings
        self._throttle = ScrubThrottle(settings.io_max_bytes_per_second, now_s)
        self._reconfigured = asyncio.Event()

    def reconfigure(self, settings: S) -> None:
        """A dynamic broker config change (fjord.cluster.dynamic_config): the new rate holds
        from the next read, a backoff under way ends now (as Kafka restarts its cleaner threads
        on a change) and the next one lasts the new backoff. ``enable`` is kept."""
        settings = replace(settings, enable=self.settings.enable)  # type: ignore[type-var]
        if settings == self.settings:
            return
        self.settings = settings
        self._throttle.rate = settings.io_max_bytes_per_second
        self._reconfigured.set()

    async def _back_off(self) -> None:
        """Sleep ``backoff_ms``, or until :meth:`reconfigure` changes the settings."""
        self._reconfigured.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._reconfigured.wait(), self.settings.backoff_ms / 1000)
