"""The pure core of the chaos harness: the fault plan, the delivery ledger and the verdict.

No processes, sockets or clocks here (callers pass times in): :mod:`fjord.testing.chaos_cluster`
runs a plan against a real :class:`fjord.local.LocalCluster`, feeding the ledger from producer
callbacks, and hands what a consumer read back to :func:`verify_delivery`.

Workload: ``keys`` keys (``k00``, ``k01``, ...), each with its own sequence number starting at 1;
record value = ``b"<key>:<seq>"``. Keyed records of one key land in one partition, so the
order of a key's records in that partition is the order they were produced in.

Defaults (every one used by the chaos test and documented in docs/chaos.md):

- ``DEFAULT_FAULT_SECONDS`` (65 s): how long faults are injected (at least; the minimum fault
  count below is always completed).
- ``DEFAULT_MIN_BROKER_KILLS`` (10): SIGKILLs of brokers per run.
- ``DEFAULT_KEYS`` (20): keys written, each with increasing sequence numbers.
- ``DEFAULT_RECORDS_PER_SECOND`` (300): the writer's pace; enough records to make every fault
  hit in-flight batches, few enough that the final read is quick on a shared 2-core machine.
- ``DEFAULT_PARTITIONS`` (6): partitions of the chaos topic (each broker leads two).
- ``KILL_DOWN_S`` ((0.2, 1.5) s): how long a killed broker stays down before its restart
  (it takes its own registration back at once, see docs/broker.md).
- ``GAP_S`` ((0.3, 1.5) s): pause between two faults.
- ``LEADER_TARGET_PROBABILITY`` (0.7): chance that a kill aims at "the leader of partition p"
  rather than at a broker picked by number.
"""

from __future__ import annotations

import random
import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

DEFAULT_FAULT_SECONDS = 65.0
DEFAULT_MIN_BROKER_KILLS = 10
DEFAULT_KEYS = 20
DEFAULT_RECORDS_PER_SECOND = 300
DEFAULT_PARTITIONS = 6
KILL_DOWN_S = (0.2, 1.5)
GAP_S = (0.3, 1.5)
LEADER_TARGET_PROBABILITY = 0.7
# Failed records are grouped by the first this many characters of their error.
REASON_CHARS = 160
# Extra broker kills planned after the required ones, used while fault time remains.
_SPARE_KILLS = 30


class FaultKind(StrEnum):
    """What one step of the plan does."""

    KILL_BROKER = "kill-broker"  # SIGKILL, stay down, restart on the same port and data
    KILL_CONTROLLER = "kill-controller"  # SIGKILL the active controller, restart it later
    FREEZE_BROKER = "freeze-broker"  # SIGSTOP until it left every ISR, then SIGCONT
    ETCD_OUTAGE = "etcd-outage"  # SIGSTOP etcd for down_s, then SIGCONT
    RESTART_BROKER = "restart-broker"  # SIGKILL a broker and start it again at once
    CORRUPT_SEGMENT = "corrupt-segment"  # stop a leader, flip a byte in a closed segment, start


@dataclass(frozen=True, slots=True)
class PlannedFault:
    """One step of a fault plan.

    ``broker`` is the broker to hit (KILL_BROKER aimed by number, FREEZE_BROKER), else -1;
    ``leader_of`` is the partition whose leader at that moment is killed, else -1 (exactly one
    of the two is set for KILL_BROKER, neither for KILL_CONTROLLER). ``down_s`` is how long a
    killed process stays down before its restart; ``gap_s`` the pause before this step.
    """

    kind: FaultKind
    broker: int = -1
    leader_of: int = -1
    down_s: float = 0.0
    gap_s: float = 0.0

    def describe(self) -> str:
        if self.kind is FaultKind.KILL_CONTROLLER:
            return "SIGKILL the active controller"
        if self.kind is FaultKind.FREEZE_BROKER:
            return f"SIGSTOP broker {self.broker} until it left every ISR"
        if self.kind is FaultKind.ETCD_OUTAGE:
            return f"SIGSTOP etcd for {self.down_s:.0f} s"
        if self.kind is FaultKind.CORRUPT_SEGMENT:
            return (f"stop the leader of p{self.leader_of}, flip a byte in a closed segment of "
                    "its copy, start it again")
        if self.kind is FaultKind.RESTART_BROKER:
            target = f"the leader of p{self.leader_of}" if self.leader_of >= 0 else (
                f"broker {self.broker}")
            return f"SIGKILL {target} and start it again at once"
        target = f"the leader of p{self.leader_of}" if self.leader_of >= 0 else (
            f"broker {self.broker}"
        )
        return f"SIGKILL {target}, down {self.down_s:.1f} s"


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """A seeded, replayable sequence of faults.

    Invariants: the first ``required`` steps hold at least ``min_broker_kills`` broker kills,
    exactly one controller kill and exactly one freeze; the steps after them are spare broker
    kills, used only while fault time remains. Same arguments, same plan.
    """

    seed: int
    steps: tuple[PlannedFault, ...]
    required: int

    def describe(self) -> str:
        lines = [f"fault plan (seed {self.seed}), {self.required} required steps:"]
        for i, step in enumerate(self.steps[: self.required]):
            lines.append(f"  {i + 1:2d}. after {step.gap_s:.1f} s: {step.describe()}")
        lines.append(f"  then up to {len(self.steps) - self.required} spare broker kills")
        return "\n".join(lines)


