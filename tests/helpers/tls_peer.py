"""What certificate a TLS service presents: the rotation proofs check each broker serves the
renewed one after its restart."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

from cryptography import x509


def served_certificate(
    address: str, ca: Path, client_cert: Path, client_key: Path
) -> x509.Certificate:
    """The certificate the gRPC door at ``address`` presents (a TLS handshake with a client
    certificate, ALPN h2, as gRPC clients connect)."""
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(client_cert, client_key)
    context.set_alpn_protocols(["h2"])
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as conn:
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)
