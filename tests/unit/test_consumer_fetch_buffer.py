"""The consumer's pure collection core (``fjord.client.fetcher.FetchBuffer`` over
``CompletedFetch``): a batch that cannot be read never costs a record of another partition or a
record before it, and never moves a position past a record that was not returned."""

from __future__ import annotations

import struct
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.client.fetcher import CompletedFetch, FetchBuffer
from fjord.client.types import TopicPartition
from fjord.errors import CorruptRecordError, RecordDeserializationError
from fjord.records.builder import BatchBuilder
from fjord.records.header import CRC_START, crc32c, stamp_batch
from tests.helpers.records import RecordListSink

DAMAGE = ("crc", "record_count", "codec", "magic")
"""Ways a fetched batch cannot be read: a flipped byte under the CRC; a record count that does
not match the records (CRC recomputed); records that claim gzip but are not (CRC recomputed);
a magic byte other than 2."""


@cache
def _batch(base: int, count: int, damage: str | None = None) -> bytes:
    builder = BatchBuilder()
    for i in range(count):
        builder.append(1000 + base + i, f"k{base + i}".encode(), f"v{base + i}".encode())
    raw = bytearray(builder.build())
    stamp_batch(raw, 0, base, 0)
    if damage == "crc":
        raw[-3] ^= 0x5A
    elif damage == "magic":
        raw[16] = 1
    elif damage in ("record_count", "codec"):
        if damage == "record_count":
            (n,) = struct.unpack_from(">i", raw, 57)
            struct.pack_into(">i", raw, 57, n + 1)
        else:
            (attributes,) = struct.unpack_from(">h", raw, 21)
            struct.pack_into(">h", raw, 21, attributes | 1)  # gzip
        struct.pack_into(">I", raw, 17, crc32c(memoryview(raw)[CRC_START:]))
    return bytes(raw)


class _Partition:
    """One partition's log: consecutive batches from offset 0, at most one damaged."""

    def __init__(self, tp: TopicPartition, sizes: list[int], damaged: int | None, kind: str):
        self.tp = tp
        self.bases: list[int] = []
        self.batches: list[bytes] = []
        base = 0
        for i, size in enumerate(sizes):
            self.bases.append(base)
            self.batches.append(_batch(base, size, kind if i == damaged else None))
            base += size
        self.end = base
        self.damaged = damaged
        self.bad_range = (
            range(self.bases[damaged], self.bases[damaged] + sizes[damaged])
            if damaged is not None
            else range(0)
        )

    def fetches(self, split: int) -> list[CompletedFetch]:
        """The log as one fetch, or two (a prefetch continuing at batch ``split``)."""
        cut = split if 0 < split < len(self.batches) else len(self.batches)
        out = [CompletedFetch(self.tp, 0, b"".join(self.batches[:cut]), self.end)]
        if cut < len(self.batches):
            out.append(
                CompletedFetch(self.tp, self.bases[cut], b"".join(self.batches[cut:]), self.end)
            )
        return out

    def refetch(self, offset: int) -> CompletedFetch | None:
        """What a Fetch at ``offset`` answers: the batches from the one holding it."""
        first = max((i for i, b in enumerate(self.bases) if b <= offset), default=0)
        if offset >= self.end:
            return None
        return CompletedFetch(self.tp, offset, b"".join(self.batches[first:]), self.end)


partition_spec = st.tuples(
    st.lists(st.integers(1, 4), min_size=1, max_size=5),  # records per batch
    st.integers(-2, 4),  # index of the damaged batch (out of range: none)
    st.sampled_from(DAMAGE),
    st.integers(0, 5),  # where the data is split into a fetch and a prefetch
)


def collect_via(into: bool):  # type: ignore[no-untyped-def]
    """``FetchBuffer.collect``, or ``collect_into`` a sink (records in whole batches, as
    ``Consumer.poll_into`` takes them), answering the records either way."""
    if not into:
        return lambda buffer, positions, limit: buffer.collect(positions, set(), limit)[0]
    sink = RecordListSink()

    def collect(buffer, positions, limit):  # type: ignore[no-untyped-def]
        taken, _ = buffer.collect_into(positions, set(), limit, sink)
        out = sink.take()
        assert taken == len(out)
        return out

    return collect


