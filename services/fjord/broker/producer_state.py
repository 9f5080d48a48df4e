"""Idempotent-producer state of one partition: which batches each producer id last wrote.

Pure core (:class:`ProducerStateManager`): decisions from batch headers only (producer id,
producer epoch, base sequence, last offset delta, max timestamp: never the records), no clock of
its own (``now_ms`` is passed in). File helpers beside it write and read the ``.snapshot`` files
of a partition directory and rebuild the state from the log's headers; the broker runs them on
worker threads or at start-up.

Kafka's rules for a leader append of a batch from producer id ``pid``, epoch ``e``, first
sequence ``s`` (see docs/idempotence.md):

1. ``e`` below the epoch the partition knows for ``pid``: INVALID_PRODUCER_EPOCH (a zombie).
2. Same epoch and ``(first, last sequence)`` equal to one of the last
   :data:`BATCHES_PER_PRODUCER` batches remembered: a duplicate (a retry whose first attempt
   was written): nothing is appended, the answer is that batch's ORIGINAL offsets.
3. ``pid`` unknown and ``s != 0``: UNKNOWN_PRODUCER_ID (its state expired or was never here).
4. ``e`` above the known epoch (a bumped epoch): ``s`` must be 0, else OUT_OF_ORDER_SEQUENCE.
5. Same epoch: ``s`` must follow the last sequence (``last + 1``, wrapping from 2**31-1 to 0),
   else OUT_OF_ORDER_SEQUENCE_NUMBER (a gap, or a duplicate older than the remembered ones).

Followers apply batches without checks (the leader already decided), so a new leader has the
same state. Sequences are int32 and wrap to 0 after 2**31-1, as in Kafka.

Transactions (Kafka's rules, see docs/transactions.md): the first transactional data batch of a
producer opens its transaction at that batch's first offset (``ProducerEntry.txn_first_offset``);
a control batch (COMMIT or ABORT marker) of that producer completes it (:class:`CompletedTxn`,
which the partition turns into a ``.txnindex`` entry when aborted). The *first unstable offset*
is the smallest first offset of an open transaction, or of a completed one whose marker is not
yet below the high watermark (Kafka's unreplicated transactions: a new leader might not have the
marker); the last stable offset is ``min(first unstable offset, high watermark)``. All of it is
derived from the log, in log order, identically on leaders, followers and after a restart
(snapshot + replay). A leader's marker append is checked by :meth:`ProducerStateManager.
check_marker`: an epoch older than the producer's is INVALID_PRODUCER_EPOCH, a coordinator epoch
older than the last marker's TRANSACTION_COORDINATOR_FENCED.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fjord.broker import defaults
from fjord.errors import (
    CoordinatorFencedError,
    CorruptRecordError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    UnknownProducerIdError,
)
from fjord.records.control import ControlRecord, read_control_batch
from fjord.records.header import NO_PRODUCER_ID, NO_SEQUENCE, BatchHeader, crc32c
from fjord.storage.checkpoint import sync_directory, write_new_file

log = logging.getLogger(__name__)

#: Batches remembered per producer id (Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN), which
#: is why a producer may have at most this many requests in flight.
BATCHES_PER_PRODUCER = 5

SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 2
_SNAPSHOT_VERSIONS = (1, 2)
NO_TXN = -1  # ProducerEntry.txn_first_offset when no transaction is open
_MAX_SEQUENCE = 0x7FFFFFFF

# Snapshot layout (big-endian):
#   header : version int16 | crc uint32 (CRC-32C of every byte after this field) |
#            end offset int64 | producer count int32
#   entry  : producer id int64 | producer epoch int16 | last timestamp int64 | batch count int8
#            | (version 2:) open txn first offset int64 (-1: none) | coordinator epoch int32
#   batch  : first sequence int32 | last sequence int32 | first offset int64 |
#            last offset int64 | max timestamp int64
# Version 1 (before transactions) is still read: it has no open transactions.
_HEADER = struct.Struct(">hIqi")
_CRC_FROM = 6  # version (2) + crc (4)
_ENTRY_V1 = struct.Struct(">qhqb")
_ENTRY = struct.Struct(">qhqbqi")
_BATCH = struct.Struct(">iiqqq")


def next_sequence(sequence: int, increment: int = 1) -> int:
    """``sequence + increment`` in Kafka's int32 sequence space (wraps to 0 after 2**31-1)."""
    return (sequence + increment) & _MAX_SEQUENCE


