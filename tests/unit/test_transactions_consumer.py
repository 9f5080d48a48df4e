"""The consumer's read_committed filter (Kafka's client rule) over a fetch's bytes and aborted
list: aborted transactional batches are dropped, markers never returned, positions move past
both; read_uncommitted returns every data record."""

from __future__ import annotations

import pytest

from fjord.client.fetcher import CompletedFetch, FetchBuffer
from fjord.client.types import TopicPartition
from fjord.records.builder import BatchBuilder
from fjord.records.control import build_control_batch
from fjord.records.header import stamp_batch
from tests.helpers.records import RecordListSink

TP = TopicPartition("t", 0)


def at(offset: int, raw: bytes) -> bytes:
    batch = bytearray(raw)
    stamp_batch(batch, 0, offset, 0)
    return bytes(batch)


def data(offset: int, values: list[str], pid: int = -1, txn: bool = False) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                           base_sequence=0 if pid >= 0 else -1, is_transactional=txn)
    for v in values:
        builder.append(1, None, v.encode())
    return at(offset, builder.build())


def mark(offset: int, pid: int, commit: bool) -> bytes:
    return at(offset, build_control_batch(pid, 0, committed=commit, coordinator_epoch=0,
                                          timestamp_ms=1))


# offsets: 0 plain | 1-2 txn 7 (aborted) | 3 txn 8 (committed) | 4 txn 7 (aborted) |
#          5 ABORT 7 | 6 COMMIT 8 | 7-8 txn 7 again (committed) | 9 COMMIT 7 | 10 plain
LOG = (data(0, ["p0"]) + data(1, ["a1", "a2"], 7, True) + data(3, ["c3"], 8, True)
       + data(4, ["a4"], 7, True) + mark(5, 7, False) + mark(6, 8, True)
       + data(7, ["c7", "c8"], 7, True) + mark(9, 7, True) + data(10, ["p10"]))


@pytest.fixture(params=["collect", "collect_into"])
def into(request: pytest.FixtureRequest) -> bool:
    """Each test runs with poll()'s collection and with poll_into()'s (whole batches)."""
    return bool(request.param == "collect_into")


def collect(cf: CompletedFetch, start: int, into: bool) -> tuple[list[str], int]:
    buffer = FetchBuffer()
    buffer.add(cf)
    positions = {TP: start}
    values: list[str] = []
    sink = RecordListSink()
    while True:
        # Small polls: state kept across them.
        if into:
            buffer.collect_into(positions, set(), 2, sink)
            out = sink.take()
        else:
            out, _ = buffer.collect(positions, set(), 2)
        if not out:
            return values, positions[TP]
        values.extend((r.value or b"").decode() for r in out)


def test_read_committed_drops_aborted_batches_and_markers(into: bool) -> None:
    values, position = collect(CompletedFetch(TP, 0, LOG, 11, aborted=[(7, 1)]), 0, into)
    assert values == ["p0", "c3", "c7", "c8", "p10"]
    assert position == 11


def test_read_uncommitted_returns_every_data_record(into: bool) -> None:
    values, position = collect(CompletedFetch(TP, 0, LOG, 11), 0, into)
    assert values == ["p0", "a1", "a2", "c3", "a4", "c7", "c8", "p10"]
    assert position == 11


def test_fetch_starting_inside_an_aborted_transaction_and_ending_in_markers(into: bool) -> None:
    tail = LOG[len(data(0, ["p0"]) + data(1, ["a1", "a2"], 7, True) + data(3, ["c3"], 8, True)):]
    values, position = collect(CompletedFetch(TP, 4, tail, 11, aborted=[(7, 1)]), 4, into)
    assert values == ["c7", "c8", "p10"] and position == 11
    only_markers = mark(5, 7, False) + mark(6, 8, True)
    values, position = collect(CompletedFetch(TP, 5, only_markers, 7, aborted=[(7, 1)]), 5, into)
    assert values == [] and position == 7  # the position moves past control batches
