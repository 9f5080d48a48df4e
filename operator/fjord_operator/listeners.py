"""Pure planning of a FjordCluster's client doors (issue 16, Kubernetes): its Kafka-protocol
listeners and its SASL gRPC doors. No I/O.

**Kafka listeners** (``spec.listeners``, Strimzi's style: each with its own name, port and
authentication). Without the field a cluster has the one listener it always had: named
``kafka`` on :data:`~fjord_operator.settings.KAFKA_PORT`, plaintext or, with TLS on, taking
client certificates or SCRAM logins as ``spec.security.kafkaAuthentication`` says. With it, each
entry is a door of every broker and coordinator pod: ``--listeners NAME://0.0.0.0:PORT``
under the listener's upper-case name, its protocol in ``--listener-security-protocol-map``,
advertised at the pod's own name and the listener's port, and a port of that name on the
brokers' and coordinators' Services. A client is answered with the addresses of the listener
it came in on, so each listener works on its own.

**SASL gRPC doors** (``spec.security.saslGrpcDoor``): every broker, controller and
coordinator opens one (``--sasl-listen 0.0.0.0:PORT``, TLS without client certificates), for
Fjord's own clients logging in with SCRAM; their Services get a ``sasl-grpc`` port.

Invariants: :func:`listener_problems` is empty exactly when :func:`kafka_listeners` and
:func:`sasl_grpc_door_port` can build the pods; port numbers never clash with each other or
with the pods' fixed ports (gRPC, metrics).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fjord_operator import settings as s

TLS, SCRAM, NONE = "tls", "scram-sha-512", "none"
#: spec.listeners[].authentication -> the Kafka protocol of the door (TLS on / off).
_PROTOCOLS = {(True, TLS): "SSL", (True, SCRAM): "SASL_SSL", (False, NONE): "KAFKA"}
#: Kafka-ish listener names: lower-case letters and digits, starting with a letter (a
#: Kubernetes port name too; Strimzi's listener names are at most 11 characters).
LISTENER_NAME = re.compile(r"^[a-z][a-z0-9]{0,10}$")
#: Names that are ports already (grpc, metrics, sasl-grpc) or Kafka protocols: a listener of
#: such a name would clash on the Service or in --listener-security-protocol-map.
RESERVED_NAMES = frozenset({"grpc", "metrics", "sasl", "kafka", "ssl", "plaintext"})
#: Ports every pod serves besides the doors: brokers' and coordinators' gRPC, and /metrics.
_FIXED_PORTS = {s.BROKER_PORT: "the brokers' gRPC port", s.COORDINATOR_PORT:
                "the coordinators' gRPC port", s.CONTROLLER_PORT: "the controllers' gRPC port",
                s.METRICS_PORT: "the metrics port"}


@dataclass(frozen=True, slots=True)
class KafkaListener:
    """One Kafka door of every broker and coordinator pod: ``name`` (the Service port's
    name; upper-case it is the Kafka listener name), ``port`` (in the pod and on the
    Services), ``protocol`` (KAFKA, SSL or SASL_SSL) and the spec's ``authentication``."""

    name: str
    port: int
    authentication: str
    protocol: str

    @property
    def kafka_name(self) -> str:
        return self.name.upper()


def _secure(spec: Mapping[str, Any]) -> bool:
    security = spec.get("security")
    return bool(security.get("tls")) if isinstance(security, Mapping) else False


def kafka_listeners(spec: Mapping[str, Any]) -> tuple[KafkaListener, ...]:
    """The cluster's Kafka listeners (spec checked by :func:`listener_problems`)."""
    secure = _secure(spec)
    entries = spec.get("listeners")
    if not entries:
        authentication = (
            str((spec.get("security") or {}).get("kafkaAuthentication", TLS)) if secure else NONE
        )
        return (KafkaListener("kafka", s.KAFKA_PORT, authentication,
                              _PROTOCOLS[(secure, authentication)]),)
    out = []
    for entry in entries:
        authentication = str(entry.get("authentication") or (TLS if secure else NONE))
        out.append(KafkaListener(str(entry["name"]), int(entry["port"]), authentication,
                                 _PROTOCOLS[(secure, authentication)]))
    return tuple(out)


def uses_named_listeners(spec: Mapping[str, Any]) -> bool:
    """True when spec.listeners is given (the pods then name their doors)."""
    return bool(spec.get("listeners"))


