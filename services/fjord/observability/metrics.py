"""Every Prometheus metric Fjord exports, defined in this one module, and helpers to update them.

Components never create metrics of their own: they call the helpers below, so names, labels and
help texts stay in one place (and in docs/observability.md). All metrics live in the process-wide
default registry of ``prometheus_client`` (which also carries the ``process_*`` and
``python_*`` collectors), served by :func:`start_metrics_server`.

Label conventions:

- ``service``: the role of the process that records the sample (``broker``, ``controller``,
  ``coordinator``, ``producer``, ...), as given to the gRPC interceptors.
- ``method``: the full gRPC method, without the leading slash (``fjord.v1.Broker/Produce``).
- ``code``: the gRPC status code name (``OK``, ``UNAVAILABLE``, ...). Kafka error codes travel
  inside responses and are not RPC failures.
- ``topic`` / ``partition`` / ``group``: what the names say. Topics and groups are bounded by
  what operators create, so their cardinality is the cluster's own size.

Updating a metric takes a lock inside ``prometheus_client`` and never does I/O, so the helpers
are safe on the event loop; the HTTP server runs in its own daemon thread.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    start_http_server,
)

from fjord import __version__
from fjord.errors import ConfigError
from fjord.observability.defaults import METRICS_HOST, METRICS_HOST_ENV, RPC_LATENCY_BUCKETS_S
from fjord.security.acls import AclOperation, ResourceType

# The ``*_created`` timestamp series double the size of a scrape and no dashboard uses them.
disable_created_metrics()

# --- Process -------------------------------------------------------------------------------

BUILD_INFO = Info("fjord_build", "The Fjord version this process runs.")
BUILD_INFO.info({"version": __version__})

# --- RPC (written by the interceptors in fjord.observability.interceptors) -------------------

RPC_SERVER_REQUESTS = Counter(
    "fjord_rpc_server_requests",
    "gRPC requests handled by this process, by method and final status code.",
    ["service", "method", "code"],
)
RPC_SERVER_LATENCY = Histogram(
    "fjord_rpc_server_latency_seconds",
    "Time from receiving a gRPC request to its final status, on the server.",
    ["service", "method", "code"],
    buckets=RPC_LATENCY_BUCKETS_S,
)
RPC_CLIENT_REQUESTS = Counter(
    "fjord_rpc_client_requests",
    "gRPC calls made by this process, by method and final status code.",
    ["service", "method", "code"],
)
RPC_CLIENT_LATENCY = Histogram(
    "fjord_rpc_client_latency_seconds",
    "Time from starting a gRPC call to its final status, on the client.",
    ["service", "method", "code"],
    buckets=RPC_LATENCY_BUCKETS_S,
)

# --- Broker ---------------------------------------------------------------------------------

BROKER_BYTES_IN = Counter(
    "fjord_broker_bytes_in",
    "Record batch bytes appended by produce requests, per topic (replication not counted).",
    ["topic"],
)
BROKER_BYTES_OUT = Counter(
    "fjord_broker_bytes_out",
    "Record batch bytes returned to consumer fetches, per topic (replication not counted).",
    ["topic"],
)
KAFKA_SENDFILE_BYTES = Counter(
    "fjord_kafka_sendfile_bytes",
    "Record bytes the Kafka listener sent from segment files with sendfile (zero copy).",
)
KAFKA_FETCH_RECORD_BYTES = Counter(
    "fjord_kafka_fetch_record_bytes",
    "Record bytes of the Kafka listener's Fetch answers by path: sendfile (from the segment "
    "file to the socket by the kernel), read (from the segment file into the encryption, "
    "TLS doors), copied (through Python into the encoded frame: zero copy off, or a segment "
    "not verified since the broker started).",
    ["path"],
)
KAFKA_SENDFILE_REGIONS = Counter(
    "fjord_kafka_sendfile_regions",
    "Record regions the Kafka listener sent with sendfile; waited=true: the socket had no "
    "room for all of it at once and the rest waited in asyncio's loop.sendfile.",
    ["waited"],
)
BROKER_MESSAGES_IN = Counter(
    "fjord_broker_messages_in",
    "Records appended by produce requests, per topic.",
    ["topic"],
)
BROKER_PARTITIONS_LED = Gauge(
    "fjord_broker_partitions_led",
    "Partitions this broker is currently the leader of.",
)
BROKER_OPEN_STREAMS = Gauge(
    "fjord_broker_open_streams",
    "ProduceStream/FetchStream calls this broker is serving now (fjord.rpc_streams: clients' "
    "and followers' Produce and Fetch requests on one long-lived stream each), and its direct "
    "door's connections (fjord.direct/Produce, fjord.direct/Fetch), by method.",
    ["method"],
)
BROKER_PURGATORY_SIZE = Gauge(
    "fjord_broker_purgatory_size",
    "Requests parked in this broker's purgatory until their condition or timeout (Kafka's "
    "PurgatorySize), by operation: fetch (consumer long polls and follower fetches) or produce "
    "(acks=all waiting for the high watermark).",
    ["operation"],
)
BROKER_UNDER_REPLICATED_PARTITIONS = Gauge(
    "fjord_broker_under_replicated_partitions",
    "Partitions led by this broker whose ISR is smaller than their replica set.",
)
BROKER_ISR_SHRINKS = Counter(
    "fjord_broker_isr_shrinks",
    "ISR shrinks committed for partitions led by this broker.",
)
BROKER_ISR_EXPANDS = Counter(
    "fjord_broker_isr_expands",
    "ISR expansions committed for partitions led by this broker.",
)

BROKER_EVENT_LOOP_STALLS = Counter(
    "fjord_broker_event_loop_stalls",
    "Stretches in which the broker's event loop made no progress for longer than a lease "
    "refresh interval (seen by the lease keep-alive thread), by what happened to the lease: "
    "renewed (the stretch stayed within the stall limit) or withheld (it passed the limit).",
    ["lease"],
)
BROKER_EVENT_LOOP_LAST_STALL = Gauge(
    "fjord_broker_event_loop_last_stall_seconds",
    "Longest time without progress of the event loop's last such stretch.",
)

BROKER_LOG_DIR_WRITE_ERRORS = Counter(
    "fjord_broker_log_dir_write_errors",
    "Writes to the broker's data directory that failed (disk full, I/O error), by operation "
    "(append, follower append, log flush (segments and their index entries), high-watermark "
    "checkpoint, producer snapshot, segment roll, retention, truncation, probe).",
    ["operation"],
)
BROKER_LOG_DIR_WRITABLE = Gauge(
    "fjord_broker_log_dir_writable",
    "1 while the broker's data directory can be written, 0 while writes fail (the broker "
    "then leads no partition that another in-sync replica can take over).",
)
BROKER_LOG_DIR_UNWRITABLE_EPISODES = Counter(
    "fjord_broker_log_dir_unwritable_episodes",
    "How often the data directory turned unwritable (each episode ends when a probe write "
    "succeeds again).",
)
BROKER_LEADERSHIP_RESIGNATIONS = Counter(
    "fjord_broker_leadership_resignations",
    "Partitions whose leadership this broker handed to another in-sync replica, by reason "
    "(disk: its data directory cannot be written; damage: its copy holds a damaged batch).",
    ["reason"],
)

BROKER_SCRUB_BYTES = Counter(
    "fjord_broker_scrub_bytes",
    "Bytes of closed segments the scrubber read and verified (CRC-32C, offsets).",
)
BROKER_SCRUB_SEGMENTS = Counter(
    "fjord_broker_scrub_segments",
    "Closed segments the scrubber verified completely.",
)
BROKER_SCRUB_PASSES = Counter(
    "fjord_broker_scrub_passes",
    "Scrub passes completed (every closed segment of every hosted partition verified once).",
)
BROKER_SCRUB_PASS_PROGRESS = Gauge(
    "fjord_broker_scrub_pass_progress",
    "Fraction (0..1) of the closed segments' bytes verified in the current scrub pass.",
)
BROKER_CLEANER_BYTES_READ = Counter(
    "fjord_broker_cleaner_bytes_read",
    "Bytes of closed segments the log cleaner rewrote (the segments it cleaned).",
)
BROKER_CLEANER_BYTES_WRITTEN = Counter(
    "fjord_broker_cleaner_bytes_written",
    "Bytes of cleaned segments the log cleaner wrote.",
)
BROKER_CLEANER_RECORDS_REMOVED = Counter(
    "fjord_broker_cleaner_records_removed",
    "Records the log cleaner removed (older values, expired tombstones, keyless records).",
)
BROKER_CLEANER_CLEANS = Counter(
    "fjord_broker_cleaner_cleans",
    "Cleans completed, by outcome (cleaned, skipped: the log changed meanwhile, failed).",
    ["outcome"],
)
BROKER_CLEANER_MAX_DIRTY_RATIO = Gauge(
    "fjord_broker_cleaner_max_dirty_ratio",
    "The largest dirty ratio among this broker's compacted logs at the cleaner's last look.",
)
BROKER_CLEANER_LAST_RUN_TIMESTAMP = Gauge(
    "fjord_broker_cleaner_last_run_timestamp_seconds",
    "Unix time the log cleaner last finished a pass (looked at its compacted logs and cleaned "
    "one or none): time() minus this is Kafka's time-since-last-run; it grows when the cleaner "
    "is stuck or keeps failing.",
)
BROKER_CLEANER_BUFFER_UTILIZATION = Gauge(
    "fjord_broker_cleaner_buffer_utilization",
    "The last clean's offset map as a fraction of log.cleaner.dedupe.buffer.size (Kafka's "
    "max-buffer-utilization-percent / 100); 1 means the clean stopped where the map filled.",
)
BROKER_CLEANER_LAST_CLEAN_SECONDS = Gauge(
    "fjord_broker_cleaner_last_clean_seconds",
    "How long the log cleaner's last clean took.",
)
BROKER_LOG_DAMAGE_FOUND = Counter(
    "fjord_broker_log_damage_found",
    "Damaged batches found in this broker's own copies, by how (scrub: the background scrubber; "
    "read: a fetch of a not yet verified segment; report: a follower said a batch failed).",
    ["source"],
)
BROKER_LOG_DAMAGE_REPAIRED = Counter(
    "fjord_broker_log_damage_repaired",
    "Damaged copies repaired: truncated at the damage and fetched again from a healthy leader "
    "up to where the copy ended before.",
)
BROKER_LOG_DAMAGE_REPAIR_SECONDS = Histogram(
    "fjord_broker_log_damage_repair_seconds",
    "Time from truncating a damaged copy to having fetched it again up to its old end.",
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)

# --- Controller -----------------------------------------------------------------------------

CONTROLLER_ACTIVE = Gauge(
    "fjord_controller_active",
    "1 while this controller holds the controller lease, else 0 (the cluster sum must be 1).",
)
CONTROLLER_OFFLINE_PARTITIONS = Gauge(
    "fjord_controller_offline_partitions",
    "Partitions without a live leader, as seen by the active controller.",
)
CONTROLLER_UNDER_REPLICATED_PARTITIONS = Gauge(
    "fjord_controller_under_replicated_partitions",
    "Partitions whose ISR is smaller than their replica set, cluster-wide (active controller).",
)

# --- Consumer groups ------------------------------------------------------------------------

GROUP_REBALANCES = Counter(
    "fjord_group_rebalances",
    "Rebalances started for a consumer group on this coordinator.",
    ["group"],
)
GROUP_LAG = Gauge(
    "fjord_group_lag",
    "Log end offset minus committed offset, per group, topic and partition.",
    ["group", "topic", "partition"],
)
GROUP_LAG_SECONDS = Gauge(
    "fjord_group_lag_seconds",
    "Now minus the timestamp of the first record not yet committed (0 when caught up), per "
    "group, topic and partition.",
    ["group", "topic", "partition"],
)
GROUP_COUNT = Gauge(
    "fjord_group_count",
    "Consumer groups served by this coordinator, per state (Empty, Stable, ...).",
    ["state"],
)
TRANSACTIONS_ENDED = Counter(
    "fjord_transactions",
    "Transactions this transaction coordinator completed, by outcome (commit, abort, "
    "timeout: aborted on transaction.timeout.ms, fenced: aborted for a new producer).",
    ["outcome"],
)
TRANSACTION_COMPLETION_SECONDS = Histogram(
    "fjord_transaction_completion_seconds",
    "From PrepareCommit/PrepareAbort written to CompleteCommit/CompleteAbort written (the "
    "markers on every partition, then the state).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


# --- Helpers --------------------------------------------------------------------------------

# --- Authorization (every service with authorizer.class.name set) ------------------------------

AUTHORIZATION_DENIALS = Counter(
    "fjord_authorization_denials",
    "Requests (or parts of one: a topic, a group) refused by the ACL authorizer, by operation "
    "and resource type (TOPIC/GROUP/CLUSTER_AUTHORIZATION_FAILED answers).",
    ["operation", "resource_type"],
)


def record_authorization_denial(operation: AclOperation, resource_type: ResourceType) -> None:
    """One denial (``operation``/``resource_type``: fjord.security.acls enums)."""
    AUTHORIZATION_DENIALS.labels(operation.java_name, resource_type.java_name).inc()


# --- SASL sessions (KIP-368; brokers and coordinators with SASL doors) ---------------------------

SASL_REAUTHENTICATIONS = Counter(
    "fjord_sasl_reauthentications",
    "Successful SASL re-authentications on Kafka-protocol connections (KIP-368; Kafka's "
    "successful-reauthentication-total).",
)
SASL_EXPIRED_SESSIONS = Counter(
    "fjord_sasl_expired_sessions",
    "SASL sessions used after their connections.max.reauth.ms: on door kafka a connection "
    "closed on its next request (Kafka's expired-connections-killed-count), on door grpc a "
    "call refused for an expired session token.",
    ["door"],
)


def record_sasl_reauthentication() -> None:
    SASL_REAUTHENTICATIONS.inc()


def record_sasl_expired_session(door: str) -> None:
    """``door``: ``kafka`` (a connection closed) or ``grpc`` (a call refused)."""
    SASL_EXPIRED_SESSIONS.labels(door).inc()


#: Per-topic children of the byte and message counters, looked up once per topic: these are
#: counted on every append and every consumer read (``labels()`` hashes its arguments and
#: takes a lock on each call). Children are never removed from these counters, so a cached
#: one is always the exported one.
_TOPIC_IN: dict[str, tuple[Any, Any]] = {}
_TOPIC_OUT: dict[str, Any] = {}


def record_bytes_in(topic: str, num_bytes: int, num_records: int = 0) -> None:
    """Count ``num_bytes`` of batches (and ``num_records`` records) appended to ``topic``."""
    children = _TOPIC_IN.get(topic)
    if children is None:
        children = _TOPIC_IN[topic] = (BROKER_BYTES_IN.labels(topic),
                                       BROKER_MESSAGES_IN.labels(topic))
    children[0].inc(num_bytes)
    if num_records:
        children[1].inc(num_records)


def record_bytes_out(topic: str, num_bytes: int) -> None:
    """Count ``num_bytes`` of batches served to consumers from ``topic``."""
    child = _TOPIC_OUT.get(topic)
    if child is None:
        child = _TOPIC_OUT[topic] = BROKER_BYTES_OUT.labels(topic)
    child.inc(num_bytes)


# The listener counts these once or twice per Fetch answer: children looked up once
# (``labels()`` hashes and locks on every call).
_SENDFILE_RECORD_BYTES = KAFKA_FETCH_RECORD_BYTES.labels("sendfile")
_SENDFILE_REGIONS = {True: KAFKA_SENDFILE_REGIONS.labels("true"),
                     False: KAFKA_SENDFILE_REGIONS.labels("false")}


def record_sendfile_bytes(num_bytes: int) -> None:
    KAFKA_SENDFILE_BYTES.inc(num_bytes)
    _SENDFILE_RECORD_BYTES.inc(num_bytes)


def record_sendfile_region(waited: bool) -> None:
    _SENDFILE_REGIONS[waited].inc()


def record_fetch_record_bytes(path: str, num_bytes: int) -> None:
    """Fetch record bytes the Kafka listener served by ``path`` ("read" or "copied"; sendfile
    ones through :func:`record_sendfile_bytes`)."""
    KAFKA_FETCH_RECORD_BYTES.labels(path).inc(num_bytes)


def open_stream(method: str) -> contextlib.AbstractContextManager[object]:
    """Around the serving of one stream of ``method``: counted in fjord_broker_open_streams
    while it is open."""
    return BROKER_OPEN_STREAMS.labels(method).track_inprogress()


def set_partitions_led(count: int) -> None:
    BROKER_PARTITIONS_LED.set(count)


def set_under_replicated_partitions(count: int) -> None:
    """Broker view: under-replicated partitions among those this broker leads."""
    BROKER_UNDER_REPLICATED_PARTITIONS.set(count)


def record_event_loop_stall(longest_s: float, withheld: bool) -> None:
    """A stretch without event-loop progress ended (called from the keep-alive thread)."""
    BROKER_EVENT_LOOP_STALLS.labels(lease="withheld" if withheld else "renewed").inc()
    BROKER_EVENT_LOOP_LAST_STALL.set(longest_s)


def record_isr_shrink() -> None:
    BROKER_ISR_SHRINKS.inc()


def record_isr_expand() -> None:
    BROKER_ISR_EXPANDS.inc()


def record_log_dir_write_error(operation: str) -> None:
    BROKER_LOG_DIR_WRITE_ERRORS.labels(operation).inc()


def set_log_dir_writable(writable: bool, new_episode: bool = False) -> None:
    BROKER_LOG_DIR_WRITABLE.set(1 if writable else 0)
    if new_episode:
        BROKER_LOG_DIR_UNWRITABLE_EPISODES.inc()


def record_leadership_resignation(reason: str) -> None:
    BROKER_LEADERSHIP_RESIGNATIONS.labels(reason).inc()


def record_scrub_bytes(num_bytes: int) -> None:
    BROKER_SCRUB_BYTES.inc(num_bytes)


def record_scrub_segment() -> None:
    BROKER_SCRUB_SEGMENTS.inc()


def set_scrub_progress(fraction: float, pass_completed: bool = False) -> None:
    BROKER_SCRUB_PASS_PROGRESS.set(fraction)
    if pass_completed:
        BROKER_SCRUB_PASSES.inc()


def record_clean(outcome: str, bytes_read: int = 0, bytes_written: int = 0,
                 records_removed: int = 0, seconds: float | None = None) -> None:
    BROKER_CLEANER_CLEANS.labels(outcome).inc()
    BROKER_CLEANER_BYTES_READ.inc(bytes_read)
    BROKER_CLEANER_BYTES_WRITTEN.inc(bytes_written)
    BROKER_CLEANER_RECORDS_REMOVED.inc(records_removed)
    if seconds is not None:
        BROKER_CLEANER_LAST_CLEAN_SECONDS.set(seconds)


def set_cleaner_buffer_utilization(fraction: float) -> None:
    BROKER_CLEANER_BUFFER_UTILIZATION.set(fraction)


def record_cleaner_pass(unix_time: float) -> None:
    BROKER_CLEANER_LAST_RUN_TIMESTAMP.set(unix_time)


def set_cleaner_max_dirty_ratio(ratio: float) -> None:
    BROKER_CLEANER_MAX_DIRTY_RATIO.set(ratio)


def record_log_damage(source: str) -> None:
    BROKER_LOG_DAMAGE_FOUND.labels(source).inc()


def record_log_repair(seconds: float) -> None:
    BROKER_LOG_DAMAGE_REPAIRED.inc()
    BROKER_LOG_DAMAGE_REPAIR_SECONDS.observe(seconds)


def set_active_controller(active: bool) -> None:
    CONTROLLER_ACTIVE.set(1 if active else 0)


def set_offline_partitions(count: int) -> None:
    """Controller view: partitions whose leader is -1 or not alive."""
    CONTROLLER_OFFLINE_PARTITIONS.set(count)


def set_cluster_under_replicated_partitions(count: int) -> None:
    """Controller view: cluster-wide count of partitions with ISR smaller than replicas."""
    CONTROLLER_UNDER_REPLICATED_PARTITIONS.set(count)


def record_rebalance(group: str) -> None:
    GROUP_REBALANCES.labels(group).inc()


def set_group_lag(group: str, topic: str, partition: int, lag: int) -> None:
    GROUP_LAG.labels(group, topic, str(partition)).set(lag)


def set_group_lag_seconds(group: str, topic: str, partition: int, seconds: float | None) -> None:
    """The time lag of one partition; None (unknown: the record could not be read) removes the
    series rather than leave a stale value."""
    if seconds is None:
        with contextlib.suppress(KeyError):
            GROUP_LAG_SECONDS.remove(group, topic, str(partition))
    else:
        GROUP_LAG_SECONDS.labels(group, topic, str(partition)).set(seconds)


def record_transaction_end(outcome: str, completion_s: float) -> None:
    """One transaction completed (``commit``, ``abort``, ``timeout``, ``fenced``) and how long
    its markers and completion took."""
    TRANSACTIONS_ENDED.labels(outcome).inc()
    TRANSACTION_COMPLETION_SECONDS.observe(completion_s)


def set_group_count(state: str, count: int) -> None:
    """How many groups this coordinator serves in ``state`` (Kafka's state names)."""
    GROUP_COUNT.labels(state).set(count)


def remove_group_lag(group: str, topic: str, partition: int) -> None:
    """Forget the lag series, offsets and seconds (the group was deleted or no longer owns the
    partition)."""
    for gauge in (GROUP_LAG, GROUP_LAG_SECONDS):
        with contextlib.suppress(KeyError):
            gauge.remove(group, topic, str(partition))


_RPC_METRICS = {
    "server": (RPC_SERVER_REQUESTS, RPC_SERVER_LATENCY),
    "client": (RPC_CLIENT_REQUESTS, RPC_CLIENT_LATENCY),
}
# (side, service, method, code) -> labelled (counter, histogram). ``labels()`` takes a lock and
# builds a tuple on every call; the set of keys is bounded by the RPCs a process has seen.
_rpc_children: dict[tuple[str, str, str, str], tuple[Any, Any]] = {}


def record_rpc(side: str, service: str, method: str, code: str, seconds: float) -> None:
    """One finished RPC. ``side`` is ``"server"`` or ``"client"``."""
    key = (side, service, method, code)
    children = _rpc_children.get(key)
    if children is None:
        if side not in _RPC_METRICS:
            raise ValueError(f"side must be 'server' or 'client', not {side!r}")
        counter, histogram = _RPC_METRICS[side]
        children = (
            counter.labels(service, method, code),
            histogram.labels(service, method, code),
        )
        _rpc_children[key] = children
    children[0].inc()
    children[1].observe(seconds)


# --- HTTP exposition ------------------------------------------------------------------------

_servers: dict[int, WSGIServer] = {}
_servers_lock = threading.Lock()


def start_metrics_server(port: int, host: str | None = None) -> int:
    """Serve ``/metrics`` on ``host:port`` from a daemon thread; returns the bound port.

    ``host`` None: the ``FJORD_METRICS_HOST`` variable, else loopback (``METRICS_HOST``); the
    container image sets the variable to ``0.0.0.0`` so probes and Prometheus reach the pod.
    ``port=0`` picks a free port (tests, and several processes on one machine). Raises
    :class:`~fjord.errors.ConfigError` when the port is out of range or cannot be bound.
    """
    if host is None:
        host = os.environ.get(METRICS_HOST_ENV) or METRICS_HOST
    if not 0 <= port <= 65535:
        raise ConfigError(f"metrics port must be in 0..65535, got {port}")
    try:
        server, _thread = start_http_server(port, addr=host, registry=REGISTRY)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc}") from exc
    bound_port = int(server.server_port)
    with _servers_lock:
        _servers[bound_port] = server
    return bound_port


def stop_metrics_server(port: int) -> None:
    """Stop a server started by :func:`start_metrics_server` (no-op for an unknown port)."""
    with _servers_lock:
        server = _servers.pop(port, None)
    if server is not None:
        server.shutdown()
        server.server_close()


def metrics_served() -> bool:
    """True while this process serves ``/metrics`` (started by :func:`start_metrics_server`):
    the clients then record their per-call metrics too (see :mod:`fjord.observability.clients`)."""
    with _servers_lock:
        return bool(_servers)
