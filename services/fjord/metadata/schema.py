"""The etcd key schema of a Fjord cluster and the JSON values stored under each key.

Every key lives under ``/fjord/<cluster_id>/`` and holds one JSON object (UTF-8):

=====================================  ==========================================================
key (relative to the cluster prefix)   value
=====================================  ==========================================================
``controller``                         :class:`ControllerRegistration` of the active controller,
                                       bound to its lease; its create revision is the
                                       controller epoch
``controllers/<id>``                   :class:`ControllerRegistration` of each live controller
``brokers/<id>``                       :class:`BrokerRegistration`, bound to the broker's lease;
                                       its create revision is the broker epoch
``topics/<name>``                      :class:`TopicRecord`
``topics/<name>/<partition>``          :class:`PartitionState`
``cluster-config``                     :class:`ClusterConfig` (``{k: v}`` topic/broker defaults:
                                       Kafka's dynamic cluster-wide broker defaults)
``broker-configs/<id>``                :class:`ClusterConfig`: one broker's dynamic configs
                                       (Kafka's ``/config/brokers/<id>``)
``producer-ids``                       :class:`ProducerIdBlock` (``{"next": int}``)
``coordinators/<id>``                  :class:`CoordinatorRegistration`, bound to the
                                       coordinator's lease; its create revision is the
                                       coordinator's epoch
``offsets-owners/<p>``                 :class:`OffsetsOwner`: which coordinator serves the
                                       groups of ``__consumer_offsets`` partition ``p``
``acls/<Type>/<Pattern>/<name>``       :class:`AclEntries`: the ACL entries of one resource
                                       pattern (``TOPIC``/``GROUP``/``CLUSTER``/
                                       ``TRANSACTIONAL_ID``, ``LITERAL``/``PREFIXED``, the
                                       name percent-encoded: group names may hold ``/``), as
                                       Kafka's ``/kafka-acl/<Type>/<name>`` znodes
``scram-users/<user>``                 :class:`ScramUser`: a user's salted SCRAM credentials
                                       by mechanism (the name percent-encoded), as Kafka's
                                       ``/config/users/<user>`` znode; never a password
=====================================  ==========================================================

Topic names never contain ``/`` (see :mod:`fjord.controller.topics`), so the partition keys
parse without ambiguity. Decoding is strict: a value of the wrong shape raises
:class:`InvalidMetadataError` naming the field, never a bare ``KeyError``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from urllib.parse import quote, unquote

from fjord.errors import ErrorCode, FjordError
from fjord.security.acls import (
    AccessControlEntry,
    AclError,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from fjord.security.scram import ScramCredential, ScramCredentialError

ROOT_PREFIX = "/fjord/"


class InvalidMetadataError(FjordError):
    """A metadata value in etcd that is not valid JSON of the expected shape."""

    code = ErrorCode.UNKNOWN_SERVER_ERROR


def _load_object(raw: bytes | str, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidMetadataError(f"{what}: not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise InvalidMetadataError(f"{what}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _int(obj: dict[str, Any], name: str, what: str) -> int:
    value = obj.get(name)
    # bool is an int subclass in Python; JSON true/false is never a valid number here.
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidMetadataError(f"{what}: field {name!r} must be an integer, got {value!r}")
    return value


def _str(obj: dict[str, Any], name: str, what: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str):
        raise InvalidMetadataError(f"{what}: field {name!r} must be a string, got {value!r}")
    return value


def _int_list(obj: dict[str, Any], name: str, what: str) -> tuple[int, ...]:
    value = obj.get(name)
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise InvalidMetadataError(f"{what}: field {name!r} must be a list of integers")
    return tuple(value)


def _str_map(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidMetadataError(f"{what}: expected an object of string values")
    return dict(value)


def _dump(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class ControllerRegistration:
    """A controller process: its id, the gRPC address it serves on and its SASL gRPC door's
    (``None`` without one). JSON: ``{"id", "host", "port"[, "sasl_grpc": {"host", "port"}]}``."""

    id: int
    host: str
    port: int
    sasl_host: str | None = None
    sasl_port: int | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def to_json(self) -> bytes:
        obj: dict[str, Any] = {"id": self.id, "host": self.host, "port": self.port}
        if self.sasl_host is not None and self.sasl_port is not None:
            obj["sasl_grpc"] = {"host": self.sasl_host, "port": self.sasl_port}
        return _dump(obj)

    @classmethod
    def from_json(cls, raw: bytes | str) -> ControllerRegistration:
        what = "controller registration"
        obj = _load_object(raw, what)
        sasl_host, sasl_port = _kafka_endpoint(obj, what, "sasl_grpc")
        return cls(_int(obj, "id", what), _str(obj, "host", what), _int(obj, "port", what),
                   sasl_host, sasl_port)


@dataclass(frozen=True)
class BrokerRegistration:
    """A live broker: id, gRPC address, optional rack (``None`` when not set), the advertised
    address of its Kafka-protocol listener (``kafka_host``/``kafka_port``, ``None`` when it
    opens none) and its ``incarnation``: a random id new at every start of a broker process
    (``None`` from brokers that predate it). The same incarnation under a new epoch is the same
    process registered again (its lease expired while etcd was away); a new incarnation is a
    restart, whose predecessor's place in ISRs and leadership the controller ends; the
    advertised address of its SASL gRPC door (``sasl_host``/``sasl_port``, ``None`` without
    one: fjord.sasl_door); ``kafka_listeners``: every Kafka door's advertised address by
    listener name (``kafka`` is the first's; empty from brokers that predate it, see
    :func:`kafka_endpoint`); the advertised address of its direct door
    (``direct_host``/``direct_port``, ``None`` without one: fjord.direct_frames). JSON:
    ``{"id", "host", "port", "rack"[, "kafka": {"host", "port"}][, "incarnation"][,
    "sasl_grpc": {"host", "port"}][, "kafka_listeners": [{"name", "host", "port"}]][,
    "direct": {"host", "port"}]}``."""

    id: int
    host: str
    port: int
    rack: str | None = None
    kafka_host: str | None = None
    kafka_port: int | None = None
    incarnation: str | None = None
    sasl_host: str | None = None
    sasl_port: int | None = None
    kafka_listeners: tuple[KafkaEndpoint, ...] = ()
    direct_host: str | None = None
    direct_port: int | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def to_json(self) -> bytes:
        obj: dict[str, Any] = {"id": self.id, "host": self.host, "port": self.port,
                               "rack": self.rack}
        obj.update(_kafka_json(self.kafka_host, self.kafka_port))
        obj.update(_listeners_json(self.kafka_listeners))
        if self.incarnation is not None:
            obj["incarnation"] = self.incarnation
        if self.sasl_host is not None and self.sasl_port is not None:
            obj["sasl_grpc"] = {"host": self.sasl_host, "port": self.sasl_port}
        if self.direct_host is not None and self.direct_port is not None:
            obj["direct"] = {"host": self.direct_host, "port": self.direct_port}
        return _dump(obj)

    @classmethod
    def from_json(cls, raw: bytes | str) -> BrokerRegistration:
        what = "broker registration"
        obj = _load_object(raw, what)
        rack = obj.get("rack")
        if rack is not None and not isinstance(rack, str):
            raise InvalidMetadataError(f"{what}: field 'rack' must be a string or null")
        incarnation = obj.get("incarnation")
        if incarnation is not None and not isinstance(incarnation, str):
            raise InvalidMetadataError(f"{what}: field 'incarnation' must be a string")
        kafka_host, kafka_port = _kafka_endpoint(obj, what)
        sasl_host, sasl_port = _kafka_endpoint(obj, what, "sasl_grpc")
        direct_host, direct_port = _kafka_endpoint(obj, what, "direct")
        return cls(
            _int(obj, "id", what), _str(obj, "host", what), _int(obj, "port", what), rack or None,
            kafka_host, kafka_port, incarnation, sasl_host, sasl_port, _listeners(obj, what),
            direct_host, direct_port,
        )


@dataclass(frozen=True)
class KafkaEndpoint:
    """The advertised address of one named Kafka listener of a process (the name upper-case,
    as fjord.kafka.listeners gives it)."""

    name: str
    host: str
    port: int


def kafka_endpoint(
    registration: BrokerRegistration | CoordinatorRegistration, listener: str
) -> tuple[str, int] | None:
    """Where a client that came in on ``listener`` reaches ``registration``'s Kafka door:
    the endpoint of that name; a registration without named endpoints (older processes, one
    door) answers its one door for any listener, and so does every registration for ``""``
    (the listener unknown); None: no such door (Kafka's LISTENER_NOT_FOUND)."""
    if registration.kafka_listeners and listener:
        for endpoint in registration.kafka_listeners:
            if endpoint.name == listener:
                return endpoint.host, endpoint.port
        return None
    if registration.kafka_host is None or registration.kafka_port is None:
        return None
    return registration.kafka_host, registration.kafka_port


def _listeners_json(endpoints: tuple[KafkaEndpoint, ...]) -> dict[str, Any]:
    if not endpoints:
        return {}
    return {"kafka_listeners": [{"name": e.name, "host": e.host, "port": e.port}
                                for e in endpoints]}


def _listeners(obj: dict[str, Any], what: str) -> tuple[KafkaEndpoint, ...]:
    raw = obj.get("kafka_listeners")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
        raise InvalidMetadataError(f"{what}: field 'kafka_listeners' must be a list of objects")
    return tuple(
        KafkaEndpoint(_str(e, "name", what), _str(e, "host", what), _int(e, "port", what))
        for e in raw
    )


def _kafka_json(host: str | None, port: int | None) -> dict[str, Any]:
    return {} if host is None or port is None else {"kafka": {"host": host, "port": port}}


def _kafka_endpoint(obj: dict[str, Any], what: str, field: str = "kafka"
                    ) -> tuple[str | None, int | None]:
    """The optional ``"kafka": {"host", "port"}`` endpoint of a registration (or another
    ``field`` of that shape)."""
    kafka = obj.get(field)
    if kafka is None:
        return None, None
    if not isinstance(kafka, dict):
        raise InvalidMetadataError(f"{what}: field {field!r} must be an object")
    return _str(kafka, "host", what), _int(kafka, "port", what)


@dataclass(frozen=True)
class CoordinatorRegistration:
    """A live group coordinator process: its id, the gRPC address it serves on, the
    advertised address of its Kafka-protocol listener (``None`` when it opens none) and its
    ``incarnation`` (random, new at every start; ``None`` without a ``--state-dir``, whose
    record of the previous run's is what lets a restart replace that run's registration at
    once) and its SASL gRPC door's address (``None`` without one); ``kafka_listeners`` as a
    broker's. JSON: ``{"id", "host", "port"[, "kafka": {"host", "port"}][, "incarnation"][,
    "sasl_grpc": {"host", "port"}][, "kafka_listeners": [{"name", "host", "port"}]]}``."""

    id: int
    host: str
    port: int
    kafka_host: str | None = None
    kafka_port: int | None = None
    incarnation: str | None = None
    sasl_host: str | None = None
    sasl_port: int | None = None
    kafka_listeners: tuple[KafkaEndpoint, ...] = ()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def to_json(self) -> bytes:
        obj: dict[str, Any] = {"id": self.id, "host": self.host, "port": self.port}
        obj.update(_kafka_json(self.kafka_host, self.kafka_port))
        obj.update(_listeners_json(self.kafka_listeners))
        if self.incarnation is not None:
            obj["incarnation"] = self.incarnation
        if self.sasl_host is not None and self.sasl_port is not None:
            obj["sasl_grpc"] = {"host": self.sasl_host, "port": self.sasl_port}
        return _dump(obj)

    @classmethod
    def from_json(cls, raw: bytes | str) -> CoordinatorRegistration:
        what = "coordinator registration"
        obj = _load_object(raw, what)
        kafka_host, kafka_port = _kafka_endpoint(obj, what)
        incarnation = obj.get("incarnation")
        if incarnation is not None and not isinstance(incarnation, str):
            raise InvalidMetadataError(f"{what}: field 'incarnation' must be a string")
        sasl_host, sasl_port = _kafka_endpoint(obj, what, "sasl_grpc")
        return cls(
            _int(obj, "id", what), _str(obj, "host", what), _int(obj, "port", what),
            kafka_host, kafka_port, incarnation, sasl_host, sasl_port, _listeners(obj, what),
        )


@dataclass(frozen=True)
class OffsetsOwner:
    """The coordinator that owns one ``__consumer_offsets`` partition.

    ``coordinator_epoch`` grows by one each time the controller moves the partition to
    another coordinator (or back), so a coordinator can tell a fresh assignment from the
    one it already served and replay the partition again, and the partition's leader refuses
    appends carrying an older epoch (a coordinator that has not noticed it lost the partition).
    """

    coordinator_id: int
    coordinator_epoch: int

    def to_json(self) -> bytes:
        return _dump(
            {"coordinator_id": self.coordinator_id, "coordinator_epoch": self.coordinator_epoch}
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> OffsetsOwner:
        what = "offsets owner"
        obj = _load_object(raw, what)
        return cls(_int(obj, "coordinator_id", what), _int(obj, "coordinator_epoch", what))


@dataclass(frozen=True)
class TopicRecord:
    """A topic: its id (32 hex digits), partition count, replication factor and config
    overrides (only the keys set for this topic; defaults come from ``cluster-config``)."""

    topic_id: str
    partitions: int
    replication_factor: int
    config: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return _dump(
            {
                "topic_id": self.topic_id,
                "partitions": self.partitions,
                "replication_factor": self.replication_factor,
                "config": dict(self.config),
            }
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> TopicRecord:
        what = "topic record"
        obj = _load_object(raw, what)
        return cls(
            _str(obj, "topic_id", what),
            _int(obj, "partitions", what),
            _int(obj, "replication_factor", what),
            _str_map(obj.get("config", {}), f"{what} config"),
        )


NO_LEADER = -1


@dataclass(frozen=True)
class PartitionState:
    """Replica set and leadership of one partition.

    Invariants (kept by the controller): ``isr`` is a subset of ``replicas``; ``leader`` is
    in ``isr`` or is :data:`NO_LEADER` (-1, offline); ``leader_epoch`` grows by one every time
    the leader changes; ``partition_epoch`` grows by one on every change of this state.

    During a reassignment (Kafka's procedure) ``replicas`` is the union of the old and the
    target replicas, target first; ``adding_replicas`` are the targets that were not replicas
    before and ``removing_replicas`` the old ones not in the target; both are empty otherwise
    (and then absent from the JSON, so older readers see the same value as before).
    """

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()

    @property
    def online(self) -> bool:
        return self.leader != NO_LEADER

    @property
    def reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

    @property
    def target_replicas(self) -> tuple[int, ...]:
        """The replicas this partition will have when its reassignment (if any) completes."""
        return tuple(r for r in self.replicas if r not in self.removing_replicas)

    def to_json(self) -> bytes:
        obj: dict[str, Any] = {
            "replicas": list(self.replicas),
            "isr": list(self.isr),
            "leader": self.leader,
            "leader_epoch": self.leader_epoch,
            "partition_epoch": self.partition_epoch,
        }
        if self.adding_replicas:
            obj["adding_replicas"] = list(self.adding_replicas)
        if self.removing_replicas:
            obj["removing_replicas"] = list(self.removing_replicas)
        return _dump(obj)

    @classmethod
    def from_json(cls, raw: bytes | str) -> PartitionState:
        what = "partition state"
        obj = _load_object(raw, what)
        return cls(
            _int_list(obj, "replicas", what),
            _int_list(obj, "isr", what),
            _int(obj, "leader", what),
            _int(obj, "leader_epoch", what),
            _int(obj, "partition_epoch", what),
            _int_list(obj, "adding_replicas", what) if "adding_replicas" in obj else (),
            _int_list(obj, "removing_replicas", what) if "removing_replicas" in obj else (),
        )


@dataclass(frozen=True)
class ClusterConfig:
    """Cluster-wide defaults for topic and broker configs (Kafka's names), ``{k: v}``."""

    values: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return _dump(dict(self.values))

    @classmethod
    def from_json(cls, raw: bytes | str) -> ClusterConfig:
        return cls(_str_map(_load_object(raw, "cluster config"), "cluster config"))


@dataclass(frozen=True)
class ProducerIdBlock:
    """The next producer id the controller hands out (blocks are allocated upwards)."""

    next: int

    def to_json(self) -> bytes:
        return _dump({"next": self.next})

    @classmethod
    def from_json(cls, raw: bytes | str) -> ProducerIdBlock:
        what = "producer id block"
        return cls(_int(_load_object(raw, what), "next", what))


@dataclass(frozen=True)
class AclEntries:
    """The ACL entries of one resource pattern: ``{"entries": [{"principal", "host",
    "operation", "permission"}, ...]}`` (Kafka's enum names). Invariant: sorted, no
    duplicates (the controller writes them so; decoding normalises)."""

    entries: tuple[AccessControlEntry, ...]

    def to_json(self) -> bytes:
        return _dump({"entries": [
            {"principal": e.principal, "host": e.host, "operation": e.operation.name,
             "permission": e.permission.name}
            for e in sorted(set(self.entries))
        ]})

    @classmethod
    def from_json(cls, raw: bytes | str) -> AclEntries:
        what = "acl entries"
        items = _load_object(raw, what).get("entries")
        if not isinstance(items, list):
            raise InvalidMetadataError(f"{what}: 'entries' must be a list")
        entries = []
        for item in items:
            if not isinstance(item, dict):
                raise InvalidMetadataError(f"{what}: each entry must be an object")
            try:
                entries.append(AccessControlEntry(
                    _str(item, "principal", what), _str(item, "host", what),
                    AclOperation.parse(_str(item, "operation", what)),
                    AclPermissionType.parse(_str(item, "permission", what)),
                ))
            except AclError as exc:
                raise InvalidMetadataError(f"{what}: {exc}") from None
        return cls(tuple(sorted(set(entries))))


@dataclass(frozen=True)
class ScramUser:
    """One user's SCRAM credentials: ``{"credentials": [ScramCredential JSON, ...]}``, at most
    one per mechanism (salt, iterations, StoredKey, ServerKey; no password)."""

    credentials: tuple[ScramCredential, ...]

    def to_json(self) -> bytes:
        ordered = sorted(self.credentials, key=lambda c: c.mechanism)
        return _dump({"credentials": [c.to_json() for c in ordered]})

    @classmethod
    def from_json(cls, raw: bytes | str) -> ScramUser:
        what = "scram user"
        items = _load_object(raw, what).get("credentials")
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise InvalidMetadataError(f"{what}: 'credentials' must be a list of objects")
        try:
            credentials = tuple(ScramCredential.from_json(item) for item in items)
        except ScramCredentialError as exc:
            raise InvalidMetadataError(f"{what}: {exc}") from None
        if len({c.mechanism for c in credentials}) != len(credentials):
            raise InvalidMetadataError(f"{what}: one credential per mechanism")
        return cls(credentials)

    def credential(self, mechanism: str) -> ScramCredential | None:
        return next((c for c in self.credentials if c.mechanism == mechanism), None)


class KeyKind(Enum):
    """What a key under the cluster prefix holds."""

    CONTROLLER = "controller"
    CONTROLLER_MEMBER = "controllers"
    BROKER = "brokers"
    TOPIC = "topic"
    PARTITION = "partition"
    CLUSTER_CONFIG = "cluster-config"
    BROKER_CONFIG = "broker-configs"
    PRODUCER_IDS = "producer-ids"
    COORDINATOR = "coordinators"
    OFFSETS_OWNER = "offsets-owners"
    ACL = "acls"
    SCRAM_USER = "scram-users"


@dataclass(frozen=True)
class ParsedKey:
    """A key split into its kind and parts: ``id`` for controllers/brokers/coordinators,
    ``topic`` and ``partition`` for topics and partitions, ``partition`` for offsets owners."""

    kind: KeyKind
    id: int | None = None
    topic: str | None = None
    partition: int | None = None
    acl_pattern: ResourcePattern | None = None
    user: str | None = None


_ID_KINDS = {
    "controllers": KeyKind.CONTROLLER_MEMBER,
    "brokers": KeyKind.BROKER,
    "broker-configs": KeyKind.BROKER_CONFIG,
    "coordinators": KeyKind.COORDINATOR,
}


def _parse_id(text: str) -> int | None:
    # Only canonical decimal ids ("7", never "07" or "+7") so each id has one key.
    if text.isdigit() and str(int(text)) == text:
        return int(text)
    return None


class Keys:
    """Key helpers for one cluster: every key is ``/fjord/<cluster_id>/...`` (str)."""

    def __init__(self, cluster_id: str) -> None:
        if not cluster_id or "/" in cluster_id:
            raise ValueError(f"invalid cluster id {cluster_id!r}: must be non-empty, no '/'")
        self.cluster_id = cluster_id
        self.prefix = f"{ROOT_PREFIX}{cluster_id}/"

    @property
    def controller(self) -> str:
        return self.prefix + "controller"

    @property
    def controllers_prefix(self) -> str:
        return self.prefix + "controllers/"

    def controller_member(self, controller_id: int) -> str:
        return f"{self.controllers_prefix}{controller_id}"

    @property
    def brokers_prefix(self) -> str:
        return self.prefix + "brokers/"

    def broker(self, broker_id: int) -> str:
        return f"{self.brokers_prefix}{broker_id}"

    @property
    def topics_prefix(self) -> str:
        return self.prefix + "topics/"

    def topic(self, name: str) -> str:
        return self.topics_prefix + name

    def topic_partitions_prefix(self, name: str) -> str:
        return self.topics_prefix + name + "/"

    def partition(self, name: str, partition: int) -> str:
        return f"{self.topics_prefix}{name}/{partition}"

    @property
    def cluster_config(self) -> str:
        return self.prefix + "cluster-config"

    @property
    def broker_configs_prefix(self) -> str:
        return self.prefix + "broker-configs/"

    def broker_config(self, broker_id: int) -> str:
        """One broker's dynamic configs (``fjord configs --entity-type brokers --alter``)."""
        return f"{self.broker_configs_prefix}{broker_id}"

    @property
    def producer_ids(self) -> str:
        return self.prefix + "producer-ids"

    @property
    def coordinators_prefix(self) -> str:
        return self.prefix + "coordinators/"

    def coordinator(self, coordinator_id: int) -> str:
        return f"{self.coordinators_prefix}{coordinator_id}"

    @property
    def offsets_owners_prefix(self) -> str:
        return self.prefix + "offsets-owners/"

    def offsets_owner(self, partition: int) -> str:
        return f"{self.offsets_owners_prefix}{partition}"

    @property
    def acls_prefix(self) -> str:
        return self.prefix + "acls/"

    def acl(self, pattern: ResourcePattern) -> str:
        """The key of ``pattern``'s entries (the name percent-encoded, so it holds no ``/``)."""
        name = quote(pattern.name, safe="")
        return f"{self.acls_prefix}{pattern.resource_type.name}/{pattern.pattern_type.name}/{name}"

    @property
    def scram_users_prefix(self) -> str:
        return self.prefix + "scram-users/"

    def scram_user(self, user: str) -> str:
        """The key of ``user``'s SCRAM credentials (the name percent-encoded)."""
        return self.scram_users_prefix + quote(user, safe="")

    def parse(self, key: str) -> ParsedKey | None:
        """The kind and parts of ``key``; ``None`` for keys outside this schema (ignored)."""
        if not key.startswith(self.prefix):
            return None
        rest = key[len(self.prefix) :]
        if rest == "controller":
            return ParsedKey(KeyKind.CONTROLLER)
        if rest == "cluster-config":
            return ParsedKey(KeyKind.CLUSTER_CONFIG)
        if rest == "producer-ids":
            return ParsedKey(KeyKind.PRODUCER_IDS)
        head, _, tail = rest.partition("/")
        if head in _ID_KINDS:
            ident = _parse_id(tail)
            if ident is None:
                return None
            return ParsedKey(_ID_KINDS[head], id=ident)
        if head == "offsets-owners":
            partition = _parse_id(tail)
            if partition is None:
                return None
            return ParsedKey(KeyKind.OFFSETS_OWNER, partition=partition)
        if head == "acls":
            pattern = _parse_acl_pattern(tail)
            return ParsedKey(KeyKind.ACL, acl_pattern=pattern) if pattern else None
        if head == "scram-users" and tail and "/" not in tail:
            try:
                user = unquote(tail, errors="strict")
            except UnicodeDecodeError:
                return None
            # One key per user: only the canonical encoding parses.
            if not user or quote(user, safe="") != tail:
                return None
            return ParsedKey(KeyKind.SCRAM_USER, user=user)
        if head == "topics" and tail:
            name, slash, part = tail.partition("/")
            if not name:
                return None
            if not slash:
                return ParsedKey(KeyKind.TOPIC, topic=name)
            partition = _parse_id(part)
            if partition is None:
                return None
            return ParsedKey(KeyKind.PARTITION, topic=name, partition=partition)
        return None


def _parse_acl_pattern(text: str) -> ResourcePattern | None:
    kind, _, rest = text.partition("/")
    pattern, _, name = rest.partition("/")
    if not name or "/" in name:
        return None
    try:
        parsed = ResourcePattern(
            ResourceType[kind], unquote(name, errors="strict"), PatternType[pattern]
        )
    except (KeyError, AclError, UnicodeDecodeError):
        return None
    # One key per pattern: only the canonical encoding parses.
    return parsed if quote(parsed.name, safe="") == name else None
