"""``fjord controller``: run one controller process (prints nothing on stdout but logs)."""

from __future__ import annotations

import asyncio
import logging

import click

from fjord.cli.client_common import parse_pairs
from fjord.cli.security_options import (
    load_authorization,
    load_service_security,
    sasl_listen_option,
    security_config_option,
)
from fjord.cluster.topic_config import validate_cluster_config
from fjord.controller.defaults import (
    AUTO_LEADER_REBALANCE_ENABLE,
    LEADER_IMBALANCE_CHECK_INTERVAL_S,
    LEASE_TTL_S,
)
from fjord.controller.server import run_controller
from fjord.errors import ConfigError
from fjord.metadata import parse_etcd_endpoint
from fjord.security.sasl_sessions import (
    CONNECTIONS_MAX_REAUTH_MS_KEY,
    SessionLifetime,
    connections_max_reauth_ms,
)


@click.command("controller")
@click.option("--id", "controller_id", type=int, required=True, help="Controller id, unique.")
@click.option("--listen", required=True, help="HOST:PORT to serve gRPC on (port 0: any free).")
@click.option(
    "--etcd", "etcd_url", required=True,
    help="etcd endpoint, http://HOST:PORT, or https://HOST:PORT (TLS with this service's "
    "--security-config certificate).",
)
@click.option("--cluster-id", required=True, help="Cluster id (etcd prefix /fjord/<id>/).")
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus /metrics here.")
@click.option(
    "--lease-ttl",
    type=click.IntRange(min=2),
    default=LEASE_TTL_S,
    show_default=True,
    help="Seconds of the leader lease: a dead active controller is replaced after at most this.",
)
@click.option(
    "--advertised-host", default=None, help="Host others should connect to (default: listen host)."
)
@click.option(
    "--auto-leader-rebalance/--no-auto-leader-rebalance",
    default=AUTO_LEADER_REBALANCE_ENABLE,
    show_default=True,
    help="Move leadership back to preferred replicas (Kafka's auto.leader.rebalance.enable).",
)
@click.option(
    "--leader-imbalance-check-interval",
    type=click.FloatRange(min=0.1),
    default=LEADER_IMBALANCE_CHECK_INTERVAL_S,
    show_default=True,
    help="Seconds between preferred-leader checks (leader.imbalance.check.interval.seconds).",
)
@click.option(
    "--config",
    "config_items",
    multiple=True,
    metavar="KEY=VALUE",
    help="Cluster default, Kafka's names (num.partitions=12, default.replication.factor=3, "
    "min.insync.replicas=2, retention.ms=...); etcd's cluster-config overrides it key by key.",
)
@sasl_listen_option
@security_config_option
@click.option("--log-level", default="INFO", show_default=True, help="Python logging level.")
def controller(
    controller_id: int,
    listen: str,
    etcd_url: str,
    cluster_id: str,
    metrics_port: int | None,
    lease_ttl: int,
    advertised_host: str | None,
    auto_leader_rebalance: bool,
    leader_imbalance_check_interval: float,
    config_items: tuple[str, ...],
    sasl_listen: str | None,
    security_config: str | None,
    log_level: str,
) -> None:
    """Run a controller: one active (leader lease in etcd), the others standby.

    Topics created without a partition count or replication factor get ``num.partitions`` /
    ``default.replication.factor``: etcd's cluster-config, else this ``--config``, else 1."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if controller_id < 0:
        raise click.BadParameter("must be >= 0", param_hint="--id")
    _, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise click.BadParameter(f"expected HOST:PORT, got {listen!r}", param_hint="--listen")
    try:
        parse_etcd_endpoint(etcd_url)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--etcd") from exc
    if not cluster_id or "/" in cluster_id:
        raise click.BadParameter("must be non-empty without '/'", param_hint="--cluster-id")
    try:
        pairs = parse_pairs(config_items, "--config")
        # The SASL door's session lifetime is this process's, not a cluster default.
        sasl_lifetime = SessionLifetime(connections_max_reauth_ms(pairs))
        pairs.pop(CONNECTIONS_MAX_REAUTH_MS_KEY, None)
        static_config = validate_cluster_config(pairs)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--config") from exc
    security = load_service_security(security_config)
    try:
        asyncio.run(
            run_controller(
                controller_id, listen, etcd_url, cluster_id, lease_ttl, advertised_host,
                metrics_port,
                auto_leader_rebalance=auto_leader_rebalance,
                leader_imbalance_check_interval_s=leader_imbalance_check_interval,
                static_config=static_config,
                security=security,
                authorization=load_authorization(security_config),
                sasl_listen=sasl_listen,
                sasl_lifetime=sasl_lifetime,
            )
        )
    except OSError as exc:
        raise click.ClickException(str(exc)) from exc
