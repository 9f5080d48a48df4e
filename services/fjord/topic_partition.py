"""One partition of a topic, the one type every side uses for it (Kafka's ``TopicPartition``).

A NamedTuple: it compares and hashes as the plain tuple ``(topic, partition)``, so a dict keyed
by it finds keys built either way, and it unpacks as ``topic, partition = tp``. The client
exports it as :class:`fjord.client.TopicPartition`.
"""

from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    """A partition of a topic: the unit of order, assignment and offsets."""

    topic: str
    partition: int
