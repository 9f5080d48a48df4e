"""``fjord topics create|list|describe|delete|alter`` (Kafka's kafka-topics flags)."""

from __future__ import annotations

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
from fjord.client import AdminClient, NewTopic, TopicDescription
from fjord.errors import ErrorCode, FjordError


def _admin(bootstrap_server: str | None) -> AdminClient:
    return AdminClient(admin_client_config(bootstrap_server))


def _replication_factor(t: TopicDescription) -> int:
    return max((len(p.replicas) for p in t.partitions), default=0)


def topic_json(t: TopicDescription, configs: dict[str, str] | None = None) -> dict[str, Any]:
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
    click.echo(f"Created topic {topic}.")


@topics.command("list")
@bootstrap_option
@output_option
@friendly_errors
def list_(bootstrap_server: str | None, output: str) -> None:
    """List every topic."""
    with _admin(bootstrap_server) as admin:
        described = admin.describe_topics(None)
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
    """Partitions (leader, replicas, ISR) and configs of topics."""
    with _admin(bootstrap_server) as admin:
        described = admin.describe_topics(list(names) if names else None)
        configs = admin.describe_configs([t.name for t in described]) if described else {}
    non_default = {
        name: {e.name: e.value for e in entries if not e.is_default}
        for name, entries in configs.items()
    }
    if output == "json":
        emit(output, [topic_json(t, non_default.get(t.name, {})) for t in described], [], [])
        return
    for t in described:
        settings = ",".join(f"{k}={v}" for k, v in sorted(non_default.get(t.name, {}).items()))
        click.echo(
            f"Topic: {t.name}\tTopicId: {t.topic_id}\tPartitionCount: {len(t.partitions)}\t"
            f"ReplicationFactor: {_replication_factor(t)}\tConfigs: {settings}"
        )
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
                )
                for p in t.partitions
            ],
            ["Topic", "Partition", "Leader", "Replicas", "Isr"],
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
@friendly_errors
def alter(
    bootstrap_server: str | None,
    topic: str,
    partitions: int | None,
    configs: tuple[str, ...],
    deleted: tuple[str, ...],
) -> None:
    """Grow a topic's partitions and/or change its configs."""
    changes: dict[str, str | None] = dict(parse_pairs(configs, "--config"))
    changes.update({key: None for key in deleted})
    if partitions is None and not changes:
        raise click.ClickException(
            "nothing to alter: give --partitions, --config or --delete-config"
        )
    with _admin(bootstrap_server) as admin:
        if partitions is not None:
            admin.create_partitions({topic: partitions})
            click.echo(f"Topic {topic} now has {partitions} partitions.")
        if changes:
            admin.alter_configs({topic: changes})
            click.echo(f"Updated configs of topic {topic}.")
