"""Kafka RecordBatch v2, byte for byte: headers, records, codecs, builder and reader.

Build with :class:`BatchBuilder` (append records, then ``build()``); read with
:func:`read_batches` (validated batches; header only unless you ask for records) or
:func:`decode_records` (every record of a fetch response). A broker needs only
:mod:`fjord.records.header`.
"""

from fjord.records.builder import BatchBuilder, rebuild_batch, record_size_upper_bound
from fjord.records.codecs import compress, compression_by_name, decompress
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
from fjord.records.reader import (
    RecordBatch,
    RecordTuple,
    decode_record_tuples,
    decode_records,
    read_batches,
)
from fjord.records.record import Header, Headers, Record

__all__ = [
    "BATCH_HEADER_SIZE",
    "LOG_OVERHEAD",
    "MAGIC_V2",
    "BatchBuilder",
    "BatchHeader",
    "Compression",
    "Header",
    "Headers",
    "Record",
    "RecordBatch",
    "RecordTuple",
    "TimestampType",
    "compress",
    "compression_by_name",
    "crc32c",
    "decode_record_tuples",
    "decode_records",
    "decompress",
    "iter_batches",
    "parse_header",
    "read_batches",
    "rebuild_batch",
    "record_size_upper_bound",
    "stamp_batch",
    "validate_batch",
]
