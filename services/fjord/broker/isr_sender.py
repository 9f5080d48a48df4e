"""Sends the leader's ISR changes to the active controller (Kafka's AlterPartitionManager).

Asyncio shell: the decisions (which ISR to ask for, what an answer means) are the
ReplicaManager's and Partition's; this only batches the queued changes into one AlterPartition
RPC, sends it to the controller named in the metadata and reports each item's answer back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc
from grpc import aio

from fjord._proto import controller_pb2, controller_pb2_grpc
from fjord.broker.partition import PartitionAssignment
from fjord.broker.replica_manager import IsrChangeRequest, ReplicaManager
from fjord.errors import ErrorCode
from fjord.metadata import MetadataImage
from fjord.tls import open_channel
from fjord.topic_partition import TopicPartition

log = logging.getLogger(__name__)

#: Upper bound on one AlterPartition call (the controller writes etcd once per call).
ALTER_PARTITION_TIMEOUT_S = 10.0


class AlterPartitionSender:
    """Drains ``ReplicaManager.isr_requests`` into AlterPartition calls, one call at a time.

    Invariants: every request taken is answered to the ReplicaManager exactly once (committed,
    refused, or failed when the call itself failed: then its pending change is cleared and the
    leader proposes it again later); after a failed call the sender waits
    ``replica.fetch.backoff.ms`` before the next one, so a missing controller is not hammered.
    """

    def __init__(
        self,
        replicas: ReplicaManager,
        image: Callable[[], MetadataImage],
        broker_epoch: Callable[[], int],
        on_stale_registration: Callable[[], None] | None = None,
    ) -> None:
        """``on_stale_registration``: called when the controller answers STALE_BROKER_EPOCH
        (our registration is not the current one: it expired, or a newer one exists)."""
        self._replicas = replicas
        self._image = image
        self._broker_epoch = broker_epoch
        self._on_stale_registration = on_stale_registration
        self._channel: aio.Channel | None = None
        self._address: str | None = None

    async def close(self) -> None:
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await self._channel.close()
        self._channel = None
        self._address = None

    async def _stub(self) -> controller_pb2_grpc.ControllerStub | None:
        controller = self._image().controller
        if controller is None:
            return None
        address = controller.registration.address
        if self._channel is None or address != self._address:
            await self.close()
            self._channel = open_channel(address)
            self._address = address
        return controller_pb2_grpc.ControllerStub(self._channel)

    async def run(self) -> None:
        backoff_s = self._replicas.replication.fetch_backoff_ms / 1000
        try:
            while True:
                await self._replicas.isr_requests_ready.wait()
                requests = self._replicas.take_isr_requests()
                if requests and not await self.send(requests):
                    await asyncio.sleep(backoff_s)
        finally:
            await self.close()

    async def send(self, requests: list[IsrChangeRequest]) -> bool:
        """One AlterPartition for ``requests``; returns False when the call failed as a whole."""
        stub = await self._stub()
        if stub is None:
            self._fail_all(requests, "no active controller")
            return False
        call = controller_pb2.AlterPartitionRequest(
            broker_id=self._replicas.broker_id, broker_epoch=self._broker_epoch()
        )
        for r in requests:
            call.partitions.add(
                topic=r.topic,
                partition=r.partition,
                leader_epoch=r.leader_epoch,
                partition_epoch=r.partition_epoch,
                new_isr=list(r.new_isr),
                resign=r.resign,
            )
        try:
            response = await stub.AlterPartition(call, timeout=ALTER_PARTITION_TIMEOUT_S)
        except asyncio.CancelledError:
            self._fail_all(requests, "shutting down")
            raise
        except grpc.RpcError as exc:
            await self.close()
            self._fail_all(requests, f"AlterPartition call failed: {exc}")
            return False
        if response.error.code != 0:
            if (response.error.code == ErrorCode.STALE_BROKER_EPOCH.code
                    and self._on_stale_registration is not None):
                self._on_stale_registration()
            self._fail_all(requests, f"AlterPartition refused: {response.error.message}")
            return False
        answers = {(p.topic, p.partition): p for p in response.partitions}
        for r in requests:
            answer = answers.get((r.topic, r.partition))
            if answer is None:
                self._replicas.on_isr_change_result(r, ErrorCode.UNKNOWN_SERVER_ERROR.code, None)
                continue
            state = None
            if answer.isr:  # the committed state, or the current one with a refusal
                key = TopicPartition(r.topic, r.partition)
                hosted = self._replicas.partitions.get(key)
                replicas = hosted.assignment.replicas if hosted is not None else tuple(answer.isr)
                state = PartitionAssignment(
                    leader=answer.leader,
                    leader_epoch=answer.leader_epoch,
                    replicas=tuple(replicas),
                    isr=tuple(answer.isr),
                    partition_epoch=answer.partition_epoch,
                )
            if r.resign:
                pass  # the ReplicaManager logs the outcome of a resignation once
            elif answer.error.code == 0:
                log.info(
                    "%s-%d: ISR is now %s (partition epoch %d)",
                    r.topic,
                    r.partition,
                    list(answer.isr),
                    answer.partition_epoch,
                )
            else:
                log.warning(
                    "%s-%d: ISR change to %s (partition epoch %d) refused: %s",
                    r.topic,
                    r.partition,
                    list(r.new_isr),
                    r.partition_epoch,
                    answer.error.message,
                )
            self._replicas.on_isr_change_result(r, answer.error.code, state)
        return True

    def _fail_all(self, requests: list[IsrChangeRequest], why: str) -> None:
        log.warning("ISR changes of %d partitions not sent: %s", len(requests), why)
        for r in requests:
            self._replicas.on_isr_change_result(r, ErrorCode.UNKNOWN_SERVER_ERROR.code, None)