def in_sequence(last_sequence: int, first_sequence: int) -> bool:
    return first_sequence == next_sequence(last_sequence)


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """What the partition remembers of one appended idempotent batch."""

    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    timestamp: int


class ProducerEntry:
    """One producer id's state in one partition.

    Invariants: ``batches`` holds at most :data:`BATCHES_PER_PRODUCER` batches of
    ``producer_epoch``, in log order, consecutive in sequence; ``last_timestamp`` is the max
    timestamp of the newest batch (what expiration compares with); ``txn_first_offset`` is the
    first offset of the producer's open transaction (its first transactional batch since its
    last marker), :data:`NO_TXN` when none is open; ``coordinator_epoch`` is the coordinator
    epoch of the producer's last marker (-1 before any).
    """

    __slots__ = (
        "batches",
        "coordinator_epoch",
        "last_timestamp",
        "producer_epoch",
        "producer_id",
        "txn_first_offset",
    )

    def __init__(self, producer_id: int, producer_epoch: int, last_timestamp: int) -> None:
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.last_timestamp = last_timestamp
        self.batches: deque[BatchMetadata] = deque(maxlen=BATCHES_PER_PRODUCER)
        self.txn_first_offset = NO_TXN
        self.coordinator_epoch = -1

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.producer_epoch:
            return None
        for batch in self.batches:
            if batch.first_sequence == first_seq and batch.last_sequence == last_seq:
                return batch
        return None

    def copy(self) -> ProducerEntry:
        other = ProducerEntry(self.producer_id, self.producer_epoch, self.last_timestamp)
        other.batches.extend(self.batches)
        other.txn_first_offset = self.txn_first_offset
        other.coordinator_epoch = self.coordinator_epoch
        return other

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ProducerEntry)
            and self.producer_id == other.producer_id
            and self.producer_epoch == other.producer_epoch
            and self.last_timestamp == other.last_timestamp
            and list(self.batches) == list(other.batches)
            and self.txn_first_offset == other.txn_first_offset
            and self.coordinator_epoch == other.coordinator_epoch
        )

    def __repr__(self) -> str:
        return (
            f"ProducerEntry(id={self.producer_id}, epoch={self.producer_epoch}, "
            f"batches={list(self.batches)}, txn_first_offset={self.txn_first_offset})"
        )


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction ended by a marker at ``last_offset``: its records lie in
    ``[first_offset, last_offset)`` (the producer's transactional batches there); ``aborted``
    for an ABORT marker. A marker without an open transaction completes an empty one
    (``first_offset == last_offset``), as in Kafka."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A leader append that repeats batches already in the log: answer with these offsets."""

    first_offset: int
    last_offset: int


def _is_idempotent(header: BatchHeader) -> bool:
    return header.producer_id != NO_PRODUCER_ID


def _batch_offsets(headers: Sequence[BatchHeader], first_offset: int) -> Iterator[tuple[int, int]]:
    offset = first_offset
    for h in headers:
        yield offset, offset + h.last_offset_delta
        offset += h.last_offset_delta + 1


class ProducerStateManager:
    """The idempotence and transaction state of one partition replica (Kafka's
    ProducerStateManager).

    Invariants:
    - ``producers`` reflects exactly the idempotent batches and markers of the log below
      ``end_offset`` (applied in log order), minus producers expired by :meth:`remove_expired`
      (never one with an open transaction).
    - ``ongoing`` maps exactly the producers whose ``txn_first_offset`` is set to it: a
      producer's transactional batches since its last marker.
    - ``unreplicated`` holds, in marker order, the completed transactions whose marker may not
      be below the high watermark yet; it only shrinks by :meth:`on_high_watermark`.
    - A leader append is decided by :meth:`check_append` before anything is written, and only a
      successful append is recorded (:meth:`record_append`); a rejected batch changes nothing.
    - Pure: no files, sockets or clocks (see :func:`load_producer_state` and
      :func:`write_snapshot` for the disk side).
    """

    def __init__(self, expiration_ms: int = defaults.PRODUCER_ID_EXPIRATION_MS) -> None:
        self.expiration_ms = expiration_ms
        self.producers: dict[int, ProducerEntry] = {}
        self.end_offset = 0  # state covers the log below this offset
        self.last_snapshot_offset = -1  # end offset of the newest snapshot written or loaded
        #: producer id -> first offset of its open transaction (mirrors the entries' field).
        self.ongoing: dict[int, int] = {}
        #: (marker offset, first offset) of completed transactions whose marker may not be
        #: replicated yet: they hold the last stable offset back until the high watermark
        #: passes the marker (see :meth:`first_unstable_offset`). Not snapshotted.
        self.unreplicated: deque[tuple[int, int]] = deque()

    # --- transactions -------------------------------------------------------------------------

    def on_high_watermark(self, high_watermark: int) -> None:
        """Forget the completed transactions whose marker is below ``high_watermark`` (they
        are replicated: they no longer hold the last stable offset back). Cheap: the partition
        calls it whenever its high watermark moves, so the list stays short on followers too."""
        pending = self.unreplicated
        while pending and pending[0][0] < high_watermark:
            pending.popleft()

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset of an open transaction, or of a completed one whose marker is at or
        above ``high_watermark``; None when every transaction below is complete and replicated.
        Forgets completed transactions whose marker is below the high watermark."""
        self.on_high_watermark(high_watermark)
        pending = self.unreplicated
        firsts = [first for _, first in pending]
        if self.ongoing:
            firsts.extend(self.ongoing.values())
        return min(firsts) if firsts else None

    def stable_offset_after(self, completed: CompletedTxn) -> int:
        """Kafka's last stable offset for a ``.txnindex`` entry: the first offset of another
        producer's open transaction, else the offset after the marker (log-derived only)."""
        return min(self.ongoing.values(), default=completed.last_offset + 1)

    def last_stable_offset(self, high_watermark: int) -> int:
        """Kafka's LSO: ``min(first unstable offset, high watermark)``."""
        first = self.first_unstable_offset(high_watermark)
        return high_watermark if first is None or first > high_watermark else first

    def check_marker(self, h: BatchHeader, marker: ControlRecord) -> None:
        """Decide a leader's append of a transaction marker (from WriteTxnMarkers): raises
        InvalidProducerEpochError when its epoch is older than the producer's here, and
        CoordinatorFencedError when its coordinator epoch is older than the last marker's.
        Changes nothing."""
        entry = self.producers.get(h.producer_id)
        if entry is None:
            return
        if h.producer_epoch < entry.producer_epoch:
            raise InvalidProducerEpochError(
                f"transaction marker for producer {h.producer_id} has epoch {h.producer_epoch}, "
                f"older than the current epoch {entry.producer_epoch}"
            )
        if marker.coordinator_epoch < entry.coordinator_epoch:
            raise CoordinatorFencedError(
                f"transaction marker for producer {h.producer_id} comes from coordinator epoch "
                f"{marker.coordinator_epoch}, older than {entry.coordinator_epoch}"
            )

    # --- leader side ---------------------------------------------------------------------------

    def check_append(self, headers: Sequence[BatchHeader]) -> Duplicate | None:
        """Decide a leader append of ``headers`` (one produce payload, in order).

        Returns a :class:`Duplicate` when the payload repeats remembered batches (all of them:
        then nothing must be appended), None when it may be appended. Raises
        InvalidProducerEpochError, UnknownProducerIdError, OutOfOrderSequenceError,
        InvalidTxnStateError (a non-transactional batch of a producer with an open
        transaction, Kafka's rule), or
        InvalidRecordError (an idempotent batch without a sequence or epoch, or a payload mixing
        duplicate and new batches). Changes nothing.
        """
        pending: dict[int, ProducerEntry] = {}
        duplicates: list[BatchMetadata] = []
        fresh = 0
        for h in headers:
            if not _is_idempotent(h):
                fresh += 1
                continue
            if h.base_sequence < 0 or h.producer_epoch < 0:
                raise InvalidRecordError(
                    f"batch of producer id {h.producer_id} has sequence {h.base_sequence} and "
                    f"epoch {h.producer_epoch}: an idempotent batch needs both >= 0"
                )
            entry = pending.get(h.producer_id) or self.producers.get(h.producer_id)
            last_seq = h.last_sequence
            if entry is not None:
                if h.producer_epoch < entry.producer_epoch:
                    raise InvalidProducerEpochError(
                        f"producer {h.producer_id} epoch {h.producer_epoch} is older than the "
                        f"current epoch {entry.producer_epoch}"
                    )
                dup = entry.find_duplicate(h.producer_epoch, h.base_sequence, last_seq)
                if dup is not None:
                    duplicates.append(dup)
                    continue
            if entry is None:
                if h.base_sequence != 0:
                    raise UnknownProducerIdError(
                        f"producer {h.producer_id} has no state in this partition and its "
                        f"batch starts at sequence {h.base_sequence}, not 0"
                    )
            elif h.producer_epoch > entry.producer_epoch:
                if h.base_sequence != 0:
                    raise OutOfOrderSequenceError(
                        f"producer {h.producer_id} new epoch {h.producer_epoch} must start at "
                        f"sequence 0, got {h.base_sequence}"
                    )
            elif not in_sequence(entry.last_sequence, h.base_sequence):
                raise OutOfOrderSequenceError(
                    f"producer {h.producer_id} epoch {h.producer_epoch}: expected sequence "
                    f"{next_sequence(entry.last_sequence)}, got {h.base_sequence}"
                    + _older_than_remembered(entry, h.base_sequence)
                )
            updated = entry.copy() if entry is not None else ProducerEntry(h.producer_id, -1, -1)
            if updated.txn_first_offset != NO_TXN and not h.is_transactional:
                raise InvalidTxnStateError(
                    f"producer {h.producer_id} has an open transaction here (from offset "
                    f"{updated.txn_first_offset}): expected a transactional write"
                )
            _apply(updated, h, 0, 0)
            if h.is_transactional and updated.txn_first_offset == NO_TXN:
                updated.txn_first_offset = 0  # opened by this payload (the offset is not known)
            pending[h.producer_id] = updated
            fresh += 1
        if duplicates and fresh:
            raise InvalidRecordError(
                "a produce payload mixes duplicate batches with new ones: send one idempotent "
                "batch per partition per request"
            )
        if duplicates:
            return Duplicate(duplicates[0].first_offset, duplicates[-1].last_offset)
        return None

    def record_append(self, headers: Sequence[BatchHeader], first_offset: int) -> None:
        """Remember batches just appended by the leader at ``first_offset`` (the headers as
        checked, before the log stamped offsets into them)."""
        for h, (first, last) in zip(headers, _batch_offsets(headers, first_offset), strict=True):
            self.apply_batch(h, first, last)

    # --- any replica ---------------------------------------------------------------------------

    def apply_batch(
        self,
        h: BatchHeader,
        first_offset: int,
        last_offset: int,
        marker: ControlRecord | None = None,
    ) -> CompletedTxn | None:
        """Apply one batch of the log (leader after an append, follower, rebuild): no checks.
        A control batch needs its decoded ``marker`` and returns the transaction it completed.
        """
        if last_offset + 1 > self.end_offset:
            self.end_offset = last_offset + 1
        if not _is_idempotent(h):
            return None
        entry = self.producers.get(h.producer_id)
        if entry is None:
            entry = self.producers[h.producer_id] = ProducerEntry(h.producer_id, -1, -1)
        if h.is_control:
            if marker is None:
                raise InvalidRecordError(
                    f"control batch at offset {first_offset} applied without its marker"
                )
            return self._complete_txn(entry, h, last_offset, marker)
        _apply(entry, h, first_offset, last_offset)
        if h.is_transactional and entry.txn_first_offset == NO_TXN:
            entry.txn_first_offset = first_offset
            self.ongoing[h.producer_id] = first_offset
        return None

    def _complete_txn(
        self, entry: ProducerEntry, h: BatchHeader, offset: int, marker: ControlRecord
    ) -> CompletedTxn:
        if h.producer_epoch != entry.producer_epoch:
            entry.producer_epoch = h.producer_epoch
            entry.batches.clear()
        entry.coordinator_epoch = marker.coordinator_epoch
        entry.last_timestamp = max(entry.last_timestamp, h.max_timestamp)
        first = entry.txn_first_offset if entry.txn_first_offset != NO_TXN else offset
        entry.txn_first_offset = NO_TXN
        self.ongoing.pop(h.producer_id, None)
        self.unreplicated.append((offset, first))
        return CompletedTxn(h.producer_id, first, offset, not marker.committed)

    def apply_log_batches(
        self, batches: Iterable[tuple[BatchHeader, ControlRecord | None]]
    ) -> list[CompletedTxn]:
        """Apply batches whose headers carry their stamped offsets (follower appends, rebuild),
        each with its marker when it is a control batch; returns the transactions completed."""
        completed = []
        for h, marker in batches:
            done = self.apply_batch(h, h.base_offset, h.last_offset, marker)
            if done is not None:
                completed.append(done)
        return completed

    def remove_expired(self, now_ms: int) -> list[int]:
        """Forget producers whose newest batch is ``expiration_ms`` old (Kafka's
        producer.id.expiration.ms); returns their ids."""
        gone = [
            pid
            for pid, entry in self.producers.items()
            if now_ms - entry.last_timestamp >= self.expiration_ms
            and entry.txn_first_offset == NO_TXN  # an open transaction keeps its producer
        ]
        for pid in gone:
            del self.producers[pid]
        return gone

    def clear(self, end_offset: int) -> None:
        self.producers.clear()
        self.ongoing.clear()
        self.unreplicated.clear()
        self.end_offset = end_offset

    # --- snapshots -----------------------------------------------------------------------------

    def to_snapshot_bytes(self) -> bytes:
        """The snapshot file's content for the current state (see the module's layout)."""
        parts = []
        for entry in self.producers.values():
            parts.append(
                _ENTRY.pack(
                    entry.producer_id,
                    entry.producer_epoch,
                    entry.last_timestamp,
                    len(entry.batches),
                    entry.txn_first_offset,
                    entry.coordinator_epoch,
                )
            )
            for b in entry.batches:
                fields = (b.first_sequence, b.last_sequence, b.first_offset, b.last_offset)
                parts.append(_BATCH.pack(*fields, b.timestamp))
        body = b"".join(parts)
        head = bytearray(_HEADER.pack(SNAPSHOT_VERSION, 0, self.end_offset, len(self.producers)))
        crc = crc32c(body, crc32c(memoryview(head)[_CRC_FROM:]))
        struct.pack_into(">I", head, 2, crc)
        return bytes(head) + body

    @classmethod
    def from_snapshot_bytes(
        cls, data: bytes, expiration_ms: int = defaults.PRODUCER_ID_EXPIRATION_MS
    ) -> ProducerStateManager:
        """Parse a snapshot; raises CorruptRecordError on a bad version, CRC or length."""
        if len(data) < _HEADER.size:
            raise CorruptRecordError(f"producer snapshot of {len(data)} bytes is truncated")
        version, crc, end_offset, count = _HEADER.unpack_from(data, 0)
        if version not in _SNAPSHOT_VERSIONS:
            raise CorruptRecordError(f"producer snapshot version {version} is not supported")
        actual = crc32c(memoryview(data)[_CRC_FROM:])
        if actual != crc:
            raise CorruptRecordError(
                f"producer snapshot CRC mismatch: stored {crc:#010x}, computed {actual:#010x}"
            )
        state = cls(expiration_ms)
        state.end_offset = end_offset
        pos = _HEADER.size
        entry_struct = _ENTRY if version >= 2 else _ENTRY_V1
        try:
            for _ in range(count):
                pid, epoch, last_ts, batch_count, *txn = entry_struct.unpack_from(data, pos)
                pos += entry_struct.size
                entry = ProducerEntry(pid, epoch, last_ts)
                if txn:
                    entry.txn_first_offset, entry.coordinator_epoch = txn
                    if entry.txn_first_offset != NO_TXN:
                        state.ongoing[pid] = entry.txn_first_offset
                for _ in range(batch_count):
                    entry.batches.append(BatchMetadata(*_BATCH.unpack_from(data, pos)))
                    pos += _BATCH.size
                state.producers[pid] = entry
        except struct.error as exc:
            raise CorruptRecordError(f"producer snapshot is truncated: {exc}") from exc
        if pos != len(data):
            raise CorruptRecordError(f"producer snapshot has {len(data) - pos} trailing bytes")
        state.last_snapshot_offset = end_offset
        return state


def _older_than_remembered(entry: ProducerEntry, first_sequence: int) -> str:
    """The explanation for a sequence below the remembered batches: a batch written before
    whose retry can no longer be recognised (never appended again, refused instead)."""
    if not entry.batches or not first_sequence < entry.batches[0].first_sequence:
        return ""
    return (
        f" (older than the {len(entry.batches)} batches remembered, which start at sequence "
        f"{entry.batches[0].first_sequence}: a retry of a batch written before cannot be "
        "recognised as a duplicate any more)"
    )


def _apply(entry: ProducerEntry, h: BatchHeader, first_offset: int, last_offset: int) -> None:
    if h.producer_epoch != entry.producer_epoch:
        entry.producer_epoch = h.producer_epoch
        entry.batches.clear()  # sequences restart with a new epoch
    entry.batches.append(
        BatchMetadata(h.base_sequence, h.last_sequence, first_offset, last_offset, h.max_timestamp)
    )
    entry.last_timestamp = h.max_timestamp


# --- files: snapshots and rebuild -----------------------------------------------------------------


def snapshot_path(directory: Path, end_offset: int) -> Path:
    """``<directory>/<end offset, 20 digits>.snapshot`` (Kafka's naming)."""
    return directory / f"{end_offset:020d}{SNAPSHOT_SUFFIX}"


def list_snapshots(directory: Path) -> list[tuple[int, Path]]:
    """``(end offset, path)`` of every snapshot file in ``directory``, oldest first."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for entry in directory.iterdir():
            stem = entry.name[: -len(SNAPSHOT_SUFFIX)]
            if entry.name.endswith(SNAPSHOT_SUFFIX) and len(stem) == 20 and stem.isdigit():
                found.append((int(stem), entry))
    found.sort()
    return found


def write_snapshot(directory: Path, data: bytes, end_offset: int) -> Path:
    """Write a snapshot atomically (temp file, fsync, rename, fsync of the directory) and
    delete all but the newest :data:`defaults.PRODUCER_SNAPSHOTS_RETAINED` ones. Blocking."""
    path = publish_snapshot(stage_snapshot(directory, data, end_offset))
    prune_snapshots(directory)
    return path


def stage_snapshot(directory: Path, data: bytes, end_offset: int) -> Path:
    """Write and fsync the snapshot under a temporary name (``<final>.tmp``); invisible to
    :func:`load_producer_state` until :func:`publish_snapshot`. Blocking: a worker thread."""
    path = snapshot_path(directory, end_offset)
    tmp = path.with_name(path.name + ".tmp")
    write_new_file(tmp, data)
    return tmp


def publish_snapshot(staged: Path) -> Path:
    """Rename a staged snapshot to its final name (one rename: cheap enough for the event loop,
    where the broker calls it so that no truncation can slip between its check and the
    rename)."""
    path = staged.with_name(staged.name.removesuffix(".tmp"))
    os.replace(staged, path)
    return path


def prune_snapshots(directory: Path) -> None:
    """Keep the newest :data:`defaults.PRODUCER_SNAPSHOTS_RETAINED` snapshots and make the
    directory's entries durable. Blocking: a worker thread."""
    for _, old in list_snapshots(directory)[: -defaults.PRODUCER_SNAPSHOTS_RETAINED]:
        with contextlib.suppress(FileNotFoundError):
            old.unlink()
    sync_directory(directory)


def delete_snapshots(directory: Path) -> None:
    """Delete every snapshot (a log restarted empty at a new offset keeps no producer state)."""
    for _, path in list_snapshots(directory):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


class SegmentedLog(Protocol):
    """What loading needs of fjord.storage.PartitionLog."""

    directory: Path
    log_start_offset: int

    @property
    def log_end_offset(self) -> int: ...

    @property
    def segments(self) -> list[Any]: ...


def iter_log_headers(
    plog: SegmentedLog, from_offset: int
) -> Iterator[tuple[BatchHeader, ControlRecord | None]]:
    """Headers (with stamped offsets) of the batches of a PartitionLog that end at or after
    ``from_offset``, in log order, each with its marker when it is a control batch; reads 61
    bytes per data batch, never its records (a control batch is read whole: one record)."""
    for segment in plog.segments:
        if segment.next_offset <= from_offset:
            continue
        start = 0
        if from_offset > segment.base_offset:
            found = segment.locate(from_offset)
            if found is None:
                continue
            start = found[0]
        for pos, header in segment.iter_headers(start, segment.size):
            if header.last_offset >= from_offset:
                marker = None
                if header.is_control:
                    marker = read_control_batch(segment.read(pos, pos + header.size))
                yield header, marker


def load_producer_state(
    plog: SegmentedLog,
    expiration_ms: int = defaults.PRODUCER_ID_EXPIRATION_MS,
    on_aborted: Callable[[CompletedTxn, int], object] | None = None,
) -> ProducerStateManager:
    """The state of a partition log: the newest valid snapshot at or below the log end, then
    every batch after it (headers only, control batches whole). Snapshots past the log end
    (left by a truncation) and corrupt ones are deleted; without a usable snapshot the whole
    log is scanned. ``on_aborted(txn, last stable offset)`` is called for each transaction an
    ABORT marker of the replayed part completes (the log rebuilds its ``.txnindex`` from them);
    the replay starts at :attr:`ProducerStateManager.end_offset` of the snapshot used."""
    directory = plog.directory
    log_end = plog.log_end_offset
    log_start = plog.log_start_offset
    state: ProducerStateManager | None = None
    for end_offset, path in reversed(list_snapshots(directory)):
        if end_offset > log_end:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        try:
            state = ProducerStateManager.from_snapshot_bytes(path.read_bytes(), expiration_ms)
            break
        except (CorruptRecordError, OSError) as exc:
            log.warning("ignoring producer snapshot %s: %s", path, exc)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    if state is None:
        state = ProducerStateManager(expiration_ms)
        state.end_offset = log_start
    from_offset = max(state.end_offset, log_start)
    if from_offset < log_end:
        for h, marker in iter_log_headers(plog, from_offset):
            done = state.apply_batch(h, h.base_offset, h.last_offset, marker)
            if done is not None and done.aborted and on_aborted is not None:
                on_aborted(done, state.stable_offset_after(done))
    state.end_offset = log_end
    return state


def snapshot_due(state: ProducerStateManager, plog: SegmentedLog, *, force: bool) -> bytes | None:
    """The snapshot to write now, or None: one is due when the log rolled a segment since the
    last snapshot (Kafka writes one per roll) or, with ``force`` (clean shutdown), whenever the
    state moved past the last one. Serialised on the caller's thread (the event loop, where
    appends happen) so it is consistent; :func:`write_snapshot` then runs on a worker thread.
    """
    if not snapshot_wanted(state, plog, force=force):
        return None
    return state.to_snapshot_bytes()


def snapshot_wanted(state: ProducerStateManager, plog: SegmentedLog, *, force: bool) -> bool:
    """Whether :func:`snapshot_due` would return a snapshot, without serialising it (cheap:
    the periodic check asks it of every hosted partition). An empty log needs none: its
    recovery reads nothing either (and thousands of new partitions would each write one)."""
    if state.end_offset != plog.log_end_offset or state.end_offset == state.last_snapshot_offset:
        return False
    if state.end_offset == 0:
        return False
    # No snapshot yet counts as one at offset 0: a log's first segment is no roll.
    return force or plog.segments[-1].base_offset > max(state.last_snapshot_offset, 0)
