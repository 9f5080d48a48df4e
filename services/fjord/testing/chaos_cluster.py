"""The chaos harness's shell: run a :class:`fjord.testing.chaos.FaultPlan` against a real local
cluster while a producer writes keyed sequence numbers, then read everything back and judge it.

Only public interfaces are used: :class:`fjord.local.LocalCluster` (start, kill, restart,
Metadata probes), signals to its processes, and the ``fjord.client`` Producer, Consumer and
AdminClient. Every wait is bounded (the bounds below); the only timed sleeps are the plan's own
"stay down" and "gap" pauses and the writer's pace.

Bounds (seconds), defined here once:

- ``HEAL_TIMEOUT_S`` (30): a restarted broker re-registers and every partition has its full ISR.
- ``CONTROLLER_FAILOVER_TIMEOUT_S`` (20): a standby takes over after the active one's SIGKILL.
- ``FREEZE_EXTRA_S`` (15): beyond replica.lag.time.max.ms + the broker lease TTL, how long a
  frozen broker may take to leave every ISR before it is resumed anyway (and the miss noted).
- ``FINAL_HEAL_TIMEOUT_S`` (45): after the faults, the cluster is whole again.
- ``READ_TIMEOUT_S`` (60): reading every partition back to its end.
- ``POST_HEAL_WRITE_TIMEOUT_S`` (30): after the final heal, a record sent then is acknowledged.
- ``CLIENT_LOG_LINES`` (40): client log messages (INFO and up) copied into the timeline.
- ``FLUSH_TIMEOUT_S`` (75): the producer's last records get their outcome (its
  delivery.timeout.ms is 60 s, so every record has one by then).
- ``POLL_INTERVAL_S`` (0.1): how often conditions are checked while waiting.
- ``ETCD_REQUEST_TIMEOUT_S`` (5): one read of a broker's registration from etcd.
- ``AFTER_FAULT_WINDOW_S`` (10): how long after an etcd outage ends (or a restarted broker is
  registered) stalls are still counted: the effects of a fault (elections, re-registrations)
  come after it.
- ``TOPIC_CHANGE_TIMEOUT_S`` (30): after etcd is back, a CreateTopics must be accepted.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import logging
import os
import signal
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.errors import ConfigError, FjordError, InvalidReplicationFactorError
from fjord.local.cluster import LocalCluster
from fjord.local.etcd import ProcessStartError, log_tail
from fjord.metadata import BrokerRegistration, CoordinatorRegistration, Keys
from fjord.testing.chaos import (
    DEFAULT_FAULT_SECONDS,
    DEFAULT_KEYS,
    DEFAULT_MIN_BROKER_KILLS,
    DEFAULT_PARTITIONS,
    DEFAULT_RECORDS_PER_SECOND,
    Acked,
    DeliveryLedger,
    DeliveryReport,
    Failed,
    FaultKind,
    FaultPlan,
    PlannedFault,
    ReadRecord,
    RecordId,
    Timeline,
    encode_value,
    key_name,
    longest_gap,
    plan_faults,
    skipped_records,
    verify_delivery,
)
from fjord.testing.damage import batch_count, flip_byte_in_batch, segment_files
from fjord.testing.metrics_probe import scrape_metric
from fjord.testing.waiting import seconds_until

HEAL_TIMEOUT_S = 30.0
CONTROLLER_FAILOVER_TIMEOUT_S = 20.0
FREEZE_EXTRA_S = 15.0
FINAL_HEAL_TIMEOUT_S = 45.0
READ_TIMEOUT_S = 60.0
FLUSH_TIMEOUT_S = 75.0
POST_HEAL_WRITE_TIMEOUT_S = 30.0
CLIENT_LOG_LINES = 40
POLL_INTERVAL_S = 0.1
ETCD_REQUEST_TIMEOUT_S = 5.0
AFTER_FAULT_WINDOW_S = 10.0
TOPIC_CHANGE_TIMEOUT_S = 30.0

#: The broker setting that bounds how long a follower may lag before leaving the ISR.
REPLICA_LAG_KEY = "replica.lag.time.max.ms"
#: Its value in the chaos cluster: short, so that a frozen follower leaves the ISR quickly.
CHAOS_REPLICA_LAG_MS = 3000
#: The brokers' lease TTL in the chaos cluster (local default: 6 s): short, so that a frozen
#: broker leaves the ISR quickly when it leads (its lease expires and the controller elects
#: another). A killed broker takes its own registration back at once when it restarts.
CHAOS_BROKER_LEASE_TTL_S = 3
#: Kafka's default, assumed when the broker does not accept the key (noted in the output).
KAFKA_REPLICA_LAG_MS = 30000


class _FaultPhaseAborted(Exception):
    """The cluster did not heal after a fault: stop injecting more (a finding is recorded)."""


class _TimelineHandler(logging.Handler):
    """Copies the first ``limit`` client log messages into a runner's timeline."""

    def __init__(self, runner: ChaosRunner, limit: int) -> None:
        super().__init__(logging.INFO)
        self.runner = runner
        self.left = limit

    def emit(self, record: logging.LogRecord) -> None:
        if self.left > 0:
            self.left -= 1
            self.runner.note(f"client {record.levelname.lower()}: {record.getMessage()}")


