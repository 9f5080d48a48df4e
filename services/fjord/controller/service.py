"""The controller's etcd shell: leader election on a lease, fenced metadata writes, and the
reactions to broker liveness. The decisions themselves are in the pure modules
(:mod:`~fjord.controller.planner`, :mod:`~fjord.controller.election`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aetcd
from aetcd import rpc

from fjord.cluster.dynamic_config import plan_broker_config
from fjord.controller.defaults import (
    AUTO_LEADER_REBALANCE_ENABLE,
    BROKER_REREGISTRATION_GRACE_S,
    ELECTION_POLL_S,
    ELECTION_RETRY_S,
    KEEPALIVE_FRACTION,
    LEADER_IMBALANCE_CHECK_INTERVAL_S,
    LEASE_TTL_S,
    MAX_TXN_OPS,
    PRODUCER_ID_BLOCK_SIZE,
    STEP_DOWN_MARGIN_S,
    WRITE_SETTLE_TIMEOUT_S,
)
from fjord.controller.election import alter_isr, resign_leadership
from fjord.controller.offsets_owners import (
    COORDINATOR_TOPICS,
    check_user_topic,
    offsets_topic_spec,
    plan_offsets_owners,
)
from fjord.controller.planner import (
    OngoingReassignment,
    PartitionOutcome,
    ReassignmentRequest,
    TopicPlan,
    TopicSpec,
    list_reassignments,
    partition_keys,
    plan_alter_configs,
    plan_alter_reassignments,
    plan_create_partitions,
    plan_create_topic,
    plan_elect_leaders,
    plan_preferred_rebalance,
    plan_reconcile,
)
from fjord.errors import (
    InvalidRequestError,
    NotControllerError,
    StaleBrokerEpochError,
    UnknownTopicOrPartitionError,
)
from fjord.groups.defaults import OFFSETS_TOPIC
from fjord.metadata import (
    ControllerRegistration,
    Keys,
    MetadataImage,
    MetadataWatcher,
    OffsetsOwner,
    PartitionState,
    ProducerIdBlock,
    TopicRecord,
)
from fjord.metadata.defaults import ETCD_REQUEST_TIMEOUT_S
from fjord.metadata.schema import AclEntries, ClusterConfig, ScramUser
from fjord.observability import set_active_controller, set_offline_partitions
from fjord.security.acls import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    ResourcePattern,
    plan_create_acls,
    plan_delete_acls,
)
from fjord.security.scram import (
    ScramAlterationError,
    ScramDeletion,
    ScramUpsertion,
    plan_alter_scram,
)
from fjord.serving import cancel_until_done
from fjord.topic_partition import TopicPartition

log = logging.getLogger(__name__)


class FencedError(NotControllerError):
    """A metadata txn failed its epoch compare: another controller has been elected since."""


@dataclass(frozen=True)
class AlterPartitionItemResult:
    """One partition's outcome: ``error`` set and ``state`` the current one on refusal, or
    ``error`` None and ``state`` the committed new state."""

    topic: str
    partition: int
    error: Exception | None
    state: PartitionState | None


def _own_cancellation() -> bool:
    """Whether the current task is being cancelled.

    grpc.aio raises CancelledError also when an RPC is cancelled by its channel (etcd
    connection reset); a background loop must survive that and stop only when cancelled."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def put_op(key: str, value: bytes, lease: int = 0) -> rpc.RequestOp:
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key.encode(), value=value, lease=lease))


def delete_op(key: str, prefix: bool = False) -> rpc.RequestOp:
    raw = key.encode()
    end = aetcd.utils.prefix_range_end(raw) if prefix else b""
    return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=raw, range_end=end))


def create_revision_is(key: str, revision: int) -> rpc.Compare:
    return rpc.Compare(
        key=key.encode(),
        target=rpc.Compare.CREATE,
        result=rpc.Compare.EQUAL,
        create_revision=revision,
    )