@pytest.mark.parametrize("into", [False, True], ids=["collect", "collect_into"])
@settings(max_examples=300, deadline=None)
@given(
    specs=st.lists(partition_spec, min_size=1, max_size=3),
    order=st.randoms(use_true_random=False),
    limits=st.lists(st.integers(1, 7), min_size=1, max_size=6),
)
def test_no_position_passes_a_record_that_was_not_returned(into, specs, order, limits) -> None:  # type: ignore[no-untyped-def]
    parts = {}
    for p, (sizes, damaged, kind, _) in enumerate(specs):
        tp = TopicPartition("t", p)
        parts[tp] = _Partition(tp, sizes, damaged if 0 <= damaged < len(sizes) else None, kind)
    # Arrival order: any interleaving of the partitions' fetches, each partition's in order.
    queues = {tp: part.fetches(specs[tp.partition][3]) for tp, part in parts.items()}
    slots = [tp for tp, q in queues.items() for _ in q]
    order.shuffle(slots)
    buffer = FetchBuffer()
    for tp in slots:
        buffer.add(queues[tp].pop(0))

    positions = {tp: 0 for tp in parts}
    returned: dict[TopicPartition, list[int]] = {tp: [] for tp in parts}
    skipped: dict[TopicPartition, set[int]] = {tp: set() for tp in parts}
    errors = 0
    collect = collect_via(into)
    for step in range(10_000):
        try:
            out = collect(buffer, positions, limits[step % len(limits)])
        except RecordDeserializationError as exc:
            errors += 1
            tp = TopicPartition(exc.topic, exc.partition)
            part = parts[tp]
            assert part.damaged is not None and isinstance(exc, CorruptRecordError)
            # Raised only when nothing else was left: every other partition is done or stuck.
            for other, other_part in parts.items():
                stuck = other_part.damaged is not None and (
                    positions[other] == other_part.bases[other_part.damaged]
                )
                assert stuck or positions[other] == other_part.end
            assert exc.offset == positions[tp] == part.bases[part.damaged]
            following = part.damaged + 1
            expected_resume = part.bases[following] if following < len(part.bases) else None
            # The fetch that failed may end at the damaged batch (the rest in the prefetch).
            assert exc.resume_offset in (expected_resume, None)
            # The application seeks past the damaged batch; the fetcher refetches there.
            target = exc.resume_offset if exc.resume_offset is not None else part.bad_range.stop
            skipped[tp].update(range(positions[tp], target))
            positions[tp] = target
            buffer.drop(lambda t, tp=tp: t == tp)
            refetched = part.refetch(target)
            if refetched is not None:
                buffer.add(refetched)
            part.damaged = None
            continue
        if not out:
            break
        for record in out:
            tp = TopicPartition(record.topic, record.partition)
            returned[tp].append(record.offset)
            assert record.value == f"v{record.offset}".encode()
        # The property: below each position, every offset was returned or knowingly skipped.
        for tp in parts:
            assert returned[tp] == sorted(set(returned[tp]))  # in order, no duplicates
            below = set(range(positions[tp])) - skipped[tp]
            assert below == set(returned[tp])
    else:
        pytest.fail("collection did not finish")
    assert errors == sum(1 for part in parts.values() if part.bad_range)
    for tp, part in parts.items():
        assert positions[tp] == part.end
        assert returned[tp] == [o for o in range(part.end) if o not in part.bad_range]


