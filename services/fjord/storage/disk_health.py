"""Whether a broker's data directory can be written, decided from the outcomes of its writes.

Pure (no I/O, no clock): the broker's shell (:mod:`fjord.broker.disk_monitor`) reports every
failed write and every probe, and logs, counts and acts only on what this class returns.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from dataclasses import dataclass

#: errno values that mean "the device has no room": the disk (or the quota) is full.
OUT_OF_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def write_error_of(exc: BaseException | None) -> OSError | None:
    """The OSError behind ``exc`` (itself or a ``__cause__``/``__context__`` in its chain),
    None when the failure was not an operating-system error (a bug, a validation error)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def is_out_of_space(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or its cause) says the device or quota is full."""
    error = write_error_of(exc)
    return error is not None and error.errno in OUT_OF_SPACE_ERRNOS


def describe_os_error(error: OSError) -> str:
    """``"No space left on device (ENOSPC)"``: the condition, without a file name (the same
    condition hits many files; naming one per message would make every message differ)."""
    if error.errno is None:
        return str(error)
    name = errno.errorcode.get(error.errno, str(error.errno))
    return f"{os.strerror(error.errno)} ({name})"


@dataclass(frozen=True, slots=True)
class DiskCondition:
    """The data directory's condition: ``writable``, or not with ``reason`` (the OS error, e.g.
    "No space left on device (ENOSPC)") and the ``operation`` that met it first."""

    writable: bool
    reason: str = ""
    operation: str = ""

    @property
    def out_of_space(self) -> bool:
        return not self.writable and ("ENOSPC" in self.reason or "EDQUOT" in self.reason)


WRITABLE = DiskCondition(True)


class DiskHealth:
    """The writable / not-writable state of one data directory.

    Invariants:
    - ``condition`` turns unwritable at the first failed write while writable, changes reason
      when a failure of another kind (errno) arrives while unwritable, and turns writable again
      only through a successful probe (:meth:`on_probe`): a small write that happens to fit
      while the disk is still nearly full does not flip it back and forth.
    - Each change is returned exactly once, by the call that caused it (the shell logs each
      change once, however many writes fail every second); repeated failures of the same kind
      return None and are only counted in ``failures`` (by operation).
    """

    def __init__(self) -> None:
        self.condition = WRITABLE
        self.failures: Counter[str] = Counter()
        #: How often the condition turned unwritable (each a separate episode).
        self.episodes = 0

    @property
    def writable(self) -> bool:
        return self.condition.writable

    def on_write_failed(self, operation: str, error: OSError) -> DiskCondition | None:
        """A write for ``operation`` (e.g. "index flush") failed with ``error``. Returns the new
        condition when it changed, else None."""
        self.failures[operation] += 1
        reason = describe_os_error(error)
        if not self.condition.writable and self.condition.reason == reason:
            return None
        if self.condition.writable:
            self.episodes += 1
        self.condition = DiskCondition(False, reason, operation)
        return self.condition

    def on_probe(self, error: OSError | None) -> DiskCondition | None:
        """A probe write (see the shell) succeeded (``error`` None) or failed. Returns the new
        condition when it changed, else None."""
        if error is not None:
            return self.on_write_failed("probe", error)
        if self.condition.writable:
            return None
        self.condition = WRITABLE
        return WRITABLE
