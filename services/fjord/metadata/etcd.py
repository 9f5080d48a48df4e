"""Connecting to etcd: endpoint parsing and client construction (the only place that builds
an ``aetcd.Client``, so every component gets the same timeouts)."""

from __future__ import annotations

from urllib.parse import urlsplit

import aetcd

from fjord.errors import ConfigError
from fjord.metadata.defaults import ETCD_REQUEST_TIMEOUT_S


def parse_etcd_endpoint(url: str) -> tuple[str, int]:
    """``http://host:port`` (or bare ``host:port``) to ``(host, port)``.

    Raises :class:`~fjord.errors.ConfigError` naming ``etcd`` for anything else (TLS endpoints
    are not supported yet, so ``https`` is refused rather than silently used in clear text).
    """
    text = url if "://" in url else f"http://{url}"
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"etcd: invalid port in endpoint {url!r}") from exc
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise ConfigError(f"etcd: expected an endpoint like http://HOST:PORT, got {url!r}")
    if parts.path not in ("", "/"):
        raise ConfigError(f"etcd: endpoint {url!r} must not have a path")
    return parts.hostname, port


def etcd_client(url: str, timeout_s: float = ETCD_REQUEST_TIMEOUT_S) -> aetcd.Client:
    """An (unconnected) etcd client for ``url``; every unary call is bounded by ``timeout_s``."""
    host, port = parse_etcd_endpoint(url)
    return aetcd.Client(host=host, port=port, timeout=timeout_s)
