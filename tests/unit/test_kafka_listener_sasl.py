"""The Kafka listener's shell with SASL (a SASL_PLAINTEXT:// door), in-process on real sockets:
ApiVersions advertises SaslHandshake/SaslAuthenticate, a SCRAM login with scramp's client makes
the connection's requests run as User:<name>, a request before login or a huge frame closes only
that connection. The same door in real processes (SASL_SSL, confluent-kafka):
tests/integration/test_sasl.py."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from scramp import ScramClient

from fjord.kafka.dispatch import Api, KafkaDispatcher, RequestContext
from fjord.kafka.server import KafkaListener, SaslSettings
from fjord.security.scram import ScramCredential

WAIT_S = 10.0
CREDENTIAL = ScramCredential.from_password("SCRAM-SHA-256", "pw")


async def whoami(request: Any, ctx: RequestContext) -> Any:
    """Metadata answering the caller's principal name as its cluster id."""
    return MetadataResponse[ctx.api_version](
        brokers=[], cluster_id=ctx.principal.name, controller_id=-1, topics=[])


@asynccontextmanager
async def sasl_door() -> AsyncIterator[int]:
    listener = KafkaListener(
        KafkaDispatcher([Api(3, 4, 4, MetadataRequest, whoami)]), "127.0.0.1", 0, name="sasl",
        sasl=SaslSettings(lambda m, u: CREDENTIAL if (m, u) == ("SCRAM-SHA-256", "ann")
                          else None),
    )
    port = await listener.start()
    try:
        yield port
    finally:
        await listener.stop()
        assert listener.connection_count == 0


async def roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: Any,
                    response_class: Any, version: int) -> Any:
    request.with_header(correlation_id=7, client_id="t")
    writer.write(bytes(request.encode(version=version, header=True, framed=True)))
    await writer.drain()
    size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), WAIT_S))[0]
    return response_class.decode(await reader.readexactly(size), version=version, header=True)


async def closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(1), WAIT_S) == b""


def test_scram_login_runs_requests_as_the_user_and_bad_input_closes() -> None:
    async def main() -> None:
        async with sasl_door() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            versions = await roundtrip(reader, writer, ApiVersionsRequest[3](
                client_software_name="t", client_software_version="1"), ApiVersionsResponse, 3)
            advertised = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
            assert advertised[17] == (1, 1) and advertised[36] == (0, 2)
            handshake = await roundtrip(reader, writer, SaslHandshakeRequest[1](
                mechanism="SCRAM-SHA-256"), SaslHandshakeResponse, 1)
            assert handshake.error_code == 0
            client = ScramClient(["SCRAM-SHA-256"], "ann", "pw")
            first = await roundtrip(reader, writer, SaslAuthenticateRequest[2](
                auth_bytes=client.get_client_first().encode()), SaslAuthenticateResponse, 2)
            client.set_server_first(first.auth_bytes.decode())
            final = await roundtrip(reader, writer, SaslAuthenticateRequest[2](
                auth_bytes=client.get_client_final().encode()), SaslAuthenticateResponse, 2)
            assert final.error_code == 0
            client.set_server_final(final.auth_bytes.decode())
            me = await roundtrip(reader, writer, MetadataRequest[4](topics=None),
                                 MetadataResponse, 4)
            assert me.cluster_id == "ann"
            # Another connection: Metadata before login closes it; a huge frame too.
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)
            request = MetadataRequest[4](topics=None)
            request.with_header(correlation_id=1, client_id="t")
            w2.write(bytes(request.encode(version=4, header=True, framed=True)))
            assert await closed(r2)
            w2.close()
            r3, w3 = await asyncio.open_connection("127.0.0.1", port)
            w3.write(struct.pack(">i", 600_000) + b"\0" * 16)
            assert await closed(r3)
            w3.close()
            # The logged-in connection goes on.
            again = await roundtrip(reader, writer, MetadataRequest[4](topics=None),
                                    MetadataResponse, 4)
            assert again.cluster_id == "ann"
            writer.close()

    asyncio.run(main())
