"""Security settings with Kafka's names, validated; pure (paths are not opened here).

Clients (``Producer``, ``Consumer``, ``AdminClient``, every ``fjord`` client command through
``--command-config FILE``) take librdkafka's keys:

====================================  ======================================================
``security.protocol``                 ``PLAINTEXT`` (default), ``SSL``, ``SASL_SSL`` or
                                      ``SASL_PLAINTEXT`` (SCRAM logins on the services' SASL
                                      gRPC doors, fjord.sasl_door)
``sasl.mechanism``                    ``SCRAM-SHA-256`` or ``SCRAM-SHA-512`` (required with
                                      SASL; Kafka's default GSSAPI is not served)
``sasl.username``, ``sasl.password``  the SCRAM user and password (required with SASL)
``ssl.ca.location``                   PEM file of the CA certificates to trust (default: the
                                      system's roots)
``ssl.certificate.location``          PEM file of the client certificate (mutual TLS)
``ssl.key.location``                  PEM file of its private key (unencrypted)
``ssl.key.password``                  refused: encrypted keys are not supported
``ssl.endpoint.identification.algorithm``  ``https`` (default, the only one: the server's
                                      certificate must name the host dialled)
====================================  ======================================================

Services (``fjord broker|controller|coordinator --security-config FILE``) take Kafka's broker
keys with the PEM keystore type (files, not inline PEM):

====================================  ======================================================
``ssl.keystore.location``             PEM file with the service's certificate (chain) and its
                                      unencrypted private key; also shown as its client
                                      certificate when it dials other services and etcd
``ssl.truststore.location``           PEM file of the CA certificates to trust for clients,
                                      other services and etcd
``ssl.client.auth``                   ``required`` (default; Kafka's default is ``none``) or
                                      ``none``. Only with ``required`` are inter-broker
                                      requests limited to the cluster service identity
``ssl.keystore.type``                 ``PEM`` only (Kafka's JKS/PKCS12 are refused)
``ssl.keystore.password``,            refused: encrypted keys are not supported
``ssl.key.password``
====================================  ======================================================

The same file may switch authorization on with Kafka's ``authorizer.class.name``,
``super.users`` and ``allow.everyone.if.no.acl.found`` (read by
:meth:`fjord.security.acls.AuthorizerSettings.from_service_config`).

Every error is a :class:`SecurityConfigError` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from fjord.errors import ConfigError


class SecurityConfigError(ConfigError):
    """An invalid or unsupported security setting; ``key`` is the setting's name."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class SecurityProtocol(Enum):
    """Kafka's ``security.protocol`` values."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def uses_tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)


SUPPORTED_PROTOCOLS = tuple(SecurityProtocol)

CLIENT_SECURITY_KEYS = (
    "security.protocol",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "sasl.mechanism",
    "sasl.username",
    "sasl.password",
)
SERVICE_SECURITY_KEYS = (
    "ssl.keystore.location",
    "ssl.keystore.type",
    "ssl.keystore.password",
    "ssl.key.password",
    "ssl.truststore.location",
    "ssl.client.auth",
)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The PEM files one side of a TLS connection uses (paths, not contents).

    ``ca``: trusted CA certificates (None: the system's roots). ``certificate``/``key``: this
    side's own certificate and private key (may be the same file); both or neither.
    """

    ca: str | None = None
    certificate: str | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if (self.certificate is None) != (self.key is None):
            raise ValueError("TlsFiles: certificate and key go together")


@dataclass(frozen=True, slots=True)
class SaslLogin:
    """A client's SCRAM login (``sasl.*``); the password is kept out of ``repr``."""

    mechanism: str
    username: str
    password: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """How a client dials: plaintext, or TLS with ``tls`` (never None with SSL or SASL_SSL);
    ``sasl`` is set exactly with SASL_SSL and SASL_PLAINTEXT."""

    protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    tls: TlsFiles | None = None
    sasl: SaslLogin | None = None

    @property
    def uses_tls(self) -> bool:
        return self.protocol.uses_tls

    @classmethod
    def from_config(cls, config: Mapping[str, object]) -> ClientSecurity:
        """The security part of a client configuration (other keys are ignored here: each
        client validates its own). Raises SecurityConfigError naming the key."""
        protocol = _protocol(config)
        if config.get("ssl.key.password") not in (None, ""):
            raise SecurityConfigError(
                "ssl.key.password", "encrypted private keys are not supported; give an "
                "unencrypted key in ssl.key.location (file permissions protect it)"
            )
        algorithm = str(config.get("ssl.endpoint.identification.algorithm", "https")).lower()
        if algorithm != "https":
            raise SecurityConfigError(
                "ssl.endpoint.identification.algorithm",
                f"only 'https' (verify the server's host name) is supported, got {algorithm!r}",
            )
        sasl = _sasl_login(config) if protocol.value.startswith("SASL_") else None
        if not protocol.uses_tls:
            return cls(protocol, sasl=sasl)
        certificate = _path(config, "ssl.certificate.location")
        key = _path(config, "ssl.key.location")
        if (certificate is None) != (key is None):
            missing = "ssl.key.location" if key is None else "ssl.certificate.location"
            other = "ssl.certificate.location" if key is None else "ssl.key.location"
            raise SecurityConfigError(missing, f"required when {other} is set")
        return cls(protocol, TlsFiles(_path(config, "ssl.ca.location"), certificate, key), sasl)


