"""``fjord operator``: the Kubernetes operator (needs the ``operator`` extra)."""

from __future__ import annotations

import dataclasses

import click

from fjord.errors import ConfigError


@click.command("operator")
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    help="Namespace to watch (repeatable); none: every namespace. Env: FJORD_OPERATOR_NAMESPACES.",
)
@click.option(
    "--all-namespaces",
    is_flag=True,
    help="Watch every namespace (the default when no --namespace is given).",
)
@click.option(
    "--standalone",
    is_flag=True,
    help="One replica, no kopf peering (always the case; accepted for clarity).",
)
@click.option(
    "--cluster-interval", type=float, default=None, help="Seconds between FjordCluster checks."
)
@click.option(
    "--topic-interval", type=float, default=None, help="Seconds between FjordTopic checks."
)
@click.option(
    "--retry-delay", type=float, default=None, help="Seconds before a waiting step retries."
)
@click.option(
    "--kube-server",
    default=None,
    help="Kubernetes API URL replacing the login's own (credentials and CA are kept).",
)
@click.option(
    "--kubeconfig",
    default=None,
    help="Kubeconfig to log in with (default: in-cluster service account, else KUBECONFIG or "
    "~/.kube/config). Env: FJORD_OPERATOR_KUBECONFIG.",
)
def operator(
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    standalone: bool,
    cluster_interval: float | None,
    topic_interval: float | None,
    retry_delay: float | None,
    kube_server: str | None,
    kubeconfig: str | None,
) -> None:
    """Run the Kubernetes operator: FjordCluster and FjordTopic resources (kopf)."""
    try:
        from fjord_operator.main import run
        from fjord_operator.settings import OperatorSettings
    except ImportError as exc:
        raise click.ClickException(
            f"the operator needs the 'operator' extra (pip install 'fjord[operator]'): {exc}"
        ) from exc
    if all_namespaces and namespaces:
        raise click.UsageError("--all-namespaces and --namespace exclude each other")
    try:
        settings = OperatorSettings.from_env()
        settings = dataclasses.replace(
            settings,
            namespaces=() if all_namespaces else (namespaces or settings.namespaces),
            cluster_interval_s=settings.cluster_interval_s
            if cluster_interval is None
            else cluster_interval,
            topic_interval_s=settings.topic_interval_s
            if topic_interval is None
            else topic_interval,
            retry_delay_s=settings.retry_delay_s if retry_delay is None else retry_delay,
            kube_server=kube_server or settings.kube_server,
            kubeconfig=kubeconfig or settings.kubeconfig,
        )
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from exc
    run(settings)
