"""``fjord groups list|describe|delete|reset-offsets``: Kafka's kafka-consumer-groups tool.

The commands only translate: the admin client gathers state, committed offsets and log end
offsets; :mod:`fjord.groups.lag` computes lag rows and reset plans. The helpers below that
turn options into specs and results into rows are pure (tested without a cluster).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import click

from fjord.cli.client_common import (
    admin_client_config,
    bootstrap_option,
    emit,
    friendly_errors,
    output_option,
)
from fjord.client import AdminClient, TopicPartition
from fjord.client.admin import DEAD_STATE, ConsumerGroupDescription
from fjord.errors import GroupIdNotFoundError, InvalidRequestError
from fjord.groups.lag import (
    ByDuration,
    LagRow,
    PartitionReset,
    ResetSpec,
    ShiftBy,
    ToDatetime,
    ToEarliest,
    ToLatest,
    ToOffset,
    export_csv,
    parse_duration_ms,
    parse_reset_csv,
)

#: The columns of ``describe`` (kafka-consumer-groups --describe --offsets).
OFFSET_HEADERS = (
    "GROUP",
    "TOPIC",
    "PARTITION",
    "CURRENT-OFFSET",
    "LOG-END-OFFSET",
    "LAG",
    "TIME-LAG",
    "CONSUMER-ID",
    "HOST",
    "CLIENT-ID",
)
MEMBER_HEADERS = ("GROUP", "CONSUMER-ID", "GROUP-INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS")
STATE_HEADERS = ("GROUP", "COORDINATOR", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS")
PLAN_HEADERS = ("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET")

DRY_RUN_NOTE = (
    "WARN: No action was performed: this is a dry run. Add --execute to reset the offsets."
)


def _admin(bootstrap_server: str | None) -> AdminClient:
    return AdminClient(admin_client_config(bootstrap_server))


def _dash(value: Any) -> Any:
    return "-" if value is None or value == "" else value


# --- pure helpers ---------------------------------------------------------------------------


def parse_datetime_ms(text: str) -> int:
    """``--to-datetime``: ISO 8601 as Kafka's tool takes it (``2026-11-22T10:00:00.000``,
    optionally with ``Z`` or ``+02:00``) as epoch ms; without a zone it is local time, as in
    Kafka's tool."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise click.BadParameter(
            f"expected an ISO 8601 date-time like 2026-11-22T10:00:00.000 or "
            f"2026-11-22T10:00:00Z, got {text!r}",
            param_hint="--to-datetime",
        ) from None
    return round(moment.timestamp() * 1000)


def reset_spec(
    *,
    to_earliest: bool,
    to_latest: bool,
    to_offset: int | None,
    to_datetime: str | None,
    shift_by: int | None,
    by_duration: str | None = None,
    from_file: str | None = None,
) -> ResetSpec:
    """The one reset scenario the options name (UsageError for none or several).
    ``from_file`` is the text of the ``--from-file`` CSV (BadParameter naming the line that is
    wrong), ``by_duration`` an ISO 8601 duration (BadParameter if it is not one)."""
    given: list[ResetSpec] = []
    if to_earliest:
        given.append(ToEarliest())
    if to_latest:
        given.append(ToLatest())
    if to_offset is not None:
        if to_offset < 0:
            raise click.BadParameter(f"must be >= 0, got {to_offset}", param_hint="--to-offset")
        given.append(ToOffset(to_offset))
    if to_datetime is not None:
        given.append(ToDatetime(parse_datetime_ms(to_datetime)))
    if shift_by is not None:
        given.append(ShiftBy(shift_by))
    if by_duration is not None:
        try:
            given.append(ByDuration(parse_duration_ms(by_duration)))
        except InvalidRequestError as exc:
            raise click.BadParameter(str(exc), param_hint="--by-duration") from None
    if from_file is not None:
        try:
            given.append(parse_reset_csv(from_file))
        except InvalidRequestError as exc:
            raise click.BadParameter(str(exc), param_hint="--from-file") from None
    if len(given) != 1:
        raise click.UsageError(
            "give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, "
            "--by-duration, --from-file, --shift-by"
        )
    return given[0]


