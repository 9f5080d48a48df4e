"""fjord.security: Kafka's security settings validated with errors naming the key, properties
files, and the principal rules (User:<CN>, ANONYMOUS, the cluster service identity)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fjord.errors import ConfigError
from fjord.security import (
    ANONYMOUS,
    SERVICE_IDENTITY_OU,
    ClientSecurity,
    Principal,
    SecurityConfigError,
    SecurityProtocol,
    ServiceSecurity,
    TlsFiles,
    parse_properties,
    principal_from_certificate_subject,
)


def test_plaintext_is_the_default_and_ignores_ssl_keys():
    assert ClientSecurity.from_config({}) == ClientSecurity(SecurityProtocol.PLAINTEXT)
    plain = ClientSecurity.from_config({"ssl.ca.location": "/ca.pem", "bootstrap.servers": "x"})
    assert not plain.uses_tls and plain.tls is None


def test_ssl_with_a_client_certificate():
    security = ClientSecurity.from_config(
        {
            "security.protocol": "ssl",
            "ssl.ca.location": "/ca.pem",
            "ssl.certificate.location": "/c.pem",
            "ssl.key.location": "/k.pem",
        }
    )
    assert security.uses_tls
    assert security.tls == TlsFiles("/ca.pem", "/c.pem", "/k.pem")


def test_sasl_takes_kafkas_names_and_hides_the_password():
    security = ClientSecurity.from_config({
        "security.protocol": "SASL_SSL", "ssl.ca.location": "/ca.pem",
        "sasl.mechanism": "scram-sha-512", "sasl.username": "alice", "sasl.password": "s3cret",
    })
    assert security.uses_tls and security.tls == TlsFiles("/ca.pem")
    assert security.sasl is not None
    assert (security.sasl.mechanism, security.sasl.username) == ("SCRAM-SHA-512", "alice")
    assert "s3cret" not in repr(security)
    plain = ClientSecurity.from_config({
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "bob", "sasl.password": "pw"})
    assert not plain.uses_tls and plain.sasl is not None


def test_ssl_without_anything_trusts_the_system_roots():
    assert ClientSecurity.from_config({"security.protocol": "SSL"}).tls == TlsFiles()


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"security.protocol": "TLS"}, "security.protocol"),
        ({"security.protocol": "SASL_SSL"}, "sasl.mechanism"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI"}, "sasl.mechanism"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}, "sasl.username"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
          "sasl.username": "alice"}, "sasl.password"),
        ({"security.protocol": "SSL", "ssl.certificate.location": "/c"}, "ssl.key.location"),
        ({"security.protocol": "SSL", "ssl.key.location": "/k"}, "ssl.certificate.location"),
        ({"security.protocol": "SSL", "ssl.ca.location": 7}, "ssl.ca.location"),
        ({"ssl.key.password": "secret"}, "ssl.key.password"),
        (
            {"ssl.endpoint.identification.algorithm": "none"},
            "ssl.endpoint.identification.algorithm",
        ),
    ],
)
def test_client_errors_name_the_key(config, key):
    with pytest.raises(SecurityConfigError) as info:
        ClientSecurity.from_config(config)
    assert info.value.key == key
    assert str(info.value).startswith(f"{key}: ")
    assert isinstance(info.value, ConfigError)


def test_service_security_defaults_to_required_client_auth_and_dials_with_its_identity():
    service = ServiceSecurity.from_config(
        {"ssl.keystore.location": "/svc.pem", "ssl.truststore.location": "/ca.pem"}
    )
    assert service.client_auth_required
    assert service.outbound() == ClientSecurity(
        SecurityProtocol.SSL, TlsFiles("/ca.pem", "/svc.pem", "/svc.pem")
    )
    relaxed = ServiceSecurity.from_config(
        {
            "ssl.keystore.location": "/svc.pem",
            "ssl.truststore.location": "/ca.pem",
            "ssl.client.auth": "NONE",
            "ssl.keystore.type": "pem",
        }
    )
    assert not relaxed.client_auth_required


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"ssl.truststore.location": "/ca"}, "ssl.keystore.location"),
        ({"ssl.keystore.location": "/k"}, "ssl.truststore.location"),
        ({"ssl.keystore.location": "/k", "ssl.truststore.location": "/c",
          "ssl.client.auth": "requested"}, "ssl.client.auth"),
        ({"ssl.keystore.location": "/k", "ssl.truststore.location": "/c",
          "ssl.keystore.type": "JKS"}, "ssl.keystore.type"),
        ({"ssl.keystore.location": "/k", "ssl.truststore.location": "/c",
          "ssl.keystore.password": "x"}, "ssl.keystore.password"),
        ({"ssl.keystore.location": "/k", "ssl.truststore.location": "/c",
          "ssl.cipher.suites": "x"}, "ssl.cipher.suites"),
    ],
)
def test_service_errors_name_the_key(config, key):
    with pytest.raises(SecurityConfigError) as info:
        ServiceSecurity.from_config(config)
    assert info.value.key == key


def test_properties_files():
    text = "# comment\n! also\n\nsecurity.protocol = SSL\nssl.ca.location: /a=b.pem\n"
    assert parse_properties(text) == {"security.protocol": "SSL", "ssl.ca.location": "/a=b.pem"}
    with pytest.raises(ConfigError, match=r"client\.properties: line 2: expected key=value"):
        parse_properties("a=1\nnonsense\n", "client.properties")
    with pytest.raises(ConfigError, match="line 2: a given twice"):
        parse_properties("a=1\na=2\n")


@given(st.dictionaries(
    st.from_regex(r"[a-z][a-z.]{0,20}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9/._=:-]{0,30}", fullmatch=True).map(str.strip),
))
def test_properties_round_trip(entries):
    text = "".join(f"{key}={value}\n" for key, value in entries.items())
    assert parse_properties(text) == entries


def test_principals():
    alice = principal_from_certificate_subject(["alice"], ["team-a"])
    assert str(alice) == "User:alice" and not alice.is_service
    service = principal_from_certificate_subject(["broker-1"], ["x", SERVICE_IDENTITY_OU])
    assert str(service) == "User:broker-1" and service.is_service
    assert service != Principal("broker-1")  # a client with a service's CN is not a service
    assert principal_from_certificate_subject([], [SERVICE_IDENTITY_OU]) is ANONYMOUS
    assert principal_from_certificate_subject([""], []) is ANONYMOUS
    assert str(ANONYMOUS) == "User:ANONYMOUS" and not ANONYMOUS.is_service
    assert Principal.parse("User:bob") == Principal("bob")
    for bad in ("bob", "User:", "Group:x"):
        with pytest.raises(ConfigError, match="principal"):
            Principal.parse(bad)
