"""Consumer lag and offset resets, pure: what ``kafka-consumer-groups.sh --describe`` shows and
what ``--reset-offsets`` would commit. The admin client / CLI gathers the inputs (committed
offsets, log start/end offsets, ``offsets_for_times`` answers, the group description) and
commits the plan with a simple (generation -1) OffsetCommit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fjord.errors import InvalidRequestError, NonEmptyGroupError, UnknownTopicOrPartitionError
from fjord.groups.protocol import TopicPartition


@dataclass(frozen=True)
class MemberPartitions:
    """An active member and the partitions assigned to it (from DescribeGroups)."""

    consumer_id: str
    host: str
    client_id: str
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True)
class LagRow:
    """One row of ``--describe``. ``current_offset`` is None ("-") when nothing is committed,
    ``log_end_offset`` None when unknown, ``lag`` None when either is; consumer fields are None
    ("-") for partitions no active member holds."""

    topic: str
    partition: int
    current_offset: int | None
    log_end_offset: int | None
    lag: int | None
    consumer_id: str | None
    host: str | None
    client_id: str | None


def lag_rows(
    committed: Mapping[TopicPartition, int],
    log_end_offsets: Mapping[TopicPartition, int],
    members: Iterable[MemberPartitions] = (),
) -> list[LagRow]:
    """Rows for every partition that has a committed offset or is assigned to a member, sorted
    by (topic, partition), lag = log end offset - committed offset (never below 0: a committed
    offset past the end, e.g. after truncation, shows lag 0 as Kafka does)."""
    owner: dict[TopicPartition, MemberPartitions] = {}
    for member in members:
        for tp in member.partitions:
            owner[(tp[0], tp[1])] = member
    keys = sorted({(tp[0], tp[1]) for tp in committed} | set(owner))
    rows = []
    for tp in keys:
        current = committed.get(tp)
        if current is not None and current < 0:
            current = None  # OffsetFetch's -1: nothing committed
        end = log_end_offsets.get(tp)
        lag = None if current is None or end is None else max(end - current, 0)
        holder = owner.get(tp)
        rows.append(
            LagRow(
                tp[0],
                tp[1],
                current,
                end,
                lag,
                holder.consumer_id if holder else None,
                holder.host if holder else None,
                holder.client_id if holder else None,
            )
        )
    return rows


def total_lag(rows: Iterable[LagRow]) -> int:
    """Sum of the known lags (the per-group metric)."""
    return sum(row.lag for row in rows if row.lag is not None)


# --- reset planning -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ToEarliest:
    pass


@dataclass(frozen=True)
class ToLatest:
    pass


@dataclass(frozen=True)
class ToOffset:
    offset: int


@dataclass(frozen=True)
class ToDatetime:
    """Reset to the first offset whose timestamp is >= ``timestamp_ms`` (``--to-datetime``)."""

    timestamp_ms: int


@dataclass(frozen=True)
class ShiftBy:
    shift: int


ResetSpec = ToEarliest | ToLatest | ToOffset | ToDatetime | ShiftBy


@dataclass(frozen=True)
class PartitionReset:
    """One line of the plan: ``--dry-run`` prints these, ``--execute`` commits new_offset."""

    topic: str
    partition: int
    current_offset: int | None
    new_offset: int


def parse_topic_selector(selector: str) -> tuple[str, tuple[int, ...] | None]:
    """``--topic`` values: ``orders`` (all partitions) or ``orders:0,2,5`` (those)."""
    topic, sep, numbers = selector.partition(":")
    if not topic:
        raise InvalidRequestError(f"--topic {selector!r}: empty topic name")
    if not sep:
        return topic, None
    try:
        partitions = tuple(int(n) for n in numbers.split(",") if n.strip())
    except ValueError:
        raise InvalidRequestError(
            f"--topic {selector!r}: partitions must be integers like orders:0,1"
        ) from None
    if not partitions or any(p < 0 for p in partitions):
        raise InvalidRequestError(f"--topic {selector!r}: give at least one partition >= 0")
    return topic, partitions


def reset_scope(
    *,
    topics: Sequence[str] | None,
    all_topics: bool,
    partitions_per_topic: Mapping[str, int],
    committed: Mapping[TopicPartition, int],
) -> list[TopicPartition]:
    """The partitions a reset touches: ``--all-topics`` = every partition of every topic the
    group has committed offsets for; ``--topic`` selectors (see :func:`parse_topic_selector`)
    otherwise. Exactly one of the two must be given."""
    if all_topics == bool(topics):
        raise InvalidRequestError("give exactly one of --all-topics or --topic")
    wanted: list[tuple[str, tuple[int, ...] | None]]
    if all_topics:
        wanted = [(t, None) for t in sorted({tp[0] for tp in committed})]
    else:
        wanted = [parse_topic_selector(s) for s in topics or ()]
    scope: set[TopicPartition] = set()
    for topic, numbers in wanted:
        count = partitions_per_topic.get(topic)
        if count is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        for p in numbers if numbers is not None else range(count):
            if not 0 <= p < count:
                raise UnknownTopicOrPartitionError(f"{topic}-{p}: topic has {count} partitions")
            scope.add((topic, p))
    return sorted(scope)


def plan_offset_reset(
    group_id: str,
    spec: ResetSpec,
    partitions: Iterable[TopicPartition],
    *,
    group_state: str,
    active_members: int,
    committed: Mapping[TopicPartition, int],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    offsets_for_times: Mapping[TopicPartition, int | None] | None = None,
) -> list[PartitionReset]:
    """Kafka's ``--reset-offsets`` plan. Refused (NonEmptyGroupError) unless the group is
    inactive (Empty or Dead, no members): active members would overwrite it. Every new offset is
    clamped to [earliest, latest] as Kafka's tool does. ``--to-datetime`` needs
    ``offsets_for_times`` (None for a partition = no record that late: the log end offset);
    ``--shift-by`` needs a committed offset for each partition."""
    if active_members > 0 or group_state not in ("Empty", "Dead"):
        raise NonEmptyGroupError(
            f"assignments can only be reset if the group {group_id!r} is inactive, but the "
            f"current state is {group_state} with {active_members} active member(s)"
        )
    plan = []
    for tp in sorted({(tp[0], tp[1]) for tp in partitions}):
        if tp not in earliest or tp not in latest:
            raise InvalidRequestError(f"no earliest/latest offset given for {tp[0]}-{tp[1]}")
        low, high = earliest[tp], latest[tp]
        current = committed.get(tp)
        if current is not None and current < 0:
            current = None
        if isinstance(spec, ToEarliest):
            target = low
        elif isinstance(spec, ToLatest):
            target = high
        elif isinstance(spec, ToOffset):
            target = spec.offset
        elif isinstance(spec, ToDatetime):
            if offsets_for_times is None or tp not in offsets_for_times:
                raise InvalidRequestError(
                    f"--to-datetime needs the offsets_for_times answer for {tp[0]}-{tp[1]}"
                )
            found = offsets_for_times[tp]
            target = high if found is None else found
        else:
            if current is None:
                raise InvalidRequestError(
                    f"cannot shift the offset of {tp[0]}-{tp[1]}: the group has no committed "
                    "offset for it"
                )
            target = current + spec.shift
        plan.append(PartitionReset(tp[0], tp[1], current, min(max(target, low), high)))
    return plan
