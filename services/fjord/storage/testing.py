"""Valid RecordBatch v2 bytes for storage tests, benchmarks and the demo.

Storage never decodes records, so its tests only need batches whose header, length and CRC are
right. This builds them with uncompressed records of Kafka's v2 layout (no keys, no headers);
the full codec is :mod:`fjord.records`.
"""

from __future__ import annotations

from fjord.records.header import (
    BATCH_HEADER_SIZE,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    MAGIC_V2,
    seal_batch,
)
from fjord.records.varint import encode_zigzag


def make_batch(
    values: list[bytes],
    base_timestamp: int = 0,
    timestamp_step: int = 0,
    base_offset: int = 0,
    leader_epoch: int = -1,
) -> bytes:
    """One uncompressed batch holding ``values`` (one record each, timestamps
    ``base_timestamp + i * timestamp_step``), with a correct length and CRC-32C."""
    if not values:
        raise ValueError("a batch needs at least one record")
    records = bytearray()
    for i, value in enumerate(values):
        body = (
            b"\x00"
            + encode_zigzag(i * timestamp_step)
            + encode_zigzag(i)
            + encode_zigzag(-1)
            + encode_zigzag(len(value))
            + value
            + encode_zigzag(0)
        )
        records += encode_zigzag(len(body)) + body
    count = len(values)
    max_ts = base_timestamp + (count - 1) * max(timestamp_step, 0)
    size = BATCH_HEADER_SIZE + len(records)
    header = bytearray(
        HEADER_STRUCT.pack(
            base_offset,
            size - LOG_OVERHEAD,
            leader_epoch,
            MAGIC_V2,
            0,
            0,
            count - 1,
            base_timestamp,
            max_ts,
            -1,
            -1,
            -1,
            count,
        )
    )
    batch = header + records
    seal_batch(batch)
    return bytes(batch)


def make_batch_of_size(total_size: int, timestamp: int = 0) -> bytes:
    """One single-record batch of exactly ``total_size`` bytes (>= 80)."""
    overhead = len(make_batch([b""], timestamp))
    value_len = total_size - overhead
    for _ in range(4):  # the varint lengths grow with the value; converge on the exact size
        batch = make_batch([b"x" * value_len], timestamp)
        value_len += total_size - len(batch)
    if len(batch) != total_size:
        raise ValueError(f"cannot build a batch of exactly {total_size} bytes")
    return batch
