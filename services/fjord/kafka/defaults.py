"""Every default of the Kafka-protocol listener, defined once (Kafka's names and values).

A broker opens its Kafka listener when ``--listeners`` names one (``KAFKA://HOST:PORT``);
``fjord local up`` always does, on a free loopback port per process.
"""

from __future__ import annotations

#: Listener name of Fjord's native gRPC door, as written in ``listeners``.
GRPC_LISTENER = "GRPC"
#: Listener name of the Kafka-protocol door, as written in ``listeners``.
KAFKA_LISTENER = "KAFKA"
#: The Kafka-protocol door over TLS (``fjord.tls.server_ssl_context``): needs
#: ``--security-config``. A process has at most one Kafka-protocol door, KAFKA or SSL.
SSL_LISTENER = "SSL"
#: The Kafka-protocol door with SASL authentication (fjord.kafka.sasl), plaintext or over TLS.
SASL_PLAINTEXT_LISTENER = "SASL_PLAINTEXT"
SASL_SSL_LISTENER = "SASL_SSL"

#: Port of the Kafka listener when ``KAFKA://HOST`` names none (Kafka's own default).
DEFAULT_KAFKA_PORT = 9092

#: ``socket.request.max.bytes``: the largest request frame (size prefix excluded) a listener
#: reads; a larger size prefix closes the connection, as Kafka does (100 MiB, Kafka's default).
SOCKET_REQUEST_MAX_BYTES = 104_857_600

#: ``connections.max.idle.ms``: a connection that completes no request for this long is closed
#: (Kafka's default, 10 minutes). Also bounds a client that sends half a frame and stalls.
CONNECTIONS_MAX_IDLE_MS = 600_000

#: Seconds a forwarded admin request may take at the controller before the broker answers
#: REQUEST_TIMED_OUT (the request's own timeout_ms is added when it has one).
ADMIN_FORWARD_TIMEOUT_S = 30.0

#: How long a Kafka-protocol listener waits for in-flight requests when stopping.
SHUTDOWN_GRACE_S = 2.0

#: Kafka node id of group coordinator ``c`` is ``COORDINATOR_NODE_ID_BASE + c``: coordinators
#: are nodes of their own in Kafka's single node-id space (Metadata lists them beside the
#: brokers, FindCoordinator names them), so their ids must never meet a broker's. Broker ids
#: must stay below it.
COORDINATOR_NODE_ID_BASE = 1 << 30
