"""Consumer-group benchmark: a group of 3 consumers over 12 partitions, and how long a member's
join takes until the group is Stable again.

One private LocalCluster (3 brokers, 2 controllers, 2 group coordinators: ``fjord local up``'s
defaults; every process on loopback on this machine):

- **Group throughput.** A topic of 12 partitions (replication factor 1) is pre-filled with
  ``--records`` records of ``--record-size`` bytes (the ``fjord perf produce`` code). Then 3
  consumers, each its own process (as a group's members are), subscribe with one group id and
  read from the earliest offset. Each reports when it got its first and last record and how
  many it read; the figure is all records / (last record anywhere - first record anywhere),
  the median of ``--rounds`` rounds (each round a new group reading the whole topic).
  The run checks that each record was read exactly once (the total equals ``--records``, no
  rebalance after the first assignment) and says so in the results.
- **Join until Stable.** With those 3 members still in the group (idle at the log end,
  heartbeating), a 4th consumer subscribes; the figure is the time from its ``subscribe()``
  (its poll loop starts right after) until its ``on_assign`` callback: the moment its SyncGroup
  was answered, which is when the group became Stable again (Kafka's eager protocol, the
  ``range`` assignor: every member rejoins). The 4th member then closes (LeaveGroup), the run
  waits until the group is Stable with 3 members, pauses a random 0 to 1 heartbeat interval
  (seeded; every rebalance restarts all members' heartbeat timers together, so joining at once
  would always land at the same, worst, point of their heartbeat cycle), and joins again
  (``--joins`` times); the results give p50 and max. The existing members learn of a
  rebalance from their next heartbeat, so the figure is bounded below by the round trips and
  above by about one ``heartbeat.interval.ms``: the members use session.timeout.ms 6000 and
  heartbeat.interval.ms 500 (``--heartbeat-interval-ms``; shortened as in the tests; Kafka's
  defaults are 45000 and 3000). ``group.initial.rebalance.delay.ms`` only delays the first
  rebalance of an *empty* group, so
  it does not apply to a member joining an existing group. Target: p50 and max under 1 s.

- **Coordinator fail-over.** A group with committed offsets on every partition (no members)
  loses the coordinator serving it to a SIGKILL, not restarted; the figure is the time from the
  kill until another coordinator serves the group with every committed offset (the controller
  moves the group's ``__consumer_offsets`` partition once the dead coordinator's lease expires,
  the new owner replays it). The killed coordinator is started again before the next of
  ``--coordinator-failovers`` rounds. Target: the coordinators' lease TTL + 1 s (the tests only
  check that the fail-over happens and loses nothing: tests/integration/test_find_coordinator.py,
  test_group_semantics.py).

Run::

    .venv/bin/python bench/bench_groups.py [--records 200000] [--rounds 3] [--joins 9]
        [--heartbeat-interval-ms 500] [--coordinator-failovers 3] [--write-results]

``--write-results`` rewrites the "groups" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_file import cpu_model, write_section

from fjord.cli.perf_cmd import run_produce_perf
from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.errors import FjordError
from fjord.local.cluster import LocalCluster
from fjord.testing.waiting import seconds_until

SECTION = "## groups"
TOPIC = "bench-groups"
PARTITIONS = 12
MEMBERS = 3
SESSION_TIMEOUT_MS = 6_000
HEARTBEAT_INTERVAL_MS = 500  # default of --heartbeat-interval-ms
TARGET_JOIN_S = 1.0
TARGET_FAILOVER_SLACK_S = 1.0  # a coordinator fail-over within its lease TTL + this
WAIT_S = 120.0  # bound on every wait of the run (a loaded 2-core machine)
REPORT_INTERVAL_S = 0.5  # how often a member process reports its count
JOIN_PHASE_SEED = 5  # seeds the random pause before each join (reproducible runs)

MEMBER_CONFIG: dict[str, Any] = {
    "session.timeout.ms": SESSION_TIMEOUT_MS,
    "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,  # main() sets --heartbeat-interval-ms
    "auto.offset.reset": "earliest",
    # Auto-commit (and its commit on revoke) keeps members from re-reading the topic after
    # each join's rebalance, which would load the machine while the joins are timed.
    "enable.auto.commit": True,
    "auto.commit.interval.ms": 1_000,
}

# One group member in its own process: reads until its stdin closes, prints JSON lines:
# {"assign": [...], "at": t} per on_assign and {"count": n, "first": t, "last": t} every
# REPORT_INTERVAL_S and at the end (time.monotonic(): one clock for every process here).
MEMBER_PROCESS = r"""
import json, sys, threading, time
from fjord.client import Consumer
config, topic, report_every = json.loads(sys.argv[1])
def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
consumer = Consumer(config)
consumer.subscribe([topic], on_assign=lambda c, tps: out(
    {"assign": sorted(tp.partition for tp in tps), "at": time.monotonic()}))
