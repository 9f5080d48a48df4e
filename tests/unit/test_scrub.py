"""The scrubber's pure parts (fjord.storage.scrub, fjord.broker.damage) and the log's side of
damage: a read never serves a damaged batch, serves the intact ones before it, and truncating
below the damage clears it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fjord.broker.damage import DamageAction, damage_action, no_healthy_copy_message
from fjord.errors import CorruptRecordError, LogDamagedError
from fjord.records.header import BATCH_HEADER_SIZE, iter_batches, stamp_batch, validate_batch
from fjord.storage import LogConfig, PartitionLog
from fjord.storage.scrub import (
    LogDamage,
    ScrubScheduler,
    ScrubThrottle,
    SegmentRef,
    check_batches,
)
from fjord.storage.testing import make_batch
from fjord.testing.damage import batch_count, flip_byte_in_batch


def stored(counts: list[int], first_offset: int = 0) -> tuple[bytes, list[tuple[int, int, int]]]:
    """Batches as a log stores them (offsets stamped), with (position, base, next) of each."""
    out = bytearray()
    where = []
    offset = first_offset
    for n in counts:
        b = bytearray(make_batch([b"v%d" % i for i in range(n)], 1000))
        stamp_batch(b, 0, offset, 0)
        where.append((len(out), offset, offset + n))
        out += b
        offset += n
    return bytes(out), where


def flipped(data: bytes, at: int) -> bytes:
    b = bytearray(data)
    b[at] ^= 0x01
    return bytes(b)


def test_intact_batches_pass_and_a_partial_tail_waits_for_more() -> None:
    data, where = stored([2, 3, 1], first_offset=10)
    check = check_batches(data, 10, final=True)
    assert (check.valid_bytes, check.next_offset, check.damage) == (len(data), 16, None)
    cut = check_batches(data[:-5], 10, final=False)
    assert (cut.valid_bytes, cut.next_offset, cut.damage) == (where[2][0], 15, None)
    torn = check_batches(data[:-5], 10, final=True)
    assert torn.damage is not None and torn.damage.offset == 15


def test_a_flipped_record_byte_is_damage_with_a_resume_offset() -> None:
    data, where = stored([2, 3, 1, 4])
    pos, base, nxt = where[1]
    check = check_batches(flipped(data, pos + BATCH_HEADER_SIZE + 2), 0, final=True)
    assert check.valid_bytes == pos and check.next_offset == base
    assert check.damage == LogDamage(base, nxt, check.damage.reason if check.damage else "")
    assert check.damage is not None and "CRC mismatch" in check.damage.reason
    assert check.damage.covers(base) and check.damage.covers(nxt - 1)
    assert not check.damage.covers(nxt) and not check.damage.covers(base - 1)


def test_a_flipped_base_offset_outside_the_crc_is_caught_as_a_gap() -> None:
    data, where = stored([2, 3])
    pos = where[1][0]
    check = check_batches(flipped(data, pos + 7), 0, final=True)  # low byte of base offset
    assert check.damage is not None and check.damage.offset == 2
    assert check.damage.resume_offset is None and "expected 2" in check.damage.reason


@given(st.lists(st.integers(1, 5), min_size=1, max_size=6), st.data())
def test_any_single_flip_is_found_at_or_before_its_batch(counts, data) -> None:  # type: ignore[no-untyped-def]
    stream, where = stored(counts)
    at = data.draw(st.integers(0, len(stream) - 1))
    # The partition leader epoch (bytes 12..15 of a batch) is outside the CRC and carries no
    # offset: a flip there is not detectable by any check and is not asked for.
    owner = max(i for i, (pos, _, _) in enumerate(where) if pos <= at)
    if 12 <= at - where[owner][0] < 16:
        return
    check = check_batches(flipped(stream, at), 0, final=True)
    assert check.damage is not None
    assert check.damage.offset <= where[owner][1]
    assert check.valid_bytes <= where[owner][0]


def test_throttle_spreads_reads_at_the_rate_and_saves_at_most_a_second() -> None:
    throttle = ScrubThrottle(1000, now_s=0.0)
    assert throttle.delay_for(500, 0.0) == pytest.approx(0.5)
    assert throttle.delay_for(500, 0.5) == pytest.approx(0.5)  # the first wait was spent
    assert throttle.delay_for(1000, 100.0) == 0.0  # idle: one second's allowance, no more
    assert throttle.delay_for(1000, 100.0) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        ScrubThrottle(0, 0.0)


def test_scheduler_verifies_each_segment_once_per_pass_unclean_partitions_first() -> None:
    scheduler = ScrubScheduler()
    segments = [SegmentRef("a", 0, 0, 10), SegmentRef("a", 0, 5, 10), SegmentRef("b", 0, 0, 20),
                SegmentRef("b", 0, 7, 20)]
    scheduler.prioritize(("b", 0))
    order = []
    while (ref := scheduler.next_segment(segments)) is not None:
        order.append((ref.topic, ref.base_offset))
        scheduler.mark_verified(ref)
        assert scheduler.progress(segments).verified_segments == len(order)
    assert order == [("b", 7), ("b", 0), ("a", 0), ("a", 5)]
    assert scheduler.progress(segments).fraction == 1.0
    scheduler.start_pass()
    assert scheduler.pass_number == 2
    assert scheduler.next_segment(segments) == segments[0]  # priority is per pass
    # A segment rolled during the pass joins it; a deleted one is forgotten.
    assert scheduler.next_segment([SegmentRef("c", 0, 0, 1)]) == SegmentRef("c", 0, 0, 1)


def test_damage_actions_prefer_a_healthy_copy() -> None:
    assert damage_action(1, 2, (1, 2)) is DamageAction.REFETCH
    assert damage_action(1, -1, (2,)) is DamageAction.WAIT_FOR_LEADER
    assert damage_action(1, 1, (1, 3)) is DamageAction.RESIGN
    assert damage_action(1, 1, (1,)) is DamageAction.NO_HEALTHY_COPY
    message = no_healthy_copy_message("t", 0, 374, 380, 1, "CRC mismatch")
    assert "t-0" in message and "offset 374" in message and "380" in message
    assert "DeleteRecords" in message


def test_a_loaded_segment_is_checked_on_read_and_the_damage_never_served(tmp_path: Path) -> None:
    config = LogConfig.from_dict({"segment.bytes": 400})
    log = PartitionLog.open(tmp_path / "t-0", config)
    for i in range(12):
        log.append(make_batch([b"x" * 20 for _ in range(2)], 1000 + i), 0)
    log.close()
    first = sorted((tmp_path / "t-0").glob("*.log"))[0]
    data = first.read_bytes()
    batches = [(pos, h) for pos, h in iter_batches(data)]
    pos, header = batches[1]
    first.write_bytes(flipped(data, pos + header.size - 3))
    log = PartitionLog.open(tmp_path / "t-0", config)
    try:
        served = log.read(0, 1 << 20)
        assert [h.base_offset for _, h in iter_batches(served)] == [0]  # the intact prefix
        assert log.damage is not None and log.damage.offset == header.base_offset
        with pytest.raises(LogDamagedError) as raised:
            log.read(header.base_offset, 1 << 20)
        assert raised.value.offset == header.base_offset
        # Past the damaged batch (framing intact) reads go on.
        after = log.read(header.next_offset, 1 << 20)
        assert next(iter_batches(after))[1].base_offset == header.next_offset
        log.truncate_to(header.base_offset)
        assert log.damage is None and log.log_end_offset == header.base_offset
    finally:
        log.close()


def test_scrubber_settings_are_broker_keys_checked_by_name() -> None:
    from fjord.cluster.broker_config import validate_broker_config
    from fjord.cluster.scrubber_config import ScrubberSettings
    from fjord.errors import ConfigError

    settings = ScrubberSettings.from_config({"log.scrubber.io.max.bytes.per.second": "1024",
                                             "log.scrubber.enable": "FALSE"})
    assert (settings.io_max_bytes_per_second, settings.enable) == (1024, False)
    for key, bad in (("log.scrubber.io.max.bytes.per.second", "0"),
                     ("log.scrubber.backoff.ms", "soon"), ("log.scrubber.enable", "yes")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            validate_broker_config({key: bad})


def test_partitions_recovered_after_an_unclean_stop_are_scrubbed_first(tmp_path: Path) -> None:
    from fjord.broker.replica_manager import ReplicaManager
    from fjord.broker.scrubber import Scrubber
    from fjord.cluster.scrubber_config import ScrubberSettings
    from fjord.storage import LogManager

    logs = LogManager(tmp_path)
    for topic in ("a", "z"):
        plog = logs.get_or_create(topic, 0)
        plog.append(make_batch([b"v"], 1000), 0)
        plog.roll()
        plog.append(make_batch([b"w"], 1001), 0)
    logs.get_or_create("z", 0).abandon()  # a crash: no clean-shutdown marker
    logs.close()
    logs = LogManager(tmp_path)
    try:
        scrubber = Scrubber(ReplicaManager(1, logs), ScrubberSettings())
        scrubber.prioritize_unclean(logs.logs())
        closed = [SegmentRef(t, 0, 0, 10) for t in ("a", "z")]
        assert scrubber.scheduler.next_segment(closed) == closed[1]
    finally:
        logs.close()


def test_flip_byte_in_batch_names_a_missing_batch(tmp_path: Path) -> None:
    """The damage helper of the integration and chaos tests: it damages the n-th batch inside
    what its CRC covers, and a segment with fewer batches (a producer's grown batch holds many
    records) is a named IndexError, not a torn header read past the end."""
    data, where = stored([3, 1, 5])
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(data)
    assert batch_count(segment) == 3
    flipped = flip_byte_in_batch(segment, 2)
    assert (flipped.base_offset, flipped.next_offset) == (4, 9)
    damaged = segment.read_bytes()
    validate_batch(damaged, where[1][0])  # the others intact
    with pytest.raises(CorruptRecordError, match="CRC"):
        validate_batch(damaged, where[2][0])
    with pytest.raises(IndexError, match="holds 3 batches, no batch 3"):
        flip_byte_in_batch(segment, 3)
