"""A whole Fjord cluster on one machine: etcd, controllers, brokers and group coordinators as
child processes.

Used by ``fjord local up|status|down`` and by the integration tests' shared fixture.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc

from fjord._proto import (
    broker_pb2,
    broker_pb2_grpc,
    controller_pb2,
    controller_pb2_grpc,
    coordinator_pb2,
    coordinator_pb2_grpc,
)
from fjord.errors import ErrorCode
from fjord.local.certs import LocalPki
from fjord.local.defaults import (
    DEFAULT_BROKERS,
    DEFAULT_CLUSTER_ID,
    DEFAULT_CONTROLLERS,
    DEFAULT_COORDINATORS,
    ETCD_START_TIMEOUT_S,
    LOCAL_BROKER_LEASE_TTL_S,
    LOCAL_CONTROLLER_LEASE_TTL_S,
    LOCAL_COORDINATOR_LEASE_TTL_S,
    LOCAL_LEADER_IMBALANCE_CHECK_INTERVAL_S,
    LOCAL_REPLICA_LAG_TIME_MAX_MS,
    LOOPBACK_HOST,
    PORT_RETRIES,
    PROBE_TIMEOUT_S,
    PROCESS_START_TIMEOUT_S,
    READY_POLL_INTERVAL_S,
    STATE_FILE,
    STOP_TIMEOUT_S,
)
from fjord.local.etcd import (
    EtcdProcess,
    ProcessStartError,
    free_port,
    log_size,
    log_tail,
    stop_process,
)
from fjord.local.ports import PortInUseError, check_ports_free, port_clash_message
from fjord.metadata import ClusterConfig, Keys
from fjord.security import ClientSecurity, parse_properties
from fjord.tls import client_ssl_context, open_blocking_channel

# The child command: the installed package's CLI, independent of PATH.
_FJORD = [sys.executable, "-c", "from fjord.cli.main import main; main()"]


class ClusterStateError(RuntimeError):
    """The data directory has no usable state file, or a cluster is already running there."""


@dataclass(frozen=True)
class ProcessInfo:
    """One process of a local cluster as written to the state file."""

    role: str  # "etcd", "controller", "broker" or "coordinator"
    id: int
    pid: int
    address: str  # host:port of its gRPC (or etcd client) endpoint
    log: str
    # host:port serving Prometheus /metrics (etcd serves its own on its client port).
    metrics_address: str | None = None
    # The command that started it: ``fjord local up`` restarts a process that died with it.
    argv: tuple[str, ...] = ()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still "exists" for kill(0); it is not alive. But a killed multi-threaded
    # process shows its leader as a zombie while its other threads still exit, and only the
    # last of them closes the files (its listening sockets): dead means no thread is left.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(")")[-1].split()[0] != "Z":
                return True
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except FileNotFoundError:
        return False  # reaped meanwhile
    except OSError:
        return True


class LocalCluster:
    """etcd + controllers + brokers + group coordinators under one data directory.

    Layout of ``data_dir``: ``etcd/`` (etcd's data), ``brokers/<id>/`` (each broker's partition
    logs), ``logs/<role>-<id>.log`` (each process's output), and ``cluster.json``, the state
    file: ``{"cluster_id", "etcd_url", "bootstrap_servers", "kafka_bootstrap_servers",
    "launcher_pid", "processes": [{"role", "id", "pid", "address", "log", "metrics_address",
    "argv"}]}``.

    Every broker and every coordinator also opens a Kafka-protocol listener
    (``KAFKA://127.0.0.1:<free port>``, kept across restarts of that process like its gRPC
    port); the brokers' are ``kafka_bootstrap_servers``, and Kafka clients find the
    coordinators' through FindCoordinator and Metadata.

    Brokers listen on ``broker_port``, ``broker_port + 1``, ... when it is not 0 (``fjord local
    up --port``), else on free ports. With ``broker_port_fallback`` that port is only a wish:
    when it is taken (say, by a cluster started a moment earlier) the brokers take free ports.

    Coordinators have ids 1..N and no data directory (their state is ``__consumer_offsets``).

    Invariants: every process listens on loopback; every controller, broker and coordinator
    also serves
    Prometheus ``/metrics`` on a port of its own (picked free by the launcher, kept across
    restarts of that process like its gRPC port; etcd serves its own metrics on its client
    port); :meth:`start` returns only when etcd is healthy, a controller is active and every
    broker is registered and answers Metadata and every coordinator is registered (each wait
    bounded), otherwise it stops what it started and raises ProcessStartError with the failing
    process's log tail; :meth:`stop` stops coordinators, then brokers, then controllers, then
    etcd.

    Never losing track of a process: only an instance whose :meth:`start` got past the
    "already running" check owns the state file; :meth:`stop` of any other instance leaves it
    alone, and the owner's :meth:`stop` also stops every process the state file records
    (``fjord local up`` may have restarted some), then records only processes still alive.
    """

    def __init__(
        self,
        data_dir: Path | str,
        brokers: int = DEFAULT_BROKERS,
        controllers: int = DEFAULT_CONTROLLERS,
        cluster_id: str = DEFAULT_CLUSTER_ID,
        config: Mapping[str, str] | None = None,
        controller_lease_ttl_s: int = LOCAL_CONTROLLER_LEASE_TTL_S,
        broker_lease_ttl_s: int = LOCAL_BROKER_LEASE_TTL_S,
        unsafe_etcd_no_fsync: bool = False,
        detach: bool = False,
        coordinators: int = DEFAULT_COORDINATORS,
        coordinator_lease_ttl_s: int = LOCAL_COORDINATOR_LEASE_TTL_S,
        coordinator_config: Mapping[str, str] | None = None,
        broker_port: int = 0,
        broker_port_fallback: bool = False,
        secure: bool = False,
        authorization: bool = False,
        kafka_sasl: bool = False,
        racks: Mapping[int, str] | None = None,
        mtls_kafka_door: bool = False,
        etcd_tls: bool = True,
        broker_loop_stall_limit_s: float | None = None,
    ) -> None:
        if brokers < 0 or controllers < 1 or coordinators < 0:
            raise ValueError(
                "need at least one controller and zero or more brokers and coordinators"
            )
        self.data_dir = Path(data_dir).absolute()
        self.num_brokers = brokers
        self.num_controllers = controllers
        self.num_coordinators = coordinators
        self.coordinator_lease_ttl_s = coordinator_lease_ttl_s
        self.coordinator_config = dict(coordinator_config or {})
        if self.coordinator_config:
            from fjord.coordinator.server import parse_coordinator_config

            parse_coordinator_config(self.coordinator_config)  # ConfigError names a bad key
        self.cluster_id = cluster_id
        from fjord.cluster.topic_config import split_cluster_config

        # cluster-config gets the controller's part, each broker's --config its own part.
        self.cluster_config, self.broker_config = split_cluster_config(dict(config or {}))
        self.broker_config.setdefault("replica.lag.time.max.ms", str(LOCAL_REPLICA_LAG_TIME_MAX_MS))
        # One SASL session lifetime for the whole local cluster: the coordinators' and the
        # controllers' SASL doors take the brokers' connections.max.reauth.ms (a coordinator
        # keeps its own when given one).
        from fjord.security.sasl_sessions import CONNECTIONS_MAX_REAUTH_MS_KEY

        self._controller_config_args: list[str] = []
        if CONNECTIONS_MAX_REAUTH_MS_KEY in self.broker_config:
            lifetime = self.broker_config[CONNECTIONS_MAX_REAUTH_MS_KEY]
            self.coordinator_config.setdefault(CONNECTIONS_MAX_REAUTH_MS_KEY, lifetime)
            self._controller_config_args = [
                "--config", f"{CONNECTIONS_MAX_REAUTH_MS_KEY}={lifetime}"]
        self.controller_lease_ttl_s = controller_lease_ttl_s
        self.broker_lease_ttl_s = broker_lease_ttl_s
        #: Each broker's ``--loop-stall-limit`` (None: its default, the lease TTL).
        self.broker_loop_stall_limit_s = broker_loop_stall_limit_s
        self.detach = detach
        self.broker_port = broker_port
        # True: broker_port is only preferred (the default 9092); a clash means free ports.
        self.broker_port_fallback = broker_port_fallback
        #: TLS with client certificates on every listener and towards etcd; the CA and
        #: certificates live in ``<data_dir>/tls`` (fjord.local.certs), made by start().
        self.secure = secure
        if authorization and not secure:
            raise ValueError("authorization needs secure=True (principals come from certificates)")
        #: Kafka's ACL authorizer on in every service, User:admin (client.properties) the
        #: super user; everyone else needs ACLs.
        self.authorization = authorization
        #: The Kafka-protocol doors authenticate with SASL SCRAM: SASL_SSL:// when secure,
        #: else SASL_PLAINTEXT:// (users: fjord users / AdminClient.alter_user_scram_credentials).
        self.kafka_sasl = kafka_sasl
        if mtls_kafka_door and not (secure and kafka_sasl):
            raise ValueError("mtls_kafka_door needs secure=True and kafka_sasl=True")
        #: Brokers and coordinators open a second Kafka door, SSL:// with client
        #: certificates, beside the SASL_SSL:// one (two named listeners, each advertised).
        self.mtls_kafka_door = mtls_kafka_door
        #: Each broker's rack (``fjord broker --rack``); brokers not named have none.
        self.racks = dict(racks or {})
        self._pki: LocalPki | None = None
        self._client_security: ClientSecurity | None = None
        self._owner = False  # True once start() may write the state file
        self.logs_dir = self.data_dir / "logs"
        self.state_path = self.data_dir / STATE_FILE
        previous = self._previous_etcd_ports()
        self.etcd = EtcdProcess(
            self.data_dir / "etcd",
            self.logs_dir / "etcd.log",
            client_port=previous[0],
            peer_port=previous[1],
            unsafe_no_fsync=unsafe_etcd_no_fsync,
            tls=(
                (self.data_dir / "tls" / "etcd-0.pem", self.data_dir / "tls" / "ca.pem")
                if secure and etcd_tls else None
            ),
        )
        #: Per process (role, id), a directory holding ``service.pem`` and ``ca.crt`` (as a
        #: Kubernetes Secret volume does, in the operator's tests): that process starts with
        #: them as keystore and truststore instead of the local CA's files.
        self.mounted_tls: dict[tuple[str, int], Path] = {}
        self._children: dict[tuple[str, int], tuple[subprocess.Popen[bytes], str]] = {}
        self._argv: dict[tuple[str, int], tuple[str, ...]] = {}
        self._log_start: dict[tuple[str, int], int] = {}  # where each run's output begins
        # (role, id) -> the port its /metrics is served on; kept when the process restarts.
        self._metrics_ports: dict[tuple[str, int], int] = {}
        # (role, id) -> the port of its Kafka listener (brokers and coordinators); kept when
        # the process restarts.
        self._kafka_ports: dict[tuple[str, int], int] = {}
        self._mtls_kafka_ports: dict[tuple[str, int], int] = {}
        self._sasl_grpc_ports: dict[tuple[str, int], int] = {}
        #: ("broker", id) -> the port of that broker's direct door (fjord.broker.direct_door;
        #: brokers of a cluster that is not secure open one); kept when it restarts.
        self._direct_ports: dict[tuple[str, int], int] = {}

    # -- addresses ---------------------------------------------------------------------------

    @property
    def etcd_url(self) -> str:
        return self.etcd.url

    def address(self, role: str, node_id: int) -> str:
        return self._children[(role, node_id)][1]

    def metrics_address(self, role: str, node_id: int) -> str:
        """``host:port`` where ``role`` ``node_id`` serves Prometheus ``/metrics``."""
        if role == "etcd":
            return _without_scheme(self.etcd_url)
        return f"{LOOPBACK_HOST}:{self._metrics_ports[(role, node_id)]}"

    @property
    def broker_addresses(self) -> dict[int, str]:
        return {i: a for (r, i), (_, a) in sorted(self._children.items()) if r == "broker"}

    @property
    def controller_addresses(self) -> dict[int, str]:
        return {i: a for (r, i), (_, a) in sorted(self._children.items()) if r == "controller"}

    @property
    def coordinator_addresses(self) -> dict[int, str]:
        return {i: a for (r, i), (_, a) in sorted(self._children.items()) if r == "coordinator"}

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(self.broker_addresses.values())

    @property
    def kafka_broker_addresses(self) -> dict[int, str]:
        """broker id -> ``host:port`` of its Kafka-protocol listener."""
        return self._kafka_addresses("broker")

    @property
    def kafka_coordinator_addresses(self) -> dict[int, str]:
        """coordinator id -> ``host:port`` of its Kafka-protocol listener."""
        return self._kafka_addresses("coordinator")

    @property
    def mtls_kafka_bootstrap_servers(self) -> str:
        """The brokers' SSL:// doors (clusters started with mtls_kafka_door)."""
        return ",".join(self._kafka_addresses("broker", self._mtls_kafka_ports).values())

    def mtls_kafka_addresses(self, role: str) -> dict[int, str]:
        """id -> ``host:port`` of each ``role`` process's SSL:// door (mtls_kafka_door)."""
        return self._kafka_addresses(role, self._mtls_kafka_ports)

    def _kafka_addresses(
        self, role: str, ports: dict[tuple[str, int], int] | None = None
    ) -> dict[int, str]:
        ports = self._kafka_ports if ports is None else ports
        return {i: f"{LOOPBACK_HOST}:{p}" for (r, i), p in sorted(ports.items())
                if r == role and (r, i) in self._children}

    def _kafka_port(self, role: str, node_id: int) -> int:
        """The Kafka listener port of ``role`` ``node_id`` (picked free once, then kept)."""
        port = self._kafka_ports.get((role, node_id)) or free_port()
        self._kafka_ports[(role, node_id)] = port
        return port

    def _kafka_listeners(self, role: str, node_id: int) -> str:
        """``--listeners``' Kafka doors of ``role`` ``node_id``: the cluster's door, and with
        mtls_kafka_door an SSL:// one after it."""
        doors = f"{self._kafka_door}://{LOOPBACK_HOST}:{self._kafka_port(role, node_id)}"
        if self.mtls_kafka_door:
            port = self._mtls_kafka_ports.get((role, node_id)) or free_port()
            self._mtls_kafka_ports[(role, node_id)] = port
            doors += f",SSL://{LOOPBACK_HOST}:{port}"
        return doors

    def _kept_ports(self) -> tuple[dict[tuple[str, int], int], ...]:
        """Every map of (role, id) -> a port picked free once and kept when the process
        restarts: a start that failed to bind any of them picks all of them again."""
        return (self._metrics_ports, self._kafka_ports, self._mtls_kafka_ports,
                self._sasl_grpc_ports, self._direct_ports)

    def _direct_port(self, broker_id: int) -> int:
        """The direct door port of broker ``broker_id`` (picked free once, then kept)."""
        port = self._direct_ports.get(("broker", broker_id)) or free_port()
        self._direct_ports[("broker", broker_id)] = port
        return port

    def direct_address(self, broker_id: int) -> str:
        """``HOST:PORT`` of broker ``broker_id``'s direct door (clusters that are not
        secure: their brokers open one; KeyError for a broker never started)."""
        return f"{LOOPBACK_HOST}:{self._direct_ports[('broker', broker_id)]}"

    def _sasl_grpc_port(self, role: str, node_id: int) -> int:
        """The SASL gRPC door port of ``role`` ``node_id`` (picked free once, then kept)."""
        port = self._sasl_grpc_ports.get((role, node_id)) or free_port()
        self._sasl_grpc_ports[(role, node_id)] = port
        return port

    def sasl_grpc_address(self, role: str, node_id: int) -> str:
        """``HOST:PORT`` of a process's SASL gRPC door (clusters started with kafka_sasl)."""
        return f"{LOOPBACK_HOST}:{self._sasl_grpc_ports[(role, node_id)]}"

    @property
    def sasl_grpc_bootstrap_servers(self) -> str:
        """The brokers' SASL gRPC doors (clusters started with kafka_sasl): ``bootstrap.servers``
        of a fjord.client with ``security.protocol`` SASL_SSL/SASL_PLAINTEXT."""
        doors = sorted(self._sasl_grpc_ports.items())
        return ",".join(f"{LOOPBACK_HOST}:{p}" for (r, i), p in doors
                        if r == "broker" and (r, i) in self._children)

    @property
    def kafka_bootstrap_servers(self) -> str:
        """What a Kafka client's ``bootstrap.servers`` should be."""
        return ",".join(self.kafka_broker_addresses.values())

    def processes(self) -> list[ProcessInfo]:
        out = []
        if self.etcd.process is not None:
            out.append(
                ProcessInfo("etcd", 0, self.etcd.process.pid,
                            _without_scheme(self.etcd.url), str(self.etcd.log_path),
                            self.metrics_address("etcd", 0), tuple(self.etcd.command))
            )
        for (role, node_id), (proc, address) in sorted(self._children.items()):
            out.append(ProcessInfo(role, node_id, proc.pid, address, str(self._log(role, node_id)),
                                   self.metrics_address(role, node_id),
                                   self._argv[(role, node_id)]))
        return out

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        existing = read_state(self.data_dir, missing_ok=True)
        if existing and any(pid_alive(p["pid"]) for p in existing["processes"]):
            raise ClusterStateError(
                f"a local cluster is already running in {self.data_dir} "
                "(stop it with `fjord local down`)"
            )
        # Fixed ports are checked before anything starts: a clash is reported at once, naming
        # the port and its holder, instead of a process dying (or, for etcd, an old etcd on
        # the same port answering health checks) and a timeout later.
        check_ports_free(
            {"etcd (client port)": self.etcd.client_port, "etcd (peer port)": self.etcd.peer_port}
        )
        broker_ports = {
            f"broker {i}": self.broker_port + i if self.broker_port else 0
            for i in range(self.num_brokers)
        }
        try:
            check_ports_free(broker_ports)
        except PortInUseError:
            if not self.broker_port_fallback:
                raise
            self.broker_port = 0
        self._owner = True
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        if self.secure:
            self._pki = LocalPki(self.data_dir)
            self._pki.service_files("etcd", 0)
            self._client_security = client_security_from_file(self._pki.client_properties())
        try:
            self.etcd.start(ETCD_START_TIMEOUT_S)
            self._write_state()
            self._write_cluster_config()
            # Everything starts at once (Python start-up dominates); brokers do not need an
            # active controller to register and answer Metadata.
            for controller_id in range(self.num_controllers):
                self.start_controller(controller_id, wait=False)
            for broker_id in range(self.num_brokers):
                self.start_broker(broker_id, wait=False)
            for coordinator_id in range(1, self.num_coordinators + 1):
                self.start_coordinator(coordinator_id, wait=False)
            for controller_id in range(self.num_controllers):
                self._wait_ready("controller", controller_id)
            self.wait_active_controller(PROCESS_START_TIMEOUT_S)
            for broker_id in range(self.num_brokers):
                self._wait_ready("broker", broker_id)
            for coordinator_id in range(1, self.num_coordinators + 1):
                self._wait_ready("coordinator", coordinator_id)
        except BaseException:
            self.stop()
            raise
        self._write_state()

    def stop(self) -> None:
        """Stop coordinators, brokers, then controllers, then etcd (SIGTERM, then SIGKILL after
        a grace). A no-op for the state file unless this instance started the cluster."""
        if self._owner:
            # Processes someone restarted (``fjord local up`` filling a gap) are ours to stop.
            with contextlib.suppress(ClusterStateError, OSError):
                stop_from_state(self.data_dir)
        for role in ("coordinator", "broker", "controller"):
            procs = [p for (r, _), (p, _) in self._children.items() if r == role]
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                stop_process(proc, STOP_TIMEOUT_S)
        self.etcd.stop()
        if self._owner:
            self._write_state(stopped=True)

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- single processes (also for fault tests) ---------------------------------------------

    def _log(self, role: str, node_id: int) -> Path:
        return self.logs_dir / f"{role}-{node_id}.log"

    def _spawn(self, role: str, node_id: int, args: list[str]) -> subprocess.Popen[bytes]:
        argv = (*_FJORD, *args)
        self._argv[(role, node_id)] = argv
        self._log_start[(role, node_id)] = log_size(self._log(role, node_id))
        with open(self._log(role, node_id), "ab") as log:
            return subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Own session: Ctrl-C reaches only the launcher, which stops children in order;
                # with --detach the children outlive the launcher.
                start_new_session=True,
            )

    def _start_child(
        self,
        role: str,
        node_id: int,
        args_for_port: Callable[[str], list[str]],
        fixed_port: int = 0,
    ) -> None:
        old = self._children.get((role, node_id))
        if old is not None and old[0].poll() is None:
            raise ClusterStateError(f"{role} {node_id} is already running")
        port = int(old[1].rpartition(":")[2]) if old else fixed_port or free_port()
        address = f"{LOOPBACK_HOST}:{port}"
        metrics_port = self._metrics_ports.get((role, node_id)) or free_port()
        self._metrics_ports[(role, node_id)] = metrics_port
        args = [*args_for_port(address), "--metrics-port", str(metrics_port)]
        self._children[(role, node_id)] = (self._spawn(role, node_id, args), address)

    def start_controller(self, controller_id: int, wait: bool = True) -> None:
        """Start (or restart, on the same port) controller ``controller_id``."""
        self._start_child(
            "controller",
            controller_id,
            lambda address: [
                "controller", "--id", str(controller_id), "--listen", address,
                "--etcd", self.etcd_url, "--cluster-id", self.cluster_id,
                "--lease-ttl", str(self.controller_lease_ttl_s),
                "--leader-imbalance-check-interval", str(LOCAL_LEADER_IMBALANCE_CHECK_INTERVAL_S),
                *self._security_args("controller", controller_id),
                *(["--sasl-listen",
                   f"{LOOPBACK_HOST}:{self._sasl_grpc_port('controller', controller_id)}",
                   *self._controller_config_args]
                  if self.kafka_sasl else []),
            ],
        )
        if wait:
            self._wait_ready("controller", controller_id)

    def start_broker(self, broker_id: int, wait: bool = True) -> None:
        """Start (or restart, on the same ports and data) broker ``broker_id``. With ``wait``, a
        start that fails because a port it keeps was taken meanwhile (a port is only known free
        when picked) is started again with every port picked afresh, as :meth:`start` does."""
        data = self.data_dir / "brokers" / str(broker_id)
        data.mkdir(parents=True, exist_ok=True)
        config_args = [a for k, v in sorted(self.broker_config.items())
                       for a in ("--config", f"{k}={v}")]
        kafka_listeners = self._kafka_listeners("broker", broker_id)
        self._start_child(
            "broker",
            broker_id,
            lambda address: [
                "broker", "--id", str(broker_id), "--listen", address,
                "--listeners", kafka_listeners,
                "--data-dir", str(data), "--etcd", self.etcd_url,
                "--cluster-id", self.cluster_id,
                "--lease-ttl", str(self.broker_lease_ttl_s), *config_args,
                *(["--loop-stall-limit", str(self.broker_loop_stall_limit_s)]
                  if self.broker_loop_stall_limit_s is not None else []),
                *(["--rack", self.racks[broker_id]] if broker_id in self.racks else []),
                *self._security_args("broker", broker_id),
                *(["--sasl-listen", f"{LOOPBACK_HOST}:{self._sasl_grpc_port('broker', broker_id)}"]
                  if self.kafka_sasl else []),
                # The direct door has no identity: only brokers without TLS open one.
                *(["--direct-listen", f"{LOOPBACK_HOST}:{self._direct_port(broker_id)}"]
                  if not self.secure else []),
            ],
            self.broker_port + broker_id if self.broker_port else 0,
        )
        if wait:
            self._wait_ready("broker", broker_id)

    def start_coordinator(self, coordinator_id: int, wait: bool = True) -> None:
        """Start (or restart, on the same port) group coordinator ``coordinator_id``."""
        config_args = [a for k, v in sorted(self.coordinator_config.items())
                       for a in ("--config", f"{k}={v}")]
        kafka_listeners = self._kafka_listeners("coordinator", coordinator_id)
        self._start_child(
            "coordinator",
            coordinator_id,
            lambda address: [
                "coordinator", "--id", str(coordinator_id), "--listen", address,
                "--listeners", kafka_listeners,
                "--etcd", self.etcd_url, "--cluster-id", self.cluster_id,
                "--lease-ttl", str(self.coordinator_lease_ttl_s), *config_args,
                "--state-dir", str(self.data_dir / "coordinators" / str(coordinator_id)),
                *self._security_args("coordinator", coordinator_id),
                *(["--sasl-listen",
                   f"{LOOPBACK_HOST}:{self._sasl_grpc_port('coordinator', coordinator_id)}"]
                  if self.kafka_sasl else []),
            ],
        )
        if wait:
            self._wait_ready("coordinator", coordinator_id)

    @property
    def _kafka_door(self) -> str:
        if self.kafka_sasl:
            return "SASL_SSL" if self.secure else "SASL_PLAINTEXT"
        return "SSL" if self.secure else "KAFKA"

    def _security_args(self, role: str, node_id: int) -> list[str]:
        if self._pki is None:
            return []
        mounted = self.mounted_tls.get((role, node_id))
        if mounted is not None:
            properties = self._pki.mounted_service_properties(mounted, self.authorization)
        else:
            _, properties = self._pki.service_files(role, node_id, self.authorization)
        return ["--security-config", str(properties)]

    @property
    def client_security(self) -> ClientSecurity | None:
        """How the launcher's own probes and waits dial the services (a secure cluster: the
        ``client.properties`` identity); a test whose services stop trusting the local CA
        gives it another."""
        return self._client_security

    @client_security.setter
    def client_security(self, security: ClientSecurity | None) -> None:
        self._client_security = security

    @property
    def client_properties(self) -> Path | None:
        """``<data_dir>/client.properties`` of a secure cluster (None when plaintext)."""
        return self.data_dir / "client.properties" if self.secure else None

    @property
    def client_config(self) -> dict[str, str]:
        """What a client (fjord.client or confluent-kafka) needs besides bootstrap.servers:
        {} for plaintext, the ``client.properties`` entries for a secure cluster."""
        path = self.client_properties
        return parse_properties(path.read_text()) if path is not None else {}

    def kill(self, role: str, node_id: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (default SIGKILL) to a process and reap it."""
        proc = self._children[(role, node_id)][0]
        if proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(STOP_TIMEOUT_S)
        self._write_state()

    def process(self, role: str, node_id: int) -> subprocess.Popen[bytes]:
        return self._children[(role, node_id)][0]

    # -- readiness ---------------------------------------------------------------------------

    def _wait_ready(self, role: str, node_id: int) -> None:
        """Wait until a freshly started process is ready; if it died because its port was
        taken between picking and binding (other test runs share the machine), start it again
        on a new port, at most PORT_RETRIES times."""
        waits: dict[str, Callable[[int], None]] = {
            "controller": self._wait_controller_serving,
            "broker": self._wait_broker_ready,
            "coordinator": self._wait_coordinator_registered,
        }
        restarts: dict[str, Callable[..., None]] = {
            "controller": self.start_controller,
            "broker": self.start_broker,
            "coordinator": self.start_coordinator,
        }
        wait, restart = waits[role], restarts[role]
        for attempt in range(PORT_RETRIES):
            try:
                wait(node_id)
                return
            except ProcessStartError:
                proc = self.process(role, node_id)
                log = self._run_log(role, node_id).lower()
                bind_failed = "bind" in log or "address already in use" in log
                fixed = role == "broker" and self.broker_port
                if bind_failed and proc.poll() is not None and fixed:
                    if not self.broker_port_fallback:
                        # A port that was asked for is never swapped for another.
                        port = int(self.address(role, node_id).rpartition(":")[2])
                        raise PortInUseError(
                            port_clash_message(f"broker {node_id}", port)
                        ) from None
                    self.broker_port = 0  # taken meanwhile: free ports from here on
                if proc.poll() is None or not bind_failed or attempt == PORT_RETRIES - 1:
                    raise
                # Every port is picked afresh: any may be the one that was taken.
                del self._children[(role, node_id)]
                for ports in self._kept_ports():
                    ports.pop((role, node_id), None)
                restart(node_id, wait=False)

    def _run_log(self, role: str, node_id: int) -> str:
        """The tail of what the current run of ``role`` ``node_id`` wrote to its log."""
        return log_tail(self._log(role, node_id), since=self._log_start.get((role, node_id), 0))

    def _check_alive(self, role: str, node_id: int) -> None:
        proc = self.process(role, node_id)
        if proc.poll() is not None:
            raise ProcessStartError(
                f"{role} {node_id} exited with {proc.returncode}:\n"
                f"{self._run_log(role, node_id)}"
            )

    def _wait_until(
        self, role: str, node_id: int, check: Callable[[], object], what: str, timeout: float
    ) -> object:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive(role, node_id)
            result = check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise ProcessStartError(
                    f"{role} {node_id} not {what} after {timeout} s:\n"
                    f"{self._run_log(role, node_id)}"
                )
            time.sleep(READY_POLL_INTERVAL_S)

    def describe_cluster(self, controller_id: int) -> controller_pb2.DescribeClusterResponse | None:
        return probe_controller(self.address("controller", controller_id), self._client_security)

    def _wait_controller_serving(self, controller_id: int) -> None:
        address = self.address("controller", controller_id)
        self._wait_until(
            "controller", controller_id,
            lambda: READY["controller"](address, controller_id, self._client_security),
            "serving", PROCESS_START_TIMEOUT_S,
        )

    def active_controller(self) -> int | None:
        """The id of the active controller as the controllers report it, or None."""
        for controller_id, (proc, _) in sorted(
            (i, v) for (r, i), v in self._children.items() if r == "controller"
        ):
            if proc.poll() is not None:
                continue
            response = self.describe_cluster(controller_id)
            if response is not None and response.error.code == 0:
                return controller_id
        return None

    def wait_active_controller(self, timeout: float, exclude: int | None = None) -> int:
        """Wait (bounded) until some controller other than ``exclude`` is active."""
        deadline = time.monotonic() + timeout
        while True:
            active = self.active_controller()
            if active is not None and active != exclude:
                return active
            if time.monotonic() > deadline:
                raise ProcessStartError(f"no active controller after {timeout} s")
            time.sleep(READY_POLL_INTERVAL_S)

    def broker_metadata(self, broker_id: int) -> broker_pb2.MetadataResponse | None:
        return probe_broker(self.address("broker", broker_id), self._client_security)

    def _wait_broker_ready(self, broker_id: int) -> None:
        address = self.address("broker", broker_id)
        self._wait_until("broker", broker_id,
                         lambda: READY["broker"](address, broker_id, self._client_security),
                         "registered and answering Metadata", PROCESS_START_TIMEOUT_S)

    def list_groups(self, coordinator_id: int) -> coordinator_pb2.ListGroupsResponse | None:
        """The coordinator's ListGroups answer (None when it does not answer)."""
        return probe_coordinator(
            self.address("coordinator", coordinator_id), self._client_security
        )

    def _wait_coordinator_registered(self, coordinator_id: int) -> None:
        address = self.address("coordinator", coordinator_id)
        self._wait_until("coordinator", coordinator_id,
                         lambda: READY["coordinator"](address, coordinator_id,
                                                      self._client_security), "registered",
                         PROCESS_START_TIMEOUT_S)

    # -- etcd and state ----------------------------------------------------------------------

    def _write_cluster_config(self) -> None:
        """Write ``cluster-config``: replaced when ``--config`` was given, otherwise created
        empty only if absent (a restart without ``--config`` keeps the previous one).

        Uses etcd's JSON gateway, which keeps the launcher synchronous (it may be called from
        inside an event loop)."""
        key = base64.b64encode(Keys(self.cluster_id).cluster_config.encode()).decode()
        value = base64.b64encode(ClusterConfig(self.cluster_config).to_json()).decode()
        put = {"requestPut": {"key": key, "value": value}}
        only_if_absent = [] if self.cluster_config else [
            {"key": key, "target": "CREATE", "result": "EQUAL", "createRevision": "0"}
        ]
        body = json.dumps({"compare": only_if_absent, "success": [put]}).encode()
        request = urllib.request.Request(f"{self.etcd_url}/v3/kv/txn", data=body, method="POST")
        with urllib.request.urlopen(
            request, timeout=ETCD_START_TIMEOUT_S, context=self.etcd.ssl_context()
        ) as response:
            response.read()

    def _previous_etcd_ports(self) -> tuple[int, int]:
        state = read_state(self.data_dir, missing_ok=True)
        if state and (self.data_dir / "etcd").exists():
            ports = state.get("etcd_ports")
            if isinstance(ports, list) and len(ports) == 2:
                return int(ports[0]), int(ports[1])
        return 0, 0

    def _write_state(self, stopped: bool = False) -> None:
        # A stopped cluster keeps its state file without processes: the etcd ports are reused
        # by the next start, because etcd's data directory remembers its peer address.
        state = {
            "cluster_id": self.cluster_id,
            "etcd_url": self.etcd_url,
            "etcd_ports": [self.etcd.client_port, self.etcd.peer_port],
            "bootstrap_servers": self.bootstrap_servers,
            "kafka_bootstrap_servers": self.kafka_bootstrap_servers,
            "launcher_pid": None if self.detach or stopped else os.getpid(),
            "client_properties": str(self.client_properties) if self.client_properties else None,
            # Once stopped, only a process that survived SIGKILL is still listed.
            "processes": [
                asdict(p) for p in self.processes() if not stopped or pid_alive(p.pid)
            ],
        }
        _write_state_file(self.data_dir, state)


def probe_controller(
    address: str, security: ClientSecurity | None = None
) -> controller_pb2.DescribeClusterResponse | None:
    """The DescribeCluster answer of the controller at ``address`` (None when it does not
    answer within PROBE_TIMEOUT_S)."""
    try:
        with open_blocking_channel(address, security) as channel:
            stub = controller_pb2_grpc.ControllerStub(channel)
            request = controller_pb2.DescribeClusterRequest()
            return stub.DescribeCluster(request, timeout=PROBE_TIMEOUT_S)
    except grpc.RpcError:
        return None


def probe_broker(
    address: str, security: ClientSecurity | None = None
) -> broker_pb2.MetadataResponse | None:
    """The all-topics Metadata answer of the broker at ``address`` (None when none)."""
    try:
        with open_blocking_channel(address, security) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            request = broker_pb2.MetadataRequest(all_topics=True)
            return stub.Metadata(request, timeout=PROBE_TIMEOUT_S)
    except grpc.RpcError:
        return None


def probe_coordinator(
    address: str, security: ClientSecurity | None = None
) -> coordinator_pb2.ListGroupsResponse | None:
    """The ListGroups answer of the group coordinator at ``address`` (None when none)."""
    try:
        with open_blocking_channel(address, security) as channel:
            stub = coordinator_pb2_grpc.CoordinatorStub(channel)
            return stub.ListGroups(coordinator_pb2.ListGroupsRequest(), timeout=PROBE_TIMEOUT_S)
    except grpc.RpcError:
        return None


def _without_scheme(url: str) -> str:
    return url.partition("://")[2] or url


def client_security_from_file(path: Path) -> ClientSecurity:
    return ClientSecurity.from_config(parse_properties(path.read_text(), str(path)))


def _etcd_healthy(address: str, _id: int, security: ClientSecurity | None) -> bool:
    if security is not None and security.uses_tls:
        return EtcdProcess.health_at(f"https://{address}", client_ssl_context(security))
    return EtcdProcess.health_at(f"http://{address}")


def _controller_serving(address: str, _id: int, security: ClientSecurity | None) -> bool:
    return probe_controller(address, security) is not None


def _broker_registered(address: str, broker_id: int, security: ClientSecurity | None) -> bool:
    response = probe_broker(address, security)
    return response is not None and any(b.id == broker_id for b in response.brokers)


def _coordinator_registered(address: str, _id: int, security: ClientSecurity | None) -> bool:
    # A coordinator answers COORDINATOR_NOT_AVAILABLE until it is registered in etcd.
    response = probe_coordinator(address, security)
    return response is not None and response.error.code != ErrorCode.COORDINATOR_NOT_AVAILABLE.code


#: Per role: is the process at (address, id) ready (the check :meth:`LocalCluster.start` and
#: :func:`restart_dead_processes` wait for)?
READY: dict[str, Callable[[str, int, ClientSecurity | None], bool]] = {
    "etcd": _etcd_healthy,
    "controller": _controller_serving,
    "broker": _broker_registered,
    "coordinator": _coordinator_registered,
}

_ROLE_ORDER = {"etcd": 0, "controller": 1, "broker": 2, "coordinator": 3}


def restart_dead_processes(
    data_dir: Path | str, timeout: float = PROCESS_START_TIMEOUT_S
) -> list[dict[str, Any]]:
    """Start again every process of the cluster in ``data_dir`` that its state file records
    but that is no longer alive (a broker that crashed or was killed), with the command, port
    and log it had; etcd first, then controllers, brokers, coordinators. Waits (bounded) until
    each is ready and records the new pids. Returns the restarted entries.

    Raises ClusterStateError when nothing in the state file is alive (start the cluster
    instead) or the state file predates recorded commands, PortInUseError when a process's
    port is taken, ProcessStartError when one exits or is not ready in ``timeout``."""
    state = read_state(data_dir)
    assert state is not None
    processes = state["processes"]
    dead = [p for p in processes if not pid_alive(p["pid"])]
    if not dead:
        return []
    if len(dead) == len(processes):
        raise ClusterStateError(f"no process of the local cluster in {data_dir} is running")
    if any(not p.get("argv") for p in dead):
        raise ClusterStateError(
            f"the state file in {data_dir} does not record how its processes were started "
            "(written by an older fjord): run `fjord local down`, then `fjord local up`"
        )
    properties = state.get("client_properties")
    security = client_security_from_file(Path(properties)) if properties else None
    for p in sorted(dead, key=lambda p: (_ROLE_ORDER[p["role"]], p["id"])):
        port = int(p["address"].rpartition(":")[2])
        check_ports_free({f"{p['role']} {p['id']}": port})
        log_path = Path(p["log"])
        start = log_size(log_path)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                list(p["argv"]), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not READY[p["role"]](p["address"], p["id"], security):
            if proc.poll() is not None or time.monotonic() > deadline:
                what = f"exited with {proc.returncode}" if proc.poll() is not None else (
                    f"not ready after {timeout} s")
                if proc.poll() is None:
                    stop_process(proc)
                raise ProcessStartError(
                    f"{p['role']} {p['id']} {what}:\n{log_tail(log_path, since=start)}"
                )
            time.sleep(READY_POLL_INTERVAL_S)
        p["pid"] = proc.pid
        _write_state_file(Path(data_dir), state)  # each restart recorded at once
    return dead


def _write_state_file(data_dir: Path, state: Mapping[str, Any]) -> None:
    path = data_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, path)


