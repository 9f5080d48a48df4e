"""``fjord local up|status|down``: a whole cluster on this machine (see docs/operations.md)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import click
from tabulate import tabulate

from fjord.cli.client_common import output_option
from fjord.cluster.defaults import DEFAULT_BROKER_PORT
from fjord.errors import ConfigError
from fjord.local import (
    ClusterStateError,
    EtcdNotFoundError,
    LocalCluster,
    ProcessStartError,
    choose_broker_port,
    read_state,
    resolve_data_dir,
    restart_dead_processes,
    stop_from_state,
)
from fjord.local.cluster import pid_alive
from fjord.local.defaults import (
    DATA_DIR_ENV_VAR,
    DEFAULT_BROKERS,
    DEFAULT_COORDINATORS,
    DEFAULT_DATA_DIR,
    MONITOR_INTERVAL_S,
    READY_POLL_INTERVAL_S,
    STOP_TIMEOUT_S,
)

_DATA_DIR = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory holding etcd data, broker logs, process logs and the state file "
    f"(default: ${DATA_DIR_ENV_VAR}, else the nearest {DEFAULT_DATA_DIR} with a state file in "
    f"this directory or a parent, else ./{DEFAULT_DATA_DIR}).",
)


def _parse_config(items: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--config")
        out[key.strip()] = value.strip()
    return out


@click.group("local")
def local() -> None:
    """Run a whole Fjord cluster (etcd, controllers, brokers, coordinators) on this machine."""


@local.command("up")
@_DATA_DIR
@click.option("--brokers", type=click.IntRange(min=1), default=DEFAULT_BROKERS, show_default=True)
@click.option(
    "--coordinators", type=click.IntRange(min=0), default=DEFAULT_COORDINATORS, show_default=True
)
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    help=f"First broker port; brokers take consecutive ports (default: {DEFAULT_BROKER_PORT} "
    "when it and the next ones are free, else free ports; 0: free ports).",
)
@click.option("--detach", is_flag=True, help="Return once healthy; stop later with `down`.")
@click.option(
    "--config",
    "config_items",
    multiple=True,
    metavar="KEY=VALUE",
    help="Cluster-wide broker/topic default (Kafka names), e.g. min.insync.replicas=2.",
)
@click.option(
    "--secure",
    is_flag=True,
    help="TLS with client certificates on every listener and on etcd: makes a CA and "
    "certificates in DATA_DIR/tls and writes DATA_DIR/client.properties for clients.",
)
@click.option(
    "--authorization",
    is_flag=True,
    help="With --secure: Kafka's ACL authorizer on in every service; client.properties' "
    "User:admin is the super user, every other principal needs ACLs (fjord acls).",
)
@click.option(
    "--sasl",
    is_flag=True,
    help="Kafka-protocol listeners take SASL SCRAM-SHA-256/512 logins (SASL_SSL:// with "
    "--secure, else SASL_PLAINTEXT://); make users with fjord users --alter.",
)
def up(
    data_dir: Path | None,
    brokers: int,
    coordinators: int,
    port: int | None,
    detach: bool,
    config_items: tuple[str, ...],
    secure: bool,
    authorization: bool,
    sasl: bool,
) -> None:
    """Start a local cluster and print its bootstrap servers. Without --detach it runs in the
    foreground until Ctrl-C (or SIGTERM), then stops everything.

    When the cluster is already running but some of its processes died (a broker killed or
    crashed), start those again with their ports, data and settings, and return."""
    if authorization and not secure:
        raise click.UsageError("--authorization needs --secure (principals come from "
                               "client certificates)")
    data_dir = resolve_data_dir(data_dir)
    if _fill_gaps(data_dir):
        return
    first_port, note = choose_broker_port(port, brokers)
    try:
        cluster = LocalCluster(
            data_dir,
            brokers=brokers,
            config=_parse_config(config_items),
            detach=detach,
            coordinators=coordinators,
            broker_port=first_port,
            broker_port_fallback=port is None,
            secure=secure,
            authorization=authorization,
            kafka_sasl=sasl,
        )
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--config") from exc
    try:
        cluster.start()
    except (ClusterStateError, ProcessStartError, EtcdNotFoundError) as exc:
        raise click.ClickException(str(exc)) from exc
    if note:
        click.echo(note)
    click.echo(f"bootstrap servers: {cluster.bootstrap_servers}")
    click.echo(f"kafka bootstrap servers: {cluster.kafka_bootstrap_servers}")
    coordinators_text = ", ".join(f"{i}={a}" for i, a in cluster.coordinator_addresses.items())
    click.echo(f"group coordinators: {coordinators_text or 'none'}")
    click.echo(f"etcd: {cluster.etcd_url}  data: {cluster.data_dir}")
    if cluster.client_properties is not None:
        props = cluster.client_properties
        click.echo(f"secure: mutual TLS everywhere; client settings (User:admin) in {props}")
        if cluster.authorization:
            click.echo("  ACLs on: User:admin is the super user; others need "
                       f"fjord acls --add ... --command-config {props}")
        click.echo(f"  fjord topics list --command-config {props}")
        if not sasl:  # with --sasl the Kafka doors take SASL logins (printed below)
            click.echo(
                "  Kafka clients: the same keys (security.protocol=SSL, ssl.ca.location, "
                "ssl.certificate.location, ssl.key.location)"
            )
    if sasl:
        command = f" --command-config {cluster.client_properties}" if secure else ""
        protocol = "SASL_SSL" if secure else "SASL_PLAINTEXT"
        click.echo(f"SASL: the Kafka listeners take SCRAM-SHA-256/512 ({protocol}); make a user:")
        click.echo(f"  fjord users --alter --entity-name alice --add-config "
                   f"'SCRAM-SHA-512=[password=alice-secret]'{command}")
        click.echo(f"  Kafka clients: security.protocol={protocol}, sasl.mechanism=SCRAM-SHA-512, "
                   "sasl.username, sasl.password"
                   + (", ssl.ca.location" if secure else ""))
        click.echo(f"  fjord clients (fjord.client, --command-config): the same keys with "
                   f"bootstrap.servers={cluster.sasl_grpc_bootstrap_servers} (SASL gRPC doors)")
    if detach:
        click.echo(f"running in the background; stop with: fjord local down --data-dir {data_dir}")
        return
    _run_in_foreground(cluster)


def _fill_gaps(data_dir: Path) -> bool:
    """If the cluster in ``data_dir`` runs with some processes dead, restart those and say so;
    True when the cluster is (now) whole and running, False when nothing of it runs."""
    try:
        state = read_state(data_dir, missing_ok=True)
    except ClusterStateError as exc:
        raise click.ClickException(str(exc)) from exc
    if not state or not any(pid_alive(p["pid"]) for p in state["processes"]):
        return False
    try:
        restarted = restart_dead_processes(data_dir)
    except (ClusterStateError, ProcessStartError) as exc:
        raise click.ClickException(str(exc)) from exc
    for p in restarted:
        click.echo(f"restarted {p['role']} {p['id']} (pid {p['pid']}) on {p['address']}")
    if not restarted:
        raise click.ClickException(
            f"a local cluster is already running in {data_dir} (stop it with `fjord local down`)"
        )
    click.echo(f"bootstrap servers: {state.get('bootstrap_servers', '')}")
    return True


def _run_in_foreground(cluster: LocalCluster) -> None:
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    click.echo("press Ctrl-C to stop")
    reported: set[int] = set()
    try:
        while not stopping.wait(MONITOR_INTERVAL_S):
            # A process that dies is reported once; the rest keep running (killing a broker
            # on purpose is a normal local experiment).
            for p in cluster.processes():
                if p.pid not in reported and not pid_alive(p.pid):
                    reported.add(p.pid)
                    click.echo(
                        f"warning: {p.role} {p.id} exited; see {p.log} "
                        "(`fjord local up` in another terminal starts it again)",
                        err=True,
                    )
    finally:
        click.echo("stopping...")
        cluster.stop()


@local.command("status")
@_DATA_DIR
@output_option
def status(data_dir: Path, output: str) -> None:
    """Show the processes of the local cluster in DATA_DIR (gRPC and /metrics addresses) and
    whether they are alive."""
    data_dir = resolve_data_dir(data_dir)
    try:
        state = read_state(data_dir)
    except ClusterStateError as exc:
        raise click.ClickException(str(exc)) from exc
    assert state is not None
    # A state file written before metrics ports existed has no "metrics_address": null.
    processes = [
        {k: p[k] for k in ("role", "id", "pid", "address", "log")}
        | {"metrics_address": p.get("metrics_address"), "alive": pid_alive(p["pid"])}
        for p in state["processes"]
    ]
    bootstrap = state.get("bootstrap_servers", "") if processes else ""
    kafka_bootstrap = state.get("kafka_bootstrap_servers", "") if processes else ""
    if output == "json":
        click.echo(
            json.dumps(
                {
                    "bootstrap_servers": bootstrap,
                    "kafka_bootstrap_servers": kafka_bootstrap,
                    "cluster_id": state["cluster_id"],
                    "etcd_url": state["etcd_url"],
                    "processes": processes,
                },
                indent=2,
            )
        )
        return
    if not processes:
        click.echo(f"the local cluster in {data_dir} is stopped")
        return
    click.echo(f"bootstrap servers: {bootstrap}  data: {Path(data_dir).absolute()}")
    click.echo(f"kafka bootstrap servers: {kafka_bootstrap}")
    click.echo(tabulate(processes, headers="keys"))
    dead = [p for p in processes if not p["alive"]]
    if dead:
        names = ", ".join(f"{p['role']} {p['id']}" for p in dead)
        click.echo(f"not running: {names} (logs above); `fjord local up` starts them again")


@local.command("down")
@_DATA_DIR
def down(data_dir: Path) -> None:
    """Stop the local cluster in DATA_DIR (coordinators, brokers, controllers, then etcd).
    Data is kept."""
    data_dir = resolve_data_dir(data_dir)
    try:
        state = read_state(data_dir)
        assert state is not None
        launcher = state.get("launcher_pid")
        if launcher and pid_alive(launcher):
            # A foreground `up` owns the processes: ask it to stop them in order, and wait.
            os.kill(launcher, signal.SIGTERM)
            deadline = time.monotonic() + 3 * STOP_TIMEOUT_S
            while pid_alive(launcher) and time.monotonic() < deadline:
                time.sleep(READY_POLL_INTERVAL_S)
            if pid_alive(launcher):
                raise click.ClickException(f"launcher (pid {launcher}) did not stop in time")
            click.echo(f"the foreground launcher (pid {launcher}) stopped the cluster")
            return
        stopped = stop_from_state(data_dir)
    except ClusterStateError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"stopped {len(stopped)} processes")