def group_summary(description: ConsumerGroupDescription) -> str:
    """The line above the ``describe`` table (Kafka's wording for a group without members)."""
    if not description.members:
        return f"Consumer group '{description.group_id}' has no active members."
    assignor = description.partition_assignor
    using = f", assignor {assignor}" if assignor else ""
    return (
        f"Consumer group '{description.group_id}' is {description.state} with "
        f"{len(description.members)} active member(s){using}."
    )


def format_time_lag(seconds: float | None) -> str:
    """TIME-LAG as a person reads it: ``0s``, ``4.2s``, ``3m12s``, ``2h05m``, ``3d04h``; "-"
    when unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return "0s" if seconds == 0 else f"{seconds:.1f}s"
    whole = int(seconds)
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"


def offset_rows(group_id: str, rows: Sequence[LagRow]) -> list[tuple[Any, ...]]:
    return [
        (
            group_id,
            r.topic,
            r.partition,
            _dash(r.current_offset),
            _dash(r.log_end_offset),
            _dash(r.lag),
            format_time_lag(r.time_lag_s),
            _dash(r.consumer_id),
            _dash(r.host),
            _dash(r.client_id),
        )
        for r in rows
    ]


def describe_json(description: ConsumerGroupDescription, rows: Sequence[LagRow]) -> dict[str, Any]:
    """``describe --output json``: the group, its state and one object per row (None where the
    table shows "-")."""
    return {
        "group": description.group_id,
        "state": description.state,
        "protocol_type": description.protocol_type,
        "assignor": description.partition_assignor,
        "coordinator": description.coordinator,
        "members": [
            {
                "consumer_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "host": m.host,
                "client_id": m.client_id,
                "assignment": [{"topic": t, "partition": p} for t, p in m.assignment],
            }
            for m in description.members
        ],
        "rows": [
            {
                "topic": r.topic,
                "partition": r.partition,
                "current_offset": r.current_offset,
                "log_end_offset": r.log_end_offset,
                "lag": r.lag,
                "time_lag_seconds": r.time_lag_s,
                "consumer_id": r.consumer_id,
                "host": r.host,
                "client_id": r.client_id,
            }
            for r in rows
        ],
    }


def format_assignment(partitions: Sequence[TopicPartition]) -> str:
    """Kafka's ``--members --verbose`` ASSIGNMENT cell: ``orders(0,1),audit(2)`` or ``-``."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    cells = [f"{t}({','.join(map(str, ps))})" for t, ps in by_topic.items()]
    return ",".join(cells) or "-"


def member_rows(
    description: ConsumerGroupDescription, verbose: bool = False
) -> list[tuple[Any, ...]]:
    return [
        (
            description.group_id,
            m.member_id,
            _dash(m.group_instance_id),
            m.host,
            m.client_id,
            len(m.assignment),
            *((format_assignment(m.assignment),) if verbose else ()),
        )
        for m in description.members
    ]


def state_row(description: ConsumerGroupDescription) -> tuple[Any, ...]:
    return (
        description.group_id,
        description.coordinator,
        _dash(description.partition_assignor),
        description.state,
        len(description.members),
    )


def plan_rows(group_id: str, plan: Sequence[PartitionReset]) -> list[tuple[Any, ...]]:
    return [(group_id, r.topic, r.partition, r.new_offset) for r in plan]


def plan_json(group_id: str, plan: Sequence[PartitionReset], executed: bool) -> dict[str, Any]:
    return {
        "group": group_id,
        "executed": executed,
        "plan": [
            {
                "topic": r.topic,
                "partition": r.partition,
                "current_offset": r.current_offset,
                "new_offset": r.new_offset,
            }
            for r in plan
        ],
    }


