"""Incremental fetch sessions (Kafka's KIP-227), pure: both ends' bookkeeping, no I/O.

A fetcher that polls the same partitions again and again (a follower replicating thousands of
partitions, a consumer) need not name every partition in every Fetch, nor hear about every
partition in every answer. Session metadata travels with each Fetch as ``(session_id, epoch)``:

- ``epoch == INITIAL_EPOCH`` (0): a full fetch; the leader drops ``session_id`` (if any), opens a
  new session holding exactly the partitions of the request and answers every one of them with
  the new session's id (``NO_SESSION`` when it could not open one: then every fetch stays full).
- ``epoch == FINAL_EPOCH`` (-1): a full fetch without a session; ``session_id`` (if any) is
  closed.
- otherwise an incremental fetch: the request carries only the partitions added or changed
  since the previous request of the session and the partitions to drop ("forgotten"); the
  answer carries only the partitions with news (records, an error, or a changed high watermark,
  log start offset or leader). The epoch must be the session's next one, else
  INVALID_FETCH_SESSION_EPOCH; an unknown (e.g. evicted) id is FETCH_SESSION_ID_NOT_FOUND. On
  either error, and on any failed call, the fetcher starts over with a full fetch.

The invariant both ends keep, and the tests check (hypothesis): after every successful fetch,
the session's partitions on the leader equal the fetcher's partitions of its last request, and
the fetcher's view of every partition (the last answer it got for it) equals what a full fetch
would have answered.

:class:`FetchSessionHandler` is the fetcher's side, :class:`FetchSessionCache` the leader's.
Keys and values are opaque here: a key names a partition, a value is what the fetcher asks for
it (offsets, epochs, limits; compared with ``==``); a partition's answer is summarised by its
"state" (whatever the leader would repeat without news, e.g. high watermark and log start).
"""

from __future__ import annotations

import itertools
import random
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from fjord.errors import ErrorCode

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

NO_SESSION = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
#: Kafka's max.incremental.fetch.session.cache.slots default.
DEFAULT_MAX_SESSIONS = 1000


def next_epoch(epoch: int) -> int:
    """Epochs run 1, 2, ... and wrap to 1 (never back to INITIAL or FINAL), as Kafka's do."""
    return 1 if epoch >= 2**31 - 1 else epoch + 1


@dataclass(frozen=True, slots=True)
class FetchPlan(Generic[K, V]):
    """One Fetch as the fetcher sends it: the session metadata, the partitions to put in the
    request (all of them for a full fetch) and those to drop from the session."""

    session_id: int
    epoch: int
    to_send: dict[K, V]
    forgotten: tuple[K, ...]
    #: Every partition the fetcher wants, i.e. the session after this fetch succeeds.
    wanted: dict[K, V]

    @property
    def full(self) -> bool:
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)


class FetchSessionHandler(Generic[K, V]):
    """The fetcher's side of one session with one leader (Kafka's FetchSessionHandler).

    Invariants: ``session_id == NO_SESSION`` iff the next fetch is full; while a session is
    open, ``partitions`` is exactly what the leader's session holds (the ``wanted`` of the last
    successful fetch), and ``epoch`` is the epoch the next incremental fetch carries. Any failure
    (an error answer, a failed call) closes the session on this side: the next fetch is full.
    """

    def __init__(self, use_sessions: bool = True) -> None:
        self.use_sessions = use_sessions
        self.session_id = NO_SESSION
        self.epoch = INITIAL_EPOCH
        self.partitions: dict[K, V] = {}

    def build(self, wanted: Mapping[K, V]) -> FetchPlan[K, V]:
        wanted = dict(wanted)
        if self.session_id == NO_SESSION:
            epoch = INITIAL_EPOCH if self.use_sessions else FINAL_EPOCH
            return FetchPlan(NO_SESSION, epoch, wanted, (), wanted)
        previous = self.partitions
        to_send = {
            k: v for k, v in wanted.items()
            if (p := previous.get(k, _ABSENT)) is not v and p != v
        }
        forgotten = tuple(k for k in previous if k not in wanted)
        return FetchPlan(self.session_id, self.epoch, to_send, forgotten, wanted)

    def on_response(self, plan: FetchPlan[K, V], error_code: int, session_id: int) -> bool:
        """Take the leader's answer to ``plan``: its top-level error code and session id.
        Returns True when the partitions in the answer may be applied."""
        if error_code != 0:
            self.reset()
            return False
        if plan.full:
            self.session_id = session_id if self.use_sessions else NO_SESSION
            self.epoch = next_epoch(INITIAL_EPOCH)
        elif session_id == NO_SESSION:  # the leader closed the session: start over
            self.session_id = NO_SESSION
            self.epoch = INITIAL_EPOCH
        else:
            self.epoch = next_epoch(plan.epoch)
        self.partitions = plan.wanted if self.session_id != NO_SESSION else {}
        return True

    def reset(self) -> None:
        """Forget the session (after any failure): the next fetch is full."""
        self.session_id = NO_SESSION
        self.epoch = INITIAL_EPOCH
        self.partitions = {}


