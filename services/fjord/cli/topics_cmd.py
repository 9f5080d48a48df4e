"""``fjord topics create|list|describe|delete|alter|reassign|elect-leaders`` (Kafka's
kafka-topics, kafka-reassign-partitions and kafka-leader-election flags)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from fjord.cli.client_common import (
    admin_client_config,
    bootstrap_option,
    emit,
    friendly_errors,
    output_option,
    parse_pairs,
)
from fjord.client import AdminClient, LogDirPartition, NewTopic, TopicDescription, TopicPartition
from fjord.errors import ErrorCode, FjordError, InvalidReplicaAssignmentError


def _admin(bootstrap_server: str | None) -> AdminClient:
    return AdminClient(admin_client_config(bootstrap_server))


def _replication_factor(t: TopicDescription) -> int:
    return max((len(p.replicas) for p in t.partitions), default=0)


#: In the Racks column: a replica on a live broker without a rack, and one on a broker that is
#: not live now (its rack is not known).
NO_RACK = "-"
UNKNOWN_RACK = "?"


def replica_racks(replicas: Sequence[int], racks: Mapping[int, str | None]) -> list[str]:
    """The rack of each replica, in replica order (``racks``: the live brokers' racks)."""
    return [
        (racks[b] or NO_RACK) if b in racks else UNKNOWN_RACK for b in replicas
    ]


#: Per partition, per broker id: that replica as its broker's DescribeLogDirs reported it.
CleanerStates = Mapping[tuple[str, int], Mapping[int, LogDirPartition]]


def is_compacted(configs: Mapping[str, str]) -> bool:
    """Whether a topic's ``cleanup.policy`` (``compact``, ``compact,delete``, ``[delete,
    compact]``) includes compaction."""
    return "compact" in configs.get("cleanup.policy", "").lower()


def cleaner_states(admin: AdminClient, topics: Sequence[TopicDescription]) -> CleanerStates:
    """The log cleaner's state of every replica of ``topics``, asked of each broker hosting one
    (DescribeLogDirs). A broker that is down or does not answer is left out (its replicas show
    as unknown), so one dead broker does not fail the whole describe."""
    wanted = {t.name for t in topics}
    brokers = sorted({b for t in topics for p in t.partitions for b in p.replicas})
    out: dict[tuple[str, int], dict[int, LogDirPartition]] = {}
    for broker in brokers:
        try:
            (found,) = admin.describe_log_dirs([broker])
        except FjordError:
            continue
        for replica in found.partitions:
            if replica.topic in wanted and replica.compacted:
                out.setdefault((replica.topic, replica.partition), {})[broker] = replica
    return out


def _cleaner_json(
    t: TopicDescription, partition: int, leader: int, states: CleanerStates
) -> dict[str, Any]:
    replicas = states.get((t.name, partition), {})

    def one(r: LogDirPartition) -> dict[str, Any]:
        return {"dirty_ratio": r.cleaner_dirty_ratio,
                "first_dirty_offset": r.cleaner_first_dirty_offset}

    lead = replicas.get(leader)
    return {
        **(one(lead) if lead is not None else {"dirty_ratio": None, "first_dirty_offset": None}),
        "replicas": {str(b): one(r) for b, r in sorted(replicas.items())},
    }


def cleaner_columns(
    t: TopicDescription, partition: int, leader: int, states: CleanerStates
) -> tuple[str, str]:
    """DirtyRatio and CleanedBelow of the leader's replica ("?" when its broker did not
    answer)."""
    lead = states.get((t.name, partition), {}).get(leader)
    if lead is None:
        return "?", "?"
    return f"{lead.cleaner_dirty_ratio:.2f}", str(lead.cleaner_first_dirty_offset)


def topic_json(
    t: TopicDescription,
    configs: dict[str, str] | None = None,
    racks: Mapping[int, str | None] | None = None,
    cleaner: CleanerStates | None = None,
) -> dict[str, Any]:
    """``cleaner`` given (a compacted topic): each partition gets ``"cleaner"``: the leader's
    ``dirty_ratio`` and ``first_dirty_offset`` (offsets below it are compacted; null when its
    broker did not answer) and every answering replica's under ``"replicas"``."""
    data: dict[str, Any] = {
        "name": t.name,
        "topic_id": t.topic_id,
        "partition_count": len(t.partitions),
        "replication_factor": _replication_factor(t),
        "internal": t.internal,
        "partitions": [
            {
                "partition": p.partition,
                "leader": p.leader,
                "leader_epoch": p.leader_epoch,
                "replicas": list(p.replicas),
                "isr": list(p.isr),
                "offline_replicas": list(p.offline_replicas),
                **(
                    {"replica_racks": [
                        racks.get(b) if b in racks else None for b in p.replicas
                    ]}
                    if racks is not None else {}
                ),
                **(
                    {"cleaner": _cleaner_json(t, p.partition, p.leader, cleaner)}
                    if cleaner is not None else {}
                ),
            }
            for p in t.partitions
        ],
    }
    if configs is not None:
        data["configs"] = configs
    return data


@click.group("topics")
def topics() -> None:
    """Create, list, describe, alter and delete topics."""


@topics.command("create")
@bootstrap_option
@click.option("--topic", required=True, help="Name of the topic to create.")
@click.option("--partitions", type=int, default=-1, help="Partition count (default: cluster's).")
@click.option(
    "--replication-factor",
    type=int,
    default=-1,
    help="Replicas per partition (default: cluster).",
)
@click.option("--config", "configs", multiple=True, metavar="K=V", help="Topic config, repeatable.")
@click.option("--if-not-exists", is_flag=True, help="Succeed when the topic already exists.")
@friendly_errors
def create(
    bootstrap_server: str | None,
    topic: str,
    partitions: int,
    replication_factor: int,
    configs: tuple[str, ...],
    if_not_exists: bool,
) -> None:
    """Create a topic."""
    config = parse_pairs(configs, "--config")
    with _admin(bootstrap_server) as admin:
        try:
            admin.create_topics([NewTopic(topic, partitions, replication_factor, config)])
        except FjordError as exc:
            if not (if_not_exists and exc.code is ErrorCode.TOPIC_ALREADY_EXISTS):
                raise
            # Kafka's tool says nothing here; saying "Created" would be false.
            click.echo(f"Topic {topic} already exists; nothing changed.")
            return
    click.echo(f"Created topic {topic}.")


@topics.command("list")
@bootstrap_option
@output_option
@click.option(
    "--exclude-internal", is_flag=True, help="Leave out internal topics (__consumer_offsets)."
)
@friendly_errors
def list_(bootstrap_server: str | None, output: str, exclude_internal: bool) -> None:
    """List every topic (internal ones too, as Kafka's tool does, unless --exclude-internal)."""
    with _admin(bootstrap_server) as admin:
        described = admin.describe_topics(None)
    if exclude_internal:
        described = [t for t in described if not t.internal]
    emit(
        output,
        [{"name": t.name, "partitions": len(t.partitions)} for t in described],
        [(t.name, len(t.partitions), _replication_factor(t)) for t in described],
        ["Topic", "Partitions", "ReplicationFactor"],
    )


@topics.command("describe")
@bootstrap_option
@output_option
@click.option("--topic", "names", multiple=True, help="Topic to describe (default: all).")
@friendly_errors
def describe(bootstrap_server: str | None, output: str, names: tuple[str, ...]) -> None:
    """Partitions (leader, replicas, ISR, the racks of the replicas) and configs of topics; for
    a compacted topic also the log cleaner's state of each partition's leader replica: its
    dirty ratio at the cleaner's last look and the offset below which it is compacted (JSON:
    every replica's too)."""
    with _admin(bootstrap_server) as admin:
        described = admin.describe_topics(list(names) if names else None)
        configs = admin.describe_configs([t.name for t in described]) if described else {}
        racks = {b.id: b.rack or None for b in admin.describe_cluster().brokers}
        compacted = [
            t for t in described
            if is_compacted({e.name: e.value for e in configs.get(t.name, [])})
        ]
        cleaner = cleaner_states(admin, compacted) if compacted else {}
    compacted_names = {t.name for t in compacted}
    non_default = {
        name: {e.name: e.value for e in entries if not e.is_default}
        for name, entries in configs.items()
    }
    if output == "json":
        emit(output, [topic_json(t, non_default.get(t.name, {}), racks,
                                 cleaner if t.name in compacted_names else None)
                      for t in described],
             [], [])
        return
    for t in described:
        settings = ",".join(f"{k}={v}" for k, v in sorted(non_default.get(t.name, {}).items()))
        click.echo(
            f"Topic: {t.name}\tTopicId: {t.topic_id}\tPartitionCount: {len(t.partitions)}\t"
            f"ReplicationFactor: {_replication_factor(t)}\tConfigs: {settings}"
        )
        headers = ["Topic", "Partition", "Leader", "Replicas", "Isr", "Racks"]
        with_cleaner = t.name in compacted_names
        if with_cleaner:
            headers += ["DirtyRatio", "CleanedBelow"]
        emit(
            output,
            None,
            [
                (
                    t.name,
                    p.partition,
                    p.leader,
                    ",".join(map(str, p.replicas)),
                    ",".join(map(str, p.isr)),
                    ",".join(replica_racks(p.replicas, racks)),
                    *(cleaner_columns(t, p.partition, p.leader, cleaner) if with_cleaner
                      else ()),
                )
                for p in t.partitions
            ],
            headers,
        )


@topics.command("delete")
@bootstrap_option
@click.option("--topic", "names", multiple=True, required=True, help="Topic to delete.")
@click.option("--if-exists", is_flag=True, help="Succeed when the topic does not exist.")
@friendly_errors
def delete(bootstrap_server: str | None, names: tuple[str, ...], if_exists: bool) -> None:
    """Delete topics."""
    with _admin(bootstrap_server) as admin:
        results = admin.delete_topics(list(names), raise_on_error=False)
    for name, error in results.items():
        if error is not None and not (
            if_exists and error.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        ):
            raise error
        click.echo(f"Deleted topic {name}." if error is None else f"Topic {name} did not exist.")


@topics.command("alter")
@bootstrap_option
@click.option("--topic", required=True, help="Topic to change.")
@click.option("--partitions", type=int, default=None, help="New (larger) partition count.")
@click.option("--config", "configs", multiple=True, metavar="K=V", help="Set a config.")
@click.option("--delete-config", "deleted", multiple=True, metavar="K", help="Reset a config.")
@click.option(
    "--replication-factor",
    type=int,
    default=None,
    help="New replication factor (a reassignment: fewest moves, balanced over live brokers).",
)
@click.option(
    "--wait",
    "wait_s",
    type=float,
    default=None,
    metavar="SECONDS",
    help="With --replication-factor: wait up to this long for the reassignment to complete.",
)
@friendly_errors
def alter(
    bootstrap_server: str | None,
    topic: str,
    partitions: int | None,
    configs: tuple[str, ...],
    deleted: tuple[str, ...],
    replication_factor: int | None,
    wait_s: float | None,
) -> None:
    """Grow a topic's partitions, change its configs and/or its replication factor."""
    changes: dict[str, str | None] = dict(parse_pairs(configs, "--config"))
    changes.update({key: None for key in deleted})
    if partitions is None and not changes and replication_factor is None:
        raise click.ClickException(
            "nothing to alter: give --partitions, --config, --delete-config or "
            "--replication-factor"
        )
    with _admin(bootstrap_server) as admin:
        if replication_factor is not None:
            plan = admin.alter_replication_factor(topic, replication_factor)
            for (_, partition), replicas in sorted(plan.items()):
                click.echo(f"Reassigning {topic}-{partition} to replicas "
                           f"{','.join(map(str, replicas))}.")
            if not plan:
                click.echo(f"Topic {topic} already has replication factor {replication_factor}.")
            elif wait_s is not None:
                _wait_reassignments(admin, set(plan), wait_s)
                click.echo(f"Topic {topic} now has replication factor {replication_factor}.")
        if partitions is not None:
            admin.create_partitions({topic: partitions})
            click.echo(f"Topic {topic} now has {partitions} partitions.")
        if changes:
            admin.alter_configs({topic: changes})
            click.echo(f"Updated configs of topic {topic}.")


def parse_reassignment_json(text: str) -> dict[TopicPartition, list[int]]:
    """kafka-reassign-partitions' file format: ``{"version": 1, "partitions": [{"topic": "t",
    "partition": 0, "replicas": [1, 2, 3]}, ...]}``. Raises InvalidReplicaAssignmentError
    naming what is wrong (a partition named twice included)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InvalidReplicaAssignmentError(f"reassignment file is not JSON: {exc}") from None
    entries = doc.get("partitions") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise InvalidReplicaAssignmentError(
            'reassignment file needs a non-empty "partitions" list'
        )
    out: dict[TopicPartition, list[int]] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise InvalidReplicaAssignmentError(f"partitions[{i}] is not an object")
        topic, partition, replicas = (
            entry.get("topic"), entry.get("partition"), entry.get("replicas")
        )
        if not isinstance(topic, str) or not topic:
            raise InvalidReplicaAssignmentError(f'partitions[{i}]: "topic" must be a string')
        if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
            raise InvalidReplicaAssignmentError(
                f'partitions[{i}]: "partition" must be a non-negative integer'
            )
        if not isinstance(replicas, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) for r in replicas
        ):
            raise InvalidReplicaAssignmentError(
                f'partitions[{i}]: "replicas" must be a list of broker ids'
            )
        if (topic, partition) in out:
            raise InvalidReplicaAssignmentError(f"{topic}-{partition} is listed twice")
        out[TopicPartition(topic, partition)] = list(replicas)
    return out


def _wait_reassignments(
    admin: AdminClient, partitions: set[TopicPartition], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        running = set(admin.list_partition_reassignments(sorted(partitions)))
        if not running:
            return
        if time.monotonic() >= deadline:
            raise click.ClickException(
                "reassignment still in progress after "
                f"{timeout_s:g} s for {', '.join(f'{t}-{p}' for t, p in sorted(running))}"
            )
        time.sleep(0.2)  # polling an admin API; bounded by the deadline above


@topics.command("reassign")
@bootstrap_option
@output_option
@click.option(
    "--reassignment-json-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help='Kafka\'s format: {"version":1,"partitions":[{"topic","partition","replicas"}]}.',
)
@click.option("--topic", default=None, help="One partition's topic (instead of a file).")
@click.option("--partition", type=int, default=None, help="One partition (with --topic).")
@click.option("--replicas", default=None, metavar="1,2,3", help="Its new replicas, leader first.")
@click.option("--execute", "mode", flag_value="execute", help="Start the reassignment.")
@click.option("--verify", "mode", flag_value="verify", help="Report whether it has completed.")
@click.option("--cancel", "mode", flag_value="cancel", help="Cancel a running reassignment.")
@click.option(
    "--wait", "wait_s", type=float, default=None, metavar="SECONDS",
    help="With --execute: wait up to this long for completion.",
)
@friendly_errors
def reassign(
    bootstrap_server: str | None,
    output: str,
    reassignment_json_file: Path | None,
    topic: str | None,
    partition: int | None,
    replicas: str | None,
    mode: str | None,
    wait_s: float | None,
) -> None:
    """Move partitions to other brokers (kafka-reassign-partitions)."""
    if mode is None:
        raise click.UsageError("give one of --execute, --verify or --cancel")
    if reassignment_json_file is not None:
        if topic is not None or partition is not None or replicas is not None:
            raise click.UsageError(
                "give either --reassignment-json-file or --topic/--partition/--replicas"
            )
        plan = parse_reassignment_json(reassignment_json_file.read_text())
    else:
        if topic is None or partition is None or (replicas is None and mode != "cancel"):
            raise click.UsageError(
                "give --reassignment-json-file, or --topic, --partition and --replicas"
            )
        try:
            target = [int(b) for b in (replicas or "").split(",") if b.strip()]
        except ValueError:
            raise click.BadParameter(
                f"expected broker ids like 1,2,3, got {replicas!r}", param_hint="--replicas"
            ) from None
        plan = {TopicPartition(topic, partition): target}
    with _admin(bootstrap_server) as admin:
        if mode == "execute":
            admin.alter_partition_reassignments(dict(plan))
            for (t, p), target in sorted(plan.items()):
                click.echo(f"Started reassignment of {t}-{p} to {','.join(map(str, target))}.")
            if wait_s is not None:
                _wait_reassignments(admin, set(plan), wait_s)
                click.echo("Reassignment complete.")
            return
        if mode == "cancel":
            admin.alter_partition_reassignments(dict.fromkeys(plan))
            for t, p in sorted(plan):
                click.echo(f"Cancelled reassignment of {t}-{p}.")
            return
        running = admin.list_partition_reassignments(sorted(plan))
        described = {
            (d.name, info.partition): info
            for d in admin.describe_topics(sorted({t for t, _ in plan}))
            for info in d.partitions
        }
    rows = []
    for key, target in sorted(plan.items()):
        info = described.get(key)
        if key in running:
            status = "in progress"
        elif info is None:
            status = "unknown partition"
        elif list(info.replicas) == target:
            status = "complete"
        else:
            status = "different replicas"
        current = list(info.replicas) if info is not None else []
        rows.append((key[0], key[1], ",".join(map(str, target)),
                     ",".join(map(str, current)), status))
    emit(
        output,
        [{"topic": r[0], "partition": r[1], "target": plan[TopicPartition(r[0], r[1])],
          "replicas": described[(r[0], r[1])].replicas if (r[0], r[1]) in described else [],
          "status": r[4]} for r in rows],
        rows,
        ["Topic", "Partition", "Target", "Replicas", "Status"],
    )
    if any(r[4] != "complete" for r in rows):
        raise click.exceptions.Exit(1)


@topics.command("elect-leaders")
@bootstrap_option
@click.option(
    "--election-type",
    type=click.Choice(["preferred", "unclean"], case_sensitive=False),
    default="preferred",
    show_default=True,
    help="preferred: first replica leads again; unclean: any live replica leads (data loss).",
)
@click.option("--topic", default=None, help="Only this topic (with --partition: one partition).")
@click.option("--partition", type=int, default=None, help="Partition of --topic.")
@friendly_errors
def elect_leaders(
    bootstrap_server: str | None, election_type: str, topic: str | None, partition: int | None
) -> None:
    """Run a leader election (kafka-leader-election)."""
    if partition is not None and topic is None:
        raise click.UsageError("--partition needs --topic")
    with _admin(bootstrap_server) as admin:
        partitions: list[TopicPartition] | None = None
        if topic is not None:
            if partition is not None:
                partitions = [TopicPartition(topic, partition)]
            else:
                (described,) = admin.describe_topics([topic])
                partitions = [TopicPartition(topic, p.partition) for p in described.partitions]
        results = admin.elect_leaders(election_type.lower(), partitions, raise_on_error=False)
    failed = False
    for (t, p), error in sorted(results.items()):
        if error is None:
            click.echo(f"Elected a new leader for {t}-{p}.")
        elif error.code is ErrorCode.ELECTION_NOT_NEEDED:
            click.echo(f"{t}-{p}: election not needed.")
        else:
            failed = True
            click.echo(f"{t}-{p}: {error.code.name}: {error}", err=True)
    if not results:
        click.echo("No partition needed an election.")
    if failed:
        raise click.exceptions.Exit(1)
