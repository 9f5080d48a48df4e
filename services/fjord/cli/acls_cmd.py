"""``fjord acls``: Kafka's kafka-acls.sh over the controller's CreateAcls/DescribeAcls/
DeleteAcls, with its flags::

    fjord acls --add --allow-principal User:alice --operation Read --topic orders --group billing
    fjord acls --add --deny-principal User:bob --operation Write --topic pay \\
        --resource-pattern-type prefixed
    fjord acls --list [--topic orders] [--principal User:alice]
    fjord acls --remove --allow-principal User:alice --operation Read --topic orders
    fjord acls --add --allow-principal User:bob --consumer --topic orders --group billing

``--add`` makes one ACL per resource x principal x host x operation (operation default All,
host default ``*``), as kafka-acls.sh does; ``--remove`` deletes what those describe (only a
resource: every ACL on it); ``--list`` shows the ACLs of the named resources (default: all).
"""

from __future__ import annotations

from itertools import product

import click

from fjord.cli.client_common import (
    admin_client_config,
    bootstrap_option,
    emit,
    friendly_errors,
    output_option,
)
from fjord.client import AdminClient
from fjord.security.acls import (
    CLUSTER_RESOURCE_NAME,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclError,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)


def _resources(
    topics: tuple[str, ...], groups: tuple[str, ...], transactional_ids: tuple[str, ...],
    cluster: bool,
) -> list[tuple[ResourceType, str]]:
    out = [(ResourceType.TOPIC, t) for t in topics]
    out += [(ResourceType.GROUP, g) for g in groups]
    out += [(ResourceType.TRANSACTIONAL_ID, t) for t in transactional_ids]
    if cluster:
        out.append((ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME))
    return out


def _entries(
    allow: tuple[str, ...], deny: tuple[str, ...], allow_hosts: tuple[str, ...],
    deny_hosts: tuple[str, ...], operations: list[AclOperation],
) -> list[AccessControlEntry]:
    out = []
    for permission, principals, hosts in (
        (AclPermissionType.ALLOW, allow, allow_hosts or ("*",)),
        (AclPermissionType.DENY, deny, deny_hosts or ("*",)),
    ):
        for principal, host, op in product(principals, hosts, operations):
            out.append(AccessControlEntry(principal, host, op, permission))
    return out


def _print(bindings: list[AclBinding], output: str) -> None:
    if output == "json":
        emit(output, [b.to_dict() for b in bindings], [], [])
        return
    by_pattern: dict[ResourcePattern, list[AccessControlEntry]] = {}
    for b in bindings:
        by_pattern.setdefault(b.pattern, []).append(b.entry)
    for pattern, entries in by_pattern.items():
        click.echo(f"Current ACLs for resource `{pattern}`:")
        for entry in entries:
            click.echo(f" \t{entry}")
        click.echo()


@click.command("acls")
@click.option("--add", "action", flag_value="add", help="Add ACLs.")
@click.option("--remove", "action", flag_value="remove", help="Remove ACLs.")
@click.option("--list", "action", flag_value="list", help="List ACLs.")
@click.option("--allow-principal", "allow", multiple=True, metavar="User:NAME",
              help="Principal the ACLs allow (User:* for everyone); repeatable.")
@click.option("--deny-principal", "deny", multiple=True, metavar="User:NAME",
              help="Principal the ACLs deny; repeatable.")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="HOST",
              help="Host the allow ACLs apply to (default *); repeatable.")
@click.option("--deny-host", "deny_hosts", multiple=True, metavar="HOST",
              help="Host the deny ACLs apply to (default *); repeatable.")
@click.option("--operation", "operations", multiple=True, metavar="OP",
              help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, "
              "DescribeConfigs, AlterConfigs, IdempotentWrite or All (default: All); repeatable.")
@click.option("--topic", "topics", multiple=True, metavar="NAME", help="Topic; repeatable.")
@click.option("--group", "groups", multiple=True, metavar="NAME",
              help="Consumer group; repeatable.")
@click.option("--transactional-id", "transactional_ids", multiple=True, metavar="ID",
              help="Transactional id; repeatable.")
