"""A cluster CA and certificates for ``fjord local up --secure`` (and the security tests), made
with the ``cryptography`` library: EC P-256 keys (fast to make), SHA-256 signatures.

Layout of ``<data_dir>/tls/`` (files written 0600, the directory 0700):

- ``ca.pem`` / ``ca.key``: the cluster CA (the key never leaves this directory);
- ``<role>-<id>.pem``: a service's certificate and key in one PEM (Kafka's PEM keystore), subject
  ``CN=<role>-<id>, OU=fjord-service`` (the cluster service identity), SANs ``localhost`` and
  ``127.0.0.1``; ``<role>-<id>.properties``: its ``--security-config``;
- ``client.pem`` / ``client.key``: a client certificate ``CN=admin`` (principal
  ``User:admin``, not a service identity); ``<data_dir>/client.properties`` points at them.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fjord.security import SERVICE_IDENTITY_OU
from fjord.security.acls import AUTHORIZER_CLASS_NAMES
from fjord.security.certificates import (
    LOCAL_CERT_VALIDITY,
    LOCAL_SANS,
    CertificateAuthority,
    make_ca,
    private_key_pem,
)
from fjord.tls import write_private

__all__ = [
    "CLIENT_CN",
    "LOCAL_CERT_VALIDITY",
    "LOCAL_SANS",
    "CertificateAuthority",
    "LocalPki",
    "load_ca",
    "make_ca",
    "write_private",
]

CLIENT_CN = "admin"


def load_ca(directory: Path) -> CertificateAuthority:
    cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return CertificateAuthority(cert, key)



class LocalPki:
    """The CA and certificates of a secure local cluster under ``<data_dir>/tls``.

    Invariant: the CA is made once per data directory and reused by later starts (clients'
    ``client.properties`` stay valid); service certificates are made on demand, one per
    process, all carrying the service identity.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.directory = data_dir / "tls"
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        if (self.directory / "ca.pem").exists() and (self.directory / "ca.key").exists():
            self.ca = load_ca(self.directory)
        else:
            self.ca = make_ca()
            write_private(self.directory / "ca.key", private_key_pem(self.ca.key))
            write_private(self.directory / "ca.pem", self.ca.pem())

    @property
    def ca_path(self) -> Path:
        return self.directory / "ca.pem"

    def service_files(
        self, role: str, node_id: int, authorization: bool = False
    ) -> tuple[Path, Path]:
        """(keystore PEM, ``--security-config`` file) of ``role`` ``node_id``; made when
        missing. ``authorization``: the file also switches Kafka's ACL authorizer on, with the
        client certificate's ``User:admin`` as the one super user (rewritten each time, so a
        restart follows the flag)."""
        name = f"{role}-{node_id}"
        keystore = self.directory / f"{name}.pem"
        properties = self.directory / f"{name}.properties"
        if not keystore.exists():
            cert, key = self.ca.issue(name, organizational_unit=SERVICE_IDENTITY_OU)
            write_private(keystore, cert + key)
        text = (
            f"ssl.keystore.location={keystore}\n"
            f"ssl.truststore.location={self.ca_path}\n"
            "ssl.client.auth=required\n"
        )
        if authorization:
            text += (
                f"authorizer.class.name={AUTHORIZER_CLASS_NAMES[0]}\n"
                f"super.users=User:{CLIENT_CN}\n"
            )
        if not properties.exists() or properties.read_text() != text:
            properties.write_text(text)
        return keystore, properties

    def mounted_service_properties(self, directory: Path, authorization: bool = False) -> Path:
        """The ``--security-config`` of a process whose keystore and truststore are the
        ``service.pem`` and ``ca.crt`` in ``directory`` (a mounted Kubernetes Secret), written
        there as ``local.properties``."""
        text = (
            f"ssl.keystore.location={directory / 'service.pem'}\n"
            f"ssl.truststore.location={directory / 'ca.crt'}\n"
            "ssl.client.auth=required\n"
        )
        if authorization:
            text += (
                f"authorizer.class.name={AUTHORIZER_CLASS_NAMES[0]}\n"
                f"super.users=User:{CLIENT_CN}\n"
            )
        properties = directory / "local.properties"
        properties.write_text(text)
        return properties

    def client_properties(self) -> Path:
        """``<data_dir>/client.properties`` for a ``User:admin`` client (made when missing)."""
        cert_path, key_path = self.directory / "client.pem", self.directory / "client.key"
        if not cert_path.exists() or not key_path.exists():
            cert, key = self.ca.issue(CLIENT_CN)
            write_private(cert_path, cert)
            write_private(key_path, key)
        path = self.data_dir / "client.properties"
        path.write_text(
            "# fjord local up --secure: mutual TLS as User:admin (Kafka's client names)\n"
            "security.protocol=SSL\n"
            f"ssl.ca.location={self.ca_path}\n"
            f"ssl.certificate.location={cert_path}\n"
            f"ssl.key.location={key_path}\n"
        )
        return path
