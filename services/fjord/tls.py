"""The TLS shell: PEM files to gRPC credentials and ``ssl`` contexts, every gRPC channel Fjord
opens, and the principal of a gRPC or Kafka-protocol peer.

The settings and rules are pure in :mod:`fjord.security`; this module only reads files and
talks to gRPC/``ssl``. Invariants:

- :func:`open_channel` is the only place a gRPC channel to a Fjord service is made. With an
  explicit :class:`~fjord.security.ClientSecurity` it dials as that client; without one it dials
  as this process: a service that called :func:`use_service_security` shows its own
  certificate (mutual TLS), anything else dials in plaintext.
- A peer's principal comes only from a certificate the listener's trust store verified.
"""

from __future__ import annotations

import functools
import logging
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from fjord.errors import ConfigError
from fjord.security import (
    ANONYMOUS,
    ClientSecurity,
    Principal,
    ServiceSecurity,
    TlsFiles,
    principal_from_certificate_subject,
)
from fjord.security.principal import SASL_SESSION_PRINCIPAL

log = logging.getLogger(__name__)


_process_security: ServiceSecurity | None = None


def use_service_security(security: ServiceSecurity | None) -> None:
    """This process is a Fjord service with ``security`` (None: plaintext): every channel it
    opens without an explicit client security dials with its certificate. Called once at
    start-up by ``fjord broker|controller|coordinator``."""
    global _process_security
    _process_security = security


def process_client_security() -> ClientSecurity:
    """How this process dials when nobody says otherwise (see :func:`use_service_security`)."""
    return _process_security.outbound() if _process_security else ClientSecurity()


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    """The bytes of :class:`~fjord.security.TlsFiles`: CA certificates, own chain and key."""

    ca: bytes | None
    chain: bytes | None
    key: bytes | None


def _read(path: str, key: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror or exc}") from exc


def _pem_blocks(data: bytes) -> list[bytes]:
    blocks: list[bytes] = []
    current: list[bytes] = []
    for line in data.splitlines(keepends=True):
        if line.startswith(b"-----BEGIN ") or current:
            current.append(line)
        if line.startswith(b"-----END "):
            blocks.append(b"".join(current))
            current = []
    return blocks


def load_tls(files: TlsFiles, what: str = "ssl") -> TlsMaterial:
    """Read ``files``; a combined PEM (chain and key in one file, Kafka's PEM keystore) is
    split. ConfigError names ``what`` and the file when one cannot be read or holds no
    certificate/key."""
    ca = _read(files.ca, f"{what} CA") if files.ca else None
    chain = key = None
    if files.certificate and files.key:
        cert_blocks = _pem_blocks(_read(files.certificate, f"{what} certificate"))
        key_blocks = _pem_blocks(_read(files.key, f"{what} key"))
        chain = b"".join(b for b in cert_blocks if b"CERTIFICATE-----" in b.splitlines()[0])
        keys = [b for b in key_blocks if b"PRIVATE KEY-----" in b.splitlines()[0]]
        if not chain:
            raise ConfigError(f"{what}: no PEM certificate in {files.certificate}")
        if not keys:
            raise ConfigError(f"{what}: no PEM private key in {files.key}")
        key = keys[0]
    return TlsMaterial(ca, chain, key)


# --- gRPC ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    material = load_tls(files)
    return grpc.ssl_channel_credentials(material.ca, material.key, material.chain)


def open_channel(
    address: str,
    security: ClientSecurity | None = None,
    *,
    options: Sequence[tuple[str, Any]] | None = None,
    interceptors: Sequence[aio.ClientInterceptor] | None = None,
) -> aio.Channel:
    """A grpc.aio channel to ``address``: TLS when ``security`` (default: this process's, see
    :func:`use_service_security`) says so, else plaintext."""
    security = security or process_client_security()
    if security.sasl is not None:
        from fjord.sasl_login import SaslLoginInterceptor

        interceptors = [*(interceptors or ()), SaslLoginInterceptor(address, security)]
    if security.uses_tls:
        assert security.tls is not None
        return aio.secure_channel(
            address, channel_credentials(security.tls), options=options,
            interceptors=interceptors,
        )
    return aio.insecure_channel(address, options=options, interceptors=interceptors)


def bind_port(server: aio.Server, address: str, security: ServiceSecurity | None) -> int:
    """Bind ``server`` to ``address`` with TLS (``security``) or plaintext; returns the bound
    port (0 when gRPC could not bind)."""
    if security is None:
        return int(server.add_insecure_port(address))
    material = load_tls(security.server_files, "ssl.keystore.location")
    assert material.key is not None and material.chain is not None
    credentials = grpc.ssl_server_credentials(
        [(material.key, material.chain)],
        root_certificates=material.ca,
        require_client_auth=security.client_auth_required,
    )
    return int(server.add_secure_port(address, credentials))


