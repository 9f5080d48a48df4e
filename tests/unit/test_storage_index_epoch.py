"""Sparse indexes and the leader epoch cache: lookups against brute force, files, checks."""

from __future__ import annotations

import itertools
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from fjord.storage.epoch import LeaderEpochCache, parse_checkpoint
from fjord.storage.index import OffsetIndex, TimeIndex

BASE = 1000


@st.composite
def offset_entries(draw: st.DrawFn) -> list[tuple[int, int]]:
    gaps = draw(st.lists(st.tuples(st.integers(1, 50), st.integers(1, 5000)), max_size=40))
    entries, offset, position = [], BASE, 0
    for offset_gap, position_gap in gaps:
        offset += offset_gap
        position += position_gap
        entries.append((offset, position))
    return entries


@settings(max_examples=60, deadline=None)
@given(entries=offset_entries(), probe=st.integers(BASE - 5, BASE + 2100))
def test_offset_index_lookup_is_the_last_entry_at_or_before(
    entries: list[tuple[int, int]], probe: int
) -> None:
    index = OffsetIndex(Path("/nonexistent/x.index"), BASE, 1000)
    for offset, position in entries:
        index.append(offset, position)
    at_or_before = [e for e in entries if e[0] <= probe]
    assert index.lookup(probe) == (at_or_before[-1] if at_or_before else (BASE, 0))
    by_position = [e for e in entries if e[1] <= probe * 10]
    assert index.lookup_position(probe * 10) == (by_position[-1] if by_position else (BASE, 0))


def test_offset_index_file_round_trip_truncate_and_sanity(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000001000.index"
    index = OffsetIndex(path, BASE, 100)
    for i in range(1, 6):
        index.append(BASE + 10 * i, 100 * i)
    index.write_pending()
    assert path.stat().st_size == 5 * 8
    assert path.read_bytes()[:8] == (10).to_bytes(4, "big") + (100).to_bytes(4, "big")
    loaded = OffsetIndex(path, BASE, 100)
    assert loaded.load(segment_size=501)
    assert list(loaded.positions) == [100, 200, 300, 400, 500]
    assert not OffsetIndex(path, BASE, 100).load(segment_size=500)  # position past the log end
    loaded.truncate_to_offset(BASE + 30)
    assert list(loaded.positions) == [100, 200]
    assert path.stat().st_size == 16
    path.write_bytes(path.read_bytes() + b"\x00\x00\x00")  # torn entry
    assert not OffsetIndex(path, BASE, 100).load(10_000)
    path.write_bytes(bytes.fromhex("0000000a00000064 00000005000000c8".replace(" ", "")))
    assert not OffsetIndex(path, BASE, 100).load(10_000)  # offsets not increasing
    assert not OffsetIndex(tmp_path / "missing.index", BASE, 100).load(10)


def test_index_full_by_entry_count(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "a.index", 0, max_entries=2)
    index.append(1, 10)
    assert not index.is_full
    index.append(2, 20)
    assert index.is_full


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.integers(-1, 500), min_size=1, max_size=40),
    probe=st.integers(-2, 510),
)
def test_time_index_lookup_never_skips_the_answer(batches: list[int], probe: int) -> None:
    """Model: batch i has offset BASE + i and max timestamp batches[i]; entries are added like
    the segment does. Scanning from lookup(probe) must still find the first batch >= probe."""
    index = TimeIndex(Path("/nonexistent/x.timeindex"), BASE, 1000)
    max_so_far, offset_of_max = -1, BASE
    for i, ts in enumerate(batches):
        if ts > max_so_far:
            max_so_far, offset_of_max = ts, BASE + i
        if i % 3 == 2:
            index.maybe_append(max_so_far, offset_of_max)
    assert list(index.timestamps) == sorted(set(index.timestamps))
    start = index.lookup(probe)
    expected = next((BASE + i for i, ts in enumerate(batches) if ts >= probe), None)
    found = next(
        (BASE + i for i, ts in enumerate(batches) if ts >= probe and BASE + i >= start), None
    )
    assert found == expected


