"""Topic name rules (Kafka's), pure."""

from __future__ import annotations

import re
from collections.abc import Iterable

from fjord.broker.metadata_view import INTERNAL_TOPIC_PREFIX
from fjord.controller.defaults import MAX_TOPIC_NAME_LENGTH
from fjord.errors import InvalidTopicError

_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def validate_topic_name(name: str) -> None:
    """Raise :class:`InvalidTopicError` unless ``name`` is a legal topic name.

    Kafka's rules: non-empty, at most 249 characters of ``[a-zA-Z0-9._-]``, not ``.`` or ``..``.
    """
    if not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(
            f"topic name is {len(name)} characters long; the limit is {MAX_TOPIC_NAME_LENGTH}"
        )
    if not _LEGAL.fullmatch(name):
        raise InvalidTopicError(
            f"topic name {name!r} is illegal: only ASCII letters, digits, '.', '_' and '-' "
            "are allowed"
        )


def is_internal_topic(name: str) -> bool:
    """Whether ``name`` is reserved for Fjord's own topics (``__consumer_offsets``): Kafka's
    ``__`` prefix, the same rule that marks topics ``internal`` in Metadata responses."""
    return name.startswith(INTERNAL_TOPIC_PREFIX)


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
