"""What certificate a TLS service presents (the rotation proofs check each broker serves the
renewed one after its restart), and a TLS handshake between two contexts in memory."""

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


def memory_handshake(server: ssl.SSLContext, client: ssl.SSLContext, hostname: str) -> None:
    """A TLS handshake in memory (no sockets); raises ssl.SSLError when the client refuses."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client_side = client.wrap_bio(c_in, c_out, server_hostname=hostname)
    server_side = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, side in (("client", client_side), ("server", server_side)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return
    raise AssertionError("handshake did not finish")
