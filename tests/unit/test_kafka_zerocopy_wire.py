"""Zero copy on the wire (fjord.kafka.server): a Fetch answer whose records are file regions,
sent by a real KafkaListener over loopback TCP (the frame's bytes written, each region with
``sendfile``: straight on the socket when it has room, through ``loop.sendfile`` for what it
did not take), arrives byte for byte as the frame a listener without zero copy sends with the
records encoded in it, at every Fetch version served, for several partitions of any sizes up
to several MiB (more than a loopback socket takes at once). A region whose file is shorter
than announced (its segment truncated meanwhile) closes the connection rather than sending a
frame shorter than its size prefix. The socket is corked (TCP_CORK) only while an answer's pieces
go in. FJORD_KAFKA_ZERO_COPY=false turns zero copy off."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse

from fjord.kafka.codec import encode_response
from fjord.kafka.dispatch import Api, KafkaDispatcher, RequestContext
from fjord.kafka.server import KafkaListener, _Pipeline, zero_copy_enabled
from fjord.kafka.zerocopy import FileBackedResponse
from fjord.observability import metrics
from fjord.storage.region import FileRegion

WAIT_S = 20.0
FETCH_VERSIONS = (4, 12)


def fetch_response(version: int, records: list[bytes | None]) -> Any:
    cls = FetchResponse[version]
    topic_cls = cls.FetchableTopicResponse
    part_cls = topic_cls.PartitionData
    return cls(throttle_time_ms=0, error_code=0, session_id=0, responses=[
        topic_cls(topic=f"t{i % 2}", partitions=[
            part_cls(partition_index=i, error_code=0, high_watermark=10, last_stable_offset=10,
                     log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1,
                     current_leader=part_cls.LeaderIdAndEpoch(leader_id=1, leader_epoch=0),
                     records=r)
        ])
        for i, r in enumerate(records)
    ])


def fetch_request_frame(version: int, correlation_id: int) -> bytes:
    cls = FetchRequest[version]
    request = cls(
        replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
        session_id=0, session_epoch=-1, topics=[cls.FetchTopic(topic="t0", partitions=[
            cls.FetchTopic.FetchPartition(partition=0, fetch_offset=0,
                                          partition_max_bytes=1 << 20, current_leader_epoch=-1,
                                          last_fetched_epoch=-1, log_start_offset=-1)])],
        forgotten_topics_data=[], rack_id="")
    request.with_header(correlation_id=correlation_id, client_id="t")
    return bytes(request.encode(version=version, header=True, framed=True))


class SegmentFile:
    """Record sets laid out in one file (after some unrelated bytes), as regions of it."""

    def __init__(self, path: Path, blobs: list[bytes | None], shrink_by: int = 0) -> None:
        self.blobs = blobs
        lead = os.urandom(37)
        data = lead + b"".join(b for b in blobs if b)
        path.write_bytes(data[: len(data) - shrink_by])
        self.fd = os.open(path, os.O_RDONLY)
        self.positions: list[int] = []
        position = len(lead)
        for blob in blobs:
            self.positions.append(position)
            position += len(blob or b"")

    def answer(self, version: int, zero_copy: bool) -> Any:
        """The handler's answer: records as regions (zero copy) or as bytes."""
        if not zero_copy:
            return fetch_response(version, self.blobs)
        file_backed = FileBackedResponse(None)
        fields: list[bytes | None] = [
            file_backed.add(FileRegion(os.dup(self.fd), position, len(blob))) if blob else blob
            for blob, position in zip(self.blobs, self.positions, strict=True)
        ]
        file_backed.response = fetch_response(version, fields)
        return file_backed

    def close(self) -> None:
        os.close(self.fd)


async def fetch_frame(segment: SegmentFile, version: int, zero_copy: bool) -> bytes:
    """The frame (size prefix included) a listener sends for ``segment``'s records; b"" plus
    whatever arrived when the connection closes first."""

    async def handler(request: Any, ctx: RequestContext) -> Any:
        assert ctx.zero_copy is zero_copy
        return segment.answer(ctx.api_version, ctx.zero_copy)

    listener = KafkaListener(KafkaDispatcher([Api(1, 4, 12, FetchRequest, handler)]),
                             "127.0.0.1", 0, name="test", zero_copy=zero_copy)
    port = await listener.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(fetch_request_frame(version, 7))
            async with asyncio.timeout(WAIT_S):
                prefix = await reader.readexactly(4)
                try:
                    return prefix + await reader.readexactly(struct.unpack(">i", prefix)[0])
                except asyncio.IncompleteReadError:
                    return b""
        finally:
            writer.close()
    finally:
        await listener.stop()


