"""``--security-config FILE`` of ``fjord broker|controller|coordinator``: the service's TLS
settings (Kafka's ``ssl.keystore.location``, ``ssl.truststore.location``, ``ssl.client.auth``;
see :mod:`fjord.security.config`), read and checked before the service starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from fjord.errors import ConfigError, FjordError
from fjord.security import ServiceSecurity, parse_properties
from fjord.security.acls import AuthorizerSettings
from fjord.tls import load_tls, server_ssl_context

F = TypeVar("F", bound=Callable[..., Any])


def security_config_option(fn: F) -> F:
    return click.option(
        "--security-config",
        "security_config",
        default=None,
        metavar="FILE",
        help="Properties file with ssl.keystore.location (PEM certificate and key), "
        "ssl.truststore.location (PEM CA) and ssl.client.auth (required|none): TLS on every "
        "listener and every connection this service opens. Without it: plaintext.",
    )(fn)


def sasl_listen_option(fn: F) -> F:
    """``--sasl-listen HOST:PORT``: the service's SASL gRPC door (fjord.sasl_door)."""
    return click.option(
        "--sasl-listen",
        default=None,
        metavar="HOST:PORT",
        help="Open a SASL gRPC door here for Fjord's own SASL_SSL/SASL_PLAINTEXT clients (TLS "
        "without client certificates with --security-config, else plaintext).",
    )(fn)


def load_service_security(path: str | None) -> ServiceSecurity | None:
    """The service security of ``--security-config`` (None without one). Every file is read
    and parsed here, so a bad path or PEM fails at start-up with a UsageError naming the key."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise click.BadParameter(
            f"cannot read {path}: {exc.strerror or exc}", param_hint="--security-config"
        ) from exc
    try:
        security = ServiceSecurity.from_config(parse_properties(text, path))
        load_tls(security.server_files, "ssl.keystore.location")
        server_ssl_context(security)
    except ConfigError as exc:
        raise click.UsageError(f"--security-config {path}: {exc}") from exc
    return security


def load_authorization(path: str | None) -> AuthorizerSettings | None:
    """The ACL authorization of ``--security-config`` (Kafka's ``authorizer.class.name``,
    ``super.users``, ``allow.everyone.if.no.acl.found``); None: off (also without a file)."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            config = parse_properties(f.read(), path)
        settings = AuthorizerSettings.from_service_config(config)
        if settings is not None and config.get("ssl.client.auth", "required").lower() != (
            "required"
        ):
            # Without client certificates every caller, the other services included, is
            # User:ANONYMOUS: replication and forwarding would be refused.
            raise ConfigError(
                "authorizer.class.name: ACLs need ssl.client.auth=required (principals come "
                "from client certificates)"
            )
        return settings
    except OSError as exc:
        raise click.BadParameter(
            f"cannot read {path}: {exc.strerror or exc}", param_hint="--security-config"
        ) from exc
    except FjordError as exc:
        raise click.UsageError(f"--security-config {path}: {exc}") from exc
