"""Kafka's ``listeners`` / ``advertised.listeners`` syntax: ``NAME://HOST:PORT[,NAME://HOST:PORT]``.

Fjord knows five listener names (:mod:`fjord.kafka.defaults`): ``GRPC`` (the native door,
TLS when the process has ``--security-config``), ``KAFKA`` (the Kafka-protocol door), ``SSL``
(the Kafka-protocol door over TLS), ``SASL_PLAINTEXT`` and ``SASL_SSL`` (the Kafka-protocol
door with SASL SCRAM authentication, plaintext or over TLS); at most one Kafka-protocol door.
Pure parsing; ConfigError names the option.
"""

from __future__ import annotations

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


def parse_listeners(text: str, option: str = "listeners") -> dict[str, tuple[str, int]]:
    """``"KAFKA://0.0.0.0:9092,GRPC://:9093"`` to ``{"KAFKA": ("0.0.0.0", 9092), ...}``.

    An empty host means all interfaces (``0.0.0.0``), as in Kafka; ``[v6]`` hosts are accepted;
    a missing port is Kafka's 9092 for ``KAFKA`` and an error for ``GRPC``. Each name at most
    once; names are case-insensitive and returned upper-case.
    """
    out: dict[str, tuple[str, int]] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, address = item.partition("://")
        name = name.strip().upper()
        if not sep:
            raise ConfigError(f"{option}: expected NAME://HOST:PORT, got {item!r}")
        if name not in KNOWN_LISTENERS:
            raise ConfigError(
                f"{option}: unknown listener name {name!r} (known: {', '.join(KNOWN_LISTENERS)})"
            )
        if name in out:
            raise ConfigError(f"{option}: listener {name} named twice")
        host, colon, port_text = address.rpartition(":")
        if not colon or "]" in port_text:
            if name not in _KAFKA_DOORS:
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
    port, KAFKA listener or None, advertised KAFKA address or None). The gRPC address is
    given exactly once: ``--listen HOST:PORT`` or ``GRPC://`` in ``--listeners``."""
    parsed = parse_listeners(listeners)
    advertised = parse_listeners(advertised_listeners, "advertised-listeners")
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
    kafka_advertised = _kafka_door(advertised, "advertised-listeners")
    return host, port, _kafka_door(parsed, "listeners"), kafka_advertised


def kafka_listener_uses_tls(listeners: str) -> bool:
    """Whether the Kafka-protocol door in ``listeners`` is ``SSL://`` or ``SASL_SSL://`` (TLS)
    rather than ``KAFKA://`` or ``SASL_PLAINTEXT://`` (plaintext)."""
    parsed = parse_listeners(listeners)
    return SSL_LISTENER in parsed or SASL_SSL_LISTENER in parsed


def kafka_listener_uses_sasl(listeners: str) -> bool:
    """Whether the Kafka-protocol door in ``listeners`` authenticates clients with SASL
    (``SASL_PLAINTEXT://`` or ``SASL_SSL://``)."""
    parsed = parse_listeners(listeners)
    return SASL_PLAINTEXT_LISTENER in parsed or SASL_SSL_LISTENER in parsed


def _kafka_door(parsed: dict[str, tuple[str, int]], option: str) -> tuple[str, int] | None:
    doors = [name for name in _KAFKA_DOORS if name in parsed]
    if len(doors) > 1:
        raise ConfigError(
            f"{option}: one Kafka-protocol listener (KAFKA://, SSL://, SASL_PLAINTEXT:// or "
            f"SASL_SSL://), got {', '.join(doors)}"
        )
    return parsed[doors[0]] if doors else None
