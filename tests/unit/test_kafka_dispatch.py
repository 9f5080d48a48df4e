"""The Kafka listener's pure core: framing/header codec, version negotiation, dispatch decisions
(reply, no reply, close) and the ``listeners`` syntax."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse

from fjord.errors import ConfigError
from fjord.kafka.codec import MalformedFrameError, peek_prefix
from fjord.kafka.dispatch import Api, Close, KafkaDispatcher, Reply, RequestContext
from fjord.kafka.listeners import parse_listeners
from fjord.metadata.schema import BrokerRegistration, CoordinatorRegistration


async def _metadata(request: Any, ctx: RequestContext) -> Any:
    cls = MetadataResponse[ctx.api_version]
    names = [t.name for t in request.topics or []]
    return cls(brokers=[], cluster_id=ctx.client_id, controller_id=-1, topics=[
        cls.MetadataResponseTopic(error_code=3, name=n, partitions=[]) for n in names
    ])


async def _silent(request: Any, ctx: RequestContext) -> Any:
    return None


def _dispatcher(handler: Any = _metadata) -> KafkaDispatcher:
    return KafkaDispatcher([Api(3, 1, 12, MetadataRequest, handler)])


def _frame(request: Any, version: int, correlation_id: int = 5) -> bytes:
    request.with_header(correlation_id=correlation_id, client_id="unit")
    return bytes(request.encode(version=version, header=True))


def _dispatch(dispatcher: KafkaDispatcher, frame: bytes) -> Reply | Close:
    return asyncio.run(dispatcher.dispatch(frame))


def _decode(reply: Reply | Close, cls: Any, version: int) -> Any:
    assert isinstance(reply, Reply) and reply.frame is not None
    size = struct.unpack(">i", reply.frame[:4])[0]
    assert size == len(reply.frame) - 4
    return cls.decode(reply.frame[4:], version=version, header=True)


@pytest.mark.parametrize("version", range(0, 5))
def test_api_versions_advertises_exactly_the_table(version: int) -> None:
    request = ApiVersionsRequest[version](client_software_name="t", client_software_version="1")
    answer = _decode(_dispatch(_dispatcher(), _frame(request, version, 9)),
                     ApiVersionsResponse, version)
    assert answer.header.correlation_id == 9 and answer.error_code == 0
    assert {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys} == {
        3: (1, 12), 18: (0, 4)
    }


def test_unknown_api_versions_version_gets_v0_unsupported_version() -> None:
    frame = struct.pack(">hhih", 18, 77, 4, -1)
    answer = _decode(_dispatch(_dispatcher(), frame), ApiVersionsResponse, 0)
    assert answer.error_code == 35 and answer.header.correlation_id == 4
    assert {k.api_key for k in answer.api_keys} == {3, 18}


@pytest.mark.parametrize("version", range(1, 13))
def test_request_decoded_and_answered_at_its_version(version: int) -> None:
    cls = MetadataRequest[version]
    request = cls(topics=[cls.MetadataRequestTopic(name="a")], allow_auto_topic_creation=False)
    answer = _decode(_dispatch(_dispatcher(), _frame(request, version, 77)),
                     MetadataResponse, version)
    assert answer.header.correlation_id == 77
    assert [(t.name, t.error_code) for t in answer.topics] == [("a", 3)]


def test_handler_without_response_sends_nothing() -> None:
    request = MetadataRequest[4](topics=None, allow_auto_topic_creation=False)
    assert _dispatch(_dispatcher(_silent), _frame(request, 4)) == Reply(None)


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\x00\x03\x00",
        struct.pack(">hhi", 9999, 0, 1),  # unknown api key
        struct.pack(">hhi", 3, 0, 1),  # below the supported versions
        struct.pack(">hhi", 3, 13, 1),  # above
        struct.pack(">hhih", 3, 4, 1, 500) + b"xy",  # client id longer than the frame
        struct.pack(">hhih", 18, 3, 1, -1) + b"\x05",  # ApiVersions v3 body cut short
    ],
)
def test_bad_frames_close_the_connection(frame: bytes) -> None:
    outcome = _dispatch(_dispatcher(), frame)
    assert isinstance(outcome, Close) and outcome.reason


def test_peek_prefix_needs_eight_bytes() -> None:
    assert peek_prefix(struct.pack(">hhi", 1, 2, 3)).correlation_id == 3
    with pytest.raises(MalformedFrameError):
        peek_prefix(b"\x00" * 7)


def test_api_versions_outside_the_spec_are_refused() -> None:
    with pytest.raises(ValueError):
        Api(3, 0, 99, MetadataRequest, _metadata)
    with pytest.raises(ValueError):
        KafkaDispatcher([Api(3, 1, 2, MetadataRequest, _metadata)] * 2)


def test_parse_listeners() -> None:
    assert parse_listeners("KAFKA://0.0.0.0:9092, grpc://[::1]:9093") == {
        "KAFKA": ("0.0.0.0", 9092), "GRPC": ("::1", 9093)
    }
    assert parse_listeners("KAFKA://:0") == {"KAFKA": ("0.0.0.0", 0)}
    assert parse_listeners("KAFKA://host") == {"KAFKA": ("host", 9092)}
    assert parse_listeners("") == {}
    for bad in ("PLAINTEXT://h:1", "KAFKA://h:x", "KAFKA://h:70000", "h:1", "GRPC://h",
                "KAFKA://a:1,KAFKA://b:2"):
        with pytest.raises(ConfigError, match="listeners"):
            parse_listeners(bad)


def test_registrations_carry_the_kafka_endpoint() -> None:
    broker = BrokerRegistration(1, "h", 2, "r", "k", 9092)
    assert BrokerRegistration.from_json(broker.to_json()) == broker
    plain = BrokerRegistration(1, "h", 2)
    assert b"kafka" not in plain.to_json()
    assert BrokerRegistration.from_json(plain.to_json()) == plain
    coordinator = CoordinatorRegistration(3, "h", 4, "k", 9093)
    assert CoordinatorRegistration.from_json(coordinator.to_json()) == coordinator
