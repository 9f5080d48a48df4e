"""``fjord configs``: Kafka's kafka-configs.sh (``--describe [--all]``, ``--alter --add-config
k=v,... --delete-config k,...``) with each value's source, as rpk and Kafka name them.

Entity types: ``topics`` (describe and alter, through the AdminClient's DescribeConfigs and
incremental AlterConfigs); ``brokers`` (describe: each broker asked for its own configs; alter:
dynamic broker configs, one broker's with ``--entity-name N`` or the cluster-wide default with
``--entity-default``, stored by the controller and applied by the brokers without a restart;
read-only keys refused with Kafka's error); ``groups`` is refused saying why (Fjord has no
per-group configs). See docs/configuration.md and docs/clients.md, "fjord configs".
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
    "DYNAMIC_BROKER": "DYNAMIC_BROKER_CONFIG",
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
@click.option(
    "--entity-default",
    "entity_default",
    is_flag=True,
    help="With --entity-type brokers: the cluster-wide default (dynamic) instead of one broker.",
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
    entity_default: bool,
    mode: str | None,
    show_all: bool,
    add_config: tuple[str, ...],
    delete_config: tuple[str, ...],
) -> None:
    """Describe or change configs, like kafka-configs.sh: --describe [--all] shows each value
    and its source (DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG,
    STATIC_BROKER_CONFIG, DEFAULT_CONFIG) for topics or brokers; --alter --add-config
    k=v,... --delete-config k,... changes a topic's configs, or a broker's dynamic configs
    (--entity-name N, or --entity-default for the cluster-wide default)."""
    if mode is None:
        raise click.UsageError("give --describe or --alter")
    if entity_type == "groups":
        raise click.ClickException(GROUPS_REFUSAL)
    if entity_default and (entity_type != "brokers" or entity_name is not None):
        raise click.UsageError("--entity-default goes with --entity-type brokers and no "
                               "--entity-name")
    if mode == "alter":
        if entity_type == "brokers":
            _alter_broker(bootstrap_server, entity_name, entity_default, add_config,
                          delete_config)
            return
        _alter_topic(bootstrap_server, entity_name, add_config, delete_config)
        return
    if add_config or delete_config:
        raise click.UsageError("--add-config and --delete-config need --alter")
    if entity_type == "brokers":
        if entity_default:
            with AdminClient(admin_client_config(bootstrap_server)) as admin:
                defaults = admin.describe_broker_default_configs()
            _print_configs("default", {"default": defaults}, True, output)
            return
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
        title = (f"{what} configs for {kind} {name} are:" if kind != "default"
                 else "Default configs for brokers in the cluster are:")
        click.echo(title + ("" if entries else " (none)"))
        emit(output, None, [(e.name, e.value, KAFKA_SOURCE_NAMES.get(e.source, e.source))
                            for e in entries], ["KEY", "VALUE", "SOURCE"])


def _changes(
    add_config: tuple[str, ...], delete_config: tuple[str, ...]
) -> dict[str, str | None]:
    changes: dict[str, str | None] = dict(parse_add_config(add_config))
    for text in delete_config:
        changes.update(dict.fromkeys(split_config_list(text, "--delete-config")))
    if not changes:
        raise click.UsageError("--alter needs --add-config or --delete-config")
    return changes


def _alter_broker(
    bootstrap_server: str | None,
    name: str | None,
    default: bool,
    add_config: tuple[str, ...],
    delete_config: tuple[str, ...],
) -> None:
    """Dynamic broker configs: one broker's or the cluster-wide default."""
    if not default and name is None:
        raise click.UsageError("--alter --entity-type brokers needs --entity-name ID or "
                               "--entity-default")
    broker: int | None = None
    if not default:
        try:
            broker = int(str(name))
        except ValueError:
            raise click.BadParameter(f"a broker id is a number, got {name!r}",
                                     param_hint="--entity-name") from None
    changes = _changes(add_config, delete_config)
    with AdminClient(admin_client_config(bootstrap_server)) as admin:
        admin.alter_broker_configs({broker: changes})
    what = "default broker" if broker is None else f"broker {broker}"
    click.echo(f"Completed updating config for {what}.")


def _alter_topic(
    bootstrap_server: str | None,
    name: str | None,
    add_config: tuple[str, ...],
    delete_config: tuple[str, ...],
) -> None:
    if not name:
        raise click.UsageError("--alter needs --entity-name")
    changes = _changes(add_config, delete_config)
    with AdminClient(admin_client_config(bootstrap_server)) as admin:
        admin.alter_configs({name: changes})
    click.echo(f"Completed updating config for topic {name}.")
