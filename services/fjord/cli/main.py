"""Entry point of the ``fjord`` command: one click group, subcommands in sibling modules."""

from __future__ import annotations

from typing import Any

import click

from fjord import __version__
from fjord.cli.broker_cmd import broker
from fjord.cli.client_common import exit_quietly_on_broken_pipe
from fjord.cli.cluster_cmd import cluster
from fjord.cli.configs_cmd import configs
from fjord.cli.console_cmd import consume, produce
from fjord.cli.controller_cmd import controller
from fjord.cli.coordinator_cmd import coordinator
from fjord.cli.demo import demo
from fjord.cli.groups_cmd import groups
from fjord.cli.local_cmd import local
from fjord.cli.log_dirs_cmd import log_dirs
from fjord.cli.operator_cmd import operator
from fjord.cli.perf_cmd import perf
from fjord.cli.quickstart_cmd import quickstart
from fjord.cli.topics_cmd import topics


class _FjordGroup(click.Group):
    """The top-level group: a closed stdout pipe ends any command quietly (status 141)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            exit_quietly_on_broken_pipe()


@click.group(cls=_FjordGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fjord")
def cli() -> None:
    """Fjord: a distributed, replicated commit log with Kafka's model."""


for _command in (
    broker,
    cluster,
    configs,
    consume,
    controller,
    coordinator,
    demo,
    groups,
    local,
    log_dirs,
    operator,
    perf,
    produce,
    quickstart,
    topics,
):
    cli.add_command(_command)


def main() -> None:
    cli()
