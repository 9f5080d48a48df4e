"""``fjord log-dirs describe``: each broker's data directory (Kafka's kafka-log-dirs.sh
--describe), with Fjord's scrubber: pass progress, damage found, repairs made."""

from __future__ import annotations

from typing import Any

import click

from fjord.cli.client_common import (
    admin_client_config,
    bootstrap_option,
    emit,
    friendly_errors,
    output_option,
)
from fjord.client import AdminClient, LogDirDescription


@click.group("log-dirs")
def log_dirs() -> None:
    """Inspect the brokers' data directories."""


def _summary(d: LogDirDescription) -> str:
    s = d.scrub
    state = "writable" if d.writable else f"NOT WRITABLE ({d.unwritable_reason})"
    if not s.enabled:
        scrub = "scrubber off"
    elif s.passes_completed >= s.pass_number:
        scrub = (f"scrub pass {s.pass_number} complete ({s.total_segments} closed segments, "
                 f"{s.total_bytes} bytes verified), the next after log.scrubber.backoff.ms")
    else:
        scrub = (f"scrub pass {s.pass_number}: {s.progress:.0%} of {s.total_segments} closed "
                 f"segments ({s.verified_bytes}/{s.total_bytes} bytes), "
                 f"{s.passes_completed} passes done")
    damaged = sum(1 for p in d.partitions if p.damaged_offset >= 0)
    repairing = sum(1 for p in d.partitions if p.repair_until_offset >= 0)
    return (f"Broker {d.broker_id}: {d.log_dir} {state}; {scrub}; damage found {s.damage_found}"
            f" (now {damaged} damaged), repairs done {s.repairs_done} ({repairing} under way)")


def _as_json(d: LogDirDescription) -> dict[str, Any]:
    s = d.scrub
    return {
        "broker": d.broker_id,
        "log_dir": d.log_dir,
        "writable": d.writable,
        "unwritable_reason": d.unwritable_reason or None,
        "scrub": {
            "enabled": s.enabled, "pass": s.pass_number, "passes_completed": s.passes_completed,
            "verified_segments": s.verified_segments, "total_segments": s.total_segments,
            "verified_bytes": s.verified_bytes, "total_bytes": s.total_bytes,
            "damage_found": s.damage_found, "repairs_done": s.repairs_done,
            "io_max_bytes_per_second": s.io_max_bytes_per_second,
        },
        "partitions": [
            {"topic": p.topic, "partition": p.partition, "size": p.size_bytes,
             "log_start_offset": p.log_start_offset, "log_end_offset": p.log_end_offset,
             "leader": p.leader,
             "damaged_offset": None if p.damaged_offset < 0 else p.damaged_offset,
             "damage": p.damage or None,
             "repair_until_offset": None if p.repair_until_offset < 0 else p.repair_until_offset,
             "cleaner": {"dirty_ratio": p.cleaner_dirty_ratio,
                         "first_dirty_offset": p.cleaner_first_dirty_offset}
             if p.compacted else None}
            for p in d.partitions
        ],
    }


def _state(p: Any) -> str:
    if p.damaged_offset >= 0:
        return f"damaged at {p.damaged_offset}: {p.damage}"
    if p.repair_until_offset >= 0:
        return f"repairing: re-fetching up to {p.repair_until_offset}"
    if p.compacted:
        return (f"ok; compacted below {p.cleaner_first_dirty_offset}, dirty ratio "
                f"{p.cleaner_dirty_ratio:.2f}")
    return "ok"


@log_dirs.command("describe")
@click.option("--broker", "brokers", type=int, multiple=True, metavar="ID",
              help="Only this broker (repeatable; Kafka's --broker-list). Default: every live "
              "broker.")
@bootstrap_option
@output_option
@friendly_errors
def describe(brokers: tuple[int, ...], bootstrap_server: str | None, output: str) -> None:
    """Each broker's data directory: writable or not, scrubber progress, damage found and
    repairs made, and its partition replicas with their size and state (for a compacted one,
    the log cleaner's: the offset below which it is compacted, and its dirty ratio)."""
    with AdminClient(admin_client_config(bootstrap_server)) as admin:
        found = admin.describe_log_dirs(brokers or None)
    if output == "json":
        emit(output, [_as_json(d) for d in found], [], [])
        return
    for i, d in enumerate(found):
        if i:
            click.echo()
        click.echo(_summary(d))
        rows = [(f"{p.topic}-{p.partition}", "leader" if p.leader else "follower", p.size_bytes,
                 p.log_start_offset, p.log_end_offset, _state(p)) for p in d.partitions]
        emit(output, None, rows, ["Partition", "Role", "Size", "Start", "End", "State"])
