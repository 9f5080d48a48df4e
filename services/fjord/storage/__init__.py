"""Partition logs on disk: segments, sparse indexes, recovery, retention (Kafka's log layer).

The storage layer validates batch headers and CRCs and stamps offsets; it never decodes records.
See docs/storage.md for the on-disk format.
"""

from fjord.storage.config import LogConfig
from fjord.storage.epoch import LeaderEpochCache
from fjord.storage.index import OffsetIndex, TimeIndex
from fjord.storage.log import AppendInfo, PartitionLog, RecoveryReport
from fjord.storage.manager import LogManager, parse_partition_dir_name, partition_dir_name
from fjord.storage.segment import LogSegment

__all__ = [
    "AppendInfo",
    "LeaderEpochCache",
    "LogConfig",
    "LogManager",
    "LogSegment",
    "OffsetIndex",
    "PartitionLog",
    "RecoveryReport",
    "TimeIndex",
    "parse_partition_dir_name",
    "partition_dir_name",
]
