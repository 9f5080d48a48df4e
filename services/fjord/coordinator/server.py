"""The group coordinator process (``fjord coordinator``): etcd registration, metadata following,
``__consumer_offsets`` ownership and replay, gRPC serving, lag metrics.

Lifecycle (:class:`CoordinatorServer`): follow the cluster metadata (MetadataWatcher) -> serve
gRPC (answering COORDINATOR_NOT_AVAILABLE until registered) -> register ``coordinators/<id>``
under its own lease -> own the ``__consumer_offsets`` partitions whose ``offsets-owners/<p>``
names this coordinator, claim each at its leader with the coordinator epoch and replay it
(answering COORDINATOR_LOAD_IN_PROGRESS meanwhile), serve their groups -> run until
SIGTERM/SIGINT -> stop serving, revoke the lease (the controller moves the partitions at once
instead of after the TTL), stop the watcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aetcd
import grpc
from grpc import aio

from fjord._proto import broker_pb2, common_pb2, coordinator_pb2, coordinator_pb2_grpc
from fjord.client.network import Network, transport_error
from fjord.client.offset_fetcher import (
    NO_TIMESTAMP_BOUND,
    first_record_at_or_after,
    first_record_fetch,
)
from fjord.coordinator import defaults
from fjord.coordinator.appender import OffsetsAppender, replay_into, replay_partitions
from fjord.coordinator.authorization import AuthorizedGroups, AuthorizedTransactions
from fjord.coordinator.group import GroupConfig
from fjord.coordinator.kafka_apis import CoordinatorKafkaApis
from fjord.coordinator.manager import GroupManager
from fjord.coordinator.service import CoordinatorServicer
from fjord.coordinator.transactions import TransactionManager
from fjord.errors import (
    ConfigError,
    ErrorCode,
    FjordError,
    error_code_from_number,
    error_for_code,
)
from fjord.groups.defaults import OFFSETS_TOPIC
from fjord.groups.lag import time_lag_seconds
from fjord.kafka.listeners import KafkaDoor, door_for
from fjord.kafka.server import KafkaDoors, SaslSettings
from fjord.metadata import (
    CoordinatorRegistration,
    Keys,
    MetadataImage,
    MetadataWatcher,
    etcd_client,
    parse_etcd_endpoint,
)
from fjord.metadata.registration import (
    lease_still_held,
    register_under_lease,
    take_back_registration,
)
from fjord.metadata.schema import KafkaEndpoint
from fjord.observability.interceptors import server_interceptors
from fjord.observability.metrics import (
    remove_group_lag,
    set_group_count,
    set_group_lag,
    set_group_lag_seconds,
    start_metrics_server,
    stop_metrics_server,
)
from fjord.process_state import StateDirLock, record_incarnation
from fjord.sasl_door import bind_sasl_port, sasl_door_server
from fjord.security import ServiceSecurity
from fjord.security.acls import AuthorizerSettings
from fjord.security.sasl_sessions import (
    CONNECTIONS_MAX_REAUTH_MS_KEY,
    DEFAULT_CONNECTIONS_MAX_REAUTH_MS,
    SessionLifetime,
)
from fjord.serving import (
    access_control,
    advertised_host,
    bind_grpc_port,
    cancel_until_done,
    run_until_signalled,
)
from fjord.tls import ClusterActionGuard, use_service_security
from fjord.topic_partition import TopicPartition
from fjord.transactions.defaults import (
    ABORT_TIMED_OUT_INTERVAL_MS,
    TRANSACTION_MAX_TIMEOUT_MS,
    TRANSACTION_STATE_TOPIC,
    TRANSACTIONAL_ID_EXPIRATION_MS,
)
from fjord.transactions.log import TransactionLogLoader

log = logging.getLogger(__name__)

#: ``--config`` keys of ``fjord coordinator`` (Kafka's broker settings) -> GroupConfig fields.
_GROUP_CONFIG_KEYS = {
    "group.min.session.timeout.ms": "min_session_timeout_ms",
    "group.max.session.timeout.ms": "max_session_timeout_ms",
    "group.initial.rebalance.delay.ms": "initial_rebalance_delay_ms",
    "group.max.size": "max_size",
    "offset.metadata.max.bytes": "offset_metadata_max_bytes",
}
_SERVICE_CONFIG_KEYS = (
    "offsets.retention.minutes",
    "offsets.retention.check.interval.ms",
    "offsets.commit.timeout.ms",
    "transaction.max.timeout.ms",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms",
    "transactional.id.expiration.ms",
    CONNECTIONS_MAX_REAUTH_MS_KEY,
)
CONFIG_KEYS = tuple(sorted([*_GROUP_CONFIG_KEYS, *_SERVICE_CONFIG_KEYS]))


def parse_coordinator_config(config: Mapping[str, str]) -> tuple[GroupConfig, dict[str, int]]:
    """``--config`` entries to (GroupConfig, service settings in ms). ConfigError names the key
    for an unknown key or a value that is not a non-negative integer."""
    group_fields: dict[str, int] = {}
    service: dict[str, int] = {
        "offsets.retention.check.interval.ms": defaults.OFFSETS_RETENTION_CHECK_INTERVAL_MS,
        "offsets.commit.timeout.ms": defaults.OFFSETS_COMMIT_TIMEOUT_MS,
        "transaction.max.timeout.ms": TRANSACTION_MAX_TIMEOUT_MS,
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": (
            ABORT_TIMED_OUT_INTERVAL_MS
        ),
        "transactional.id.expiration.ms": TRANSACTIONAL_ID_EXPIRATION_MS,
        CONNECTIONS_MAX_REAUTH_MS_KEY: DEFAULT_CONNECTIONS_MAX_REAUTH_MS,
    }
    for key, text in config.items():
        if key not in CONFIG_KEYS:
            raise ConfigError(
                f"{key}: unknown coordinator setting (known: {', '.join(CONFIG_KEYS)})"
            )
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{key}: expected an integer, got {text!r}") from None
        if value < 0 or (value == 0 and key not in ("group.initial.rebalance.delay.ms",
                                                    CONNECTIONS_MAX_REAUTH_MS_KEY)):
            raise ConfigError(f"{key}: must be positive, got {value}")
        if key in _GROUP_CONFIG_KEYS:
            group_fields[_GROUP_CONFIG_KEYS[key]] = value
        elif key == "offsets.retention.minutes":
            group_fields["offsets_retention_ms"] = value * 60_000
        else:
            service[key] = value
    group = GroupConfig(**group_fields)
    if group.min_session_timeout_ms > group.max_session_timeout_ms:
        raise ConfigError(
            "group.min.session.timeout.ms: larger than group.max.session.timeout.ms "
            f"({group.min_session_timeout_ms} > {group.max_session_timeout_ms})"
        )
    return group, service


@dataclass(frozen=True)
class CoordinatorOptions:
    """Everything ``fjord coordinator`` is started with.

    ``advertised_host`` is what clients are told to connect to (default: the listen host, or
    this machine's host name on a wildcard address); ``listen_port`` 0 binds a free port and
    registers the bound one. ``config`` holds Kafka's coordinator settings (``CONFIG_KEYS``).
    """

    coordinator_id: int
    listen_host: str
    listen_port: int
    etcd_url: str
    cluster_id: str
    metrics_port: int | None = None
    advertised_host: str | None = None
    lease_ttl_s: int = defaults.COORDINATOR_LEASE_TTL_S
    lag_refresh_interval_s: float = defaults.LAG_REFRESH_INTERVAL_S
    config: dict[str, str] = field(default_factory=dict)
    #: ``KAFKA`` listener (host, port; port 0: any free) or None for no Kafka-protocol door;
    #: ``kafka_advertised``: the (host, port) Kafka clients are told (port 0: the bound one).
    kafka_listener: tuple[str, int] | None = None
    kafka_advertised: tuple[str, int] | None = None
    #: TLS for every listener and every connection this coordinator opens (None: plaintext);
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
    #: The SASL gRPC door (host, port) for Fjord's own SASL clients (fjord.sasl_door); None:
    #: no such door.
    sasl_grpc_listener: tuple[str, int] | None = None
    #: A directory only this process uses (an exclusive lock) where each run records its
    #: incarnation: started again after a crash, the coordinator replaces its previous run's
    #: registration at once instead of waiting for that run's lease to expire. None: no
    #: record, a restart waits out the old lease.
    state_dir: Path | None = None

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
        if self.coordinator_id < 0:
            raise ConfigError(f"id: coordinator id must be >= 0, got {self.coordinator_id}")
        if self.lease_ttl_s < 1:
            raise ConfigError(f"lease-ttl: must be >= 1 s, got {self.lease_ttl_s}")
        if self.lag_refresh_interval_s <= 0:
            raise ConfigError(
                f"lag-refresh-interval: must be positive, got {self.lag_refresh_interval_s}"
            )
        try:
            Keys(self.cluster_id)
        except ValueError as exc:
            raise ConfigError(f"cluster-id: {exc}") from exc
        parse_etcd_endpoint(self.etcd_url)
        parse_coordinator_config(self.config)


#: The coordinator's :class:`StateDirLock` file in its ``--state-dir``.
STATE_LOCK_FILE = ".fjord-coordinator.lock"


class CoordinatorServer:
    """One running group coordinator.

    Invariants: ``coordinators/<id>`` exists only while this process holds its lease; groups
    are served only while registered and only for partitions whose ``offsets-owners/<p>``
    names this coordinator (at the epoch they were replayed for); losing the lease (refresh
    refused, or the registration gone from the metadata) drops every partition at once, and
    they are replayed again after re-registering; every background task is cancelled and
    awaited by :meth:`stop`.
    """

    def __init__(self, options: CoordinatorOptions) -> None:
        self.options = options
        self._keys = Keys(options.cluster_id)
        self.group_config, service = parse_coordinator_config(options.config)
        self._retention_check_s = service["offsets.retention.check.interval.ms"] / 1000
        self._commit_timeout_ms = service["offsets.commit.timeout.ms"]
        #: connections.max.reauth.ms: both SASL doors' session lifetime.
        self._sasl_lifetime = SessionLifetime(service[CONNECTIONS_MAX_REAUTH_MS_KEY])
        self._txn_sweep_s = (
            service["transaction.abort.timed.out.transaction.cleanup.interval.ms"] / 1000
        )
        self._client_id = f"coordinator-{options.coordinator_id}"
        self._etcd: aetcd.Client | None = None
        self._watcher: MetadataWatcher | None = None
        self._appender = OffsetsAppender(
            self._bootstrap, self._client_id, timeout_ms=self._commit_timeout_ms
        )
        self.manager = GroupManager(
            self._appender, self.group_config, partition_exists=self._partition_exists
        )
        self._txn_appender = OffsetsAppender(
            self._bootstrap, f"{self._client_id}-txn", timeout_ms=self._commit_timeout_ms,
            topic=TRANSACTION_STATE_TOPIC,
        )
        self.transactions = TransactionManager(
            self._txn_appender,
            self._write_txn_markers,
            self._new_producer_id,
            self._complete_txn_offsets,
            partition_exists=self._partition_exists,
            max_timeout_ms=service["transaction.max.timeout.ms"],
            expiration_ms=service["transactional.id.expiration.ms"],
        )
        self._txn_load_wakeup = asyncio.Event()
        self._next_pid_broker = 0
        self._network = Network(
            [],
            client_id=self._client_id,
            request_timeout_ms=int(defaults.LAG_LIST_OFFSETS_TIMEOUT_S * 1000),
            service="coordinator",
        )
        #: The etcd revision of the current registration (-1 while not registered).
        self.registration_revision = -1
        self._lease_id: int | None = None
        self._server: aio.Server | None = None
        self._sasl_server: aio.Server | None = None
        #: The SASL gRPC door's bound port (0: no door).
        self.sasl_port = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._load_wakeup = asyncio.Event()
        self._replay_cancelled = threading.Event()
        self._lag_series: set[tuple[str, str, int]] = set()
        # (topic-partition, offset) -> timestamp of the first record at or after it: a
        # committed offset that does not move is read once, not every refresh.
        self._first_record_ms: dict[tuple[TopicPartition, int], int] = {}
        self._metrics_port: int | None = None
        self.port = options.listen_port
        self._kafka = KafkaDoors(
            options.all_kafka_doors, f"coordinator {options.coordinator_id} kafka"
        )
        self._kafka_apis: CoordinatorKafkaApis | None = None
        self._stopped = False
        #: New at every start (Kafka's incarnation id), and the previous run's as recorded in
        #: the state dir (None: no state dir, or nothing recorded).
        self.incarnation = uuid.uuid4().hex
        self.previous_incarnation: str | None = None
        self._state_lock = (
            None if options.state_dir is None
            else StateDirLock(options.state_dir, STATE_LOCK_FILE, "coordinator", "state-dir")
        )

    # --- start/stop -------------------------------------------------------------------------

    async def start(self) -> None:
        opts = self.options
        if opts.state_dir is not None and self._state_lock is not None:
            opts.state_dir.mkdir(parents=True, exist_ok=True)
            self._state_lock.acquire()
            self.previous_incarnation = record_incarnation(opts.state_dir, self.incarnation)
        use_service_security(opts.security)
        self._etcd = etcd_client(opts.etcd_url)
        await self._etcd.connect()
        await self._end_previous_run()
        self._watcher = MetadataWatcher(self._etcd, opts.cluster_id)
        self._watcher.add_listener(lambda _old, new: self._reconcile(new))
        await self._watcher.start(defaults.METADATA_STARTUP_TIMEOUT_S)

        self._server = aio.server(
            interceptors=server_interceptors("coordinator"), options=[("grpc.so_reuseport", 0)]
        )
        groups = AuthorizedGroups(
            self.manager, self._image, access_control(opts.authorization)
        )
        transactions = AuthorizedTransactions(
            self.transactions, self._image, access_control(opts.authorization)
        )
        servicer = CoordinatorServicer(
            groups, transactions, ClusterActionGuard.for_service(opts.security),
            opts.coordinator_id,
        )
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(servicer, self._server)
        self.port = bind_grpc_port(
            self._server, opts.listen_host, opts.listen_port, opts.security
        )
        await self._server.start()
        if opts.sasl_grpc_listener is not None:
            self._sasl_server, _ = sasl_door_server(
                lambda mechanism, user: self._image().scram_credential(mechanism, user),
                f"coordinator {opts.coordinator_id}",
                interceptors=server_interceptors("coordinator"),
                lifetime=self._sasl_lifetime,
                options=[("grpc.so_reuseport", 0)],
            )
            coordinator_pb2_grpc.add_CoordinatorServicer_to_server(servicer, self._sasl_server)
            host, port = opts.sasl_grpc_listener
            self.sasl_port = bind_sasl_port(self._sasl_server, f"{host}:{port}", opts.security)
            if not self.sasl_port:
                raise ConfigError(f"sasl-listen: could not bind {host}:{port}")
            await self._sasl_server.start()
        if self._kafka.doors:
            self._kafka_apis = CoordinatorKafkaApis(
                opts.coordinator_id, groups, self._image, self._network.broker, transactions
            )
            await self._kafka.open(
                self._kafka_apis.dispatcher(), opts.security, self._sasl_settings
            )
        if opts.metrics_port is not None:
            self._metrics_port = start_metrics_server(opts.metrics_port)

        revision = await self._register()
        await self._watcher.wait_for_revision(revision, defaults.METADATA_STARTUP_TIMEOUT_S)
        self._activate()
        self._spawn(self._keep_lease_alive(), "lease keep-alive")
        self._spawn(self._load_partitions(), "__consumer_offsets loader")
        self._spawn(self._load_txn_partitions(), "__transaction_state loader")
        self._spawn(
            self._periodic(self._txn_sweep_s, self._abort_timed_out),
            "transaction timeouts",
        )
        self._spawn(self._periodic(self._retention_check_s, self._expire_offsets), "offset expiry")
        self._spawn(self._periodic(opts.lag_refresh_interval_s, self._refresh_lag), "lag metrics")
        kafka = self.kafka_address
        log.info(
            "coordinator %d serving gRPC on %s:%d%s (cluster %s)",
            opts.coordinator_id,
            self.advertised_host,
            self.port,
            "" if kafka is None else f", Kafka on {kafka[0]}:{kafka[1]}",
            opts.cluster_id,
        )

    async def stop(self) -> None:
        """Stop serving, deregister, stop following metadata (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        self._replay_cancelled.set()
        # Parked requests are answered NOT_COORDINATOR first, so their clients move on to the
        # next owner instead of waiting out the grace period.
        self.manager.active = False
        self.manager.drop_all()
        await self.transactions.close()
        await self._kafka.stop()
        if self._kafka_apis is not None:
            await self._kafka_apis.close()
        if self._sasl_server is not None:
            await self._sasl_server.stop(defaults.SHUTDOWN_GRACE_S)
        if self._server is not None:
            await self._server.stop(defaults.SHUTDOWN_GRACE_S)
        await cancel_until_done(self._tasks)
        self._tasks.clear()
        await self._appender.close()
        await self._txn_appender.close()
        await self._network.close()
        if self._etcd is not None and self._lease_id is not None:
            try:
                await self._etcd.revoke_lease(self._lease_id)
            except Exception as exc:  # etcd gone: the lease expires by itself after its TTL
                log.warning("could not revoke the coordinator lease: %s", exc)
            self._lease_id = None
        if self._watcher is not None:
            await self._watcher.stop()
        if self._etcd is not None:
            with contextlib.suppress(Exception):
                await self._etcd.close()
        for group, topic, partition in self._lag_series:
            remove_group_lag(group, topic, partition)
        self._lag_series.clear()
        if self._metrics_port is not None:
            stop_metrics_server(self._metrics_port)
            self._metrics_port = None
        if self._state_lock is not None:
            self._state_lock.release()
        log.info("coordinator %d stopped", self.options.coordinator_id)

    async def run_until_signalled(self) -> None:
        """Start, serve until SIGTERM or SIGINT, then stop cleanly."""
        what = f"coordinator {self.options.coordinator_id}"
        await run_until_signalled(self.start, self.stop, what)

    # --- registration -----------------------------------------------------------------------

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

    async def _register(self) -> int:
        """Create ``coordinators/<id>`` bound to a new lease; retry until the key is free.
        Returns the etcd revision of the registration (the coordinator epoch)."""
        assert self._etcd is not None
        coordinator_id = self.options.coordinator_id
        kafka_host, kafka_port = self.kafka_address or (None, None)
        registration = CoordinatorRegistration(
            coordinator_id, self.advertised_host, self.port, kafka_host, kafka_port,
            self.incarnation if self.options.state_dir is not None else None,
            self.advertised_host if self.sasl_port else None, self.sasl_port or None,
            self.kafka_endpoints,
        )
        self._lease_id, revision = await register_under_lease(
            self._etcd,
            self._keys.coordinator(coordinator_id).encode(),
            registration.to_json(),
            self.options.lease_ttl_s,
            what=f"coordinator {coordinator_id} at {self.advertised_host}:{self.port}",
            replaceable=self._own_registration,
        )
        self.registration_revision = revision
        return revision

    async def _end_previous_run(self) -> None:
        """Delete the registration our previous run on this state dir left (killed: its lease
        has not expired yet) before anything else, so the controller gives its
        ``__consumer_offsets`` partitions to live coordinators at once. Best effort:
        registering takes it back anyway."""
        assert self._etcd is not None
        coordinator_id = self.options.coordinator_id
        if self.previous_incarnation is None:
            return
        try:
            await take_back_registration(
                self._etcd, self._keys.coordinator(coordinator_id).encode(),
                self._own_registration, f"coordinator {coordinator_id}",
            )
        except Exception as exc:
            log.warning("coordinator %d: could not check for its previous run's registration: "
                        "%s", coordinator_id, exc)

    def _own_registration(self, value: bytes) -> bool:
        """Whether a registration found under our id is this process's or its predecessor's
        on this state dir (replaced at once instead of waiting for its lease). Without a state
        dir, none is. Another live process with our id is never replaced: with another state
        dir it recorded another incarnation, and none can run on ours (the lock). Fencing of
        ``__consumer_offsets`` is unchanged: the replaced run is gone, and whatever epoch the
        controller gives the partitions, this run claims each at its leader before replaying."""
        if self.options.state_dir is None:
            return False
        try:
            found = CoordinatorRegistration.from_json(value).incarnation
        except FjordError:
            return False
        return found is not None and found in (self.incarnation, self.previous_incarnation)

    async def _keep_lease_alive(self) -> None:
        assert self._etcd is not None and self._watcher is not None
        interval = self.options.lease_ttl_s / 3
        what = f"coordinator {self.options.coordinator_id}"
        last_ok: float | None = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            assert last_ok is not None
            if not self.manager.active:  # the watcher saw the registration disappear
                last_ok = None
            else:
                last_ok = await lease_still_held(
                    self._etcd, self._lease_id, last_ok, self.options.lease_ttl_s, what=what
                )
            if last_ok is not None:
                continue
            log.error(
                "coordinator %d lost its etcd lease: dropping every group and re-registering",
                self.options.coordinator_id,
            )
            self._deactivate()
            self._lease_id = None
            revision = await self._register()
            while True:
                try:
                    await self._watcher.wait_for_revision(
                        revision, defaults.METADATA_STARTUP_TIMEOUT_S
                    )
                    break
                except TimeoutError:  # the watch is reconnecting: keep waiting, keep the lease
                    log.warning("metadata has not caught up with registration %d yet", revision)
                    with contextlib.suppress(Exception):
                        await self._etcd.refresh_lease(self._lease_id)
            self._activate()
            last_ok = time.monotonic()

    def _activate(self) -> None:
        self.manager.active = True
        self.transactions.active = True
        self._reconcile(self._image())

    def _deactivate(self) -> None:
        self.manager.active = False
        self.transactions.active = False
        self.registration_revision = -1
        self.manager.drop_all()
        self.transactions.drop_all()

    # --- ownership and replay ---------------------------------------------------------------

    def _sasl_settings(self) -> SaslSettings:
        return SaslSettings(lambda mechanism, user: self._image().scram_credential(mechanism, user),
                            lifetime=self._sasl_lifetime)

    def _image(self) -> MetadataImage:
        assert self._watcher is not None
        return self._watcher.image

    def _reconcile(self, image: MetadataImage) -> None:
        """Own exactly the partitions ``offsets-owners/`` gives this coordinator."""
        if not self.manager.active:
            return
        my_id = self.options.coordinator_id
        if image.coordinator_epoch(my_id) != self.registration_revision:
            # Our registration is gone (lease expired) or replaced: stop serving at once; the
            # keep-alive task re-registers.
            log.error("coordinator %d: registration gone from the metadata", my_id)
            self._deactivate()
            return
        owned = {
            p: owner.coordinator_epoch
            for p, owner in image.offsets_owners.items()
            if owner.coordinator_id == my_id
        }
        if self.manager.assign(owned):
            self._load_wakeup.set()
        # __transaction_state partition p is owned with __consumer_offsets partition p.
        txn_topic = image.topic(TRANSACTION_STATE_TOPIC)
        txn_owned = {
            p: epoch for p, epoch in owned.items()
            if txn_topic is not None and p < txn_topic.partitions
        }
        if self.transactions.assign(txn_owned):
            self._txn_load_wakeup.set()

    def _bootstrap(self) -> str:
        return ",".join(b.address for _, b in sorted(self._image().brokers.items()))

    def _partition_exists(self, topic: str, partition: int) -> bool:
        record = self._image().topic(topic)
        return record is not None and 0 <= partition < record.partitions

    async def _load_partitions(self) -> None:
        """Replay owned partitions that are not loaded yet, a batch at a time (one consumer
        for all of them), and install each unless ownership changed meanwhile."""
        while True:
            await self._load_wakeup.wait()
            self._load_wakeup.clear()
            pending = self.manager.unloaded()
            if not pending:
                continue
            started = time.monotonic()
            try:
                claimed = await self._claim(pending)
                pending = {p: e for p, e in pending.items() if p in claimed}
                if not pending:
                    continue
                replayed = await asyncio.to_thread(
                    replay_partitions,
                    self._bootstrap(),
                    sorted(pending),
                    f"{self._client_id}-loader",
                    defaults.OFFSETS_LOAD_TIMEOUT_S,
                    cancelled=self._replay_cancelled,
                    read_to_at_least=claimed,
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "replaying __consumer_offsets partitions %s failed: %s; retrying",
                    sorted(pending),
                    exc,
                )
                await asyncio.sleep(defaults.LOAD_RETRY_BACKOFF_S)
                self._load_wakeup.set()
                continue
            installed = [
                p for p, groups in replayed.items() if self.manager.install(p, pending[p], groups)
            ]
            log.info(
                "loaded __consumer_offsets partitions %s in %.2f s",
                installed,
                time.monotonic() - started,
            )
            if self.manager.unloaded():
                self._load_wakeup.set()

    async def _load_txn_partitions(self) -> None:
        """Claim and replay owned ``__transaction_state`` partitions (as
        :meth:`_load_partitions` does for ``__consumer_offsets``), then serve them; the
        install completes transactions the previous owner left prepared."""
        while True:
            await self._txn_load_wakeup.wait()
            self._txn_load_wakeup.clear()
            pending = self.transactions.unloaded()
            if not pending:
                continue
            try:
                claimed = await self._claim(
                    pending, TRANSACTION_STATE_TOPIC, self.transactions.fence
                )
                pending = {p: e for p, e in pending.items() if p in claimed}
                if not pending:
                    continue
                loaders = {p: TransactionLogLoader() for p in pending}
                await asyncio.to_thread(
                    replay_into,
                    self._bootstrap(),
                    loaders,
                    f"{self._client_id}-txn-loader",
                    defaults.OFFSETS_LOAD_TIMEOUT_S,
                    TRANSACTION_STATE_TOPIC,
                    cancelled=self._replay_cancelled,
                    read_to_at_least=claimed,
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "replaying __transaction_state partitions %s failed: %s; retrying",
                    sorted(pending), exc,
                )
                await asyncio.sleep(defaults.LOAD_RETRY_BACKOFF_S)
                self._txn_load_wakeup.set()
                continue
            for p, loader in loaders.items():
                self.transactions.install(p, pending[p], loader.records())
            if self.transactions.unloaded():
                self._txn_load_wakeup.set()

    async def _abort_timed_out(self) -> None:
        await self.transactions.abort_timed_out()
        await self.transactions.expire_transactional_ids()

    async def _new_producer_id(self) -> int:
        """A fresh producer id for a transactional id: asked of the live brokers in turn
        (their InitProducerId without a transactional id allocates from the controller's
        blocks)."""
        brokers = [b.address for _, b in sorted(self._image().brokers.items())]
        for i in range(len(brokers)):
            address = brokers[(self._next_pid_broker + i) % len(brokers)]
            try:
                answer = await self._network.broker(address).InitProducerId(
                    broker_pb2.InitProducerIdRequest(producer_id=-1, producer_epoch=-1),
                    timeout=self._commit_timeout_ms / 1000,
                )
            except grpc.aio.AioRpcError as exc:
                log.info("InitProducerId to broker %s failed: %s", address, exc.code().name)
                continue
            code = error_code_from_number(answer.error.code)
            if code is not ErrorCode.NONE:
                log.info("InitProducerId on broker %s: %s", address, code.name)
                continue
            self._next_pid_broker += i + 1
            return int(answer.producer_id)
        raise error_for_code(
            ErrorCode.COORDINATOR_NOT_AVAILABLE, "no broker allocated a producer id"
        )

    async def _complete_txn_offsets(
        self, partition: int, producer_id: int, producer_epoch: int, committed: bool
    ) -> None:
        """Tell the owner of ``__consumer_offsets`` partition ``partition`` (this coordinator
        or another, over gRPC) that the transaction ended; raises to be retried."""
        owner = self._image().offsets_owner(partition)
        if owner is None:
            raise error_for_code(ErrorCode.COORDINATOR_NOT_AVAILABLE, "no owner")
        if owner.coordinator_id == self.options.coordinator_id:
            await self.manager.complete_txn_offsets(partition, producer_id, committed)
            return
        registration = self._image().coordinators.get(owner.coordinator_id)
        if registration is None:
            raise error_for_code(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the owner is not live")
        address = registration.address
        try:
            answer = await self._network.coordinator(address).CompleteTxnOffsets(
                coordinator_pb2.CompleteTxnOffsetsRequest(
                    partition=partition, producer_id=producer_id,
                    producer_epoch=producer_epoch, committed=committed,
                ),
                timeout=self._commit_timeout_ms / 1000,
            )
        except Exception as exc:
            raise transport_error(exc, address) from exc
        code = error_code_from_number(answer.error.code)
        if code is not ErrorCode.NONE:
            raise error_for_code(code, answer.error.message)

    async def _write_txn_markers(
        self,
        producer_id: int,
        producer_epoch: int,
        committed: bool,
        coordinator_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        """WriteTxnMarkers to each partition's leader (from the metadata image), in parallel;
        a partition without a live leader or whose leader fails is answered with a retriable
        code."""
        image = self._image()
        by_leader: dict[str, list[TopicPartition]] = {}
        out: dict[TopicPartition, ErrorCode] = {}
        for tp in partitions:
            state = image.partition(tp.topic, tp.partition)
            if state is None and image.topic(tp.topic) is None:
                out[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            leader = None if state is None else image.broker(state.leader)
            if leader is None:
                out[tp] = ErrorCode.LEADER_NOT_AVAILABLE
                continue
            by_leader.setdefault(leader.address, []).append(tp)

        async def send(address: str, tps: list[TopicPartition]) -> None:
            request = broker_pb2.WriteTxnMarkersRequest(
                markers=[
                    broker_pb2.TxnMarker(
                        producer_id=producer_id,
                        producer_epoch=producer_epoch,
                        committed=committed,
                        coordinator_epoch=coordinator_epoch,
                        partitions=[
                            common_pb2.TopicPartition(topic=t, partition=n) for t, n in tps
                        ],
                    )
                ]
            )
            try:
                response = await self._network.broker(address).WriteTxnMarkers(
                    request, timeout=self._commit_timeout_ms / 1000
                )
            except Exception as exc:
                log.info("WriteTxnMarkers to %s failed: %s", address, transport_error(exc, address))
                out.update(dict.fromkeys(tps, ErrorCode.NETWORK_EXCEPTION))
                return
            for result in response.markers:
                for p in result.partitions:
                    out[TopicPartition(p.topic, p.partition)] = error_code_from_number(
                        p.error.code
                    )

        await asyncio.gather(*(send(a, t) for a, t in by_leader.items()))
        return out

    async def _claim(
        self,
        pending: Mapping[int, int],
        topic: str = OFFSETS_TOPIC,
        fence: Callable[[int, int], None] | None = None,
    ) -> dict[int, int]:
        """Tell each partition's leader this coordinator's epoch before replaying it (a produce
        with the epoch and no records), so that no older owner's append can land after the
        replay's end unseen: from the claim on the leader refuses older epochs, and the replay
        reads at least to the log end the claim answered. Returns {partition: that log end}
        for the partitions claimed; a partition whose claim is refused as fenced is given up
        (:meth:`GroupManager.fence`). Raises FjordError (the load is retried) for any other
        error: no leader known, leader moved, transport."""
        image = self._image()
        by_leader: dict[str, list[broker_pb2.ProducePartition]] = {}
        for p, epoch in sorted(pending.items()):
            state = image.partition(topic, p)
            leader = None if state is None else image.broker(state.leader)
            if leader is None:
                raise error_for_code(
                    ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}-{p} has no live leader"
                )
            by_leader.setdefault(leader.address, []).append(
                broker_pb2.ProducePartition(partition=p, coordinator_epoch=epoch)
            )
        claimed: dict[int, int] = {}
        for address, partitions in by_leader.items():
            request = broker_pb2.ProduceRequest(
                acks=1,
                timeout_ms=self._commit_timeout_ms,
                topics=[broker_pb2.ProduceTopic(name=topic, partitions=partitions)],
            )
            try:
                response = await self._network.broker(address).Produce(
                    request, timeout=self._commit_timeout_ms / 1000
                )
            except Exception as exc:
                raise transport_error(exc, address) from exc
            for topic_answer in response.topics:
                for answer in topic_answer.partitions:
                    code = error_code_from_number(answer.error.code)
                    if code is ErrorCode.NONE:
                        claimed[answer.partition] = answer.base_offset
                    elif code is ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                        (fence or self.manager.fence)(
                            answer.partition, pending[answer.partition]
                        )
                    else:
                        raise error_for_code(
                            code,
                            f"claiming {topic}-{answer.partition} on {address}: "
                            f"{answer.error.message}",
                        )
        return claimed

    # --- periodic duties --------------------------------------------------------------------

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(f"coordinator {self.options.coordinator_id}: {name}")
        self._tasks.append(task)

    async def _periodic(self, interval_s: float, action: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await action()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("coordinator maintenance failed")

    async def _expire_offsets(self) -> None:
        self.manager.expire_offsets()

    async def _refresh_lag(self) -> None:
        """Set ``fjord_group_lag`` for every committed offset of the served groups (log end
        offset = high watermark from the partition leader's ListOffsets), and
        ``fjord_group_lag_seconds`` (now minus the timestamp of the first uncommitted record,
        :func:`fjord.groups.lag.time_lag_seconds`), and the per-state group counts; series of
        groups/partitions no longer served are removed."""
        for state, count in self.manager.state_counts().items():
            set_group_count(state, count)
        committed = self.manager.committed_offsets()
        wanted = {tp for offsets in committed.values() for tp in offsets}
        ends = await self._log_end_offsets(wanted)
        behind = {
            (TopicPartition(topic, partition), offset)
            for offsets in committed.values()
            for (topic, partition), offset in offsets.items()
            if 0 <= offset < ends.get(TopicPartition(topic, partition), -1)
        }
        stamps = await self._first_record_timestamps(behind)
        now_ms = int(time.time() * 1000)
        current: set[tuple[str, str, int]] = set()
        for group, offsets in committed.items():
            for (topic, partition), offset in offsets.items():
                tp = TopicPartition(topic, partition)
                end = ends.get(tp)
                if end is None:
                    continue
                set_group_lag(group, topic, partition, max(end - offset, 0))
                set_group_lag_seconds(
                    group, topic, partition,
                    time_lag_seconds(offset, end, stamps.get((tp, offset)), now_ms),
                )
                current.add((group, topic, partition))
        for group, topic, partition in self._lag_series - current:
            remove_group_lag(group, topic, partition)
        self._lag_series = current

    async def _first_record_timestamps(
        self, wanted: set[tuple[TopicPartition, int]]
    ) -> dict[tuple[TopicPartition, int], int]:
        """Timestamp of the first record at or after each (partition, committed offset), read
        with one Fetch to the partition's leader per pair not cached from an earlier refresh;
        pairs whose read fails are left out (their time lag is unknown this round). The cache
        keeps only the pairs still wanted."""
        image = self._image()
        cached = {key: ts for key, ts in self._first_record_ms.items() if key in wanted}

        async def read(tp: TopicPartition, offset: int) -> None:
            state = image.partition(tp.topic, tp.partition)
            leader = None if state is None else image.broker(state.leader)
            if leader is None:
                return
            request = first_record_fetch(tp, offset, defaults.LAG_FETCH_MAX_BYTES)
            try:
                response = await self._network.broker(leader.address).Fetch(
                    request, timeout=defaults.LAG_LIST_OFFSETS_TIMEOUT_S
                )
            except (TimeoutError, grpc.aio.AioRpcError) as exc:
                log.debug("Fetch of %s at %d for time lag failed: %s", tp, offset, exc)
                return
            hit = first_record_at_or_after(response, tp, offset, NO_TIMESTAMP_BOUND)
            if hit is not None:
                cached[(tp, offset)] = hit[1]

        await asyncio.gather(*(read(tp, o) for tp, o in wanted if (tp, o) not in cached))
        self._first_record_ms = cached
        return cached

    async def _log_end_offsets(self, tps: set[TopicPartition]) -> dict[TopicPartition, int]:
        """High watermarks by ListOffsets(latest) to each partition's leader (from the
        metadata image); partitions whose leader is unknown or fails are left out."""
        image = self._image()
        by_leader: dict[str, dict[str, list[int]]] = {}
        for topic, partition in tps:
            state = image.partition(topic, partition)
            leader = None if state is None else image.broker(state.leader)
            if leader is not None:
                by_leader.setdefault(leader.address, {}).setdefault(topic, []).append(partition)
        out: dict[TopicPartition, int] = {}

        async def ask(address: str, topics: dict[str, list[int]]) -> None:
            request = broker_pb2.ListOffsetsRequest(
                replica_id=-1,
                topics=[
                    broker_pb2.ListOffsetsTopic(
                        name=topic,
                        partitions=[
                            broker_pb2.ListOffsetsPartition(
                                partition=p, timestamp=-1, current_leader_epoch=-1
                            )
                            for p in sorted(partitions)
                        ],
                    )
                    for topic, partitions in topics.items()
                ],
            )
            try:
                response = await self._network.broker(address).ListOffsets(
                    request, timeout=defaults.LAG_LIST_OFFSETS_TIMEOUT_S
                )
            except (TimeoutError, grpc.aio.AioRpcError) as exc:
                log.debug("ListOffsets to %s for lag failed: %s", address, exc)
                return
            for topic in response.topics:
                for p in topic.partitions:
                    if error_code_from_number(p.error.code) is ErrorCode.NONE and p.offset >= 0:
                        out[TopicPartition(topic.name, p.partition)] = p.offset

        await asyncio.gather(*(ask(a, t) for a, t in by_leader.items()))
        return out


__all__ = [
    "CONFIG_KEYS",
    "CoordinatorOptions",
    "CoordinatorServer",
    "parse_coordinator_config",
]