def read_state(data_dir: Path | str, missing_ok: bool = False) -> dict[str, Any] | None:
    """The state file of the cluster in ``data_dir``; ClusterStateError if absent/corrupt."""
    path = Path(data_dir) / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        if missing_ok:
            return None
        raise ClusterStateError(f"no local cluster in {data_dir} (no {STATE_FILE})") from None
    except ValueError as exc:
        raise ClusterStateError(f"{path} is corrupt: {exc}") from exc
    if not isinstance(state, dict) or not isinstance(state.get("processes"), list):
        raise ClusterStateError(f"{path} is not a Fjord state file")
    return state


def stop_from_state(data_dir: Path | str, timeout: float = STOP_TIMEOUT_S) -> list[dict[str, Any]]:
    """Stop a (detached) cluster from its state file: coordinators, brokers, controllers, then
    etcd.

    Only pids recorded in the state file are signalled. Returns the processes it stopped.
    """
    state = read_state(data_dir)
    assert state is not None
    order = {"coordinator": 0, "broker": 1, "controller": 2, "etcd": 3}
    stopped = []
    for role in sorted(order, key=order.__getitem__):
        group = [p for p in state["processes"] if p["role"] == role and pid_alive(p["pid"])]
        for p in group:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p["pid"], signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in group:
            while pid_alive(p["pid"]) and time.monotonic() < deadline:
                time.sleep(READY_POLL_INTERVAL_S)
            if pid_alive(p["pid"]):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p["pid"], signal.SIGKILL)
            stopped.append(p)
    state["processes"] = [p for p in state["processes"] if pid_alive(p["pid"])]
    state["launcher_pid"] = None
    _write_state_file(Path(data_dir), state)
    return stopped
