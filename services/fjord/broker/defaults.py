"""Every default of the broker service, defined once here; the defaults of its config keys
(``--config``, the ``--listen`` port) are :mod:`fjord.cluster.defaults`', shared with whoever
checks a broker config.

Names follow Kafka's broker settings where one exists (in the comment); values are Kafka's unless
a comment says why Fjord differs.
"""

from __future__ import annotations

# --- network -------------------------------------------------------------------------------

#: Largest gRPC message the broker sends or accepts. A produce request may carry up to
#: 64 MiB of batches (a large ``max.request.size``) and a fetch may answer up to ``fetch.max.bytes``
#: plus one oversized first batch; 8 MiB of headroom covers protobuf framing of many partitions.
GRPC_MAX_MESSAGE_BYTES = 64 * 1024 * 1024 + 8 * 1024 * 1024

#: Seconds the server lets in-flight calls finish on SIGTERM/SIGINT before cancelling them.
SHUTDOWN_GRACE_S = 5.0

# --- etcd registration -----------------------------------------------------------------------

#: TTL of the broker's etcd lease (its liveness): the controller moves leadership away this many
#: seconds after a broker dies without revoking its lease (Kafka: broker.session.timeout.ms = 9 s).
BROKER_LEASE_TTL_S = 9

#: How often the lease is refreshed: three refreshes per TTL, so one lost refresh is harmless.
LEASE_KEEPALIVE_INTERVAL_S = BROKER_LEASE_TTL_S / 3

#: How often the event loop stamps its progress for the lease keep-alive thread (which renews
#: the lease only while the stamp is younger than ``--loop-stall-limit``, by default the TTL;
#: fjord.broker.lease_keeper). Ten wake-ups a second cost nothing measurable.
LOOP_PROGRESS_TICK_S = 0.1
#: How often the keep-alive thread looks at the stamp (it renews every refresh interval, and at
#: once when a stalled loop moves again).
LEASE_KEEPALIVE_POLL_S = 0.25
#: Smallest ``--loop-stall-limit``: below a second ordinary pauses (a full garbage collection, a
#: large metadata apply's slice) would stop renewals.
LOOP_STALL_LIMIT_MIN_S = 1.0


#: Seconds to wait at start-up for the first metadata snapshot before serving anyway.
METADATA_STARTUP_TIMEOUT_S = 30.0
#: An apply of a metadata change taking longer than this is logged (again every this many
#: seconds) with where it waits: every newer change waits behind it.
METADATA_APPLY_SLOW_S = 10.0

# --- request handling ---------------------------------------------------------------------------

#: Kafka's ``request.timeout.ms`` default, used when a produce request carries timeout_ms <= 0.
DEFAULT_REQUEST_TIMEOUT_MS = 30_000

#: Upper bound on a fetch's ``max_wait_ms`` (a client cannot park a call for longer).
MAX_FETCH_WAIT_MS = 60_000

#: ``fetch.max.bytes`` (broker side cap on one fetch response; Kafka: 55 MiB).
FETCH_MAX_BYTES = 55 * 1024 * 1024

#: Per-partition cap used when a fetch leaves ``partition_max_bytes`` at 0 (unset): the Kafka
#: consumer's ``max.partition.fetch.bytes`` default.
PARTITION_FETCH_MAX_BYTES = 1024 * 1024

#: Reads larger than this are done in a worker thread instead of on the event loop: small reads
#: come from the page cache in microseconds, and a thread hop costs more than that.
READ_IN_THREAD_THRESHOLD_BYTES = 1024 * 1024

# --- periodic log maintenance ------------------------------------------------------------------

#: How often logs are checked for ``flush.messages`` / ``flush.ms`` (Kafka:
#: log.flush.scheduler.interval.ms; Kafka leaves flushing to the OS by default, and so do the
#: default topic configs: this check is cheap when nothing asks for a flush).
FLUSH_CHECK_INTERVAL_S = 1.0

#: How often logs are checked for a time-based roll (segment.ms).
ROLL_CHECK_INTERVAL_S = 10.0

#: Upper bound on one maintenance pass; a pass that takes longer is logged and cancelled.
MAINTENANCE_TIMEOUT_S = 60.0

# --- idempotent producers (see docs/idempotence.md) ------------------------------------------

#: ``producer.id.expiration.ms``: a producer id whose newest batch in a partition is this old is
#: forgotten by that partition (its next batch must then start at sequence 0). Kafka: 1 day.
PRODUCER_ID_EXPIRATION_MS = 24 * 3600 * 1000

#: How often expired producer ids are removed (Kafka:
#: producer.id.expiration.check.interval.ms = 10 min).
PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_S = 600.0

#: How often partitions are checked for a producer-state snapshot to write (one is written
#: when the log rolled a segment since the last snapshot; another at clean shutdown).
PRODUCER_SNAPSHOT_CHECK_INTERVAL_S = 10.0

#: Snapshot files kept per partition directory (the newest ones; older ones are deleted).
PRODUCER_SNAPSHOTS_RETAINED = 2

#: Seconds the broker waits for the controller's AllocateProducerIds before InitProducerId
#: answers COORDINATOR_NOT_AVAILABLE (retriable).
PRODUCER_ID_ALLOCATION_TIMEOUT_S = 10.0

#: A produce payload that a topic's compression.type makes the leader rewrite in another codec
#: (fjord.records.recompress) is rewritten on the event loop up to this size, in a worker thread
#: above it. Measured (2 shared cores, load 4): 64 KiB of records (586 records, gzip -> zstd)
#: take 4.5 ms and 1 MiB 100 ms, which would stall every other request; 8 KiB stay well under
#: a millisecond, less than a thread hand-off is worth.
RECOMPRESS_INLINE_MAX_BYTES = 8 * 1024

#: New partition replicas are opened (directory, segment files, producer state) in a worker
#: thread this many at a time, the event loop running in between, so a topic of thousands of
#: partitions never stalls lease keep-alives or requests (issue 12). Creations of more than
#: OPEN_PARTITIONS_LOGGED partitions are logged as one line instead of one per partition.
OPEN_PARTITIONS_CHUNK = 100
#: Chunks opened at once (worker threads; their fsyncs overlap).
OPEN_PARTITIONS_PARALLEL = 4
OPEN_PARTITIONS_LOGGED = 20
#: A metadata apply yields to the event loop after this many partitions looked at.
APPLY_YIELD_EVERY = 500

# --- data directory health (see docs/operations.md, "Disk full") ------------------------------

#: While the data directory cannot be written, how often the broker probes it (and asks again
#: to hand over leadership of partitions it still leads).
DISK_PROBE_INTERVAL_S = 1.0

#: A probe counts the directory writable again only with at least this much free space (so a
#: disk with a few KiB free does not flip back and forth with every small write) ...
DISK_PROBE_MIN_FREE_BYTES = 4 * 1024 * 1024

#: ... and after writing and fsyncing a probe file of this size (then deleted).
DISK_PROBE_BYTES = 64 * 1024

#: Name of that probe file in the data directory (hidden: the LogManager ignores it).
DISK_PROBE_FILE = ".fjord-disk-probe"

#: Producer-state snapshots a broker writes at once (each waits for an fsync in a worker
#: thread; at shutdown every partition whose producer state moved writes one).
SNAPSHOTS_AT_ONCE = 8
