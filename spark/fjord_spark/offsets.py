"""Offsets as Spark's checkpoint stores them, rate limiting and range planning (pure: no I/O).

Spark keeps a streaming query's progress in its checkpoint as JSON; this source writes the same
shape as Spark's Kafka source: ``{"topic": {"0": 42, "1": 7}}``, each value the *next* offset
to read in that partition. A micro-batch reads, per partition, the half-open range
``[start, end)`` between two such documents.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fjord.client.types import TopicPartition
from fjord.errors import ConfigError
from fjord_spark.errors import DataLossError
from fjord_spark.options import EARLIEST, LATEST, OffsetSpec

log = logging.getLogger(__name__)

Offsets = dict[TopicPartition, int]


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """``{topic: {"partition": offset}}``, topics and partitions in order."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def offsets_from_json(document: Mapping[str, Any]) -> Offsets:
    """The inverse of :func:`offsets_to_json`; ConfigError on anything else (a checkpoint
    written by another source, or edited by hand)."""
    out: Offsets = {}
    if not isinstance(document, Mapping):
        raise ConfigError(f"not a Fjord offsets document: {document!r}")
    for topic, partitions in document.items():
        if not isinstance(partitions, Mapping):
            raise ConfigError(f"not a Fjord offsets document (topic {topic!r}): {document!r}")
        for partition, offset in partitions.items():
            try:
                number = int(partition)
            except ValueError:
                raise ConfigError(f"bad partition {partition!r} in offsets {document!r}") from None
            if not isinstance(offset, int) or offset < 0 or number < 0:
                raise ConfigError(f"bad offset for {topic}-{partition} in {document!r}")
            out[TopicPartition(str(topic), number)] = offset
    return out


def resolve_offsets(
    spec: OffsetSpec,
    partitions: list[TopicPartition],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    option: str,
) -> Offsets:
    """Concrete offsets for ``partitions`` from a spec, given each partition's log start
    (``earliest``) and high watermark (``latest``). A partition the JSON names that the query
    does not read is a ConfigError (a typo would otherwise be silently ignored)."""
    known = set(partitions)
    for tp in spec.specific:
        if tp not in known:
            raise ConfigError(
                f"option {option} names {tp.topic}-{tp.partition}, which this query does not "
                "read (no such partition, or not selected by subscribe/assign)"
            )
    out: Offsets = {}
    for tp in partitions:
        wanted = spec.specific.get(tp, EARLIEST if spec.strategy == "earliest" else LATEST)
        if wanted == EARLIEST:
            out[tp] = earliest[tp]
        elif wanted == LATEST:
            out[tp] = latest[tp]
        else:
            out[tp] = wanted
    return out


def limit_offsets(start: Mapping[TopicPartition, int], latest: Offsets, max_rows: int) -> Offsets:
    """End offsets that read at most ``max_rows`` records in all, shared among the partitions
    in proportion to what each has available (Spark's Kafka source's rule), the rounding
    remainder going to the largest fractions.

    Invariants: each result is between the partition's start and latest offset (a partition
    whose latest is not above its start keeps its latest, untouched); the total read is
    ``min(max_rows, total available)``; with ``max_rows >= 1`` and data available, at least
    one record is read (the query makes progress).
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    available = {
        tp: end - start[tp] for tp, end in latest.items() if tp in start and end > start[tp]
    }
    total = sum(available.values())
    if total <= max_rows:
        return dict(latest)
    shares = {tp: size * max_rows // total for tp, size in available.items()}
    left = max_rows - sum(shares.values())
    # Largest remainder first; ties by partition so the result is deterministic.
    by_remainder = sorted(available, key=lambda tp: (-(available[tp] * max_rows % total), tp))
    for tp in by_remainder[:left]:
        shares[tp] += 1
    out = dict(latest)
    for tp, share in shares.items():
        out[tp] = start[tp] + share
    return out


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records ``[from_offset, until_offset)`` of one partition: one Spark task's work."""

    tp: TopicPartition
    from_offset: int
    until_offset: int

    @property
    def size(self) -> int:
        return self.until_offset - self.from_offset


def _lost(message: str, fail_on_data_loss: bool) -> None:
    if fail_on_data_loss:
        raise DataLossError(
            f"{message}. Some data may have been lost because it is no longer available in "
            "Fjord (deleted by retention, or the topic was deleted or recreated). If you want "
            'the query to go on, set the option failOnDataLoss to "false".'
        )
    log.warning("%s; skipping it because failOnDataLoss is false", message)


