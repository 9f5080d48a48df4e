"""A pure, immutable view of a cluster's metadata at one etcd revision.

The image knows nothing about etcd clients: it is built from :class:`MetadataEvent` values
(puts and deletes with their revisions), so it is tested without any process.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any, TypeVar

from fjord.metadata.schema import (
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
from fjord.security.acls import AccessControlEntry, AclBinding, AclError, ResourcePattern
from fjord.security.scram import ScramCredential
from fjord.topic_partition import TopicPartition

log = logging.getLogger(__name__)

K = TypeVar("K")
V = TypeVar("V")


class EventType(Enum):
    """The two kinds of etcd change."""

    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True)
class MetadataEvent:
    """One change of one key. ``create_revision`` is the key's create revision for a put
    (epochs derive from it) and 0 for a delete; ``mod_revision`` is the revision of the change."""

    type: EventType
    key: str
    value: bytes
    create_revision: int
    mod_revision: int

    @classmethod
    def put(cls, key: str, value: bytes, create_revision: int, mod_revision: int) -> MetadataEvent:
        return cls(EventType.PUT, key, value, create_revision, mod_revision)

    @classmethod
    def delete(cls, key: str, mod_revision: int) -> MetadataEvent:
        return cls(EventType.DELETE, key, b"", 0, mod_revision)


@dataclass(frozen=True)
class ActiveController:
    """The active controller and its epoch (the create revision of the ``controller`` key)."""

    registration: ControllerRegistration
    epoch: int


@dataclass(frozen=True)
class PartitionRef:
    """A partition and its state, as returned by the by-broker lookups."""

    topic: str
    partition: int
    state: PartitionState


def _frozen(mapping: dict[K, V]) -> Mapping[K, V]:
    return MappingProxyType(mapping)


class MetadataImage:
    """Cluster metadata as of etcd revision :attr:`revision`.

    Invariants: the image never changes after construction (:meth:`apply` returns a new
    one); ``revision`` never decreases along a chain of :meth:`apply` calls and events whose
    ``mod_revision`` is not above the image's revision are ignored (so replaying a watch from
    an older revision is harmless); keys outside the cluster's prefix or schema are ignored;
    a value that does not decode is logged and treated as absent; :meth:`partitions` returns
    only partitions of topics whose ``topics/<name>`` record exists.
    """

    __slots__ = (
        "_acls",
        "_broker_configs",
        "_broker_epochs",
        "_brokers",
        "_cluster_config",
        "_controller",
        "_controllers",
        "_coordinator_epochs",
        "_coordinators",
        "_offsets_owners",
        "_partitions",
        "_producer_ids",
        "_scram_users",
        "_topics",
        "keys",
        "revision",
    )

    def __init__(self, cluster_id: str, revision: int = 0) -> None:
        self.keys = Keys(cluster_id)
        self.revision = revision
        self._controller: ActiveController | None = None
        self._controllers: dict[int, ControllerRegistration] = {}
        self._brokers: dict[int, BrokerRegistration] = {}
        self._broker_epochs: dict[int, int] = {}
        self._topics: dict[str, TopicRecord] = {}
        self._partitions: dict[str, dict[int, PartitionState]] = {}
        self._cluster_config: dict[str, str] = {}
        self._broker_configs: dict[int, dict[str, str]] = {}
        self._producer_ids: int | None = None
        self._coordinators: dict[int, CoordinatorRegistration] = {}
        self._coordinator_epochs: dict[int, int] = {}
        self._offsets_owners: dict[int, OffsetsOwner] = {}
        # Replaced (never mutated) when an ACL key changes, so its identity tells a cache
        # (fjord.security.access) whether the ACLs changed between two images.
        self._acls: dict[ResourcePattern, tuple[AccessControlEntry, ...]] = {}
        self._scram_users: dict[str, ScramUser] = {}

    @classmethod
    def empty(cls, cluster_id: str) -> MetadataImage:
        return cls(cluster_id)

    @classmethod
    def from_snapshot(
        cls, cluster_id: str, puts: Iterable[MetadataEvent], revision: int
    ) -> MetadataImage:
        """The image of a consistent read at ``revision`` (all ``puts``, any order)."""
        image = cls(cluster_id)
        image._apply_in_place(puts, check_revision=False)
        image.revision = revision
        return image

    @property
    def cluster_id(self) -> str:
        return self.keys.cluster_id

    def with_cluster_defaults(self, defaults: Mapping[str, str]) -> MetadataImage:
        """This image with ``defaults`` layered under its ``cluster-config`` (a process's static
        config, as Kafka's server.properties under its dynamic cluster defaults: etcd's entry
        wins key by key). The same image when ``defaults`` is empty."""
        if not defaults:
            return self
        other = self._copy()
        other._cluster_config = {**defaults, **self._cluster_config}
        return other

    def _copy(self) -> MetadataImage:
        other = MetadataImage(self.cluster_id, self.revision)
        other._controller = self._controller
        other._controllers = dict(self._controllers)
        other._brokers = dict(self._brokers)
        other._broker_epochs = dict(self._broker_epochs)
        other._topics = dict(self._topics)
        # Inner partition dicts are copied lazily, only for topics that an event touches.
        other._partitions = dict(self._partitions)
        other._cluster_config = self._cluster_config
        other._broker_configs = dict(self._broker_configs)
        other._producer_ids = self._producer_ids
        other._coordinators = dict(self._coordinators)
        other._coordinator_epochs = dict(self._coordinator_epochs)
        other._offsets_owners = dict(self._offsets_owners)
        other._acls = self._acls
        other._scram_users = dict(self._scram_users)
        return other

    def apply(self, events: Iterable[MetadataEvent], revision: int | None = None) -> MetadataImage:
        """A new image with ``events`` applied in order; its revision is ``revision`` (or the
        highest event revision), never lower than this image's."""
        events = list(events)
        new = self._copy()
        touched: set[str] = set()
        new._apply_in_place(events, check_revision=True, touched=touched)
        highest = max([self.revision, *(e.mod_revision for e in events)])
        new.revision = max(highest, revision or 0)
        return new

    def _apply_in_place(
        self,
        events: Iterable[MetadataEvent],
        check_revision: bool,
        touched: set[str] | None = None,
    ) -> None:
        for event in events:
            if check_revision and event.mod_revision <= self.revision:
                continue
            parsed = self.keys.parse(event.key)
            if parsed is None:
                continue
            value = None
            if event.type is EventType.PUT:
                try:
                    value = _decode(parsed.kind, event.value)
                except InvalidMetadataError as exc:
                    log.warning("ignoring invalid metadata at %s: %s", event.key, exc)
            self._set(parsed.kind, parsed, value, event.create_revision, touched)

    def _set(
        self,
        kind: KeyKind,
        parsed: ParsedKey,
        value: Any,
        create_revision: int,
        touched: set[str] | None,
    ) -> None:
        # The parser guarantees the parts each kind needs; these names make that explicit.
        ident = parsed.id if parsed.id is not None else -1
        topic = parsed.topic or ""
        partition = parsed.partition if parsed.partition is not None else -1
        if kind is KeyKind.CONTROLLER:
            self._controller = ActiveController(value, create_revision) if value else None
        elif kind is KeyKind.CONTROLLER_MEMBER:
            _put_or_pop(self._controllers, ident, value)
        elif kind is KeyKind.BROKER:
            _put_or_pop(self._brokers, ident, value)
            _put_or_pop(self._broker_epochs, ident, create_revision if value else None)
        elif kind is KeyKind.TOPIC:
            # Partition states are kept even without their topic record: the image mirrors
            # the store key by key (the controller deletes a topic's keys in one txn).
            _put_or_pop(self._topics, topic, value)
        elif kind is KeyKind.PARTITION:
            parts = self._partitions.get(topic)
            if touched is not None and topic not in touched:
                parts = dict(parts or {})
                touched.add(topic)
            elif parts is None:
                parts = {}
            _put_or_pop(parts, partition, value)
            if parts:
                self._partitions[topic] = parts
            else:
                self._partitions.pop(topic, None)
        elif kind is KeyKind.CLUSTER_CONFIG:
            self._cluster_config = dict(value.values) if value else {}
        elif kind is KeyKind.BROKER_CONFIG:
            _put_or_pop(self._broker_configs, ident, dict(value.values) if value else None)
        elif kind is KeyKind.PRODUCER_IDS:
            self._producer_ids = value.next if value else None
        elif kind is KeyKind.COORDINATOR:
            _put_or_pop(self._coordinators, ident, value)
            _put_or_pop(self._coordinator_epochs, ident, create_revision if value else None)
        elif kind is KeyKind.OFFSETS_OWNER:
            _put_or_pop(self._offsets_owners, partition, value)
        elif kind is KeyKind.ACL:
            assert parsed.acl_pattern is not None
            acls = dict(self._acls)
            entries = value.entries if value else ()
            _put_or_pop(acls, parsed.acl_pattern, entries or None)
            self._acls = acls
        elif kind is KeyKind.SCRAM_USER:
            assert parsed.user is not None
            _put_or_pop(self._scram_users, parsed.user, value)

    # -- lookups -------------------------------------------------------------------------

    @property
    def controller(self) -> ActiveController | None:
        """The active controller, or ``None`` while an election is pending."""
        return self._controller

    @property
    def controllers(self) -> Mapping[int, ControllerRegistration]:
        """Every live controller (active and standby) by id."""
        return _frozen(self._controllers)

    @property
    def brokers(self) -> Mapping[int, BrokerRegistration]:
        """Every live (registered) broker by id."""
        return _frozen(self._brokers)

    def broker(self, broker_id: int) -> BrokerRegistration | None:
        return self._brokers.get(broker_id)

    def broker_epoch(self, broker_id: int) -> int | None:
        """The broker's epoch (create revision of its registration), ``None`` if not live."""
        return self._broker_epochs.get(broker_id)

    @property
    def topics(self) -> Mapping[str, TopicRecord]:
        return _frozen(self._topics)

    def topic(self, name: str) -> TopicRecord | None:
        return self._topics.get(name)

    def topic_by_id(self, topic_id: str) -> str | None:
        for name, record in self._topics.items():
            if record.topic_id == topic_id:
                return name
        return None

    def partitions(self, topic: str) -> Mapping[int, PartitionState]:
        """The partition states of ``topic`` by partition number (empty if no such topic)."""
        if topic not in self._topics:
            return _frozen({})
        return _frozen(self._partitions.get(topic, {}))

    def partition(self, topic: str, partition: int) -> PartitionState | None:
        return self.partitions(topic).get(partition)

    def all_partitions(self) -> list[PartitionRef]:
        """Every partition of every topic, sorted by (topic, partition)."""
        return [
            PartitionRef(topic, p, state)
            for topic in sorted(self._topics)
            for p, state in sorted(self._partitions.get(topic, {}).items())
        ]

    def replica_states_on(self, broker_id: int) -> dict[TopicPartition, PartitionState]:
        """The state of every partition with a replica on ``broker_id``, in no particular
        order: what a broker applies on every metadata change (no sort, no PartitionRef per
        partition: at tens of thousands of partitions :meth:`partitions_replicated_on` cost a
        broker's event loop a fifth of a second per change)."""
        out: dict[TopicPartition, PartitionState] = {}
        for topic in self._topics:
            for number, state in self._partitions.get(topic, {}).items():
                if broker_id in state.replicas:
                    out[TopicPartition(topic, number)] = state
        return out

    def partitions_led_by(self, broker_id: int) -> list[PartitionRef]:
        """Partitions whose leader is ``broker_id``, sorted by (topic, partition)."""
        return [ref for ref in self.all_partitions() if ref.state.leader == broker_id]

    def partitions_replicated_on(self, broker_id: int) -> list[PartitionRef]:
        """Partitions with a replica on ``broker_id``, sorted by (topic, partition)."""
        return [ref for ref in self.all_partitions() if broker_id in ref.state.replicas]

    @property
    def cluster_config(self) -> Mapping[str, str]:
        return _frozen(self._cluster_config)

    def broker_config(self, broker_id: int) -> Mapping[str, str]:
        """Broker ``broker_id``'s dynamic configs (``broker-configs/<id>``; empty when none)."""
        return _frozen(self._broker_configs.get(broker_id, {}))

    @property
    def next_producer_id(self) -> int | None:
        """The ``next`` of ``producer-ids``; ``None`` before the first allocation."""
        return self._producer_ids

    @property
    def coordinators(self) -> Mapping[int, CoordinatorRegistration]:
        """Every live (registered) group coordinator by id."""
        return _frozen(self._coordinators)

    def coordinator_epoch(self, coordinator_id: int) -> int | None:
        """The coordinator's epoch (create revision of its registration), ``None`` if not
        live."""
        return self._coordinator_epochs.get(coordinator_id)

    @property
    def offsets_owners(self) -> Mapping[int, OffsetsOwner]:
        """Owner of each ``__consumer_offsets`` partition that has one, by partition."""
        return _frozen(self._offsets_owners)

    def offsets_owner(self, partition: int) -> OffsetsOwner | None:
        return self._offsets_owners.get(partition)

    @property
    def acls(self) -> Mapping[ResourcePattern, tuple[AccessControlEntry, ...]]:
        """The ACL entries by resource pattern (patterns without entries are absent)."""
        return _frozen(self._acls)

    @property
    def acls_identity(self) -> object:
        """Changes exactly when :attr:`acls` may have changed (cache key for authorizers)."""
        return self._acls

    def acl_bindings(self) -> list[AclBinding]:
        """Every ACL binding, sorted. Bindings that are no longer valid (an operation the
        resource type does not take) are dropped with a warning."""
        out = []
        for pattern, entries in self._acls.items():
            for entry in entries:
                try:
                    out.append(AclBinding(pattern, entry))
                except AclError as exc:
                    log.warning("ignoring invalid ACL %s %s: %s", pattern, entry, exc)
        return sorted(out)

    @property
    def scram_users(self) -> Mapping[str, ScramUser]:
        """Every user with SCRAM credentials, by name."""
        return _frozen(self._scram_users)

    def scram_credential(self, mechanism: str, user: str) -> ScramCredential | None:
        """``user``'s salted credential for ``mechanism``, or None (the SASL lookup)."""
        scram_user = self._scram_users.get(user)
        return scram_user.credential(mechanism) if scram_user else None

    def __repr__(self) -> str:
        return (
            f"MetadataImage(cluster={self.cluster_id!r}, revision={self.revision}, "
            f"brokers={sorted(self._brokers)}, topics={len(self._topics)})"
        )


def _put_or_pop(mapping: dict[K, V], key: K, value: V | None) -> None:
    if value is None:
        mapping.pop(key, None)
    else:
        mapping[key] = value


_DECODERS = {
    KeyKind.CONTROLLER: ControllerRegistration.from_json,
    KeyKind.CONTROLLER_MEMBER: ControllerRegistration.from_json,
    KeyKind.BROKER: BrokerRegistration.from_json,
    KeyKind.TOPIC: TopicRecord.from_json,
    KeyKind.PARTITION: PartitionState.from_json,
    KeyKind.CLUSTER_CONFIG: ClusterConfig.from_json,
    KeyKind.BROKER_CONFIG: ClusterConfig.from_json,
    KeyKind.PRODUCER_IDS: ProducerIdBlock.from_json,
    KeyKind.COORDINATOR: CoordinatorRegistration.from_json,
    KeyKind.OFFSETS_OWNER: OffsetsOwner.from_json,
    KeyKind.ACL: AclEntries.from_json,
    KeyKind.SCRAM_USER: ScramUser.from_json,
}


def _decode(kind: KeyKind, raw: bytes) -> object:
    return _DECODERS[kind](raw)
