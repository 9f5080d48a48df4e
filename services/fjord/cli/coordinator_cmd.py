"""``fjord coordinator``: run one group coordinator process (prints nothing on stdout but logs)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import click

from fjord.cli.listener_options import listener_options
from fjord.cli.security_options import (
    load_authorization,
    load_service_security,
    sasl_listen_option,
    security_config_option,
)
from fjord.coordinator import defaults
from fjord.coordinator.server import CONFIG_KEYS, CoordinatorOptions, CoordinatorServer
from fjord.errors import ConfigError
from fjord.kafka.listeners import resolve_kafka_doors
from fjord.observability import setup_tracing, shutdown_tracing
from fjord.runtime import freeze_startup_objects, shorten_gil_switch_interval
from fjord.serving import parse_listen


def _parse_config(items: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected k=v, got {item!r}", param_hint="--config")
        out[key.strip()] = value.strip()
    return out


@click.command("coordinator")
@click.option("--id", "coordinator_id", type=int, required=True, help="Coordinator id, unique.")
@listener_options
@click.option(
    "--etcd", "etcd_url", required=True,
    help="etcd endpoint, http://HOST:PORT, or https://HOST:PORT (TLS with this service's "
    "--security-config certificate).",
)
@click.option("--cluster-id", required=True, help="Cluster id (etcd prefix /fjord/<id>/).")
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus /metrics here.")
@click.option(
    "--advertised-host",
    default=None,
    help="Host clients should connect to (default: the listen host).",
)
@click.option(
    "--lease-ttl",
    type=int,
    default=defaults.COORDINATOR_LEASE_TTL_S,
    show_default=True,
    help="Seconds of the etcd lease that keeps this coordinator registered.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="A directory only this coordinator uses (locked while it runs): each run records its "
    "incarnation there, so a coordinator started again after a crash replaces its previous "
    "run's registration at once instead of waiting for that run's lease to expire.",
)
@click.option(
    "--lag-refresh-interval",
    type=float,
    default=defaults.LAG_REFRESH_INTERVAL_S,
    show_default=True,
    help="Seconds between refreshes of the fjord_group_lag gauges.",
)
@click.option(
    "--config",
    "config_items",
    multiple=True,
    metavar="K=V",
    help="Coordinator setting (Kafka names): " + ", ".join(CONFIG_KEYS) + ".",
)
@sasl_listen_option
@security_config_option
@click.option("--log-level", default="INFO", show_default=True, help="Python logging level.")
def coordinator(
    coordinator_id: int,
    listen: str | None,
    listeners: str,
    advertised_listeners: str,
    listener_security_protocol_map: str,
    etcd_url: str,
    cluster_id: str,
    metrics_port: int | None,
    advertised_host: str | None,
    lease_ttl: int,
    state_dir: Path | None,
    lag_refresh_interval: float,
    config_items: tuple[str, ...],
    sasl_listen: str | None,
    security_config: str | None,
    log_level: str,
) -> None:
    """Run a group coordinator: consumer groups and committed offsets of the
    __consumer_offsets partitions the controller assigns to it (no data directory: its state
    lives in that replicated topic; --state-dir only makes restarts fast)."""
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        host, port, doors = resolve_kafka_doors(
            listen, listeners, advertised_listeners, defaults.DEFAULT_COORDINATOR_PORT,
            listener_security_protocol_map,
        )
        options = CoordinatorOptions(
            coordinator_id=coordinator_id,
            listen_host=host,
            listen_port=port,
            etcd_url=etcd_url,
            cluster_id=cluster_id,
            metrics_port=metrics_port,
            advertised_host=advertised_host,
            lease_ttl_s=lease_ttl,
            state_dir=state_dir,
            lag_refresh_interval_s=lag_refresh_interval,
            config=_parse_config(config_items),
            kafka_doors=doors,
            security=load_service_security(security_config),
            authorization=load_authorization(security_config),
            sasl_grpc_listener=(
                parse_listen(sasl_listen, 0) if sasl_listen is not None else None
            ),
        )
        setup_tracing("coordinator")  # OTEL_* variables decide; no exporter by default
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    freeze_startup_objects()
    shorten_gil_switch_interval()  # gRPC's poller thread gets the GIL without waiting 5 ms
    try:
        asyncio.run(CoordinatorServer(options).run_until_signalled())
    finally:
        shutdown_tracing()