async def etcd_txn(
    client: aetcd.Client, compare: list[rpc.Compare], success: list[rpc.RequestOp]
) -> rpc.TxnResponse:
    """One etcd transaction with the full response (aetcd's helper drops the header, whose
    revision we need: it is the new controller epoch, or the revision a write must reach)."""
    await client.connect()
    try:
        return await client.kvstub.Txn(
            rpc.TxnRequest(compare=compare, success=success, failure=[]),
            timeout=ETCD_REQUEST_TIMEOUT_S,
            metadata=client.metadata,
        )
    except rpc.AioRpcError as exc:
        aetcd.exceptions._handle_exception(exc)
        raise  # unreachable: the handler always raises


class ControllerService:
    """One controller process: a candidate, a standby or the active controller.

    Election: a txn creates ``controller`` only if absent (create revision 0), bound to this
    controller's lease; the txn's revision is the controller epoch. Standbys re-run the txn
    whenever the watcher sees the key disappear.

    Invariants: :meth:`is_active` is true only while this controller holds the ``controller``
    key and its lease cannot have expired by its own clock (last successful keep-alive + TTL -
    margin); every metadata write is one etcd txn that compares the ``controller`` key's create
    revision with this controller's epoch, so a deposed controller's writes fail; writes are
    serialised by one lock and each waits until the watcher has applied it, so every decision
    is taken on an image that includes all earlier writes of this controller. While any
    coordinator is registered, the active controller keeps every ``__consumer_offsets``
    partition owned by a live one (``offsets-owners/<p>``, see
    :func:`~fjord.controller.offsets_owners.plan_offsets_owners`), re-planned on every change of
    coordinators, owners or the topic.
    """

    def __init__(
        self,
        client: aetcd.Client,
        cluster_id: str,
        controller_id: int,
        host: str,
        port: int,
        lease_ttl_s: int = LEASE_TTL_S,
        rng: random.Random | None = None,
        auto_leader_rebalance: bool = AUTO_LEADER_REBALANCE_ENABLE,
        leader_imbalance_check_interval_s: float = LEADER_IMBALANCE_CHECK_INTERVAL_S,
        static_config: Mapping[str, str] | None = None,
        broker_reregistration_grace_s: float = BROKER_REREGISTRATION_GRACE_S,
        sasl_port: int = 0,
    ) -> None:
        self.client = client
        self.cluster_id = cluster_id
        self.keys = Keys(cluster_id)
        self.registration = ControllerRegistration(
            controller_id, host, port, host if sasl_port else None, sasl_port or None
        )
        self.lease_ttl_s = lease_ttl_s
        self.watcher = MetadataWatcher(client, cluster_id)
        self._rng = rng or random.Random()
        self.auto_leader_rebalance = auto_leader_rebalance
        self.leader_imbalance_check_interval_s = leader_imbalance_check_interval_s
        self._lease_id = 0
        self._lease_deadline = 0.0  # loop time after which the lease may have expired
        self._epoch: int | None = None
        self.broker_reregistration_grace_s = broker_reregistration_grace_s
        self._active_since = 0.0  # loop time this controller last took office
        # broker id -> the incarnation of its last registration seen (kept while it is absent),
        # and brokers seen registered by a new process whose predecessor's place in ISRs and
        # leadership the reconcile has not ended yet (-> loop time seen, and the partitions
        # (topic id, partition) that existed then: only those can hold the predecessor, see
        # plan_liveness's known_at_restart).
        self._incarnations: dict[int, str | None] = {}
        self._broker_epochs: dict[int, int | None] = {}
        self._restarted: dict[int, tuple[float, frozenset[tuple[str, int]]]] = {}
        self._state_changed = asyncio.Event()
        self._reconcile_needed = asyncio.Event()
        self._owners_needed = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._lease_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._unsubscribe = self.watcher.add_listener(self._on_image)
        # `fjord controller --config`: cluster defaults under etcd's cluster-config.
        self._static_config = dict(static_config or {})
        self._layered: tuple[MetadataImage, MetadataImage] | None = None  # (watched, layered)

    # -- public state ------------------------------------------------------------------------

    @property
    def image(self) -> MetadataImage:
        """The watched image, with this process's ``static_config`` under its cluster-config
        (every decision reads cluster defaults from here)."""
        watched = self.watcher.image
        if not self._static_config:
            return watched
        if self._layered is None or self._layered[0] is not watched:
            self._layered = (watched, watched.with_cluster_defaults(self._static_config))
        return self._layered[1]

    @property
    def epoch(self) -> int | None:
        """This controller's epoch while it is active, else None."""
        return self._epoch if self.is_active() else None

    def is_active(self) -> bool:
        loop = asyncio.get_running_loop()
        return (
            self._epoch is not None
            and loop.time() < self._lease_deadline - STEP_DOWN_MARGIN_S
        )

    def require_active(self) -> int:
        epoch = self.epoch
        if epoch is None:
            raise NotControllerError(f"controller {self.registration.id} is not active")
        return epoch

    async def wait_active(self, timeout: float) -> int:
        """Wait until this controller is active (for tests and start-up); returns the epoch."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.is_active():
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError("controller did not become active")
            self._state_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._state_changed.wait(), remaining)
        assert self._epoch is not None
        return self._epoch

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        await self.watcher.start()
        await self._new_lease()
        self._tasks = [
            asyncio.create_task(self._keepalive_loop(), name="controller-keepalive"),
            asyncio.create_task(self._election_loop(), name="controller-election"),
            asyncio.create_task(self._reconcile_loop(), name="controller-reconcile"),
            asyncio.create_task(self._offsets_owners_loop(), name="controller-offsets-owners"),
        ]
        if self.auto_leader_rebalance:
            self._tasks.append(
                asyncio.create_task(self._rebalance_loop(), name="controller-leader-rebalance")
            )

    async def stop(self) -> None:
        """Stop acting and revoke the lease (so a standby takes over at once)."""
        self._step_down("stopping")
        await cancel_until_done(self._tasks)
        self._tasks = []
        self._unsubscribe()
        await self.watcher.stop()
        if self._lease_id:
            try:
                await self.client.revoke_lease(self._lease_id)
            except Exception as exc:  # etcd gone: the lease expires by itself
                log.warning("could not revoke lease: %s", exc)

    # -- lease and election ------------------------------------------------------------------

    async def _new_lease(self) -> None:
        lease = await self.client.lease(self.lease_ttl_s)
        loop = asyncio.get_running_loop()
        self._lease_id = lease.id
        self._lease_deadline = loop.time() + lease.ttl
        await self.client.put(
            self.keys.controller_member(self.registration.id).encode(),
            self.registration.to_json(),
            lease=lease.id,
        )

    async def _replace_lease(self, expired_id: int) -> None:
        """Get a new lease unless another task already replaced ``expired_id``."""
        async with self._lease_lock:
            if self._lease_id != expired_id:
                return
            try:
                await self._new_lease()
            except Exception as exc:
                log.warning("could not get a new lease: %s", exc)

    async def _keepalive_loop(self) -> None:
        interval = self.lease_ttl_s * KEEPALIVE_FRACTION
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            sent = loop.time()
            try:
                reply = await self.client.refresh_lease(self._lease_id)
            except (asyncio.CancelledError, Exception) as exc:
                if isinstance(exc, asyncio.CancelledError) and _own_cancellation():
                    raise
                log.warning("lease keep-alive failed: %s", exc)
                if loop.time() >= self._lease_deadline - STEP_DOWN_MARGIN_S:
                    self._step_down("lease keep-alive failing")
                continue
            if reply is None or reply.TTL <= 0:
                self._step_down("lease expired")
                await self._replace_lease(self._lease_id)
                continue
            # The TTL counts from when etcd received the refresh, which is after ``sent``.
            self._lease_deadline = sent + reply.TTL

    def _step_down(self, why: str) -> None:
        if self._epoch is not None:
            log.warning("controller %d stops acting (epoch %d): %s",
                        self.registration.id, self._epoch, why)
            self._epoch = None
            set_active_controller(False)
            self._state_changed.set()

    async def _campaign(self) -> bool:
        key = self.keys.controller
        response = await etcd_txn(
            self.client,
            [create_revision_is(key, 0)],
            [put_op(key, self.registration.to_json(), self._lease_id)],
        )
        if not response.succeeded:
            return False
        self._epoch = response.header.revision
        loop = asyncio.get_running_loop()
        self._active_since = loop.time()
        # Restarts seen long ago as a standby were handled by the controller of that time.
        self._restarted = {
            b: seen for b, seen in self._restarted.items()
            if seen[0] >= self._active_since - self.broker_reregistration_grace_s
        }
        set_active_controller(True)
        log.info("controller %d is active, epoch %d", self.registration.id, self._epoch)
        await self.watcher.wait_for_revision(self._epoch, WRITE_SETTLE_TIMEOUT_S)
        # Unregistered brokers get the grace to come back; then they are decided on.
        loop.call_later(self.broker_reregistration_grace_s, self._reconcile_needed.set)
        self._state_changed.set()
        self._reconcile_needed.set()
        self._owners_needed.set()
        return True

    async def _election_loop(self) -> None:
        while True:
            try:
                if self._epoch is None:
                    if self.image.controller is None and await self._campaign():
                        continue
                    # Someone else leads: wait until its key disappears (or our lease changes).
                    await self._wait_image(lambda image: image.controller is None, ELECTION_POLL_S)
                else:
                    await self._wait_image(lambda image: False, ELECTION_POLL_S)
            except asyncio.CancelledError:
                if _own_cancellation():
                    raise
                log.warning("election attempt cancelled by the etcd channel; retrying")
                await asyncio.sleep(ELECTION_RETRY_S)
            except Exception as exc:
                log.warning("election attempt failed: %s", exc)
                if "lease not found" in str(exc):
                    # Our lease expired before the keep-alive noticed: replace it now.
                    await self._replace_lease(self._lease_id)
                    continue
                await asyncio.sleep(ELECTION_RETRY_S)

    async def _wait_image(
        self, predicate: Callable[[MetadataImage], bool], timeout: float
    ) -> None:
        with contextlib.suppress(TimeoutError):
            await self.watcher.wait_for(predicate, timeout)

    def _on_image(self, old: MetadataImage, new: MetadataImage) -> None:
        epoch = self._epoch
        if epoch is not None and new.revision >= epoch:
            current = new.controller
            if current is None or current.epoch != epoch:
                self._step_down("controller key lost")
        self._note_restarts(new)
        if (
            old.brokers != new.brokers
            or old.topics.keys() != new.topics.keys()
            or _reassignment_moved(old, new)
        ):
            self._reconcile_needed.set()
        if (
            old.coordinators != new.coordinators
            or old.offsets_owners != new.offsets_owners
            or old.topic(OFFSETS_TOPIC) != new.topic(OFFSETS_TOPIC)
        ):
            self._owners_needed.set()
        if self._epoch is not None:
            set_offline_partitions(sum(1 for r in new.all_partitions() if not r.state.online))

    def _note_restarts(self, image: MetadataImage) -> None:
        """Remember brokers registered by a new process (a new incarnation): their earlier
        process's place must end even when the reconcile never saw them unregistered (a fast
        restart replaces its own registration at once)."""
        now = asyncio.get_running_loop().time()
        for broker_id, registration in image.brokers.items():
            incarnation = registration.incarnation
            if broker_id in self._incarnations and (
                incarnation is None or incarnation != self._incarnations[broker_id]
            ) and self._epoch_changed(broker_id, image):
                self._restarted[broker_id] = (now, partition_keys(image))
            self._incarnations[broker_id] = incarnation
            self._broker_epochs[broker_id] = image.broker_epoch(broker_id)

    def _epoch_changed(self, broker_id: int, image: MetadataImage) -> bool:
        return self._broker_epochs.get(broker_id) != image.broker_epoch(broker_id)

    def _waiting_for(self, image: MetadataImage) -> frozenset[int]:
        """Brokers whose return the reconcile awaits: every unregistered broker while this
        controller is within the re-registration grace after taking office, else none."""
        loop = asyncio.get_running_loop()
        if loop.time() >= self._active_since + self.broker_reregistration_grace_s:
            return frozenset()
        named = {
            b for ref in image.all_partitions() for b in (ref.state.leader, *ref.state.isr)
        }
        return frozenset(b for b in named if b >= 0 and b not in image.brokers)

    # -- fenced writes -----------------------------------------------------------------------

    async def _write(self, ops: list[rpc.RequestOp]) -> int:
        """Write ``ops`` in fenced txns of at most MAX_TXN_OPS; returns the last revision after
        the watcher has applied it. Caller holds the write lock."""
        epoch = self.require_active()
        revision = self.image.revision
        for start in range(0, len(ops), MAX_TXN_OPS):
            response = await etcd_txn(
                self.client,
                [create_revision_is(self.keys.controller, epoch)],
                ops[start : start + MAX_TXN_OPS],
            )
            if not response.succeeded:
                self._step_down("fenced by a newer controller epoch")
                raise FencedError("a newer controller has been elected")
            revision = response.header.revision
        await self.watcher.wait_for_revision(revision, WRITE_SETTLE_TIMEOUT_S)
        return revision

    async def fenced_write(self, ops: list[rpc.RequestOp]) -> int:
        async with self._write_lock:
            return await self._write(ops)

    def _topic_ops(self, plan: TopicPlan) -> list[rpc.RequestOp]:
        # Partitions first, topic record last: readers hide partitions without their topic
        # record, so a topic split over several txns never appears half-made.
        ops = [
            put_op(self.keys.partition(plan.name, p), state.to_json())
            for p, state in sorted(plan.partitions.items())
        ]
        ops.append(put_op(self.keys.topic(plan.name), plan.record.to_json()))
        return ops

    # -- operations (each raises a typed FjordError) -----------------------------------------

    async def create_topic(self, spec: TopicSpec, validate_only: bool = False) -> TopicRecord:
        async with self._write_lock:
            self.require_active()
            check_user_topic(spec.name, "create")
            if spec.name in COORDINATOR_TOPICS:
                spec = offsets_topic_spec(spec, len(self.image.brokers))
            plan = plan_create_topic(self.image, spec, uuid.uuid4().hex, self._rng)
            if not validate_only:
                await self._write(self._topic_ops(plan))
            return plan.record

    async def delete_topic(self, name: str) -> None:
        async with self._write_lock:
            self.require_active()
            check_user_topic(name, "delete")
            if self.image.topic(name) is None:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            await self._write(
                [delete_op(self.keys.topic(name)),
                 delete_op(self.keys.topic_partitions_prefix(name), prefix=True)]
            )

    async def create_partitions(
        self,
        name: str,
        count: int,
        assignments: Mapping[int, list[int]],
        validate_only: bool = False,
    ) -> TopicRecord:
        async with self._write_lock:
            self.require_active()
            check_user_topic(name, "add partitions to")
            plan = plan_create_partitions(self.image, name, count, assignments, self._rng)
            if not validate_only:
                await self._write(self._topic_ops(plan))
            return plan.record

    async def alter_configs(
        self, name: str, set_configs: Mapping[str, str], delete: list[str], validate_only: bool
    ) -> TopicRecord:
        async with self._write_lock:
            self.require_active()
            record = plan_alter_configs(self.image, name, set_configs, delete)
            if not validate_only and record != self.image.topic(name):
                await self._write([put_op(self.keys.topic(name), record.to_json())])
            return record

    async def alter_broker_configs(
        self,
        broker_id: int | None,
        set_configs: Mapping[str, str],
        delete: list[str],
        validate_only: bool,
        *,
        replace_all: bool = False,
    ) -> dict[str, str]:
        """Dynamic broker configs: broker ``broker_id``'s (``broker-configs/<id>``) or, for
        None, the cluster-wide default (``cluster-config``, whose other keys are kept), checked
        by fjord.cluster.dynamic_config (typed errors naming the keys; nothing written then).
        Brokers apply the change when their watcher sees it. Returns the new entries."""
        if broker_id is not None and broker_id < 0:
            raise InvalidRequestError(f"broker id {broker_id}: expected an id >= 0")
        async with self._write_lock:
            self.require_active()
            watched = self.watcher.image  # etcd's own entries, without this process's --config
            current = (watched.cluster_config if broker_id is None
                       else watched.broker_config(broker_id))
            new = plan_broker_config(current, set_configs, delete, default=broker_id is None,
                                     replace_all=replace_all)
            key = (self.keys.cluster_config if broker_id is None
                   else self.keys.broker_config(broker_id))
            if not validate_only and new != dict(current):
                await self._write([put_op(key, ClusterConfig(new).to_json()) if new
                                   else delete_op(key)])
            return new

    def _acl_ops(
        self, changed: Mapping[ResourcePattern, tuple[AccessControlEntry, ...]]
    ) -> list[rpc.RequestOp]:
        return [
            put_op(self.keys.acl(pattern), AclEntries(entries).to_json())
            if entries else delete_op(self.keys.acl(pattern))
            for pattern, entries in sorted(changed.items())
        ]

    async def create_acls(self, bindings: list[AclBinding]) -> None:
        """Add ``bindings`` (existing ones are kept as they are) in fenced txns; every broker
        and coordinator sees them once its watcher applies the revision."""
        async with self._write_lock:
            self.require_active()
            changed = plan_create_acls(self.image.acls, bindings)
            if changed:
                await self._write(self._acl_ops(changed))

    def describe_acls(self, selector: AclBindingFilter) -> list[AclBinding]:
        self.require_active()
        return [b for b in self.image.acl_bindings() if selector.matches(b)]

    async def delete_acls(self, filters: list[AclBindingFilter]) -> list[list[AclBinding]]:
        """Delete what ``filters`` match; per filter, the bindings it deleted."""
        async with self._write_lock:
            self.require_active()
            changed, deleted = plan_delete_acls(self.image.acls, filters)
            if changed:
                await self._write(self._acl_ops(changed))
            return deleted

    async def alter_scram_credentials(
        self, deletions: list[ScramDeletion], upsertions: list[ScramUpsertion]
    ) -> dict[str, ScramAlterationError | None]:
        """Kafka's AlterUserScramCredentials: per user named, its error or None (applied);
        the valid users' changes are written in one fenced txn (scram-users/<user>)."""
        async with self._write_lock:
            self.require_active()
            current = {u: s.credentials for u, s in self.image.scram_users.items()}
            changed, errors = plan_alter_scram(current, deletions, upsertions)
            if changed:
                await self._write([
                    put_op(self.keys.scram_user(user), ScramUser(credentials).to_json())
                    if credentials else delete_op(self.keys.scram_user(user))
                    for user, credentials in sorted(changed.items())
                ])
            return errors

    def describe_scram_credentials(self) -> dict[str, ScramUser]:
        self.require_active()
        return dict(self.image.scram_users)

    def _check_broker_epoch(self, broker_id: int, broker_epoch: int) -> None:
        current = self.image.broker_epoch(broker_id)
        if current is None or current != broker_epoch:
            raise StaleBrokerEpochError(
                f"broker {broker_id} epoch {broker_epoch} is not its current registration "
                f"({current})"
            )

    async def allocate_producer_ids(self, broker_id: int, broker_epoch: int) -> tuple[int, int]:
        """A block ``(first_id, count)`` that no other call will hand out."""
        async with self._write_lock:
            self.require_active()
            self._check_broker_epoch(broker_id, broker_epoch)
            first = self.image.next_producer_id or 0
            block = ProducerIdBlock(first + PRODUCER_ID_BLOCK_SIZE)
            await self._write([put_op(self.keys.producer_ids, block.to_json())])
            return first, PRODUCER_ID_BLOCK_SIZE

    async def alter_partition(
        self,
        broker_id: int,
        broker_epoch: int,
        items: list[tuple[str, int, int, int, list[int], bool]],
    ) -> list[AlterPartitionItemResult]:
        """Apply ISR changes ``(topic, partition, leader_epoch, partition_epoch, new_isr,
        resign)``; a resigning leader hands leadership to another live ISR member
        (:func:`resign_leadership`) instead."""
        async with self._write_lock:
            self.require_active()
            self._check_broker_epoch(broker_id, broker_epoch)
            image = self.image
            live = set(image.brokers)
            results: list[AlterPartitionItemResult] = []
            ops: list[rpc.RequestOp] = []
            for topic, partition, leader_epoch, partition_epoch, new_isr, resign in items:
                state = image.partition(topic, partition)
                if state is None:
                    error = UnknownTopicOrPartitionError(f"{topic}-{partition} does not exist")
                    results.append(AlterPartitionItemResult(topic, partition, error, None))
                    continue
                try:
                    if resign:
                        new = resign_leadership(
                            state, broker_id, leader_epoch, partition_epoch, live
                        )
                        log.info("%s-%d: broker %d resigns leadership; broker %d leads "
                                 "(epoch %d), ISR %s", topic, partition, broker_id,
                                 new.leader, new.leader_epoch, list(new.isr))
                    else:
                        new = alter_isr(
                            state, broker_id, leader_epoch, partition_epoch, new_isr, live
                        )
                except Exception as exc:
                    results.append(AlterPartitionItemResult(topic, partition, exc, state))
                    continue
                if new is not state:
                    ops.append(put_op(self.keys.partition(topic, partition), new.to_json()))
                results.append(AlterPartitionItemResult(topic, partition, None, new))
            if ops:
                await self._write(ops)
            return results

    def _partition_ops(
        self,
        changes: Mapping[TopicPartition, PartitionState],
        records: Mapping[str, TopicRecord] | None = None,
    ) -> list[rpc.RequestOp]:
        ops = [
            put_op(self.keys.partition(t, p), s.to_json()) for (t, p), s in sorted(changes.items())
        ]
        ops += [put_op(self.keys.topic(n), r.to_json()) for n, r in sorted((records or {}).items())]
        return ops

    # -- reassignment and elections ----------------------------------------------------------

    async def alter_partition_reassignments(
        self, requests: list[ReassignmentRequest]
    ) -> list[PartitionOutcome]:
        """Start (or cancel, ``target`` None) reassignments; the rest of the procedure runs in
        the reconcile loop as the ISR grows, also after a controller fail-over."""
        async with self._write_lock:
            self.require_active()
            changes, records, outcomes = plan_alter_reassignments(self.image, requests)
            if changes:
                for (topic, partition), state in sorted(changes.items()):
                    log.info("reassignment of %s-%d: replicas %s adding %s removing %s",
                             topic, partition, list(state.replicas),
                             list(state.adding_replicas), list(state.removing_replicas))
                await self._write(self._partition_ops(changes, records))
            return outcomes

    def list_partition_reassignments(
        self, partitions: list[TopicPartition] | None
    ) -> list[OngoingReassignment]:
        self.require_active()
        return list_reassignments(self.image, partitions)

    async def elect_leaders(
        self, election_type: int, partitions: list[TopicPartition] | None
    ) -> list[PartitionOutcome]:
        async with self._write_lock:
            self.require_active()
            changes, outcomes = plan_elect_leaders(self.image, election_type, partitions)
            if changes:
                self._log_elections(changes, "ElectLeaders")
                await self._write(self._partition_ops(changes))
            return outcomes

    def _log_elections(self, changes: Mapping[TopicPartition, PartitionState], why: str) -> None:
        image = self.image
        for (topic, partition), new in sorted(changes.items()):
            old = image.partition(topic, partition)
            if old is None or old.leader == new.leader:
                continue
            if new.leader != -1 and new.leader not in old.isr:
                log.error(
                    "UNCLEAN leader election (%s) of %s-%d: broker %d was not in the ISR %s; "
                    "records acknowledged only by the old ISR are lost",
                    why, topic, partition, new.leader, list(old.isr),
                )
            else:
                log.info("%s: %s-%d leader %d -> %d (leader epoch %d)", why, topic, partition,
                         old.leader, new.leader, new.leader_epoch)

    async def _rebalance_loop(self) -> None:
        """Auto leader rebalancing: every interval, preferred replicas lead again."""
        while True:
            await asyncio.sleep(self.leader_imbalance_check_interval_s)
            if not self.is_active():
                continue
            try:
                async with self._write_lock:
                    changes = plan_preferred_rebalance(self.image)
                    if changes:
                        self._log_elections(changes, "preferred leader rebalance")
                        await self._write(self._partition_ops(changes))
            except (asyncio.CancelledError, Exception) as exc:
                if isinstance(exc, asyncio.CancelledError) and _own_cancellation():
                    raise
                log.warning("leader rebalance failed: %r", exc)

    # -- liveness reactions ------------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        while True:
            await self._reconcile_needed.wait()
            self._reconcile_needed.clear()
            if not self.is_active():
                continue
            try:
                async with self._write_lock:
                    image = self.image
                    waiting_for = self._waiting_for(image)
                    restarted = dict(self._restarted)
                    changes = plan_reconcile(
                        image, waiting_for=waiting_for, restarted=restarted.keys(),
                        known_at_restart={b: known for b, (_, known) in restarted.items()},
                    )
                    if waiting_for:
                        log.info("reconcile: waiting up to %.1f s for brokers %s to register "
                                 "again before moving their partitions",
                                 self.broker_reregistration_grace_s, sorted(waiting_for))
                    if restarted:
                        log.info("reconcile: brokers %s restarted (new incarnation): their "
                                 "previous process leaves ISRs and leadership",
                                 sorted(restarted))
                    if changes:
                        log.info("reconcile: updating %d partitions", len(changes))
                        self._log_elections(changes, "liveness/reassignment")
                        await self._write(self._partition_ops(changes))
                    for broker_id, seen in restarted.items():
                        if self._restarted.get(broker_id) == seen:
                            del self._restarted[broker_id]
            except (asyncio.CancelledError, Exception) as exc:
                if isinstance(exc, asyncio.CancelledError) and _own_cancellation():
                    raise
                log.warning("liveness reconcile failed: %r; retrying", exc)
                await asyncio.sleep(ELECTION_RETRY_S)
                self._reconcile_needed.set()

    async def _offsets_owners_loop(self) -> None:
        """Keep every ``__consumer_offsets`` partition owned by a live coordinator: runs when
        coordinator registrations, the owners or the topic change (and on taking office)."""
        while True:
            await self._owners_needed.wait()
            self._owners_needed.clear()
            if not self.is_active():
                continue
            try:
                async with self._write_lock:
                    changes = _offsets_owner_changes(self.image)
                    if changes:
                        log.info("__consumer_offsets owners: %s", ", ".join(
                            f"{p}->{o.coordinator_id}@{o.coordinator_epoch}"
                            for p, o in sorted(changes.items())))
                        await self._write(
                            [put_op(self.keys.offsets_owner(p), owner.to_json())
                             for p, owner in sorted(changes.items())]
                        )
            except (asyncio.CancelledError, Exception) as exc:
                if isinstance(exc, asyncio.CancelledError) and _own_cancellation():
                    raise
                log.warning("offsets owners update failed: %r; retrying", exc)
                await asyncio.sleep(ELECTION_RETRY_S)
                self._owners_needed.set()


def _offsets_owner_changes(image: MetadataImage) -> dict[int, OffsetsOwner]:
    """The ``offsets-owners/`` entries to write for ``image`` (none while the topic is absent)."""
    record = image.topic(OFFSETS_TOPIC)
    if record is None:
        return {}
    return plan_offsets_owners(record.partitions, image.coordinators, image.offsets_owners)


def _reassignment_moved(old: MetadataImage, new: MetadataImage) -> bool:
    """Whether a partition under reassignment changed (its ISR may now cover the target)."""
    return any(
        ref.state.reassigning and old.partition(ref.topic, ref.partition) != ref.state
        for ref in new.all_partitions()
    )
