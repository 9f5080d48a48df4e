"""Types of the C extension built from _speedups.c (see fjord.records.speedups)."""

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from fjord.records.record import Header

_T = TypeVar("_T", bound=tuple[Any, ...])
_F = TypeVar("_F")

class RecordFutureBase:
    def __init__(self, batch: Any, relative_offset: int, timestamp: int) -> None: ...
    @property
    def _batch(self) -> Any: ...
    @property
    def _relative_offset(self) -> int: ...
    @property
    def _timestamp(self) -> int: ...

class RecordAppender:
    def __init__(self, batch_size: int) -> None: ...
    def append(
        self,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> bool: ...
    def try_append(
        self,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> int: ...
    def try_append_future(
        self,
        future_type: Callable[[Any, int, int], _F],
        completion: Any,
        timestamp_ms: int | None,
        key: bytes | None,
        value: bytes | None,
    ) -> _F | None: ...
    def try_append_many(
        self,
        timestamp_ms: int,
        keys: list[bytes | None] | None,
        values: list[bytes | None],
        start: int,
    ) -> int: ...
    def seal(self) -> None: ...
    def take_records(self) -> tuple[bytes, int, int, int]: ...
    @property
    def record_count(self) -> int: ...
    @property
    def size_in_bytes(self) -> int: ...
    @property
    def base_timestamp(self) -> int: ...
    @property
    def max_timestamp(self) -> int: ...
    @property
    def records_taken(self) -> bool: ...

def decode_record_tuples(
    data: bytes | bytearray | memoryview,
    base_offset: int,
    base_timestamp: int,
    record_count: int,
    last_offset_delta: int,
) -> list[tuple[int, int, bytes | None, bytes | None, tuple[Header, ...]]]: ...
def decode_records_as(
    cls: type[_T],
    data: bytes | bytearray | memoryview,
    base_offset: int,
    base_timestamp: int,
    record_count: int,
    last_offset_delta: int,
    min_offset: int,
    topic: str,
    partition: int,
    fixed_timestamp: int | None,
) -> list[_T]: ...
def binary_column(
    records: list[tuple[Any, ...]], index: int
) -> tuple[bytes, bytes, bytes | None, int]: ...
def int64_column(records: list[tuple[Any, ...]], index: int, multiplier: int) -> bytes: ...
def murmur2(data: bytes) -> int: ...
def group_by_partition(
    keys: list[bytes | None], values: list[Any], num_partitions: int, null_key_partition: int
) -> list[tuple[list[bytes | None], list[Any]] | None]: ...

_BinaryBuffers = tuple[bytes, bytes, bytes | None, int]

class ColumnBuilder:
    def __init__(self, timestamp_multiplier: int = 1) -> None: ...
    def append_section(
        self,
        data: bytes | bytearray | memoryview,
        base_offset: int,
        base_timestamp: int,
        record_count: int,
        last_offset_delta: int,
        min_offset: int,
        fixed_timestamp: int | None,
    ) -> int | None: ...
    def append_records(self, records: list[tuple[Any, ...]]) -> int: ...
    def take(self) -> tuple[int, _BinaryBuffers, _BinaryBuffers, bytes, bytes]: ...
    @property
    def rows(self) -> int: ...
    @property
    def data_bytes(self) -> int: ...
