"""``fjord cluster describe``: cluster id, active controller, brokers, coordinators."""

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


@click.group("cluster")
def cluster() -> None:
    """Inspect the cluster."""


@cluster.command("describe")
@bootstrap_option
@output_option
@friendly_errors
def describe(bootstrap_server: str | None, output: str) -> None:
    """Cluster id, active controller, live brokers and group coordinators."""
    with AdminClient(admin_client_config(bootstrap_server)) as admin:
        description = admin.describe_cluster()
    active = description.controller
    data = {
        "cluster_id": description.cluster_id,
        "controller": None
        if active is None
        else {"id": active.id, "host": active.host, "port": active.port},
        "brokers": [
            {"id": b.id, "host": b.host, "port": b.port, "rack": b.rack or None}
            for b in description.brokers
        ],
        "controllers": [
            {"id": c.id, "host": c.host, "port": c.port} for c in description.controllers
        ],
        "coordinators": [
            {"id": c.id, "host": c.host, "port": c.port} for c in description.coordinators
        ],
    }
    if output == "json":
        emit(output, data, [], [])
        return
    click.echo(f"Cluster id: {description.cluster_id}")
    click.echo(f"Controller: {active.id} ({active.address})" if active else "Controller: none")
    rows = [("broker", b.id, b.address, b.rack or "") for b in description.brokers]
    rows += [
        ("controller", c.id, c.address, "active" if active and c.id == active.id else "standby")
        for c in description.controllers
    ]
    rows += [("coordinator", c.id, c.address, "") for c in description.coordinators]
    emit(output, data, rows, ["Role", "Id", "Address", "Rack/State"])