def sasl_grpc_door_port(spec: Mapping[str, Any]) -> int | None:
    """The SASL gRPC doors' port, None when the cluster opens none."""
    door = (spec.get("security") or {}).get("saslGrpcDoor") or {}
    if not isinstance(door, Mapping) or not door.get("enabled"):
        return None
    return int(door.get("port", s.SASL_GRPC_PORT))


def serves_scram(spec: Mapping[str, Any]) -> bool:
    """Whether a SCRAM user can log in anywhere: a scram-sha-512 Kafka listener or the SASL
    gRPC doors."""
    return sasl_grpc_door_port(spec) is not None or any(
        listener.authentication == SCRAM for listener in kafka_listeners(spec)
    )


def listener_problems(spec: Mapping[str, Any]) -> list[str]:
    """Why spec.listeners or spec.security.saslGrpcDoor cannot be built (empty: they can)."""
    problems: list[str] = []
    secure = _secure(spec)
    used: dict[int, str] = {}
    door = (spec.get("security") or {}).get("saslGrpcDoor") if isinstance(
        spec.get("security"), Mapping) else None
    if door is not None and not isinstance(door, Mapping):
        problems.append(f"spec.security.saslGrpcDoor must be an object, got {door!r}")
    elif door and door.get("enabled"):
        port = door.get("port", s.SASL_GRPC_PORT)
        if not secure:
            problems.append(
                "spec.security.saslGrpcDoor needs spec.security.tls (SCRAM logins travel over "
                "TLS)"
            )
        if not isinstance(port, int) or not 1 <= port <= 65535:
            problems.append(
                f"spec.security.saslGrpcDoor.port must be an integer 1..65535, got {port!r}"
            )
        elif port in _FIXED_PORTS:
            problems.append(f"spec.security.saslGrpcDoor.port {port} is {_FIXED_PORTS[port]}")
        else:
            used[port] = "spec.security.saslGrpcDoor.port"
    entries = spec.get("listeners")
    if entries is None:
        return problems
    if not isinstance(entries, list) or not entries:
        return [*problems, "spec.listeners must be a non-empty list (or left out)"]
    names: set[str] = set()
    allowed = (TLS, SCRAM) if secure else (NONE,)
    for i, entry in enumerate(entries):
        where = f"spec.listeners[{i}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{where} must be an object, got {entry!r}")
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not LISTENER_NAME.match(name):
            problems.append(
                f"{where}.name must be lower-case letters and digits starting with a letter, "
                f"at most 11 characters (like tls or scram), got {name!r}"
            )
        elif name in RESERVED_NAMES:
            problems.append(
                f"{where}.name {name!r} is taken (reserved: {', '.join(sorted(RESERVED_NAMES))})"
            )
        elif name in names:
            problems.append(f"{where}.name {name!r} is given twice")
        else:
            names.add(name)
        port = entry.get("port")
        if not isinstance(port, int) or not 1 <= port <= 65535:
            problems.append(f"{where}.port must be an integer 1..65535, got {port!r}")
        elif port in _FIXED_PORTS:
            problems.append(f"{where}.port {port} is {_FIXED_PORTS[port]}")
        elif port in used:
            problems.append(f"{where}.port {port} is also {used[port]}")
        else:
            used[port] = f"{where}.port"
        authentication = entry.get("authentication") or (TLS if secure else NONE)
        if authentication not in allowed:
            problems.append(
                f"{where}.authentication must be one of {', '.join(allowed)} "
                f"{'with' if secure else 'without'} spec.security.tls, got {authentication!r}"
            )
    return problems


def client_bootstrap_hints(body: Mapping[str, Any], authentication: str) -> list[str]:
    """Where a FjordUser authenticating with ``authentication`` connects, one line per door
    that takes it (``client.properties`` carries them as comments: one properties file serves
    Kafka's clients and Fjord's own, only ``bootstrap.servers`` differs)."""
    meta, spec = body["metadata"], body.get("spec") or {}
    service = f"{meta['name']}-broker.{meta.get('namespace', 'default')}.svc"
    lines = [
        f"Kafka clients (listener {x.name}): bootstrap.servers={service}:{x.port}"
        for x in kafka_listeners(spec) if x.authentication == authentication
    ]
    if authentication == TLS:
        lines.append(f"Fjord's clients (gRPC): bootstrap.servers={service}:{s.BROKER_PORT}")
    door = sasl_grpc_door_port(spec)
    if authentication == SCRAM and door is not None:
        lines.append(f"Fjord's clients (SASL gRPC doors): bootstrap.servers={service}:{door}")
    return lines