class ReplicationUnavailableError(RuntimeError):
    """The cluster refused a replicated topic (replication not built yet)."""


@dataclass(frozen=True)
class PartitionState:
    leader: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]


def partition_states(
    cluster: LocalCluster, topic: str, ask: Iterable[int]
) -> dict[int, PartitionState] | None:
    """``topic``'s partitions as the first answering broker of ``ask`` describes them."""
    for broker_id in ask:
        response = cluster.broker_metadata(broker_id)
        if response is None:
            continue
        for t in response.topics:
            if t.name == topic and t.error.code == 0:
                return {
                    p.partition: PartitionState(p.leader, tuple(p.isr), tuple(p.replicas))
                    for p in t.partitions
                }
        return None
    return None


def _registration(cluster: LocalCluster, key: str) -> tuple[int, bytes] | None:
    """The value at ``key`` with its create revision, None when absent. Read through etcd's
    JSON gateway, so it works while processes are busy restarting."""
    encoded = base64.b64encode(key.encode()).decode()
    request = urllib.request.Request(
        f"{cluster.etcd_url}/v3/kv/range", data=json.dumps({"key": encoded}).encode(),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=ETCD_REQUEST_TIMEOUT_S) as response:
        kvs = json.loads(response.read()).get("kvs") or []
    if not kvs:
        return None
    return int(kvs[0]["create_revision"]), base64.b64decode(kvs[0]["value"])


def registered_broker(cluster: LocalCluster, broker_id: int
                      ) -> tuple[int, BrokerRegistration] | None:
    """``broker_id``'s registration in etcd with its create revision (the broker epoch), or
    None when it is not registered."""
    found = _registration(cluster, Keys(cluster.cluster_id).broker(broker_id))
    return None if found is None else (found[0], BrokerRegistration.from_json(found[1]))


def registered_coordinator(cluster: LocalCluster, coordinator_id: int
                           ) -> tuple[int, CoordinatorRegistration] | None:
    """``coordinator_id``'s registration in etcd with its create revision, or None."""
    found = _registration(cluster, Keys(cluster.cluster_id).coordinator(coordinator_id))
    return None if found is None else (found[0], CoordinatorRegistration.from_json(found[1]))


def broker_registration(cluster: LocalCluster, broker_id: int) -> int | None:
    """The create revision (broker epoch) of ``broker_id``'s registration in etcd, or None
    when it is not registered: a restarted broker answers Metadata before its new registration
    exists, so only the epoch tells that the restart has registered."""
    found = registered_broker(cluster, broker_id)
    return None if found is None else found[0]


def producer_state(producer: Producer) -> str:
    """A diagnostic snapshot of a producer's sender (private attributes, read without locks:
    for the report of a stalled producer only; never raises)."""
    try:
        sender: Any = getattr(producer, "_sender", None)
        acc: Any = getattr(producer, "_accumulator", None)
        idem: Any = getattr(acc, "idempotence", None)
        queues = {f"{tp.topic}-{tp.partition}": [(b.base_sequence, b.attempts) for b in q][:3]
                  for tp, q in getattr(acc, "_queues", {}).items() if q}
        parts = [
            f"in_flight={getattr(sender, 'in_flight', '?')}",
            f"requests={len(getattr(sender, '_requests', ()))}",
            f"init_task={getattr(sender, '_init_task', None)!r}"[:120],
            f"queued heads (base_sequence, attempts)={queues}",
        ]
        if idem is not None:
            unacked = {f"{tp.topic}-{tp.partition}": v[:5] for tp, v in idem.unacked.items()}
            parts.append(f"producer_id={idem.producer_id} epoch={idem.producer_epoch} "
                         f"bump_needed={idem.bump_needed} unacked={unacked}")
        return ", ".join(parts)
    except Exception as exc:  # diagnostics must not hide the finding itself
        return f"(unavailable: {exc!r})"


def chaos_cluster(data_dir: Path, replica_lag_ms: int = CHAOS_REPLICA_LAG_MS,
                  min_insync_replicas: int = 2,
                  broker_lease_ttl_s: int = CHAOS_BROKER_LEASE_TTL_S,
                  **kwargs: Any) -> tuple[LocalCluster, int]:
    """A (not yet started) 3-broker LocalCluster for chaos runs, and the replica lag time in
    ms that applies to it (the launcher's or Kafka's default when the brokers do not accept
    the setting)."""
    config = {"min.insync.replicas": str(min_insync_replicas), REPLICA_LAG_KEY: str(replica_lag_ms)}
    try:
        return LocalCluster(data_dir, brokers=3, config=config,
                            broker_lease_ttl_s=broker_lease_ttl_s, **kwargs), replica_lag_ms
    except ConfigError:
        del config[REPLICA_LAG_KEY]
        cluster = LocalCluster(data_dir, brokers=3, config=config,
                               broker_lease_ttl_s=broker_lease_ttl_s, **kwargs)
        return cluster, int(cluster.broker_config.get(REPLICA_LAG_KEY, KAFKA_REPLICA_LAG_MS))


