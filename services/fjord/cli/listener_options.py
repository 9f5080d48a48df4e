"""The listener options every server command shares (``fjord broker``, ``fjord coordinator``):
Kafka's ``listeners`` / ``advertised.listeners`` beside ``--listen``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])


def listener_options(command: F) -> F:
    """Adds ``--listen``, ``--listeners`` and ``--advertised-listeners`` (resolved by
    :func:`fjord.kafka.listeners.resolve_listeners`)."""
    for option in reversed([
        click.option(
            "--listen",
            default=None,
            help="HOST:PORT to serve gRPC on (port 0: any free); same as GRPC://HOST:PORT in "
            "--listeners.",
        ),
        click.option(
            "--listeners",
            default="",
            help="Kafka-style NAME://HOST:PORT list: GRPC (native), and KAFKA or SSL (the Kafka "
            "protocol, SSL over TLS with --security-config), e.g. KAFKA://0.0.0.0:9092. "
            "Neither KAFKA nor SSL: no Kafka listener.",
        ),
        click.option(
            "--advertised-listeners",
            default="",
            help="NAME://HOST:PORT clients are told per listener (default: the listen address; "
            "port 0: the bound port). Only the Kafka one is used; GRPC's host is "
            "--advertised-host.",
        ),
    ]):
        command = option(command)
    return command