_ABSENT = object()


class FetchSessionError(Exception):
    """A session fetch the leader refuses as a whole; ``code`` is Kafka's error."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class CachedPartition(Generic[V]):
    """One partition of a leader-side session: what the fetcher last asked for it and the state
    the leader last answered for it (None: never answered in this session)."""

    request: V
    sent_state: object = None


@dataclass(eq=False)
class FetchSession(Generic[K, V]):
    """One open session on the leader.

    Invariants: ``partitions`` is the fetcher's view (see the module docstring); ``epoch`` is the
    epoch its next incremental fetch must carry; ``dirty`` holds the partitions whose leader-side
    state may have changed since their state was last answered (the shell adds to it through
    :meth:`FetchSessionCache.touch`); ``woken`` is called on every touch (the shell's parked
    fetch, if any).
    """

    session_id: int
    owner: object
    partitions: dict[K, CachedPartition[V]]
    epoch: int = field(default=1)
    dirty: set[K] = field(default_factory=set)
    last_used: float = 0.0
    #: When every partition was last looked at by the leader (not only the dirty ones), and
    #: when the shell last refreshed what the fetches of the untouched ones prove (a
    #: follower's caught-up time for the ISR).
    last_full_pass: float = 0.0
    last_refresh: float = 0.0
    woken: Callable[[], None] | None = None
    #: The broker epoch a follower's last fetch carried (None: none yet, or a consumer's).
    owner_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class FetchContext(Generic[K, V]):
    """What the leader does for one Fetch.

    ``session`` is None for a sessionless full fetch; ``full`` says whether every partition of
    ``session``/the request is answered (a full fetch) or only those with news. ``requested``
    are the partitions the request named (answered even without news when ``full``).
    """

    session: FetchSession[K, V] | None
    full: bool
    requested: dict[K, V]

    @property
    def session_id(self) -> int:
        return NO_SESSION if self.session is None else self.session.session_id


class FetchSessionCache(Generic[K, V]):
    """The leader's open sessions (Kafka's FetchSessionCache + FetchManager.newContext).

    Invariants: at most ``max_sessions`` sessions, the least recently used evicted first to make
    room for a new one; one session per ``owner`` when the owner is given (a follower broker
    opening a new session replaces its old one); ids are never NO_SESSION and unique among the
    open sessions; ``_by_key[k]`` is exactly the set of open sessions holding ``k``.
    """

    def __init__(
        self,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        new_id: Callable[[], int] | None = None,
    ) -> None:
        self.max_sessions = max_sessions
        self._new_id = new_id or (lambda: random.randint(1, 2**31 - 1))
        self._sessions: OrderedDict[int, FetchSession[K, V]] = OrderedDict()
        self._by_owner: dict[object, int] = {}
        self._by_key: dict[K, set[FetchSession[K, V]]] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int) -> FetchSession[K, V] | None:
        return self._sessions.get(session_id)

    def sessions(self) -> list[FetchSession[K, V]]:
        return list(self._sessions.values())

    def new_context(
        self,
        session_id: int,
        epoch: int,
        requested: Mapping[K, V],
        forgotten: Iterable[K],
        now: float,
        owner: object = None,
    ) -> FetchContext[K, V]:
        """Open, continue or close a session for one Fetch; raises FetchSessionError for an
        unknown session or a wrong epoch (the request is then answered with that error only)."""
        requested = dict(requested)
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != NO_SESSION:
                self.remove(session_id)
            if epoch == FINAL_EPOCH or self.max_sessions <= 0:
                return FetchContext(None, True, requested)
            session = self._open(owner, requested, now)
            return FetchContext(session, True, requested)
        existing = self._sessions.get(session_id)
        if existing is None:
            raise FetchSessionError(
                ErrorCode.FETCH_SESSION_ID_NOT_FOUND, f"no fetch session {session_id}"
            )
        session = existing
        if session.epoch != epoch:
            raise FetchSessionError(
                ErrorCode.INVALID_FETCH_SESSION_EPOCH,
                f"fetch session {session_id} expects epoch {session.epoch}, got {epoch}",
            )
        for key in forgotten:
            if session.partitions.pop(key, None) is not None:
                self._unindex(key, session)
            session.dirty.discard(key)
        for key, value in requested.items():
            cached = session.partitions.get(key)
            if cached is None:
                session.partitions[key] = CachedPartition(value)
                self._by_key.setdefault(key, set()).add(session)
            else:
                cached.request = value
        session.epoch = next_epoch(epoch)
        session.last_used = now
        self._sessions.move_to_end(session_id)
        return FetchContext(session, False, requested)

    def _open(self, owner: object, requested: dict[K, V], now: float) -> FetchSession[K, V]:
        if owner is not None and owner in self._by_owner:
            self.remove(self._by_owner[owner])
        while len(self._sessions) >= self.max_sessions:
            self.remove(next(iter(self._sessions)))  # least recently used
        session_id = self._new_id()
        for _ in itertools.count():
            if session_id != NO_SESSION and session_id not in self._sessions:
                break
            session_id = self._new_id()
        session: FetchSession[K, V] = FetchSession(
            session_id, owner, {k: CachedPartition(v) for k, v in requested.items()},
            last_used=now, last_full_pass=now, last_refresh=now,
        )
        self._sessions[session_id] = session
        if owner is not None:
            self._by_owner[owner] = session_id
        for key in requested:
            self._by_key.setdefault(key, set()).add(session)
        return session

    def remove(self, session_id: int) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        if session.owner is not None and self._by_owner.get(session.owner) == session_id:
            del self._by_owner[session.owner]
        for key in session.partitions:
            self._unindex(key, session)
        if session.woken is not None:
            session.woken()  # a parked fetch of a closed session answers now

    def _unindex(self, key: K, session: FetchSession[K, V]) -> None:
        holders = self._by_key.get(key)
        if holders is not None:
            holders.discard(session)
            if not holders:
                del self._by_key[key]

    def touch(
        self, key: K, wake: Callable[[FetchSession[K, V]], bool] | None = None
    ) -> None:
        """``key``'s leader-side state may have changed: every session holding it looks at it
        on its next fetch (and a parked one wakes, unless ``wake`` says it need not: a change
        that cannot complete its parked fetch waits for the fetch's next pass)."""
        holders = self._by_key.get(key)
        if not holders:
            return
        for session in holders:
            session.dirty.add(key)
            if session.woken is not None and (wake is None or wake(session)):
                session.woken()

    def touch_all(self) -> None:
        for key in list(self._by_key):
            self.touch(key)


def has_news(cached: CachedPartition[V], state: object, always: bool) -> bool:
    """Whether a partition goes into an incremental answer: ``always`` (records, an error, a
    divergence) or a state other than the one last answered. The caller commits ``state`` to
    ``cached.sent_state`` once the answer is final."""
    return always or cached.sent_state != state