@click.option("--cluster", is_flag=True, help="The cluster resource.")
@click.option("--resource-pattern-type", "pattern_type", default=None,
              type=click.Choice(["literal", "prefixed", "any", "match"], case_sensitive=False),
              help="literal (default for --add/--remove), prefixed; --list and --remove also "
              "take any and match (every pattern covering the named resource).")
@click.option("--principal", "principal", default=None, metavar="User:NAME",
              help="--list: only the ACLs of this principal.")
@click.option("--producer", is_flag=True,
              help="Shortcut: Write, Describe and Create on the --topic(s) (with --idempotent "
              "also IdempotentWrite on the cluster), as kafka-acls.sh --producer.")
@click.option("--consumer", is_flag=True,
              help="Shortcut: Read and Describe on the --topic(s) and Read on the --group(s), "
              "as kafka-acls.sh --consumer.")
@click.option("--idempotent", is_flag=True, help="With --producer: IdempotentWrite too.")
@click.option("--force", is_flag=True, hidden=True, help="Accepted for kafka-acls.sh scripts.")
@bootstrap_option
@output_option
@friendly_errors
def acls(
    action: str | None, allow: tuple[str, ...], deny: tuple[str, ...],
    allow_hosts: tuple[str, ...], deny_hosts: tuple[str, ...], operations: tuple[str, ...],
    topics: tuple[str, ...], groups: tuple[str, ...], transactional_ids: tuple[str, ...],
    cluster: bool, pattern_type: str | None, principal: str | None, producer: bool,
    consumer: bool, idempotent: bool, force: bool, bootstrap_server: str | None, output: str,
) -> None:
    """Add, list or remove ACLs (Kafka's kafka-acls.sh). ``--force`` is accepted and
    ignored: nothing is ever asked."""
    del force
    if action is None:
        raise click.UsageError("give one of --add, --remove, --list")
    if (producer or consumer) and action == "list":
        raise click.UsageError("--producer and --consumer go with --add or --remove")
    if idempotent and not producer:
        raise click.UsageError("--idempotent goes with --producer")
    resources = _resources(topics, groups, transactional_ids, cluster)
    try:
        ops = [AclOperation.parse(o) for o in operations] or [AclOperation.ALL]
        pattern = PatternType.parse(pattern_type) if pattern_type else None
        with AdminClient(admin_client_config(bootstrap_server)) as admin:
            if producer or consumer:
                _shortcuts(admin, action, topics, groups, producer, consumer, idempotent,
                           allow, deny, allow_hosts, deny_hosts, pattern, output)
            elif action == "add":
                _add(admin, resources, allow, deny, allow_hosts, deny_hosts, ops, pattern, output)
            elif action == "remove":
                _remove(admin, resources, allow, deny, allow_hosts, deny_hosts, operations,
                        ops, pattern, output)
            else:
                _list(admin, resources, pattern, principal, output)
    except AclError as exc:
        raise click.UsageError(str(exc)) from exc


def _add(
    admin: AdminClient, resources: list[tuple[ResourceType, str]], allow: tuple[str, ...],
    deny: tuple[str, ...], allow_hosts: tuple[str, ...], deny_hosts: tuple[str, ...],
    ops: list[AclOperation], pattern: PatternType | None, output: str,
) -> None:
    if not resources:
        raise click.UsageError("--add needs a resource: --topic, --group, --cluster or "
                               "--transactional-id")
    if not allow and not deny:
        raise click.UsageError("--add needs --allow-principal or --deny-principal")
    pattern = pattern or PatternType.LITERAL
    if pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise click.UsageError("--add takes --resource-pattern-type literal or prefixed")
    entries = _entries(allow, deny, allow_hosts, deny_hosts, ops)
    bindings = [
        AclBinding(ResourcePattern(kind, name, pattern), entry)
        for (kind, name), entry in product(resources, entries)
    ]
    admin.create_acls(bindings)
    if output != "json":
        click.echo(f"Added {len(bindings)} ACLs.")
    _print(sorted(bindings), output)


