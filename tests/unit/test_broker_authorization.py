"""The broker's ACL checks (fjord.broker.authorization) over a real MetadataImage holding ACL
keys: which topics of a request reach the core, what the refused ones are answered, Metadata
hiding, and InitProducerId's KIP-679 rule."""

from __future__ import annotations

from fjord._proto import broker_pb2, common_pb2
from fjord.broker.authorization import BrokerAuthorization
from fjord.errors import ErrorCode
from fjord.metadata import AclEntries, Keys, MetadataEvent, MetadataImage
from fjord.security import Principal
from fjord.security.acls import (
    AccessControl,
    AccessControlEntry,
    AclOperation,
    AclPermissionType,
    AuthorizerSettings,
    Caller,
    PatternType,
    ResourcePattern,
    ResourceType,
)

KEYS = Keys("c1")
ALICE = Caller(Principal("alice"), "10.0.0.1")
BOB = Caller(Principal("bob"), "10.0.0.2")
DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED.code


def image_with(*acls: tuple[ResourcePattern, AccessControlEntry]) -> MetadataImage:
    events = [
        MetadataEvent.put(KEYS.acl(pattern), AclEntries((entry,)).to_json(), i + 1, i + 1)
        for i, (pattern, entry) in enumerate(acls)
    ]
    return MetadataImage.empty("c1").apply(events)


def allow(kind: ResourceType, name: str, op: AclOperation, who: str = "alice",
          pattern: PatternType = PatternType.LITERAL) -> tuple[ResourcePattern, AccessControlEntry]:
    return (ResourcePattern(kind, name, pattern),
            AccessControlEntry(f"User:{who}", "*", op, AclPermissionType.ALLOW))


def gate(image: MetadataImage, denials: list[object] | None = None) -> BrokerAuthorization:
    access = AccessControl(AuthorizerSettings(),
                           (lambda op, kind: denials.append((op, kind))) if denials is not None
                           else None)
    return BrokerAuthorization(lambda: image, access)


def produce_request(*topics: str) -> broker_pb2.ProduceRequest:
    request = broker_pb2.ProduceRequest(acks=-1)
    for name in topics:
        request.topics.add(name=name).partitions.add(partition=0, records=b"x")
    return request


def test_only_writable_topics_reach_the_core_and_the_others_are_answered():
    denials: list[object] = []
    checks = gate(image_with(allow(ResourceType.TOPIC, "orders", AclOperation.WRITE)), denials)
    request = produce_request("orders", "secret")
    allowed, refused = checks.split_topics(ALICE, AclOperation.WRITE, request)
    assert [t.name for t in allowed.topics] == ["orders"] and allowed.acks == -1
    assert [t.name for t in refused] == ["secret"]
    assert [t.name for t in request.topics] == ["orders", "secret"]  # the request is untouched
    response = broker_pb2.ProduceResponse()
    checks.refuse_produce(ALICE, refused, response)
    (part,) = response.topics[0].partitions
    assert part.error.code == DENIED and part.base_offset == -1
    assert "User:alice is not authorized to Write topic secret" in part.error.message
    assert denials == [(AclOperation.WRITE, ResourceType.TOPIC)]
    same, none = checks.split_topics(ALICE, AclOperation.WRITE, produce_request("orders"))
    assert none == [] and [t.name for t in same.topics] == ["orders"]


def test_fetch_and_list_offsets_refusals():
    checks = gate(image_with(allow(ResourceType.TOPIC, "orders", AclOperation.READ)))
    fetch = broker_pb2.FetchRequest(replica_id=-1)
    fetch.topics.add(name="secret").partitions.add(partition=3)
    allowed, refused = checks.split_topics(ALICE, AclOperation.READ, fetch)
    assert not allowed.topics
    response = broker_pb2.FetchResponse()
    checks.refuse_fetch(ALICE, refused, response)
    part = response.topics[0].partitions[0]
    assert (part.partition, part.error.code, part.high_watermark) == (3, DENIED, -1)
    offsets = broker_pb2.ListOffsetsRequest()
    offsets.topics.add(name="orders").partitions.add(partition=0)
    offsets.topics.add(name="secret").partitions.add(partition=0)
    allowed, refused = checks.split_topics(ALICE, AclOperation.DESCRIBE, offsets)
    assert [t.name for t in allowed.topics] == ["orders"]  # Read implies Describe
    answer = broker_pb2.ListOffsetsResponse()
    checks.refuse_list_offsets(ALICE, refused, answer)
    assert answer.topics[0].partitions[0].error.code == DENIED


def test_metadata_hides_topics_or_names_the_refusal():
    denials: list[object] = []
    checks = gate(image_with(allow(ResourceType.TOPIC, "ord", AclOperation.DESCRIBE,
                                   pattern=PatternType.PREFIXED)), denials)
    response = broker_pb2.MetadataResponse(cluster_id="c1", topics=[
        common_pb2.TopicMetadata(name="orders"), common_pb2.TopicMetadata(name="secret")])
    everything = checks.filter_metadata(ALICE, broker_pb2.MetadataRequest(all_topics=True),
                                        response)
    assert [t.name for t in everything.topics] == ["orders"] and everything.cluster_id == "c1"
    assert denials == []  # hiding is not a denial
    named = checks.filter_metadata(ALICE, broker_pb2.MetadataRequest(topics=["orders", "secret"]),
                                   response)
    assert [(t.name, t.error.code) for t in named.topics] == [("orders", 0), ("secret", DENIED)]
    assert len(response.topics) == 2  # a cached answer is never changed
    visible = gate(image_with(allow(ResourceType.TOPIC, "*", AclOperation.READ)))
    assert visible.filter_metadata(ALICE, broker_pb2.MetadataRequest(all_topics=True),
                                   response) is response


def test_idempotent_producer_needs_idempotent_write_or_write_on_some_topic():
    assert not gate(image_with()).allows_idempotent_producer(ALICE)
    cluster_acl = allow(ResourceType.CLUSTER, "kafka-cluster", AclOperation.IDEMPOTENT_WRITE)
    assert gate(image_with(cluster_acl)).allows_idempotent_producer(ALICE)
    some_topic = gate(image_with(allow(ResourceType.TOPIC, "orders", AclOperation.WRITE)))
    assert some_topic.allows_idempotent_producer(ALICE)
    assert not some_topic.allows_idempotent_producer(BOB)
    off = BrokerAuthorization(lambda: image_with())
    assert off.allows_idempotent_producer(BOB) and not off.enabled
