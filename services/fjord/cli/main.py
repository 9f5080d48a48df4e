"""Entry point of the ``fjord`` command: one click group, subcommands in sibling modules."""

from __future__ import annotations

import click

from fjord import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fjord")
def cli() -> None:
    """Fjord: a distributed, replicated commit log with Kafka's model."""


def main() -> None:
    cli()