def _sasl_login(config: Mapping[str, object]) -> SaslLogin:
    mechanism = str(config.get("sasl.mechanism") or "").upper()
    if mechanism not in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        raise SecurityConfigError(
            "sasl.mechanism", "SCRAM-SHA-256 or SCRAM-SHA-512 required with SASL "
            f"(Fjord serves no other), got {mechanism or 'nothing'!r}",
        )
    values = []
    for key in ("sasl.username", "sasl.password"):
        value = config.get(key)
        if not isinstance(value, str) or not value:
            raise SecurityConfigError(key, "required with SASL")
        values.append(value)
    return SaslLogin(mechanism, values[0], values[1])


@dataclass(frozen=True, slots=True)
class ServiceSecurity:
    """A service's TLS settings: its listeners serve TLS with ``keystore``; with
    ``client_auth_required`` every client must show a certificate ``truststore`` accepts.

    Invariant: the same keystore and truststore are used when the service dials other services
    and etcd (:meth:`outbound`), so one certificate is the service's identity both ways.
    """

    keystore: str
    truststore: str
    client_auth_required: bool = True

    @property
    def server_files(self) -> TlsFiles:
        return TlsFiles(self.truststore, self.keystore, self.keystore)

    def outbound(self) -> ClientSecurity:
        """How this service dials others: TLS, its own certificate, its trust store."""
        return ClientSecurity(SecurityProtocol.SSL, self.server_files)

    @classmethod
    def from_config(cls, config: Mapping[str, object]) -> ServiceSecurity:
        """A service's ``--security-config`` entries (every key must be known). Raises
        SecurityConfigError naming the key."""
        from fjord.security.acls import AUTHORIZER_KEYS  # read by AuthorizerSettings

        for key in config:
            if key not in SERVICE_SECURITY_KEYS and key not in AUTHORIZER_KEYS:
                known = ", ".join((*SERVICE_SECURITY_KEYS, *AUTHORIZER_KEYS))
                raise SecurityConfigError(key, f"unknown service security setting (known: {known})")
        for key in ("ssl.keystore.password", "ssl.key.password"):
            if config.get(key) not in (None, ""):
                raise SecurityConfigError(
                    key, "encrypted private keys are not supported; give an unencrypted PEM "
                    "key in ssl.keystore.location (file permissions protect it)"
                )
        kind = str(config.get("ssl.keystore.type", "PEM")).upper()
        if kind != "PEM":
            raise SecurityConfigError(
                "ssl.keystore.type", f"only PEM is supported, got {kind!r} (convert with openssl)"
            )
        keystore = _path(config, "ssl.keystore.location")
        truststore = _path(config, "ssl.truststore.location")
        if keystore is None:
            raise SecurityConfigError("ssl.keystore.location", "required for TLS")
        if truststore is None:
            raise SecurityConfigError("ssl.truststore.location", "required for TLS")
        auth = str(config.get("ssl.client.auth", "required")).lower()
        if auth not in ("required", "none"):
            raise SecurityConfigError(
                "ssl.client.auth", f"expected 'required' or 'none', got {auth!r}"
            )
        return cls(keystore, truststore, auth == "required")


def _protocol(config: Mapping[str, object]) -> SecurityProtocol:
    text = str(config.get("security.protocol", "PLAINTEXT")).upper()
    try:
        protocol = SecurityProtocol(text)
    except ValueError:
        known = ", ".join(p.value for p in SecurityProtocol)
        raise SecurityConfigError(
            "security.protocol", f"expected one of {known}, got {text!r}"
        ) from None
    return protocol


def _path(config: Mapping[str, object], key: str) -> str | None:
    value = config.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise SecurityConfigError(key, f"expected a file path, got {value!r}")
    return value


def parse_properties(text: str, source: str = "properties") -> dict[str, str]:
    """Java properties as Kafka's ``--command-config`` files use them: ``key=value`` or
    ``key: value`` lines, ``#``/``!`` comments, blank lines; surrounding spaces stripped.
    ConfigError names ``source`` and the line for a line without a separator or a repeated key
    (line continuations and escapes are not supported)."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if cut < 0:
            raise ConfigError(f"{source}: line {number}: expected key=value, got {raw!r}")
        key, value = line[:cut].strip(), line[cut + 1 :].strip()
        if key in out:
            raise ConfigError(f"{source}: line {number}: {key} given twice")
        out[key] = value
    return out
