"""The coordinator's group shell: owned ``__consumer_offsets`` partitions, one
:class:`~fjord.coordinator.group.GroupStateMachine` per group, effects carried out on the event
loop (parked requests, appends, timers). No gRPC and no etcd here: the servicer
(:mod:`fjord.coordinator.service`) translates requests into these calls and the server
(:mod:`fjord.coordinator.server`) decides which partitions are owned and replays them.

See docs/groups.md ("Effects: what the shell does" and "The coordinator service").
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from fjord.coordinator.group import (
    AppendRecords,
    CommittedOffset,
    Effect,
    GroupConfig,
    GroupDescription,
    GroupStateMachine,
    JoinGroupResponse,
    OffsetCommitRequestPartition,
    OffsetCommitResponse,
    RebalanceCompleted,
    RebalanceStarted,
    Reply,
    SyncGroupResponse,
    map_append_error,
)
from fjord.coordinator.offsets_log import (
    LoadedGroup,
    OffsetCommitValue,
    PendingTxnOffsetKey,
    encode_record,
)
from fjord.coordinator.ownership import PartitionOwnership
from fjord.errors import ErrorCode, FjordError, InvalidGroupIdError, error_for_code
from fjord.groups.defaults import OFFSETS_TOPIC
from fjord.groups.offsets_topic import group_partition
from fjord.groups.state import GroupState
from fjord.observability.metrics import record_rebalance
from fjord.topic_partition import TopicPartition

log = logging.getLogger(__name__)

T = TypeVar("T")

#: One encoded ``__consumer_offsets`` record: key bytes and value bytes (None: tombstone).
EncodedRecord = tuple[bytes, bytes | None]


class Appender(Protocol):
    """Writes records to a ``__consumer_offsets`` partition with acks=all.

    ``submit`` must not suspend: records submitted earlier are written earlier (the group
    machine's appends are ordered). ``epoch`` is the coordinator epoch the partition is owned
    at: the partition's leader refuses an append whose epoch is older than the newest it knows
    (TRANSACTION_COORDINATOR_FENCED). The future fails with a FjordError carrying the broker's
    error code when the write failed.
    """

    def submit(
        self, partition: int, epoch: int, records: Sequence[EncodedRecord]
    ) -> asyncio.Future[None]: ...


def _materialize(
    machine: GroupStateMachine,
    offsets: Mapping[TopicPartition, OffsetCommitValue],
    request_id: int,
    now_ms: int,
) -> list[Effect]:
    return machine.materialize_txn_offsets(request_id, now_ms, offsets)


def wall_clock_ms() -> int:
    """The machines' clock: wall-clock milliseconds (commit timestamps are stored in the log)."""
    return int(time.time() * 1000)


@dataclass(eq=False)
class _Group:
    """One served group: its machine, its timer, and the futures of its parked requests by
    request id (resolved by the machine's Reply effects, possibly much later)."""

    machine: GroupStateMachine
    partition: _Partition
    timer: asyncio.TimerHandle | None = None
    waiters: dict[int, asyncio.Future[Any]] = field(default_factory=dict)
    appends_in_flight: int = 0


@dataclass(eq=False)
class _Partition:
    """An owned ``__consumer_offsets`` partition at one coordinator epoch; ``loaded`` once its
    replay has been installed (until then its groups answer COORDINATOR_LOAD_IN_PROGRESS)."""

    number: int
    epoch: int
    loaded: bool = False
    groups: dict[str, _Group] = field(default_factory=dict)
    #: Offsets of open transactions (TxnOffsetCommit), written as pending records:
    #: {producer id: {group: {partition: offset}}}.
    pending_txn: dict[int, dict[str, dict[TopicPartition, OffsetCommitValue]]] = field(
        default_factory=dict
    )


class GroupManager(PartitionOwnership[_Partition]):
    """Every group this coordinator serves, grouped by ``__consumer_offsets`` partition.

    Invariants:
    - a group is served only while its partition is owned (:meth:`assign`) and loaded
      (:meth:`install`); otherwise requests fail with NOT_COORDINATOR or
      COORDINATOR_LOAD_IN_PROGRESS (typed FjordErrors the servicer turns into error codes);
    - calls into a machine never await, so the event loop itself serializes each group's calls
      (the per-group lock of Kafka's coordinator); effects are applied right after the call;
    - every request handed to a machine gets exactly one answer: its Reply, or
      NOT_COORDINATOR when the partition is lost while it is parked; a cancelled RPC removes
      its future, and a later Reply for it is dropped;
    - appends go to the :class:`Appender` in the order the machines emit them, with the
      epoch their partition is owned at, and their outcome is reported back with
      ``append_completed`` unless the partition was lost (then the groups are gone and their
      parked requests were answered already);
    - an append refused as fenced (a newer coordinator owns the partition) drops the
      partition at once, and :meth:`assign` does not take it back at that epoch or an older
      one: only a newer epoch (the controller gave it back) is owned again;
    - each group has at most one timer, set to the machine's ``next_deadline()`` after every
      call.
    """

    internal_topic = OFFSETS_TOPIC

    def __init__(
        self,
        appender: Appender,
        config: GroupConfig | None = None,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        partition_exists: Callable[[str, int], bool] | None = None,
    ) -> None:
        super().__init__()
        self._appender = appender
        self.config = config or GroupConfig()
        self._clock = clock
        self._partition_exists = partition_exists
        self._next_request_id = 1
        #: False while the coordinator is not registered (lease lost): nothing is served.
        self.active = False

    # --- ownership (assign, owned, unloaded, fence, drop_all: PartitionOwnership) ----------

    def _new_partition(self, number: int, epoch: int) -> _Partition:
        return _Partition(number, epoch)

    def install(self, number: int, epoch: int, groups: Mapping[str, LoadedGroup]) -> bool:
        """Serve partition ``number`` from its replay (``GroupMetadataLoader.groups()``).
        False (and nothing changes) when the partition is no longer owned at ``epoch``."""
        part = self._partitions.get(number)
        if part is None or part.epoch != epoch or part.loaded:
            return False
        now = self._clock()
        for name, loaded in groups.items():
            for pid, offsets in loaded.pending_txn.items():
                part.pending_txn.setdefault(pid, {})[name] = dict(offsets)
            machine = GroupStateMachine.load(
                name, loaded.metadata, loaded.offsets, now, self.config
            )
            group = _Group(machine, part)
            part.groups[name] = group
            self._schedule(group)
        part.loaded = True
        log.debug(
            "serving __consumer_offsets partition %d (epoch %d): %d groups",
            number,
            epoch,
            len(groups),
        )
        return True

    def _release(self, part: _Partition) -> None:
        """Every parked request of ``part``'s groups is answered NOT_COORDINATOR."""
        for group in part.groups.values():
            if group.timer is not None:
                group.timer.cancel()
                group.timer = None
            for waiter in group.waiters.values():
                if not waiter.done():
                    waiter.set_exception(
                        error_for_code(
                            ErrorCode.NOT_COORDINATOR,
                            f"this coordinator no longer owns group {group.machine.group_id!r}",
                        )
                    )
        part.groups.clear()

    # --- routing ----------------------------------------------------------------------------

    def _partition_for(self, group_id: str) -> _Partition:
        if not group_id:
            raise InvalidGroupIdError("group id must be a non-empty string")
        if not self.active:
            raise error_for_code(
                ErrorCode.COORDINATOR_NOT_AVAILABLE, "the coordinator is not registered"
            )
        number = group_partition(group_id)
        part = self._partitions.get(number)
        if part is None:
            raise error_for_code(
                ErrorCode.NOT_COORDINATOR,
                f"group {group_id!r} lives in __consumer_offsets partition {number}, "
                "which this coordinator does not own",
            )
        if not part.loaded:
            raise error_for_code(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                f"__consumer_offsets partition {number} is still loading",
            )
        return part

    def _group(self, group_id: str, *, create: bool) -> _Group | None:
        part = self._partition_for(group_id)
        group = part.groups.get(group_id)
        if group is not None and group.machine.state is GroupState.DEAD and create:
            group = None  # a Dead group is replaced by a fresh Empty one (docs/groups.md)
        if group is None and create:
            machine = GroupStateMachine(group_id, self.config, now_ms=self._clock())
            group = part.groups[group_id] = _Group(machine, part)
        return group

    # --- effects ----------------------------------------------------------------------------

    async def _call(self, group: _Group, call: Callable[[int, int], list[Effect]]) -> Any:
        """Run ``call(request_id, now_ms)`` on the machine and wait for its Reply."""
        request_id = self._next_request_id
        self._next_request_id += 1
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        group.waiters[request_id] = waiter
        try:
            self._apply(group, call(request_id, self._clock()))
            return await waiter
        finally:
            group.waiters.pop(request_id, None)
            if not group.waiters:
                self._after_call(group)  # a group this request created may be vacant now

    def _apply(self, group: _Group, effects: list[Effect]) -> list[asyncio.Future[None]]:
        """Carry out effects; returns the futures of the appends they started."""
        appends = []
        group_id = group.machine.group_id
        for effect in effects:
            if isinstance(effect, Reply):
                waiter = group.waiters.get(effect.request_id)
                if waiter is not None and not waiter.done():
                    waiter.set_result(effect.response)
            elif isinstance(effect, AppendRecords):
                appends.append(self._start_append(group, effect))
            elif isinstance(effect, RebalanceStarted):
                record_rebalance(group_id)
                log.info(
                    "group %s: rebalance from generation %d (%s)",
                    group_id,
                    effect.generation_id,
                    effect.reason,
                )
            elif isinstance(effect, RebalanceCompleted):
                log.info(
                    "group %s: generation %d stable with %d members",
                    group_id,
                    effect.generation_id,
                    effect.members,
                )
        self._after_call(group)
        return appends

    def _start_append(self, group: _Group, effect: AppendRecords) -> asyncio.Future[None]:
        records = [encode_record(record) for record in effect.records]
        future = self._appender.submit(group.partition.number, group.partition.epoch, records)
        group.appends_in_flight += 1

        def done(f: asyncio.Future[None]) -> None:
            group.appends_in_flight -= 1
            error = ErrorCode.NONE
            if f.cancelled():
                error = ErrorCode.REQUEST_TIMED_OUT
            elif f.exception() is not None:
                exc = f.exception()
                error = exc.code if isinstance(exc, FjordError) else ErrorCode.UNKNOWN_SERVER_ERROR
                log.warning(
                    "group %s: append to __consumer_offsets-%d failed: %s (answered as %s)",
                    group.machine.group_id,
                    group.partition.number,
                    exc,
                    map_append_error(error).name,
                )
            if not self._owns(group.partition):
                return  # the partition was lost: its requests were answered NOT_COORDINATOR
            self._apply(
                group, group.machine.append_completed(effect.append_id, error, self._clock())
            )
            if error is ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                self.fence(group.partition.number, group.partition.epoch)

        future.add_done_callback(done)
        return future

    def _after_call(self, group: _Group) -> None:
        part = group.partition
        if not self._owns(part):
            return
        machine = group.machine
        vacant = (
            machine.state is GroupState.EMPTY
            and machine.generation_id == 0
            and not machine.pending_members
            and not machine.offsets
            and group.appends_in_flight == 0
            and not group.waiters
        )
        if machine.state is GroupState.DEAD or vacant:
            # Dead, or created by a request that left nothing behind: forget it (a parked
            # append still reports to this machine through its callback).
            if part.groups.get(machine.group_id) is group:
                del part.groups[machine.group_id]
            if group.timer is not None:
                group.timer.cancel()
                group.timer = None
            return
        self._schedule(group)

    def _schedule(self, group: _Group) -> None:
        if group.timer is not None:
            group.timer.cancel()
            group.timer = None
        deadline = group.machine.next_deadline()
        if deadline is None:
            return
        # +1 ms: the loop's monotonic clock and the wall clock may disagree by a rounding.
        delay_s = max(deadline - self._clock() + 1, 0) / 1000
        group.timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer, group)

    def _on_timer(self, group: _Group) -> None:
        group.timer = None
        if group.partition.groups.get(group.machine.group_id) is not group:
            return
        self._apply(group, group.machine.poll_timeouts(self._clock()))

    # --- requests ---------------------------------------------------------------------------

    async def join_group(
        self,
        group_id: str,
        *,
        member_id: str,
        group_instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        require_known_member_id: bool = True,
    ) -> JoinGroupResponse:
        """``require_known_member_id``: a new member first gets MEMBER_ID_REQUIRED (KIP-394;
        False for Kafka's JoinGroup v0-v3)."""
        group = self._group(group_id, create=not member_id)
        if group is None:
            return JoinGroupResponse(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
        response: JoinGroupResponse = await self._call(
            group,
            lambda rid, now: group.machine.join_group(
                rid,
                now,
                member_id=member_id,
                group_instance_id=group_instance_id,
                client_id=client_id,
                client_host=client_host,
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout_ms,
                protocol_type=protocol_type,
                protocols=protocols,
                require_known_member_id=require_known_member_id,
            ),
        )
        return response

    async def sync_group(
        self,
        group_id: str,
        *,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: Mapping[str, bytes],
    ) -> SyncGroupResponse:
        group = self._group(group_id, create=False)
        if group is None:
            return SyncGroupResponse(ErrorCode.UNKNOWN_MEMBER_ID)
        response: SyncGroupResponse = await self._call(
            group,
            lambda rid, now: group.machine.sync_group(
                rid,
                now,
                member_id=member_id,
                generation_id=generation_id,
                group_instance_id=group_instance_id,
                protocol_type=protocol_type,
                protocol_name=protocol_name,
                assignments=assignments,
            ),
        )
        return response

    def heartbeat(
        self, group_id: str, *, member_id: str, generation_id: int, group_instance_id: str | None
    ) -> ErrorCode:
        group = self._group(group_id, create=False)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        error = group.machine.heartbeat(
            self._clock(),
            member_id=member_id,
            generation_id=generation_id,
            group_instance_id=group_instance_id,
        )
        self._after_call(group)
        return error

    def leave_group(
        self, group_id: str, members: Sequence[tuple[str, str | None]]
    ) -> list[ErrorCode]:
        group = self._group(group_id, create=False)
        if group is None:
            return [ErrorCode.UNKNOWN_MEMBER_ID] * len(members)
        errors, effects = group.machine.leave_group(self._clock(), members)
        self._apply(group, effects)
        return errors

    async def commit_offsets(
        self,
        group_id: str,
        *,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, OffsetCommitRequestPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """Per-partition errors; partitions of unknown topics get UNKNOWN_TOPIC_OR_PARTITION
        and are not written."""
        errors: dict[TopicPartition, ErrorCode] = {}
        valid = {}
        for tp, request in offsets.items():
            if self._partition_exists is not None and not self._partition_exists(*tp):
                errors[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                valid[tp] = request
        simple = generation_id < 0 and not member_id and group_instance_id is None
        group = self._group(group_id, create=simple and bool(valid))
        if not valid:
            return errors
        if group is None:
            # Kafka: a member commit for a group this coordinator does not know is stale.
            return errors | dict.fromkeys(valid, ErrorCode.ILLEGAL_GENERATION)
        response: OffsetCommitResponse = await self._call(
            group,
            lambda rid, now: group.machine.commit_offsets(
                rid,
                now,
                member_id=member_id,
                generation_id=generation_id,
                offsets=valid,
                group_instance_id=group_instance_id,
            ),
        )
        return errors | response.errors

    def fetch_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition] | None
    ) -> dict[TopicPartition, CommittedOffset]:
        group = self._group(group_id, create=False)
        if group is None:
            return {tp: CommittedOffset(-1) for tp in partitions or ()}
        return group.machine.fetch_offsets(partitions)

    def list_groups(
        self, states: Sequence[str] = ()
    ) -> tuple[ErrorCode, list[tuple[str, str, str]]]:
        """(error, [(group id, protocol type, state)]) of the loaded partitions' groups; the
        error is COORDINATOR_LOAD_IN_PROGRESS while some owned partition is still loading."""
        if not self.active:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, []
        wanted = {s.lower() for s in states}
        out = []
        for part in self._partitions.values():
            for name, group in part.groups.items():
                state = group.machine.state.value
                if wanted and state.lower() not in wanted:
                    continue
                out.append((name, group.machine.protocol_type or "", state))
        loading = any(not p.loaded for p in self._partitions.values())
        return (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if loading else ErrorCode.NONE), sorted(out)

    def describe_group(self, group_id: str) -> GroupDescription:
        group = self._group(group_id, create=False)
        if group is None:
            return GroupDescription(group_id, GroupState.DEAD, "", "", ())
        return group.machine.describe()

    async def delete_group(self, group_id: str) -> ErrorCode:
        """Kafka's DeleteGroups for one group; answered once its tombstones are written."""
        group = self._group(group_id, create=False)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        error, effects = group.machine.delete(self._clock())
        appends = self._apply(group, effects)
        for append in appends:
            try:
                await asyncio.shield(append)
            except FjordError as exc:
                return map_append_error(exc.code)
        return error

    # --- transactional offsets (docs/transactions.md) ----------------------------------------

    async def txn_commit_offsets(
        self,
        group_id: str,
        *,
        producer_id: int,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, OffsetCommitRequestPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """Kafka's TxnOffsetCommit: the offsets are written as pending records of the
        producer's transaction and count (OffsetFetch sees them) only once
        :meth:`complete_txn_offsets` reports that the transaction committed."""
        errors: dict[TopicPartition, ErrorCode] = {}
        valid: dict[TopicPartition, OffsetCommitValue] = {}
        now = self._clock()
        for tp, request in offsets.items():
            if self._partition_exists is not None and not self._partition_exists(*tp):
                errors[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif request.offset < 0:
                errors[tp] = ErrorCode.INVALID_COMMIT_OFFSET_SIZE
            elif len(request.metadata.encode("utf-8")) > self.config.offset_metadata_max_bytes:
                errors[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                valid[tp] = OffsetCommitValue(
                    request.offset, request.leader_epoch, request.metadata, now
                )
        part = self._partition_for(group_id)
        group = self._group(group_id, create=False)
        if group is not None:
            check = group.machine.check_txn_commit(member_id, generation_id, group_instance_id)
            if check is not ErrorCode.NONE:
                return errors | dict.fromkeys(valid, check)
        elif generation_id >= 0 or member_id:
            return errors | dict.fromkeys(valid, ErrorCode.ILLEGAL_GENERATION)
        if not valid:
            return errors
        records = [
            encode_record((PendingTxnOffsetKey(group_id, tp[0], tp[1], producer_id), value))
            for tp, value in valid.items()
        ]
        try:
            await asyncio.shield(self._appender.submit(part.number, part.epoch, records))
        except FjordError as exc:
            if exc.code is ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                self.fence(part.number, part.epoch)
            return errors | dict.fromkeys(valid, map_append_error(exc.code))
        if not self._owns(part):
            return errors | dict.fromkeys(valid, ErrorCode.NOT_COORDINATOR)
        part.pending_txn.setdefault(producer_id, {}).setdefault(group_id, {}).update(valid)
        return errors | dict.fromkeys(valid, ErrorCode.NONE)

    async def complete_txn_offsets(self, partition: int, producer_id: int, committed: bool) -> None:
        """The transaction of ``producer_id`` ended (its marker is written to this
        ``__consumer_offsets`` partition): its pending offsets become committed offsets
        (appended as ordinary commits) or are dropped; their pending records are tombstoned.
        Raises NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS (the caller retries, at the new
        owner) and the append's typed error."""
        if not self.active:
            raise error_for_code(ErrorCode.COORDINATOR_NOT_AVAILABLE, "not registered")
        part = self._partitions.get(partition)
        if part is None:
            raise error_for_code(
                ErrorCode.NOT_COORDINATOR,
                f"__consumer_offsets partition {partition} is not owned here",
            )
        if not part.loaded:
            raise error_for_code(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                f"__consumer_offsets partition {partition} is still loading",
            )
        by_group = part.pending_txn.get(producer_id, {})
        for group_id, offsets in list(by_group.items()):
            if committed:
                group = self._group(group_id, create=True)
                assert group is not None
                machine = group.machine
                response: OffsetCommitResponse = await self._call(
                    group, functools.partial(_materialize, machine, offsets)
                )
                failed = {e for e in response.errors.values() if e is not ErrorCode.NONE}
                if failed:
                    raise error_for_code(
                        failed.pop(), f"materializing the offsets of group {group_id!r}"
                    )
            tombstones = [
                encode_record((PendingTxnOffsetKey(group_id, tp[0], tp[1], producer_id), None))
                for tp in offsets
            ]
            await asyncio.shield(self._appender.submit(part.number, part.epoch, tombstones))
            if not self._owns(part):
                raise error_for_code(ErrorCode.NOT_COORDINATOR, "the partition moved")
            by_group.pop(group_id, None)
        part.pending_txn.pop(producer_id, None)

    def pending_txn_partitions(self, group_id: str) -> set[TopicPartition]:
        """The partitions of ``group_id`` whose offsets an open transaction committed
        (OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them)."""
        part = self._partition_for(group_id)
        return {
            tp for groups in part.pending_txn.values() for tp in groups.get(group_id, {})
        }

    # --- periodic duties --------------------------------------------------------------------

    def expire_offsets(self) -> None:
        """``offsets.retention.check.interval.ms``: run offset expiry on every served group."""
        now = self._clock()
        for part in list(self._partitions.values()):
            if not part.loaded:
                continue
            for group in list(part.groups.values()):
                self._apply(group, group.machine.expire_offsets(now))

    def committed_offsets(self) -> dict[str, dict[TopicPartition, int]]:
        """Every served group's committed offsets (for the lag gauges)."""
        out: dict[str, dict[TopicPartition, int]] = {}
        for part in self._partitions.values():
            if not part.loaded:
                continue
            for name, group in part.groups.items():
                offsets = group.machine.offsets
                if offsets:
                    out[name] = {tp: value.offset for tp, value in offsets.items()}
        return out

    def state_counts(self) -> dict[str, int]:
        """How many served groups are in each state (every state listed, 0 included)."""
        counts = {state.value: 0 for state in GroupState}
        for part in self._partitions.values():
            for group in part.groups.values():
                counts[group.machine.state.value] += 1
        return counts
