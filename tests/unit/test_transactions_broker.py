"""The broker side of transactions, pure cores over real logs in temp dirs: producer state
tracks open transactions and the last stable offset, markers complete them, the ``.txnindex``
records aborted ones; leaders, followers and reopened logs agree."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fjord.broker.partition import Partition, PartitionAssignment
from fjord.broker.producer_state import (
    CompletedTxn,
    ProducerStateManager,
    load_producer_state,
    write_snapshot,
)
from fjord.errors import (
    CoordinatorFencedError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
)
from fjord.records.builder import BatchBuilder
from fjord.records.control import build_control_batch, read_control_batch
from fjord.records.header import crc32c, parse_header
from fjord.records.reader import read_batches
from fjord.storage import PartitionLog
from fjord.storage.config import LogConfig
from fjord.storage.txn_index import ENTRY_SIZE, AbortedTxn, TransactionIndex


def txn_batch(pid: int, seq: int, count: int = 2, epoch: int = 0, *, txn: bool = True) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                           is_transactional=txn)
    for i in range(count):
        builder.append(1000 + i, f"k{i}".encode(), f"{pid}-{seq}-{i}".encode())
    return builder.build()


def marker(pid: int, *, commit: bool, epoch: int = 0, coordinator_epoch: int = 0) -> bytes:
    return build_control_batch(pid, epoch, committed=commit, coordinator_epoch=coordinator_epoch,
                               timestamp_ms=2000)


def plain(value: bytes = b"x") -> bytes:
    builder = BatchBuilder()
    builder.append(1, b"k", value)
    return builder.build()


CONFIG = LogConfig.from_dict({"segment.bytes": 600})


def leader(directory: Path, replicas: tuple[int, ...] = (1,)) -> Partition:
    plog = PartitionLog.open(directory, CONFIG)
    return Partition("t", 0, 1, plog, PartitionAssignment(1, 1, replicas, replicas),
                     min_insync_replicas=1)


def follower(directory: Path) -> Partition:
    plog = PartitionLog.open(directory, CONFIG)
    return Partition("t", 0, 2, plog, PartitionAssignment(1, 1, (1, 2), (1, 2)),
                     min_insync_replicas=1)


# --- producer state, pure ------------------------------------------------------------------


def apply(state: ProducerStateManager, raw: bytes, first: int) -> CompletedTxn | None:
    h = parse_header(raw)
    mark = read_control_batch(raw) if h.is_control else None
    return state.apply_batch(h, first, first + h.last_offset_delta, mark)


def test_open_transactions_hold_the_last_stable_offset() -> None:
    state = ProducerStateManager()
    apply(state, plain(), 0)
    assert state.last_stable_offset(1) == 1
    apply(state, txn_batch(7, 0), 1)  # 1..2
    apply(state, txn_batch(8, 0), 3)  # 3..4
    apply(state, txn_batch(7, 2), 5)  # 5..6: still the same transaction of 7
    assert state.ongoing == {7: 1, 8: 3}
    assert state.last_stable_offset(7) == 1
    assert state.last_stable_offset(0) == 0  # never above the high watermark
    done = apply(state, marker(7, commit=True), 7)
    assert done == CompletedTxn(7, 1, 7, aborted=False)
    # The marker is not below the high watermark yet: still unstable from 1.
    assert state.last_stable_offset(7) == 1
    assert state.last_stable_offset(8) == 3
    done = apply(state, marker(8, commit=False), 8)
    assert done == CompletedTxn(8, 3, 8, aborted=True)
    assert state.stable_offset_after(done) == 9
    assert state.last_stable_offset(9) == 9 and not state.ongoing
    # A marker without an open transaction completes an empty one (Kafka's rule).
    assert apply(state, marker(9, commit=False), 9) == CompletedTxn(9, 9, 9, aborted=True)


def test_marker_fencing_and_expiration_keeps_open_transactions() -> None:
    state = ProducerStateManager(expiration_ms=10)
    apply(state, txn_batch(7, 0, epoch=3), 0)
    h = parse_header(marker(7, commit=True, epoch=2))
    with pytest.raises(InvalidProducerEpochError):
        state.check_marker(h, read_control_batch(marker(7, commit=True, epoch=2)))
    apply(state, marker(7, commit=False, epoch=4, coordinator_epoch=5), 2)
    assert state.producers[7].producer_epoch == 4
    late = marker(7, commit=False, epoch=4, coordinator_epoch=4)
    with pytest.raises(CoordinatorFencedError):
        state.check_marker(parse_header(late), read_control_batch(late))
    state.check_marker(parse_header(marker(99, commit=True)), read_control_batch(
        marker(99, commit=True)))  # an unknown producer: nothing to fence
    apply(state, txn_batch(8, 0), 3)
    assert state.remove_expired(10_000) == [7]  # 8 has an open transaction: kept
    assert 8 in state.producers


def test_snapshot_keeps_open_transactions_and_reads_version_1() -> None:
    state = ProducerStateManager()
    apply(state, txn_batch(7, 0), 0)
    apply(state, txn_batch(8, 0), 2)
    apply(state, marker(8, commit=True, coordinator_epoch=6), 4)
    restored = ProducerStateManager.from_snapshot_bytes(state.to_snapshot_bytes())
    assert restored.producers == state.producers
    assert restored.ongoing == {7: 0}
    assert restored.producers[8].coordinator_epoch == 6
    # A version 1 snapshot (before transactions): one producer, one batch.
    body = struct.pack(">qhqb", 5, 0, 1000, 1) + struct.pack(">iiqqq", 0, 1, 0, 1, 1000)
    head = bytearray(struct.pack(">hIqi", 1, 0, 2, 1))
    struct.pack_into(">I", head, 2, crc32c(body, crc32c(bytes(head[6:]))))
    old = ProducerStateManager.from_snapshot_bytes(bytes(head) + body)
    assert old.producers[5].last_sequence == 1 and not old.ongoing


# --- .txnindex ---------------------------------------------------------------------------


def test_txn_index_file_format_order_truncation_and_torn_entries(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.txnindex"
    index = TransactionIndex(path)
    assert not path.exists() and len(index) == 0
    a, b = AbortedTxn(10, 7, 3, 11), AbortedTxn(20, 8, 12, 15)
    assert index.append(a) and index.append(b)
    assert not index.append(a)  # a replay: already there
    with pytest.raises(Exception, match="not after"):
        index.append(AbortedTxn(15, 9, 14, 16))
    data = path.read_bytes()
    assert len(data) == 2 * ENTRY_SIZE == 68
    assert struct.unpack(">hqqqq", data[:34]) == (0, 7, 3, 10, 11)  # Kafka's AbortedTxn
    assert index.collect(11, 100) == ([b], False)
    assert index.collect(0, 12) == ([a], True)  # b starts at 12 and proves the end
    assert index.collect(0, 5) == ([a], True)  # a's last stable offset 11 >= 5: stop
    path.write_bytes(data + b"\x00\x00\x01")  # a torn last entry
    assert TransactionIndex(path).entries == [a, b]
    assert len(path.read_bytes()) == 68
    index = TransactionIndex(path)
    index.truncate_to(20)
    assert TransactionIndex(path).entries == [a]
    index.truncate_to(0)
    assert not path.exists()


# --- Partition: leader, follower, restart ---------------------------------------------------


def test_leader_lso_txnindex_follower_and_restart(tmp_path: Path) -> None:
    part = leader(tmp_path / "leader" / "t-0")
    part.append_as_leader(plain(), acks=1)  # 0
    part.append_as_leader(txn_batch(7, 0), acks=1)  # 1-2
    part.append_as_leader(txn_batch(8, 0), acks=1)  # 3-4
    assert part.high_watermark == 5 and part.last_stable_offset == 1
    part.append_marker(marker(7, commit=False))  # 5: abort 7
    assert part.last_stable_offset == 3
    part.append_as_leader(txn_batch(7, 2, epoch=0), acks=1)  # 6-7: a new txn of 7
    part.append_marker(marker(8, commit=True))  # 8
    part.append_as_leader(plain(), acks=1)  # 9
    assert part.last_stable_offset == 6
    part.append_marker(marker(7, commit=False))  # 10: abort 7 again
    assert part.last_stable_offset == part.high_watermark == 11
    assert part.aborted_transactions(0, 11) == [(7, 1), (7, 6)]
    assert part.aborted_transactions(6, 11) == [(7, 6)]
    assert part.aborted_transactions(0, 2) == [(7, 1)]
    # Clients may not write markers; a stale epoch marker is fenced; nothing appended.
    with pytest.raises(InvalidRecordError, match="control batches"):
        part.append_as_leader(marker(7, commit=True), acks=1)
    part.append_as_leader(txn_batch(7, 0, epoch=1), acks=1)  # 11-12 (epoch bump)
    with pytest.raises(InvalidProducerEpochError):
        part.append_marker(marker(7, commit=True, epoch=0))
    assert part.log_end_offset == 13 and part.last_stable_offset == 11
    # Kafka's rule: no non-transactional write while the producer's transaction is open.
    with pytest.raises(InvalidTxnStateError):
        part.append_as_leader(txn_batch(7, 2, epoch=1, txn=False), acks=1)
    assert part.log_end_offset == 13
    assert len(part.log.segments) > 1  # the entries are spread over segments

    # A follower copying the log has the same state and index.
    copy = follower(tmp_path / "follower" / "t-0")
    while copy.log_end_offset < part.log_end_offset:  # a read stops at a segment's end
        copy.append_as_follower(part.log.read(copy.log_end_offset, 1 << 20), part.high_watermark)
    # Replicated markers are forgotten as the high watermark passes them (followers too).
    assert not copy.producer_state.unreplicated and not part.producer_state.unreplicated
    assert copy.producer_state.ongoing == part.producer_state.ongoing == {7: 11}
    assert copy.aborted_transactions(0, 13) == part.aborted_transactions(0, 13)
    assert copy.last_stable_offset == 11

    # Reopened (a restart) with the .txnindex files gone and no snapshot: rebuilt from the log.
    part.log.close()
    for f in (tmp_path / "leader" / "t-0").glob("*.txnindex"):
        f.unlink()
    again = leader(tmp_path / "leader" / "t-0")
    assert again.aborted_transactions(0, 13) == [(7, 1), (7, 6)]
    assert again.producer_state.ongoing == {7: 11}
    again.update_follower_high_watermark(0)
    assert again.last_stable_offset == 11

    # With a snapshot in the middle the tail replay re-adds nothing twice.
    write_snapshot(again.log.directory, again.producer_state.to_snapshot_bytes(),
                   again.producer_state.end_offset)
    again.log.close()
    third = leader(tmp_path / "leader" / "t-0")
    assert third.aborted_transactions(0, 13) == [(7, 1), (7, 6)]
    third.log.close()

    # A follower truncating below a marker forgets its aborted transaction.
    copy.truncate_to(9)
    assert copy.aborted_transactions(0, 13) == [(7, 1)]
    assert copy.producer_state.ongoing == {7: 6}
    copy.log.close()


def test_unreplicated_marker_holds_the_lso_until_the_high_watermark_passes(
    tmp_path: Path,
) -> None:
    part = leader(tmp_path / "t-0", replicas=(1, 2))
    part.append_as_leader(txn_batch(7, 0), acks=1)  # 0-1
    part.record_follower_fetch(2, 2)
    assert part.high_watermark == 2 and part.last_stable_offset == 0
    part.append_marker(marker(7, commit=True))  # 2
    assert part.last_stable_offset == 0  # the marker is not replicated yet
    part.record_follower_fetch(2, 3)
    assert part.high_watermark == 3 and part.last_stable_offset == 3
    part.log.close()


# --- a model check: random transactions against a reference -----------------------------

OPS = st.lists(
    st.tuples(st.sampled_from(["data", "txn", "commit", "abort"]), st.integers(1, 3)),
    max_size=40,
)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPS)
def test_state_matches_a_reference_model_and_survives_reload(tmp_path_factory, ops) -> None:
    directory = tmp_path_factory.mktemp("model") / "t-0"
    part = leader(directory)
    sequences: dict[int, int] = {}
    open_first: dict[int, int] = {}
    aborted: list[tuple[int, int]] = []
    for op, pid in ops:
        end = part.log_end_offset
        if op == "data":
            part.append_as_leader(plain(), acks=1)
        elif op == "txn":
            seq = sequences.get(pid, 0)
            part.append_as_leader(txn_batch(pid, seq), acks=1)
            sequences[pid] = seq + 2
            open_first.setdefault(pid, end)
        else:
            part.append_marker(marker(pid, commit=op == "commit"))
            first = open_first.pop(pid, end)
            if op == "abort":
                aborted.append((pid, first))
        expected_lso = min(open_first.values(), default=part.log_end_offset)
        assert part.last_stable_offset == expected_lso
    assert part.aborted_transactions(0, part.log_end_offset) == aborted
    part.log.close()
    reloaded = leader(directory)
    assert reloaded.producer_state.ongoing == open_first
    assert reloaded.aborted_transactions(0, reloaded.log_end_offset) == aborted
    fresh = load_producer_state(reloaded.log)
    assert fresh.producers == reloaded.producer_state.producers
    reloaded.log.close()


# --- compaction keeps read_committed's view ---------------------------------------------------


def keyed_txn(pid: int, seq: int, items: list[tuple[bytes, bytes]]) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=0, base_sequence=seq,
                           is_transactional=True)
    for key, value in items:
        builder.append(1000, key, value)
    return builder.build()


def keyed(key: bytes, value: bytes) -> bytes:
    builder = BatchBuilder()
    builder.append(1000, key, value)
    return builder.build()


def committed_view(part: Partition) -> dict[bytes, bytes]:
    """The last value per key a read_committed reader gets (Kafka's client rule)."""
    from fjord.client.fetcher import CompletedFetch, FetchBuffer
    from fjord.client.types import TopicPartition

    tp = TopicPartition("t", 0)
    buffer = FetchBuffer()
    offset = part.log_start_offset
    view: dict[bytes, bytes] = {}
    while offset < part.last_stable_offset:
        data = part.log.read(offset, 1 << 20, part.last_stable_offset)
        aborted = part.aborted_transactions(offset, part.last_stable_offset)
        buffer.add(CompletedFetch(tp, offset, data, part.high_watermark, aborted))
        positions = {tp: offset}
        while True:
            out, _ = buffer.collect(positions, set(), 100)
            if not out:
                break
            view.update({r.key: r.value for r in out if r.key is not None})
        assert positions[tp] > offset
        offset = positions[tp]
    return view


def test_compaction_drops_aborted_records_and_keeps_markers_and_txnindex(
    tmp_path: Path,
) -> None:
    from fjord.storage.cleaner import clean_log

    config = LogConfig.from_dict({"segment.bytes": 300, "cleanup.policy": "compact"})
    part = Partition("t", 0, 1, PartitionLog.open(tmp_path / "t-0", config),
                     PartitionAssignment(1, 1, (1,), (1,)), min_insync_replicas=1)
    part.append_as_leader(keyed(b"k", b"committed-1"), acks=1)
    part.append_as_leader(keyed_txn(7, 0, [(b"k", b"aborted"), (b"j", b"aborted")]), acks=1)
    part.append_marker(marker(7, commit=False))
    part.append_as_leader(keyed_txn(8, 0, [(b"j", b"committed-j")]), acks=1)
    part.append_marker(marker(8, commit=True))
    for i in range(6):  # later segments, so the transactions sit in closed ones
        part.append_as_leader(keyed(b"other", f"o{i}".encode()), acks=1)
    before = committed_view(part)
    assert before == {b"k": b"committed-1", b"j": b"committed-j", b"other": b"o5"}
    stats = clean_log(part.log, now_ms=10**13, delete_retention_ms=0,
                      high_watermark=part.last_stable_offset)
    assert stats is not None and stats.records_kept < stats.records_read
    assert committed_view(part) == before  # the aborted write never displaced committed-1
    batches = [b for segment in part.log.segments
               for b in read_batches(segment.read(0, segment.size))]
    assert sum(b.header.is_control for b in batches) == 2  # both markers kept
    values = [r.value for b in batches if not b.header.is_control for r in b.records()]
    assert b"aborted" not in values and b"committed-1" in values
    assert part.aborted_transactions(0, part.log_end_offset) == [(7, 1)]
    part.log.close()


def test_compaction_removes_a_commit_marker_once_its_transaction_is_gone(tmp_path: Path) -> None:
    """Kafka's rule for markers: a COMMIT marker goes once no batch of its transaction is left
    and delete.retention.ms passed; ABORT markers (each has a .txnindex entry) and a producer's
    last batch stay. read_committed's view and the rebuilt producer state do not change."""
    from fjord.storage.cleaner import clean_log

    def build(directory: Path) -> Partition:
        config = LogConfig.from_dict({"segment.bytes": 1000, "cleanup.policy": "compact"})
        part = Partition("t", 0, 1, PartitionLog.open(directory, config),
                         PartitionAssignment(1, 1, (1,), (1,)), min_insync_replicas=1)
        part.append_as_leader(keyed_txn(9, 0, [(b"a", b"a-1")]), acks=1)  # 0
        part.append_marker(marker(9, commit=True))  # 1: its data superseded below
        part.append_as_leader(keyed_txn(10, 0, [(b"b", b"b-aborted")]), acks=1)  # 2
        part.append_marker(marker(10, commit=False))  # 3: an ABORT marker stays
        part.append_as_leader(keyed_txn(11, 0, [(b"c", b"c-1")]), acks=1)  # 4
        part.append_marker(marker(11, commit=True))  # 5: c-1 is live: stays
        part.append_as_leader(keyed_txn(9, 1, [(b"a", b"a-2")]), acks=1)  # 6
        part.append_marker(marker(9, commit=True))  # 7: producer 9's last batch: stays
        part.append_as_leader(keyed_txn(10, 1, [(b"b", b"b-2")]), acks=1)  # 8
        part.append_marker(marker(10, commit=True))  # 9
        part.append_as_leader(keyed_txn(11, 1, [(b"d", b"d-1")]), acks=1)  # 10
        part.append_marker(marker(11, commit=True))  # 11
        while len(part.log.segments) < 3:  # the transactions sit in closed segments
            part.append_as_leader(keyed(b"other", b"o" * 40), acks=1)
        return part

    def markers(part: Partition) -> list[int]:
        return [b.header.base_offset for segment in part.log.segments
                for b in read_batches(segment.read(0, segment.size)) if b.header.is_control]

    # Within delete.retention.ms every marker stays.
    young = build(tmp_path / "young")
    young_view = committed_view(young)
    assert clean_log(young.log, now_ms=10**13, delete_retention_ms=10**14,
                     high_watermark=young.last_stable_offset) is not None
    assert markers(young) == [1, 3, 5, 7, 9, 11]
    young.log.close()

    part = build(tmp_path / "t-0")
    before = committed_view(part)
    assert before == young_view and before[b"a"] == b"a-2" and b"b-aborted" not in before.values()
    stats = clean_log(part.log, now_ms=10**13, delete_retention_ms=0,
                      high_watermark=part.last_stable_offset)
    assert stats is not None
    assert markers(part) == [3, 5, 7, 9, 11]  # only the first commit of producer 9 went
    assert committed_view(part) == before
    assert part.aborted_transactions(0, part.log_end_offset) == [(10, 2)]
    # A clean of the clean range removes nothing more.
    clean_log(part.log, now_ms=10**13, delete_retention_ms=0,
              high_watermark=part.last_stable_offset)
    assert markers(part) == [3, 5, 7, 9, 11]
    # The producer state rebuilt from the cleaned log has no open transaction.
    directory = part.log.directory
    part.log.close()
    for snapshot in directory.glob("*.snapshot"):
        snapshot.unlink()
    reopened = PartitionLog.open(directory, LogConfig.from_dict({"cleanup.policy": "compact"}))
    rebuilt = load_producer_state(reopened)
    assert rebuilt.ongoing == {}
    reopened.close()


# --- end to end over the cores: random transactions, read_committed from random offsets ---------

READ_OPS = st.lists(
    st.tuples(st.sampled_from(["data", "txn", "txn", "commit", "abort"]), st.integers(1, 3)),
    min_size=1, max_size=30,
)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(READ_OPS, st.data())
def test_read_committed_returns_exactly_the_committed_records(
    tmp_path_factory, ops, data
) -> None:
    """The broker's LSO and aborted list plus the consumer's filter (the real cores), reading
    from any offset: exactly the plain and committed records at or after it, in offset order;
    never an aborted or still open one."""
    from fjord.client.fetcher import CompletedFetch, FetchBuffer
    from fjord.client.types import TopicPartition

    part = leader(tmp_path_factory.mktemp("read") / "t-0")
    sequences: dict[int, int] = {}
    pending: dict[int, list[tuple[int, str]]] = {}
    visible: list[tuple[int, str]] = []  # (offset, value) a read_committed reader may return
    for n, (op, pid) in enumerate(ops):
        end = part.log_end_offset
        if op == "data":
            part.append_as_leader(plain(f"p{n}".encode()), acks=1)
            visible.append((end, f"p{n}"))
        elif op == "txn":
            seq = sequences.get(pid, 0)
            part.append_as_leader(txn_batch(pid, seq, count=2), acks=1)
            sequences[pid] = seq + 2
            pending.setdefault(pid, []).extend(
                [(end, f"{pid}-{seq}-0"), (end + 1, f"{pid}-{seq}-1")]
            )
        else:
            part.append_marker(marker(pid, commit=op == "commit"))
            done = pending.pop(pid, [])
            if op == "commit":
                visible.extend(done)
    lso = part.last_stable_offset
    assert lso == min((r[0][0] for r in pending.values() if r), default=part.log_end_offset)
    start = data.draw(st.integers(0, part.log_end_offset), label="fetch from")
    tp = TopicPartition("t", 0)
    buffer = FetchBuffer()
    got: list[tuple[int, str]] = []
    offset = start
    while offset < lso:
        limit = data.draw(st.integers(61, 400), label="fetch bytes")
        raw = part.log.read(offset, limit, lso)
        aborted = part.aborted_transactions(offset, lso)
        buffer.add(CompletedFetch(tp, offset, raw, part.high_watermark, aborted))
        positions = {tp: offset}
        while True:
            out, _ = buffer.collect(positions, set(), 3)
            if not out:
                break
            got.extend((r.offset, (r.value or b"").decode()) for r in out)
        assert positions[tp] > offset, "the position must move past what was read"
        offset = positions[tp]
        buffer.drop(lambda _: True)
    expected = sorted(v for v in visible if start <= v[0] < lso)
    assert got == expected
    part.log.close()


def test_a_txnindex_that_disagrees_with_the_log_never_keeps_the_partition_closed(
    tmp_path: Path,
) -> None:
    part = leader(tmp_path / "t-0")
    part.append_as_leader(txn_batch(7, 0), acks=1)  # 0-1
    part.append_marker(marker(7, commit=False))  # 2
    part.append_as_leader(txn_batch(8, 0), acks=1)  # 3-4
    part.append_marker(marker(8, commit=False))  # 5
    part.log.close()
    (index,) = (tmp_path / "t-0").glob("*.txnindex")
    # Another last stable offset (a hint only) for the first entry, and the second replaced
    # by one that contradicts the log (a marker offset the replay will not produce).
    index.write_bytes(AbortedTxn(2, 7, 0, 99).to_bytes() + AbortedTxn(9, 8, 3, 10).to_bytes())
    again = leader(tmp_path / "t-0")
    assert again.producer_state.ongoing == {}
    assert (7, 0) in again.aborted_transactions(0, 6)
    again.log.close()


def test_the_lso_never_falls_below_the_log_start(tmp_path: Path) -> None:
    part = leader(tmp_path / "t-0")
    part.append_as_leader(txn_batch(7, 0), acks=1)  # 0-1, left open
    for _ in range(3):
        part.append_as_leader(plain(), acks=1)  # 2, 3, 4
    assert part.last_stable_offset == 0
    part.log.delete_records(3)
    assert part.last_stable_offset == 3
    part.log.close()
