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
from fjord.security.certificates import CertificateAuthority
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


def test_kafka_listener_over_tls_hands_handlers_the_principal(tmp_path: Path) -> None:
    """An SSL:// listener (in-process, real sockets): a client certificate's principal reaches
    the handler's RequestContext; the service certificate is the service identity."""
    import asyncio
    import ssl
    import struct
    from typing import Any

    from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse

    from fjord.kafka.dispatch import Api, KafkaDispatcher, RequestContext
    from fjord.kafka.server import KafkaListener
    from fjord.security import Principal
    from fjord.tls import client_ssl_context

    pki = LocalPki(tmp_path)
    _, properties = pki.service_files("broker", 0)
    service = ServiceSecurity.from_config(parse_properties(properties.read_text()))
    client = ClientSecurity.from_config(parse_properties(pki.client_properties().read_text()))
    seen: list[Principal] = []

    async def handler(request: Any, ctx: RequestContext) -> Any:
        seen.append(ctx.principal)
        return MetadataResponse[0](brokers=[], topics=[])

    async def scenario() -> None:
        listener = KafkaListener(
            KafkaDispatcher([Api(3, 0, 0, MetadataRequest, handler)]), "127.0.0.1", 0,
            ssl_context=server_ssl_context(service),
        )
        port = await listener.start()
        try:
            for context in (client_ssl_context(client), _service_client_context(service)):
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=context, server_hostname="localhost"
                )
                request = MetadataRequest[0](topics=[])
                request.with_header(correlation_id=7, client_id="t")
                writer.write(bytes(request.encode(version=0, header=True, framed=True)))
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                await reader.readexactly(size)
                writer.close()
                await writer.wait_closed()
        finally:
            await listener.stop()

    def _service_client_context(security: ServiceSecurity) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=security.truststore)
        context.load_cert_chain(security.keystore)
        return context

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert [str(p) for p in seen] == ["User:admin", "User:broker-0"]
    assert [p.is_service for p in seen] == [False, True]


def test_a_ca_bundle_serves_grpc_mutual_tls_with_either_ca(tmp_path: Path) -> None:
    """A truststore holding two CAs (the operator's bundle during a cluster CA renewal): a
    gRPC service and client of fjord.tls complete mutual TLS whichever of the two signed each
    side's certificate (the server of one, the client of the other); a certificate of a third
    CA is refused."""
    import asyncio

    import grpc
    from grpc import aio

    from fjord.security import SecurityProtocol
    from fjord.tls import bind_port, open_channel

    old, new, stranger = (make_ca(f"fjord cluster CA ns/fj {i}") for i in range(3))
    bundle = tmp_path / "ca.crt"
    bundle.write_bytes(old.pem() + new.pem())

    def keystore(name: str, ca: CertificateAuthority) -> str:
        cert, key = ca.issue(name, organizational_unit=SERVICE_IDENTITY_OU)
        # A file per CA: fjord.tls caches a client's credentials by their paths.
        path = tmp_path / f"{name}-{ca.certificate.serial_number}.pem"
        path.write_bytes(cert + key)
        return str(path)

    echo = grpc.method_handlers_generic_handler(
        "test.Echo", {"Say": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)}
    )

    async def call(server_ca: CertificateAuthority, client_ca: CertificateAuthority) -> bytes:
        server = aio.server()
        server.add_generic_rpc_handlers((echo,))
        port = bind_port(server, "127.0.0.1:0",
                         ServiceSecurity(keystore("server", server_ca), str(bundle)))
        await server.start()
        client = keystore("client", client_ca)
        security = ClientSecurity(SecurityProtocol.SSL, TlsFiles(str(bundle), client, client))
        try:
            async with open_channel(f"localhost:{port}", security) as channel:
                say = channel.unary_unary("/test.Echo/Say")
                return bytes(await say(b"hello", timeout=10))
        finally:
            await server.stop(None)

    assert asyncio.run(call(new, old)) == b"hello"
    assert asyncio.run(call(old, new)) == b"hello"
    with pytest.raises(aio.AioRpcError) as refused:
        asyncio.run(call(new, stranger))
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