def test_records_before_an_unreadable_batch_are_returned_first() -> None:
    """One fetch: two good batches, a bad one, a good one. The first poll returns the good
    records before it (not an error); the next raises at the bad batch's offset, again and
    again, naming the next intact batch; the other partition is collected around it."""
    bad = TopicPartition("t", 0)
    good = TopicPartition("t", 1)
    data = _batch(0, 3) + _batch(3, 2) + _batch(5, 4, "crc") + _batch(9, 2)
    buffer = FetchBuffer()
    buffer.add(CompletedFetch(bad, 0, data, 11))
    buffer.add(CompletedFetch(good, 0, _batch(0, 6), 6))
    positions = {bad: 0, good: 0}
    out, _ = buffer.collect(positions, set(), 100)
    assert [(r.partition, r.offset) for r in out] == [(0, o) for o in range(5)] + [
        (1, o) for o in range(6)
    ]
    assert positions == {bad: 5, good: 6}
    for _ in range(2):
        with pytest.raises(RecordDeserializationError) as caught:
            buffer.collect(positions, set(), 100)
        err = caught.value
        assert (err.topic, err.partition, err.offset, err.resume_offset) == ("t", 0, 5, 9)
        assert "CRC mismatch" in str(err) and "seek to 9" in str(err)
        assert isinstance(err.__cause__, CorruptRecordError)
        assert positions[bad] == 5
    positions[bad] = 9  # seek past it: the refetch answers from there
    buffer.drop(lambda t: t == bad)
    buffer.add(CompletedFetch(bad, 9, _batch(9, 2), 11))
    out, _ = buffer.collect(positions, set(), 100)
    assert [r.offset for r in out] == [9, 10] and positions[bad] == 11


def test_collect_into_takes_whole_batches_and_continues_after_records_left() -> None:
    """``collect_into`` adds whole batches until it has ``limit`` records (a batch is never
    split: the position moves past exactly what the sink got); records a ``collect`` decoded
    and left go to the sink first, as records."""
    tp = TopicPartition("t", 0)
    buffer = FetchBuffer()
    buffer.add(CompletedFetch(tp, 0, _batch(0, 3) + _batch(3, 4) + _batch(7, 2), 9))
    positions = {tp: 0}
    out, _ = buffer.collect(positions, set(), 1)  # decodes batch 0, takes one record of it
    assert [r.offset for r in out] == [0] and positions[tp] == 1
    sink = RecordListSink()
    taken, used_up = buffer.collect_into(positions, set(), 3, sink)
    # 2 records left of batch 0, then all 4 of batch 1 (3 were wanted: a batch is not split).
    assert taken == 6 and [r.offset for r in sink.take()] == [1, 2, 3, 4, 5, 6]
    assert positions[tp] == 7 and not used_up
    taken, used_up = buffer.collect_into(positions, set(), 3, sink)
    assert taken == 2 and [r.offset for r in sink.take()] == [7, 8]
    assert positions[tp] == 9 and used_up
    assert buffer.collect_into(positions, set(), 3, sink) == (0, False)


def test_records_stored_while_a_poll_waits_hand_it_the_gil() -> None:
    """The fetch loop hands the GIL to a ``poll()`` that waits for records (it would otherwise
    wait until the loop thread has sent its next Fetch), and only then: a poll() that is not
    waiting (busy decoding) must not delay the next Fetch."""
    from fjord._proto import broker_pb2
    from fjord.client.fetcher import Fetcher
    from fjord.client.subscription_state import SubscriptionState

    tp = TopicPartition("t", 0)
    state = SubscriptionState()
    state.assignment = [tp]
    state.positions[tp] = 0
    config = {"auto.offset.reset": "latest", "request.timeout.ms": 1000,
              "retry.backoff.ms": 100, "isolation.level": "read_uncommitted"}
    fetcher = Fetcher(state, None, None, config, None)  # type: ignore[arg-type]

    def answer(offset: int, records: bytes) -> broker_pb2.FetchResponse:
        response = broker_pb2.FetchResponse()
        response.topics.add(name="t").partitions.add(
            partition=0, high_watermark=offset + 2, records=records
        )
        return response

    assert not fetcher._store_fetch({tp: 0}, answer(0, _batch(0, 2)))
    assert not fetcher._hand_over  # nobody waited
    state.polls_waiting = 1
    assert not fetcher._store_fetch({tp: 2}, answer(2, b""))
    assert not fetcher._hand_over  # nothing arrived
    assert not fetcher._store_fetch({tp: 2}, answer(2, _batch(2, 2)))
    assert fetcher._hand_over