def _remove(
    admin: AdminClient, resources: list[tuple[ResourceType, str]], allow: tuple[str, ...],
    deny: tuple[str, ...], allow_hosts: tuple[str, ...], deny_hosts: tuple[str, ...],
    operations: tuple[str, ...], ops: list[AclOperation], pattern: PatternType | None,
    output: str,
) -> None:
    if not resources:
        raise click.UsageError("--remove needs a resource: --topic, --group, --cluster or "
                               "--transactional-id")
    pattern = pattern or PatternType.LITERAL
    filters: list[AclBindingFilter] = []
    for kind, name in resources:
        if not allow and not deny:  # only a resource: every ACL on it
            filters.append(AclBindingFilter(kind, name, pattern))
            continue
        for entry in _entries(allow, deny, allow_hosts, deny_hosts, ops):
            filters.append(AclBindingFilter(
                kind, name, pattern, entry.principal,
                entry.host if (allow_hosts or deny_hosts) else None,
                entry.operation if operations else AclOperation.ANY, entry.permission,
            ))
    deleted = sorted({b for found in admin.delete_acls(filters) for b in found})
    if output != "json":
        click.echo(f"Removed {len(deleted)} ACLs.")
    _print(deleted, output)


def _list(
    admin: AdminClient, resources: list[tuple[ResourceType, str]],
    pattern: PatternType | None, principal: str | None, output: str,
) -> None:
    filters = [
        AclBindingFilter(kind, name, pattern or PatternType.ANY, principal)
        for kind, name in resources
    ] or [AclBindingFilter(principal=principal)]
    found: set[AclBinding] = set()
    for selector in filters:
        found.update(admin.describe_acls(selector))
    _print(sorted(found), output)



def _shortcuts(
    admin: AdminClient, action: str, topics: tuple[str, ...], groups: tuple[str, ...],
    producer: bool, consumer: bool, idempotent: bool, allow: tuple[str, ...],
    deny: tuple[str, ...], allow_hosts: tuple[str, ...], deny_hosts: tuple[str, ...],
    pattern: PatternType | None, output: str,
) -> None:
    """kafka-acls.sh's --producer / --consumer: the ACLs a producer or consumer needs."""
    if not topics:
        raise click.UsageError("--producer and --consumer need --topic")
    if consumer and not groups:
        raise click.UsageError("--consumer needs --group")
    pattern = pattern or PatternType.LITERAL
    wanted: list[tuple[ResourceType, str, AclOperation]] = []
    if producer:
        wanted += [(ResourceType.TOPIC, t, op) for t in topics
                   for op in (AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.CREATE)]
        if idempotent:
            wanted.append((ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME,
                           AclOperation.IDEMPOTENT_WRITE))
    if consumer:
        wanted += [(ResourceType.TOPIC, t, op) for t in topics
                   for op in (AclOperation.READ, AclOperation.DESCRIBE)]
        wanted += [(ResourceType.GROUP, g, AclOperation.READ) for g in groups]
    bindings = []
    for kind, name, op in dict.fromkeys(wanted):
        kind_pattern = PatternType.LITERAL if kind is ResourceType.CLUSTER else pattern
        for entry in _entries(allow, deny, allow_hosts, deny_hosts, [op]):
            bindings.append(AclBinding(ResourcePattern(kind, name, kind_pattern), entry))
    if not bindings:
        raise click.UsageError(f"--{action} needs --allow-principal or --deny-principal")
    if action == "add":
        admin.create_acls(bindings)
        if output != "json":
            click.echo(f"Added {len(bindings)} ACLs.")
        _print(sorted(bindings), output)
        return
    filters = [AclBindingFilter(b.pattern.resource_type, b.pattern.name, b.pattern.pattern_type,
                                b.entry.principal, b.entry.host, b.entry.operation,
                                b.entry.permission) for b in bindings]
    deleted = sorted({b for found in admin.delete_acls(filters) for b in found})
    if output != "json":
        click.echo(f"Removed {len(deleted)} ACLs.")
    _print(deleted, output)