def plan_faults(
    seed: int,
    brokers: int,
    partitions: int,
    min_broker_kills: int = DEFAULT_MIN_BROKER_KILLS,
) -> FaultPlan:
    """The fault plan for ``seed``: broker kills with one freeze and one controller kill placed
    among the first ones (never first, so the cluster is under load when they come)."""
    if brokers < 1 or partitions < 1 or min_broker_kills < 0:
        raise ValueError("need at least one broker and one partition")
    rng = random.Random(seed)

    def kill() -> PlannedFault:
        down = round(rng.uniform(*KILL_DOWN_S), 2)
        gap = round(rng.uniform(*GAP_S), 2)
        if rng.random() < LEADER_TARGET_PROBABILITY:
            return PlannedFault(FaultKind.KILL_BROKER, leader_of=rng.randrange(partitions),
                                down_s=down, gap_s=gap)
        return PlannedFault(FaultKind.KILL_BROKER, broker=rng.randrange(brokers), down_s=down,
                            gap_s=gap)

    steps = [kill() for _ in range(min_broker_kills)]
    freeze = PlannedFault(FaultKind.FREEZE_BROKER, broker=rng.randrange(brokers),
                          gap_s=round(rng.uniform(*GAP_S), 2))
    controller = PlannedFault(FaultKind.KILL_CONTROLLER, gap_s=round(rng.uniform(*GAP_S), 2))
    # Insert at positions 1..len (never before the first kill, if there is one); the later
    # insert may land before or after the earlier one.
    steps.insert(rng.randint(min(1, len(steps)), len(steps)), freeze)
    steps.insert(rng.randint(min(1, len(steps)), len(steps)), controller)
    required = len(steps)
    steps.extend(kill() for _ in range(_SPARE_KILLS))
    return FaultPlan(seed, tuple(steps), required)


def etcd_outage_plan(seconds: float, gap_s: float = 5.0) -> FaultPlan:
    """One etcd outage of ``seconds`` (SIGSTOP, then SIGCONT) after ``gap_s`` of steady load."""
    if seconds <= 0:
        raise ValueError("an outage lasts more than 0 s")
    step = PlannedFault(FaultKind.ETCD_OUTAGE, down_s=seconds, gap_s=gap_s)
    return FaultPlan(0, (step,), 1)


def fast_restart_plan(seed: int, partitions: int, restarts: int,
                      gap_s: float = 5.0) -> FaultPlan:
    """``restarts`` SIGKILLs of the leader of a random partition, each started again at once
    (same id, port and data), ``gap_s`` apart (the runner also waits for a full heal)."""
    if partitions < 1 or restarts < 1:
        raise ValueError("need a partition and at least one restart")
    rng = random.Random(seed)
    steps = tuple(
        PlannedFault(FaultKind.RESTART_BROKER, leader_of=rng.randrange(partitions), gap_s=gap_s)
        for _ in range(restarts)
    )
    return FaultPlan(seed, steps, len(steps))


def corruption_plan(seed: int, partitions: int, corruptions: int,
                    gap_s: float = 4.0) -> FaultPlan:
    """``corruptions`` times: stop the leader of a random partition cleanly, flip one byte
    inside a batch of a closed segment of its copy (bit rot at rest), start it again; the
    runner measures how soon the damage is found and the copy repaired, and the verdict counts
    lost, duplicated and skipped records (a consumer tails the topic all along)."""
    if partitions < 1 or corruptions < 1:
        raise ValueError("need a partition and at least one corruption")
    rng = random.Random(seed)
    steps = tuple(
        PlannedFault(FaultKind.CORRUPT_SEGMENT, leader_of=rng.randrange(partitions), gap_s=gap_s)
        for _ in range(corruptions)
    )
    return FaultPlan(seed, steps, len(steps))


