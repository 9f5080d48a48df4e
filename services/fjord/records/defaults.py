"""Every default of the record codec, defined once here (Kafka's values where Kafka has one)."""

from __future__ import annotations

#: ``batch.size``: the builder accepts records until the batch would exceed this many bytes
#: (the first record is always accepted, however large). Kafka's producer default.
DEFAULT_BATCH_SIZE = 16384

#: gzip level Kafka's Java client uses by default (``compression.gzip.level`` = -1 = zlib's 6).
DEFAULT_GZIP_LEVEL = 6

#: zstd level Kafka's Java client uses by default (``compression.zstd.level`` = 3).
DEFAULT_ZSTD_LEVEL = 3

#: Uncompressed bytes per LZ4 frame block: 64 KiB, the block size Kafka's Java client writes
#: (frame descriptor BD = 0x40).
LZ4_BLOCK_SIZE = 64 * 1024

#: Uncompressed bytes per block in the xerial snappy framing: xerial's SnappyOutputStream default,
#: which Kafka's Java client uses for the records section.
XERIAL_SNAPPY_BLOCK_SIZE = 32 * 1024

#: Largest records section a compressed batch may inflate to: a batch that inflates further is
#: refused as corrupt. The check runs after the codec has inflated the data (the codecs offer no
#: bounded one-shot decompression), so it limits what a consumer keeps, not the transient peak.
#: Only consumers decompress: the broker never does.
MAX_DECOMPRESSED_RECORDS_BYTES = 256 * 1024 * 1024