def plan_ranges(
    start: Mapping[TopicPartition, int],
    end: Mapping[TopicPartition, int],
    log_start: Mapping[TopicPartition, int],
    fail_on_data_loss: bool,
) -> list[OffsetRange]:
    """The ranges a (micro-)batch reads between two offset documents.

    A partition in ``end`` but not in ``start`` is new and is read from its log start. Data
    loss (start below the log start; an end below the start, i.e. the partition was recreated;
    a partition of ``start`` missing from ``end``) raises :class:`DataLossError` when
    ``fail_on_data_loss``, else is logged and the lost part skipped. Empty ranges are omitted.
    """
    ranges: list[OffsetRange] = []
    for tp in sorted(set(start) - set(end)):
        _lost(f"partition {tp.topic}-{tp.partition} no longer exists", fail_on_data_loss)
    for tp in sorted(end):
        until = end[tp]
        first = log_start.get(tp, 0)
        begin = start.get(tp, first)
        if until < begin:
            _lost(
                f"partition {tp.topic}-{tp.partition}'s offset went back from {begin} to {until}",
                fail_on_data_loss,
            )
            continue
        if begin < first:
            _lost(
                f"cannot read {tp.topic}-{tp.partition} from offset {begin}: the log now starts "
                f"at {first}",
                fail_on_data_loss,
            )
            begin = min(first, until)
        if until > begin:
            ranges.append(OffsetRange(tp, begin, until))
    return ranges


def divide_range(r: OffsetRange, parts: int) -> list[OffsetRange]:
    """``r`` cut into ``parts`` consecutive ranges of nearly equal size (Spark's
    getDividedPartition: integer shares, the last ones taking the round-off); empty ones
    omitted."""
    out: list[OffsetRange] = []
    remaining, begin = r.size, r.from_offset
    for part in range(parts):
        share = remaining // (parts - part)
        remaining -= share
        end = min(begin + share, r.until_offset)
        if end > begin:
            out.append(OffsetRange(r.tp, begin, end))
        begin = end
    return out


def split_ranges(
    ranges: list[OffsetRange], min_partitions: int | None, max_records_per_partition: int | None
) -> list[OffsetRange]:
    """Spark's KafkaOffsetRangeCalculator: first every range above
    ``max_records_per_partition`` is cut into ceil(size / max) parts; then, while there are
    fewer ranges than ``min_partitions``, the big ones are cut in proportion to their size
    (``round(size / total * minPartitions)`` parts, at least 1), small ones (1 part) left
    whole and not counted in the proportion.

    Invariants: the result covers exactly the records of ``ranges`` (same partitions, no gap,
    no overlap, order within a partition kept); no range is empty; with
    ``max_records_per_partition`` none is bigger than it."""
    ranges = [r for r in ranges if r.size > 0]
    if max_records_per_partition is not None:
        ranges = [
            piece
            for r in ranges
            for piece in divide_range(r, -(-r.size // max_records_per_partition))
        ]
    if min_partitions is None or min_partitions <= len(ranges):
        return ranges
    total = sum(r.size for r in ranges)

    def part_count(size: int, of_total: int, parts: int) -> int:
        # Scala's math.round rounds half up.
        return max(int(size / of_total * parts + 0.5), 1)

    whole = [part_count(r.size, total, min_partitions) == 1 for r in ranges]
    whole_size = sum(r.size for r, w in zip(ranges, whole, strict=True) if w)
    split_total = total - whole_size
    split_parts = max(min_partitions - sum(whole), 1)
    out: list[OffsetRange] = []
    for r, is_whole in zip(ranges, whole, strict=True):
        parts = 1 if is_whole else part_count(r.size, split_total, split_parts)
        out.extend(divide_range(r, parts))
    return out


class TriggerDelay:
    """``minOffsetsPerTrigger`` with ``maxTriggerDelay`` (Spark's Kafka source's delayBatch):
    a micro-batch waits until at least ``min_records`` records are available, or until
    ``max_delay_ms`` have passed since the last batch that ran.

    Pure: the caller passes the clock. Invariant: ``last_trigger_ms`` moves only when a batch
    is allowed to run. It starts at construction, so after a restart the first batch with too
    few records waits at most ``max_delay_ms``."""

    def __init__(self, min_records: int, max_delay_ms: int, now_ms: int) -> None:
        if min_records < 1 or max_delay_ms < 0:
            raise ValueError(f"bad trigger delay: min {min_records}, max delay {max_delay_ms}")
        self.min_records = min_records
        self.max_delay_ms = max_delay_ms
        self.last_trigger_ms = now_ms

    def should_wait(self, available: int, now_ms: int) -> bool:
        """True: skip this trigger (too few records and not waited long enough)."""
        if available >= self.min_records or now_ms - self.last_trigger_ms >= self.max_delay_ms:
            self.last_trigger_ms = now_ms
            return False
        return True


def available_records(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int]
) -> int:
    """Records between two offset documents (partitions new in ``latest`` count from 0 here;
    callers fill their start in first)."""
    return sum(max(end - start.get(tp, 0), 0) for tp, end in latest.items())
