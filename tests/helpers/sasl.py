"""Shared by the SASL tests on a ``fjord local up --secure --sasl`` cluster
(tests/integration/test_sasl.py, test_sasl_reauth.py) and a plaintext ``fjord local up
--sasl`` one (test_sasl_plaintext.py): client settings for the SASL_SSL Kafka listener and
the SASL gRPC doors (SASL_SSL, or SASL_PLAINTEXT on a cluster without TLS), and raw Kafka
frames over TLS."""

from __future__ import annotations

import queue
import socket
import ssl
import struct
from collections.abc import Iterator

import grpc
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
)
from scramp import ScramClient

from fjord._proto import sasl_pb2, sasl_pb2_grpc
from fjord.local.cluster import LocalCluster


def admin_config(cluster: LocalCluster) -> dict[str, object]:
    return {"bootstrap.servers": cluster.bootstrap_servers, **cluster.client_config}


def sasl_conf(cluster: LocalCluster, user: str, password: str, mechanism: str = "SCRAM-SHA-512"
              ) -> dict[str, object]:
    return {
        "bootstrap.servers": cluster.kafka_bootstrap_servers, "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(cluster.data_dir / "tls" / "ca.pem"),
        "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password,
    }


def tls_socket(cluster: LocalCluster) -> ssl.SSLSocket:
    host, _, port = cluster.kafka_bootstrap_servers.split(",")[0].rpartition(":")
    context = ssl.create_default_context(cafile=str(cluster.data_dir / "tls" / "ca.pem"))
    context.check_hostname = False
    raw = socket.create_connection((host, int(port)), timeout=15)
    return context.wrap_socket(raw)


def closed(sock: ssl.SSLSocket) -> bool:
    """True when the server closed the connection (after reading any answers it sent)."""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True
    except (ConnectionError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


def frame(request: object, version: int) -> bytes:
    request.with_header(correlation_id=1, client_id="bad")  # type: ignore[attr-defined]
    return bytes(request.encode(version=version, header=True, framed=True))  # type: ignore[attr-defined]


def read_frame(sock: ssl.SSLSocket) -> bytes:
    size = b""
    while len(size) < 4:
        chunk = sock.recv(4 - len(size))
        if not chunk:
            raise ConnectionError("closed")
        size += chunk
    body = b""
    (length,) = struct.unpack(">i", size)
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    return size + body


def scram_login(sock: ssl.SSLSocket, user: str, password: str) -> object | None:
    """A SCRAM-SHA-512 login on a raw Kafka connection with scramp's client: the final
    SaslAuthenticate (v2) answer, None when the login was refused."""
    client = ScramClient(["SCRAM-SHA-512"], user, password)
    sock.sendall(frame(SaslHandshakeRequest[1](mechanism="SCRAM-SHA-512"), 1))
    read_frame(sock)
    sock.sendall(frame(SaslAuthenticateRequest[2](
        auth_bytes=client.get_client_first().encode()), 2))
    first = SaslAuthenticateResponse.decode(read_frame(sock)[4:], version=2, header=True)
    if first.error_code:
        return None
    client.set_server_first(first.auth_bytes.decode())
    sock.sendall(frame(SaslAuthenticateRequest[2](
        auth_bytes=client.get_client_final().encode()), 2))
    final = SaslAuthenticateResponse.decode(read_frame(sock)[4:], version=2, header=True)
    if final.error_code:
        return None
    client.set_server_final(final.auth_bytes.decode())  # the server proved it knows the key
    return final


def logs_in(cluster: LocalCluster, user: str, password: str) -> bool:
    """One login on the broker's SASL_SSL door (the broker's image may learn a new
    credential a moment after the controller wrote it)."""
    with tls_socket(cluster) as sock:
        return scram_login(sock, user, password) is not None


def door_client_config(cluster: LocalCluster, user: str, password: str, **extra: object
                       ) -> dict[str, object]:
    """fjord.client's settings for the SASL gRPC door: Kafka's names, no certificate;
    SASL_SSL on a secure cluster, SASL_PLAINTEXT (no ``ssl.*``) on a plaintext one."""
    tls: dict[str, object] = (
        {"security.protocol": "SASL_SSL",
         "ssl.ca.location": str(cluster.data_dir / "tls" / "ca.pem")}
        if cluster.secure else {"security.protocol": "SASL_PLAINTEXT"})
    return {
        "bootstrap.servers": cluster.sasl_grpc_bootstrap_servers, **tls,
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": password,
        **extra,
    }


def sasl_grpc_channel(cluster: LocalCluster, role: str = "broker", node_id: int = 0
                      ) -> grpc.Channel:
    """A channel to a process's SASL gRPC door (broker 0's by default): TLS showing no client
    certificate on a secure cluster, plaintext on a plaintext one."""
    address = cluster.sasl_grpc_address(role, node_id)
    if not cluster.secure:
        return grpc.insecure_channel(address)
    ca = (cluster.data_dir / "tls" / "ca.pem").read_bytes()
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=ca))


def grpc_login(channel: grpc.Channel, user: str, password: str,
               mechanism: str = "SCRAM-SHA-512") -> sasl_pb2.SaslAuthenticateResponse:
    """One SCRAM exchange over ``Sasl/Authenticate``: the last answer (its session_token on
    success, its error otherwise)."""
    client = ScramClient([mechanism], user, password)
    outbox: queue.Queue[sasl_pb2.SaslAuthenticateRequest | None] = queue.Queue()

    def requests() -> Iterator[sasl_pb2.SaslAuthenticateRequest]:
        while (item := outbox.get(timeout=15)) is not None:
            yield item

    outbox.put(sasl_pb2.SaslAuthenticateRequest(
        mechanism=mechanism, auth_bytes=client.get_client_first().encode()))
    answers = sasl_pb2_grpc.SaslStub(channel).Authenticate(requests(), timeout=15)
    first = next(answers)
    if first.error.code:
        outbox.put(None)
        return first
    client.set_server_first(first.auth_bytes.decode())
    outbox.put(sasl_pb2.SaslAuthenticateRequest(auth_bytes=client.get_client_final().encode()))
    final = next(answers)
    outbox.put(None)
    if not final.error.code:
        client.set_server_final(final.auth_bytes.decode())  # the server proved it knows us too
    return final