def test_time_index_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "0.timeindex"
    index = TimeIndex(path, 0, 100)
    index.maybe_append(100, 0)
    index.maybe_append(90, 5)  # not newer: ignored
    index.maybe_append(200, 7)
    index.write_pending()
    loaded = TimeIndex(path, 0, 100)
    assert loaded.load(max_relative_offset=10)
    assert (list(loaded.timestamps), list(loaded.relative_offsets)) == ([100, 200], [0, 7])
    assert not TimeIndex(path, 0, 100).load(max_relative_offset=6)
    loaded.truncate_to_offset(7)
    assert list(loaded.timestamps) == [100]


def test_epoch_cache_assign_and_end_offsets(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path / "leader-epoch-checkpoint")
    assert cache.end_offset_for(0, 10) == (-1, -1)
    assert cache.assign(1, 0)
    assert not cache.assign(1, 5)  # same epoch, later offset: no change
    assert cache.assign(3, 10)
    assert cache.assign(5, 20)
    assert cache.entries == [(1, 0), (3, 10), (5, 20)]
    assert cache.end_offset_for(5, 33) == (5, 33)  # latest epoch: the log end
    assert cache.end_offset_for(3, 33) == (3, 20)
    assert cache.end_offset_for(4, 33) == (3, 20)  # unknown epoch between: floor's end
    assert cache.end_offset_for(0, 33) == (0, 0)  # older than all: first start
    assert cache.end_offset_for(6, 33) == (-1, -1)
    assert cache.end_offset_for(-1, 33) == (-1, -1)
    assert cache.epoch_for_offset(15) == 3
    # changes reach the file at sync (the log's flush or close), not one write per change
    assert not (tmp_path / "leader-epoch-checkpoint").exists() and cache.write_pending
    cache.sync()
    assert not cache.write_pending
    assert (tmp_path / "leader-epoch-checkpoint").read_text() == "0\n3\n1 0\n3 10\n5 20\n"
    assert cache.assign(4, 15)  # a new epoch below 5: conflicting later entries go
    assert cache.entries == [(1, 0), (3, 10), (4, 15)]
    assert cache.assign(6, 12)  # an earlier start offset: later-starting entries go
    assert cache.entries == [(1, 0), (3, 10), (6, 12)]
    cache.truncate_from_end(11)
    assert cache.entries == [(1, 0), (3, 10)]
    cache.truncate_from_start(12)
    assert cache.entries == [(3, 12)]
    assert not cache.assign(-1, 20)
    cache.sync()
    reloaded, intact = LeaderEpochCache.load(tmp_path / "leader-epoch-checkpoint")
    assert intact and reloaded.entries == [(3, 12)]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 200)), max_size=30))
def test_epoch_cache_stays_strictly_monotonic(assignments: list[tuple[int, int]]) -> None:
    cache = LeaderEpochCache(Path("/nonexistent/never-written"))
    for epoch, offset in assignments:
        cache.assign(epoch, offset)
        entries = cache.entries
        assert all(a[0] < b[0] and a[1] < b[1] for a, b in itertools.pairwise(entries))
        assert entries[-1][0] == epoch  # the assigned epoch is always the latest afterwards
        assert entries[-1][1] <= offset


def test_malformed_checkpoints_are_rejected(tmp_path: Path) -> None:
    assert parse_checkpoint("0\n1\n2 5\n") == [(2, 5)]
    for bad in ["", "1\n0\n", "0\n2\n1 0\n", "0\n1\nx y\n", "0\n2\n2 5\n1 9\n", "0\n1\n-1 0\n"]:
        assert parse_checkpoint(bad) is None, bad
    (tmp_path / "cp").write_bytes(b"\xff\xfe")
    cache, intact = LeaderEpochCache.load(tmp_path / "cp")
    assert not intact and cache.entries == []
