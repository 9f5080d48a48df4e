"""Producer ids for InitProducerId: a broker hands them out from blocks the controller grants.

:class:`ProducerIdBlocks` is the pure core (which ids are left); :class:`ProducerIdAllocator`
is the shell that asks the active controller for a new block (``AllocateProducerIds``, fenced by
this broker's epoch) when the current one runs out. The controller records the next free id in
etcd (``producer-ids``) before answering, so no id is ever handed out twice, even across
controller fail-overs and broker restarts (a restarted broker simply asks for a new block; the
rest of its old block is never used).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from fjord._proto import controller_pb2, controller_pb2_grpc
from fjord.broker import defaults
from fjord.errors import ErrorCode, FjordError, error_code_from_number, error_for_code
from fjord.metadata import MetadataImage
from fjord.tls import open_channel

log = logging.getLogger(__name__)


class ProducerIdBlocks:
    """The ids this broker may still hand out.

    Invariants: ``next_id <= end``; every id returned by :meth:`take` lies in a block granted
    by the controller and is returned at most once; blocks are used in the order granted.
    """

    def __init__(self) -> None:
        self.next_id = 0
        self.end = 0  # exclusive

    @property
    def remaining(self) -> int:
        return self.end - self.next_id

    def add_block(self, first_id: int, count: int) -> None:
        if first_id < 0 or count <= 0:
            raise FjordError(
                f"invalid producer id block ({first_id}, {count})", ErrorCode.UNKNOWN_SERVER_ERROR
            )
        self.next_id, self.end = first_id, first_id + count

    def take(self) -> int | None:
        """The next free id, or None when the block is used up."""
        if self.next_id >= self.end:
            return None
        pid = self.next_id
        self.next_id += 1
        return pid


class ProducerIdAllocator:
    """Answers InitProducerId: a fresh producer id with epoch 0 for every call.

    Kafka gives an idempotent (non-transactional) producer a new id on every InitProducerId;
    the producer then bumps its epoch itself when it must reset its sequences. One block
    request is in flight at a time (a lock), so concurrent calls share it.
    """

    def __init__(
        self,
        broker_id: int,
        image: Callable[[], MetadataImage],
        channel_options: list[tuple[str, int]] | None = None,
    ) -> None:
        self.broker_id = broker_id
        self._image = image
        self._blocks = ProducerIdBlocks()
        self._lock = asyncio.Lock()
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._channel_options = channel_options or []

    async def new_producer_id(self) -> int:
        async with self._lock:
            pid = self._blocks.take()
            if pid is None:
                first, count = await self._allocate_block()
                self._blocks.add_block(first, count)
                pid = self._blocks.take()
                assert pid is not None
            return pid

    async def _allocate_block(self) -> tuple[int, int]:
        image = self._image()
        active = image.controller
        epoch = image.broker_epoch(self.broker_id)
        if active is None or epoch is None:
            raise FjordError(
                "no active controller (or this broker is not registered yet) to allocate "
                "producer ids from",
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
            )
        address = active.registration.address
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(
                address, options=self._channel_options
            )
        stub = controller_pb2_grpc.ControllerStub(channel)
        try:
            response = await stub.AllocateProducerIds(
                controller_pb2.AllocateProducerIdsRequest(
                    broker_id=self.broker_id, broker_epoch=epoch
                ),
                timeout=defaults.PRODUCER_ID_ALLOCATION_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as exc:
            raise FjordError(
                f"controller {address} did not allocate producer ids: {exc.code().name}",
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
            ) from exc
        if response.error.code:
            code = error_code_from_number(response.error.code)
            if code in (ErrorCode.NOT_CONTROLLER, ErrorCode.STALE_BROKER_EPOCH):
                # Metadata lags behind a fail-over or a re-registration: the client retries.
                raise FjordError(
                    f"producer id allocation refused: {code.name} {response.error.message}",
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                )
            raise error_for_code(code, response.error.message)
        log.info(
            "broker %d got producer ids [%d, %d)",
            self.broker_id,
            response.first_producer_id,
            response.first_producer_id + response.count,
        )
        return int(response.first_producer_id), int(response.count)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
