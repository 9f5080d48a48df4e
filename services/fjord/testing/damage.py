"""Damage stored bytes on purpose, as bit rot would: for the scrubber's tests and the chaos
corruption scenario. Works on a stopped broker's files (or a live one's, to model rot after
the write)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fjord.records.header import BATCH_HEADER_SIZE, parse_header
from fjord.storage import defaults


@dataclass(frozen=True, slots=True)
class FlippedBatch:
    """Where a byte was flipped: the segment file, the batch's offsets ``[base, next)``."""

    segment: Path
    base_offset: int
    next_offset: int
    position: int


def segment_files(partition_dir: Path) -> list[Path]:
    """The ``.log`` files of a partition directory, oldest first."""
    return sorted(partition_dir.glob("*" + defaults.LOG_SUFFIX))


def batch_count(segment: Path) -> int:
    """How many batches ``segment`` holds (read by their framing; CRCs are not checked). How
    records split into batches is the producer's and the broker's timing (a producer blocked on
    its in-flight window grows one batch): a caller that damages "the n-th batch" checks this
    first."""
    data = segment.read_bytes()
    pos = count = 0
    while pos < len(data):
        pos += parse_header(data, pos).size
        count += 1
    return count


def flip_byte_in_batch(segment: Path, batch_index: int) -> FlippedBatch:
    """Invert one byte inside the records of the ``batch_index``-th batch of ``segment`` (inside
    what the CRC covers, so the batch fails its check but the framing stays intact). Raises
    IndexError naming the segment's batch count when it holds no such batch."""
    data = segment.read_bytes()
    pos = 0
    for index in range(batch_index):
        if pos >= len(data):
            raise IndexError(f"{segment} holds {index} batches, no batch {batch_index}")
        pos += parse_header(data, pos).size
    if pos >= len(data):
        raise IndexError(f"{segment} holds {batch_index} batches, no batch {batch_index}")
    header = parse_header(data, pos)
    at = pos + BATCH_HEADER_SIZE + (header.size - BATCH_HEADER_SIZE) // 2
    fd = os.open(segment, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes([data[at] ^ 0xFF]), at)
        os.fsync(fd)
    finally:
        os.close(fd)
    return FlippedBatch(segment, header.base_offset, header.next_offset, at)
