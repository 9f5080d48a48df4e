"""Kafka's topic name rules (fjord.topic_names), shared by client, broker and controller; the
producer refuses an illegal name at once, before it asks anyone for metadata."""

from __future__ import annotations

import asyncio
import socket
import string
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fjord.client import AsyncProducer, Producer
from fjord.errors import ErrorCode, InvalidTopicError
from fjord.topic_names import MAX_TOPIC_NAME_LENGTH, topic_name_problem, validate_topic_name

LEGAL_CHARS = string.ascii_letters + string.digits + "._-"
ILLEGAL = [".", "..", "", "x" * (MAX_TOPIC_NAME_LENGTH + 1), "a b", "a/b", "é", "a:b", "t\n"]


@given(st.text(alphabet=LEGAL_CHARS + " /:é\x00*", max_size=260))
def test_legal_exactly_when_kafkas_rules_hold(name: str) -> None:
    legal = (
        0 < len(name) <= MAX_TOPIC_NAME_LENGTH
        and name not in (".", "..")
        and all(c in LEGAL_CHARS for c in name)
    )
    assert (topic_name_problem(name) is None) == legal
    if not legal:
        with pytest.raises(InvalidTopicError) as refused:
            validate_topic_name(name)
        assert refused.value.code is ErrorCode.INVALID_TOPIC_EXCEPTION
        assert not refused.value.retriable


def _dead_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("name", ILLEGAL)
def test_producer_refuses_an_illegal_name_at_once(name: str) -> None:
    # No broker listens at the bootstrap address: the answer cannot come from metadata, and
    # it must not wait for max.block.ms (60 s here).
    config = {"bootstrap.servers": _dead_address(), "max.block.ms": 60000}
    started = time.monotonic()
    with Producer(config) as producer:
        with pytest.raises(InvalidTopicError):
            producer.send(name, b"x")
        with pytest.raises(InvalidTopicError):
            producer.partitions_for(name)
    assert time.monotonic() - started < 10

    async def async_send() -> None:
        async with AsyncProducer(config) as aproducer:
            with pytest.raises(InvalidTopicError):
                await aproducer.send(name, b"x")

    asyncio.run(async_send())