count, first, last, reported = 0, None, None, time.monotonic()
while not stop.is_set():
    records = consumer.poll(0.2)
    if records:
        now = time.monotonic()
        first = first if first is not None else now
        last = now
        count += len(records)
    if time.monotonic() - reported >= report_every:
        out({"count": count, "first": first, "last": last}); reported = time.monotonic()
consumer.close()
out({"count": count, "first": first, "last": last})
"""


class MemberProcess:
    """A member process (MEMBER_PROCESS) and the JSON lines it printed."""

    def __init__(self, bootstrap: str, group: str, name: str) -> None:
        config = {"bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
                  **MEMBER_CONFIG}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", MEMBER_PROCESS, json.dumps([config, TOPIC,
                                                               REPORT_INTERVAL_S])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        self.lines: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(json.loads(raw))

    def report(self) -> dict[str, Any]:
        """The last {"count", "first", "last"} it printed."""
        reports = [line for line in list(self.lines) if "count" in line]
        return reports[-1] if reports else {"count": 0, "first": None, "last": None}

    def count(self) -> int:
        return int(self.report()["count"])

    def assigns(self) -> list[list[int]]:
        return [line["assign"] for line in list(self.lines) if "assign" in line]

    def stop(self) -> dict[str, Any]:
        """Close its stdin (it closes its consumer: LeaveGroup) and return its final line."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(WAIT_S)
        if self.proc.returncode != 0:
            assert self.proc.stderr is not None
            raise RuntimeError(f"member exited {self.proc.returncode}: "
                               f"{self.proc.stderr.read().decode()[-2000:]}")
        return self.report()


def group_state(admin: AdminClient, group: str) -> tuple[str, int] | None:
    """(state, member count) of ``group`` as its coordinator describes it, or None."""
    try:
        described = admin.describe_consumer_groups([group])[group]
    except FjordError:  # the coordinator cannot answer yet: the caller asks again
        return None
    return described.state, len(described.members)


def prefill(bootstrap: str, records: int, record_size: int) -> float:
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 5})
    try:
        report = run_produce_perf(producer, TOPIC, records, record_size, -1)
    finally:
        producer.close()
    return float(report["records_per_sec"])


def bench_throughput(bootstrap: str, group: str, records: int
                     ) -> tuple[list[MemberProcess], list[dict[str, Any]]]:
    """Start the members; returns them (still in the group) and each one's report at the
    moment the group had read ``records`` records."""
    members = [MemberProcess(bootstrap, group, f"member-{i}") for i in range(MEMBERS)]
    if seconds_until(lambda: sum(m.count() for m in members) >= records, WAIT_S) is None:
        raise RuntimeError(f"the group read {sum(m.count() for m in members)} of {records} "
                           f"records within {WAIT_S} s")
    return members, [m.report() for m in members]


def wait_committed_to_end(bootstrap: str, group: str) -> None:
    """Until the group's committed offsets reach the end of every partition (auto-commit), so
    that the rebalances of the joins do not make members read the topic again."""
    tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    with (Consumer({"bootstrap.servers": bootstrap}) as reader,
          AdminClient({"bootstrap.servers": bootstrap}) as admin):
        ends = reader.end_offsets(tps)

        def committed_to_end() -> bool:
            committed = admin.list_consumer_group_offsets(group, tps)
            return all((c := committed.get(tp)) is not None and c.offset == ends[tp]
                       for tp in tps)

        if seconds_until(committed_to_end, WAIT_S) is None:
            raise RuntimeError(f"committed offsets did not reach the log end within {WAIT_S} s")


def bench_joins(bootstrap: str, group: str, joins: int, heartbeat_interval_ms: int
                ) -> list[float]:
    """Seconds from a 4th member's subscribe() to its on_assign, ``joins`` times."""
    times: list[float] = []
    phases = random.Random(JOIN_PHASE_SEED)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        for n in range(joins):
            if seconds_until(lambda: group_state(admin, group) == ("Stable", MEMBERS),
                        WAIT_S) is None:
                raise RuntimeError(f"group not Stable with {MEMBERS} members: "
                                   f"{group_state(admin, group)}")
            times.append(time_one_join(bootstrap, group, n, phases.uniform(
                0, heartbeat_interval_ms / 1000)))
            print(f"join {n + 1}: Stable again after {times[-1] * 1000:.0f} ms", flush=True)
    finally:
        admin.close()
    return times


