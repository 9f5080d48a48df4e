"""The listener options every server command shares (``fjord broker``, ``fjord coordinator``):
Kafka's ``listeners`` / ``advertised.listeners`` beside ``--listen``."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])


def listener_options(command: F) -> F:
    """Adds ``--listen``, ``--listeners``, ``--advertised-listeners`` and
    ``--listener-security-protocol-map`` (resolved by
    :func:`fjord.kafka.listeners.resolve_kafka_doors`)."""
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
            help="Kafka-style NAME://HOST:PORT list: GRPC (native), and Kafka-protocol doors "
            "KAFKA, SSL, SASL_PLAINTEXT, SASL_SSL (TLS ones need --security-config) or names "
            "of --listener-security-protocol-map, e.g. SSL://0.0.0.0:9093,SASL_SSL://0.0.0.0:9094."
            " Several doors: each is advertised under its own name. None: no Kafka listener.",
        ),
        click.option(
            "--advertised-listeners",
            default="",
            help="NAME://HOST:PORT clients are told per listener (default: the listen address; "
            "port 0: the bound port). Only the Kafka ones are used; GRPC's host is "
            "--advertised-host.",
        ),
        click.option(
            "--listener-security-protocol-map",
            default="",
            metavar="NAME:PROTOCOL,...",
            help="Kafka's listener.security.protocol.map: the protocol (PLAINTEXT, SSL, "
            "SASL_PLAINTEXT, SASL_SSL) of each listener named otherwise, e.g. "
            "TLS:SSL,SCRAM:SASL_SSL.",
        ),
    ]):
        command = option(command)
    return command
