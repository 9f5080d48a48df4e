"""Several named Kafka doors per process (Kafka's listener names and
``listener.security.protocol.map``): parsing, what registrations carry, and that Metadata
and DescribeCluster name each node by the door of the listener the request came in on."""

from __future__ import annotations

import asyncio

import pytest
from kafka.protocol.metadata.metadata import MetadataRequest

from fjord._proto import broker_pb2
from fjord.errors import ConfigError, ErrorCode
from fjord.groups.defaults import OFFSETS_TOPIC, OFFSETS_TOPIC_PARTITIONS
from fjord.kafka.dispatch import RequestContext
from fjord.kafka.groups import FindCoordinatorHandler
from fjord.kafka.listeners import (
    KafkaDoor,
    door_for,
    parse_protocol_map,
    resolve_kafka_doors,
    resolve_listeners,
)
from fjord.kafka.metadata import KafkaMetadata, kafka_nodes, lowest_kafka_broker
from fjord.metadata import Keys, MetadataEvent, MetadataImage, OffsetsOwner, TopicRecord
from fjord.metadata.schema import (
    BrokerRegistration,
    CoordinatorRegistration,
    KafkaEndpoint,
    kafka_endpoint,
)


def test_named_listeners_map_to_protocols_and_keep_their_advertised_addresses() -> None:
    host, port, doors = resolve_kafka_doors(
        None, "GRPC://:9092,TLS://0.0.0.0:9095,scram://0.0.0.0:9096",
        "TLS://pod.svc:9095,SCRAM://pod.svc:0", 1, "tls:SSL,SCRAM:sasl_ssl",
    )
    assert (host, port) == ("0.0.0.0", 9092)
    assert doors == (
        KafkaDoor("TLS", "SSL", "0.0.0.0", 9095, ("pod.svc", 9095)),
        KafkaDoor("SCRAM", "SASL_SSL", "0.0.0.0", 9096, ("pod.svc", 0)),
    )
    assert (doors[0].tls, doors[0].sasl, doors[1].tls, doors[1].sasl) == (True, False, True, True)


def test_protocol_names_are_listener_names_without_a_map() -> None:
    _, _, doors = resolve_kafka_doors("h:1", "SSL://:9093,SASL_SSL://:9094", "", 1)
    assert [(d.name, d.protocol) for d in doors] == [("SSL", "SSL"), ("SASL_SSL", "SASL_SSL")]
    assert parse_protocol_map("internal:plaintext") == {"INTERNAL": "KAFKA"}


def test_the_one_door_form_still_resolves_and_refuses_two_doors() -> None:
    assert resolve_listeners("h:1", "SSL://:9095", "SSL://x:0", 1) == (
        "h", 1, ("0.0.0.0", 9095), ("x", 0)
    )
    with pytest.raises(ConfigError, match="one Kafka-protocol listener"):
        resolve_listeners("h:1", "SSL://:9093,SASL_SSL://:9094", "", 1)
    assert door_for(("h", 1), None, True, True).name == "SASL_SSL"
    assert door_for(("h", 1), None, False, True).protocol == "SASL_PLAINTEXT"
    assert door_for(("h", 1), None, False, False).protocol == "KAFKA"