def time_one_join(bootstrap: str, group: str, n: int, pause_s: float) -> float:
    """Pause ``pause_s``, then seconds from a new member's subscribe() to its on_assign; the
    member closes (LeaveGroup) afterwards."""
    time.sleep(pause_s)
    assigned = threading.Event()

    def on_assign(_consumer: Consumer, _tps: list[TopicPartition]) -> None:
        assigned.set()

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "client.id": f"joiner-{n}", **MEMBER_CONFIG})
    try:
        start = time.monotonic()
        consumer.subscribe([TOPIC], on_assign=on_assign)
        deadline = start + WAIT_S
        while not assigned.is_set() and time.monotonic() < deadline:
            consumer.poll(0.01)
        if not assigned.is_set():
            raise RuntimeError(f"join {n + 1}: no assignment within {WAIT_S} s")
        return time.monotonic() - start
    finally:
        consumer.close()


@dataclass
class ReadRound:
    """One group reading the whole pre-filled topic: each member's last report when the group
    had read everything, and whether any member was assigned more than once meanwhile."""

    finals: list[dict[str, Any]]
    rebalanced: bool

    @property
    def total(self) -> int:
        return sum(int(f["count"]) for f in self.finals)

    @property
    def rate(self) -> float:
        span = max(f["last"] for f in self.finals) - min(f["first"] for f in self.finals)
        return self.total / span if span > 0 else 0.0


def bench_coordinator_failovers(cluster: LocalCluster, failovers: int) -> list[float]:
    """Seconds from the SIGKILL of the coordinator serving a group until another coordinator
    serves it with every committed offset, once per round (method: the module docstring)."""
    tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    offset = 7
    figures: list[float] = []
    config = {"bootstrap.servers": cluster.bootstrap_servers, "default.api.timeout.ms": 30000}
    with AdminClient(config) as admin:

        def coordinator_of(group: str) -> str | None:
            try:
                return admin.describe_consumer_groups([group], timeout=10)[group].coordinator
            except FjordError:  # no coordinator can answer yet
                return None

        for n in range(failovers):
            group = f"bench-failover-{n}"
            admin.alter_consumer_group_offsets(group, dict.fromkeys(tps, offset))
            before = coordinator_of(group)
            owner = next((i for i, address in cluster.coordinator_addresses.items()
                          if address == before), None)
            if owner is None:
                raise RuntimeError(f"{group}: served by {before}, not a known coordinator")
            cluster.kill("coordinator", owner)

            def served_elsewhere(group: str = group, before: str | None = before) -> bool:
                if coordinator_of(group) in (None, before):
                    return False
                try:
                    offsets = admin.list_consumer_group_offsets(group, tps, timeout=10)
                except FjordError:
                    return False
                return all(o is not None and o.offset == offset for o in offsets.values())

            took = seconds_until(served_elsewhere, WAIT_S)
            if took is None:
                raise RuntimeError(f"{group} was not served elsewhere within {WAIT_S} s")
            figures.append(took)
            print(f"coordinator fail-over {n + 1}: coordinator {owner} killed, {group} served "
                  f"by another with its offsets after {took:.2f} s", flush=True)
            cluster.start_coordinator(owner)
    return figures


