"""``fjord quickstart``: a local cluster, the orders -> shipments scenario, and a summary.

What ``make run`` runs. It starts a :class:`~fjord.local.cluster.LocalCluster` (3 brokers,
2 controllers) in ``--data-dir``, creates ``orders`` and ``shipments`` (6 partitions,
replication factor 3), runs :func:`fjord.demo.run_scenario`, prints the summary and how to use
the cluster from another terminal, then keeps the cluster up until Ctrl-C/SIGTERM (or
``fjord local down``) and stops it cleanly. ``--no-wait`` stops right after the summary.
Exit status 1 when the verification fails.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import click

from fjord.cluster.defaults import DEFAULT_BROKER_PORT
from fjord.demo.defaults import (
    CLUSTER_WATCH_INTERVAL_S,
    DEMO_BROKERS,
    DEMO_CONTROLLERS,
    DEMO_PARTITIONS,
    DEMO_RECORDS,
    DEMO_REPLICATION_FACTOR,
    ORDERS_TOPIC,
    SHIPMENTS_TOPIC,
)
from fjord.errors import ConfigError, FjordError, InvalidReplicationFactorError
from fjord.local.defaults import DEFAULT_DATA_DIR
from fjord.observability import setup_tracing, shutdown_tracing


@click.command("quickstart")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory of the local cluster (etcd data, broker logs, process logs, state file); "
    f"found as `fjord local` finds it (default: ./{DEFAULT_DATA_DIR}).",
)
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    help=f"First broker port, as for `fjord local up` (default: {DEFAULT_BROKER_PORT} when free).",
)
@click.option(
    "--records",
    type=click.IntRange(min=1),
    default=DEMO_RECORDS,
    show_default=True,
    help="Orders the order service writes.",
)
@click.option(
    "--replication-factor",
    type=click.IntRange(min=1, max=DEMO_BROKERS),
    default=DEMO_REPLICATION_FACTOR,
    show_default=True,
    help="Replicas of each partition of both topics.",
)
@click.option("--no-wait", is_flag=True, help="Stop the cluster right after the summary.")
def quickstart(
    data_dir: Path | None, port: int | None, records: int, replication_factor: int, no_wait: bool
) -> None:
    """Start a local cluster and run the orders -> shipments demonstration on it."""
    from fjord.client import KafkaTimeoutError
    from fjord.demo import render_summary, run_scenario
    from fjord.demo.orders import next_steps
    from fjord.local import choose_broker_port, resolve_data_dir
    from fjord.local.cluster import ClusterStateError, LocalCluster, pid_alive
    from fjord.local.etcd import EtcdNotFoundError, ProcessStartError

    try:
        setup_tracing("fjord-quickstart")  # OTEL_TRACES_EXPORTER=console shows the demo's spans
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    explicit_dir = data_dir is not None
    data_dir = resolve_data_dir(data_dir)
    first_port, note = choose_broker_port(port, DEMO_BROKERS)
    cluster = LocalCluster(
        data_dir,
        brokers=DEMO_BROKERS,
        controllers=DEMO_CONTROLLERS,
        broker_port=first_port,
        broker_port_fallback=port is None,
    )
    click.echo(
        f"starting a local cluster in {cluster.data_dir} ({DEMO_BROKERS} brokers, "
        f"{DEMO_CONTROLLERS} controllers, {cluster.num_coordinators} group coordinators, "
        "etcd) ..."
    )
    # Until the summary is out, Ctrl-C or SIGTERM (`fjord local down`) interrupts whatever runs;
    # afterwards they just end the wait. Either way the finally below stops the cluster.
    stopping = threading.Event()
    interrupted = False
    previous = {
        sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    # A start that is refused (a cluster already runs there, a port is taken) or fails has
    # stopped whatever it started itself: the clean-up below is only for a started cluster,
    # and must never touch another cluster's processes or state file.
    try:
        cluster.start()
    except (ClusterStateError, ProcessStartError, EtcdNotFoundError) as exc:
        _restore(previous)
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        _restore(previous)
        click.echo("interrupted while starting", err=True)
        raise SystemExit(130) from None
    try:
        bootstrap = cluster.bootstrap_servers
        if note:
            click.echo(note)
        click.echo(f"bootstrap servers: {bootstrap}")
        click.echo(f"kafka bootstrap servers: {cluster.kafka_bootstrap_servers}")
        click.echo(
            f"order service -> {ORDERS_TOPIC} -> shipping service -> {SHIPMENTS_TOPIC}: "
            f"{records} orders, {DEMO_PARTITIONS} partitions, "
            f"replication factor {replication_factor}"
        )
        try:
            try:
                report = run_scenario(bootstrap, records, replication_factor=replication_factor)
            except InvalidReplicationFactorError as exc:
                if replication_factor == 1:
                    raise
                # A build whose controller cannot replicate yet refuses RF > 1: say so and go on
                # unreplicated rather than show nothing.
                click.echo(f"note: {exc}; creating the topics with replication factor 1")
                report = run_scenario(bootstrap, records, replication_factor=1)
        except (FjordError, KafkaTimeoutError) as exc:
            raise click.ClickException(f"the demonstration failed: {exc}") from exc
        click.echo("")
        click.echo(render_summary(report))
        click.echo("")
        if not report.verification.ok:
            raise click.ClickException("verification failed (see above)")
        if no_wait:
            return
        for sig in previous:
            signal.signal(sig, lambda *_: stopping.set())
        click.echo(next_steps(bootstrap, str(data_dir) if explicit_dir else None))
        click.echo("Press Ctrl-C to stop the cluster.")
        while not stopping.wait(CLUSTER_WATCH_INTERVAL_S):
            dead = [p for p in cluster.processes() if not pid_alive(p.pid)]
            if dead:
                for p in dead:
                    click.echo(f"{p.role} {p.id} exited (log: {p.log})", err=True)
                break
    except KeyboardInterrupt:
        click.echo("interrupted before the demonstration finished", err=True)
        interrupted = True
    finally:
        # No second interrupt may cut the shutdown short and leave processes behind.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        shutdown_tracing()
        click.echo("stopping the local cluster ...")
        cluster.stop()
        _restore(previous)
        click.echo("stopped.")
    if interrupted:
        raise SystemExit(130)  # the shell's status for "ended by Ctrl-C"


def _restore(previous: dict[signal.Signals, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
