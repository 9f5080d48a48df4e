"""An in-memory ``__consumer_offsets`` for GroupManager tests (the Appender the coordinator's
shell writes through), acknowledging appends the way a broker would."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from fjord.coordinator.manager import EncodedRecord
from fjord.coordinator.offsets_log import GroupMetadataLoader
from fjord.errors import ErrorCode, error_for_code


class Log:
    """An in-memory ``__consumer_offsets``: appends wait in ``held`` until released (``auto``
    releases each one on the next loop iteration, as an acknowledgement would arrive)."""

    def __init__(self, auto: bool = True) -> None:
        self.auto = auto
        self.records: dict[int, list[EncodedRecord]] = {}
        self.submitted: list[tuple[int, list[EncodedRecord]]] = []
        self.epochs: list[tuple[int, int]] = []
        self.held: list[tuple[int, list[EncodedRecord], asyncio.Future[None]]] = []

    def submit(
        self, partition: int, epoch: int, records: Sequence[EncodedRecord]
    ) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.submitted.append((partition, list(records)))
        self.epochs.append((partition, epoch))
        self.held.append((partition, list(records), future))
        if self.auto:
            asyncio.get_running_loop().call_soon(self.release)
        return future

    def release(self, error: ErrorCode | None = None) -> None:
        held, self.held = self.held, []
        for partition, records, future in held:
            if error is None:
                self.records.setdefault(partition, []).extend(records)
                future.set_result(None)
            else:
                future.set_exception(error_for_code(error, "append failed"))

    def replay(self, partition: int) -> GroupMetadataLoader:
        loader = GroupMetadataLoader()
        for key, value in self.records.get(partition, []):
            loader.apply_bytes(key, value)
        return loader
