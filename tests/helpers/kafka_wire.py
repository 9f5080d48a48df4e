"""Raw Kafka-protocol requests over a socket (kafka-python's message classes), for tests that
send one exact request version to a listener."""

from __future__ import annotations

import socket
import struct
from typing import Any

from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from fjord.testing.waiting import wait_for

WAIT_S = 30.0


def connect(address: str, timeout: float = WAIT_S) -> socket.socket:
    """A TCP connection to ``host:port``."""
    host, _, port = address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=timeout)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock``; ConnectionError when it closes first."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def roundtrip(sock: socket.socket, request: Any, response_class: Any, version: int,
              correlation_id: int = 1, client_id: str = "raw-test") -> Any:
    """Send ``request`` at ``version`` and decode the answer (checking its correlation id)."""
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    sock.sendall(request.encode(version=version, header=True, framed=True))
    size = struct.unpack(">i", recv_exactly(sock, 4))[0]
    response = response_class.decode(recv_exactly(sock, size), version=version, header=True)
    assert response.header.correlation_id == correlation_id
    return response


def wait_for_topic(sock: socket.socket, name: str, partitions: int = 1) -> None:
    """Until the broker at ``sock`` shows ``name`` with ``partitions`` partitions in Metadata."""
    cls = MetadataRequest[12]

    def shown() -> bool:
        meta = roundtrip(sock, cls(topics=[cls.MetadataRequestTopic(name=name)],
                                   allow_auto_topic_creation=False), MetadataResponse, 12)
        return meta.topics[0].error_code == 0 and len(meta.topics[0].partitions) == partitions

    wait_for(shown, f"{name} with {partitions} partitions in the broker's metadata")