@dataclass(frozen=True)
class ChaosSettings:
    """One chaos run's knobs (defaults: :mod:`fjord.testing.chaos`)."""

    seed: int
    fault_seconds: float = DEFAULT_FAULT_SECONDS
    min_broker_kills: int = DEFAULT_MIN_BROKER_KILLS
    keys: int = DEFAULT_KEYS
    records_per_second: int = DEFAULT_RECORDS_PER_SECOND
    partitions: int = DEFAULT_PARTITIONS
    replication_factor: int = 3
    min_insync_replicas: int = 2
    topic: str = "chaos"
    replica_lag_ms: int = CHAOS_REPLICA_LAG_MS
    #: The topic's segment.bytes (None: the default); small for the corruption scenario, so
    #: every partition has closed segments to damage.
    segment_bytes: int | None = None


@dataclass
class ChaosResult:
    """What a run did and found. ``findings`` are problems other than the delivery verdict
    (processes that died by themselves, heals that did not happen in time, ...)."""

    settings: ChaosSettings
    plan: FaultPlan
    idempotent: bool
    report: DeliveryReport
    timeline: Timeline
    faults: Counter[str] = field(default_factory=Counter)
    findings: list[str] = field(default_factory=list)
    fault_phase_s: float = 0.0
    #: (what, seconds): the longest write stall (no acknowledgement) and read stall (nothing
    #: returned to the tailing consumer) of each etcd outage or fast restart, and recovery times.
    figures: list[tuple[str, float]] = field(default_factory=list)
    #: (partition, offset) of records the tailing consumer's position passed without returning
    #: them (None: no tailing consumer in this run).
    skipped: list[tuple[int, int]] | None = None

    def figure(self, prefix: str) -> list[float]:
        """Every figure whose name starts with ``prefix``."""
        return [v for name, v in self.figures if name.startswith(prefix)]

    def render(self) -> str:
        producer = ("idempotent producer (enable.idempotence=true)" if self.idempotent else
                    "producer WITHOUT idempotence (not available), max.in.flight=1")
        return "\n".join([
            f"chaos run: seed {self.settings.seed} (replay: FJORD_CHAOS_SEED="
            f"{self.settings.seed}), {self.settings.partitions} partitions, RF "
            f"{self.settings.replication_factor}, min.insync.replicas "
            f"{self.settings.min_insync_replicas}, acks=all, {producer}, "
            f"replica.lag.time.max.ms {self.settings.replica_lag_ms}",
            f"faults in {self.fault_phase_s:.1f} s: " + ", ".join(
                f"{k} x{n}" for k, n in sorted(self.faults.items())),
            "timeline:",
            self.timeline.render(),
            "verdict:",
            self.report.summary(),
            *([] if self.skipped is None else [
                f"tailing consumer: skipped {len(self.skipped)} records"
                + (f" (first 10: {self.skipped[:10]})" if self.skipped else "")]),
            *(f"figure: {name}: {value:.2f} s" for name, value in self.figures),
            *(f"finding: {f}" for f in self.findings),
        ])


