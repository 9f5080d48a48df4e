"""Security settings and identities, pure (no I/O, no TLS library): what a client or service is
configured with (Kafka's names) and who a peer is (:class:`Principal`).

The TLS shell that loads files and builds gRPC credentials and ``ssl`` contexts is
:mod:`fjord.tls`; the authorization layers (ACLs, SCRAM) build on :class:`Principal`.
"""

from fjord.security.config import (
    CLIENT_SECURITY_KEYS,
    SERVICE_SECURITY_KEYS,
    ClientSecurity,
    SecurityConfigError,
    SecurityProtocol,
    ServiceSecurity,
    TlsFiles,
    parse_properties,
)
from fjord.security.principal import (
    ANONYMOUS,
    SERVICE_IDENTITY_OU,
    Principal,
    principal_from_certificate_subject,
)

__all__ = [
    "ANONYMOUS",
    "CLIENT_SECURITY_KEYS",
    "SERVICE_IDENTITY_OU",
    "SERVICE_SECURITY_KEYS",
    "ClientSecurity",
    "Principal",
    "SecurityConfigError",
    "SecurityProtocol",
    "ServiceSecurity",
    "TlsFiles",
    "parse_properties",
    "principal_from_certificate_subject",
]
