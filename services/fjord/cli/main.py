"""Entry point of the ``fjord`` command: one click group, subcommands in sibling modules.

Subcommands are imported when they are used, not all at start: a client command such as
``fjord topics list`` then loads the client, not the broker, controller, coordinator, Kafka
listener and operator code the service commands need (about half of every command's start-up
CPU time otherwise).
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from fjord import __version__
from fjord.cli.client_common import exit_quietly_on_broken_pipe

#: Every subcommand: name -> (module, attribute). tests/unit/test_client_cli.py checks that each
#: resolves to a command of that name.
COMMANDS: dict[str, tuple[str, str]] = {
    "acls": ("fjord.cli.acls_cmd", "acls"),
    "broker": ("fjord.cli.broker_cmd", "broker"),
    "cluster": ("fjord.cli.cluster_cmd", "cluster"),
    "configs": ("fjord.cli.configs_cmd", "configs"),
    "consume": ("fjord.cli.console_cmd", "consume"),
    "controller": ("fjord.cli.controller_cmd", "controller"),
    "coordinator": ("fjord.cli.coordinator_cmd", "coordinator"),
    "delete-records": ("fjord.cli.delete_records_cmd", "delete_records"),
    "demo": ("fjord.cli.demo", "demo"),
    "groups": ("fjord.cli.groups_cmd", "groups"),
    "local": ("fjord.cli.local_cmd", "local"),
    "log-dirs": ("fjord.cli.log_dirs_cmd", "log_dirs"),
    "operator": ("fjord.cli.operator_cmd", "operator"),
    "perf": ("fjord.cli.perf_cmd", "perf"),
    "produce": ("fjord.cli.console_cmd", "produce"),
    "quickstart": ("fjord.cli.quickstart_cmd", "quickstart"),
    "topics": ("fjord.cli.topics_cmd", "topics"),
    "transactions": ("fjord.cli.transactions_cmd", "transactions"),
    "users": ("fjord.cli.users_cmd", "users"),
}


class _FjordGroup(click.Group):
    """The top-level group: subcommands loaded on first use; a closed stdout pipe ends any
    command quietly (status 141)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attribute = COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            exit_quietly_on_broken_pipe()


@click.group(cls=_FjordGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fjord")
def cli() -> None:
    """Fjord: a distributed, replicated commit log with Kafka's model."""


def main() -> None:
    cli()
