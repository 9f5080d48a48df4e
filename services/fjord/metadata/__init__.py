"""Cluster metadata: the etcd key schema, its JSON values, a pure image and a watcher; the
answers every door derives from the image alike (:mod:`fjord.metadata.view`: Metadata;
:mod:`fjord.metadata.coordinator_lookup`: FindCoordinator).

The controller is the only writer of metadata keys (brokers write only their own
registration); everything else learns the cluster's state through :class:`MetadataWatcher`.
"""

from fjord.metadata.etcd import etcd_client, parse_etcd_endpoint
from fjord.metadata.image import (
    ActiveController,
    EventType,
    MetadataEvent,
    MetadataImage,
    PartitionRef,
)
from fjord.metadata.schema import (
    NO_LEADER,
    ROOT_PREFIX,
    AclEntries,
    BrokerRegistration,
    ClusterConfig,
    ControllerRegistration,
    CoordinatorRegistration,
    InvalidMetadataError,
    KeyKind,
    Keys,
    OffsetsOwner,
    ParsedKey,
    PartitionState,
    ProducerIdBlock,
    ScramUser,
    TopicRecord,
)
from fjord.metadata.watcher import MetadataWatcher

__all__ = [
    "NO_LEADER",
    "ROOT_PREFIX",
    "AclEntries",
    "ActiveController",
    "BrokerRegistration",
    "ClusterConfig",
    "ControllerRegistration",
    "CoordinatorRegistration",
    "EventType",
    "InvalidMetadataError",
    "KeyKind",
    "Keys",
    "MetadataEvent",
    "MetadataImage",
    "MetadataWatcher",
    "OffsetsOwner",
    "ParsedKey",
    "PartitionRef",
    "PartitionState",
    "ProducerIdBlock",
    "ScramUser",
    "TopicRecord",
    "etcd_client",
    "parse_etcd_endpoint",
]