def parse_states(text: str) -> list[str]:
    """``--state Stable,Empty`` (Kafka's comma-separated list; "" = every state)."""
    return [s.strip() for s in text.split(",") if s.strip()]


def require_existing(description: ConsumerGroupDescription) -> None:
    """Dead means the coordinator does not know the group: Kafka's tool says so and fails."""
    if description.state == DEAD_STATE:
        raise GroupIdNotFoundError(f"Consumer group '{description.group_id}' does not exist.")


# --- commands -------------------------------------------------------------------------------


@click.group("groups")
def groups() -> None:
    """List, describe, delete consumer groups and reset their offsets."""


@groups.command("list")
@bootstrap_option
@output_option
@click.option(
    "--state",
    "state",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[STATE,...]",
    help="Show each group's state; with a value (e.g. Stable,Empty) only groups in those states.",
)
@friendly_errors
def list_(bootstrap_server: str | None, output: str, state: str | None) -> None:
    """List the consumer groups of every coordinator."""
    states = parse_states(state) if state else None
    with _admin(bootstrap_server) as admin:
        listed = admin.list_consumer_groups(states)
    data = [
        {"group": g.group_id, "state": g.state, "protocol_type": g.protocol_type} for g in listed
    ]
    if output == "json":
        emit(output, data, [], [])
    elif state is None:
        for g in listed:
            click.echo(g.group_id)
    else:
        emit(output, data, [(g.group_id, g.state) for g in listed], ["GROUP", "STATE"])


@groups.command("describe")
@bootstrap_option
@output_option
@click.option("--group", "group_ids", multiple=True, help="Group to describe (repeatable).")
@click.option("--all-groups", is_flag=True, help="Describe every group.")
@click.option("--members", "view", flag_value="members", help="Show members, not offsets.")
@click.option("--state", "view", flag_value="state", help="Show state, assignor, coordinator.")
@click.option("--verbose", is_flag=True, help="With --members: each member's partitions.")
@friendly_errors
def describe(
    bootstrap_server: str | None,
    output: str,
    group_ids: tuple[str, ...],
    all_groups: bool,
    view: str | None,
    verbose: bool,
) -> None:
    """Committed offsets, log end offsets, lag and owners of a group's partitions."""
    if bool(group_ids) == all_groups:
        raise click.UsageError("give --group G (repeatable) or --all-groups")
    with _admin(bootstrap_server) as admin:
        ids = list(group_ids) or [g.group_id for g in admin.list_consumer_groups()]
        described = admin.describe_consumer_groups(ids)
        results: list[tuple[ConsumerGroupDescription, list[LagRow]]] = []
        for group_id in ids:
            description = described[group_id]
            rows = []
            if view is None:
                rows = admin.describe_consumer_group_lag(group_id, description=description)
            if description.state == DEAD_STATE and not rows:
                if all_groups:
                    continue  # deleted since it was listed
                require_existing(description)
            results.append((description, rows))
    if output == "json":
        data = [describe_json(d, rows) for d, rows in results]
        emit(output, data[0] if len(group_ids) == 1 else data, [], [])
        return
    for i, (description, rows) in enumerate(results):
        if i:
            click.echo("")
        if view == "state":
            emit(output, None, [state_row(description)], STATE_HEADERS)
        elif view == "members":
            click.echo(group_summary(description))
            headers = (*MEMBER_HEADERS, "ASSIGNMENT") if verbose else MEMBER_HEADERS
            emit(output, None, member_rows(description, verbose), headers)
        else:
            click.echo(group_summary(description))
            emit(output, None, offset_rows(description.group_id, rows), OFFSET_HEADERS)


