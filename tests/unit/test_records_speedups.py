"""The C extension (fjord.records._speedups) against the pure-Python record code it speeds up
(issue 18): byte-identical batches, the same decoded records, the same errors (type and
message) for bad input and damaged sections, and kafka-python decoding what the C builder
writes. The other record tests run against both implementations (``records_implementation``
in conftest.py); these compare the two directly."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch

from fjord.client.types import ConsumerRecord
from fjord.errors import CorruptRecordError, InvalidRecordError
from fjord.records import BATCH_HEADER_SIZE, Compression, TimestampType, speedups
from fjord.records.builder import PyBatchBuilder
from fjord.records.reader import RecordBatch, py_decode_record_tuples, py_decode_records_as
from tests.helpers.records import record_implementation

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


@pytest.fixture(scope="module")
def c_impl() -> dict[str, Any]:
    return record_implementation("c")


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """What a call returns, or the type and message of what it raises."""
    try:
        return "ok", fn()
    except Exception as exc:
        return type(exc).__name__, str(exc)


BYTES_LIKE = st.one_of(
    st.none(),
    st.binary(max_size=300),
    st.binary(max_size=40).map(bytearray),
    st.binary(max_size=40).map(memoryview),
)
HEADERS = st.one_of(
    st.just(()),
    st.lists(
        st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))),
        max_size=3,
    ).map(tuple),
)
TIMESTAMPS = st.one_of(
    st.integers(-1, 1 << 45),
    st.integers(INT64_MIN, INT64_MAX),
    st.sampled_from([0, -1, INT64_MIN, INT64_MAX, 8191, -8192, 8192, -8193]),
)
RECORDS = st.lists(st.tuples(TIMESTAMPS, BYTES_LIKE, BYTES_LIKE, HEADERS), min_size=1, max_size=30)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=RECORDS,
    batch_size=st.integers(1, 4000),
    codec=st.sampled_from([Compression.NONE, Compression.LZ4]),
    producer=st.tuples(st.integers(-1, 1 << 40), st.integers(-1, 300), st.integers(-1, 1 << 20)),
    log_append=st.booleans(),
)
def test_the_c_builder_writes_the_same_bytes(
    c_impl, records, batch_size, codec, producer, log_append
) -> None:
    settings_ = {
        "compression": codec,
        "batch_size": batch_size,
        "producer_id": producer[0],
        "producer_epoch": producer[1],
        "base_sequence": producer[2],
        "timestamp_type": (
            TimestampType.LOG_APPEND_TIME if log_append else TimestampType.CREATE_TIME
        ),
    }
    ours, reference = c_impl["BatchBuilder"](**settings_), PyBatchBuilder(**settings_)
    for record in records:
        got = outcome(lambda b=ours, r=record: b.append(*r))
        want = outcome(lambda b=reference, r=record: b.append(*r))
        if want[0] == "ok":
            assert got == want
        else:  # the C builder refuses a timestamp out of int64 at once, Python may at build()
            assert got[0] == want[0] == "InvalidRecordError"
            return
        assert (ours.record_count, ours.size_in_bytes) == (
            reference.record_count,
            reference.size_in_bytes,
        )
    built, expected = outcome(ours.build), outcome(reference.build)
    assert built == expected
    if built[0] == "ok" and codec == Compression.NONE:
        parsed = DefaultRecordBatch(built[1])
        assert parsed.validate_crc()
        assert len(list(parsed)) == ours.record_count


def test_same_errors_for_bad_input(c_impl) -> None:
    cases: list[tuple[Any, ...]] = [
        (1.5, b"k", b"v", ()),
        (True, b"k", b"v", ()),
        (1, "text", b"v", ()),
        (1, b"k", 42, ()),
        (1, b"k", b"v", (("name", "not bytes"),)),
        (1, b"k", b"v", ((1, b"v"),)),
        (1, b"k", b"v", ("x",)),
        (1, b"k", b"v", (("\ud800", b"v"),)),
        (INT64_MAX + 1, b"k", b"v", ()),
        (INT64_MIN - 1, None, None, ()),
    ]
    for args in cases:
        ours, reference = c_impl["BatchBuilder"](), PyBatchBuilder()
        got = outcome(lambda b=ours, a=args: b.append(*a))
        assert got == outcome(lambda b=reference, a=args: b.append(*a)), args
        assert got[0] == "InvalidRecordError", args
    # A delta out of int64 after a first record at one end of the range.
    ours, reference = c_impl["BatchBuilder"](), PyBatchBuilder()
    for builder in (ours, reference):
        assert builder.append(INT64_MIN, None, b"v")
    assert outcome(lambda: ours.append(INT64_MAX, None, b"v")) == outcome(
        lambda: reference.append(INT64_MAX, None, b"v")
    )
    # After build(): append refused, build() returns the same bytes.
    for builder in (ours, reference):
        first = builder.build()
        assert builder.build() is first
        with pytest.raises(InvalidRecordError, match="has been built"):
            builder.append(1, None, b"v")
    with pytest.raises(InvalidRecordError, match="without records"):
        c_impl["BatchBuilder"]().build()


def test_keyword_arguments_and_arity(c_impl) -> None:
    builder = c_impl["BatchBuilder"]()
    assert builder.append(timestamp_ms=5, key=None, value=b"v", headers=(("h", None),))
    assert builder.append(6, None, value=b"w")
    with pytest.raises(TypeError):
        builder.append(7, None)
    with pytest.raises(TypeError):
        builder.append(7, None, b"v", (), "extra")
    with pytest.raises(TypeError):
        builder.append(7, None, b"v", colour=1)
    reference = PyBatchBuilder()
    assert reference.append(5, None, b"v", (("h", None),)) and reference.append(6, None, b"w")
    assert builder.build() == reference.build()


def _section(records: list[tuple[int, bytes | None, bytes | None, tuple]]) -> tuple[bytes, Any]:
    builder = PyBatchBuilder(batch_size=1 << 30)
    for timestamp, key, value, headers in records:
        assert builder.append(timestamp, key, value, headers)
    batch = RecordBatch(builder.build())
    return batch.records_section(), batch.header


VALID = st.lists(
    st.tuples(
        st.integers(0, 1 << 42),
        st.one_of(st.none(), st.binary(max_size=30)),
        st.one_of(st.none(), st.binary(max_size=200)),
        HEADERS,
    ),
    min_size=1,
    max_size=20,
)

#: Base offsets of a decoded section, up to the largest an offset can be.
BASE_OFFSETS = st.sampled_from([0, 7, (1 << 62), INT64_MAX])
#: Damage to a records section: a byte flipped (xor) at a position, or the section cut there.
FLIP_OR_CUT = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10_000)),
)



def _damaged(section: bytes, damage: tuple[Any, ...] | None) -> bytes:
    """``section`` with ``damage`` done to it (None: none; positions wrap around its length):
    ("flip", at, mask), ("cut", at) or ("insert", at, data)."""
    if damage is None:
        return section
    at = damage[1] % len(section)
    if damage[0] == "flip":
        return section[:at] + bytes([section[at] ^ damage[2]]) + section[at + 1 :]
    if damage[0] == "cut":
        return section[:at]
    return section[:at] + damage[2] + section[at:]

@settings(max_examples=400, deadline=None)
@given(
    records=VALID,
    base_offset=BASE_OFFSETS,
    damage=st.one_of(
        st.none(),
        FLIP_OR_CUT,
        st.tuples(st.just("insert"), st.integers(0, 10_000), st.binary(min_size=1, max_size=3)),
    ),
    count_change=st.sampled_from([0, 0, 0, -1, 1, -100]),
    delta_change=st.sampled_from([0, 0, -1, 5]),
)
def test_the_c_decoders_agree_on_valid_and_damaged_sections(
    c_impl, records, base_offset, damage, count_change, delta_change
) -> None:
    section, header = _section(records)
    section = _damaged(section, damage)
    args = (
        section,
        base_offset,
        header.base_timestamp,
        header.record_count + count_change,
        header.last_offset_delta + delta_change,
    )
    expected = outcome(lambda: py_decode_record_tuples(*args))
    assert outcome(lambda: c_impl["decode_record_tuples"](*args)) == expected
    # The C decoder reads any buffer (the consumer hands it a view of the fetched bytes).
    view_args = (memoryview(bytearray(section)), *args[1:])
    assert outcome(lambda: c_impl["decode_record_tuples"](*view_args)) == expected
    if expected[0] == "ok":
        assert all(type(k) in (bytes, type(None)) for _, _, k, _, _ in expected[1])
    for min_offset, fixed in ((-1, None), (base_offset + 2, None), (0, 1234)):
        as_args = (ConsumerRecord, *view_args[:5], min_offset, "topic", 3, fixed)
        py_args = (ConsumerRecord, *args, min_offset, "topic", 3, fixed)
        got = outcome(lambda a=as_args: c_impl["decode_records_as"](*a))
        assert got == outcome(lambda a=py_args: py_decode_records_as(*a))
        if got[0] == "ok":
            assert all(type(r) is ConsumerRecord for r in got[1])


def test_decoded_records_are_consumer_records(c_impl) -> None:
    records = [(1_000 + i, b"k%d" % i, b"v" * i, (("h", b"x"),) if i % 2 else ()) for i in range(5)]
    section, header = _section(records)
    out = c_impl["decode_records_as"](
        ConsumerRecord, section, 100, header.base_timestamp, 5, 4, 102, "t", 7, None
    )
    assert out == [
        ConsumerRecord("t", 7, 100 + i, b"k%d" % i, b"v" * i, records[i][3], 1_000 + i)
        for i in range(2, 5)
    ]
    assert out[0].offset == 102 and out[0].trace_context is not None  # a real ConsumerRecord
    with pytest.raises(TypeError, match="tuple subclass"):
        c_impl["decode_records_as"](dict, section, 0, 0, 5, 4, 0, "t", 0, None)
    with pytest.raises(CorruptRecordError, match="records section holds"):
        c_impl["decode_records_as"](ConsumerRecord, section, 0, 0, 6, 5, 0, "t", 0, None)


class _RecordWithDict(tuple):  # a tuple subclass whose instances have a __dict__
    pass


def test_decoded_records_are_untracked_by_the_garbage_collector(c_impl) -> None:
    """Records (and their headers) hold only atoms, so the C decoders untrack them at once
    (young collections then never traverse a fetch's records); a record type whose instances
    have a __dict__ (a cycle is possible through it) stays tracked."""
    records = [(1_000 + i, b"k", b"v", (("h", b"x"),) if i % 2 else ()) for i in range(4)]
    section, header = _section(records)
    decoded = c_impl["decode_records_as"](
        ConsumerRecord, section, 0, header.base_timestamp, 4, 3, 0, "t", 0, None
    )
    tuples = c_impl["decode_record_tuples"](section, 0, header.base_timestamp, 4, 3)
    for record in decoded:
        assert not gc.is_tracked(record) and not gc.is_tracked(record.headers)
        assert not any(gc.is_tracked(h) for h in record.headers)
    for offset_timestamp_key_value_headers in tuples:
        assert not gc.is_tracked(offset_timestamp_key_value_headers)
    assert decoded[1].headers == (("h", b"x"),)
    with_dict = c_impl["decode_records_as"](
        _RecordWithDict, section, 0, header.base_timestamp, 4, 3, 0, "t", 0, None
    )
    assert all(gc.is_tracked(r) for r in with_dict)
    gc.collect()  # and the collector is fine with them
    assert decoded == c_impl["decode_records_as"](
        ConsumerRecord, section, 0, header.base_timestamp, 4, 3, 0, "t", 0, None
    )


def test_a_header_only_section_and_empty_input(c_impl) -> None:
    assert c_impl["decode_record_tuples"](b"", 0, 0, 0, 0) == []
    assert c_impl["decode_record_tuples"](b"", 0, 0, -3, 0) == py_decode_record_tuples(
        b"", 0, 0, -3, 0
    )
    assert outcome(lambda: c_impl["decode_record_tuples"](b"\x00", 0, 0, 0, 0)) == outcome(
        lambda: py_decode_record_tuples(b"\x00", 0, 0, 0, 0)
    )


def test_batch_header_bytes_come_from_python(c_impl) -> None:
    """Only the records section is C's: header and CRC are written by the same Python code."""
    builder = c_impl["BatchBuilder"](producer_id=9, producer_epoch=1, base_sequence=3)
    builder.append(1, None, b"v")
    batch = builder.build()
    assert len(batch) > BATCH_HEADER_SIZE
    assert RecordBatch(batch).header.producer_id == 9


@pytest.mark.parametrize("forced", ["1", "true", ""])
def test_fjord_pure_python_selects_the_fallback_at_import(forced: str) -> None:
    env = {**os.environ, speedups.PURE_PYTHON_ENV: forced}
    code = (
        "from fjord.records import builder, reader, speedups; "
        "print(speedups.IMPLEMENTATION, builder.BatchBuilder.__mro__[2].__name__, "
        "reader.decode_record_tuples.__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    if forced or speedups.EXTENSION is None:
        assert out == ["python", "PyRecordAppender", "py_decode_record_tuples"]
    else:
        assert out == ["c", "RecordAppender", "decode_record_tuples"]


def test_huge_record_counts_do_not_allocate(c_impl) -> None:
    """A header may claim 2**31 records; the decoder must fail on the data, not allocate."""
    section, _ = _section([(1, None, b"v", ())])
    with pytest.raises(CorruptRecordError):
        c_impl["decode_record_tuples"](section, 0, 0, (1 << 31) - 1, (1 << 31) - 1)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    keys=st.one_of(st.none(), st.lists(st.one_of(st.none(), st.binary(max_size=30)), max_size=40)),
    data=st.data(),
    batch_size=st.integers(1, 2000),
)
def test_try_append_many_is_try_append_in_a_loop(c_impl, keys, data, batch_size) -> None:
    """The C try_append_many appends what the Python one (try_append per record) appends: the
    same next index after each call, the same bytes, until a batch is full."""
    count = len(keys) if keys is not None else data.draw(st.integers(0, 40))
    values = data.draw(
        st.lists(st.one_of(st.none(), st.binary(max_size=200)), min_size=count, max_size=count)
    )
    ours, reference = c_impl["BatchBuilder"](batch_size=batch_size), PyBatchBuilder(
        batch_size=batch_size
    )
    start = data.draw(st.integers(0, count))
    got = ours.try_append_many(1_700_000_000_000, keys, values, start)
    want = reference.try_append_many(1_700_000_000_000, keys, values, start)
    assert got == want and start <= got <= count
    assert got > start or start == count  # an empty batch takes its first record
    assert ours.record_count == reference.record_count == got - start
    assert outcome(ours.build) == outcome(reference.build)


def test_try_append_many_errors(c_impl) -> None:
    for builder in (c_impl["BatchBuilder"](), PyBatchBuilder()):
        with pytest.raises(ValueError, match="differ in length"):
            builder.try_append_many(0, [b"k"], [b"a", b"b"], 0)
        with pytest.raises(ValueError, match="start must be >= 0"):
            builder.try_append_many(0, None, [b"a"], -1)
        # A value of the wrong type: the records before it stay appended, the error is the
        # Python builder's.
        with pytest.raises(InvalidRecordError):
            builder.try_append_many(0, None, [b"a", 42], 0)
        assert builder.record_count == 1


def _columns_of(c_impl: dict[str, Any], records: list[ConsumerRecord]) -> tuple[Any, ...]:
    """What ColumnBuilder(1000).take() must answer for ``records``: the per-field column
    builders' buffers (timestamps in microseconds)."""
    ext = speedups.EXTENSION
    assert ext is not None
    return (
        len(records),
        ext.binary_column(records, 3),
        ext.binary_column(records, 4),
        ext.int64_column(records, 2, 1),
        ext.int64_column(records, 6, 1000),
    )


@settings(max_examples=300, deadline=None)
@given(
    records=VALID,
    base_offset=BASE_OFFSETS,
    damage=st.one_of(st.none(), FLIP_OR_CUT),
    count_change=st.sampled_from([0, 0, 0, -1, 1]),
    before=st.lists(
        st.tuples(st.one_of(st.none(), st.binary(max_size=9)), st.integers(0, 1 << 40)),
        max_size=9,
    ),
)
def test_the_column_builder_agrees_with_the_decoder(
    c_impl, records, base_offset, damage, count_change, before
) -> None:
    """ColumnBuilder.append_section appends exactly the records decode_records_as returns, as
    columns; it leaves alone (None, appending nothing) only what it must: records with
    headers, offsets past int64 (min_offset too), and every section the decoder rejects."""
    section, header = _section(records)
    section = _damaged(section, damage)
    args = (section, base_offset, header.base_timestamp,
            header.record_count + count_change, header.last_offset_delta)  # fmt: skip
    # Rows already in the builder (null keys among them): a section left alone keeps them.
    held = [ConsumerRecord("t", 0, i, k, b"v", (), ts) for i, (k, ts) in enumerate(before)]
    every = outcome(lambda: py_decode_records_as(ConsumerRecord, *args, -1, "t", 0, None))
    for min_offset, fixed in ((-1, None), (base_offset + 2, None), (0, 1234)):
        builder = speedups.EXTENSION.ColumnBuilder(1000)
        assert builder.append_records(held) == len(held)
        expected = outcome(
            lambda m=min_offset, f=fixed: py_decode_records_as(
                ConsumerRecord, *args, m, "t", 0, f
            )
        )
        view = memoryview(bytearray(section))  # (any buffer: the fetched bytes' view)
        got = builder.append_section(view, *args[1:], min_offset, fixed)
        if got is None:
            assert (
                expected[0] != "ok"
                or min_offset > INT64_MAX
                or any(r.headers for r in every[1])
                or any(not INT64_MIN <= r.offset <= INT64_MAX for r in every[1])
            )
            assert builder.take() == _columns_of(c_impl, held)
        else:
            assert expected[0] == "ok" and got == len(expected[1])
            assert builder.rows == len(held) + got
            assert builder.take() == _columns_of(c_impl, held + expected[1])
        assert builder.rows == 0 and builder.take() == _columns_of(c_impl, [])


def test_the_column_builder_refuses_what_is_not_a_record(c_impl) -> None:
    builder = speedups.EXTENSION.ColumnBuilder(1000)
    good = ConsumerRecord("t", 0, 1, b"k", None, (), 5)
    assert builder.append_records([good]) == 1 and builder.data_bytes == 1
    with pytest.raises(TypeError, match="the value of record 1 is str"):
        builder.append_records([good, good._replace(value="text")])
    with pytest.raises(TypeError, match="record 0 is not a 7-field ConsumerRecord"):
        builder.append_records([(1, 2)])
    with pytest.raises(TypeError, match="records must be a list"):
        builder.append_records((good,))
    with pytest.raises(OverflowError, match="leaves int64"):
        builder.append_records([good, good._replace(timestamp=2**62)])
    with pytest.raises(TypeError, match="takes 7 arguments"):
        builder.append_section(b"", 0, 0, 0, 0, 0)
    # Nothing of a failed call stays.
    assert builder.take() == _columns_of(c_impl, [good])


class _Fallback:
    """The Python send() a FastSend hands every other call to: records what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.calls.append((args, kwargs))
        return "fallback"


def _fast_send(c_impl, targets: dict[str, Any], limit: int = 100):  # type: ignore[no-untyped-def]
    from fjord.client.futures import RecordFuture

    fallback = _Fallback()
    return speedups.EXTENSION.FastSend(targets, RecordFuture, fallback, limit), fallback


def _decoded(builder: Any) -> list[tuple[int, Any, Any]]:
    """(offset, key, value) of each record ``builder`` holds (timestamps are the clock's)."""
    return [(r.offset, r.key, r.value) for r in RecordBatch(builder.build()).records()]


CALLS = st.lists(
    st.one_of(
        st.tuples(st.just("positional"), st.sampled_from(["a", "b", "absent"]),
                  st.binary(max_size=140)),
        st.tuples(st.just("keyword"), st.sampled_from(["a", "b"]), st.binary(max_size=20)),
        st.tuples(st.just("bytearray"), st.sampled_from(["a", "b"]), st.binary(max_size=20)),
        st.tuples(st.just("three"), st.sampled_from(["a", "b"]), st.binary(max_size=20)),
    ),
    max_size=60,
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(calls=CALLS, batch_size=st.integers(1, 1500), limit=st.integers(0, 120))
def test_fast_send_is_the_producers_python_fast_path(c_impl, calls, batch_size, limit) -> None:
    """FastSend (the producer's send() fast path in C) appends exactly what the Python fast
    path appends (``builder.try_append_future`` when the call is ``send(topic, value)`` with a
    bytes value of at most the limit, for a topic with an open batch) and hands every other
    call, and every record the batch refuses, to the fallback with the same arguments."""
    from fjord.client.futures import BatchCompletion, RecordFuture

    def batches() -> dict[str, Any]:
        return {t: (c_impl["BatchBuilder"](batch_size=batch_size), BatchCompletion(t, 0))
                for t in ("a", "b")}

    ours, reference = batches(), batches()
    fast, fallback = _fast_send(c_impl, ours, limit)
    expected_fallback: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    for kind, topic, value in calls:
        if kind == "positional":
            got = fast(topic, value)
            target = reference.get(topic)
            want = None
            if target is not None and len(value) <= limit:
                want = target[0].try_append_future(RecordFuture, target[1], None, None, value)
            if want is None:
                expected_fallback.append(((topic, value), {}))
                assert got == "fallback"
            else:
                assert isinstance(got, RecordFuture)
                assert got._batch is ours[topic][1]
                assert got._relative_offset == want._relative_offset
        elif kind == "keyword":
            assert fast(topic, value=value) == "fallback"
            expected_fallback.append(((topic,), {"value": value}))
        elif kind == "bytearray":
            assert fast(topic, bytearray(value)) == "fallback"
            expected_fallback.append(((topic, bytearray(value)), {}))
        else:
            assert fast(topic, value, b"key") == "fallback"
            expected_fallback.append(((topic, value, b"key"), {}))
    assert fallback.calls == expected_fallback
    for topic in ("a", "b"):
        assert ours[topic][0].record_count == reference[topic][0].record_count
        if ours[topic][0].record_count:
            assert _decoded(ours[topic][0]) == _decoded(reference[topic][0])


def test_fast_send_closed_errors_and_plain_calls(c_impl) -> None:
    """After close() every call is the fallback's (the producer's send() then raises); an error
    of the fallback or of the topic lookup propagates; tp_call behaves as vectorcall."""
    from fjord.client.futures import BatchCompletion, RecordFuture

    builder = c_impl["BatchBuilder"]()
    targets = {"t": (builder, BatchCompletion("t", 0))}
    fast, fallback = _fast_send(c_impl, targets)
    assert isinstance(fast("t", b"v"), RecordFuture)
    assert isinstance(fast.__call__("t", b"w"), RecordFuture)  # tp_call
    assert not fast.closed and fast.__wrapped__ is fallback
    fast.close()
    assert fast.closed
    assert fast("t", b"x") == "fallback"
    assert builder.record_count == 2
    with pytest.raises(TypeError, match="unhashable"):
        _fast_send(c_impl, targets)[0]([], b"v")
    builder.seal()
    refused, fallback = _fast_send(c_impl, targets)
    assert refused("t", b"y") == "fallback" and fallback.calls == [(("t", b"y"), {})]

    def failing(*_: Any) -> None:
        raise ValueError("the slow path's own error")

    broken = speedups.EXTENSION.FastSend({}, RecordFuture, failing, 100)
    with pytest.raises(ValueError, match="slow path's own error"):
        broken("t", b"v")
    with pytest.raises(TypeError, match="RecordFutureBase"):
        speedups.EXTENSION.FastSend({}, object, failing, 100)
    with pytest.raises(TypeError, match="callable"):
        speedups.EXTENSION.FastSend({}, RecordFuture, None, 100)
