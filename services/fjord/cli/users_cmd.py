"""``fjord users``: SCRAM users with the flags of Kafka's ``kafka-configs.sh --entity-type
users``, over the controller's Alter/DescribeUserScramCredentials::

    fjord users --alter --entity-name alice \\
        --add-config 'SCRAM-SHA-512=[iterations=8192,password=alice-secret]'
    fjord users --alter --entity-name alice --delete-config SCRAM-SHA-512
    fjord users --describe [--entity-name alice]

The password is salted on this machine; only salt, StoredKey and ServerKey reach the cluster.
"""

from __future__ import annotations

import click

from fjord.cli.client_common import (
    admin_client_config,
    bootstrap_option,
    emit,
    friendly_errors,
    output_option,
)
from fjord.client import AdminClient
from fjord.security.scram import (
    DEFAULT_ITERATIONS,
    ScramCredentialError,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
    check_mechanism,
)


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside ``[...]`` (kafka-configs.sh's grouping)."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise ScramCredentialError(f"unbalanced [ ] in {text!r}")
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse_scram_add_config(text: str) -> list[tuple[str, str, int]]:
    """``SCRAM-SHA-512=[iterations=8192,password=pw],SCRAM-SHA-256=pw`` to
    [(mechanism, password, iterations)]. Typed errors name what is wrong."""
    out = []
    for item in _split_top_level(text):
        name, sep, value = item.partition("=")
        if not sep:
            raise ScramCredentialError(f"expected MECHANISM=[password=...], got {item!r}")
        mechanism = check_mechanism(name)
        iterations, password = DEFAULT_ITERATIONS, None
        if value.startswith("[") and value.endswith("]"):
            for field in value[1:-1].split(","):
                key, eq, val = field.partition("=")
                key = key.strip()
                if not eq or key not in ("password", "iterations"):
                    raise ScramCredentialError(
                        f"{mechanism}: expected password=... or iterations=N, got {field!r}"
                    )
                if key == "password":
                    password = val
                else:
                    try:
                        iterations = int(val)
                    except ValueError:
                        raise ScramCredentialError(
                            f"{mechanism}: iterations must be a number, got {val!r}"
                        ) from None
        else:
            password = value
        if not password:
            raise ScramCredentialError(f"{mechanism}: a password is required")
        out.append((mechanism, password, iterations))
    if not out:
        raise ScramCredentialError("--add-config names no SCRAM credential")
    return out


@click.command("users")
@click.option("--alter", "action", flag_value="alter", help="Add or delete credentials.")
@click.option("--describe", "action", flag_value="describe", help="Show users' mechanisms.")
@click.option("--entity-name", "users", multiple=True, metavar="USER",
              help="The user (repeatable for --describe; default there: every user).")
@click.option("--entity-type", type=click.Choice(["users"]), default="users", hidden=True,
              help="Accepted for kafka-configs.sh scripts; always users.")
@click.option("--add-config", "add_config", default=None,
              metavar="'SCRAM-SHA-512=[iterations=N,password=PW]'",
              help="Set credentials (comma-separated, one per mechanism).")
@click.option("--delete-config", "delete_config", default=None,
              metavar="SCRAM-SHA-512[,SCRAM-SHA-256]", help="Delete credentials.")
@bootstrap_option
@output_option
@friendly_errors
def users(
    action: str | None, users: tuple[str, ...], entity_type: str, add_config: str | None,
    delete_config: str | None, bootstrap_server: str | None, output: str,
) -> None:
    """Add, delete or describe SCRAM credentials (kafka-configs.sh --entity-type users)."""
    del entity_type
    if action is None:
        raise click.UsageError("give --alter or --describe")
    try:
        with AdminClient(admin_client_config(bootstrap_server)) as admin:
            if action == "describe":
                found = admin.describe_user_scram_credentials(list(users) or None)
                if output == "json":
                    emit(output, [
                        {"user": user, "credentials": [
                            {"mechanism": c.mechanism, "iterations": c.iterations}
                            for c in infos]}
                        for user, infos in found.items()
                    ], [], [])
                    return
                for user, infos in found.items():
                    configs = ",".join(f"{c.mechanism}=iterations={c.iterations}" for c in infos)
                    click.echo(f"SCRAM credential configs for user-principal '{user}' are "
                               f"{configs}")
                return
            if len(users) != 1:
                raise click.UsageError("--alter needs exactly one --entity-name")
            if not add_config and not delete_config:
                raise click.UsageError("--alter needs --add-config or --delete-config")
            user = users[0]
            alterations: list[UserScramCredentialUpsertion | UserScramCredentialDeletion] = [
                UserScramCredentialUpsertion(user, mechanism, password, iterations)
                for mechanism, password, iterations in parse_scram_add_config(add_config or "")
            ] if add_config else []
            alterations += [
                UserScramCredentialDeletion(user, check_mechanism(m))
                for m in (delete_config or "").split(",") if m.strip()
            ]
            admin.alter_user_scram_credentials(alterations)
            click.echo(f"Completed updating config for user {user}.")
    except ScramCredentialError as exc:
        raise click.UsageError(str(exc)) from exc
