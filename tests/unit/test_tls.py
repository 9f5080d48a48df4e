"""fjord.tls on real PEM files: principals of certificates, the combined keystore split, file
errors naming the key; fjord.local.certs' layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from fjord.errors import ConfigError
from fjord.local.certs import LocalPki, make_ca
from fjord.security import (
    SERVICE_IDENTITY_OU,
    ClientSecurity,
    ServiceSecurity,
    TlsFiles,
    parse_properties,
)
from fjord.tls import load_tls, principal_from_pem, server_ssl_context


def test_principals_of_certificates() -> None:
    ca = make_ca()
    service, _ = ca.issue("broker-0", organizational_unit=SERVICE_IDENTITY_OU)
    client, _ = ca.issue("alice", organizational_unit="team-a")
    assert str(principal_from_pem(service)) == "User:broker-0"
    assert principal_from_pem(service).is_service
    assert str(principal_from_pem(client)) == "User:alice"
    assert not principal_from_pem(client).is_service


def test_local_pki_files_load_and_serve(tmp_path: Path) -> None:
    pki = LocalPki(tmp_path)
    keystore, properties = pki.service_files("broker", 0)
    assert (tmp_path / "tls").stat().st_mode & 0o777 == 0o700
    assert keystore.stat().st_mode & 0o777 == 0o600
    security = ServiceSecurity.from_config(parse_properties(properties.read_text()))
    material = load_tls(security.server_files)
    assert material.chain is not None and material.chain.count(b"BEGIN CERTIFICATE") == 1
    assert material.key is not None and b"PRIVATE KEY" in material.key
    assert principal_from_pem(material.chain).is_service
    server_ssl_context(security)  # loads
    client = ClientSecurity.from_config(parse_properties(pki.client_properties().read_text()))
    assert client.uses_tls and client.tls is not None
    assert str(principal_from_pem(Path(client.tls.certificate or "").read_bytes())) == "User:admin"
    assert LocalPki(tmp_path).ca.pem() == pki.ca.pem()  # the CA is made once per directory


def test_unreadable_or_wrong_files_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"ssl\.keystore\.location certificate: cannot read"):
        load_tls(TlsFiles(None, str(tmp_path / "none.pem"), str(tmp_path / "none.pem")),
                 "ssl.keystore.location")
    cert, _ = make_ca().issue("x")
    (tmp_path / "cert-only.pem").write_bytes(cert)
    with pytest.raises(ConfigError, match="no PEM private key"):
        path = str(tmp_path / "cert-only.pem")
        load_tls(TlsFiles(None, path, path))
    bad = ServiceSecurity(str(tmp_path / "cert-only.pem"), str(tmp_path / "cert-only.pem"))
    with pytest.raises(ConfigError, match=r"ssl\.keystore\.location"):
        server_ssl_context(bad)
