"""A harness that plays the coordinator shell around one GroupStateMachine (Kafka's group
protocol driven by an injected clock): request ids, replies, appends into an in-memory log.
Shared by the state machine's example tests and its properties."""

from __future__ import annotations

import itertools

from fjord.coordinator.group import (
    AppendRecords,
    GroupConfig,
    GroupStateMachine,
    OffsetCommitRequestPartition,
    Reply,
)
from fjord.errors import ErrorCode
from fjord.groups.protocol import Subscription, encode_subscription
from fjord.groups.state import GroupState

SESSION = 10_000
REBALANCE = 30_000
DELAY = 3_000
E = ErrorCode


def sub(*topics: str) -> bytes:
    return encode_subscription(Subscription(tuple(topics)))


class Shell:
    """Plays the coordinator shell around one GroupStateMachine: request ids, replies, appends
    (auto-completed unless ``hold_appends``), and the log they produce."""

    def __init__(self, config: GroupConfig | None = None, group: GroupStateMachine | None = None):
        counter = itertools.count(1)
        self.group = group or GroupStateMachine(
            "g",
            config or GroupConfig(initial_rebalance_delay_ms=DELAY),
            member_id_factory=lambda client: f"{client}-{next(counter)}",
        )
        self.now = 0
        self.replies: dict[int, object] = {}
        self.log: list = []
        self.held: list[AppendRecords] = []
        self.hold_appends = False
        self.fail_appends: ErrorCode | None = None
        self.events: list = []
        self._ids = itertools.count(1)

    def run(self, effects):
        queue = list(effects)
        while queue:
            effect = queue.pop(0)
            if isinstance(effect, Reply):
                assert effect.request_id not in self.replies, "a request answered twice"
                self.replies[effect.request_id] = effect.response
            elif isinstance(effect, AppendRecords):
                if self.hold_appends:
                    self.held.append(effect)
                else:
                    queue.extend(self.complete(effect))
            else:
                self.events.append(effect)

    def complete(self, append: AppendRecords, error: ErrorCode | None = None):
        error = error or self.fail_appends or E.NONE
        if error is E.NONE:
            self.log.extend(append.records)
        return self.group.append_completed(append.append_id, error, self.now)

    def release(self, error: ErrorCode | None = None):
        held, self.held = self.held, []
        for append in held:
            self.run(self.complete(append, error))

    def advance(self, ms: int):
        self.now += ms
        self.run(self.group.poll_timeouts(self.now))

    def join(
        self,
        member_id="",
        client="c",
        instance=None,
        protocols=None,
        session=SESSION,
        rebalance=REBALANCE,
        protocol_type="consumer",
    ):
        rid = next(self._ids)
        self.run(
            self.group.join_group(
                rid,
                self.now,
                member_id=member_id,
                group_instance_id=instance,
                client_id=client,
                client_host="/127.0.0.1",
                session_timeout_ms=session,
                rebalance_timeout_ms=rebalance,
                protocol_type=protocol_type,
                protocols=protocols or [("range", sub("t"))],
            )
        )
        return rid

    def sync(self, member_id, generation, assignments=None, instance=None):
        rid = next(self._ids)
        self.run(
            self.group.sync_group(
                rid,
                self.now,
                member_id=member_id,
                generation_id=generation,
                group_instance_id=instance,
                assignments=assignments,
            )
        )
        return rid

    def commit(self, member_id, generation, offsets, instance=None):
        rid = next(self._ids)
        self.run(
            self.group.commit_offsets(
                rid,
                self.now,
                member_id=member_id,
                generation_id=generation,
                group_instance_id=instance,
                offsets={
                    tp: OffsetCommitRequestPartition(o) if isinstance(o, int) else o
                    for tp, o in offsets.items()
                },
            )
        )
        return rid

    def reply(self, rid):
        return self.replies.get(rid)

    def new_member(self, client="c", **kw) -> str:
        """A dynamic member's first JoinGroup (MEMBER_ID_REQUIRED) and its rejoin; returns the
        id and leaves the rejoin parked."""
        first = self.reply(self.join(client=client, **kw))
        assert first.error is E.MEMBER_ID_REQUIRED and first.member_id
        self.last_join = self.join(member_id=first.member_id, client=client, **kw)
        return first.member_id

    def stable_group(self, n=2, **kw):
        ids, joins = [], []
        for i in range(n):
            ids.append(self.new_member(client=f"c{i}", **kw))
            joins.append(self.last_join)
        self.advance(2 * DELAY)
        responses = [self.reply(r) for r in joins]
        assert all(r.error is E.NONE for r in responses)
        leader = responses[0].leader_id
        generation = responses[0].generation_id
        syncs = {
            m: self.sync(
                m, generation, {x: f"A-{x}".encode() for x in ids} if m == leader else None
            )
            for m in ids
        }
        assert all(self.reply(r).error is E.NONE for r in syncs.values())
        assert self.group.state is GroupState.STABLE
        return ids, leader, generation
