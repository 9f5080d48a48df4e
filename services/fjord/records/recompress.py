"""What the leader does to produced batches for their topic's configs (Kafka's LogValidator),
pure: ``compression.type`` (recompression) and ``message.timestamp.difference.max.ms``.

Kafka's broker keeps a batch as the producer compressed it when the topic's ``compression.type``
is ``producer`` (the default) or names the batch's own codec; otherwise it decompresses the
batch and writes it again with the topic's codec (``uncompressed``: none). This is the one case
where a Fjord broker touches records: everything else it stores and serves as the producer's
bytes (docs/configuration.md).

Invariants of :func:`recompress`: every input batch's header, length and CRC-32C are checked
before its records are read (a damaged batch is refused, never given a fresh CRC); each
rewritten batch keeps its records, their offsets and timestamps, its producer id / epoch /
base sequence, its timestamp type and transactional bit, and gets a new CRC; control batches,
header-only batches and batches already in the target codec are copied byte for byte.
"""

from __future__ import annotations

from fjord.errors import ConfigError, InvalidTimestampError
from fjord.records.builder import rebuild_batch
from fjord.records.header import Compression, parse_header, validate_batch
from fjord.records.reader import RecordBatch, decode_record_tuples

#: ``compression.type`` values and the codec each one makes the broker write (None: the
#: producer's, as sent). Kafka's names.
TOPIC_COMPRESSION_TYPES: dict[str, Compression | None] = {
    "producer": None,
    "uncompressed": Compression.NONE,
    "gzip": Compression.GZIP,
    "snappy": Compression.SNAPPY,
    "lz4": Compression.LZ4,
    "zstd": Compression.ZSTD,
}


def topic_codec(compression_type: str) -> Compression | None:
    """The codec the broker writes for a topic's ``compression.type`` (None: ``producer``,
    the batches as sent); ConfigError naming the key for anything else."""
    try:
        return TOPIC_COMPRESSION_TYPES[compression_type.strip().lower()]
    except KeyError:
        raise ConfigError(
            f"compression.type: {compression_type!r} is not one of "
            + ", ".join(TOPIC_COMPRESSION_TYPES)
        ) from None


def needs_recompression(payload: bytes, codec: Compression) -> bool:
    """Whether any data batch of ``payload`` is not in ``codec`` (headers only: cheap). A
    payload whose headers do not parse answers True, so that :func:`recompress` reports it."""
    view = memoryview(payload)
    pos = 0
    try:
        while pos < len(view):
            header = parse_header(view, pos)
            if _rewritten(header.compression, header.is_control, header.record_count, codec):
                return True
            pos += header.size
    except Exception:
        return True
    return False


def _rewritten(current: Compression, control: bool, count: int, codec: Compression) -> bool:
    return current != codec and not control and count > 0


def recompress(payload: bytes, codec: Compression, max_batch_bytes: int | None = None) -> bytes:
    """``payload`` (concatenated RecordBatch v2) with every data batch in ``codec`` (see the
    module invariants). Raises CorruptRecordError for a damaged or undecodable batch and
    RecordTooLargeError for one larger than ``max_batch_bytes`` as sent; nothing partial."""
    view = memoryview(payload)
    parts: list[bytes | memoryview] = []
    pos = 0
    while pos < len(view):
        header = validate_batch(view, pos, max_batch_bytes)
        raw = view[pos : pos + header.size]
        if _rewritten(header.compression, header.is_control, header.record_count, codec):
            section = RecordBatch(raw).records_section()
            records = decode_record_tuples(
                section, header.base_offset, header.base_timestamp, header.record_count,
                header.last_offset_delta,
            )
            parts.append(rebuild_batch(header, records, codec))
        else:
            parts.append(raw)
        pos += header.size
    return b"".join(parts)


def check_timestamps(payload: bytes, now_ms: int, max_difference_ms: int) -> None:
    """Kafka's ``message.timestamp.difference.max.ms`` for CreateTime topics: raise
    InvalidTimestampError naming the record when any record's timestamp differs from
    ``now_ms`` by more than ``max_difference_ms`` (the whole payload is then refused, as Kafka
    refuses the partition's append). Control batches are not checked; each batch's CRC is
    checked before its records are read (CorruptRecordError). Decodes every record: only
    called for topics that set the key."""
    view = memoryview(payload)
    low, high = now_ms - max_difference_ms, now_ms + max_difference_ms
    pos = 0
    while pos < len(view):
        header = validate_batch(view, pos)
        raw = view[pos : pos + header.size]
        pos += header.size
        if header.is_control or header.record_count == 0:
            continue
        records = decode_record_tuples(
            RecordBatch(raw).records_section(), header.base_offset, header.base_timestamp,
            header.record_count, header.last_offset_delta,
        )
        stamps = [(offset, ts) for offset, ts, *_ in records]
        for offset, timestamp in stamps:
            if not low <= timestamp <= high:
                raise InvalidTimestampError(
                    f"timestamp {timestamp} of the record at offset delta "
                    f"{offset - header.base_offset} is out of range: it must be within "
                    f"[{low}, {high}] (message.timestamp.difference.max.ms={max_difference_ms} "
                    f"of the broker's clock {now_ms})"
                )
