"""Consumer lag and offset resets, pure: what ``kafka-consumer-groups.sh --describe`` shows and
what ``--reset-offsets`` would commit. The admin client / CLI gathers the inputs (committed
offsets, log start/end offsets, ``offsets_for_times`` answers, the group description) and
commits the plan with a simple (generation -1) OffsetCommit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fjord.errors import InvalidRequestError, NonEmptyGroupError, UnknownTopicOrPartitionError
from fjord.topic_partition import TopicPartition


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
    time_lag_s: float | None = None
    """Seconds behind (:func:`time_lag_seconds`); None ("-") when unknown."""


def time_lag_seconds(
    committed: int | None,
    log_end_offset: int | None,
    first_uncommitted_timestamp_ms: int | None,
    now_ms: int,
) -> float | None:
    """How far behind in time a group is on one partition: now minus the timestamp of the
    first record not yet committed (the record at the committed offset, or the next one that
    exists). 0 when caught up (committed >= log end offset: nothing is waiting); None when the
    committed offset, the log end or that record's timestamp is unknown (a record without a
    timestamp, -1, is unknown too). Never negative: a record stamped in the future (producer
    clock ahead) counts as 0 s behind."""
    if committed is None or committed < 0 or log_end_offset is None:
        return None
    if committed >= log_end_offset:
        return 0.0
    if first_uncommitted_timestamp_ms is None or first_uncommitted_timestamp_ms < 0:
        return None
    return max(now_ms - first_uncommitted_timestamp_ms, 0) / 1000


def lag_rows(
    committed: Mapping[TopicPartition, int],
    log_end_offsets: Mapping[TopicPartition, int],
    members: Iterable[MemberPartitions] = (),
    first_uncommitted_timestamps: Mapping[TopicPartition, int | None] | None = None,
    now_ms: int = 0,
) -> list[LagRow]:
    """Rows for every partition that has a committed offset or is assigned to a member, sorted
    by (topic, partition), lag = log end offset - committed offset (never below 0: a committed
    offset past the end, e.g. after truncation, shows lag 0 as Kafka does). With
    ``first_uncommitted_timestamps`` (the timestamp of the record at each committed offset)
    and the clock ``now_ms``, each row's time lag too (:func:`time_lag_seconds`)."""
    owner: dict[TopicPartition, MemberPartitions] = {}
    for member in members:
        for tp in member.partitions:
            owner[TopicPartition(*tp)] = member
    keys = sorted({TopicPartition(*tp) for tp in committed} | set(owner))
    rows = []
    for tp in keys:
        current = committed.get(tp)
        if current is not None and current < 0:
            current = None  # OffsetFetch's -1: nothing committed
        end = log_end_offsets.get(tp)
        lag = None if current is None or end is None else max(end - current, 0)
        time_lag = (
            None
            if first_uncommitted_timestamps is None
            else time_lag_seconds(current, end, first_uncommitted_timestamps.get(tp), now_ms)
        )
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
                time_lag,
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


@dataclass(frozen=True)
class ByDuration:
    """``--by-duration``: reset to the first offset whose timestamp is >= now minus
    ``duration_ms`` (the shell fixes "now" and asks ``offsets_for_times``, as for
    :class:`ToDatetime`; a negative duration points into the future: the log end)."""

    duration_ms: int


@dataclass(frozen=True)
class FromFile:
    """``--from-file``: the offsets of a reset plan file (see :func:`parse_reset_csv`); the
    file's partitions are the scope. ``offsets`` is sorted by (topic, partition)."""

    offsets: tuple[tuple[str, int, int], ...]

    def as_mapping(self) -> dict[TopicPartition, int]:
        return {
            TopicPartition(topic, partition): offset for topic, partition, offset in self.offsets
        }


ResetSpec = ToEarliest | ToLatest | ToOffset | ToDatetime | ShiftBy | ByDuration | FromFile

#: Java's ``Duration.parse`` grammar (what kafka-consumer-groups.sh --by-duration takes):
#: ``PnDTnHnMn.nS``, each part optional but at least one, signs allowed, case-insensitive.
_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?\d+)D)?"
    r"(T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+)(?:[.,](\d{0,9}))?S)?)?",
    re.IGNORECASE,
)


def parse_duration_ms(text: str) -> int:
    """``--by-duration``: an ISO 8601 duration as Java's ``Duration.parse`` reads it
    (``PT10M``, ``P1DT2H``, ``PT0.5S``, ``-PT1H``) in milliseconds (fractions below a
    millisecond are dropped). InvalidRequestError for anything else (``10m``, ``P1M``: months
    and years are not durations, ``PT`` without a part)."""
    match = _DURATION.fullmatch(text.strip())
    if (
        match is None
        or (match.group(3) is not None and match.group(3).upper() == "T")
        or all(match.group(i) is None for i in (2, 4, 5, 6))
    ):
        raise InvalidRequestError(
            f"--by-duration {text!r}: expected an ISO 8601 duration PnDTnHnMnS like PT10M, "
            "P1DT2H or PT30.5S (days, hours, minutes, seconds; no years or months)"
        )
    days, hours, minutes, seconds = (int(match.group(i) or 0) for i in (2, 4, 5, 6))
    fraction = (match.group(7) or "").ljust(3, "0")[:3]
    millis = int(fraction) * (-1 if match.group(6) and match.group(6).startswith("-") else 1)
    total = ((days * 24 + hours) * 60 + minutes) * 60_000 + seconds * 1000 + millis
    return -total if match.group(1) == "-" else total


