"""The data directory's condition, pure (fjord.storage.disk_health): each change reported
once, a full disk is told apart from other errors, only a probe makes it writable again."""

from __future__ import annotations

import errno

from hypothesis import given
from hypothesis import strategies as st

from fjord.errors import StorageError
from fjord.storage.disk_health import (
    DiskHealth,
    describe_os_error,
    is_out_of_space,
    write_error_of,
)

ENOSPC = OSError(errno.ENOSPC, "No space left on device")
EIO = OSError(errno.EIO, "Input/output error")


def wrapped(error: OSError) -> StorageError:
    try:
        raise StorageError("write to x.log failed") from error
    except StorageError as exc:
        return exc


def test_the_os_error_is_found_behind_a_storage_error() -> None:
    assert write_error_of(wrapped(ENOSPC)) is ENOSPC
    assert is_out_of_space(wrapped(ENOSPC)) and not is_out_of_space(wrapped(EIO))
    assert write_error_of(ValueError("a bug")) is None
    assert describe_os_error(ENOSPC) == "No space left on device (ENOSPC)"


def test_first_failure_changes_the_condition_repeats_do_not() -> None:
    health = DiskHealth()
    changed = health.on_write_failed("index flush", ENOSPC)
    assert changed is not None and not changed.writable and changed.out_of_space
    assert changed.operation == "index flush"
    for operation in ("append", "high-watermark checkpoint", "producer snapshot"):
        assert health.on_write_failed(operation, ENOSPC) is None
    assert health.failures["append"] == 1 and sum(health.failures.values()) == 4
    assert health.episodes == 1


def test_another_kind_of_error_is_a_change() -> None:
    health = DiskHealth()
    health.on_write_failed("append", ENOSPC)
    changed = health.on_write_failed("append", EIO)
    assert changed is not None and not changed.out_of_space and "EIO" in changed.reason
    assert health.episodes == 1


def test_only_a_successful_probe_makes_it_writable_again() -> None:
    health = DiskHealth()
    assert health.on_probe(None) is None  # writable already: nothing to say
    health.on_write_failed("append", ENOSPC)
    assert health.on_probe(ENOSPC) is None and not health.writable
    assert health.on_probe(None) is not None and health.writable
    assert health.on_write_failed("append", ENOSPC) is not None
    assert health.episodes == 2


EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("fail"), st.sampled_from([errno.ENOSPC, errno.EIO, errno.EDQUOT])),
        st.tuples(st.just("probe"), st.sampled_from([None, errno.ENOSPC])),
    ),
    max_size=40,
)


@given(EVENTS)
def test_a_change_is_reported_exactly_when_the_condition_changes(events) -> None:  # type: ignore[no-untyped-def]
    health = DiskHealth()
    for kind, code in events:
        before = health.condition
        error = None if code is None else OSError(code, "x")
        if kind == "fail":
            assert error is not None
            changed = health.on_write_failed("append", error)
        else:
            changed = health.on_probe(error)
        assert (changed is not None) == (health.condition != before)
        if changed is not None:
            assert changed == health.condition
        if kind == "fail":
            assert not health.writable  # a failure never leaves it writable
