"""A Kubernetes 1.20 server-side-apply bug, bridged for Spark 4's submission client only.

Spark 4's spark-submit creates the driver's Service (and ConfigMap) with server-side apply. The
Service's ports name no ``protocol`` (optional, default TCP), and a 1.20 server refuses such an
apply: "failed to create typed patch object: .spec.ports: element 0: associative list with keys
has an element that omits key field "protocol"" (kubernetes-sigs/structured-merge-diff#183;
fixed in Kubernetes 1.21, where the server defaults the key before building the patch). The
chart's supported range (>= 1.27) has the fix; the 1.20 built here does not.

:class:`ApplyProtocolShim` is an HTTPS reverse proxy in front of the real API server that does
what 1.21 does on the server and nothing else: in a server-side apply (PATCH, content type
``application/apply-patch+yaml``) of a Service, every port without ``protocol`` gets ``TCP``.
Every other request and every answer pass unchanged (streamed answers re-chunked as they
arrive; WebSocket upgrades, fabric8's watches, tunnelled byte for byte); the client's
own credentials go through (the proxy adds none). :attr:`rewritten` counts the applies it
changed, so a test can show the bridge was needed and used.

Invariants: listens on a free loopback port with a certificate from the server's CA; every
upstream socket has a bound (WATCH_TIMEOUT_S for streams); :meth:`stop` closes the listener.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import socket
import ssl
import threading
from typing import Any

import yaml

from tests.k8s.kube.apiserver import RealKube

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
#: Bound of one upstream exchange; watches (spark-submit follows its driver pod) stream longer.
REQUEST_TIMEOUT_S = 60.0
WATCH_TIMEOUT_S = 900.0
#: Hop-by-hop headers a proxy must not forward (RFC 9110 7.6.1), and the length it recomputes.
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "content-length"}


def default_service_port_protocols(body: Any) -> bool:
    """Give every port of a Service object without ``protocol`` the default ``TCP``, in place
    (what a 1.21+ server does before building a server-side-apply patch). True if changed."""
    if not isinstance(body, dict) or body.get("kind") != "Service":
        return False
    changed = False
    for port in (body.get("spec") or {}).get("ports") or []:
        if isinstance(port, dict) and "protocol" not in port:
            port["protocol"] = "TCP"
            changed = True
    return changed


class ApplyProtocolShim:
    """See the module docstring. ``url`` is what the client is pointed at."""

    def __init__(self, kube: RealKube) -> None:
        self.kube = kube
        self.port = 0
        self.rewritten = 0
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        assert self.kube.pki is not None, "the API server is not started"
        serving = self.kube.pki.issue(
            "apply-shim", "fjord-apply-shim", server_names=("localhost",), server_ips=("127.0.0.1",)
        )
        handler = _handler(self)
        # Port 0: the kernel picks a free port as it binds (a port picked first could be taken
        # by another process before the bind).
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = int(server.server_address[1])
        server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(serving.cert, serving.key)
        context.set_alpn_protocols(["http/1.1"])
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="apply-shim")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(REQUEST_TIMEOUT_S)

    def upstream(self, watch: bool) -> http.client.HTTPSConnection:
        context = ssl.create_default_context(cafile=str(self.kube.ca_path))
        return http.client.HTTPSConnection(
            "127.0.0.1",
            self.kube.port,
            context=context,
            timeout=WATCH_TIMEOUT_S if watch else REQUEST_TIMEOUT_S,
        )


def _handler(shim: ApplyProtocolShim) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, chunked answers

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request would drown the test output

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if self.headers.get("Upgrade"):  # a WebSocket watch: tunnelled byte for byte
                self._tunnel(body)
                return
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if body and self.command == "PATCH" and content_type == APPLY_CONTENT_TYPE:
                document = yaml.safe_load(body)  # JSON or YAML, both are YAML
                if default_service_port_protocols(document):
                    shim.rewritten += 1
                    body = json.dumps(document).encode()
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_HEADERS}
            headers.pop("Host", None)
            if body is not None:
                headers["Content-Length"] = str(len(body))
            upstream = shim.upstream(watch="watch=" in self.path)
            try:
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                self.send_response(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_HEADERS:
                        self.send_header(key, value)
                if answer.getheader("Content-Length") is not None:
                    data = answer.read()
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                # Streamed (a watch, or a chunked answer): re-chunk as it arrives.
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while chunk := answer.read1(65536):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            finally:
                upstream.close()

        def _tunnel(self, body: bytes | None) -> None:
            """Send the request as it came and relay both directions until either side
            closes (the connection serves nothing else afterwards)."""
            self.close_connection = True
            context = ssl.create_default_context(cafile=str(shim.kube.ca_path))
            raw = socket.create_connection(("127.0.0.1", shim.kube.port), REQUEST_TIMEOUT_S)
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as upstream:
                upstream.settimeout(WATCH_TIMEOUT_S)
                head = f"{self.requestline}\r\n" + "".join(
                    f"{k}: {v}\r\n" for k, v in self.headers.items()
                )
                upstream.sendall(head.encode("latin-1") + b"\r\n" + (body or b""))
                self.connection.settimeout(WATCH_TIMEOUT_S)
                back = threading.Thread(
                    target=_relay, args=(upstream, self.connection), daemon=True
                )
                back.start()
                _relay(self.connection, upstream)
                back.join(REQUEST_TIMEOUT_S)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    return Handler


def _relay(source: socket.socket, target: socket.socket) -> None:
    """Copy bytes from ``source`` to ``target`` until ``source`` ends; then end ``target``."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            target.sendall(data)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_RDWR)
