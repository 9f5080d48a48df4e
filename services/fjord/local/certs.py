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

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fjord.security import SERVICE_IDENTITY_OU
from fjord.security.acls import AUTHORIZER_CLASS_NAMES

#: How long certificates made here are valid: a local cluster is for development.
LOCAL_CERT_VALIDITY = datetime.timedelta(days=365)
LOCAL_SANS = ("localhost", "127.0.0.1", "::1")
CLIENT_CN = "admin"


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA's certificate and key, in memory (:func:`make_ca`); :meth:`issue` signs leaves."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        """The CA's private key, PEM (PKCS#8, unencrypted): only for where the CA is kept."""
        return _key_pem(self.key)

    @classmethod
    def from_pem(cls, certificate: bytes, key: bytes) -> CertificateAuthority:
        """A CA from its PEM certificate and key; ValueError when they are not a CA's pair."""
        cert = x509.load_pem_x509_certificate(certificate)
        private = serialization.load_pem_private_key(key, None)
        if not isinstance(private, ec.EllipticCurvePrivateKey):
            raise ValueError("the CA key is not an EC private key")
        spki = (serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        if cert.public_key().public_bytes(*spki) != private.public_key().public_bytes(*spki):
            raise ValueError("the CA key does not belong to the CA certificate")
        return cls(cert, private)

    def issue(
        self,
        common_name: str,
        *,
        organizational_unit: str | None = None,
        sans: Sequence[str] = LOCAL_SANS,
        not_before: datetime.datetime | None = None,
        not_after: datetime.datetime | None = None,
    ) -> tuple[bytes, bytes]:
        """A leaf certificate for ``common_name`` (server and client use) and its key, as
        (certificate PEM, key PEM). ``not_before``/``not_after`` default to now .. a year."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organizational_unit:
            attributes.append(
                x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, organizational_unit)
            )
        names: list[x509.GeneralName] = []
        for san in sans:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(san)))
            except ValueError:
                names.append(x509.DNSName(san))
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before or now - datetime.timedelta(minutes=5))
            .not_valid_after(not_after or now + LOCAL_CERT_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def make_ca(
    common_name: str = "fjord local CA",
    *,
    validity: datetime.timedelta = LOCAL_CERT_VALIDITY,
    now: datetime.datetime | None = None,
) -> CertificateAuthority:
    """A self-signed CA valid from ``now`` (default: the clock) for ``validity``."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = now or datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(cert, key)


def load_ca(directory: Path) -> CertificateAuthority:
    cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return CertificateAuthority(cert, key)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


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
            write_private(self.directory / "ca.key", _key_pem(self.ca.key))
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