@functools.lru_cache(maxsize=256)
def principal_from_pem(pem: bytes) -> Principal:
    """The principal of a (verified) PEM certificate: its subject's CN and OUs."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(pem)
    subject = cert.subject
    return principal_from_certificate_subject(
        [str(a.value) for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)],
        [str(a.value) for a in subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)],
    )


def grpc_peer_principal(context: aio.ServicerContext) -> Principal:
    """Who called: ``User:<CN>`` of the client certificate the TLS handshake verified, else
    ``User:ANONYMOUS`` (plaintext, or TLS without a client certificate). On a SASL gRPC door
    it is the call's session principal (``User:<name>``, never the service identity)."""
    session = SASL_SESSION_PRINCIPAL.get()
    if session is not None:
        return session
    pems = context.auth_context().get("x509_pem_cert")
    return principal_from_pem(pems[0]) if pems else ANONYMOUS


class ClusterActionGuard:
    """Kafka's ClusterAction check for inter-broker requests (a follower's Fetch,
    AlterPartition, AllocateProducerIds, a coordinator's ``__consumer_offsets`` appends).

    Invariant: with ``enforced`` (the listener requires client certificates) only the cluster
    service identity passes; without it (plaintext, or TLS without client authentication,
    where nobody is authenticated) every caller passes, as Kafka without an authorizer.
    """

    def __init__(self, enforced: bool) -> None:
        self.enforced = enforced
        self.refused = 0

    @classmethod
    def for_service(cls, security: ServiceSecurity | None) -> ClusterActionGuard:
        return cls(security is not None and security.client_auth_required)

    def allows(self, context: aio.ServicerContext, what: str) -> bool:
        """True when the caller may send ``what``; a refusal is logged and counted."""
        if not self.enforced:
            return True
        principal = grpc_peer_principal(context)
        if principal.is_service:
            return True
        self.refused += 1
        log.warning(
            "refused %s from %s (%s): not the cluster service identity "
            "(CLUSTER_AUTHORIZATION_FAILED)", what, principal, context.peer(),
        )
        return False


# --- ssl (the Kafka-protocol listener, Kafka clients) -------------------------------------------


def server_ssl_context(security: ServiceSecurity, sasl: bool = False) -> ssl.SSLContext:
    """A TLS 1.2+ server context for the Kafka-protocol listener: the service's keystore, its
    trust store for client certificates, required when ``ssl.client.auth=required`` on an
    SSL:// door. A SASL_SSL:// door never requires one (Kafka's default there: clients prove
    who they are with SASL); a certificate a client does present is still verified."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(security.keystore)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"ssl.keystore.location: cannot load {security.keystore}: {exc}") from exc
    try:
        context.load_verify_locations(security.truststore)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"ssl.truststore.location: cannot load {security.truststore}: {exc}"
        ) from exc
    required = security.client_auth_required and not sasl
    context.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL
    return context


def ssl_peer_principal(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> Principal:
    """The principal of a Kafka-protocol connection (None or no client certificate:
    ANONYMOUS)."""
    if ssl_object is None:
        return ANONYMOUS
    cert = ssl_object.getpeercert()
    if not cert:
        return ANONYMOUS
    names: list[str] = []
    units: list[str] = []
    subject: Any = cert.get("subject", ())
    for rdn in subject:
        for attribute, value in rdn:
            if attribute == "commonName":
                names.append(value)
            elif attribute == "organizationalUnitName":
                units.append(value)
    return principal_from_certificate_subject(names, units)


def open_blocking_channel(address: str, security: ClientSecurity | None = None) -> grpc.Channel:
    """A synchronous gRPC channel (launcher probes), dialled as :func:`open_channel` dials."""
    security = security or process_client_security()
    if security.uses_tls:
        assert security.tls is not None
        return grpc.secure_channel(address, channel_credentials(security.tls))
    return grpc.insecure_channel(address)


def client_ssl_context(security: ClientSecurity) -> ssl.SSLContext:
    """An ``ssl`` client context for ``security`` (TLS must be on): its CA (else the system's
    roots), its client certificate when it has one, host names checked."""
    assert security.tls is not None
    files = security.tls
    context = ssl.create_default_context(cafile=files.ca)
    if files.certificate and files.key:
        context.load_cert_chain(files.certificate, files.key)
    return context


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
