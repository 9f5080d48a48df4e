"""Kafka's topic name rules, pure and shared: the client checks a name before it asks for
metadata, the broker before it answers Metadata or Produce, the controller before it creates a
topic. All three refuse an illegal name with INVALID_TOPIC_EXCEPTION (:class:`InvalidTopicError`,
not retriable), so a producer never waits ``max.block.ms`` for a topic that cannot exist.

- ``MAX_TOPIC_NAME_LENGTH`` (249): Kafka's limit (255 minus room for a partition suffix in a
  directory name).
"""

from __future__ import annotations

import re

from fjord.errors import InvalidTopicError

MAX_TOPIC_NAME_LENGTH = 249

#: Topics whose name starts with this are Fjord's own (``__consumer_offsets``), as in Kafka.
INTERNAL_TOPIC_PREFIX = "__"

_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def topic_name_problem(name: str) -> str | None:
    """Why ``name`` is not a legal topic name, or None when it is.

    Kafka's rules: non-empty, at most 249 characters of ``[a-zA-Z0-9._-]``, not ``.`` or ``..``.
    """
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return f"topic name cannot be {name!r}"
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return f"topic name is {len(name)} characters long; the limit is {MAX_TOPIC_NAME_LENGTH}"
    if not _LEGAL.fullmatch(name):
        return (
            f"topic name {name!r} is illegal: only ASCII letters, digits, '.', '_' and '-' "
            "are allowed"
        )
    return None


def validate_topic_name(name: str) -> None:
    """Raise :class:`InvalidTopicError` (INVALID_TOPIC_EXCEPTION) unless ``name`` is legal."""
    problem = topic_name_problem(name)
    if problem is not None:
        raise InvalidTopicError(problem)


def is_internal_topic(name: str) -> bool:
    """Whether ``name`` is reserved for Fjord's own topics (``__consumer_offsets``): Kafka's
    ``__`` prefix, the same rule that marks topics ``internal`` in Metadata responses."""
    return name.startswith(INTERNAL_TOPIC_PREFIX)