@groups.command("delete")
@bootstrap_option
@click.option(
    "--group", "group_ids", multiple=True, required=True, help="Group to delete (repeatable)."
)
@friendly_errors
def delete(bootstrap_server: str | None, group_ids: tuple[str, ...]) -> None:
    """Delete groups and their committed offsets (only groups without active members)."""
    with _admin(bootstrap_server) as admin:
        results = admin.delete_consumer_groups(group_ids, raise_on_error=False)
    done = [g for g, error in results.items() if error is None]
    if done:
        click.echo(
            "Deletion of requested consumer groups ("
            + ", ".join(f"'{g}'" for g in done)
            + ") was successful."
        )
    failed = [
        f"Group '{g}' could not be deleted due to: {error.code.name}: {error}"
        for g, error in results.items()
        if error is not None
    ]
    if failed:
        raise click.ClickException("\n".join(failed))  # one line per group that is left


@groups.command("reset-offsets")
@bootstrap_option
@output_option
@click.option("--group", "group_id", required=True, help="The group whose offsets to reset.")
@click.option(
    "--topic",
    "topics",
    multiple=True,
    metavar="TOPIC[:P,...]",
    help="A topic, or some of its partitions (orders:0,2); repeatable.",
)
@click.option("--all-topics", is_flag=True, help="Every topic the group has offsets for.")
@click.option("--to-earliest", is_flag=True, help="Reset to the log start offset.")
@click.option("--to-latest", is_flag=True, help="Reset to the log end offset.")
@click.option("--to-offset", type=int, default=None, help="Reset to this offset (clamped).")
@click.option(
    "--to-datetime",
    default=None,
    metavar="YYYY-MM-DDTHH:mm:SS.sss[Z|+HH:MM]",
    help="Reset to the first record at or after this time (no zone: local time).",
)
@click.option(
    "--by-duration",
    default=None,
    metavar="PnDTnHnMnS",
    help="Reset to the first record at or after now minus this ISO 8601 duration (PT10M).",
)
@click.option(
    "--from-file",
    type=click.File("r"),
    default=None,
    help="Reset to the offsets of a CSV plan (topic,partition,offset lines; - for stdin).",
)
@click.option("--shift-by", type=int, default=None, help="Move the committed offset by N.")
@click.option("--dry-run", is_flag=True, help="Only print the plan (the default).")
@click.option("--execute", is_flag=True, help="Commit the plan.")
@click.option("--export", is_flag=True, help="Print the plan as CSV lines --from-file reads back.")
@friendly_errors
def reset_offsets(
    bootstrap_server: str | None,
    output: str,
    group_id: str,
    topics: tuple[str, ...],
    all_topics: bool,
    to_earliest: bool,
    to_latest: bool,
    to_offset: int | None,
    to_datetime: str | None,
    by_duration: str | None,
    from_file: Any,
    shift_by: int | None,
    dry_run: bool,
    execute: bool,
    export: bool,
) -> None:
    """Plan (and with --execute commit) new offsets for a group without active members."""
    if dry_run and execute:
        raise click.UsageError("give --dry-run or --execute, not both")
    if from_file is not None:
        if topics or all_topics:
            raise click.UsageError("--from-file names its partitions: drop --topic/--all-topics")
    elif bool(topics) == all_topics:
        raise click.UsageError("give --topic (repeatable) or --all-topics")
    if export and output != "table":
        raise click.UsageError("--export prints CSV: drop --output")
    spec = reset_spec(
        to_earliest=to_earliest,
        to_latest=to_latest,
        to_offset=to_offset,
        to_datetime=to_datetime,
        shift_by=shift_by,
        by_duration=by_duration,
        from_file=None if from_file is None else from_file.read(),
    )
    with _admin(bootstrap_server) as admin:
        plan = admin.plan_consumer_group_offsets_reset(
            group_id, spec, topics=list(topics) or None, all_topics=all_topics
        )
        if execute:
            admin.reset_consumer_group_offsets(group_id, plan)
    if export:
        click.echo(export_csv(plan), nl=False)
    else:
        emit(output, plan_json(group_id, plan, execute), plan_rows(group_id, plan), PLAN_HEADERS)
    if not plan:
        click.echo(f"Nothing to reset: group '{group_id}' has no offsets in that scope.", err=True)
    elif not execute:
        click.echo(DRY_RUN_NOTE, err=True)
