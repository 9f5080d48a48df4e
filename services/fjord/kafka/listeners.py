"""Kafka's ``listeners`` / ``advertised.listeners`` syntax: ``NAME://HOST:PORT[,NAME://HOST:PORT]``.

Fjord knows five listener names (:mod:`fjord.kafka.defaults`): ``GRPC`` (the native door,
TLS when the process has ``--security-config``), ``KAFKA`` (the Kafka-protocol door), ``SSL``
(the Kafka-protocol door over TLS), ``SASL_PLAINTEXT`` and ``SASL_SSL`` (the Kafka-protocol
door with SASL SCRAM authentication, plaintext or over TLS). Other names (``TLS``, ``SCRAM``,
as Strimzi names its listeners) are Kafka doors when Kafka's ``listener.security.protocol.map``
(``--listener-security-protocol-map TLS:SSL,SCRAM:SASL_SSL``) gives their protocol; a process
may open several Kafka doors, one per name, and each is advertised under its own name (a client
is told the addresses of the listener it came in on, as Kafka does). Pure parsing; ConfigError
names the option.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fjord.errors import ConfigError
from fjord.kafka.defaults import (
    DEFAULT_KAFKA_PORT,
    GRPC_LISTENER,
    KAFKA_LISTENER,
    SASL_PLAINTEXT_LISTENER,
    SASL_SSL_LISTENER,
    SSL_LISTENER,
)
from fjord.serving import advertised_host, parse_listen

_KAFKA_DOORS = (KAFKA_LISTENER, SSL_LISTENER, SASL_PLAINTEXT_LISTENER, SASL_SSL_LISTENER)
KNOWN_LISTENERS = (GRPC_LISTENER, *_KAFKA_DOORS)
#: Kafka's protocol names a listener.security.protocol.map may give (PLAINTEXT is KAFKA here).
_PROTOCOL_ALIASES = {"PLAINTEXT": KAFKA_LISTENER}
_LISTENER_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


@dataclass(frozen=True, slots=True)
class KafkaDoor:
    """One Kafka-protocol listener of a process: its ``name`` (upper-case, what clients are
    answered by), its ``protocol`` (KAFKA, SSL, SASL_PLAINTEXT or SASL_SSL), where it binds and
    what it advertises (None: the bind address, the bound port)."""

    name: str
    protocol: str
    host: str
    port: int
    advertised: tuple[str, int] | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in (SSL_LISTENER, SASL_SSL_LISTENER)

    @property
    def sasl(self) -> bool:
        return self.protocol in (SASL_PLAINTEXT_LISTENER, SASL_SSL_LISTENER)

    @property
    def listener(self) -> tuple[str, int]:
        return self.host, self.port


def door_for(
    listener: tuple[str, int], advertised: tuple[str, int] | None, tls: bool, sasl: bool
) -> KafkaDoor:
    """The one door of a process configured the older way (a listener, its advertised
    address, whether it is TLS and SASL): named after its protocol."""
    protocol = (("SASL_" if sasl else "") + ("SSL" if tls else "PLAINTEXT")) if tls or sasl \
        else KAFKA_LISTENER
    return KafkaDoor(protocol, protocol, listener[0], listener[1], advertised)


def parse_protocol_map(text: str) -> dict[str, str]:
    """Kafka's ``listener.security.protocol.map`` (``TLS:SSL,SCRAM:SASL_SSL``) to
    ``{listener name: protocol}``, names upper-case; PLAINTEXT is read as KAFKA. GRPC cannot
    be renamed."""
    option = "listener-security-protocol-map"
    out: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, protocol = (x.strip().upper() for x in item.partition(":"))
        if not sep or not name or not protocol:
            raise ConfigError(f"{option}: expected NAME:PROTOCOL, got {item!r}")
        protocol = _PROTOCOL_ALIASES.get(protocol, protocol)
        if protocol not in _KAFKA_DOORS:
            raise ConfigError(
                f"{option}: {item!r}: unknown protocol (known: PLAINTEXT, "
                f"{', '.join(_KAFKA_DOORS)})"
            )
        if not _LISTENER_NAME.match(name) or name == GRPC_LISTENER:
            raise ConfigError(f"{option}: {item!r}: invalid listener name {name!r}")
        if name in out:
            raise ConfigError(f"{option}: listener {name} named twice")
        out[name] = protocol
    return out


def parse_listeners(
    text: str, option: str = "listeners", protocols: dict[str, str] | None = None
) -> dict[str, tuple[str, int]]:
    """``"KAFKA://0.0.0.0:9092,GRPC://:9093"`` to ``{"KAFKA": ("0.0.0.0", 9092), ...}``.

    An empty host means all interfaces (``0.0.0.0``), as in Kafka; ``[v6]`` hosts are accepted;
    a missing port is Kafka's 9092 for ``KAFKA`` and an error for ``GRPC``. Each name at most
    once; names are case-insensitive and returned upper-case; a name outside KNOWN_LISTENERS
    needs its protocol in ``protocols`` (the listener.security.protocol.map).
    """
    protocols = protocols or {}
    out: dict[str, tuple[str, int]] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, address = item.partition("://")
        name = name.strip().upper()
        if not sep:
            raise ConfigError(f"{option}: expected NAME://HOST:PORT, got {item!r}")
        if name not in KNOWN_LISTENERS and name not in protocols:
            raise ConfigError(
                f"{option}: unknown listener name {name!r} (known: {', '.join(KNOWN_LISTENERS)};"
                " others need --listener-security-protocol-map NAME:PROTOCOL)"
            )
        if name in out:
            raise ConfigError(f"{option}: listener {name} named twice")
        host, colon, port_text = address.rpartition(":")
        if not colon or "]" in port_text:
            if name == GRPC_LISTENER:
                raise ConfigError(f"{option}: {name} listener needs a port, got {item!r}")
            host, port_text = address, str(DEFAULT_KAFKA_PORT)
        host = host.strip("[]") or "0.0.0.0"
        try:
            port = int(port_text)
        except ValueError:
            raise ConfigError(f"{option}: invalid port in {item!r}") from None
        if not 0 <= port <= 65535:
            raise ConfigError(f"{option}: port {port} out of range 0..65535 in {item!r}")
        out[name] = (host, port)
    return out


def advertised_kafka_address(
    listener: tuple[str, int],
    advertised: tuple[str, int] | None,
    advertised_host_option: str | None,
    bound_port: int,
) -> tuple[str, int]:
    """The (host, port) Kafka clients are told for a ``KAFKA`` listener: the advertised
    listener's host (else ``--advertised-host``, else the listen host, or this machine's name on
    a wildcard address) and its port (0 or absent: the bound port)."""
    host, port = advertised or (None, 0)
    return advertised_host(host or advertised_host_option, listener[0]), port or bound_port


def resolve_listeners(
    listen: str | None, listeners: str, advertised_listeners: str, default_grpc_port: int
) -> tuple[str, int, tuple[str, int] | None, tuple[str, int] | None]:
    """A process's ``--listen``/``--listeners``/``--advertised-listeners`` to (gRPC host, gRPC
    port, KAFKA listener or None, advertised KAFKA address or None), for a process with at
    most one Kafka door (see :func:`resolve_kafka_doors` for several)."""
    host, port, doors = resolve_kafka_doors(listen, listeners, advertised_listeners,
                                            default_grpc_port)
    if len(doors) > 1:
        raise ConfigError(
            f"listeners: one Kafka-protocol listener expected here, got "
            f"{', '.join(d.name for d in doors)}"
        )
    door = doors[0] if doors else None
    return host, port, door.listener if door else None, door.advertised if door else None


def resolve_kafka_doors(
    listen: str | None,
    listeners: str,
    advertised_listeners: str,
    default_grpc_port: int,
    protocol_map: str = "",
) -> tuple[str, int, tuple[KafkaDoor, ...]]:
    """A process's ``--listen``/``--listeners``/``--advertised-listeners``/
    ``--listener-security-protocol-map`` to (gRPC host, gRPC port, its Kafka doors in the
    order ``--listeners`` names them). The gRPC address is given exactly once: ``--listen
    HOST:PORT`` or ``GRPC://`` in ``--listeners``. Every advertised name must be a listener's;
    two doors may not bind the same address."""
    protocols = parse_protocol_map(protocol_map)
    for name, protocol in protocols.items():
        if name in KNOWN_LISTENERS and name != protocol:
            raise ConfigError(
                f"listener-security-protocol-map: {name} is the {name} protocol's own name, "
                f"it cannot be {protocol}"
            )
    parsed = parse_listeners(listeners, "listeners", protocols)
    advertised = parse_listeners(advertised_listeners, "advertised-listeners", protocols)
    if listen is not None and GRPC_LISTENER in parsed:
        raise ConfigError("listen: give the gRPC address once (--listen or GRPC:// in --listeners)")
    if listen is None and GRPC_LISTENER not in parsed:
        raise ConfigError(
            "listen: --listen HOST:PORT or GRPC://HOST:PORT in --listeners is required"
        )
    if listen is not None:
        host, port = parse_listen(listen, default_grpc_port)
    else:
        host, port = parsed[GRPC_LISTENER]
    unknown = sorted(set(advertised) - set(parsed) - {GRPC_LISTENER})
    if unknown:
        raise ConfigError(
            f"advertised-listeners: {', '.join(unknown)} is not in --listeners"
        )
    doors = tuple(
        KafkaDoor(name, protocols.get(name, name), *address, advertised.get(name))
        for name, address in parsed.items()
        if name != GRPC_LISTENER
    )
    bound = [d.listener for d in doors if d.port]
    if len(bound) != len(set(bound)):
        raise ConfigError(f"listeners: two Kafka listeners on one address in {listeners!r}")
    return host, port, doors


def kafka_listener_uses_tls(listeners: str) -> bool:
    """Whether a Kafka-protocol door in ``listeners`` is ``SSL://`` or ``SASL_SSL://`` (TLS)
    rather than ``KAFKA://`` or ``SASL_PLAINTEXT://`` (plaintext)."""
    parsed = parse_listeners(listeners)
    return SSL_LISTENER in parsed or SASL_SSL_LISTENER in parsed


def kafka_listener_uses_sasl(listeners: str) -> bool:
    """Whether a Kafka-protocol door in ``listeners`` authenticates clients with SASL
    (``SASL_PLAINTEXT://`` or ``SASL_SSL://``)."""
    parsed = parse_listeners(listeners)
    return SASL_PLAINTEXT_LISTENER in parsed or SASL_SSL_LISTENER in parsed