def parse_reset_csv(text: str, source: str = "the reset file") -> FromFile:
    """``--from-file``: one ``topic,partition,offset`` line per partition, as
    kafka-consumer-groups.sh writes with ``--export`` for one group (blank lines are skipped; a
    ``group,topic,partition,offset`` line of a several-group export is refused, as is a
    partition given twice). InvalidRequestError naming the line for anything else."""
    offsets: dict[TopicPartition, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split(",")]
        where = f"{source} line {number} ({line!r})"
        if len(fields) != 3:
            several = " (a several-group export: reset one group at a time)"
            raise InvalidRequestError(
                f"{where}: expected topic,partition,offset" + (several if len(fields) == 4 else "")
            )
        topic, partition_text, offset_text = fields
        if not topic:
            raise InvalidRequestError(f"{where}: empty topic name")
        try:
            partition, offset = int(partition_text), int(offset_text)
        except ValueError:
            raise InvalidRequestError(f"{where}: partition and offset must be integers") from None
        if partition < 0 or offset < 0:
            raise InvalidRequestError(f"{where}: partition and offset must be >= 0")
        if (topic, partition) in offsets:
            raise InvalidRequestError(f"{where}: {topic}-{partition} is given twice")
        offsets[TopicPartition(topic, partition)] = offset
    if not offsets:
        raise InvalidRequestError(f"{source} names no partition (lines topic,partition,offset)")
    return FromFile(tuple((t, p, o) for (t, p), o in sorted(offsets.items())))


def export_csv(plan: Iterable[PartitionReset]) -> str:
    """A plan as ``topic,partition,offset`` lines (``--export``): what :func:`parse_reset_csv`
    reads back."""
    return "".join(f"{r.topic},{r.partition},{r.new_offset}\n" for r in plan)


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
    from_file: FromFile | None = None,
) -> list[TopicPartition]:
    """The partitions a reset touches: ``--all-topics`` = every partition of every topic the
    group has committed offsets for; ``--topic`` selectors (see :func:`parse_topic_selector`)
    otherwise. Exactly one of the two must be given, unless ``from_file``: then the file's
    partitions are the scope and neither may be given. A partition that does not exist is
    UnknownTopicOrPartitionError."""
    wanted: list[tuple[str, tuple[int, ...] | None]]
    if from_file is not None:
        if all_topics or topics:
            raise InvalidRequestError(
                "--from-file names its partitions: give neither --all-topics nor --topic"
            )
        by_topic: dict[str, list[int]] = {}
        for topic, partition, _ in from_file.offsets:
            by_topic.setdefault(topic, []).append(partition)
        wanted = [(t, tuple(ps)) for t, ps in sorted(by_topic.items())]
    elif all_topics == bool(topics):
        raise InvalidRequestError("give exactly one of --all-topics or --topic")
    elif all_topics:
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
            scope.add(TopicPartition(topic, p))
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
    clamped to [earliest, latest] as Kafka's tool does. ``--to-datetime`` and ``--by-duration``
    need ``offsets_for_times`` (None for a partition = no record that late: the log end
    offset); ``--shift-by`` needs a committed offset for each partition; ``--from-file`` plans
    exactly the file's partitions (any other partition given is refused)."""
    if active_members > 0 or group_state not in ("Empty", "Dead"):
        raise NonEmptyGroupError(
            f"assignments can only be reset if the group {group_id!r} is inactive, but the "
            f"current state is {group_state} with {active_members} active member(s)"
        )
    plan = []
    for tp in sorted({TopicPartition(*tp) for tp in partitions}):
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
        elif isinstance(spec, ToDatetime | ByDuration):
            if offsets_for_times is None or tp not in offsets_for_times:
                option = "--to-datetime" if isinstance(spec, ToDatetime) else "--by-duration"
                raise InvalidRequestError(
                    f"{option} needs the offsets_for_times answer for {tp[0]}-{tp[1]}"
                )
            found = offsets_for_times[tp]
            target = high if found is None else found
        elif isinstance(spec, FromFile):
            from_file = spec.as_mapping()
            if tp not in from_file:
                raise InvalidRequestError(f"{tp[0]}-{tp[1]} is not in the --from-file plan")
            target = from_file[tp]
        else:
            if current is None:
                raise InvalidRequestError(
                    f"cannot shift the offset of {tp[0]}-{tp[1]}: the group has no committed "
                    "offset for it"
                )
            target = current + spec.shift
        plan.append(PartitionReset(tp[0], tp[1], current, min(max(target, low), high)))
    return plan
