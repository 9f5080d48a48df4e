"""The broker process: etcd registration, metadata following, log maintenance, gRPC serving.

Lifecycle (:class:`BrokerServer`): open every local log (LogManager) -> follow the cluster
metadata (MetadataWatcher; the first snapshot decides which logs this broker hosts) -> serve gRPC
-> register ``brokers/<id>`` under its own lease -> run until SIGTERM/SIGINT -> stop serving,
revoke the lease (the controller moves leadership at once instead of after the TTL), stop the
watcher, close the logs (clean-shutdown marker).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aetcd
from grpc import aio

from fjord._proto import broker_pb2
from fjord.broker import defaults
from fjord.broker.direct_door import DirectDoor
from fjord.broker.disk_monitor import DiskMonitor
from fjord.broker.fetcher import ReplicaFetcherManager
from fjord.broker.isr_sender import AlterPartitionSender
from fjord.broker.kafka_apis import BrokerKafkaHandlers
from fjord.broker.lease_thread import LeaseKeepAliveThread, LoopProgress
from fjord.broker.log_cleaner import LogCleaner
from fjord.broker.loop_stall_hook import install_loop_stall_hook
from fjord.broker.partition import Partition
from fjord.broker.producer_ids import ProducerIdAllocator
from fjord.broker.producer_state import (
    prune_snapshots,
    publish_snapshot,
    snapshot_due,
    snapshot_wanted,
    stage_snapshot,
)
from fjord.broker.replica_manager import ReplicaManager
from fjord.broker.replication_checkpoint import HighWatermarkCheckpoint
from fjord.broker.scrubber import Scrubber
from fjord.broker.service import BrokerServicer, add_broker_service
from fjord.cluster.broker_config import (
    retention_check_interval_s,
    topic_settings,
    validate_broker_config,
)
from fjord.cluster.cleaner_config import CleanerSettings
from fjord.cluster.dynamic_config import effective_broker_config
from fjord.cluster.scrubber_config import ScrubberSettings
from fjord.direct_client import door_address
from fjord.errors import ConfigError, FjordError
from fjord.kafka.admin import BrokerAdminHandlers, ControllerForwarder
from fjord.kafka.defaults import COORDINATOR_NODE_ID_BASE
from fjord.kafka.groups import FindCoordinatorHandler
from fjord.kafka.listeners import KafkaDoor, door_for
from fjord.kafka.server import MAX_IN_FLIGHT_PRODUCE, KafkaDoors, SaslSettings
from fjord.metadata import (
    BrokerRegistration,
    Keys,
    MetadataImage,
    MetadataWatcher,
    etcd_client,
    parse_etcd_endpoint,
)
from fjord.metadata.coordinator_lookup import OffsetsTopicCreator
from fjord.metadata.registration import (
    LeaseStatus,
    refresh_lease_once,
    register_under_lease,
    take_back_registration,
)
from fjord.metadata.schema import KafkaEndpoint
from fjord.observability.interceptors import server_interceptors
from fjord.observability.metrics import start_metrics_server, stop_metrics_server
from fjord.process_state import StateDirLock, record_incarnation
from fjord.sasl_door import bind_sasl_port, sasl_door_server
from fjord.security import ServiceSecurity
from fjord.security.acls import AuthorizerSettings
from fjord.security.sasl_sessions import SessionLifetime, connections_max_reauth_ms
from fjord.serving import (
    access_control,
    advertised_host,
    bind_grpc_port,
    cancel_until_done,
    run_until_signalled,
)
from fjord.storage import LogManager
from fjord.storage.disk_health import DiskCondition
from fjord.tls import ClusterActionGuard, use_service_security
from fjord.topic_partition import TopicPartition

log = logging.getLogger(__name__)


#: Hidden file (LogManager ignores dot entries) naming the cluster and broker a data dir
#: belongs to, like Kafka's meta.properties: a broker started with the wrong cluster id or
#: broker id fails instead of treating every local log as a stray and deleting it.
IDENTITY_FILE = ".fjord-broker.json"
#: The broker's :class:`StateDirLock` file in its data dir (a hidden file: LogManager skips it).
BROKER_LOCK_FILE = ".fjord-broker.lock"


def check_data_dir_identity(data_dir: Path, cluster_id: str, broker_id: int) -> None:
    """Create the identity file of a new data dir, or check that it matches. Raises ConfigError
    naming ``data-dir`` on a mismatch or an unreadable file."""
    path = data_dir / IDENTITY_FILE
    expected = {"cluster_id": cluster_id, "broker_id": broker_id}
    if path.exists():
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"data-dir: cannot read {path}: {exc}") from exc
        if found != expected:
            raise ConfigError(
                f"data-dir: {data_dir} belongs to cluster {found.get('cluster_id')!r} broker "
                f"{found.get('broker_id')!r}, not cluster {cluster_id!r} broker {broker_id}"
            )
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(expected))
    os.replace(tmp, path)


def await_chain(task: asyncio.Task[Any]) -> list[str]:
    """Where a suspended task waits: ``function (file:line)`` of each coroutine in its await
    chain, outermost first (a task's own stack shows only its outermost frame)."""
    chain: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None and getattr(awaited, "cr_frame", None) is not None:
        frame = awaited.cr_frame
        chain.append(f"{frame.f_code.co_name} ({Path(frame.f_code.co_filename).name}:"
                     f"{frame.f_lineno})")
        awaited = getattr(awaited, "cr_await", None)
    return chain


class MetadataApplier:
    """Applies the newest metadata image to this broker's replicas, in its own task.

    The watcher only hands images over (:meth:`offer`), so a slow apply (a topic of thousands
    of partitions to open) never holds up the watch stream, and images arriving meanwhile are
    coalesced: the next apply takes the newest. Invariant: :attr:`revision` is the revision of
    the last image whose apply finished; it only grows.
    """

    def __init__(
        self,
        apply: Callable[[MetadataImage], Awaitable[None]],
        *,
        slow_after_s: float = defaults.METADATA_APPLY_SLOW_S,
    ) -> None:
        self._apply = apply
        self._latest: MetadataImage | None = None
        self._wake = asyncio.Event()
        self._applied = asyncio.Condition()
        self._slow_after_s = slow_after_s
        self.revision = -1

    def offer(self, _old: MetadataImage, new: MetadataImage) -> None:
        self._latest = new
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            image = self._latest
            assert image is not None
            try:
                await self._apply_reporting_slowness(image)
            except Exception:
                log.exception("applying metadata revision %d failed", image.revision)
                continue
            async with self._applied:
                self.revision = max(self.revision, image.revision)
                self._applied.notify_all()

    async def _apply_reporting_slowness(self, image: MetadataImage) -> None:
        """Apply ``image``; while that takes longer than ``slow_after_s``, say so every
        ``slow_after_s`` with what the apply is waiting on. Every later metadata change waits
        behind this apply, so a stuck one (issue 12: a fetcher's stop that never returned)
        must show in the log, not only as a broker that silently stopped following metadata."""
        applying = asyncio.ensure_future(self._apply(image))
        started = time.monotonic()
        try:
            while True:
                done, _ = await asyncio.wait({applying}, timeout=self._slow_after_s)
                if done:
                    applying.result()
                    return
                log.warning(
                    "applying metadata revision %d has taken %.0f s so far; newer metadata "
                    "waits behind it (waiting in %s)", image.revision,
                    time.monotonic() - started, " -> ".join(await_chain(applying)) or "?",
                )
        finally:
            if not applying.done():  # our caller was cancelled: the apply goes with it
                applying.cancel()

    async def wait_applied(self, revision: int, timeout: float) -> None:
        """Wait until an image of at least ``revision`` has been applied (TimeoutError)."""
        async with self._applied:
            await asyncio.wait_for(
                self._applied.wait_for(lambda: self.revision >= revision), timeout
            )


@dataclass(frozen=True)
class BrokerOptions:
    """Everything ``fjord broker`` is started with.

    ``advertised_host`` is what clients are told to connect to (default: the listen host, or
    this machine's host name when listening on a wildcard address). ``listen_port`` 0 binds a
    free port and advertises the bound one.
    """

    broker_id: int
    listen_host: str
    listen_port: int
    data_dir: Path
    etcd_url: str
    cluster_id: str
    rack: str | None = None
    metrics_port: int | None = None
    config: dict[str, str] = field(default_factory=dict)
    advertised_host: str | None = None
    lease_ttl_s: int = defaults.BROKER_LEASE_TTL_S
    #: Seconds the event loop may make no progress before the lease is no longer renewed
    #: (None: the lease TTL; fjord.broker.lease_keeper says why).
    loop_stall_limit_s: float | None = None
    #: ``KAFKA`` listener (host, port; port 0: any free) or None for no Kafka-protocol door;
    #: ``kafka_advertised``: the (host, port) Kafka clients are told (port 0: the bound one).
    kafka_listener: tuple[str, int] | None = None
    kafka_advertised: tuple[str, int] | None = None
    #: TLS for every listener and every connection this broker opens (None: plaintext);
    #: ``kafka_tls``: the Kafka-protocol door is ``SSL://`` (needs ``security``).
    security: ServiceSecurity | None = None
    kafka_tls: bool = False
    #: The Kafka-protocol door authenticates with SASL SCRAM (``SASL_PLAINTEXT://`` or, with
    #: ``kafka_tls``, ``SASL_SSL://``) against the credentials in the metadata image.
    kafka_sasl: bool = False
    #: More Kafka-protocol doors, or all of them (fjord.kafka.listeners.resolve_kafka_doors:
    #: several named listeners, each advertised under its own name); the door of
    #: ``kafka_listener`` (the older, one-door options) comes first.
    kafka_doors: tuple[KafkaDoor, ...] = ()
    #: ACL authorization (``authorizer.class.name`` in the security config); None: off.
    authorization: AuthorizerSettings | None = None
    #: The SASL gRPC door (host, port) for Fjord's own SASL clients (fjord.sasl_door): TLS
    #: without client certificates with ``security``, else plaintext; None: no such door.
    sasl_grpc_listener: tuple[str, int] | None = None
    #: The direct door (host, port; port 0: any free) serving Produce and Fetch as protobuf
    #: frames on plain TCP (fjord.broker.direct_door); None: no such door. It has no
    #: identity, so it is refused with TLS (``security``) or ``authorization``.
    direct_listener: tuple[str, int] | None = None

    @property
    def effective_loop_stall_limit_s(self) -> float:
        """The loop stall limit in force: ``loop_stall_limit_s``, by default the lease TTL."""
        return float(self.lease_ttl_s if self.loop_stall_limit_s is None
                     else self.loop_stall_limit_s)

    @property
    def all_kafka_doors(self) -> tuple[KafkaDoor, ...]:
        """Every Kafka door this process opens: ``kafka_listener``'s, then ``kafka_doors``."""
        first = () if self.kafka_listener is None else (door_for(
            self.kafka_listener, self.kafka_advertised, self.kafka_tls, self.kafka_sasl),)
        return (*first, *self.kafka_doors)

    def __post_init__(self) -> None:
        if (self.kafka_tls and self.security is None) or (
            self.security is None and any(door.tls for door in self.kafka_doors)
        ):
            raise ConfigError(
                "listeners: an SSL:// or SASL_SSL:// listener needs --security-config"
            )
        if self.direct_listener is not None and (
            self.security is not None or self.authorization is not None
        ):
            raise ConfigError(
                "direct-listen: the direct door is plain TCP without identity (every request "
                "would run as User:ANONYMOUS, bypassing client certificates and ACLs); it "
                "cannot be opened with --security-config TLS or authorization"
            )
        if self.broker_id < 0:
            raise ConfigError(f"id: broker id must be >= 0, got {self.broker_id}")
        if self.broker_id >= COORDINATOR_NODE_ID_BASE:
            raise ConfigError(
                f"id: broker id must be below {COORDINATOR_NODE_ID_BASE} (Kafka node ids "
                f"from there on name group coordinators), got {self.broker_id}"
            )
        if self.lease_ttl_s < 1:
            raise ConfigError(f"lease-ttl: must be >= 1 s, got {self.lease_ttl_s}")
        if self.loop_stall_limit_s is not None and not (
            defaults.LOOP_STALL_LIMIT_MIN_S <= self.loop_stall_limit_s <= 3600
        ):
            raise ConfigError(
                f"loop-stall-limit: must be between {defaults.LOOP_STALL_LIMIT_MIN_S} and "
                f"3600 s, got {self.loop_stall_limit_s}")
        try:
            Keys(self.cluster_id)
        except ValueError as exc:
            raise ConfigError(f"cluster-id: {exc}") from exc
        parse_etcd_endpoint(self.etcd_url)
        validate_broker_config(self.config)


async def snapshot_producer_state(partition: Partition, *, force: bool = False) -> bool:
    """Write ``partition``'s producer-state snapshot if one is due (see
    :func:`snapshot_due`); True when one was published.

    The state is serialised on the event loop and the file is written and fsynced by a worker
    thread under a temporary name; it is renamed into place back on the loop only if no
    truncation replaced the state meanwhile (truncations also run on the loop), so a published
    snapshot never describes batches that a truncation removed.
    """
    state = partition.producer_state
    data = snapshot_due(state, partition.log, force=force)
    if data is None:
        return False
    end = state.end_offset
    directory = partition.log.directory
    staged = await asyncio.to_thread(stage_snapshot, directory, data, end)
    if partition.producer_state is not state:
        staged.unlink(missing_ok=True)
        return False
    publish_snapshot(staged)
    await asyncio.to_thread(prune_snapshots, directory)
    state.last_snapshot_offset = max(state.last_snapshot_offset, end)
    return True


class BrokerServer:
    """One running broker.

    Invariants: the etcd key ``brokers/<id>`` exists only while this process holds its lease;
    once etcd says the lease is gone the ReplicaManager is fenced (no leader appends) until the
    broker has re-registered and its metadata image has caught up with the new registration;
    while etcd merely cannot be reached the broker serves on (leadership ends with a newer
    leader epoch, never with a clock); every background task is cancelled and awaited by
    :meth:`stop`.
    """

    def __init__(self, options: BrokerOptions) -> None:
        self.options = options
        self._keys = Keys(options.cluster_id)
        self._etcd: aetcd.Client | None = None
        self._watcher: MetadataWatcher | None = None
        self._applier: MetadataApplier | None = None
        self._logs: LogManager | None = None
        self.replicas: ReplicaManager | None = None
        self.scrubber: Scrubber | None = None
        self.cleaner: LogCleaner | None = None
        self._producer_ids = ProducerIdAllocator(options.broker_id, lambda: self._image())
        self._offsets_topic = OffsetsTopicCreator(lambda: self._image())
        self._fetchers: ReplicaFetcherManager | None = None
        self._hw_checkpoint = HighWatermarkCheckpoint(options.data_dir)
        #: What the periodic checkpoint last wrote (None: nothing yet this run).
        self._hw_checkpointed: dict[TopicPartition, int] | None = None
        self.disk = DiskMonitor(options.data_dir, self._on_disk_unwritable, self._on_disk_writable)
        #: The broker epoch: the etcd revision of this process's current registration.
        self.broker_epoch = -1
        #: New at every start of this process (Kafka's incarnation id): a registration with the
        #: same incarnation is this process again (e.g. after etcd lost its lease), another one
        #: is a restart whose predecessor the controller must treat as gone.
        self.incarnation = uuid.uuid4().hex
        #: The incarnation of the previous process on this data dir (None: none recorded).
        self.previous_incarnation: str | None = None
        self._lock = StateDirLock(options.data_dir, BROKER_LOCK_FILE, "broker", "data-dir")
        # Set when the keep-alive thread says the lease is gone (_lost_lease names it) or the
        # controller said our registration is not current (STALE_BROKER_EPOCH; fenced).
        self._lease_event = asyncio.Event()
        self._lost_lease: tuple[int, float | None] | None = None
        #: Stamped by the event loop every tick; the keep-alive thread renews the lease only
        #: while the stamp is younger than the stall limit.
        self.loop_progress = LoopProgress()
        self._lease_thread: LeaseKeepAliveThread | None = None
        self._server: aio.Server | None = None
        self._sasl_server: aio.Server | None = None
        self._servicer: BrokerServicer | None = None
        #: The SASL gRPC door's bound port (0: no door).
        self.sasl_port = 0
        self._direct: DirectDoor | None = None
        #: The direct door's bound port (0: no door).
        self.direct_port = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._lease_id: int | None = None
        self._metrics_port: int | None = None
        self.port: int = options.listen_port
        self._kafka = KafkaDoors(options.all_kafka_doors, f"broker {options.broker_id} kafka")
        self._forwarder: ControllerForwarder | None = None
        self._stopped = asyncio.Event()

    # --- start/stop -----------------------------------------------------------------------------

    async def start(self) -> None:
        opts = self.options
        opts.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        check_data_dir_identity(opts.data_dir, opts.cluster_id, opts.broker_id)
        self.previous_incarnation = record_incarnation(opts.data_dir, self.incarnation)
        use_service_security(opts.security)
        self._etcd = etcd_client(opts.etcd_url)
        await self._etcd.connect()
        await self._end_previous_run()
        default_log_config = topic_settings(opts.config, {}, {}).log_config
        # LogManager loads (and recovers) every partition at construction: a worker thread.
        self._logs = await asyncio.to_thread(LogManager, opts.data_dir, default_log_config)
        high_watermarks = await asyncio.to_thread(self._hw_checkpoint.read)
        self.replicas = ReplicaManager(
            opts.broker_id, self._logs, opts.config, initial_high_watermarks=high_watermarks
        )
        self.replicas.on_write_error = self.disk.report
        self.scrubber = Scrubber(self.replicas, ScrubberSettings.from_config(opts.config))
        self.scrubber.prioritize_unclean(self._logs.logs())
        self.cleaner = LogCleaner(self.replicas, CleanerSettings.from_config(opts.config))
        self._fetchers = ReplicaFetcherManager(
            self.replicas, self._broker_address, lambda: self.broker_epoch,
            self._broker_direct_door,
        )
        fetchers = self._fetchers

        self._watcher = MetadataWatcher(self._etcd, opts.cluster_id)
        replicas = self.replicas

        async def apply(image: MetadataImage) -> None:
            await replicas.apply_metadata(image)
            await fetchers.update()
            self._apply_dynamic_config(image)

        self._applier = MetadataApplier(apply)
        self._spawn(self._applier.run(), "metadata applier")
        self._watcher.add_listener(self._applier.offer)
        await self._watcher.start(defaults.METADATA_STARTUP_TIMEOUT_S)
        await self._applier.wait_applied(
            self._watcher.revision, defaults.METADATA_STARTUP_TIMEOUT_S
        )

        self._server = aio.server(
            interceptors=server_interceptors("broker"),
            options=[
                ("grpc.max_send_message_length", defaults.GRPC_MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", defaults.GRPC_MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        access = access_control(opts.authorization)
        servicer = BrokerServicer(
            replicas, lambda: self._image(), self._producer_ids, self._offsets_topic,
            self.describe_log_dirs,
            cluster_action=ClusterActionGuard.for_service(opts.security),
            access=access,
        )
        add_broker_service(servicer, self._server)
        self._servicer = servicer
        self.port = bind_grpc_port(
            self._server, opts.listen_host, opts.listen_port, opts.security
        )
        await self._server.start()
        if opts.sasl_grpc_listener is not None:
            self._sasl_server, _ = sasl_door_server(
                lambda mechanism, user: self._image().scram_credential(mechanism, user),
                f"broker {opts.broker_id}",
                interceptors=server_interceptors("broker"),
                lifetime=self._sasl_lifetime(),
                options=[
                    ("grpc.max_send_message_length", defaults.GRPC_MAX_MESSAGE_BYTES),
                    ("grpc.max_receive_message_length", defaults.GRPC_MAX_MESSAGE_BYTES),
                    ("grpc.so_reuseport", 0),
                ],
            )
            add_broker_service(servicer, self._sasl_server, streams=False)
            host, port = opts.sasl_grpc_listener
            self.sasl_port = bind_sasl_port(self._sasl_server, f"{host}:{port}", opts.security)
            if not self.sasl_port:
                raise ConfigError(f"sasl-listen: could not bind {host}:{port}")
            await self._sasl_server.start()
            log.info("broker %d: SASL gRPC door on %s:%d", opts.broker_id, host, self.sasl_port)
        if opts.direct_listener is not None:
            host, port = opts.direct_listener
            self._direct = DirectDoor(
                servicer, f"broker {opts.broker_id} direct door",
                max_request_bytes=defaults.GRPC_MAX_MESSAGE_BYTES,
                max_in_flight_produce=MAX_IN_FLIGHT_PRODUCE,
            )
            self.direct_port = await self._direct.start(host, port)
            log.info("broker %d: direct door on %s:%d", opts.broker_id, host, self.direct_port)
        if self._kafka.doors:
            self._forwarder = ControllerForwarder(self._image)
            admin = BrokerAdminHandlers(
                opts.broker_id, replicas, self._image, opts.config, self._forwarder, access
            )
            handlers = BrokerKafkaHandlers(
                opts.broker_id, replicas, servicer, self._image, admin,
                FindCoordinatorHandler(self._image, self._offsets_topic, access),
            )
            await self._kafka.open(handlers.dispatcher(), opts.security, self._sasl_settings)

        if opts.metrics_port is not None:
            self._metrics_port = start_metrics_server(opts.metrics_port)

        self._spawn(self.loop_progress.run(defaults.LOOP_PROGRESS_TICK_S), "loop progress stamp")
        self._lease_thread = LeaseKeepAliveThread(
            opts.etcd_url,
            ttl_s=opts.lease_ttl_s,
            stall_limit_s=opts.effective_loop_stall_limit_s,
            progress=self.loop_progress,
            loop=asyncio.get_running_loop(),
            on_lease_lost=self._lease_lost,
            what=f"broker {opts.broker_id}",
            poll_s=defaults.LEASE_KEEPALIVE_POLL_S,
        )
        self.loop_progress.stamp()  # start-up held the loop; the stamp task has not run yet
        self._lease_thread.start()
        install_loop_stall_hook(asyncio.get_running_loop(), opts.data_dir)
        revision = await self._register()
        self._spawn(self._keep_lease_alive(), "lease keep-alive")
        await self._applier.wait_applied(revision, defaults.METADATA_STARTUP_TIMEOUT_S)
        replication = replicas.replication
        sender = AlterPartitionSender(
            replicas, self._image, lambda: self.broker_epoch, self._doubt_registration
        )
        self._spawn(sender.run(), "AlterPartition sender")
        self._spawn(
            self._periodic(replication.lag_time_max_ms / 2000, self._check_isr_lag),
            "ISR lag check",
        )
        self._spawn(
            self._periodic(replication.hw_checkpoint_interval_ms / 1000, self._checkpoint_hw,
                           "high-watermark checkpoint"),
            "high-watermark checkpoint",
        )
        self._spawn(
            self._periodic(defaults.FLUSH_CHECK_INTERVAL_S, self._flush_logs, "log flush"),
            "log flusher",
        )
        self._spawn(
            self._periodic(retention_check_interval_s(opts.config), self._apply_retention,
                           "retention"),
            "log retention",
        )
        self._spawn(
            self._periodic(defaults.ROLL_CHECK_INTERVAL_S, self._roll_logs, "segment roll"),
            "log roller",
        )
        self._spawn(
            self._periodic(defaults.PRODUCER_SNAPSHOT_CHECK_INTERVAL_S, self._snapshot_producers,
                           "producer snapshot"),
            "producer-state snapshots",
        )
        self._spawn(self.disk.run(), "data directory probe")
        self._spawn(self.scrubber.run(), "scrubber")
        self._spawn(self.cleaner.run(), "log cleaner")
        self._spawn(
            self._periodic(
                defaults.PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_S, self._expire_producers
            ),
            "producer-id expiration",
        )
        kafka = self.kafka_address
        log.info(
            "broker %d serving gRPC on %s:%d%s (cluster %s, %d partitions)",
            opts.broker_id,
            self.advertised_host,
            self.port,
            "" if kafka is None else f", Kafka on {kafka[0]}:{kafka[1]}",
            opts.cluster_id,
            len(replicas.partitions),
        )

    async def stop(self) -> None:
        """Stop serving, deregister, stop following metadata and close the logs (idempotent)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._servicer is not None:
            # First: else the server's stop waits its whole grace for the clients' open
            # streams (and after replicas.close() a parked fetch's answer may be on its way
            # out, where a cancel does not end the stream: fjord.rpc_streams.OpenStreams).
            self._servicer.open_streams.end_all()
        if self._direct is not None:
            self._direct.close()  # as the streams: the connections' handlers are cancelled
        if self.replicas is not None:
            self.replicas.close()
        if self._fetchers is not None:
            await self._fetchers.close()
        await self._kafka.stop()
        if self._forwarder is not None:
            await self._forwarder.close()
        if self._sasl_server is not None:
            await self._sasl_server.stop(defaults.SHUTDOWN_GRACE_S)
        if self._server is not None:
            await self._server.stop(defaults.SHUTDOWN_GRACE_S)
        await cancel_until_done(self._tasks)
        self._tasks.clear()
        if self._lease_thread is not None:  # before the revoke: no renewal of a revoked lease
            await self._lease_thread.stop()
        if self.replicas is not None and self._logs is not None:
            try:  # a clean restart resumes with these high watermarks
                await self._checkpoint_hw()
            except Exception as exc:
                if not self.disk.report("high-watermark checkpoint", exc):
                    log.exception("writing the high-watermark checkpoint failed")
        if self._etcd is not None and self._lease_id is not None:
            try:
                await self._etcd.revoke_lease(self._lease_id)
            except Exception as exc:  # etcd gone: the lease expires by itself after its TTL
                log.warning("could not revoke the broker lease: %s", exc)
            self._lease_id = None
        if self._watcher is not None:
            await self._watcher.stop()
        if self._etcd is not None:
            with contextlib.suppress(Exception):
                await self._etcd.close()
        await self._producer_ids.close()
        await self._offsets_topic.close()
        if self._logs is not None:
            if self.replicas is not None:
                await self._snapshot_producers(force=True)  # restart reads no log tail
            await asyncio.to_thread(self._logs.close)
            self._logs = None
        if self._metrics_port is not None:
            stop_metrics_server(self._metrics_port)
            self._metrics_port = None
        self._lock.release()
        log.info("broker %d stopped", self.options.broker_id)

    async def run_until_signalled(self) -> None:
        """Start, serve until SIGTERM or SIGINT, then stop cleanly."""
        await run_until_signalled(self.start, self.stop, f"broker {self.options.broker_id}")

    # --- registration ---------------------------------------------------------------------------

    @property
    def advertised_host(self) -> str:
        return advertised_host(self.options.advertised_host, self.options.listen_host)

    @property
    def kafka_endpoints(self) -> tuple[KafkaEndpoint, ...]:
        """Each Kafka door's advertised (name, host, port), in ``--listeners`` order."""
        return self._kafka.endpoints(self.options.advertised_host)

    @property
    def kafka_address(self) -> tuple[str, int] | None:
        """The (host, port) Kafka clients are told (the first door's), None without one."""
        endpoints = self.kafka_endpoints
        return (endpoints[0].host, endpoints[0].port) if endpoints else None

    def _registration(self) -> BrokerRegistration:
        kafka_host, kafka_port = self.kafka_address or (None, None)
        return BrokerRegistration(
            self.options.broker_id, self.advertised_host, self.port, self.options.rack,
            kafka_host, kafka_port, self.incarnation,
            self.advertised_host if self.sasl_port else None, self.sasl_port or None,
            self.kafka_endpoints,
            self.advertised_host if self.direct_port else None, self.direct_port or None,
        )

    async def _register(self) -> int:
        """Create ``brokers/<id>`` bound to a new lease; retry until it is free. Returns the
        etcd revision of the registration (the broker epoch)."""
        assert self._etcd is not None
        broker_id = self.options.broker_id
        self._lease_id, revision = await register_under_lease(
            self._etcd,
            self._keys.broker(broker_id).encode(),
            self._registration().to_json(),
            self.options.lease_ttl_s,
            what=f"broker {broker_id} at {self.advertised_host}:{self.port}",
            replaceable=self._own_registration,
        )
        self.broker_epoch = revision
        self._keep_lease(self._lease_id)
        return revision

    async def _end_previous_run(self) -> None:
        """Delete the registration our previous run on this data dir left (killed: its lease
        has not expired yet) first thing at start, before the logs are opened: the controller
        moves that run's leadership to other ISR members at once, so writes resume while this
        process is still starting instead of when it registers. Best effort: registering
        later takes the registration back anyway."""
        assert self._etcd is not None
        broker_id = self.options.broker_id
        try:
            await take_back_registration(
                self._etcd, self._keys.broker(broker_id).encode(), self._own_registration,
                f"broker {broker_id}",
            )
        except Exception as exc:
            log.warning("broker %d: could not check for its previous run's registration: %s",
                        broker_id, exc)

    def _own_registration(self, value: bytes) -> bool:
        """Whether a registration found under our id is this process's or its predecessor's
        on this data dir (then it is replaced at once instead of waiting for its lease):
        Kafka's incarnation id. Another process with our id, with another data dir, is never
        replaced (it recorded another incarnation), and none can run on ours (the lock)."""
        try:
            found = BrokerRegistration.from_json(value).incarnation
        except FjordError:
            return False
        return found is not None and found in (self.incarnation, self.previous_incarnation)

    def _lease_lost(self, lease_id: int, away_s: float | None) -> None:
        """The keep-alive thread heard from etcd that ``lease_id`` is gone (on the loop)."""
        if lease_id == self._lease_id:  # not a lease this process has already replaced
            self._lost_lease = (lease_id, away_s)
            self._lease_event.set()

    async def _keep_lease_alive(self) -> None:
        """Act on what happens to the lease; the keep-alive thread renews it (a busy loop must
        not cost the broker its lease; one that makes no progress for the stall limit does:
        :mod:`fjord.broker.lease_keeper`).

        etcd unreachable: keep serving. Leadership is not tied to the lease: nobody can elect
        another leader while etcd is away, and once one is elected this broker learns it from
        metadata or from its followers (a newer leader epoch), and a leader cut off from its
        followers cannot advance the high watermark, so it acknowledges no acks=all write
        (docs/replication.md, "etcd outages"). etcd says the lease is gone (expired while it was
        away, or revoked): fenced until re-registered and the metadata has caught up with the
        new registration, so any leadership change made meanwhile is known before appending.
        Fenced because the controller doubted the registration: etcd is asked here, at once and
        then every refresh interval, until it confirms the registration (unfenced) or says it
        is gone."""
        assert self._etcd is not None and self.replicas is not None
        interval = self.options.lease_ttl_s / 3
        what = f"broker {self.options.broker_id}"
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lease_event.wait(),
                                       interval if self.replicas.fenced else None)
            self._lease_event.clear()
            lost, self._lost_lease = self._lost_lease, None
            if lost is not None and lost[0] != self._lease_id:
                lost = None  # about a lease replaced since (the doubt path re-registered)
            away = "" if lost is None or lost[1] is None else (
                f" after {lost[1]:.1f} s without etcd")
            if lost is None:  # a doubt, or a fence not lifted yet: ask etcd
                if not self.replicas.fenced:
                    continue
                status = await refresh_lease_once(self._etcd, self._lease_id, what=what)
                if status is LeaseStatus.UNREACHABLE:
                    continue
                if status is LeaseStatus.HELD and await self._registration_current():
                    log.info("%s: its registration is current after all: unfenced", what)
                    self.replicas.fenced = False
                    continue
            log.error("%s lost its etcd lease%s: fencing and re-registering", what, away)
            self.replicas.fenced = True
            self._lease_id = None
            self._keep_lease(None)
            revision = await self._register()
            await self._wait_metadata_applied(revision)
            self.replicas.fenced = False
            log.info("%s re-registered (epoch %d): unfenced", what, revision)

    def _keep_lease(self, lease_id: int | None) -> None:
        if self._lease_thread is not None:
            self._lease_thread.keep(lease_id)

    def _doubt_registration(self) -> None:
        """The controller answered STALE_BROKER_EPOCH: our registration expired (a leader cut
        off from etcd while the controller is not: it may have elected other leaders) or
        was replaced. Stop acting as a leader now (this also ends acks=0/1 writes a deposed
        leader would take), and let the keep-alive check etcd at once: a registration that is
        current after all (the controller's view lagged) lifts the fence again, a lost one is
        registered anew, and while etcd cannot be reached the fence stays."""
        assert self.replicas is not None
        if not self.replicas.fenced:
            log.warning("broker %d: the controller says its registration (epoch %d) is not "
                        "current: fenced until etcd confirms or it registers again",
                        self.options.broker_id, self.broker_epoch)
        self.replicas.fenced = True
        self._lease_event.set()

    async def _registration_current(self) -> bool:
        """Whether ``brokers/<id>`` still holds this process's registration (the lease being
        alive says so unless someone deleted the key); True when etcd cannot say."""
        assert self._etcd is not None
        try:
            found = await self._etcd.get(self._keys.broker(self.options.broker_id).encode())
        except Exception:
            return True
        return found is not None and found.create_revision == self.broker_epoch

    async def _wait_metadata_applied(self, revision: int) -> None:
        """Wait until the applied metadata includes ``revision`` (the keep-alive thread keeps
        the new lease alive meanwhile)."""
        assert self._applier is not None
        while True:
            try:
                await self._applier.wait_applied(revision, defaults.METADATA_STARTUP_TIMEOUT_S)
                return
            except TimeoutError:  # the watch is reconnecting: keep waiting
                log.warning("metadata has not caught up with registration %d yet", revision)

    def _sasl_lifetime(self) -> SessionLifetime:
        """``connections.max.reauth.ms`` of ``--config``: both SASL doors' session lifetime."""
        return SessionLifetime(connections_max_reauth_ms(self.options.config))

    def _sasl_settings(self) -> SaslSettings:
        return SaslSettings(lambda mechanism, user: self._image().scram_credential(mechanism, user),
                            lifetime=self._sasl_lifetime())

    def _image(self) -> MetadataImage:
        assert self._watcher is not None
        return self._watcher.image

    def _broker_address(self, broker_id: int) -> str | None:
        registration = self._image().broker(broker_id) if self._watcher is not None else None
        return None if registration is None else registration.address

    def _broker_direct_door(self, broker_id: int) -> tuple[str, BrokerRegistration] | None:
        """The direct door a broker advertises (``host:port``) and the registration saying so
        (a restarted broker's new one makes a door that was unavailable worth trying again);
        None without one."""
        registration = self._image().broker(broker_id) if self._watcher is not None else None
        if registration is None or registration.direct_host is None:
            return None
        door = door_address(registration.direct_host, registration.direct_port or 0)
        return None if door is None else (door, registration)

    # --- replication maintenance ----------------------------------------------------------------

    def _apply_dynamic_config(self, image: MetadataImage) -> None:
        """Dynamic broker configs (this broker's ``broker-configs/<id>`` over the cluster-wide
        default over its ``--config``) reach the cleaner and the scrubber without a restart;
        topic defaults reach the logs in ReplicaManager.apply_metadata. The controller checked
        them before writing; a value that still fails here is logged and the old one kept."""
        effective = effective_broker_config(
            self.options.config, image.cluster_config, image.broker_config(self.options.broker_id)
        )
        try:
            cleaner, scrubber = (CleanerSettings.from_config(effective),
                                 ScrubberSettings.from_config(effective))
        except FjordError as exc:
            log.error("dynamic broker config not applied: %s", exc)
            return
        if self.cleaner is not None:
            self.cleaner.reconfigure(cleaner)
        if self.scrubber is not None:
            self.scrubber.reconfigure(scrubber)

    def describe_log_dirs(self) -> broker_pb2.DescribeLogDirsResponse:
        """The data directory as ``fjord log-dirs describe`` shows it: writable or why not,
        the scrubber's pass, damage found and repairs, and every hosted partition."""
        response = broker_pb2.DescribeLogDirsResponse(
            broker_id=self.options.broker_id, log_dir=str(self.options.data_dir)
        )
        condition = self.disk.health.condition
        response.writable = condition.writable
        response.unwritable_reason = condition.reason
        replicas = self.replicas
        if self.scrubber is not None:
            status = self.scrubber.status()
            progress = status.progress
            response.scrub.enabled = status.enabled
            response.scrub.pass_number = progress.pass_number
            response.scrub.passes_completed = status.passes_completed
            response.scrub.verified_segments = progress.verified_segments
            response.scrub.total_segments = progress.total_segments
            response.scrub.verified_bytes = progress.verified_bytes
            response.scrub.total_bytes = progress.total_bytes
            response.scrub.damage_found = status.damage_found
            response.scrub.repairs_done = status.repairs_done
            response.scrub.io_max_bytes_per_second = self.scrubber.settings.io_max_bytes_per_second
        if replicas is None:
            return response
        for key, partition in sorted(replicas.hosted()):
            topic, number = key
            plog = partition.log
            damage = plog.damage
            repair = replicas.repairs.get(key)
            cleaner = None if self.cleaner is None else self.cleaner.states.get(key)
            response.partitions.add(
                topic=topic,
                partition=number,
                size_bytes=plog.size_in_bytes,
                log_start_offset=partition.log_start_offset,
                log_end_offset=partition.log_end_offset,
                leader=partition.is_leader,
                damaged_offset=-1 if damage is None else damage.offset,
                damage="" if damage is None else damage.reason,
                repair_until_offset=-1 if repair is None else repair[0],
                compacted=plog.config.compact,
                cleaner_dirty_ratio=cleaner.dirty_ratio if cleaner else 0.0,
                cleaner_first_dirty_offset=cleaner.first_dirty_offset if cleaner else 0,
            )
        return response

    def _on_disk_unwritable(self, condition: DiskCondition) -> None:
        """The data directory cannot be written: stop following (appends would fail) and hand
        every led partition to another in-sync replica (Kafka takes the log directory offline;
        here the broker stays up to serve reads and rejoins once space is back)."""
        replicas = self.replicas
        if replicas is None:
            return
        replicas.disk_writable = False
        asked = replicas.resign_all("disk")
        if asked:
            log.warning(
                "asked the controller to move the leadership of %d partitions away (%s)",
                asked, condition.reason,
            )

    def _on_disk_writable(self) -> None:
        if self.replicas is not None:
            self.replicas.disk_writable = True

    async def _check_isr_lag(self) -> None:
        assert self.replicas is not None
        self.replicas.check_isr_lag()

    async def _checkpoint_hw(self) -> None:
        assert self.replicas is not None
        entries = self.replicas.high_watermarks()
        if entries == self._hw_checkpointed:
            return  # unchanged since the last write: an idle broker fsyncs nothing
        await asyncio.to_thread(self._hw_checkpoint.write, entries)
        self._hw_checkpointed = entries

    # --- maintenance ------------------------------------------------------------------------------

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        self._tasks.append(asyncio.ensure_future(coro))
        self._tasks[-1].set_name(f"broker {self.options.broker_id}: {name}")

    async def _periodic(
        self, interval_s: float, action: Callable[[], Awaitable[None]], operation: str = ""
    ) -> None:
        """Run ``action`` every ``interval_s``. A failed write to the data directory goes to
        the disk monitor (logged once per change of condition, counted per ``operation``);
        anything else is logged with its traceback."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await asyncio.wait_for(action(), defaults.MAINTENANCE_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self.disk.report(operation or "maintenance", exc):
                    log.exception("log maintenance (%s) failed", operation or "periodic")

    async def _flush_logs(self) -> None:
        assert self.replicas is not None
        now_ms = int(time.time() * 1000)
        failed: Exception | None = None
        due = [p.log for p in self.replicas.partitions.values() if p.log.needs_flush(now_ms)]
        for plog in due:
            if not plog.closed:
                try:
                    await asyncio.to_thread(plog.flush)
                except OSError as exc:  # one full disk fails them all: report once per pass
                    failed = exc
        if failed is not None:
            raise failed

    async def _apply_retention(self) -> None:
        # PartitionLog guards its state with a lock, so retention may run in a worker thread
        # while the event loop appends; it never deletes at or above the high watermark.
        assert self.replicas is not None
        now_ms = int(time.time() * 1000)
        moved = []
        for key, partition in self.replicas.hosted():
            plog = partition.log
            if not plog.retention_may_delete():
                continue  # one thread hop per partition costs more than the check (issue 18)
            if await asyncio.to_thread(plog.apply_retention, now_ms, partition.high_watermark):
                moved.append(key)
        self.replicas.on_log_start_moved(moved)

    async def _snapshot_producers(self, force: bool = False) -> None:
        """Write a producer-state snapshot where the log rolled since the last one (``force``:
        wherever the state moved, at shutdown). Serialised here, written by a worker thread."""
        assert self.replicas is not None
        # Several at a time: each snapshot waits for its fsync in a worker thread, and at
        # shutdown every partition with producer state moved writes one.
        limit = asyncio.Semaphore(defaults.SNAPSHOTS_AT_ONCE)

        async def snapshot(partition: Partition) -> None:
            async with limit:
                try:
                    await snapshot_producer_state(partition, force=force)
                except Exception as exc:
                    if not self.disk.report("producer snapshot", exc):
                        log.exception("producer-state snapshot of %s failed",
                                      partition.log.directory)

        # Only the due ones get a task: with thousands of idle partitions a task each cost
        # ~80 ms of the loop every PRODUCER_SNAPSHOT_CHECK_INTERVAL_S (4,100 partitions).
        due = [p for _key, p in self.replicas.hosted()
               if snapshot_wanted(p.producer_state, p.log, force=force)]
        await asyncio.gather(*(snapshot(p) for p in due))

    async def _expire_producers(self) -> None:
        assert self.replicas is not None
        now_ms = int(time.time() * 1000)
        for _key, partition in self.replicas.hosted():
            partition.producer_state.remove_expired(now_ms)

    async def _roll_logs(self) -> None:
        assert self.replicas is not None
        now_ms = int(time.time() * 1000)
        for _key, partition in self.replicas.hosted():
            if partition.log.roll_due(now_ms):  # the thread hop only where a roll is due
                await asyncio.to_thread(partition.log.maybe_roll, now_ms)

