"""``fjord configs``: Kafka's kafka-configs.sh (``--describe [--all]``, ``--alter --add-config
k=v,... --delete-config k,...``) with each value's source, as rpk and Kafka name them.

Entity types: ``topics`` (describe and alter, through the AdminClient's DescribeConfigs and
incremental AlterConfigs); ``brokers`` (describe only, each broker asked for its own configs:
broker configs are static in Fjord, so --alter is refused saying so); ``groups`` is refused
saying why (Fjord has no per-group configs). See docs/clients.md, "fjord configs".
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


#: Why ``--entity-type groups`` is refused (Kafka 4's group configs have no Fjord counterpart).
GROUPS_REFUSAL = (
    "INVALID_REQUEST: --entity-type groups: Fjord has no per-group configs. Kafka's group "
    "configs (consumer.session.timeout.ms, consumer.heartbeat.interval.ms, share.*) belong to "
    "its new consumer rebalance protocol (KIP-848) and share groups, which Fjord does not "
    "implement; in the classic protocol Fjord speaks, each consumer sends its own "
    "session.timeout.ms (a consumer property), bounded by the coordinators' "
    "group.min.session.timeout.ms and group.max.session.timeout.ms, which are set when they "
    "start (`fjord coordinator --config`, `fjord local up`)"
)

#: Why ``--alter --entity-type brokers`` is refused.
BROKERS_ALTER_REFUSAL = (
    "INVALID_REQUEST: broker configs are static in Fjord: a broker reads them once at start "
    "(`fjord broker --config k=v`, cluster-wide defaults with `fjord local up --config k=v`); "
    "topic configs change at run time (--alter --entity-type topics)"
)


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
@click.option(
    "--entity-name",
    default=None,
    help="Its name: a topic, or a broker id (all topics or brokers when left out).",
)
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
    and its source (DYNAMIC_TOPIC_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG,
    DEFAULT_CONFIG) for topics or brokers; --alter --add-config k=v,... --delete-config k,...
    changes a topic's configs (broker configs are static)."""
    if mode is None:
        raise click.UsageError("give --describe or --alter")
    if entity_type == "groups":
        raise click.ClickException(GROUPS_REFUSAL)
    if mode == "alter":
        if entity_type == "brokers":
            raise click.ClickException(BROKERS_ALTER_REFUSAL)
        _alter_topic(bootstrap_server, entity_name, add_config, delete_config)
        return
    if add_config or delete_config:
        raise click.UsageError("--add-config and --delete-config need --alter")
    if entity_type == "brokers":
        _describe_brokers(bootstrap_server, entity_name, show_all, output)
        return
    with AdminClient(admin_client_config(bootstrap_server)) as admin:
        names = [entity_name] if entity_name else admin.list_topics()
        described = admin.describe_configs(names) if names else {}
    shown = {
        name: [e for e in entries if show_all or e.source == "TOPIC"]
        for name, entries in sorted(described.items())
    }
    _print_configs("topic", shown, show_all, output)


def _describe_brokers(
    bootstrap_server: str | None, entity_name: str | None, show_all: bool, output: str
) -> None:
    """kafka-configs.sh --describe for brokers: without --all the values set for the broker
    (its --config, the cluster's defaults), with --all every key and its default too."""
    ids: list[int] | None = None
    if entity_name is not None:
        try:
            ids = [int(entity_name)]
        except ValueError:
            raise click.BadParameter(
                f"a broker id is a number, got {entity_name!r}", param_hint="--entity-name"
            ) from None
    with AdminClient(admin_client_config(bootstrap_server)) as admin:
        described = admin.describe_broker_configs(ids)
    shown = {
        str(broker_id): [e for e in entries if show_all or e.source != "DEFAULT"]
        for broker_id, entries in sorted(described.items())
    }
    _print_configs("broker", shown, show_all, output)


def _print_configs(
    kind: str, shown: dict[str, list[ConfigEntry]], show_all: bool, output: str
) -> None:
    if output == "json":
        emit(output, {name: [entry_json(e) for e in entries] for name, entries in shown.items()},
             [], [])  # fmt: skip
        return
    for i, (name, entries) in enumerate(shown.items()):
        if i:
            click.echo("")
        what = "All" if show_all else ("Dynamic" if kind == "topic" else "Set")
        click.echo(f"{what} configs for {kind} {name} are:" + ("" if entries else " (none)"))
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
