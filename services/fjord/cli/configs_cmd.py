"""``fjord configs``: Kafka's kafka-configs.sh (``--describe [--all]``, ``--alter --add-config
k=v,... --delete-config k,...``) with each value's source, as rpk and Kafka name them.

Entity types: ``topics`` (describe and alter, through the AdminClient's DescribeConfigs and
incremental AlterConfigs). ``brokers`` and ``groups`` are refused with a message saying what
Fjord offers instead (see docs/clients.md, "fjord configs").
"""

from __future__ import annotations

from typing import Any

import click

from fjord.cli.client_common import (
    admin_client_config,
    bootstrap_option,
    emit,
    friendly_errors,
    output_option,
)
from fjord.client import AdminClient, ConfigEntry

#: Fjord's config sources under Kafka's names (DescribeConfigs' ConfigSource, as rpk prints).
KAFKA_SOURCE_NAMES = {
    "TOPIC": "DYNAMIC_TOPIC_CONFIG",
    "CLUSTER_DEFAULT": "DYNAMIC_DEFAULT_BROKER_CONFIG",
    "STATIC_BROKER": "STATIC_BROKER_CONFIG",
    "DEFAULT": "DEFAULT_CONFIG",
}


def split_config_list(text: str, option: str) -> list[str]:
    """Kafka's ``--add-config`` list: items separated by commas, except inside ``[...]``
    (``cleanup.policy=[delete,compact]``); blanks dropped."""
    items: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(depth - 1, 0)
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    items.append("".join(current))
    if depth:
        raise click.BadParameter(f"unclosed '[' in {text!r}", param_hint=option)
    return [item.strip() for item in items if item.strip()]


def parse_add_config(texts: tuple[str, ...]) -> dict[str, str]:
    """``k=v`` items of every ``--add-config``; ``[a,b]`` values lose their brackets."""
    out: dict[str, str] = {}
    for text in texts:
        for item in split_config_list(text, "--add-config"):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise click.BadParameter(f"expected k=v, got {item!r}", param_hint="--add-config")
            value = value.strip()
            if value.startswith("[") and value.endswith("]"):
                value = value[1:-1]
            out[key.strip()] = value
    return out


def entry_json(entry: ConfigEntry) -> dict[str, Any]:
    return {
        "name": entry.name,
        "value": entry.value,
        "source": KAFKA_SOURCE_NAMES.get(entry.source, entry.source),
        "is_default": entry.is_default,
    }


@click.command("configs")
@bootstrap_option
@output_option
@click.option(
    "--entity-type",
    type=click.Choice(["topics", "brokers", "groups"]),
    required=True,
    help="What the configs belong to.",
)
@click.option("--entity-name", default=None, help="Its name (topics: all when left out).")
@click.option("--describe", "mode", flag_value="describe", help="Show configs and their sources.")
@click.option("--alter", "mode", flag_value="alter", help="Change configs.")
@click.option("--all", "show_all", is_flag=True, help="With --describe: every key, defaults too.")
@click.option(
    "--add-config",
    "add_config",
    multiple=True,
    metavar="K=V,K=V",
    help="With --alter: set these (comma-separated; [a,b] for a list value).",
)
@click.option(
    "--delete-config",
    "delete_config",
    multiple=True,
    metavar="K,K",
    help="With --alter: reset these to the default (comma-separated).",
)
@friendly_errors
def configs(
    bootstrap_server: str | None,
    output: str,
    entity_type: str,
    entity_name: str | None,
    mode: str | None,
    show_all: bool,
    add_config: tuple[str, ...],
    delete_config: tuple[str, ...],
) -> None:
    """Describe or change configs, like kafka-configs.sh: --describe [--all] shows each value
    and its source (DYNAMIC_TOPIC_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, DEFAULT_CONFIG);
    --alter --add-config k=v,... --delete-config k,... changes a topic's configs."""
    if mode is None:
        raise click.UsageError("give --describe or --alter")
    if entity_type != "topics":
        raise click.ClickException(
            f"INVALID_REQUEST: --entity-type {entity_type} is not supported yet: Fjord has "
            + (
                "no per-group configs (the coordinators' group.* settings are set where they "
                "start: `fjord local up`, `fjord coordinator --config`)"
                if entity_type == "groups"
                else "no broker config API yet (brokers take --config at start; the cluster-wide "
                "topic defaults show as DYNAMIC_DEFAULT_BROKER_CONFIG in "
                "`fjord configs --describe --all --entity-type topics`)"
            )
        )
    if mode == "alter":
        _alter_topic(bootstrap_server, entity_name, add_config, delete_config)
        return
    if add_config or delete_config:
        raise click.UsageError("--add-config and --delete-config need --alter")
    with AdminClient(admin_client_config(bootstrap_server)) as admin:
        names = [entity_name] if entity_name else admin.list_topics()
        described = admin.describe_configs(names) if names else {}
    shown = {
        name: [e for e in entries if show_all or e.source == "TOPIC"]
        for name, entries in sorted(described.items())
    }
    if output == "json":
        emit(output, {name: [entry_json(e) for e in entries] for name, entries in shown.items()},
             [], [])
        return
    for i, (name, entries) in enumerate(shown.items()):
        if i:
            click.echo("")
        what = "All" if show_all else "Dynamic"
        click.echo(f"{what} configs for topic {name} are:" + ("" if entries else " (none)"))
        emit(output, None, [(e.name, e.value, KAFKA_SOURCE_NAMES.get(e.source, e.source))
                            for e in entries], ["KEY", "VALUE", "SOURCE"])


def _alter_topic(
    bootstrap_server: str | None,
    name: str | None,
    add_config: tuple[str, ...],
    delete_config: tuple[str, ...],
) -> None:
    if not name:
        raise click.UsageError("--alter needs --entity-name")
    changes: dict[str, str | None] = dict(parse_add_config(add_config))
    for text in delete_config:
        changes.update(dict.fromkeys(split_config_list(text, "--delete-config")))
    if not changes:
        raise click.UsageError("--alter needs --add-config or --delete-config")
    with AdminClient(admin_client_config(bootstrap_server)) as admin:
        admin.alter_configs({name: changes})
    click.echo(f"Completed updating config for topic {name}.")
