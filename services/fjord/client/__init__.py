"""Fjord's clients: Producer, Consumer and AdminClient, configured with Kafka's property names.

See docs/clients.md for the configuration table, semantics and differences from Kafka.
"""

from fjord.client.admin import (
    AdminClient,
    ConsumerGroupDescription,
    ConsumerGroupListing,
    MemberDescription,
)
from fjord.client.consumer import (
    Consumer,
    FeatureNotAvailableError,
    IllegalStateError,
    NoOffsetForPartitionError,
)
from fjord.client.futures import RecordFuture, RecordsFuture
from fjord.client.partitioner import murmur2, partition_for_key
from fjord.client.producer import AsyncProducer, Producer
from fjord.client.types import (
    ClusterDescription,
    ConfigEntry,
    ConsumerGroupMetadata,
    ConsumerRecord,
    LogDirDescription,
    LogDirPartition,
    NewTopic,
    Node,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    PartitionInfo,
    RecordMetadata,
    ScrubStatus,
    TopicDescription,
    TopicPartition,
)
from fjord.errors import KafkaTimeoutError, NotControllerError

__all__ = [
    "AdminClient",
    "AsyncProducer",
    "ClusterDescription",
    "ConfigEntry",
    "Consumer",
    "ConsumerGroupDescription",
    "ConsumerGroupListing",
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "FeatureNotAvailableError",
    "IllegalStateError",
    "KafkaTimeoutError",
    "LogDirDescription",
    "LogDirPartition",
    "MemberDescription",
    "NewTopic",
    "NoOffsetForPartitionError",
    "Node",
    "NotControllerError",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "PartitionInfo",
    "Producer",
    "RecordFuture",
    "RecordMetadata",
    "RecordsFuture",
    "ScrubStatus",
    "TopicDescription",
    "TopicPartition",
    "murmur2",
    "partition_for_key",
]