@pytest.mark.parametrize("listeners,advertised,protocol_map,message", [
    ("TLS://:1", "", "", "unknown listener name 'TLS'"),
    ("TLS://:1", "", "TLS:TLS", "unknown protocol"),
    ("TLS://:1", "", "TLS", "expected NAME:PROTOCOL"),
    ("TLS://:1", "", "TLS:SSL,tls:SSL", "named twice"),
    ("GRPC://:2", "", "GRPC:SSL", "invalid listener name"),
    ("SSL://:1", "", "SSL:SASL_SSL", "protocol's own name"),
    ("SSL://:1", "SASL_SSL://h:1", "", "SASL_SSL is not in --listeners"),
    ("SSL://:1,TLS://:1", "", "TLS:SSL", "two Kafka listeners on one address"),
])
def test_bad_listener_options_are_named(
    listeners: str, advertised: str, protocol_map: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_kafka_doors("h:9", listeners, advertised, 1, protocol_map)


def test_registrations_carry_every_named_endpoint_and_older_ones_answer_any_listener() -> None:
    endpoints = (KafkaEndpoint("TLS", "b1", 9095), KafkaEndpoint("SCRAM", "b1", 9096))
    broker = BrokerRegistration(1, "b1", 9092, None, "b1", 9095, "i", None, None, endpoints)
    assert BrokerRegistration.from_json(broker.to_json()) == broker
    coordinator = CoordinatorRegistration(2, "c2", 9094, "c2", 9095, None, None, None, endpoints)
    assert CoordinatorRegistration.from_json(coordinator.to_json()) == coordinator
    assert kafka_endpoint(broker, "SCRAM") == ("b1", 9096)
    assert kafka_endpoint(broker, "TLS") == ("b1", 9095)
    assert kafka_endpoint(broker, "OTHER") is None
    assert kafka_endpoint(broker, "") == ("b1", 9095)
    older = BrokerRegistration(3, "b3", 9092, None, "b3", 9095)
    assert b"kafka_listeners" not in older.to_json()
    assert kafka_endpoint(older, "SCRAM") == ("b3", 9095)
    assert kafka_endpoint(BrokerRegistration(4, "b4", 9092), "TLS") is None


def _image() -> MetadataImage:
    keys = Keys("c1")

    def named(host: str) -> tuple[KafkaEndpoint, ...]:
        return (KafkaEndpoint("TLS", host, 9095), KafkaEndpoint("SCRAM", host, 9096))

    events = [
        MetadataEvent.put(keys.broker(1), BrokerRegistration(
            1, "b1", 9092, "r1", "b1", 9095, kafka_listeners=named("b1")).to_json(), 1, 1),
        # Only a TLS door: a SCRAM client is not told about it.
        MetadataEvent.put(keys.broker(2), BrokerRegistration(
            2, "b2", 9092, None, "b2", 9095,
            kafka_listeners=(KafkaEndpoint("TLS", "b2", 9095),)).to_json(), 2, 2),
        MetadataEvent.put(keys.coordinator(1), CoordinatorRegistration(
            1, "c1", 9094, "c1", 9095, kafka_listeners=named("c1")).to_json(), 3, 3),
    ]
    return MetadataImage.empty("c1").apply(events)


def test_kafka_nodes_are_the_doors_of_the_asking_listener() -> None:
    image = _image()
    coordinator = kafka_nodes(image, "TLS")[-1][0]
    assert kafka_nodes(image, "TLS") == [
        (1, "b1", 9095, "r1"), (2, "b2", 9095, None), (coordinator, "c1", 9095, None)
    ]
    assert kafka_nodes(image, "SCRAM") == [(1, "b1", 9096, "r1"), (coordinator, "c1", 9096, None)]
    assert lowest_kafka_broker(image, "SCRAM") == 1
    assert kafka_nodes(image, "NONE") == []


def test_metadata_answers_each_listener_with_its_own_addresses() -> None:
    image = _image()
    metadata = KafkaMetadata(lambda: image, lambda _r, _c: broker_pb2.MetadataResponse(
        cluster_id="c1"), lowest_kafka_broker)

    def ask(listener: str) -> list[tuple[int, str, int]]:
        ctx = RequestContext(3, 9, 1, "t", listener=listener)
        answer = asyncio.run(metadata.metadata(MetadataRequest[9](topics=None), ctx))
        return [(b.node_id, b.host, b.port) for b in answer.brokers]

    assert [(h, p) for _, h, p in ask("SCRAM")] == [("b1", 9096), ("c1", 9096)]
    assert [(h, p) for _, h, p in ask("TLS")] == [("b1", 9095), ("b2", 9095), ("c1", 9095)]


def test_find_coordinator_names_the_coordinators_door_of_the_asking_listener() -> None:
    keys = Keys("c1")
    image = _image().apply(
        [MetadataEvent.put(keys.topic(OFFSETS_TOPIC),
                           TopicRecord("1" * 32, OFFSETS_TOPIC_PARTITIONS, 3).to_json(), 4, 4)]
        + [MetadataEvent.put(keys.offsets_owner(p), OffsetsOwner(1, 1).to_json(), 5, 5)
           for p in range(OFFSETS_TOPIC_PARTITIONS)]
    )
    finder = FindCoordinatorHandler(lambda: image)
    assert finder.locate("g", 0, None, "SCRAM")[3:] == ("c1", 9096)
    assert finder.locate("g", 0, None, "TLS")[3:] == ("c1", 9095)
    error, message, *_ = finder.locate("g", 0, None, "OTHER")
    assert error is ErrorCode.COORDINATOR_NOT_AVAILABLE and "listener OTHER" in message
