"""Certificates made with the ``cryptography`` library, no I/O: a CA (:func:`make_ca`,
:class:`CertificateAuthority`, EC P-256 keys, SHA-256 signatures) that signs leaf certificates
for servers and clients. Shared by ``fjord local up --secure`` (fjord.local.certs, which writes
them to files) and the Kubernetes operator (which keeps them in Secrets)."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: How long certificates made here are valid: a local cluster is for development.
LOCAL_CERT_VALIDITY = datetime.timedelta(days=365)
LOCAL_SANS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA's certificate and key, in memory (:func:`make_ca`); :meth:`issue` signs leaves."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        """The CA's private key, PEM (PKCS#8, unencrypted): only for where the CA is kept."""
        return private_key_pem(self.key)

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
            # Names the issuing key: while a renewed CA and its predecessor are both trusted,
            # a verifier picks the right one even where their subjects are alike.
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), private_key_pem(key)


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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(cert, key)


def private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
