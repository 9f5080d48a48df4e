"""Connecting to etcd: endpoint parsing and client construction (the only place that builds
an ``aetcd.Client``, so every component gets the same timeouts and the same TLS)."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import aetcd
import grpc
from aetcd import rpc, watcher

from fjord.errors import ConfigError
from fjord.metadata.defaults import ETCD_REQUEST_TIMEOUT_S
from fjord.security import ClientSecurity, SecurityProtocol, TlsFiles


def parse_etcd_url(url: str) -> tuple[bool, str, int]:
    """``http://host:port``, ``https://host:port`` or bare ``host:port`` (http, as etcd's own
    clients read it) to ``(tls, host, port)``. ConfigError names ``etcd`` for anything else."""
    text = url if "://" in url else f"http://{url}"
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"etcd: invalid port in endpoint {url!r}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise ConfigError(
            f"etcd: expected an endpoint like http://HOST:PORT or https://HOST:PORT, got {url!r}"
        )
    if parts.path not in ("", "/"):
        raise ConfigError(f"etcd: endpoint {url!r} must not have a path")
    return parts.scheme == "https", parts.hostname, port


def parse_etcd_endpoint(url: str) -> tuple[str, int]:
    """``(host, port)`` of an etcd endpoint (see :func:`parse_etcd_url`)."""
    _, host, port = parse_etcd_url(url)
    return host, port


class _TlsEtcdClient(aetcd.Client):
    """aetcd's client over a TLS channel (aetcd 1.x only dials in plaintext): the same stubs
    and watcher as ``aetcd.Client.connect`` sets up, on a ``grpc.aio.secure_channel``."""

    def __init__(self, host: str, port: int, timeout: float, credentials: grpc.ChannelCredentials):
        super().__init__(host=host, port=port, timeout=timeout)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:  # type: ignore[has-type]  # another task is connecting: wait for it, as aetcd does
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            self.channel = grpc.aio.secure_channel(
                f"{self._host}:{self._port}", self._credentials, options=list(self._options.items())
            )
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = watcher.Watcher(
                rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False


def etcd_client(
    url: str,
    timeout_s: float = ETCD_REQUEST_TIMEOUT_S,
    security: ClientSecurity | None = None,
) -> aetcd.Client:
    """An (unconnected) etcd client for ``url``; every unary call is bounded by ``timeout_s``.

    ``https://`` endpoints are dialled with TLS: ``security``'s CA and client certificate
    (default: this process's, i.e. a secured service's keystore and truststore; else the
    system's roots and no client certificate). ``http://`` is plaintext whatever ``security``
    says."""
    tls, host, port = parse_etcd_url(url)
    if not tls:
        return aetcd.Client(host=host, port=port, timeout=timeout_s)
    from fjord.tls import channel_credentials, process_client_security

    security = security or process_client_security()
    if not security.uses_tls:
        security = ClientSecurity(SecurityProtocol.SSL, TlsFiles())
    assert security.tls is not None
    return _TlsEtcdClient(host, port, timeout_s, channel_credentials(security.tls))


#: Longest pause between two reconnection attempts of :class:`BlockingLeaseRefresher`.
LEASE_RECONNECT_BACKOFF_MAX_MS = 1000


class BlockingLeaseRefresher:
    """Lease keep-alives over a blocking gRPC channel of its own, for a thread that must not
    depend on any event loop (the broker's lease keep-alive thread): the same endpoint parsing,
    TLS and request timeout as :func:`etcd_client`. Not thread-safe: one thread uses it."""

    def __init__(
        self, url: str, timeout_s: float = ETCD_REQUEST_TIMEOUT_S,
        security: ClientSecurity | None = None,
    ) -> None:
        tls, host, port = parse_etcd_url(url)
        self._timeout_s = timeout_s
        # Reconnect within a second once etcd is back (gRPC's default backoff grows to 120 s):
        # after an outage longer than the lease the broker must learn at once that its lease
        # is gone and register anew, before the controller's re-registration grace ends.
        options = [("grpc.max_reconnect_backoff_ms", LEASE_RECONNECT_BACKOFF_MAX_MS)]
        if not tls:
            self._channel = grpc.insecure_channel(f"{host}:{port}", options=options)
        else:
            from fjord.tls import channel_credentials, process_client_security

            security = security or process_client_security()
            if not security.uses_tls:
                security = ClientSecurity(SecurityProtocol.SSL, TlsFiles())
            assert security.tls is not None
            self._channel = grpc.secure_channel(
                f"{host}:{port}", channel_credentials(security.tls), options=options)
        self._leases = rpc.LeaseStub(self._channel)

    def refresh(self, lease_id: int) -> int | None:
        """Renew ``lease_id`` once: the TTL etcd granted (0 or less: the lease is gone), None
        when etcd ended the stream without an answer. Raises grpc.RpcError when etcd cannot
        be reached within the timeout."""
        replies = self._leases.LeaseKeepAlive(
            iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=self._timeout_s)
        try:
            reply = next(replies, None)
        finally:
            replies.cancel()
        return None if reply is None else int(reply.TTL)

    def close(self) -> None:
        """Close the channel (a refresh in flight in another thread fails at once)."""
        self._channel.close()
