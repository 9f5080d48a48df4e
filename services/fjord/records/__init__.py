"""Kafka RecordBatch v2, byte for byte: headers, records, codecs, builder and reader."""

from fjord.records.header import (
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    BatchHeader,
    Compression,
    TimestampType,
    crc32c,
    iter_batches,
    parse_header,
    stamp_batch,
    validate_batch,
)

__all__ = [
    "BATCH_HEADER_SIZE",
    "LOG_OVERHEAD",
    "MAGIC_V2",
    "BatchHeader",
    "Compression",
    "TimestampType",
    "crc32c",
    "iter_batches",
    "parse_header",
    "stamp_batch",
    "validate_batch",
]
