"""Keeps a :class:`MetadataImage` current by following etcd: snapshot, then watch."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import aetcd
from aetcd import rpc
from aetcd.utils import prefix_range_end

from fjord.metadata.defaults import SNAPSHOT_TIMEOUT_S, WATCH_RETRY_MAX_S, WATCH_RETRY_MIN_S
from fjord.metadata.image import MetadataEvent, MetadataImage

log = logging.getLogger(__name__)

Listener = Callable[[MetadataImage, MetadataImage], Awaitable[None] | None]


class _Compacted(Exception):
    """The watch's start revision was compacted away: only a fresh snapshot can continue."""


class MetadataWatcher:
    """Follows ``/fjord/<cluster_id>/`` in etcd and exposes the current :class:`MetadataImage`.

    Protocol: a linearizable range read of the prefix gives a snapshot at revision R; a watch
    stream then starts at R + 1, so no change is missed or applied twice. When the stream
    breaks (etcd restart, network), it is re-opened from the last applied revision + 1 with
    bounded back-off; if that revision was compacted, a new snapshot replaces the image.

    Invariants: :attr:`image` only moves forward in revision; all events of one etcd revision
    are applied together (listeners and waiters never see half of a transaction); the revision
    advances only through snapshots and events under the prefix, so
    ``wait_for_revision(n)`` is meant for revisions of writes under this prefix (e.g. the
    header revision of a metadata txn). Listeners run in the watch task, in order, after each
    change; one that raises is logged and does not stop the watcher.
    """

    def __init__(self, client: aetcd.Client, cluster_id: str) -> None:
        self._client = client
        self._image = MetadataImage.empty(cluster_id)
        self._prefix = self._image.keys.prefix.encode()
        self._listeners: list[Listener] = []
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._started = asyncio.Event()

    @property
    def image(self) -> MetadataImage:
        return self._image

    @property
    def revision(self) -> int:
        return self._image.revision

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(old_image, new_image)`` after every change; returns an unsubscribe."""
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    async def start(self, timeout: float = SNAPSHOT_TIMEOUT_S) -> MetadataImage:
        """Load the first snapshot and start following; returns once the image is loaded.

        Raises ``TimeoutError`` if etcd does not answer within ``timeout`` seconds.
        """
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="fjord-metadata-watcher")
        try:
            await asyncio.wait_for(self._started.wait(), timeout)
        except TimeoutError:
            await self.stop()
            raise TimeoutError(f"no metadata snapshot from etcd within {timeout} s") from None
        return self._image

    async def stop(self) -> None:
        """Stop following (idempotent); the last image stays readable."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def wait_for(
        self, predicate: Callable[[MetadataImage], bool], timeout: float
    ) -> MetadataImage:
        """The first image (current or future) for which ``predicate`` holds.

        Raises ``TimeoutError`` after ``timeout`` seconds.
        """
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: predicate(self._image)), timeout)
            return self._image

    async def wait_for_revision(self, revision: int, timeout: float) -> MetadataImage:
        """The image once it has applied every change up to etcd revision ``revision``."""
        return await self.wait_for(lambda image: image.revision >= revision, timeout)

    # -- internals -------------------------------------------------------------------------

    async def _publish(self, new: MetadataImage) -> None:
        old, self._image = self._image, new
        async with self._changed:
            self._changed.notify_all()
        for listener in list(self._listeners):
            try:
                result = listener(old, new)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("metadata listener %r failed", listener)

    async def _load_snapshot(self) -> None:
        snapshot = await self._client.get_prefix(self._prefix)
        puts = [
            MetadataEvent.put(kv.key.decode(), kv.value, kv.create_revision, kv.mod_revision)
            for kv in snapshot.kvs
        ]
        image = MetadataImage.from_snapshot(self._image.cluster_id, puts, snapshot.header.revision)
        if image.revision < self._image.revision:
            # Never move backwards (a lagging etcd member could serve an older read).
            return
        await self._publish(image)
        self._started.set()

    async def _run(self) -> None:
        delay = WATCH_RETRY_MIN_S
        need_snapshot = True
        while True:
            try:
                if need_snapshot:
                    await self._load_snapshot()
                    need_snapshot = False
                async for _ in self._follow():
                    delay = WATCH_RETRY_MIN_S
            except asyncio.CancelledError:
                # grpc.aio also raises CancelledError when the RPC (not this task) is cancelled,
                # e.g. the channel was closed and will be re-opened: only a cancellation of
                # this task ends the loop.
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                log.warning("metadata watch stream cancelled; retrying in %.1f s", delay)
            except _Compacted:
                log.warning("metadata watch revision compacted; reloading snapshot")
                need_snapshot = True
                continue
            except Exception as exc:
                log.warning("metadata watch interrupted (%s); retrying in %.1f s", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, WATCH_RETRY_MAX_S)

    async def _follow(self) -> AsyncIterator[None]:
        """Apply watch responses from the current revision + 1; yields after each change."""
        await self._client.connect()
        stub = rpc.WatchStub(self._client.channel)
        create = rpc.WatchRequest(
            create_request=rpc.WatchCreateRequest(
                key=self._prefix,
                range_end=prefix_range_end(self._prefix),
                start_revision=self._image.revision + 1,
            )
        )
        stop_requests = asyncio.Event()

        async def requests() -> AsyncIterator[rpc.WatchRequest]:
            yield create
            # Keep the request side open: closing it would end the stream.
            await stop_requests.wait()

        call = stub.Watch(requests(), metadata=self._client.metadata)
        try:
            async for response in call:
                if response.compact_revision:
                    raise _Compacted()
                if response.canceled:
                    raise ConnectionError(f"watch canceled by etcd: {response.cancel_reason}")
                if not response.events:
                    continue
                events = []
                for ev in response.events:
                    key = ev.kv.key.decode()
                    if ev.type == rpc.Event.DELETE:
                        events.append(MetadataEvent.delete(key, ev.kv.mod_revision))
                    else:
                        events.append(
                            MetadataEvent.put(
                                key, ev.kv.value, ev.kv.create_revision, ev.kv.mod_revision
                            )
                        )
                await self._publish(self._image.apply(events))
                yield
            raise ConnectionError("watch stream ended")
        finally:
            stop_requests.set()
            call.cancel()
