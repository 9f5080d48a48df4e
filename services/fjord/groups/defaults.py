"""The group protocol's shared constants and the consumer's group defaults, defined once here.

Names are Kafka's broker/consumer settings (in the comment); values are Kafka's. The coordinator
service's own defaults (session bounds, retention, timeouts of its shell) are in
:mod:`fjord.coordinator.defaults`.
"""

from __future__ import annotations

#: ``offsets.topic.num.partitions``: partitions of ``__consumer_offsets``; a group lives in
#: partition ``abs(javaStringHashCode(group)) % OFFSETS_TOPIC_PARTITIONS``
#: (:func:`fjord.groups.offsets_topic.group_partition`).
OFFSETS_TOPIC_PARTITIONS = 50

#: Name of the internal topic holding group metadata and committed offsets.
OFFSETS_TOPIC = "__consumer_offsets"

#: Seconds a door answering FindCoordinator (a broker, a coordinator's Kafka listener) waits
#: for the controller's CreateTopics of ``__consumer_offsets`` (sent in the background on a
#: FindCoordinator that finds no such topic; the FindCoordinator itself answers
#: COORDINATOR_NOT_AVAILABLE at once and the client retries).
OFFSETS_TOPIC_CREATE_TIMEOUT_S = 10.0

# --- consumer side (the client's defaults; the coordinator only sees what members send) ------

#: ``session.timeout.ms`` (consumer, Kafka 3.0+).
CONSUMER_SESSION_TIMEOUT_MS = 45_000

#: ``heartbeat.interval.ms`` (consumer).
CONSUMER_HEARTBEAT_INTERVAL_MS = 3_000

#: ``max.poll.interval.ms`` (consumer): sent as the member's rebalance timeout.
CONSUMER_MAX_POLL_INTERVAL_MS = 300_000

#: The protocol type consumers use (``ConsumerProtocol.PROTOCOL_TYPE``).
CONSUMER_PROTOCOL_TYPE = "consumer"
