"""Every default of the Fjord Spark data source, defined once (see docs/spark.md)."""

from __future__ import annotations

#: The format name users pass to ``spark.read.format(...)`` / ``writeStream.format(...)``.
FORMAT_NAME = "fjord"

#: Java release Spark 4 needs; older ones fail with a clear error before Spark starts.
MIN_JAVA_VERSION = 17

#: Where streaming queries start without ``startingOffsets`` (Spark's Kafka source: latest).
STREAMING_STARTING_OFFSETS = "latest"

#: Where batch queries start and end without ``startingOffsets`` / ``endingOffsets``
#: (Spark's Kafka source: earliest .. latest).
BATCH_STARTING_OFFSETS = "earliest"
BATCH_ENDING_OFFSETS = "latest"

#: ``failOnDataLoss`` default (Spark's Kafka source: true).
FAIL_ON_DATA_LOSS = True

#: ``startingOffsetsByTimestampStrategy`` default: "error" fails when no record is at or after
#: the timestamp; "latest" starts at the end instead (Spark's Kafka source's names).
TIMESTAMP_STRATEGY = "error"

#: ``pollTimeoutMs``: how long a task waits for records it knows exist before failing (Spark's
#: kafkaConsumer.pollTimeoutMs defaults to spark.network.timeout, 120 s).
POLL_TIMEOUT_MS = 120_000

#: ``max.poll.records`` of the consumer inside a read task unless ``fjord.max.poll.records`` is
#: given: a task converts whole polls into Arrow, so bigger polls mean fewer, bigger batches.
TASK_MAX_POLL_RECORDS = 20_000

#: Most rows in one Arrow record batch a read task yields (about: a fetched batch is never
#: split, so one may hold a producer batch's records more).
ARROW_BATCH_ROWS = 20_000
#: A read task yields its Arrow batch once the keys and values it holds pass this many bytes
#: (with the C extension), whatever the rows: large records stay far from Arrow's 2 GiB limit
#: of a binary column's int32 offsets.
ARROW_BATCH_BYTES = 64 * 1024 * 1024

#: ``acks`` of the producer inside a write task unless ``fjord.acks`` is given (Kafka's default).
WRITER_ACKS = "all"

#: ``batch.size`` of the producer inside a write task unless ``fjord.batch.size`` is given: a
#: task writes many rows at once (Producer.send_many), and with the producer's 16 KiB default
#: an idempotent producer (at most 5 batches of a partition unanswered) waits on round trips:
#: 148k rows/s vs 1.18M with 1 MiB (bench/RESULTS.md, section spark). 1 MiB is the default
#: ``max.request.size``, and a batch never exceeds batch.size, so it fits a topic's default
#: ``max.message.bytes``.
WRITER_BATCH_SIZE = 1_048_576

#: ``maxTriggerDelay`` default: with ``minOffsetsPerTrigger``, the longest a micro-batch waits
#: for enough records (Spark's Kafka source: 15m).
MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000

#: How long a report to the consumer group (``kafka.group.id``) is waited for before the
#: source goes on (it stays in flight and is checked at the next trigger).
REPORT_WAIT_S = 5.0

#: How long a stopping streaming query waits for a report still in flight.
REPORT_FLUSH_S = 5.0

#: ``transactionalIdPrefix`` default: the exactly-once sink's transactional ids are
#: ``<prefix>-<query id>-<write task partition>``.
TRANSACTIONAL_ID_PREFIX = "fjord-spark"
