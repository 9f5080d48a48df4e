"""The high-watermark checkpoint of a broker's data dir (Kafka's ``replication-offset-checkpoint``).

Without it a restarted leader would start its high watermark at the log start, hiding every
committed record from consumers until all followers fetched again.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fjord.errors import StorageError
from fjord.storage.checkpoint import read_text, write_atomically
from fjord.topic_partition import TopicPartition

#: File name, in the broker's data dir (next to the partition directories; LogManager ignores it
#: because it is not a ``<topic>-<partition>`` directory).
HW_CHECKPOINT_FILE = "replication-offset-checkpoint"

#: Format version written on the first line (Kafka's is 0).
HW_CHECKPOINT_VERSION = 0



def format_hw_checkpoint(entries: Mapping[TopicPartition, int]) -> str:
    """Kafka's text format: the version, the number of entries, then one ``topic partition
    offset`` line per partition (sorted, so equal maps give equal files)."""
    lines = [str(HW_CHECKPOINT_VERSION), str(len(entries))]
    lines += [
        f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(entries.items())
    ]
    return "\n".join(lines) + "\n"


def parse_hw_checkpoint(text: str) -> dict[TopicPartition, int]:
    """The entries of a checkpoint; StorageError names what is wrong with a malformed one."""
    lines = text.splitlines()
    if len(lines) < 2:
        raise StorageError("high-watermark checkpoint: missing version or entry count")
    if lines[0].strip() != str(HW_CHECKPOINT_VERSION):
        raise StorageError(f"high-watermark checkpoint: unsupported version {lines[0]!r}")
    try:
        count = int(lines[1])
    except ValueError:
        raise StorageError(f"high-watermark checkpoint: bad entry count {lines[1]!r}") from None
    body = [line for line in lines[2:] if line.strip()]
    if count != len(body):
        raise StorageError(f"high-watermark checkpoint: says {count} entries, holds {len(body)}")
    out: dict[TopicPartition, int] = {}
    for line in body:
        parts = line.split()
        if len(parts) != 3:
            raise StorageError(f"high-watermark checkpoint: bad line {line!r}")
        try:
            partition, offset = int(parts[1]), int(parts[2])
        except ValueError:
            raise StorageError(f"high-watermark checkpoint: bad line {line!r}") from None
        if partition < 0 or offset < 0:
            raise StorageError(f"high-watermark checkpoint: negative value in {line!r}")
        out[TopicPartition(parts[0], partition)] = offset
    return out


class HighWatermarkCheckpoint:
    """``<data dir>/replication-offset-checkpoint``.

    On-disk format (text, Kafka's)::

        0                 <- version
        2                 <- number of entries
        orders 0 1500     <- "topic partition high_watermark", one line per partition
        orders 1 1498

    Invariant: the file is replaced atomically and fsync'd (temporary file + rename), so a reader
    sees a whole old or a whole new checkpoint. A missing or malformed file reads as empty (the
    high watermarks then start at each log's start and catch up as followers fetch): it is an
    optimisation of availability, never a source of truth about data.
    """

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / HW_CHECKPOINT_FILE

    def read(self) -> dict[TopicPartition, int]:
        text = read_text(self.path)
        if text is None:
            return {}
        try:
            return parse_hw_checkpoint(text)
        except StorageError:
            return {}

    def write(self, entries: Mapping[TopicPartition, int]) -> None:
        """Blocking (fsync): call it from a worker thread in services."""
        write_atomically(self.path, format_hw_checkpoint(entries), sync=True)
