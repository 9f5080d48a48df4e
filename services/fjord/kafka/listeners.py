"""Kafka's ``listeners`` / ``advertised.listeners`` syntax: ``NAME://HOST:PORT[,NAME://HOST:PORT]``.

Fjord knows two listener names (:mod:`fjord.kafka.defaults`): ``GRPC`` (the native door) and
``KAFKA`` (the Kafka-protocol door). Pure parsing; ConfigError names the option.
"""

from __future__ import annotations

from fjord.errors import ConfigError
from fjord.kafka.defaults import DEFAULT_KAFKA_PORT, GRPC_LISTENER, KAFKA_LISTENER

KNOWN_LISTENERS = (GRPC_LISTENER, KAFKA_LISTENER)


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
            if name != KAFKA_LISTENER:
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
