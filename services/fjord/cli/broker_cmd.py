"""``fjord broker``: run one broker process (contract: prints nothing on stdout but logs)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import click

from fjord.broker import defaults
from fjord.broker.server import BrokerOptions, BrokerServer
from fjord.cli.listener_options import listener_options
from fjord.cli.security_options import (
    load_authorization,
    load_service_security,
    sasl_listen_option,
    security_config_option,
)
from fjord.cluster.broker_config import canonical_keys
from fjord.cluster.defaults import DEFAULT_BROKER_PORT
from fjord.errors import ConfigError
from fjord.kafka.listeners import resolve_kafka_doors
from fjord.observability import setup_tracing, shutdown_tracing
from fjord.runtime import (
    freeze_startup_objects,
    keep_large_buffers_in_heap,
    shorten_gil_switch_interval,
)
from fjord.serving import parse_listen


def _parse_config(items: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected k=v, got {item!r}", param_hint="--config")
        out[key.strip()] = value.strip()
    try:
        return canonical_keys(out)  # Kafka's broker names (log.retention.ms) as Fjord's keys
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--config") from None


@click.command("broker")
@click.option("--id", "broker_id", type=int, required=True, help="Broker id (>= 0), unique.")
@listener_options
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory of this broker's partition logs.",
)
@click.option(
    "--etcd", "etcd_url", required=True,
    help="etcd endpoint, http://HOST:PORT, or https://HOST:PORT (TLS with this service's "
    "--security-config certificate).",
)
@click.option("--cluster-id", required=True, help="Cluster id (etcd prefix /fjord/<id>/).")
@click.option("--rack", default=None, help="Rack (or zone) of this broker, for replica spread.")
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus /metrics here.")
@click.option(
    "--config",
    "config_items",
    multiple=True,
    metavar="K=V",
    help="Topic config default for this broker (Kafka names, e.g. segment.bytes=1048576).",
)
@click.option(
    "--advertised-host",
    default=None,
    help="Host clients should connect to (default: the listen host).",
)
@click.option(
    "--lease-ttl",
    type=int,
    default=defaults.BROKER_LEASE_TTL_S,
    show_default=True,
    help="Seconds of the etcd lease that keeps this broker registered.",
)
@click.option(
    "--loop-stall-limit",
    type=float,
    default=None,
    help="Seconds the broker's event loop may make no progress before its lease is no longer "
    "renewed (a wedged broker is then fenced within this plus the lease TTL) [default: the "
    "lease TTL].",
)
@sasl_listen_option
@click.option(
    "--direct-listen",
    default=None,
    metavar="HOST:PORT",
    help="Open a direct door here: Produce and Fetch as protobuf frames on plain TCP, faster "
    "than gRPC (docs/direct-door.md; port 0: any free port). Refused with TLS or "
    "authorization: the door has no identity.",
)
@security_config_option
@click.option("--log-level", default="INFO", show_default=True, help="Python logging level.")
def broker(
    broker_id: int,
    listen: str | None,
    listeners: str,
    advertised_listeners: str,
    listener_security_protocol_map: str,
    data_dir: Path,
    etcd_url: str,
    cluster_id: str,
    rack: str | None,
    metrics_port: int | None,
    config_items: tuple[str, ...],
    advertised_host: str | None,
    lease_ttl: int,
    loop_stall_limit: float | None,
    sasl_listen: str | None,
    direct_listen: str | None,
    security_config: str | None,
    log_level: str,
) -> None:
    """Run a broker: host partition replicas, serve Produce/Fetch/ListOffsets/Metadata."""
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        host, port, doors = resolve_kafka_doors(
            listen, listeners, advertised_listeners, DEFAULT_BROKER_PORT,
            listener_security_protocol_map,
        )
        options = BrokerOptions(
            broker_id=broker_id,
            listen_host=host,
            listen_port=port,
            data_dir=data_dir,
            etcd_url=etcd_url,
            cluster_id=cluster_id,
            rack=rack,
            metrics_port=metrics_port,
            config=_parse_config(config_items),
            advertised_host=advertised_host,
            lease_ttl_s=lease_ttl,
            loop_stall_limit_s=loop_stall_limit,
            kafka_doors=doors,
            security=load_service_security(security_config),
            authorization=load_authorization(security_config),
            sasl_grpc_listener=(
                parse_listen(sasl_listen, 0) if sasl_listen is not None else None
            ),
            direct_listener=(
                parse_listen(direct_listen, 0) if direct_listen is not None else None
            ),
        )
        setup_tracing("broker")  # OTEL_* variables decide; no exporter by default
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    # Keep full garbage collections of the start-up objects from stalling produce and fetch.
    freeze_startup_objects()
    shorten_gil_switch_interval()  # gRPC's poller thread gets the GIL without waiting 5 ms
    keep_large_buffers_in_heap()  # record buffers reuse heap memory instead of page faults
    try:
        asyncio.run(BrokerServer(options).run_until_signalled())
    finally:
        shutdown_tracing()