class ChaosRunner:
    """Runs one chaos experiment on a started cluster that nobody else uses.

    Invariants: at most one broker is down or frozen at any time (the plan's faults run one
    after the other), so min.insync.replicas=2 of 3 can be met whenever the cluster has healed;
    every process it stopped is running again when :meth:`run` returns (or raises).
    """

    def __init__(self, cluster: LocalCluster, settings: ChaosSettings,
                 log: Callable[[str], None] = print, plan: FaultPlan | None = None,
                 tail: bool = False) -> None:
        """``plan``: the faults (default: the seeded kill/freeze/controller plan);
        ``tail``: a consumer reads the topic all along (its stalls and skips are reported)."""
        self.cluster = cluster
        self.settings = settings
        self.log = log
        self.plan = plan or plan_faults(settings.seed, cluster.num_brokers,
                                        settings.partitions, settings.min_broker_kills)
        self.figures: list[tuple[str, float]] = []
        # Monotonic times of acknowledgements (all, and per partition) and of records the
        # tailing consumer returned; appended from client threads (list.append is atomic).
        self._ack_times: list[float] = []
        self._ack_times_by_partition: dict[int, list[float]] = defaultdict(list)
        self._tail = tail
        self._tail_times: list[float] = []
        self._tail_returned: list[tuple[int, int]] = []
        self._tail_positions: dict[int, int] = {}
        self._stop_tail = threading.Event()
        self.timeline = Timeline()
        self.ledger = DeliveryLedger()
        self.faults: Counter[str] = Counter()
        self.findings: list[str] = []
        self.unavailable: set[int] = set()  # brokers down or frozen right now
        self._start = time.monotonic()
        self._stop_writer = threading.Event()
        self._writer_error: BaseException | None = None
        self._sent_index = 0  # how many records the writer has sent (1-based index of the last)
        self._max_acked_index = 0  # the highest such index acknowledged so far
        self.idempotent = False

    # -- helpers --------------------------------------------------------------------------------

    def note(self, what: str) -> None:
        at = time.monotonic() - self._start
        self.timeline.add(at, what)
        self.log(f"[chaos {at:7.2f} s] {what}")

    def _brokers(self) -> list[int]:
        return sorted(self.cluster.broker_addresses)

    def states(self) -> dict[int, PartitionState] | None:
        ask = [b for b in self._brokers() if b not in self.unavailable]
        return partition_states(self.cluster, self.settings.topic, ask)

    def healthy(self) -> bool:
        """Every running broker sees every partition led, with its full replica set in ISR."""
        for broker_id in self._brokers():
            if broker_id in self.unavailable:
                return False
            states = partition_states(self.cluster, self.settings.topic, [broker_id])
            if states is None or len(states) != self.settings.partitions:
                return False
            for state in states.values():
                if state.leader < 0 or set(state.isr) != set(state.replicas):
                    return False
        return True

    def _check_processes(self) -> None:
        """A broker or controller that exited without our signal is a finding; restart it."""
        for info in self.cluster.processes():
            if info.role == "etcd" or (info.role == "broker" and info.id in self.unavailable):
                continue
            proc = self.cluster.process(info.role, info.id)
            if proc.poll() is not None:
                finding = f"{info.role} {info.id} exited by itself with {proc.returncode}"
                self.findings.append(finding)
                self.note(finding + "; restarting it")
                self._restart(info.role, info.id)

    def _restart(self, role: str, node_id: int, wait: bool = True) -> bool:
        """Start a stopped process again; a failure to start is a finding (with its log)."""
        try:
            if role == "broker":
                self.cluster.start_broker(node_id, wait=wait)
            else:
                self.cluster.start_controller(node_id, wait=wait)
        except ProcessStartError as exc:
            finding = f"{role} {node_id} failed to start again: {exc}"
            self.findings.append(finding)
            self.note(finding)
            return False
        return True

    def _wait_healed(self, after: str, timeout_s: float = HEAL_TIMEOUT_S) -> None:
        """Wait until every ISR is full again; if that does not happen in time, it is a
        finding and the fault phase ends (more faults on a broken cluster would only bury it)."""
        took = seconds_until(self.healthy, timeout_s, interval=POLL_INTERVAL_S)
        if took is None:
            finding = f"not healed {timeout_s:.0f} s after {after}: {self.states()}"
            self.findings.append(finding)
            self.note(finding)
            raise _FaultPhaseAborted(finding)
        self.note(f"healed (full ISR everywhere) {took:.1f} s after {after}")

    # -- the writer -----------------------------------------------------------------------------

    def _producer(self) -> Producer:
        base: dict[str, Any] = {
            "bootstrap.servers": self.cluster.bootstrap_servers,
            "acks": "all",
            "linger.ms": 5,
            "request.timeout.ms": 10000,
            "delivery.timeout.ms": 60000,
            "client.id": "chaos-writer",
        }
        try:
            producer = Producer({**base, "enable.idempotence": True,
                                 "max.in.flight.requests.per.connection": 5})
            self.idempotent = True
            return producer
        except ConfigError as exc:
            self.note(f"idempotent producer refused ({exc}); acks=all without it, "
                      "max.in.flight.requests.per.connection=1 to keep per-key order")
            return Producer({**base, "max.in.flight.requests.per.connection": 1})

    def _settle(self, record: RecordId, index: int, future: Any) -> None:
        error = future.exception()
        if error is not None:
            self.ledger.settle(record, Failed(repr(error)))
        else:
            meta = future.result()
            now = time.monotonic()
            self._ack_times.append(now)
            self._ack_times_by_partition[meta.partition].append(now)
            self.ledger.settle(record, Acked(meta.partition, meta.offset))
            if index > self._max_acked_index:
                self._max_acked_index = index

    def _write(self, producer: Producer) -> None:
        settings = self.settings
        interval = 1.0 / settings.records_per_second
        seqs = [0] * settings.keys
        due = time.monotonic()
        i = 0
        try:
            while not self._stop_writer.is_set():
                now = time.monotonic()
                if now < due:
                    self._stop_writer.wait(due - now)
                    continue
                # Falling far behind (send blocked): resume the pace instead of bursting.
                due = max(due, now - 1.0) + interval
                index = i % settings.keys
                i += 1
                self._sent_index = i
                seqs[index] += 1
                key = key_name(index)
                record = (key, seqs[index])
                self.ledger.sent(record)
                try:
                    future = producer.send(settings.topic, value=encode_value(*record), key=key)
                except FjordError as exc:
                    self.ledger.settle(record, Failed(f"send(): {exc!r}"))
                    continue
                future.add_done_callback(functools.partial(self._settle, record, i))
        except BaseException as exc:  # surfaced by run()
            self._writer_error = exc

    # -- faults ---------------------------------------------------------------------------------

    def _kill_broker(self, step: PlannedFault) -> None:
        states = self.states() or {}
        if step.leader_of >= 0:
            leader = states[step.leader_of].leader if step.leader_of in states else -1
            target = leader if leader >= 0 else step.leader_of % self.cluster.num_brokers
            why = f"leader of p{step.leader_of}" if leader >= 0 else "p's leader unknown"
        else:
            target, why = step.broker, "by number"
        led = sorted(p for p, s in states.items() if s.leader == target)
        epoch = broker_registration(self.cluster, target)
        self.cluster.kill("broker", target)
        self.unavailable.add(target)
        self.faults["broker SIGKILL"] += 1
        self.note(f"SIGKILL broker {target} ({why}; led {[f'p{p}' for p in led]})")
        time.sleep(step.down_s)  # the plan's "stay down" time
        self.cluster.start_broker(target, wait=False)
        try:
            registered = seconds_until(lambda: self._registered(target, epoch), HEAL_TIMEOUT_S,
                                       interval=POLL_INTERVAL_S)
        except ProcessStartError as exc:
            self.findings.append(str(exc))
            self.note(str(exc))
            raise
        finally:
            self.unavailable.discard(target)
        if registered is None:
            self.note(f"broker {target} restarted but not registered in {HEAL_TIMEOUT_S:.0f} s")
            return
        self.note(f"broker {target} restarted, registered with a new epoch {registered:.1f} s "
                  "later")
        self._wait_healed(f"broker {target}'s restart")

    def _registered(self, broker_id: int, old_epoch: int | None) -> bool:
        proc = self.cluster.process("broker", broker_id)
        if proc.poll() is not None:
            raise ProcessStartError(
                f"broker {broker_id} exited with {proc.returncode} during its restart:\n"
                + log_tail(self.cluster.logs_dir / f"broker-{broker_id}.log")
            )
        epoch = broker_registration(self.cluster, broker_id)
        return epoch is not None and epoch != old_epoch

    def _kill_controller(self) -> None:
        active = self.cluster.active_controller()
        if active is None:
            self.note("no active controller to kill (skipped)")
            return
        self.cluster.kill("controller", active)
        self.faults["controller SIGKILL"] += 1
        self.note(f"SIGKILL active controller {active}")
        took = seconds_until(lambda: self.cluster.active_controller() not in (None, active),
                             CONTROLLER_FAILOVER_TIMEOUT_S, interval=POLL_INTERVAL_S)
        if took is None:
            self.findings.append(f"no controller took over within "
                                 f"{CONTROLLER_FAILOVER_TIMEOUT_S:.0f} s")
            self.note("no controller took over in time")
        else:
            self.note(f"controller {self.cluster.active_controller()} active {took:.1f} s later")
        # Not waited for: a controller's start-up takes seconds on a loaded machine and the
        # next faults do not need it (the final heal checks it is still running).
        if self._restart("controller", active, wait=False):
            self.note(f"controller {active} restarting (standby)")

    def _freeze_broker(self, step: PlannedFault) -> None:
        target = step.broker
        pid = self.cluster.process("broker", target).pid
        states = self.states() or {}
        led = sorted(p for p, s in states.items() if s.leader == target)
        lag_s = self.settings.replica_lag_ms / 1000
        os.kill(pid, signal.SIGSTOP)
        self.unavailable.add(target)
        self.faults["broker SIGSTOP"] += 1
        self.note(f"SIGSTOP broker {target} (led {[f'p{p}' for p in led]}; "
                  f"replica.lag.time.max.ms {self.settings.replica_lag_ms})")
        try:
            start = time.monotonic()

            def left_every_isr() -> bool:
                if time.monotonic() - start < lag_s + 1.0:
                    return False
                now = self.states()
                return now is not None and all(target not in s.isr for s in now.values())

            took = seconds_until(left_every_isr, lag_s + self.cluster.broker_lease_ttl_s +
                                 FREEZE_EXTRA_S, interval=POLL_INTERVAL_S)
            if took is None:
                held = time.monotonic() - start
                finding = f"frozen broker {target} still in some ISR after {held:.1f} s"
                self.findings.append(finding)
                self.note(finding)
            else:
                self.note(f"broker {target} out of every ISR; frozen {took:.1f} s")
        finally:
            os.kill(pid, signal.SIGCONT)
            self.unavailable.discard(target)
        self.note(f"SIGCONT broker {target}")
        self._wait_healed(f"broker {target}'s resume")

    def _stalls(self, what: str, start: float, end: float) -> None:
        """Record the longest write stall (and read stall, with a tailing consumer) of
        [start, end] as figures."""
        write = longest_gap(self._ack_times, start, end)
        self.figures.append((f"{what}: longest write stall", write))
        text = f"{what}: longest write stall {write:.2f} s"
        if self._tail:
            read = longest_gap(self._tail_times, start, end)
            self.figures.append((f"{what}: longest read stall", read))
            text += f", longest read stall {read:.2f} s"
        self.note(text)

    def _etcd_outage(self, step: PlannedFault) -> None:
        """SIGSTOP etcd for the step's time under load, SIGCONT; then metadata changes must
        complete again (a topic is created), and stalls are measured up to
        AFTER_FAULT_WINDOW_S after the outage (leases expired meanwhile take effect then)."""
        etcd = self.cluster.etcd.process
        assert etcd is not None
        start = time.monotonic()
        os.kill(etcd.pid, signal.SIGSTOP)
        self.faults["etcd SIGSTOP"] += 1
        self.note(f"SIGSTOP etcd for {step.down_s:.0f} s")
        try:
            time.sleep(step.down_s)  # the plan's outage time
        finally:
            os.kill(etcd.pid, signal.SIGCONT)
        resumed = time.monotonic()
        self.note("SIGCONT etcd")
        topic = f"{self.settings.topic}-after-outage-{self.faults['etcd SIGSTOP']}"

        def created() -> bool:
            with AdminClient({"bootstrap.servers": self.cluster.bootstrap_servers,
                              "default.api.timeout.ms": 5000}) as admin:
                try:
                    admin.create_topics([NewTopic(topic, 1, self.settings.replication_factor)])
                except FjordError as exc:
                    return "already exists" in str(exc)
            return True

        took = seconds_until(created, TOPIC_CHANGE_TIMEOUT_S, interval=POLL_INTERVAL_S)
        if took is None:
            finding = f"no topic could be created {TOPIC_CHANGE_TIMEOUT_S:.0f} s after etcd " \
                      "came back"
            self.findings.append(finding)
            self.note(finding)
        else:
            self.figures.append(("etcd outage: topic created after etcd came back", took))
            self.note(f"topic {topic} created {took:.1f} s after etcd came back")
        time.sleep(max(0.0, resumed + AFTER_FAULT_WINDOW_S - time.monotonic()))  # the window
        self._stalls(f"etcd outage of {step.down_s:.0f} s", start, resumed + AFTER_FAULT_WINDOW_S)
        self._wait_healed("etcd's return")

    def _restart_broker(self, step: PlannedFault) -> None:
        """SIGKILL the leader of the step's partition and start it again at once: it must be
        registered again and the partitions it led take acknowledged writes again soon."""
        states = self.states() or {}
        leader = states[step.leader_of].leader if step.leader_of in states else -1
        target = leader if leader >= 0 else step.leader_of % self.cluster.num_brokers
        led = sorted(p for p, s in states.items() if s.leader == target)
        epoch = broker_registration(self.cluster, target)
        self.cluster.kill("broker", target)
        killed = time.monotonic()
        self.faults["broker fast restart"] += 1
        self.note(f"SIGKILL broker {target} (led {[f'p{p}' for p in led]}) and start it again")
        self.unavailable.add(target)
        try:
            self.cluster.start_broker(target, wait=False)
            registered = seconds_until(lambda: self._registered(target, epoch), HEAL_TIMEOUT_S,
                                       interval=POLL_INTERVAL_S)
        except ProcessStartError as exc:
            self.findings.append(str(exc))
            self.note(str(exc))
            raise
        finally:
            self.unavailable.discard(target)
        if registered is None:
            finding = f"broker {target} not registered {HEAL_TIMEOUT_S:.0f} s after its restart"
            self.findings.append(finding)
            self.note(finding)
            return
        self.figures.append(("fast restart: registered again after the kill",
                             time.monotonic() - killed))
        self.note(f"broker {target} registered again {time.monotonic() - killed:.1f} s after "
                  "the kill")

        def led_partitions_write() -> bool:
            return all(any(t > killed for t in self._ack_times_by_partition[p]) for p in led)

        took = seconds_until(led_partitions_write, HEAL_TIMEOUT_S, interval=POLL_INTERVAL_S)
        if took is not None:
            first = max(min(t for t in self._ack_times_by_partition[p] if t > killed)
                        for p in led) if led else killed
            self.figures.append(("fast restart: first acknowledged write on every partition "
                                 "it led after the kill", first - killed))
            self.note(f"every partition broker {target} led took writes again "
                      f"{first - killed:.2f} s after the kill")
        self._wait_healed(f"broker {target}'s fast restart")
        self._stalls(f"fast restart of broker {target}", killed,
                     min(time.monotonic(), killed + AFTER_FAULT_WINDOW_S))

    def _broker_metric(self, broker_id: int, name: str) -> float:
        """The sum of a broker's metric samples named ``name`` (0 when unreachable)."""
        try:
            return scrape_metric(self.cluster.metrics_address("broker", broker_id), name,
                                 timeout=ETCD_REQUEST_TIMEOUT_S)
        except OSError:
            return 0.0

    def _corrupt_segment(self, step: PlannedFault) -> None:
        """Stop the leader of the step's partition cleanly (SIGTERM), flip a byte inside a batch
        of a closed segment of its copy, start it again. Figures: how soon after the restart
        the broker found the damage and had its copy repaired, and the full heal."""
        states = self.states() or {}
        leader = states[step.leader_of].leader if step.leader_of in states else -1
        target = leader if leader >= 0 else step.leader_of % self.cluster.num_brokers
        self.unavailable.add(target)
        try:
            self.cluster.kill("broker", target, signal.SIGTERM)
            self.cluster.process("broker", target).wait(HEAL_TIMEOUT_S)
            directory = (self.cluster.data_dir / "brokers" / str(target) /
                         f"{self.settings.topic}-{step.leader_of}")
            segments = segment_files(directory)
            victim = segments[-2] if len(segments) >= 2 else segments[-1]
            # Its second batch, or its only one: a closed segment may hold a single batch (a
            # producer blocked on its in-flight window during a fault grows one batch, up to
            # 512 KiB, larger than a chaos segment).
            flipped = flip_byte_in_batch(victim, min(1, batch_count(victim) - 1))
            self.faults["segment corruption"] += 1
            self.note(f"stopped broker {target} (leader of p{step.leader_of}); flipped a byte in "
                      f"batch {flipped.base_offset}..{flipped.next_offset - 1} of "
                      f"{victim.name}{'' if len(segments) >= 2 else ' (the active segment)'}")
            self.cluster.start_broker(target)
        except ProcessStartError as exc:
            self.findings.append(str(exc))
            self.note(str(exc))
            raise
        finally:
            self.unavailable.discard(target)
        started = time.monotonic()
        found = seconds_until(
            lambda: self._broker_metric(target, "fjord_broker_log_damage_found_total") >= 1,
            HEAL_TIMEOUT_S, interval=POLL_INTERVAL_S)
        if found is None:
            finding = f"broker {target} did not find the damage {HEAL_TIMEOUT_S:.0f} s after " \
                      "its restart"
            self.findings.append(finding)
            self.note(finding)
        else:
            self.figures.append(("corruption: damage found after it registered again", found))
            repaired = seconds_until(
                lambda: self._broker_metric(target, "fjord_broker_log_damage_repaired_total")
                >= 1, HEAL_TIMEOUT_S, interval=POLL_INTERVAL_S)
            if repaired is None:
                finding = f"broker {target} did not repair its copy {HEAL_TIMEOUT_S:.0f} s " \
                          "after its restart"
                self.findings.append(finding)
                self.note(finding)
            else:
                took = time.monotonic() - started
                self.figures.append(("corruption: copy repaired after it registered again", took))
                self.note(f"broker {target} found the damage {found:.2f} s and repaired its "
                          f"copy {took:.2f} s after it registered again")
        self._wait_healed(f"broker {target}'s repair")
        self.figures.append(("corruption: every ISR full again after it registered again",
                             time.monotonic() - started))

    # -- the tailing consumer -------------------------------------------------------------------

    def _tail_topic(self) -> None:
        """Read the topic as it is written (from the start), noting what was returned when."""
        topic = self.settings.topic
        tps = [TopicPartition(topic, p) for p in range(self.settings.partitions)]
        try:
            with Consumer({"bootstrap.servers": self.cluster.bootstrap_servers,
                           "auto.offset.reset": "earliest",
                           "client.id": "chaos-tail"}) as consumer:
                consumer.assign(tps)
                while not self._stop_tail.is_set():
                    try:
                        records = consumer.poll(0.2)
                    except FjordError as exc:  # named partition and offset: a finding
                        self.findings.append(f"tailing consumer: {exc}")
                        self.note(f"tailing consumer: {exc}")
                        continue
                    now = time.monotonic()
                    for r in records:
                        self._tail_returned.append((r.partition, r.offset))
                        self._tail_times.append(now)
                for tp in tps:
                    self._tail_positions[tp.partition] = consumer.position(tp)
        except BaseException as exc:  # surfaced as a finding by run()
            self.findings.append(f"tailing consumer failed: {exc!r}")

    # -- the run --------------------------------------------------------------------------------

    def create_topic(self) -> None:
        with AdminClient({"bootstrap.servers": self.cluster.bootstrap_servers}) as admin:
            try:
                admin.create_topics([NewTopic(
                    self.settings.topic, self.settings.partitions,
                    self.settings.replication_factor,
                    {"min.insync.replicas": str(self.settings.min_insync_replicas),
                     **({} if self.settings.segment_bytes is None else
                        {"segment.bytes": str(self.settings.segment_bytes)})},
                )])
            except InvalidReplicationFactorError as exc:
                raise ReplicationUnavailableError(str(exc)) from exc
        took = seconds_until(self.healthy, HEAL_TIMEOUT_S, interval=POLL_INTERVAL_S)
        if took is None:
            raise RuntimeError(f"topic {self.settings.topic} not fully replicated in "
                               f"{HEAL_TIMEOUT_S:.0f} s: {self.states()}")
        self.note(f"topic {self.settings.topic} created, every ISR full after {took:.1f} s")

    def run(self) -> ChaosResult:
        client_log = logging.getLogger("fjord.client")
        handler = _TimelineHandler(self, CLIENT_LOG_LINES)
        old_level = client_log.level
        client_log.addHandler(handler)
        client_log.setLevel(logging.INFO)
        try:
            return self._run()
        finally:
            client_log.removeHandler(handler)
            client_log.setLevel(old_level)

    def _run(self) -> ChaosResult:
        self._start = time.monotonic()
        self.log(self.plan.describe())
        self.create_topic()
        producer = self._producer()
        writer = threading.Thread(target=self._write, args=(producer,), name="chaos-writer",
                                  daemon=True)
        writer.start()
        self.note("writer started")
        tail = threading.Thread(target=self._tail_topic, name="chaos-tail", daemon=True)
        if self._tail:
            tail.start()
            self.note("tailing consumer started")
        fault_start = time.monotonic()
        try:
            self._run_faults(fault_start)
        except (ProcessStartError, _FaultPhaseAborted) as exc:
            # Already a finding; carry on to healing and the verdict on what was written.
            self.note(f"fault phase aborted: {str(exc).splitlines()[0]}")
        finally:
            fault_phase_s = time.monotonic() - fault_start
            self._heal_everything()
        self._check_writes_resume(producer)
        self._stop_writer.set()
        writer.join(30)
        sent, acked, failed = self.ledger.counts()
        self.note(f"writer stopped: sent {sent}, acknowledged {acked}, failed {failed} so far")
        try:
            producer.flush(timeout=FLUSH_TIMEOUT_S)
        except FjordError as exc:
            self.findings.append(f"producer flush did not finish: {exc}")
        producer.close(timeout=10)
        sent, acked, failed = self.ledger.counts()
        self.note(f"producer closed: sent {sent}, acknowledged {acked}, failed {failed}")
        if self._writer_error is not None:
            self.findings.append(f"writer thread failed: {self._writer_error!r}")
        try:
            records = self.read_back()
        except FjordError as exc:
            # Without the whole log the verdict would call everything lost: the finding
            # (checked first by the test) says what really happened.
            records = []
            finding = f"reading back failed, the verdict below is not meaningful: {exc}"
            self.findings.append(finding)
            self.note(finding)
        report = verify_delivery(self.ledger.outcomes(), records)
        skipped = None
        if self._tail:
            self._stop_tail.set()
            tail.join(30)
            skipped = skipped_records(self._tail_returned, self._tail_positions,
                                      [(r.partition, r.offset) for r in records])
        self.note("verified")
        return ChaosResult(self.settings, self.plan, self.idempotent, report, self.timeline,
                           self.faults, self.findings, fault_phase_s, list(self.figures),
                           skipped)

    def _check_writes_resume(self, producer: Producer) -> None:
        """A healed cluster must take writes: a record sent now is acknowledged soon."""
        since = self._sent_index
        took = seconds_until(lambda: self._max_acked_index > since, POST_HEAL_WRITE_TIMEOUT_S,
                             interval=POLL_INTERVAL_S)
        if took is None:
            finding = (f"no record sent after the final heal was acknowledged within "
                       f"{POST_HEAL_WRITE_TIMEOUT_S:.0f} s ({self._sent_index - since} sent); "
                       f"producer state: {producer_state(producer)}")
            self.findings.append(finding)
            self.note(finding)
        else:
            self.note(f"writes acknowledged again {took:.1f} s after the final heal")

    def _run_faults(self, fault_start: float) -> None:
        hard_limit = self.settings.fault_seconds * 2.5
        for index, step in enumerate(self.plan.steps):
            elapsed = time.monotonic() - fault_start
            if index >= self.plan.required and elapsed >= self.settings.fault_seconds:
                break
            if elapsed > hard_limit:
                self.findings.append(f"only {index} of {self.plan.required} required faults "
                                     f"ran within {hard_limit:.0f} s")
                break
            time.sleep(step.gap_s)  # the plan's pause between faults
            self._check_processes()
            if step.kind is FaultKind.KILL_BROKER:
                self._kill_broker(step)
            elif step.kind is FaultKind.KILL_CONTROLLER:
                self._kill_controller()
            elif step.kind is FaultKind.ETCD_OUTAGE:
                self._etcd_outage(step)
            elif step.kind is FaultKind.RESTART_BROKER:
                self._restart_broker(step)
            elif step.kind is FaultKind.CORRUPT_SEGMENT:
                self._corrupt_segment(step)
            else:
                self._freeze_broker(step)

    def _heal_everything(self) -> None:
        for broker_id in self._brokers():
            proc = self.cluster.process("broker", broker_id)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
        self.unavailable.clear()
        self._check_processes()
        took = seconds_until(self.healthy, FINAL_HEAL_TIMEOUT_S, interval=POLL_INTERVAL_S)
        if took is None:
            finding = f"cluster not healed {FINAL_HEAL_TIMEOUT_S:.0f} s after the faults: " \
                      f"{self.states()}"
            self.findings.append(finding)
            self.note(finding)
        else:
            self.note(f"faults over; cluster healed after {took:.1f} s")

    def read_back(self) -> list[ReadRecord]:
        """Every record of every partition from the beginning to the current end."""
        topic = self.settings.topic
        tps = [TopicPartition(topic, p) for p in range(self.settings.partitions)]
        records: list[ReadRecord] = []
        with Consumer({"bootstrap.servers": self.cluster.bootstrap_servers,
                       "auto.offset.reset": "earliest", "client.id": "chaos-reader"}) as consumer:
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            starts = consumer.beginning_offsets(tps)
            ends = consumer.end_offsets(tps)
            if any(starts[tp] != 0 for tp in tps):
                self.findings.append(f"log start offsets moved: {starts}")
            deadline = time.monotonic() + READ_TIMEOUT_S
            remaining = {tp for tp in tps if ends[tp] > 0}
            while remaining:
                if time.monotonic() > deadline:
                    stuck = {str(tp): consumer.position(tp) for tp in remaining}
                    self.findings.append(
                        f"read did not reach the end in {READ_TIMEOUT_S:.0f} s: {stuck}, "
                        f"ends {ends}"
                    )
                    break
                for r in consumer.poll(0.5):
                    if r.offset < ends[TopicPartition(r.topic, r.partition)]:
                        records.append(ReadRecord(r.partition, r.offset, r.value))
                remaining = {tp for tp in remaining if consumer.position(tp) < ends[tp]}
        self.note(f"read back {len(records)} records up to the high watermarks "
                  f"{[ends[tp] for tp in tps]}")
        return records