def render(args: argparse.Namespace, produce_rate: float, rounds: list[ReadRound],
           joins: list[float], load: tuple[float, float], coordinators: int,
           failovers: list[float], lease_ttl_s: int) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    command = (f".venv/bin/python bench/bench_groups.py --records {args.records} "
               f"--rounds {args.rounds} --joins {args.joins} --heartbeat-interval-ms "
               f"{args.heartbeat_interval_ms} --coordinator-failovers "
               f"{args.coordinator_failovers} --write-results")
    median = sorted(rounds, key=lambda r: r.rate)[len(rounds) // 2]
    lines = [
        f"Command: `{command}`, {now}; machine: {os.cpu_count()} CPUs ({cpu_model()}), Python "
        f"{platform.python_version()}, {platform.system()} {platform.release()}; load average "
        f"(1 min) {load[0]:.1f} at the start, {load[1]:.1f} at the end (the machine is shared "
        f"with other work). One LocalCluster: 3 brokers, 2 controllers, {coordinators} group "
        f"coordinators, all on loopback; topic of {PARTITIONS} partitions, replication factor "
        f"1, pre-filled with {args.records:,} records of {args.record_size} bytes (at "
        f"{produce_rate:,.0f} rec/s). Members: session.timeout.ms {SESSION_TIMEOUT_MS}, "
        f"heartbeat.interval.ms {args.heartbeat_interval_ms}, partition.assignment.strategy "
        "range (eager), auto commit every 1 s; the coordinators' "
        "group.initial.rebalance.delay.ms is Kafka's 3000 (it only delays the first rebalance "
        "of an empty group, not a join into a Stable one). Method: the script's docstring.",
        "",
        "| measurement | figure |",
        "|---|---:|",
        f"| group of {MEMBERS} consumers (one process each), {PARTITIONS} partitions: records/s "
        f"(median of {len(rounds)} rounds) | {median.rate:,.0f} |",
        "| per member in that round: records read | "
        + ", ".join(f"{f['count']:,}" for f in median.finals) + " |",
    ]
    if joins:
        p50, worst = statistics.median(joins), max(joins)
        lines.append(f"| member joins -> Stable again, p50 (n={len(joins)}) | "
                     f"{p50 * 1000:.0f} ms |")
        lines.append(f"| member joins -> Stable again, max | {worst * 1000:.0f} ms |")
    lines.append("")
    lines.append("- rounds (records/s): " + ", ".join(f"{r.rate:,.0f}" for r in rounds))
    once = all(r.total == args.records and not r.rebalanced for r in rounds)
    lines.append(f"- every record read exactly once by the group in every round: "
                 f"{'yes' if once else 'NO'} (read: "
                 + ", ".join(f"{r.total:,}" + (" with a rebalance" if r.rebalanced else "")
                             for r in rounds) + f" of {args.records:,})")
    if joins:
        verdict = "met" if max(joins) < TARGET_JOIN_S else (
            "p50 met, max MISSED" if statistics.median(joins) < TARGET_JOIN_S else "MISSED")
        lines.append("- joins (ms): " + ", ".join(f"{j * 1000:.0f}" for j in joins)
                     + f"; target p50 and max under {TARGET_JOIN_S * 1000:.0f} ms: {verdict}")
    if failovers:
        target = lease_ttl_s + TARGET_FAILOVER_SLACK_S
        verdict = "met" if max(failovers) <= target else "MISSED"
        lines.append("- coordinator fail-over (SIGKILL -> another coordinator serves the group "
                     "with its offsets), s: " + ", ".join(f"{f:.2f}" for f in failovers)
                     + f"; target within the lease TTL {lease_ttl_s} s + "
                     f"{TARGET_FAILOVER_SLACK_S:.0f} s: {verdict}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--joins", type=int, default=9)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=HEARTBEAT_INTERVAL_MS)
    parser.add_argument("--coordinator-failovers", type=int, default=3)
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    MEMBER_CONFIG["heartbeat.interval.ms"] = args.heartbeat_interval_ms
    load_start = os.getloadavg()[0]
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    rounds: list[ReadRound] = []
    joins: list[float] = []
    with (tempfile.TemporaryDirectory(prefix="fjord-bench-groups-") as tmp,
          LocalCluster(Path(tmp), brokers=3, unsafe_etcd_no_fsync=True) as cluster):
        bootstrap = cluster.bootstrap_servers
        coordinators = cluster.num_coordinators
        produce_rate = prefill(bootstrap, args.records, args.record_size)
        print(f"pre-filled {args.records:,} records at {produce_rate:,.0f} rec/s", flush=True)
        for round_no in range(args.rounds):
            # A new group each round reads the topic from the start; the last one stays for
            # the joins.
            group = f"bench-group-{round_no}"
            members, finals = bench_throughput(bootstrap, group, args.records)
            try:
                rounds.append(ReadRound(finals, any(len(m.assigns()) > 1 for m in members)))
                print(f"round {round_no + 1}: {rounds[-1].rate:,.0f} records/s", flush=True)
                if round_no == args.rounds - 1:
                    wait_committed_to_end(bootstrap, group)
                    joins = bench_joins(bootstrap, group, args.joins, args.heartbeat_interval_ms)
            finally:
                for member in members:
                    member.stop()
        failovers = bench_coordinator_failovers(cluster, args.coordinator_failovers)
        lease_ttl_s = cluster.coordinator_lease_ttl_s
    block = render(args, produce_rate, rounds, joins, (load_start, os.getloadavg()[0]),
                   coordinators, failovers, lease_ttl_s)
    print(block)
    if args.write_results:
        write_section(SECTION, block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
