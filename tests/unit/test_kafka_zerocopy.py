"""Zero-copy Fetch frames (fjord.kafka.zerocopy): a frame encoded with records markers and
spliced with file regions is byte for byte the frame kafka-python encodes with the records
themselves, at every Fetch version the listener serves, for several partitions of any sizes;
the log hands out regions only for verified segments."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.fetch import FetchResponse

from fjord.kafka.codec import encode_response
from fjord.kafka.zerocopy import (
    FileBackedResponse,
    SpliceError,
    materialize,
    splice_frame,
)
from fjord.records import BatchBuilder
from fjord.storage import PartitionLog
from fjord.storage.region import FileRegion


def fetch_response(version: int, records: list[bytes | None]) -> object:
    cls = FetchResponse[version]
    topic_cls = cls.FetchableTopicResponse
    part_cls = topic_cls.PartitionData
    return cls(throttle_time_ms=0, error_code=0, session_id=0, responses=[
        topic_cls(topic="t", partitions=[
            part_cls(partition_index=i, error_code=0, high_watermark=10, last_stable_offset=10,
                     log_start_offset=0, aborted_transactions=None, preferred_read_replica=-1,
                     current_leader=part_cls.LeaderIdAndEpoch(leader_id=1, leader_epoch=0),
                     records=r)
            for i, r in enumerate(records)
        ])
    ])


@settings(max_examples=60, deadline=None)
@given(version=st.integers(4, 12),
       sizes=st.lists(st.one_of(st.none(), st.integers(0, 70_000)), min_size=1, max_size=4))
def test_spliced_frame_equals_the_encoded_frame(
    tmp_path_factory: pytest.TempPathFactory, version: int, sizes: list[int | None]
) -> None:
    path = tmp_path_factory.mktemp("zc") / "segment"
    blobs = [None if n is None else os.urandom(n) for n in sizes]
    prefix = os.urandom(37)
    path.write_bytes(prefix + b"".join(b for b in blobs if b))
    fd = os.open(path, os.O_RDONLY)
    try:
        file_backed = FileBackedResponse(None)
        fields: list[bytes | None] = []
        position = len(prefix)
        for blob in blobs:
            if not blob:
                fields.append(blob)  # null and empty records stay as they are
                continue
            fields.append(file_backed.add(FileRegion(os.dup(fd), position, len(blob))))
            position += len(blob)
        spliced = splice_frame(
            encode_response(fetch_response(version, fields), 7, version), file_backed.regions
        )
        expected = encode_response(fetch_response(version, blobs), 7, version)
        assert materialize(spliced) == bytes(expected)
        file_backed.close()
    finally:
        os.close(fd)


def test_a_marker_not_found_once_is_refused(tmp_path: Path) -> None:
    file_backed = FileBackedResponse(None)
    region = FileRegion(-1, 0, 5)
    marker = file_backed.add(region)
    frame = encode_response(fetch_response(12, [b"x" * 16]), 1, 12)
    with pytest.raises(SpliceError):
        splice_frame(frame, file_backed.regions)  # absent
    twice = encode_response(fetch_response(12, [marker, marker]), 1, 12)
    with pytest.raises(SpliceError):
        splice_frame(twice, file_backed.regions)


def test_log_regions_only_for_verified_segments(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0")
    builder = BatchBuilder()
    for i in range(3):
        builder.append(1_000 + i, None, b"v%d" % i)
    log.append(builder.build(), 0)
    assert log.serves_regions_at(0)  # written here: the read needs no worker thread
    region = log.read_region(0, 1 << 20)
    assert isinstance(region, FileRegion) and region.read() == log.read(0, 1 << 20)
    assert region.end_offset == 3  # read_committed bounds its aborted transactions with it
    region.close()
    assert region.fd == -1
    log.close()
    reopened = PartitionLog.open(tmp_path / "t-0")  # loaded from disk: not verified yet
    try:
        assert not reopened.serves_regions_at(0)
        assert reopened.read_region(0, 1 << 20) == reopened.read(0, 1 << 20)
        assert reopened.read_region(3, 1 << 20) == b""  # the log end
    finally:
        reopened.close()
