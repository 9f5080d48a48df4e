"""The metadata key schema, JSON codecs and the pure MetadataImage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.errors import ConfigError
from fjord.metadata import (
    BrokerRegistration,
    ClusterConfig,
    ControllerRegistration,
    CoordinatorRegistration,
    InvalidMetadataError,
    KeyKind,
    Keys,
    MetadataEvent,
    MetadataImage,
    ParsedKey,
    PartitionState,
    ProducerIdBlock,
    TopicRecord,
    parse_etcd_endpoint,
)

CID = "c1"
K = Keys(CID)


def put(key: str, value: bytes, rev: int, create: int | None = None) -> MetadataEvent:
    return MetadataEvent.put(key, value, create if create is not None else rev, rev)


# -- keys ------------------------------------------------------------------------------------


def test_key_layout_matches_the_contract() -> None:
    assert K.controller == "/fjord/c1/controller"
    assert K.controller_member(2) == "/fjord/c1/controllers/2"
    assert K.broker(3) == "/fjord/c1/brokers/3"
    assert K.topic("orders") == "/fjord/c1/topics/orders"
    assert K.partition("orders", 7) == "/fjord/c1/topics/orders/7"
    assert K.topic_partitions_prefix("orders") == "/fjord/c1/topics/orders/"
    assert K.cluster_config == "/fjord/c1/cluster-config"
    assert K.producer_ids == "/fjord/c1/producer-ids"


@pytest.mark.parametrize(
    ("key", "parsed"),
    [
        (K.controller, ParsedKey(KeyKind.CONTROLLER)),
        (K.controller_member(4), ParsedKey(KeyKind.CONTROLLER_MEMBER, id=4)),
        (K.broker(0), ParsedKey(KeyKind.BROKER, id=0)),
        (K.topic("a.b_c-1"), ParsedKey(KeyKind.TOPIC, topic="a.b_c-1")),
        (K.partition("t", 12), ParsedKey(KeyKind.PARTITION, topic="t", partition=12)),
        (K.cluster_config, ParsedKey(KeyKind.CLUSTER_CONFIG)),
        (K.producer_ids, ParsedKey(KeyKind.PRODUCER_IDS)),
    ],
)
def test_parse_round_trips_every_kind(key: str, parsed: ParsedKey) -> None:
    assert K.parse(key) == parsed


@pytest.mark.parametrize(
    "key",
    [
        "/fjord/c2/brokers/1",  # another cluster
        "/fjord/c1/brokers/x",
        "/fjord/c1/brokers/01",  # non-canonical id
        "/fjord/c1/brokers/-1",
        "/fjord/c1/brokers/",
        "/fjord/c1/topics/",
        "/fjord/c1/topics//1",
        "/fjord/c1/topics/t/p",
        "/fjord/c1/topics/t/1/2",
        "/fjord/c1/unknown",
        "/fjord/c1/coordinators/x",
        "/fjord/c1/coordinators/01",
        "/fjord/c1/offsets-owners/",
        "/fjord/c1/offsets-owners/-1",
    ],
)
def test_parse_ignores_foreign_and_malformed_keys(key: str) -> None:
    assert K.parse(key) is None


@pytest.mark.parametrize("bad", ["", "a/b"])
def test_cluster_id_must_be_a_single_path_segment(bad: str) -> None:
    with pytest.raises(ValueError, match="cluster id"):
        Keys(bad)


# -- codecs ----------------------------------------------------------------------------------

VALUES = [
    ControllerRegistration(1, "127.0.0.1", 9000),
    BrokerRegistration(2, "b2", 9092, "rack-a"),
    BrokerRegistration(3, "b3", 9093, None),
    BrokerRegistration(4, "b4", 9094, None, "b4", 39094, "0f" * 16),
    TopicRecord("0" * 32, 3, 1, {"retention.ms": "60000"}),
    PartitionState((1, 2, 3), (1, 2), 1, 4, 9),
    ClusterConfig({"min.insync.replicas": "2"}),
    ProducerIdBlock(1000),
    CoordinatorRegistration(3, "h", 4, "k", 9093, "0f" * 16),
    CoordinatorRegistration(3, "h", 4),
    # SASL gRPC doors (fjord.sasl_door)
    ControllerRegistration(1, "127.0.0.1", 9000, "127.0.0.1", 9100),
    BrokerRegistration(5, "b5", 9095, None, None, None, "0f" * 16, "b5", 9195),
    CoordinatorRegistration(3, "h", 4, None, None, None, "h", 5),
    # direct doors (fjord.direct_frames)
    BrokerRegistration(6, "b6", 9096, direct_host="b6", direct_port=9196),
    BrokerRegistration(7, "b7", 9097, "r", "b7", 39097, "0f" * 16, "b7", 9197, (),
                       "10.0.0.7", 9297),
]


def test_broker_registration_names_its_direct_door_only_when_it_has_one() -> None:
    with_door = BrokerRegistration(1, "h", 1, direct_host="h", direct_port=2)
    assert b'"direct":{"host":"h","port":2}' in with_door.to_json().replace(b" ", b"")
    assert b"direct" not in BrokerRegistration(1, "h", 1).to_json()
    # A registration written before direct doors existed parses, without one.
    old = BrokerRegistration.from_json(b'{"id": 1, "host": "h", "port": 1, "rack": null}')
    assert (old.direct_host, old.direct_port) == (None, None)


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_values_round_trip_through_json(value: object) -> None:
    assert type(value).from_json(value.to_json()) == value  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("cls", "raw", "field"),
    [
        (BrokerRegistration, b"[1]", "object"),
        (BrokerRegistration, b"\xff", "JSON"),
        (BrokerRegistration, b'{"id": "1", "host": "h", "port": 1}', "'id'"),
        (BrokerRegistration, b'{"id": true, "host": "h", "port": 1}', "'id'"),
        (BrokerRegistration, b'{"id": 1, "host": "h", "port": 1, "rack": 5}', "'rack'"),
        (BrokerRegistration, b'{"id": 1, "host": "h", "port": 1, "incarnation": 7}',
         "'incarnation'"),
        (BrokerRegistration, b'{"id": 1, "host": "h", "port": 1, "direct": 7}', "'direct'"),
        (BrokerRegistration, b'{"id": 1, "host": "h", "port": 1, "direct": {"host": "h"}}',
         "'port'"),
        (CoordinatorRegistration, b'{"id": 1, "host": "h", "port": 1, "incarnation": []}',
         "'incarnation'"),
        (ControllerRegistration, b'{"id": 1, "port": 1}', "'host'"),
        (TopicRecord, b'{"topic_id": "x", "partitions": 1, "replication_factor": 1, '
         b'"config": {"a": 1}}', "config"),
        (PartitionState, b'{"replicas": [1], "isr": ["1"], "leader": 1, "leader_epoch": 0, '
         b'"partition_epoch": 0}', "'isr'"),
        (ProducerIdBlock, b"{}", "'next'"),
        (ClusterConfig, b'{"a": null}', "string"),
    ],
)
def test_bad_values_raise_a_typed_error_naming_the_field(cls, raw, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidMetadataError, match=field):
        cls.from_json(raw)


# -- image -----------------------------------------------------------------------------------


def test_empty_image_has_nothing() -> None:
    image = MetadataImage.empty(CID)
    assert image.revision == 0
    assert image.controller is None
    assert dict(image.brokers) == {} and dict(image.topics) == {}
    assert dict(image.partitions("t")) == {}
    assert image.next_producer_id is None
    assert dict(image.cluster_config) == {}


def test_controller_epoch_is_the_create_revision_and_survives_updates() -> None:
    reg = ControllerRegistration(1, "h", 1)
    image = MetadataImage.empty(CID).apply([put(K.controller, reg.to_json(), 5)])
    assert image.controller is not None
    assert image.controller.epoch == 5 and image.controller.registration == reg
    image = image.apply([MetadataEvent.put(K.controller, reg.to_json(), 5, 8)])
    assert image.controller is not None and image.controller.epoch == 5
    image = image.apply([MetadataEvent.delete(K.controller, 9)])
    assert image.controller is None
    assert image.revision == 9


def test_brokers_and_epochs_follow_registrations() -> None:
    b1 = BrokerRegistration(1, "h1", 1, "r1")
    image = MetadataImage.empty(CID).apply([put(K.broker(1), b1.to_json(), 3)])
    assert image.broker(1) == b1 and image.broker_epoch(1) == 3
    image = image.apply([MetadataEvent.delete(K.broker(1), 4)])
    assert image.broker(1) is None and image.broker_epoch(1) is None
    # Re-registration: a new lease, a new create revision, a new epoch.
    image = image.apply([put(K.broker(1), b1.to_json(), 6)])
    assert image.broker_epoch(1) == 6


def test_topics_partitions_and_lookups_by_broker() -> None:
    topic = TopicRecord("a" * 32, 2, 2, {})
    p0 = PartitionState((1, 2), (1, 2), 1, 0, 0)
    p1 = PartitionState((2, 1), (2,), 2, 3, 5)
    image = MetadataImage.empty(CID).apply(
        [
            put(K.topic("b"), topic.to_json(), 2),
            put(K.partition("b", 0), p0.to_json(), 2),
            put(K.partition("b", 1), p1.to_json(), 2),
            put(K.topic("a"), topic.to_json(), 2),
            put(K.partition("a", 0), p1.to_json(), 2),
        ],
        revision=2,
    )
    assert image.topic_by_id("a" * 32) in {"a", "b"}
    assert image.topic_by_id("f" * 32) is None
    assert [(r.topic, r.partition) for r in image.partitions_led_by(2)] == [("a", 0), ("b", 1)]
    assert [(r.topic, r.partition) for r in image.partitions_replicated_on(1)] == [
        ("a", 0),
        ("b", 0),
        ("b", 1),
    ]
    # the same, unsorted, as the broker's apply reads it (every broker, every partition)
    for broker in (1, 2, 3):
        assert image.replica_states_on(broker) == {
            (r.topic, r.partition): r.state for r in image.partitions_replicated_on(broker)
        }
    assert image.partition("b", 1) == p1 and image.partition("b", 2) is None
    # Without its topic record a topic's partitions are hidden.
    image = image.apply([MetadataEvent.delete(K.topic("b"), 3)])
    assert image.topic("b") is None and dict(image.partitions("b")) == {}
    assert list(image.replica_states_on(1)) == [("a", 0)]
    assert [(r.topic, r.partition) for r in image.partitions_led_by(1)] == []


def test_partition_without_topic_record_is_hidden() -> None:
    state = PartitionState((1,), (1,), 1, 0, 0)
    image = MetadataImage.empty(CID).apply([put(K.partition("t", 0), state.to_json(), 2)])
    assert dict(image.partitions("t")) == {} and image.all_partitions() == []


def test_apply_never_mutates_the_old_image() -> None:
    state = PartitionState((1,), (1,), 1, 0, 0)
    old = MetadataImage.empty(CID).apply(
        [put(K.topic("t"), TopicRecord("x", 1, 1).to_json(), 1),
         put(K.partition("t", 0), state.to_json(), 1)]
    )
    new = old.apply([put(K.partition("t", 0), PartitionState((1,), (1,), -1, 1, 1).to_json(), 2)])
    assert old.partition("t", 0) == state
    assert new.partition("t", 0) is not None and not new.partition("t", 0).online  # type: ignore[union-attr]
    assert old.revision == 1 and new.revision == 2


def test_stale_events_are_ignored_and_revision_never_goes_back() -> None:
    b = BrokerRegistration(1, "h", 1)
    image = MetadataImage.empty(CID).apply([put(K.broker(1), b.to_json(), 10)])
    replay = image.apply([MetadataEvent.delete(K.broker(1), 10)], revision=3)
    assert replay.broker(1) == b and replay.revision == 10


def test_invalid_values_are_treated_as_absent_and_foreign_keys_ignored() -> None:
    b = BrokerRegistration(1, "h", 1)
    image = MetadataImage.empty(CID).apply([put(K.broker(1), b.to_json(), 1)])
    image = image.apply(
        [put(K.broker(1), b"garbage", 2), put("/fjord/other/brokers/2", b.to_json(), 2)]
    )
    assert dict(image.brokers) == {} and image.revision == 2


def test_cluster_config_and_producer_ids() -> None:
    image = MetadataImage.empty(CID).apply(
        [
            put(K.cluster_config, ClusterConfig({"a": "1"}).to_json(), 1),
            put(K.producer_ids, ProducerIdBlock(2000).to_json(), 1),
        ]
    )
    assert dict(image.cluster_config) == {"a": "1"} and image.next_producer_id == 2000
    image = image.apply([MetadataEvent.delete(K.cluster_config, 2)])
    assert dict(image.cluster_config) == {}


def test_lookups_are_read_only() -> None:
    image = MetadataImage.empty(CID)
    with pytest.raises(TypeError):
        image.brokers[1] = BrokerRegistration(1, "h", 1)  # type: ignore[index]


# -- property: incremental application equals a snapshot of the final state ------------------

_KEYS = st.sampled_from(
    [K.controller, K.broker(1), K.broker(2), K.controller_member(1), K.topic("t"),
     K.topic("u"), K.partition("t", 0), K.partition("t", 1), K.partition("u", 0),
     K.cluster_config, K.producer_ids]
)


def _value_for(key: str, n: int) -> bytes:
    kind = K.parse(key).kind  # type: ignore[union-attr]
    return {
        KeyKind.CONTROLLER: ControllerRegistration(n, "h", n).to_json(),
        KeyKind.CONTROLLER_MEMBER: ControllerRegistration(n, "h", n).to_json(),
        KeyKind.BROKER: BrokerRegistration(n, "h", n).to_json(),
        KeyKind.TOPIC: TopicRecord("x", n, 1).to_json(),
        KeyKind.PARTITION: PartitionState((n,), (n,), n, n, n).to_json(),
        KeyKind.CLUSTER_CONFIG: ClusterConfig({"k": str(n)}).to_json(),
        KeyKind.PRODUCER_IDS: ProducerIdBlock(n).to_json(),
    }[kind]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_KEYS, st.booleans(), st.integers(0, 5)), max_size=40),
       st.integers(1, 5))
def test_incremental_apply_equals_snapshot_of_final_state(ops, batch) -> None:  # type: ignore[no-untyped-def]
    """Replays ops (put or delete) as an etcd store would, in batches of revisions, and
    compares the incremental image with one built from the final store contents."""
    store: dict[str, tuple[bytes, int, int]] = {}  # key -> (value, create_rev, mod_rev)
    image = MetadataImage.empty(CID)
    pending: list[MetadataEvent] = []
    for rev, (key, is_put, n) in enumerate(ops, start=1):
        if is_put:
            create = store[key][1] if key in store else rev
            store[key] = (_value_for(key, n), create, rev)
            pending.append(MetadataEvent.put(key, store[key][0], create, rev))
        elif key in store:
            del store[key]
            pending.append(MetadataEvent.delete(key, rev))
        if len(pending) >= batch:
            image = image.apply(pending)
            pending = []
    image = image.apply(pending, revision=len(ops))
    snap = MetadataImage.from_snapshot(
        CID, [MetadataEvent.put(k, v, c, m) for k, (v, c, m) in store.items()], len(ops)
    )
    assert image.revision == snap.revision
    assert image.controller == snap.controller
    assert dict(image.controllers) == dict(snap.controllers)
    assert dict(image.brokers) == dict(snap.brokers)
    assert all(image.broker_epoch(b) == snap.broker_epoch(b) for b in (1, 2))
    assert dict(image.topics) == dict(snap.topics)
    assert image.all_partitions() == snap.all_partitions()
    assert dict(image.cluster_config) == dict(snap.cluster_config)
    assert image.next_producer_id == snap.next_producer_id


# -- etcd endpoints --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [("http://127.0.0.1:2379", ("127.0.0.1", 2379)), ("etcd.local:1", ("etcd.local", 1)),
     ("http://[::1]:2379/", ("::1", 2379)), ("https://etcd:2379", ("etcd", 2379))],
)
def test_parse_etcd_endpoint(url: str, expected: tuple[str, int]) -> None:
    assert parse_etcd_endpoint(url) == expected


def test_etcd_endpoint_scheme_says_tls() -> None:
    from fjord.metadata.etcd import parse_etcd_url

    assert parse_etcd_url("https://etcd:2379") == (True, "etcd", 2379)
    assert parse_etcd_url("etcd:2379") == (False, "etcd", 2379)


@pytest.mark.parametrize(
    "url", ["https://h", "http://h", "http://h:x", "http://h:1/path", "http://:1", "ftp://h:1"]
)
def test_bad_etcd_endpoint_names_etcd(url: str) -> None:
    with pytest.raises(ConfigError, match="etcd"):
        parse_etcd_endpoint(url)


def test_etcd_binary_is_found() -> None:
    from fjord.local import find_etcd_binary

    path = find_etcd_binary()
    assert path.endswith("etcd")


def test_coordinator_and_offsets_owner_keys_round_trip_through_the_image() -> None:
    from fjord.metadata import KeyKind, MetadataEvent, OffsetsOwner

    assert K.parse(K.coordinator(3)) == ParsedKey(KeyKind.COORDINATOR, id=3)
    assert K.parse(K.offsets_owner(49)) == ParsedKey(KeyKind.OFFSETS_OWNER, partition=49)
    image = MetadataImage.empty("c1").apply(
        [
            MetadataEvent.put(K.coordinator(3), CoordinatorRegistration(3, "h", 9).to_json(), 5, 5),
            MetadataEvent.put(K.offsets_owner(7), OffsetsOwner(3, 2).to_json(), 6, 6),
        ]
    )
    assert image.coordinators[3].address == "h:9"
    assert image.coordinator_epoch(3) == 5
    assert image.offsets_owner(7) == OffsetsOwner(3, 2)
    gone = image.apply([MetadataEvent.delete(K.coordinator(3), 7)])
    assert gone.coordinators == {} and gone.coordinator_epoch(3) is None
    assert image.coordinators[3].id == 3  # the older image never changes
    with pytest.raises(InvalidMetadataError):
        OffsetsOwner.from_json(b'{"coordinator_id": "3", "coordinator_epoch": 1}')


def test_acl_keys_encode_names_and_the_image_keeps_bindings() -> None:
    from fjord.metadata import AclEntries
    from fjord.security.acls import (
        AccessControlEntry,
        AclBinding,
        AclOperation,
        AclPermissionType,
        PatternType,
        ResourcePattern,
        ResourceType,
    )

    group = ResourcePattern(ResourceType.GROUP, "team/a b", PatternType.PREFIXED)
    key = K.acl(group)
    assert key == "/fjord/c1/acls/GROUP/PREFIXED/team%2Fa%20b"
    assert K.parse(key) == ParsedKey(KeyKind.ACL, acl_pattern=group)
    for bad in ("acls/GROUP/PREFIXED", "acls/NOPE/LITERAL/x", "acls/TOPIC/MATCH/x",
                "acls/TOPIC/LITERAL/a/b", "acls/TOPIC/LITERAL/%61"):
        assert K.parse(K.prefix + bad) is None, bad
    read = AccessControlEntry("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW)
    deny = AccessControlEntry("User:bob", "*", AclOperation.ALL, AclPermissionType.DENY)
    entries = AclEntries((read, deny, read))
    assert AclEntries.from_json(entries.to_json()) == AclEntries(tuple(sorted({read, deny})))
    image = MetadataImage.empty(CID).apply([put(key, entries.to_json(), 3)])
    assert image.acl_bindings() == sorted([AclBinding(group, read), AclBinding(group, deny)])
    identity = image.acls_identity
    assert image.apply([put(K.broker(1), BrokerRegistration(1, "h", 1).to_json(), 4)]
                       ).acls_identity is identity
    emptied = image.apply([put(key, AclEntries(()).to_json(), 5)])
    assert emptied.acls == {} and emptied.acls_identity is not identity
    assert image.apply([MetadataEvent.delete(key, 6)]).acl_bindings() == []
    bad = b'{"entries": [{"principal": "alice", "host": "*", "operation": "READ", ' \
          b'"permission": "ALLOW"}]}'
    with pytest.raises(InvalidMetadataError, match="User:<name>"):
        AclEntries.from_json(bad)
