"""``fjord demo``: one partition log on disk, shown step by step (what ``make run`` runs).

It writes batches built by the record codec, rolls segments, looks offsets and timestamps up
through the sparse indexes, reads records back, simulates a crash that tears the last write and
reopens the log to show recovery. Everything happens in a temporary directory unless
``--dir`` names one (then the files stay for inspection).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import click

from fjord.records import BatchBuilder, decode_records, iter_batches
from fjord.storage import LogConfig, PartitionLog

DEMO_SEGMENT_BYTES = 4096
DEMO_INDEX_INTERVAL_BYTES = 512
DEMO_BATCHES = 40
DEMO_RECORDS_PER_BATCH = 5
DEMO_START_MS = 1_700_000_000_000


def _build_batch(number: int) -> bytes:
    builder = BatchBuilder()
    for i in range(DEMO_RECORDS_PER_BATCH):
        key = f"order-{number * DEMO_RECORDS_PER_BATCH + i}".encode()
        value = f'{{"order": {number * DEMO_RECORDS_PER_BATCH + i}, "qty": {i + 1}}}'.encode()
        builder.append(DEMO_START_MS + number * 1000 + i, key, value)
    return builder.build()


def _describe_segments(log: PartitionLog) -> None:
    for segment in log.segments:
        click.echo(
            f"    {segment.base_offset:020d}.log  offsets {segment.base_offset}-"
            f"{segment.next_offset - 1}  {segment.size:5d} bytes  "
            f"{len(segment.offset_index)} index entries, "
            f"{len(segment.time_index)} time index entries"
        )


@click.command("demo")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to put the partition log (default: a temporary dir).",
)
def demo(directory: Path | None) -> None:
    """Write, read, look up and crash-recover one partition log, printing each step."""
    root = directory or Path(tempfile.mkdtemp(prefix="fjord-demo-"))
    # The demo prints the recovery report itself; keep the storage warnings off the terminal.
    logging.getLogger("fjord.storage").setLevel(logging.ERROR)
    try:
        _run(root / "orders-0")
    finally:
        if directory is None:
            shutil.rmtree(root, ignore_errors=True)


def _run(path: Path) -> None:
    config = LogConfig.from_dict(
        {"segment.bytes": DEMO_SEGMENT_BYTES, "index.interval.bytes": DEMO_INDEX_INTERVAL_BYTES}
    )
    click.echo(f"Fjord storage demo: partition log in {path}")
    click.echo(
        f"  segment.bytes={config.segment_bytes} index.interval.bytes={config.index_interval_bytes}"
    )
    log = PartitionLog.open(path, config, now_ms=DEMO_START_MS)

    click.echo(
        f"\n1. Append {DEMO_BATCHES} batches of {DEMO_RECORDS_PER_BATCH} records "
        "(leader epoch 0, then 1 from batch 30)"
    )
    for number in range(DEMO_BATCHES):
        info = log.append(
            _build_batch(number),
            leader_epoch=0 if number < 30 else 1,
            now_ms=DEMO_START_MS + number * 1000,
        )
        if number in (0, 1, DEMO_BATCHES - 1):
            click.echo(f"    batch {number:2d} -> offsets {info.first_offset}-{info.last_offset}")
    click.echo(
        f"    log start offset {log.log_start_offset}, log end offset "
        f"{log.log_end_offset}, {len(log.segments)} segments:"
    )
    _describe_segments(log)

    click.echo("\n2. Look offsets up: bisect the segments, bisect the sparse index, short scan")
    for offset in (0, 57, 123, log.log_end_offset - 1):
        segment = log.segment_for(offset)
        entry_offset, position = segment.offset_index.lookup(offset)
        data = log.read(offset, 1)
        first = next(iter_batches(data))[1]
        click.echo(
            f"    offset {offset:3d}: segment {segment.base_offset}, index entry "
            f"(offset {entry_offset}, position {position}) -> batch "
            f"{first.base_offset}-{first.last_offset}"
        )
    records = [r for r in decode_records(log.read(57, 200)) if r.offset >= 57][:2]
    for record in records:
        click.echo(f"    record {record.offset}: key={record.key!r} value={record.value!r}")

    click.echo("\n3. Timestamps and leader epochs")
    for ts in (DEMO_START_MS + 12_500, DEMO_START_MS + 10**9):
        click.echo(f"    first batch with timestamp >= {ts}: {log.offset_for_timestamp(ts)}")
    click.echo(
        f"    leader-epoch-checkpoint: {log.epoch_cache.entries}; end offset of "
        f"epoch 0 = {log.end_offset_for_epoch(0)[1]}"
    )

    click.echo("\n4. Flush (fsync) then crash while writing two more batches")
    log.flush()
    click.echo(f"    recovery point {log.recovery_point}")
    log.append(_build_batch(DEMO_BATCHES), 1, now_ms=DEMO_START_MS + 99_000)
    log.append(_build_batch(DEMO_BATCHES + 1), 1, now_ms=DEMO_START_MS + 99_000)
    active = log.active_segment.path(".log")
    log.abandon()  # no flush, no clean-shutdown marker
    torn = active.stat().st_size - 25
    os.truncate(active, torn)  # the second write was torn by the crash
    click.echo(f"    crash: {active.name} cut to {torn} bytes (mid-batch)")

    log = PartitionLog.open(path, config)
    report = log.recovery
    assert report is not None
    click.echo(
        f"\n5. Reopen: clean shutdown={report.clean_shutdown}, re-validated "
        f"{report.recovered_segments} segment(s) past the recovery point, cut "
        f"{report.truncated_bytes} bytes of torn batch"
    )
    click.echo(
        f"    log end offset {log.log_end_offset} (the untorn batch survived, the torn one is gone)"
    )
    whole = sum(1 for s in log.segments for _ in iter_batches(log.read(s.base_offset, 10**6)))
    click.echo(f"    every batch reads back whole with a valid CRC: {whole} batches")

    click.echo("\n6. Retention: keep at most 6000 bytes")
    log.config = LogConfig.from_dict({"retention.bytes": 6000, "retention.ms": -1}, config)
    deleted = log.apply_retention()
    click.echo(f"    deleted {deleted} old segment(s); log start offset now {log.log_start_offset}")
    _describe_segments(log)
    log.close()
    click.echo(f"\nClosed cleanly (marker {path / '.clean-shutdown'} written).")
