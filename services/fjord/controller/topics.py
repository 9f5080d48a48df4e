"""Topic name rules (Kafka's), pure. The legality rule and the internal-topic rule are shared
with clients and brokers: :mod:`fjord.topic_names`."""

from __future__ import annotations

from collections.abc import Iterable

from fjord.topic_names import validate_topic_name

__all__ = ["collision_key", "find_collision", "validate_topic_name"]


def collision_key(name: str) -> str:
    """Names are equal under this key when they collide in metric names ('.' vs '_')."""
    return name.replace(".", "_")


def find_collision(name: str, existing: Iterable[str]) -> str | None:
    """An existing topic (other than ``name`` itself) that collides with ``name``, else None."""
    key = collision_key(name)
    for other in existing:
        if other != name and collision_key(other) == key:
            return other
    return None