def longest_gap(times: Iterable[float], start: float, end: float) -> float:
    """The longest stretch within [start, end] without any of ``times`` (e.g. acknowledgement
    times: the longest write stall of a fault window). Times outside the window are ignored;
    with none inside it the whole window is one gap."""
    if end < start:
        raise ValueError("the window ends before it starts")
    inside = sorted(t for t in times if start <= t <= end)
    longest, last = 0.0, start
    for t in inside:
        longest = max(longest, t - last)
        last = t
    return max(longest, end - last)


def skipped_records(returned: Iterable[tuple[int, int]], positions: Mapping[int, int],
                    log_offsets: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """(partition, offset) of records a consumer's position passed without returning them:
    every offset in ``log_offsets`` below the consumer's final position of its partition that
    is not in ``returned`` (must be empty: a consumer never skips a record)."""
    seen = set(returned)
    return sorted(
        (p, o) for p, o in log_offsets if o < positions.get(p, 0) and (p, o) not in seen
    )


# --- the workload ------------------------------------------------------------------------------


def key_name(index: int) -> str:
    return f"k{index:02d}"


def encode_value(key: str, seq: int) -> bytes:
    return f"{key}:{seq}".encode()


def decode_value(value: bytes | None) -> tuple[str, int]:
    """``b"k07:42"`` -> ``("k07", 42)``; ValueError for anything else."""
    if value is None:
        raise ValueError("record without a value")
    key, sep, seq = value.decode("utf-8", errors="strict").rpartition(":")
    if not sep or not key or not seq.isdigit():
        raise ValueError(f"not a chaos record value: {value[:40]!r}")
    return key, int(seq)


RecordId = tuple[str, int]  # (key, seq)


@dataclass(frozen=True, slots=True)
class Acked:
    """A record the producer reported acknowledged, and where."""

    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Failed:
    """A record the producer reported failed (not acknowledged), with the error's text."""

    error: str


Outcome = Acked | Failed


class DeliveryLedger:
    """Every record the writer sent, and what became of it. Thread-safe: outcomes arrive on the
    producer's I/O thread while the writer thread sends.

    Invariants: a record id is sent at most once; it gets at most one outcome, and only after
    it was sent; ``pending`` = sent - acknowledged - failed.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sent: set[RecordId] = set()
        self._outcomes: dict[RecordId, Outcome] = {}

    def sent(self, record: RecordId) -> None:
        with self._lock:
            if record in self._sent:
                raise ValueError(f"record {record} sent twice")
            self._sent.add(record)

    def settle(self, record: RecordId, outcome: Outcome) -> None:
        with self._lock:
            if record not in self._sent:
                raise ValueError(f"outcome for record {record} that was never sent")
            if record in self._outcomes:
                raise ValueError(f"second outcome for record {record}")
            self._outcomes[record] = outcome

    def counts(self) -> tuple[int, int, int]:
        """(sent, acknowledged, failed) right now."""
        with self._lock:
            acked = sum(1 for o in self._outcomes.values() if isinstance(o, Acked))
            return len(self._sent), acked, len(self._outcomes) - acked

    def outcomes(self) -> dict[RecordId, Outcome | None]:
        """Every sent record with its outcome (None: still pending)."""
        with self._lock:
            return {r: self._outcomes.get(r) for r in self._sent}


@dataclass(frozen=True, slots=True)
class ReadRecord:
    """A record as read back: where it was and what it said."""

    partition: int
    offset: int
    value: bytes | None


@dataclass(frozen=True)
class DeliveryReport:
    """The verdict on one run.

    - ``lost``: acknowledged records not read back (must be empty).
    - ``misplaced``: acknowledged records read at another partition/offset than the one their
      acknowledgement gave (the acknowledged write itself was lost; must be empty).
    - ``duplicated``: records read more than once, with how often (empty with idempotence).
    - ``unacked_present``: records that failed or were still pending and are in the log anyway
      (allowed: the client cannot tell a lost answer from a lost write).
    - ``order_violations``: (key, seq, after_seq): the first copy of ``seq`` was read after the
      first copy of the larger ``after_seq`` of the same key (must be empty).
    - ``foreign``: records that are not this workload's, or were never sent (must be empty).
    """

    sent: int
    acknowledged: int
    failed: int
    pending: int
    read: int
    lost: tuple[RecordId, ...]
    misplaced: tuple[tuple[RecordId, Acked, ReadRecord], ...]
    duplicated: Mapping[RecordId, int]
    unacked_present: int
    order_violations: tuple[tuple[str, int, int], ...]
    foreign: tuple[ReadRecord, ...]
    failure_reasons: Mapping[str, int] = field(default_factory=dict)

    def ok(self, require_no_duplicates: bool) -> bool:
        return not (
            self.lost
            or self.misplaced
            or self.order_violations
            or self.foreign
            or (require_no_duplicates and self.duplicated)
        )

    def summary(self) -> str:
        extra = sum(self.duplicated.values()) - len(self.duplicated)
        lines = [
            f"sent {self.sent}, acknowledged {self.acknowledged}, failed {self.failed}, "
            f"pending {self.pending}",
            f"read {self.read}, lost {len(self.lost)}, duplicated {len(self.duplicated)} "
            f"records ({extra} extra copies), unacknowledged-but-present {self.unacked_present}, "
            f"misplaced {len(self.misplaced)}, order violations {len(self.order_violations)}, "
            f"foreign {len(self.foreign)}",
        ]
        if self.failure_reasons:
            lines.append("  failures by reason: " + "; ".join(
                f"{n} x {reason}" for reason, n in sorted(
                    self.failure_reasons.items(), key=lambda item: -item[1])[:5]))
        if self.lost:
            lines.append(f"  lost (first 20): {sorted(self.lost)[:20]}")
        if self.misplaced:
            lines.append("  misplaced (first 10): " + "; ".join(
                f"{r} acked p{a.partition}@{a.offset}, read p{m.partition}@{m.offset}"
                for r, a, m in self.misplaced[:10]
            ))
        if self.duplicated:
            first = sorted(self.duplicated.items())[:20]
            lines.append(f"  duplicated (first 20): {first}")
        if self.order_violations:
            lines.append(f"  order violations (first 20, key/seq/after): "
                         f"{list(self.order_violations[:20])}")
        if self.foreign:
            lines.append(f"  foreign (first 10): {list(self.foreign[:10])}")
        return "\n".join(lines)


def verify_delivery(
    outcomes: Mapping[RecordId, Outcome | None], records: Iterable[ReadRecord]
) -> DeliveryReport:
    """Check what was read against what was acknowledged.

    ``records`` may come in any order; they are judged in (partition, offset) order, which is
    the order a key's records were appended in (one key lives in one partition).
    """
    ordered = sorted(records, key=lambda r: (r.partition, r.offset))
    copies: Counter[RecordId] = Counter()
    first_seen: dict[RecordId, ReadRecord] = {}
    foreign: list[ReadRecord] = []
    at_position: dict[tuple[int, int], RecordId] = {}
    max_seq: dict[str, int] = {}
    violations: list[tuple[str, int, int]] = []
    for record in ordered:
        try:
            record_id = decode_value(record.value)
        except ValueError:
            foreign.append(record)
            continue
        if record_id not in outcomes:
            foreign.append(record)
            continue
        at_position[(record.partition, record.offset)] = record_id
        copies[record_id] += 1
        if copies[record_id] > 1:
            continue
        first_seen[record_id] = record
        key, seq = record_id
        top = max_seq.get(key, 0)
        if seq < top:
            violations.append((key, seq, top))
        else:
            max_seq[key] = seq
    lost: list[RecordId] = []
    misplaced: list[tuple[RecordId, Acked, ReadRecord]] = []
    unacked_present = 0
    counts: dict[str, int] = defaultdict(int)
    reasons: Counter[str] = Counter()
    for record_id, outcome in outcomes.items():
        if isinstance(outcome, Failed):
            reasons[outcome.error[:REASON_CHARS]] += 1
        kind = "pending" if outcome is None else type(outcome).__name__
        counts[kind] += 1
        seen = first_seen.get(record_id)
        if isinstance(outcome, Acked):
            if seen is None:
                lost.append(record_id)
            elif at_position.get((outcome.partition, outcome.offset)) != record_id:
                # No copy sits where the acknowledgement said: that write was lost.
                misplaced.append((record_id, outcome, seen))
        elif seen is not None:
            unacked_present += 1
    return DeliveryReport(
        sent=len(outcomes),
        acknowledged=counts["Acked"],
        failed=counts["Failed"],
        pending=counts["pending"],
        read=len(ordered),
        lost=tuple(sorted(lost)),
        misplaced=tuple(sorted(misplaced, key=lambda m: m[0])),
        duplicated={r: n for r, n in sorted(copies.items()) if n > 1},
        unacked_present=unacked_present,
        order_violations=tuple(violations),
        foreign=tuple(foreign),
        failure_reasons=dict(reasons),
    )


# --- the timeline ------------------------------------------------------------------------------


@dataclass
class Timeline:
    """What happened when, in seconds since the run started (callers pass the time).

    Invariant: events are kept in the order they were added. Thread-safe.
    """

    events: list[tuple[float, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, at_s: float, what: str) -> None:
        with self._lock:
            self.events.append((at_s, what))

    def render(self) -> str:
        with self._lock:
            return "\n".join(f"  {at:7.2f} s  {what}" for at, what in self.events)