def sizes_strategy(max_size: int) -> st.SearchStrategy[list[int | None]]:
    return st.lists(st.one_of(st.none(), st.integers(0, max_size)), min_size=1, max_size=4)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(version=st.integers(*FETCH_VERSIONS), sizes=sizes_strategy(3 << 20))
def test_a_sendfile_answer_arrives_as_the_copied_answer(
    tmp_path: Path, version: int, sizes: list[int | None]
) -> None:
    blobs = [None if n is None else os.urandom(n) for n in sizes]
    segment = SegmentFile(tmp_path / "segment", blobs)
    try:
        sent = asyncio.run(fetch_frame(segment, version, zero_copy=True))
        copied = asyncio.run(fetch_frame(segment, version, zero_copy=False))
    finally:
        segment.close()
    assert sent == copied == bytes(encode_response(fetch_response(version, blobs), 7, version))


def waited_regions() -> float:
    return float(metrics.KAFKA_SENDFILE_REGIONS.labels("true")._value.get())


def test_regions_larger_than_the_socket_takes_wait_for_room_in_order(tmp_path: Path) -> None:
    blobs: list[bytes | None] = [os.urandom(24 << 20), os.urandom(100), os.urandom(9 << 20)]
    segment = SegmentFile(tmp_path / "segment", blobs)
    before = waited_regions()
    try:
        sent = asyncio.run(fetch_frame(segment, 12, zero_copy=True))
    finally:
        segment.close()
    assert sent == bytes(encode_response(fetch_response(12, blobs), 7, 12))
    assert waited_regions() > before  # the loop.sendfile path ran too


@pytest.mark.parametrize("size", [1_000, 24 << 20])
def test_a_region_past_the_end_of_its_file_closes_the_connection(
    tmp_path: Path, size: int
) -> None:
    segment = SegmentFile(tmp_path / "segment", [os.urandom(size)], shrink_by=10)
    try:
        assert asyncio.run(fetch_frame(segment, 12, zero_copy=True)) == b""
    finally:
        segment.close()


@pytest.mark.parametrize(("value", "enabled"), [
    (None, True), ("true", True), ("1", True), ("false", False), ("0", False), (" No ", False),
])
def test_zero_copy_switch(monkeypatch: pytest.MonkeyPatch, value: str | None,
                          enabled: bool) -> None:
    if value is None:
        monkeypatch.delenv("FJORD_KAFKA_ZERO_COPY", raising=False)
    else:
        monkeypatch.setenv("FJORD_KAFKA_ZERO_COPY", value)
    assert zero_copy_enabled() is enabled


@pytest.mark.skipif(not hasattr(socket, "TCP_CORK"), reason="TCP_CORK is Linux's")
@pytest.mark.parametrize("shrink_by", [0, 10])
def test_an_answer_leaves_the_socket_uncorked(tmp_path: Path, shrink_by: int) -> None:
    """The socket is corked only while an answer's pieces go in: afterwards (also after a
    region that came up short) nothing is held back."""
    blob = os.urandom(5_000)
    segment = SegmentFile(tmp_path / "segment", [blob], shrink_by=shrink_by)

    async def scenario() -> None:
        accepted: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()

        async def on_connect(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.set_result(writer)

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, client = await asyncio.open_connection("127.0.0.1", port)
        writer = await asyncio.wait_for(accepted, WAIT_S)
        pipeline = _Pipeline(writer)
        sock = writer.get_extra_info("socket")
        try:
            parts = [b"head", FileRegion(os.dup(segment.fd), segment.positions[0], len(blob)),
                     b"tail"]
            if shrink_by:
                with pytest.raises(ConnectionError):
                    await pipeline._write_parts(parts)
            else:
                await pipeline._write_parts(parts)
                expected = b"head" + blob + b"tail"
                assert await asyncio.wait_for(reader.readexactly(len(expected)), WAIT_S) \
                    == expected
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 0
        finally:
            pipeline.abort()
            client.close()
            writer.close()
            server.close()
            await server.wait_closed()

    try:
        asyncio.run(scenario())
    finally:
        segment.close()
