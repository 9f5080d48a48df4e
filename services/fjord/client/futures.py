"""Per-record futures that cost almost nothing: the records of a batch share one completion.

Creating a :class:`concurrent.futures.Future` per record costs microseconds (a condition
variable each); at hundreds of thousands of records per second that would cap the producer. As
Kafka's clients do, every record of a batch holds a tiny :class:`RecordFuture` (the batch's
:class:`BatchCompletion` and the record's position in it) that offers the ``Future`` interface.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_right
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fjord.client.types import RecordMetadata
from fjord.records.speedups import EXTENSION, IMPLEMENTATION

log = logging.getLogger(__name__)

DoneCallback = Callable[[Any], object]


class BatchCompletion:
    """The outcome of one produced batch, shared by the futures of its records.

    Invariants: it completes at most once (success with a base offset, or failure with an
    exception); callbacks registered before completion run exactly once, in registration order,
    on the completing thread; callbacks registered after completion run at once on the caller's
    thread. A callback that raises is logged and does not stop the others.
    """

    __slots__ = (
        "_callbacks",
        "_claimed",
        "_done",
        "_event",
        "_lock",
        "_parent",
        "_parts",
        "_remaining",
        "base_offset",
        "error",
        "log_append_time",
        "partition",
        "topic",
    )

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.base_offset = -1
        self.log_append_time = -1
        self.error: BaseException | None = None
        self._done = False
        # Made by the first wait() only: a threading.Event (a Condition and its locks, in
        # Python) per batch was a noticeable share of the sender's time, and most batches are
        # never waited for (flush() waits for the last ones).
        self._event: threading.Event | None = None
        self._lock = threading.Lock()
        self._callbacks: list[tuple[DoneCallback, RecordFuture]] = []
        #: After :meth:`split_into`: (index of its first record, completion) per part.
        self._parts: list[tuple[int, BatchCompletion]] | None = None
        self._parent: BatchCompletion | None = None
        self._remaining = 0
        self._claimed = False  # a part: its outcome is set and reported to its parent

    @property
    def done(self) -> bool:
        return self._done

    def wait(self, timeout: float | None) -> bool:
        with self._lock:
            if self._done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def complete(self, base_offset: int, log_append_time: int = -1) -> None:
        self._finish(base_offset, log_append_time, None)

    def fail(self, error: BaseException) -> None:
        self._finish(-1, -1, error)

    def _finish(self, base_offset: int, log_append_time: int, error: BaseException | None) -> None:
        parent = self._parent
        if parent is not None:
            # A part of a split batch: its parent finishes (if this was its last part) before
            # this part is seen done, so whoever waited for the part (flush()) finds the
            # records' futures done too.
            with self._lock:
                if self._done or self._claimed:
                    return
                self._claimed = True
                self.base_offset = base_offset
                self.log_append_time = log_append_time
                self.error = error
            parent._part_finished()
        with self._lock:
            if self._done:
                return
            self.base_offset = base_offset
            self.log_append_time = log_append_time
            self.error = error
            self._done = True  # (after the fields: a reader that sees it sees them)
            if self._event is not None:
                self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn, future in callbacks:
            _run_callback(fn, future)

    def split_into(self, parts: list[tuple[int, BatchCompletion]]) -> None:
        """The batch was split (the broker refused it as too large): the records from
        ``parts[i][0]`` up to the next part's first index now travel in the batch of
        ``parts[i][1]`` (fresh, not done). Each record's future reports its own part's outcome
        (:meth:`locate`); this completion finishes once every part has, with the first
        failed part's error (None when all succeeded) and the first part's offsets, and only
        then are the records' futures done and their callbacks run (so a flush or a
        ``send_many`` waiting for this completion waits for every part)."""
        with self._lock:
            assert not self._done and self._parts is None and parts and parts[0][0] == 0
            self._parts = parts
            self._remaining = len(parts)
        for _, part in parts:
            part._parent = self

    def _part_finished(self) -> None:
        with self._lock:
            self._remaining -= 1
            if self._remaining:
                return
            parts = self._parts
        assert parts is not None
        first = parts[0][1]
        error = next((p.error for _, p in parts if p.error is not None), None)
        self._finish(first.base_offset if error is None else -1, first.log_append_time, error)

    def locate(self, index: int) -> tuple[BatchCompletion, int]:
        """The completion record ``index`` of this batch depends on, and its index there (itself
        and ``index`` unless the batch was split)."""
        completion = self
        while completion._parts is not None:
            parts = completion._parts
            at = bisect_right(parts, index, key=lambda part: part[0]) - 1
            start, completion = parts[at]
            index -= start
        return completion, index

    def add_callback(self, fn: DoneCallback, future: RecordFuture) -> None:
        with self._lock:
            if not self._done:
                self._callbacks.append((fn, future))
                return
        _run_callback(fn, future)


def _run_callback(fn: DoneCallback, future: RecordFuture) -> None:
    try:
        fn(future)
    except Exception:
        log.exception("exception in a produce callback %r", fn)


class PyRecordFutureBase:
    """The fields of :class:`RecordFuture`: its batch's completion, its index in the batch and
    its timestamp (pure Python; ``fjord.records._speedups.RecordFutureBase`` is the same in C,
    which the producer's C fast path creates futures of in the same call as the append)."""

    __slots__ = ("_batch", "_relative_offset", "_timestamp")

    def __init__(self, batch: BatchCompletion, relative_offset: int, timestamp: int) -> None:
        self._batch = batch
        self._relative_offset = relative_offset
        self._timestamp = timestamp


if TYPE_CHECKING:
    _RecordFutureBase = PyRecordFutureBase
else:
    _RecordFutureBase = (
        EXTENSION.RecordFutureBase
        if IMPLEMENTATION == "c" and EXTENSION is not None
        else PyRecordFutureBase
    )


class RecordFuture(_RecordFutureBase):
    """The future of one sent record, with :class:`concurrent.futures.Future`'s interface.

    ``result()`` returns :class:`RecordMetadata` or raises the batch's error (a
    :class:`fjord.errors.FjordError`); waiting longer than ``timeout`` raises ``TimeoutError``.
    A record future cannot be cancelled once sent (``cancel()`` returns False), as in Kafka.
    ``RecordFuture(completion, relative_offset, timestamp)``.
    """

    __slots__ = ()

    def done(self) -> bool:
        return self._batch.done

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return not self._batch.done

    def _wait(self, timeout: float | None) -> None:
        if not self._batch.wait(timeout):
            raise TimeoutError(f"the record was not acknowledged within {timeout} s")

    def result(self, timeout: float | None = None) -> RecordMetadata:
        self._wait(timeout)
        batch, index = self._batch, self._relative_offset
        if batch._parts is not None:  # split: the record's outcome is its part's
            batch, index = batch.locate(index)
        if batch.error is not None:
            raise batch.error
        offset = batch.base_offset + index if batch.base_offset >= 0 else -1
        timestamp = batch.log_append_time if batch.log_append_time >= 0 else self._timestamp
        return RecordMetadata(batch.topic, batch.partition, offset, timestamp)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return self._batch.locate(self._relative_offset)[0].error

    def add_done_callback(self, fn: DoneCallback) -> None:
        self._batch.add_callback(fn, self)

    def __repr__(self) -> str:
        state = "pending" if not self.done() else "failed" if self._batch.error else "done"
        return f"<RecordFuture {self._batch.topic}-{self._batch.partition} {state}>"


class RecordsFuture:
    """The outcome of the records one :meth:`fjord.client.Producer.send_many` call queued:
    done when every batch they went into is. ``result()`` returns how many records were
    sent, or raises the error of the first batch (in the order the records went in) that
    failed; waiting longer than ``timeout`` raises ``TimeoutError``."""

    __slots__ = ("_completions", "count")

    def __init__(self, completions: list[BatchCompletion], count: int) -> None:
        self._completions = completions
        self.count = count

    def done(self) -> bool:
        return all(c.done for c in self._completions)

    def _wait(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for completion in self._completions:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not completion.wait(remaining):
                raise TimeoutError(f"the records were not acknowledged within {timeout} s")

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return next((c.error for c in self._completions if c.error is not None), None)

    def result(self, timeout: float | None = None) -> int:
        error = self.exception(timeout)
        if error is not None:
            raise error
        return self.count

    def __repr__(self) -> str:
        return f"<RecordsFuture {self.count} records, {'done' if self.done() else 'pending'}>"
