"""The admin client: topics, cluster and consumer group operations (Kafka's ``AdminClient``).

Admin requests go to the active controller, found in a broker's Metadata answer (its
``controller`` field); a NOT_CONTROLLER answer or an unreachable controller means the controller
moved: the client refreshes metadata and retries, within ``default.api.timeout.ms``.
Each call raises the typed error of the first failing topic (e.g. TOPIC_ALREADY_EXISTS,
INVALID_TOPIC_EXCEPTION, UNKNOWN_TOPIC_OR_PARTITION, INVALID_PARTITIONS) after all topics of the
request were processed; ``raise_on_error=False`` returns {topic: error or None} instead.

Group requests go to the group's coordinator, looked up with FindCoordinator on every attempt:
NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS and COORDINATOR_NOT_AVAILABLE (the group moved,
its coordinator is replaying or gone) are retried after a new lookup, within the same timeout.
Listing asks every live coordinator, which the controller's DescribeCluster names.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

from fjord._proto import broker_pb2, common_pb2, controller_pb2, coordinator_pb2
from fjord.client.consumer import Consumer
from fjord.client.metadata import topic_error
from fjord.client.network import EventLoopThread, Network, transport_error
from fjord.client.types import (
    ClusterDescription,
    ConfigEntry,
    LogDirDescription,
    LogDirPartition,
    NewTopic,
    Node,
    OffsetAndMetadata,
    ScrubStatus,
    TopicDescription,
    TopicPartition,
)
from fjord.cluster.acl_wire import binding_from_pb, binding_to_pb, filter_to_pb
from fjord.config import admin_config
from fjord.errors import (
    CoordinatorNotAvailableError,
    ErrorCode,
    FjordError,
    GroupIdNotFoundError,
    InvalidGroupIdError,
    InvalidRequestError,
    KafkaTimeoutError,
    NonEmptyGroupError,
    NotControllerError,
    OffsetOutOfRangeError,
    ReassignmentInProgressError,
    error_code_from_number,
    error_for_code,
)
from fjord.groups.defaults import CONSUMER_PROTOCOL_TYPE
from fjord.groups.lag import (
    ByDuration,
    FromFile,
    LagRow,
    MemberPartitions,
    PartitionReset,
    ResetSpec,
    ToDatetime,
    lag_rows,
    plan_offset_reset,
    reset_scope,
)
from fjord.groups.protocol import decode_assignment
from fjord.groups.state import GroupState
from fjord.security import ClientSecurity
from fjord.security.acls import MATCH_ALL, AclBinding, AclBindingFilter
from fjord.security.config import CLIENT_SECURITY_KEYS
from fjord.security.scram import (
    MECHANISM_BY_TYPE,
    SCRAM_MECHANISMS,
    ScramCredential,
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
    check_mechanism,
)

T = TypeVar("T")

#: A partition as admin calls name it: (topic, partition).
PartitionErrors = dict[TopicPartition, FjordError | None]

#: ElectLeaders election types (Kafka's names and wire values).
ELECTION_TYPES = {"preferred": 0, "unclean": 1}

#: How often create_topics looks whether the brokers' metadata names the new topics yet.
TOPIC_KNOWN_POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    """A running reassignment (ListPartitionReassignments): ``replicas`` is old + target
    (target first) while it runs."""

    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]

    @property
    def target_replicas(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.removing_replicas)


def _partition_results(results: Iterable[Any]) -> PartitionErrors:
    out: PartitionErrors = {}
    for r in results:
        code = error_code_from_number(r.error.code)
        out[TopicPartition(r.topic, r.partition)] = (
            None
            if code is ErrorCode.NONE
            else error_for_code(code, f"{r.topic}-{r.partition}: {r.error.message}")
        )
    return out


def _raise_first_partition(errors: PartitionErrors, raise_on_error: bool) -> PartitionErrors:
    if raise_on_error:
        for error in errors.values():
            if error is not None:
                raise error
    return errors

TopicErrors = dict[str, FjordError | None]


def _error_of(error: common_pb2.Error, topic: str) -> FjordError | None:
    code = error_code_from_number(error.code)
    if code is ErrorCode.NONE:
        return None
    return topic_error(topic, code, error.message)


def _acl_error(error: common_pb2.Error, what: object) -> FjordError | None:
    """The typed error of one ACL creation or deletion filter, naming it."""
    code = error_code_from_number(error.code)
    if code is ErrorCode.NONE:
        return None
    return error_for_code(code, f"{what}: {error.message or code.name}")


def _results(results: Iterable[Any]) -> TopicErrors:
    return {r.name: _error_of(r.error, r.name) for r in results}


def _raise_first(errors: TopicErrors, raise_on_error: bool) -> TopicErrors:
    if raise_on_error:
        for error in errors.values():
            if error is not None:
                raise error
    return errors


#: Coordinator errors that mean "look the coordinator up again and retry" (Kafka's).
COORDINATOR_RETRIABLE = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
    }
)

#: The state DescribeGroups reports for a group that does not exist (Kafka's).
DEAD_STATE = GroupState.DEAD.value

#: What :meth:`AdminClient.list_offsets` asks per partition: the log start offset, the log
#: end offset (high watermark), or a timestamp in ms (the first record at or after it).
OffsetSpec = Literal["earliest", "latest"] | int


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """One transactional id as its transaction coordinator describes it (Kafka's
    DescribeTransactions): state by Kafka's name, producer id and epoch, timeout, start of the
    running transaction (-1: none) and its partitions."""

    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int
    partitions: tuple[TopicPartition, ...]
    coordinator_id: int


@dataclass(frozen=True, slots=True)
class ConsumerGroupListing:
    """One group as ListGroups reports it. ``protocol_type`` is "consumer" for groups of
    subscribing consumers and "" for groups that only ever had simple (admin or ``assign()``)
    commits."""

    group_id: str
    state: str
    protocol_type: str

    @property
    def is_simple_consumer_group(self) -> bool:
        return not self.protocol_type


@dataclass(frozen=True, slots=True)
class MemberDescription:
    """An active member; ``assignment`` is decoded from its ConsumerProtocol Assignment bytes
    (empty unless the group is Stable: DescribeGroups shows assignments only then)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    assignment: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescription:
    """A group as DescribeGroups reports it. Invariants: ``state`` is one of Empty,
    PreparingRebalance, CompletingRebalance, Stable, Dead (Dead: the group does not exist);
    ``partition_assignor`` (the chosen protocol) is only known while Stable; ``coordinator``
    is the ``host:port`` of the coordinator that answered."""

    group_id: str
    state: str
    protocol_type: str
    partition_assignor: str
    members: tuple[MemberDescription, ...]
    coordinator: str

    @property
    def is_simple_consumer_group(self) -> bool:
        return not self.protocol_type


def _coordinator_errors(response: Any) -> list[tuple[ErrorCode, str]]:
    """Every non-NONE (code, message) of a coordinator answer: top level, per group, per
    partition."""
    fields = response.DESCRIPTOR.fields_by_name
    errors = [response.error] if "error" in fields else []
    for name in ("groups", "results"):
        # DescribeGroups' groups and DeleteGroups' results carry errors; ListGroups' do not.
        if name in fields and "error" in fields[name].message_type.fields_by_name:
            errors.extend(item.error for item in getattr(response, name))
    if "topics" in fields:
        errors.extend(p.error for t in response.topics for p in t.partitions)
    found = [(error_code_from_number(e.code), e.message) for e in errors]
    return [(code, message) for code, message in found if code is not ErrorCode.NONE]


def _decode_member(member: Any, protocol_type: str) -> MemberDescription:
    assignment: tuple[TopicPartition, ...] = ()
    if protocol_type == CONSUMER_PROTOCOL_TYPE and member.member_assignment:
        assignment = tuple(
            TopicPartition(t, p) for t, p in decode_assignment(member.member_assignment).partitions
        )
    return MemberDescription(
        member.member_id,
        member.group_instance_id or None,
        member.client_id,
        member.client_host,
        assignment,
    )


def _offset_request_topics(
    offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
) -> list[coordinator_pb2.OffsetCommitTopic]:
    by_topic: dict[str, list[coordinator_pb2.OffsetCommitPartition]] = {}
    for tp, value in sorted(offsets.items()):
        committed = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(value)
        by_topic.setdefault(tp[0], []).append(
            coordinator_pb2.OffsetCommitPartition(
                partition=tp[1],
                committed_offset=committed.offset,
                committed_leader_epoch=(
                    -1 if committed.leader_epoch is None else committed.leader_epoch
                ),
                committed_metadata=committed.metadata,
            )
        )
    return [
        coordinator_pb2.OffsetCommitTopic(name=name, partitions=parts)
        for name, parts in by_topic.items()
    ]


def _group_error(group_id: str, error: common_pb2.Error) -> FjordError | None:
    code = error_code_from_number(error.code)
    if code is ErrorCode.NONE:
        return None
    if code is ErrorCode.NON_EMPTY_GROUP:
        return NonEmptyGroupError(f"group {group_id!r}: The group is not empty.")
    if code is ErrorCode.GROUP_ID_NOT_FOUND:
        return GroupIdNotFoundError(f"group {group_id!r} does not exist")
    return error_for_code(code, f"group {group_id!r}: {error.message or code.name}")


def _group_states(states: Iterable[str]) -> list[str]:
    """State names as the coordinator spells them (``stable`` -> ``Stable``); an unknown name
    is an INVALID_REQUEST naming the valid ones, not a silently empty listing."""
    known = {state.value.lower(): state.value for state in GroupState}
    out = []
    for state in states:
        name = known.get(state.strip().lower())
        if name is None:
            raise InvalidRequestError(
                f"unknown group state {state!r}: expected one of "
                + ", ".join(s.value for s in GroupState)
            )
        out.append(name)
    return out


def _remaining(deadline: float) -> float:
    """Seconds left until the monotonic ``deadline`` (a sliver when none: the call then
    times out with the usual typed error)."""
    return max(deadline - time.monotonic(), 0.001)


class AdminClient:
    """Creates, deletes, grows, configures and describes topics; describes the cluster; lists,
    describes and deletes consumer groups, shows their lag and resets their offsets.

    Invariants: every call either returns within ``default.api.timeout.ms`` or raises
    :class:`KafkaTimeoutError`; retriable errors (NOT_CONTROLLER, transport failures) are
    retried after a metadata refresh, non-retriable ones are raised at once, typed.
    ``tracer_provider``: as for :class:`~fjord.client.Producer`.
    """

    def __init__(self, config: Mapping[str, Any], *, tracer_provider: Any | None = None) -> None:
        self.config = admin_config(config)
        cfg = self.config
        self._timeout_s = cfg["default.api.timeout.ms"] / 1000
        self._request_timeout_s = cfg["request.timeout.ms"] / 1000
        self._backoff_s = cfg["retry.backoff.ms"] / 1000
        self._io = EventLoopThread(f"fjord-admin-{cfg['client.id']}")
        self._network = Network(
            cfg["bootstrap.servers"],
            client_id=cfg["client.id"],
            request_timeout_ms=cfg["request.timeout.ms"],
            service="admin",
            tracer_provider=tracer_provider,
            security=ClientSecurity.from_config(cfg),
        )
        self._closed = False
        self._reader: Consumer | None = None

    # -- plumbing -----------------------------------------------------------------------------

    def _run(self, coro_fn: Callable[[float], Awaitable[T]], timeout: float | None) -> T:
        if self._closed:
            raise FjordError("the admin client is closed", code=ErrorCode.INVALID_REQUEST)
        wait = self._timeout_s if timeout is None else timeout

        async def bounded() -> T:
            return await coro_fn(time.monotonic() + wait)

        return self._io.run(bounded(), wait + 1)

    async def _controller_call(
        self, name: str, request: Any, deadline: float, top_error: bool = False
    ) -> Any:
        """Call RPC ``name`` on the active controller, retrying until ``deadline``."""
        network = self._network

        async def attempt() -> Any:
            snapshot = network.snapshot
            if snapshot.controller is None:
                snapshot = await network.refresh_metadata()
            controller = snapshot.controller
            if controller is None:
                raise FjordError("no active controller", code=ErrorCode.NOT_CONTROLLER)
            try:
                response = await getattr(network.controller(controller.address), name)(
                    request, timeout=min(self._request_timeout_s, deadline - time.monotonic())
                )
            except Exception as exc:
                error = transport_error(exc, f"controller {controller.address}")
                if isinstance(error, KafkaTimeoutError):
                    error = FjordError(str(error), code=ErrorCode.REQUEST_TIMED_OUT)
                raise error from exc
            # A standby answers everything with NOT_CONTROLLER, at the top or per topic.
            codes = []
            if top_error:
                codes.append(response.error.code)
            for item in getattr(response, "results", []):
                codes.append(item.error.code)
            if ErrorCode.NOT_CONTROLLER.code in codes:
                raise NotControllerError(f"{controller.address} is not the active controller")
            return response

        return await network.call_with_retries(
            attempt, deadline=deadline, backoff_s=self._backoff_s, what=f"{name} (controller)"
        )

    # -- topics -------------------------------------------------------------------------------

    def create_topics(
        self,
        topics: Iterable[NewTopic],
        *,
        validate_only: bool = False,
        timeout: float | None = None,
        raise_on_error: bool = True,
    ) -> TopicErrors:
        """Create topics; returns {name: None} (or errors, see module doc).

        Returns once the controller has created them and the brokers' metadata this client
        reads names them (bounded by the call's timeout, after which it returns anyway: the
        topics exist), so that a describe, a plan or an assignment right after finds them.
        Kafka's ZooKeeper-era CreateTopics waited for its ``timeout_ms`` the same way; a
        KRaft controller answers before the brokers know, and a describe at once can fail
        with UNKNOWN_TOPIC_OR_PARTITION."""
        new = list(topics)
        request = controller_pb2.CreateTopicsRequest(
            topics=[
                controller_pb2.CreatableTopic(
                    name=t.name,
                    num_partitions=t.num_partitions,
                    replication_factor=t.replication_factor,
                    configs={str(k): str(v) for k, v in t.config.items()},
                )
                for t in new
            ],
            timeout_ms=int(self._request_timeout_s * 1000),
            validate_only=validate_only,
        )

        async def call(deadline: float) -> Any:
            response = await self._controller_call("CreateTopics", request, deadline)
            if not validate_only:
                created = {name for name, error in _results(response.results).items()
                           if error is None}
                await self._until_brokers_know(created, deadline)
            return response

        response = self._run(call, timeout)
        return _raise_first(_results(response.results), raise_on_error)

    async def _until_brokers_know(self, topics: set[str], deadline: float) -> None:
        """Refresh metadata until it names every one of ``topics`` or ``deadline`` passes
        (never raises: the topics exist whatever the brokers know yet)."""
        if not topics:
            return
        network = self._network
        while True:
            network.topics_of_interest = set(topics)
            try:
                snapshot = await network.refresh_metadata(spaced=False)
            except FjordError:
                snapshot = None
            if snapshot is not None and topics <= snapshot.topics.keys():
                return
            if time.monotonic() + TOPIC_KNOWN_POLL_S >= deadline:
                return
            await asyncio.sleep(TOPIC_KNOWN_POLL_S)

    def delete_topics(
        self, topics: Iterable[str], *, timeout: float | None = None, raise_on_error: bool = True
    ) -> TopicErrors:
        request = controller_pb2.DeleteTopicsRequest(
            names=list(topics), timeout_ms=int(self._request_timeout_s * 1000)
        )

        async def call(deadline: float) -> Any:
            return await self._controller_call("DeleteTopics", request, deadline)

        return _raise_first(_results(self._run(call, timeout).results), raise_on_error)

    def create_partitions(
        self,
        new_totals: Mapping[str, int],
        *,
        validate_only: bool = False,
        timeout: float | None = None,
        raise_on_error: bool = True,
    ) -> TopicErrors:
        """Grow topics to the given total partition counts (never fewer: INVALID_PARTITIONS)."""
        request = controller_pb2.CreatePartitionsRequest(
            topics=[controller_pb2.PartitionCount(name=n, count=c) for n, c in new_totals.items()],
            timeout_ms=int(self._request_timeout_s * 1000),
            validate_only=validate_only,
        )

        async def call(deadline: float) -> Any:
            return await self._controller_call("CreatePartitions", request, deadline)

        return _raise_first(_results(self._run(call, timeout).results), raise_on_error)

    def alter_configs(
        self,
        configs: Mapping[str, Mapping[str, str | None]],
        *,
        validate_only: bool = False,
        timeout: float | None = None,
        raise_on_error: bool = True,
    ) -> TopicErrors:
        """Set topic configs: {topic: {key: value}}; a value of None resets the key to the
        cluster default (Kafka's incremental alter: keys not named keep their value)."""
        request = controller_pb2.AlterConfigsRequest(
            topics=[
                controller_pb2.AlterTopicConfig(
                    name=topic,
                    set={k: str(v) for k, v in entries.items() if v is not None},
                    delete=[k for k, v in entries.items() if v is None],
                )
                for topic, entries in configs.items()
            ],
            validate_only=validate_only,
        )

        async def call(deadline: float) -> Any:
            return await self._controller_call("AlterConfigs", request, deadline)

        return _raise_first(_results(self._run(call, timeout).results), raise_on_error)

    def describe_configs(
        self, topics: Iterable[str], *, timeout: float | None = None
    ) -> dict[str, list[ConfigEntry]]:
        """Every config of each topic with its source (TOPIC, CLUSTER_DEFAULT, DEFAULT)."""
        request = controller_pb2.DescribeConfigsRequest(topics=list(topics))

        async def call(deadline: float) -> Any:
            return await self._controller_call("DescribeConfigs", request, deadline)

        out: dict[str, list[ConfigEntry]] = {}
        for result in self._run(call, timeout).results:
            error = _error_of(result.error, result.name)
            if error is not None:
                raise error
            out[result.name] = sorted(
                (ConfigEntry(e.name, e.value, e.is_default, e.source) for e in result.entries),
                key=lambda e: e.name,
            )
        return out

    def describe_broker_configs(
        self, broker_ids: Iterable[int] | None = None, *, timeout: float | None = None
    ) -> dict[int, list[ConfigEntry]]:
        """Every config each broker reads (all live brokers when None), with its effective
        value and source (DYNAMIC_BROKER, CLUSTER_DEFAULT, STATIC_BROKER, DEFAULT), asked of
        the broker itself as Kafka's DescribeConfigs for a BROKER resource is. An id that is
        not a live broker raises BROKER_NOT_AVAILABLE naming the live ones."""
        wanted = None if broker_ids is None else list(broker_ids)

        async def call(deadline: float) -> Any:
            async def metadata() -> Any:
                return await self._network.refresh_metadata()

            snapshot = await self._network.call_with_retries(
                metadata, deadline=deadline, backoff_s=self._backoff_s, what="Metadata"
            )
            ids = sorted(snapshot.brokers) if wanted is None else wanted
            missing = [i for i in ids if i not in snapshot.brokers]
            if missing:
                raise FjordError(
                    f"broker {', '.join(map(str, missing))} is not a live broker of this cluster "
                    f"(live: {', '.join(map(str, sorted(snapshot.brokers))) or 'none'})",
                    code=ErrorCode.BROKER_NOT_AVAILABLE,
                )
            out = {}
            for broker_id in ids:
                address = snapshot.brokers[broker_id].address
                try:
                    out[broker_id] = await self._network.broker(address).DescribeConfigs(
                        broker_pb2.DescribeBrokerConfigsRequest(),
                        timeout=max(deadline - time.monotonic(), 0.001),
                    )
                except Exception as exc:
                    raise transport_error(exc, f"broker {broker_id} {address}") from exc
            return out

        return {
            broker_id: [ConfigEntry(e.name, e.value, e.is_default, e.source)
                        for e in response.entries]
            for broker_id, response in self._run(call, timeout).items()
        }  # fmt: skip

    def alter_broker_configs(
        self,
        configs: Mapping[int | None, Mapping[str, str | None]],
        *,
        validate_only: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Dynamic broker configs, as ``kafka-configs.sh --entity-type brokers --alter``:
        {broker id: {key: value}}, the key None for the cluster-wide default
        (``--entity-default``); a value of None deletes the key (the next layer applies).
        Keys by Kafka's broker name (``log.retention.ms``) or Fjord's (``retention.ms``).
        Brokers apply the change without a restart. Raises the first entry's typed error:
        INVALID_CONFIG naming an unknown key or a bad value, INVALID_REQUEST naming read-only
        keys ("Cannot update these configs dynamically"); nothing of that entry changes."""
        request = controller_pb2.AlterConfigsRequest(
            validate_only=validate_only,
            brokers=[
                controller_pb2.AlterBrokerConfig(
                    broker_id=0 if broker is None else broker,
                    default=broker is None,
                    set={k: str(v) for k, v in entries.items() if v is not None},
                    delete=[k for k, v in entries.items() if v is None],
                )
                for broker, entries in configs.items()
            ],
        )

        async def call(deadline: float) -> Any:
            return await self._controller_call("AlterConfigs", request, deadline)

        for result in self._run(call, timeout).broker_results:
            code = error_code_from_number(result.error.code)
            if code is not ErrorCode.NONE:
                entity = "the cluster-wide default" if result.default else (
                    f"broker {result.broker_id}")
                raise error_for_code(code, f"{entity}: {result.error.message}")

    def describe_broker_default_configs(
        self, *, timeout: float | None = None
    ) -> list[ConfigEntry]:
        """The dynamic cluster-wide broker defaults (``kafka-configs.sh --describe
        --entity-type brokers --entity-default``), as any live broker knows them."""

        async def call(deadline: float) -> Any:
            async def attempt() -> Any:
                snapshot = await self._network.refresh_metadata()
                if not snapshot.brokers:
                    raise FjordError("no live broker", code=ErrorCode.BROKER_NOT_AVAILABLE)
                node = snapshot.brokers[min(snapshot.brokers)]
                try:
                    return await self._network.broker(node.address).DescribeConfigs(
                        broker_pb2.DescribeBrokerConfigsRequest(default=True),
                        timeout=min(self._request_timeout_s, _remaining(deadline)),
                    )
                except Exception as exc:
                    raise transport_error(exc, f"broker {node.id} {node.address}") from exc

            return await self._network.call_with_retries(
                attempt, deadline=deadline, backoff_s=self._backoff_s, what="DescribeConfigs"
            )

        return [ConfigEntry(e.name, e.value, e.is_default, e.source)
                for e in self._run(call, timeout).entries]

    def list_topics(self, *, timeout: float | None = None) -> list[str]:
        """Names of every topic, sorted."""
        return sorted(t.name for t in self.describe_topics(None, timeout=timeout))

    def describe_topics(
        self, topics: Iterable[str] | None = None, *, timeout: float | None = None
    ) -> list[TopicDescription]:
        """Partitions, leaders, replicas and ISR of the given topics (all when None), as the
        brokers' metadata has them. An unknown topic raises UNKNOWN_TOPIC_OR_PARTITION."""
        names = None if topics is None else list(topics)

        async def call(deadline: float) -> Any:
            async def attempt() -> Any:
                self._network.topics_of_interest = set(names or ())
                # Asked for now (not spaced like the client's own refreshes): a Spark stream
                # describes its topics every trigger; call_with_retries spaces the retries.
                return await self._network.refresh_metadata(spaced=False)

            return await self._network.call_with_retries(
                attempt, deadline=deadline, backoff_s=self._backoff_s, what="Metadata"
            )

        snapshot = self._run(call, timeout)
        if names is None:
            return sorted(snapshot.topics.values(), key=lambda t: t.name)
        out = []
        for name in names:
            if name in snapshot.topic_errors:
                code, message = snapshot.topic_errors[name]
                raise topic_error(name, code, message)
            if name not in snapshot.topics:
                raise error_for_code(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
                )
            out.append(snapshot.topics[name])
        return out

    def describe_cluster(self, *, timeout: float | None = None) -> ClusterDescription:
        """Cluster id, active controller, live brokers, controllers and group coordinators
        (from the controller)."""

        async def call(deadline: float) -> Any:
            return await self._controller_call(
                "DescribeCluster", controller_pb2.DescribeClusterRequest(), deadline, True
            )

        response = self._run(call, timeout)
        error = _error_of(response.error, "(cluster)")
        if error is not None:
            raise error

        def node(c: Any) -> Node:
            return Node(c.id, c.host, c.port, getattr(c, "rack", ""))

        controller = node(response.controller) if response.controller.port else None
        return ClusterDescription(
            response.cluster_id,
            controller,
            tuple(sorted((node(b) for b in response.brokers), key=lambda n: n.id)),
            tuple(sorted((node(c) for c in response.controllers), key=lambda n: n.id)),
            tuple(sorted((node(c) for c in response.coordinators), key=lambda n: n.id)),
        )

    def describe_log_dirs(
        self, broker_ids: Iterable[int] | None = None, *, timeout: float | None = None
    ) -> list[LogDirDescription]:
        """Each broker's data directory (all live brokers, or those in ``broker_ids``): whether
        it can be written, its scrubber's progress, damage found and repairs, and its partition
        replicas (Kafka's describeLogDirs). A broker that is not live or does not answer raises
        (typed, naming it)."""
        wanted = None if broker_ids is None else sorted(set(broker_ids))

        async def call(deadline: float) -> list[LogDirDescription]:
            response = await self._controller_call(
                "DescribeCluster", controller_pb2.DescribeClusterRequest(), deadline, True
            )
            error = _error_of(response.error, "(cluster)")
            if error is not None:
                raise error
            live = {b.id: f"{b.host}:{b.port}" for b in response.brokers}
            ids = sorted(live) if wanted is None else wanted
            missing = [b for b in ids if b not in live]
            if missing:
                raise FjordError(f"brokers {missing} are not live (live: {sorted(live)})",
                                 code=ErrorCode.BROKER_NOT_AVAILABLE)

            async def one(broker_id: int) -> LogDirDescription:
                address = live[broker_id]

                async def attempt() -> broker_pb2.DescribeLogDirsResponse:
                    try:
                        return await self._network.broker(address).DescribeLogDirs(
                            broker_pb2.DescribeLogDirsRequest(),
                            timeout=min(self._request_timeout_s, _remaining(deadline)),
                        )
                    except Exception as exc:
                        raise transport_error(exc, f"broker {broker_id} at {address}") from exc

                # A transport failure is retried until the deadline, as Kafka's admin client
                # retries a call whose node is unreachable: a broker that just restarted can
                # be refused for a moment by this process's channel (gRPC's reconnect backoff).
                answer = await self._network.call_with_retries(
                    attempt, deadline=deadline, backoff_s=self._backoff_s,
                    what=f"DescribeLogDirs (broker {broker_id})",
                )
                failure = _error_of(answer.error, f"(broker {broker_id})")
                if failure is not None:
                    raise failure
                return _log_dir(answer)

            return list(await asyncio.gather(*(one(b) for b in ids)))

        return self._run(call, timeout)

    # -- ACLs (Kafka's CreateAcls/DescribeAcls/DeleteAcls, kept by the controller) -------------

    def create_acls(
        self, bindings: Sequence[AclBinding], *, timeout: float | None = None
    ) -> None:
        """Create ``bindings`` (one that exists already is kept, not an error). Raises the first
        binding's error: INVALID_REQUEST naming what is wrong, CLUSTER_AUTHORIZATION_FAILED
        without Alter on the cluster; the valid ones are created all the same."""
        request = controller_pb2.CreateAclsRequest(
            creations=[binding_to_pb(b) for b in bindings]
        )

        async def call(deadline: float) -> Any:
            return await self._controller_call("CreateAcls", request, deadline)

        response = self._run(call, timeout)
        for binding, result in zip(bindings, response.results, strict=True):
            error = _acl_error(result.error, binding)
            if error is not None:
                raise error

    def describe_acls(
        self, selector: AclBindingFilter = MATCH_ALL, *, timeout: float | None = None
    ) -> list[AclBinding]:
        """The ACLs ``selector`` matches (all by default), sorted."""
        request = controller_pb2.DescribeAclsRequest(filter=filter_to_pb(selector))

        async def call(deadline: float) -> Any:
            return await self._controller_call("DescribeAcls", request, deadline, True)

        response = self._run(call, timeout)
        self._top_error(response)
        return [binding_from_pb(b) for b in response.bindings]

    def delete_acls(
        self, filters: Sequence[AclBindingFilter], *, timeout: float | None = None
    ) -> list[list[AclBinding]]:
        """Delete what each filter matches; per filter, the ACLs it deleted. Raises the first
        filter's error (nothing is deleted for a filter with an error)."""
        request = controller_pb2.DeleteAclsRequest(filters=[filter_to_pb(f) for f in filters])

        async def call(deadline: float) -> Any:
            return await self._controller_call("DeleteAcls", request, deadline)

        response = self._run(call, timeout)
        out = []
        for selector, result in zip(filters, response.results, strict=True):
            error = _acl_error(result.error, selector)
            if error is not None:
                raise error
            out.append([binding_from_pb(b) for b in result.deleted])
        return out

    # -- SCRAM credentials (Kafka's Describe/AlterUserScramCredentials) ------------------------

    def describe_user_scram_credentials(
        self, users: Sequence[str] | None = None, *, timeout: float | None = None
    ) -> dict[str, list[ScramCredentialInfo]]:
        """Each user's SCRAM mechanisms and iteration counts (every user with credentials by
        default). A named user without credentials raises RESOURCE_NOT_FOUND naming it."""
        request = controller_pb2.DescribeUserScramCredentialsRequest(users=list(users or ()))

        async def call(deadline: float) -> Any:
            return await self._controller_call(
                "DescribeUserScramCredentials", request, deadline, True
            )

        response = self._run(call, timeout)
        self._top_error(response)
        out: dict[str, list[ScramCredentialInfo]] = {}
        for result in response.results:
            error = _acl_error(result.error, f"user {result.user!r}")
            if error is not None:
                raise error
            out[result.user] = [
                ScramCredentialInfo(MECHANISM_BY_TYPE.get(c.mechanism, str(c.mechanism)),
                                    c.iterations)
                for c in result.credentials
            ]
        return out

    def alter_user_scram_credentials(
        self,
        alterations: Sequence[UserScramCredentialUpsertion | UserScramCredentialDeletion],
        *,
        timeout: float | None = None,
    ) -> None:
        """Set or delete users' SCRAM credentials. Passwords are salted here (random salt,
        ``iterations``) and only salt, StoredKey and ServerKey go to the controller. Each
        user's alterations are applied or refused together; raises the first refused user's
        error (UNSUPPORTED_SASL_MECHANISM, UNACCEPTABLE_CREDENTIAL, DUPLICATE_RESOURCE,
        RESOURCE_NOT_FOUND, CLUSTER_AUTHORIZATION_FAILED); the other users' are applied."""
        request = controller_pb2.AlterUserScramCredentialsRequest()
        for item in alterations:
            mechanism = SCRAM_MECHANISMS[check_mechanism(item.mechanism)]
            if isinstance(item, UserScramCredentialDeletion):
                request.deletions.add(user=item.user, mechanism=mechanism)
                continue
            credential = ScramCredential.from_password(
                item.mechanism, item.password, item.iterations
            )
            request.upsertions.add(
                user=item.user, mechanism=mechanism, iterations=credential.iterations,
                salt=credential.salt, stored_key=credential.stored_key,
                server_key=credential.server_key,
            )

        async def call(deadline: float) -> Any:
            return await self._controller_call("AlterUserScramCredentials", request, deadline)

        response = self._run(call, timeout)
        for result in response.results:
            error = _acl_error(result.error, f"user {result.user!r}")
            if error is not None:
                raise error

    # -- reassignment and elections -----------------------------------------------------------

    def _top_error(self, response: Any) -> None:
        error = _error_of(response.error, "(request)")
        if error is not None:
            raise error

    def alter_partition_reassignments(
        self,
        reassignments: Mapping[TopicPartition, Sequence[int] | None],
        *,
        timeout: float | None = None,
        raise_on_error: bool = True,
    ) -> PartitionErrors:
        """Move partitions to new replica lists (first = preferred leader); None cancels a
        running reassignment. Returns at once; the move completes when every new replica has
        joined the ISR (see :meth:`list_partition_reassignments`). Typed errors per partition:
        INVALID_REPLICA_ASSIGNMENT, UNKNOWN_TOPIC_OR_PARTITION, NO_REASSIGNMENT_IN_PROGRESS."""
        request = controller_pb2.AlterPartitionReassignmentsRequest(
            partitions=[
                controller_pb2.ReassignablePartition(
                    topic=topic,
                    partition=partition,
                    replicas=list(replicas or ()),
                    cancel=replicas is None,
                )
                for (topic, partition), replicas in reassignments.items()
            ],
            timeout_ms=int(self._request_timeout_s * 1000),
        )

        async def call(deadline: float) -> Any:
            return await self._controller_call(
                "AlterPartitionReassignments", request, deadline, True
            )

        response = self._run(call, timeout)
        self._top_error(response)
        return _raise_first_partition(_partition_results(response.results), raise_on_error)

    def list_partition_reassignments(
        self,
        partitions: Iterable[TopicPartition] | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, PartitionReassignment]:
        """The running reassignments (of ``partitions``, or all)."""
        request = controller_pb2.ListPartitionReassignmentsRequest(
            partitions=[
                controller_pb2.TopicPartitionRef(topic=t, partition=p)
                for t, p in (partitions or ())
            ],
            timeout_ms=int(self._request_timeout_s * 1000),
        )

        async def call(deadline: float) -> Any:
            return await self._controller_call(
                "ListPartitionReassignments", request, deadline, True
            )

        response = self._run(call, timeout)
        self._top_error(response)
        return {
            TopicPartition(r.topic, r.partition): PartitionReassignment(
                tuple(r.replicas), tuple(r.adding_replicas), tuple(r.removing_replicas)
            )
            for r in response.reassignments
        }

    def elect_leaders(
        self,
        election_type: str = "preferred",
        partitions: Iterable[TopicPartition] | None = None,
        *,
        timeout: float | None = None,
        raise_on_error: bool = True,
    ) -> PartitionErrors:
        """Kafka's ElectLeaders: ``preferred`` moves leadership to each partition's first
        replica (if live and in the ISR), ``unclean`` elects any live replica for partitions
        without a live leader. ``partitions`` None means every partition (then those that
        need no election are left out). Errors per partition: ELECTION_NOT_NEEDED,
        PREFERRED_LEADER_NOT_AVAILABLE, ELIGIBLE_LEADERS_NOT_AVAILABLE, ..."""
        if election_type not in ELECTION_TYPES:
            raise FjordError(
                f"election type must be one of {sorted(ELECTION_TYPES)}, got {election_type!r}",
                code=ErrorCode.INVALID_REQUEST,
            )
        request = controller_pb2.ElectLeadersRequest(
            election_type=ELECTION_TYPES[election_type],
            partitions=[
                controller_pb2.TopicPartitionRef(topic=t, partition=p)
                for t, p in (partitions or ())
            ],
            timeout_ms=int(self._request_timeout_s * 1000),
        )

        async def call(deadline: float) -> Any:
            return await self._controller_call("ElectLeaders", request, deadline, True)

        response = self._run(call, timeout)
        self._top_error(response)
        return _raise_first_partition(_partition_results(response.results), raise_on_error)

    def plan_replication_factor(
        self, topic: str, replication_factor: int, *, timeout: float | None = None
    ) -> dict[TopicPartition, list[int]]:
        """The reassignment that gives ``topic`` ``replication_factor`` replicas per partition
        with the fewest moves, balanced over the live brokers, on distinct racks when every
        broker has one (the pure planner
        :func:`fjord.cluster.reassignment_plan.plan_reassignment`). Refuses with
        REASSIGNMENT_IN_PROGRESS while a partition of the topic is moving."""
        from fjord.cluster.reassignment_plan import plan_reassignment

        (description,) = self.describe_topics([topic], timeout=timeout)
        moving = [
            key for key in self.list_partition_reassignments(timeout=timeout) if key[0] == topic
        ]
        if moving:
            raise ReassignmentInProgressError(
                f"partitions {sorted(p for _, p in moving)} of {topic!r} are being reassigned"
            )
        nodes = self.describe_cluster(timeout=timeout).brokers
        current = {
            TopicPartition(topic, p.partition): list(p.replicas) for p in description.partitions
        }
        # Rack-aware when every live broker has a rack (replicas on distinct racks).
        racks = {node.id: node.rack or None for node in nodes}
        return plan_reassignment(
            current, [node.id for node in nodes], target_rf=replication_factor, racks=racks
        )

    def alter_replication_factor(
        self, topic: str, replication_factor: int, *, timeout: float | None = None
    ) -> dict[TopicPartition, list[int]]:
        """Change ``topic``'s replication factor: plans it (:meth:`plan_replication_factor`)
        and starts the reassignment; returns the new replica lists (empty: nothing to do).
        Growing completes when the new replicas have caught up; shrinking at once."""
        plan = self.plan_replication_factor(topic, replication_factor, timeout=timeout)
        if plan:
            self.alter_partition_reassignments(dict(plan), timeout=timeout)
        return plan

    # -- consumer groups ----------------------------------------------------------------------

    async def _coordinator_call(
        self, group_id: str, name: str, request: Any, deadline: float
    ) -> tuple[str, Any]:
        """Call RPC ``name`` for ``group_id`` on its coordinator; returns (address, answer).
        The coordinator is looked up again (FindCoordinator) on every attempt, so
        NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE and transport
        failures are retried after a rediscovery until ``deadline``."""
        if not group_id:
            raise InvalidGroupIdError("the group id must not be empty")
        network = self._network

        async def attempt() -> tuple[str, Any]:
            address = await network.find_coordinator(group_id)
            try:
                response = await getattr(network.coordinator(address), name)(
                    request, timeout=min(self._request_timeout_s, deadline - time.monotonic())
                )
            except Exception as exc:
                error = transport_error(exc, f"coordinator {address}")
                if isinstance(error, KafkaTimeoutError):
                    error = FjordError(str(error), code=ErrorCode.REQUEST_TIMED_OUT)
                raise error from exc
            for code, message in _coordinator_errors(response):
                if code in COORDINATOR_RETRIABLE:
                    raise error_for_code(code, f"{name}({group_id!r}) at {address}: {message}")
            return address, response

        return await network.call_with_retries(
            attempt, deadline=deadline, backoff_s=self._backoff_s, what=f"{name}({group_id!r})"
        )

    async def _coordinators(self, deadline: float) -> list[str]:
        """Addresses of every live group coordinator (the controller's DescribeCluster)."""
        response = await self._controller_call(
            "DescribeCluster", controller_pb2.DescribeClusterRequest(), deadline, True
        )
        error = _error_of(response.error, "(cluster)")
        if error is not None:
            raise error
        return [f"{c.host}:{c.port}" for c in response.coordinators]

    def list_transactions(
        self,
        states: Iterable[str] | None = None,
        producer_ids: Iterable[int] | None = None,
        *,
        timeout: float | None = None,
    ) -> list[TransactionDescription]:
        """Every transactional id of every live coordinator (those in ``states``, Kafka's
        names such as "Ongoing", and of ``producer_ids`` when given), sorted by id. As
        :meth:`list_consumer_groups`: all coordinators must answer, else it is retried."""
        request = coordinator_pb2.ListTransactionsRequest(
            states_filter=list(states or ()), producer_id_filter=list(producer_ids or ())
        )
        network = self._network

        async def ask(address: str, deadline: float) -> Any:
            try:
                response = await network.coordinator(address).ListTransactions(
                    request, timeout=min(self._request_timeout_s, deadline - time.monotonic())
                )
            except Exception as exc:
                raise transport_error(exc, f"coordinator {address}") from exc
            for code, message in _coordinator_errors(response):
                raise error_for_code(code, f"ListTransactions at {address}: {message}")
            return response

        async def call(deadline: float) -> list[Any]:
            async def attempt() -> list[Any]:
                addresses = await self._coordinators(deadline)
                if not addresses:
                    raise CoordinatorNotAvailableError("no coordinator is running")
                return list(await asyncio.gather(*(ask(a, deadline) for a in addresses)))

            return await network.call_with_retries(
                attempt, deadline=deadline, backoff_s=self._backoff_s, what="ListTransactions"
            )

        found: dict[str, TransactionDescription] = {}
        for response in self._run(call, timeout):
            for t in response.transactions:
                found.setdefault(t.transactional_id, TransactionDescription(
                    t.transactional_id, t.state, t.producer_id, t.producer_epoch,
                    t.transaction_timeout_ms, t.transaction_start_time_ms,
                    tuple(TopicPartition(p.topic, p.partition) for p in t.partitions),
                    t.coordinator_id,
                ))
        return sorted(found.values(), key=lambda t: t.transactional_id)

    def list_consumer_groups(
        self, states: Iterable[str] | None = None, *, timeout: float | None = None
    ) -> list[ConsumerGroupListing]:
        """Every group of every live coordinator (only those in ``states``, e.g. ``["Stable",
        "Empty"]``, when given), sorted by id. All coordinators must answer: when one does not
        (it just died, or is loading), the whole listing is retried until the timeout, so a
        group is never silently left out. No live coordinator: COORDINATOR_NOT_AVAILABLE."""
        request = coordinator_pb2.ListGroupsRequest(states_filter=_group_states(states or ()))
        network = self._network

        async def ask(address: str, deadline: float) -> Any:
            try:
                response = await network.coordinator(address).ListGroups(
                    request, timeout=min(self._request_timeout_s, deadline - time.monotonic())
                )
            except Exception as exc:
                raise transport_error(exc, f"coordinator {address}") from exc
            for code, message in _coordinator_errors(response):
                raise error_for_code(code, f"ListGroups at {address}: {message}")
            return response

        async def call(deadline: float) -> list[Any]:
            async def attempt() -> list[Any]:
                addresses = await self._coordinators(deadline)
                if not addresses:
                    raise CoordinatorNotAvailableError("no group coordinator is running")
                return list(await asyncio.gather(*(ask(a, deadline) for a in addresses)))

            return await network.call_with_retries(
                attempt, deadline=deadline, backoff_s=self._backoff_s, what="ListGroups"
            )

        listings: dict[str, ConsumerGroupListing] = {}
        for response in self._run(call, timeout):
            for group in response.groups:
                listings.setdefault(
                    group.group_id,
                    ConsumerGroupListing(group.group_id, group.group_state, group.protocol_type),
                )
        return sorted(listings.values(), key=lambda g: g.group_id)

    def describe_consumer_groups(
        self, group_ids: Iterable[str], *, timeout: float | None = None
    ) -> dict[str, ConsumerGroupDescription]:
        """State, protocol and members (with their decoded assignments) of each group. A
        group that does not exist is described as Dead with no members (Kafka's answer);
        other errors (e.g. INVALID_GROUP_ID) are raised, typed."""
        ids = list(dict.fromkeys(group_ids))

        async def one(group_id: str, deadline: float) -> ConsumerGroupDescription:
            request = coordinator_pb2.DescribeGroupsRequest(group_ids=[group_id])
            address, response = await self._coordinator_call(
                group_id, "DescribeGroups", request, deadline
            )
            for group in response.groups:
                if group.group_id != group_id:
                    continue
                code = error_code_from_number(group.error.code)
                if code is ErrorCode.GROUP_ID_NOT_FOUND:
                    return ConsumerGroupDescription(group_id, DEAD_STATE, "", "", (), address)
                if code is not ErrorCode.NONE:
                    raise error_for_code(code, f"group {group_id!r}: {group.error.message}")
                return ConsumerGroupDescription(
                    group_id,
                    group.group_state,
                    group.protocol_type,
                    group.protocol_data,
                    tuple(_decode_member(m, group.protocol_type) for m in group.members),
                    address,
                )
            raise FjordError(
                f"the coordinator at {address} did not describe group {group_id!r}",
                code=ErrorCode.UNKNOWN_SERVER_ERROR,
            )

        async def call(deadline: float) -> list[ConsumerGroupDescription]:
            return list(await asyncio.gather(*(one(g, deadline) for g in ids)))

        return {d.group_id: d for d in self._run(call, timeout)}

    def delete_consumer_groups(
        self,
        group_ids: Iterable[str],
        *,
        timeout: float | None = None,
        raise_on_error: bool = True,
    ) -> dict[str, FjordError | None]:
        """Delete groups with their committed offsets: {group: None or error}. Only groups
        without active members can go (NON_EMPTY_GROUP, "The group is not empty."); an unknown
        group is GROUP_ID_NOT_FOUND. With ``raise_on_error`` the first error is raised after
        every group was tried."""
        ids = list(dict.fromkeys(group_ids))

        async def one(group_id: str, deadline: float) -> FjordError | None:
            request = coordinator_pb2.DeleteGroupsRequest(group_ids=[group_id])
            _, response = await self._coordinator_call(group_id, "DeleteGroups", request, deadline)
            for result in response.results:
                if result.group_id == group_id:
                    return _group_error(group_id, result.error)
            return FjordError(
                f"the coordinator did not answer for group {group_id!r}",
                code=ErrorCode.UNKNOWN_SERVER_ERROR,
            )

        async def call(deadline: float) -> list[FjordError | None]:
            return list(await asyncio.gather(*(one(g, deadline) for g in ids)))

        errors = dict(zip(ids, self._run(call, timeout), strict=True))
        if raise_on_error:
            for error in errors.values():
                if error is not None:
                    raise error
        return errors

    def list_consumer_group_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition] | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets: every committed partition when ``partitions`` is
        None; otherwise exactly the partitions asked, None for those without a commit."""
        asked = None if partitions is None else sorted({TopicPartition(*tp) for tp in partitions})
        by_topic: dict[str, list[int]] = {}
        for tp in asked or ():
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        request = coordinator_pb2.OffsetFetchRequest(
            group_id=group_id,
            topics=[
                coordinator_pb2.OffsetFetchTopic(name=t, partitions=ps)
                for t, ps in by_topic.items()
            ],
        )

        async def call(deadline: float) -> Any:
            return (await self._coordinator_call(group_id, "OffsetFetch", request, deadline))[1]

        response = self._run(call, timeout)
        found: dict[TopicPartition, OffsetAndMetadata | None] = dict.fromkeys(asked or ())
        if response.error.code == ErrorCode.GROUP_ID_NOT_FOUND.code:
            return found  # Kafka's answer for a group that does not exist: nothing committed
        error = _group_error(group_id, response.error)
        if error is not None:
            raise error
        for topic in response.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition)
                code = error_code_from_number(p.error.code)
                if code is not ErrorCode.NONE:
                    raise error_for_code(
                        code, f"group {group_id!r}, {tp.topic}-{tp.partition}: {p.error.message}"
                    )
                if p.committed_offset >= 0:
                    found[tp] = OffsetAndMetadata(
                        p.committed_offset,
                        p.metadata,
                        None if p.committed_leader_epoch < 0 else p.committed_leader_epoch,
                    )
        return dict(sorted(found.items()))

    def alter_consumer_group_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
        *,
        timeout: float | None = None,
        raise_on_error: bool = True,
    ) -> dict[TopicPartition, FjordError | None]:
        """Set committed offsets (a simple commit: generation -1, no member id), e.g. to
        rewind a stopped application. The coordinator accepts it only while the group has no
        active members: otherwise every partition gets NonEmptyGroupError (the wire's
        UNKNOWN_MEMBER_ID, as Kafka answers a simple commit to an active group). Negative
        offsets are refused before anything is sent (INVALID_COMMIT_OFFSET_SIZE)."""
        for tp, value in offsets.items():
            offset = value.offset if isinstance(value, OffsetAndMetadata) else value
            if offset < 0:
                raise FjordError(
                    f"offset for {tp[0]}-{tp[1]} must be >= 0, got {offset}",
                    code=ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
                )
        request = coordinator_pb2.OffsetCommitRequest(
            group_id=group_id,
            generation_id=-1,
            member_id="",
            topics=_offset_request_topics(offsets),
        )

        async def call(deadline: float) -> Any:
            return (await self._coordinator_call(group_id, "OffsetCommit", request, deadline))[1]

        response = self._run(call, timeout)
        error = _group_error(group_id, response.error)
        if error is not None:
            raise error
        results: dict[TopicPartition, FjordError | None] = {}
        for topic in response.topics:
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition)
                code = error_code_from_number(p.error.code)
                if code is ErrorCode.UNKNOWN_MEMBER_ID:
                    results[tp] = NonEmptyGroupError(
                        f"cannot set the offsets of group {group_id!r}: it has active members "
                        "(stop its consumers first)"
                    )
                elif code is not ErrorCode.NONE:
                    results[tp] = error_for_code(
                        code, f"{tp.topic}-{tp.partition}: {p.error.message or code.name}"
                    )
                else:
                    results[tp] = None
        if raise_on_error:
            for failure in results.values():
                if failure is not None:
                    raise failure
        return results

    def list_offsets(
        self, specs: Mapping[TopicPartition, OffsetSpec], *, timeout: float | None = None
    ) -> dict[TopicPartition, int | None]:
        """Kafka's ``listOffsets``: per partition the log start offset (``"earliest"``), the
        log end offset (``"latest"``: the high watermark) or, for a timestamp in ms, the first
        offset whose record timestamp is >= it (None when no record is that late)."""
        if not specs:
            return {}
        out: dict[TopicPartition, int | None] = {}
        earliest = [TopicPartition(*tp) for tp, s in specs.items() if s == "earliest"]
        latest = [TopicPartition(*tp) for tp, s in specs.items() if s == "latest"]
        times: dict[TopicPartition, int] = {}
        for tp, spec in specs.items():
            if spec in ("earliest", "latest"):
                continue
            if not isinstance(spec, int) or isinstance(spec, bool):
                raise FjordError(
                    f"offset spec for {tp[0]}-{tp[1]} must be 'earliest', 'latest' or a "
                    f"timestamp in ms, got {spec!r}",
                    code=ErrorCode.INVALID_REQUEST,
                )
            if spec < 0:
                raise FjordError(
                    f"timestamp for {tp[0]}-{tp[1]} must be >= 0, got {spec}",
                    code=ErrorCode.INVALID_REQUEST,
                )
            times[TopicPartition(*tp)] = spec
        reader = self._offsets_reader()
        deadline = time.monotonic() + (self._timeout_s if timeout is None else timeout)
        if earliest:
            out.update(reader.beginning_offsets(earliest, _remaining(deadline)))
        if latest:
            out.update(reader.end_offsets(latest, _remaining(deadline)))
        if times:
            found = reader.offsets_for_times(times, _remaining(deadline))
            out.update({tp: None if o is None else o.offset for tp, o in found.items()})
        return out

    def delete_records(
        self, offsets: Mapping[TopicPartition, int], *, timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        """Kafka's ``deleteRecords``: move each partition's log start offset up to the given
        offset (-1: its high watermark), so that the records below it can no longer be read;
        returns each partition's low watermark (its new log start offset).

        Checked before anything is sent, so that bad input changes nothing: an unknown topic or
        partition raises UNKNOWN_TOPIC_OR_PARTITION, an offset below -1 or above the
        partition's high watermark OFFSET_OUT_OF_RANGE, each naming the partition. Then each
        leader is asked for its partitions (a leader that moved meanwhile is found again and
        asked, within the timeout); a partition the leader refuses raises its typed error
        after every partition was tried."""
        wanted: dict[TopicPartition, int] = {}
        for tp, offset in offsets.items():
            key = TopicPartition(*tp)
            if not isinstance(offset, int) or isinstance(offset, bool):
                raise InvalidRequestError(
                    f"{key.topic}-{key.partition}: offset must be an integer, got {offset!r}"
                )
            wanted[key] = offset
        if not wanted:
            return {}
        deadline = time.monotonic() + (self._timeout_s if timeout is None else timeout)
        counts = {t.name: len(t.partitions)
                  for t in self.describe_topics(sorted({tp.topic for tp in wanted}),
                                                timeout=_remaining(deadline))}
        for tp, offset in sorted(wanted.items()):
            if not 0 <= tp.partition < counts[tp.topic]:
                raise error_for_code(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"{tp.topic}-{tp.partition}: topic {tp.topic!r} has {counts[tp.topic]} "
                    "partitions",
                )
            if offset < -1:
                raise OffsetOutOfRangeError(
                    f"{tp.topic}-{tp.partition}: offset {offset} is negative (-1 means the "
                    "high watermark)"
                )
        ends = self.list_offsets(dict.fromkeys(wanted, "latest"), timeout=_remaining(deadline))
        beyond = [
            f"{tp.topic}-{tp.partition}: offset {offset} is above the high watermark {ends[tp]}"
            for tp, offset in sorted(wanted.items())
            if ends[tp] is not None and offset > cast(int, ends[tp])
        ]
        if beyond:
            raise OffsetOutOfRangeError("; ".join(beyond) + " (nothing deleted)")
        done: dict[TopicPartition, int] = {}
        failed: dict[TopicPartition, FjordError] = {}

        async def call(deadline: float) -> None:
            async def attempt() -> None:
                snapshot = await self._network.refresh_metadata()
                pending = [tp for tp in wanted if tp not in done and tp not in failed]
                by_leader: dict[int, list[TopicPartition]] = {}
                retry: FjordError | None = None
                for tp in pending:
                    leader = snapshot.leaders.get(tp)
                    if leader is None or leader not in snapshot.brokers:
                        retry = FjordError(f"{tp.topic}-{tp.partition} has no leader",
                                           code=ErrorCode.LEADER_NOT_AVAILABLE)
                    else:
                        by_leader.setdefault(leader, []).append(tp)
                for leader, tps in sorted(by_leader.items()):
                    request = broker_pb2.DeleteRecordsRequest()
                    for topic in sorted({tp.topic for tp in tps}):
                        request.topics.add(name=topic, partitions=[
                            broker_pb2.DeleteRecordsPartition(partition=tp.partition,
                                                              offset=wanted[tp])
                            for tp in tps if tp.topic == topic
                        ])
                    address = snapshot.brokers[leader].address
                    try:
                        answer = await self._network.broker(address).DeleteRecords(
                            request, timeout=min(self._request_timeout_s, _remaining(deadline))
                        )
                    except Exception as exc:
                        retry = transport_error(exc, f"broker {leader} at {address}")
                        continue
                    for t in answer.topics:
                        for r in t.partitions:
                            tp = TopicPartition(t.name, r.partition)
                            error = _error_of(r.error, t.name)
                            if error is None:
                                done[tp] = r.low_watermark
                            elif error.retriable:
                                retry = error_for_code(
                                    error.code, f"{tp.topic}-{tp.partition}: {r.error.message}"
                                )
                            else:
                                failed[tp] = error_for_code(
                                    error.code, f"{tp.topic}-{tp.partition}: {r.error.message}"
                                )
                if retry is not None:
                    raise retry

            await self._network.call_with_retries(
                attempt, deadline=deadline, backoff_s=self._backoff_s, what="DeleteRecords"
            )

        self._run(call, _remaining(deadline))
        for tp in sorted(failed):
            raise failed[tp]
        return done

    def _offsets_reader(self) -> Consumer:
        """A group-less consumer used only for ListOffsets (log start/end offsets and
        ``offsets_for_times``), created on first use and closed with this client."""
        if self._closed:
            raise FjordError("the admin client is closed", code=ErrorCode.INVALID_REQUEST)
        if self._reader is None:
            cfg = self.config
            self._reader = Consumer(
                {
                    "bootstrap.servers": ",".join(f"{h}:{p}" for h, p in cfg["bootstrap.servers"]),
                    "client.id": f"{cfg['client.id']}-offsets",
                    "request.timeout.ms": cfg["request.timeout.ms"],
                    "retry.backoff.ms": cfg["retry.backoff.ms"],
                    "fetch.max.wait.ms": 0,
                    "enable.auto.commit": False,
                    # The admin client's own security settings: without them a secure
                    # cluster's brokers refused this consumer's plaintext handshake.
                    **{k: cfg[k] for k in CLIENT_SECURITY_KEYS if cfg.get(k) is not None},
                }
            )
        return self._reader

    def describe_consumer_group_lag(
        self,
        group_id: str,
        *,
        description: ConsumerGroupDescription | None = None,
        timeout: float | None = None,
    ) -> list[LagRow]:
        """The rows of ``kafka-consumer-groups --describe``: every partition with a committed
        offset or an owner, its log end offset (None for a partition that no longer exists),
        lag, time lag (now minus the timestamp of the first record not yet committed, read
        with one Fetch per partition that is behind) and the member holding it
        (:func:`fjord.groups.lag.lag_rows`). Pass the
        ``description`` just fetched to save a DescribeGroups call."""
        deadline = time.monotonic() + (self._timeout_s if timeout is None else timeout)
        if description is None:
            description = self.describe_consumer_groups([group_id], timeout=_remaining(deadline))[
                group_id
            ]
        committed = self.list_consumer_group_offsets(group_id, timeout=_remaining(deadline))
        members = [
            MemberPartitions(m.member_id, m.host, m.client_id, m.assignment)
            for m in description.members
        ]
        wanted = set(committed) | {tp for m in description.members for tp in m.assignment}
        existing = self._partition_counts(_remaining(deadline))
        ends = self.list_offsets(
            {tp: "latest" for tp in wanted if tp.partition < existing.get(tp.topic, 0)},
            timeout=_remaining(deadline),
        )
        offsets = {tp: o.offset for tp, o in committed.items() if o is not None}
        known_ends = {tp: o for tp, o in ends.items() if o is not None}
        behind = {tp: o for tp, o in offsets.items() if 0 <= o < known_ends.get(tp, -1)}
        stamps = (
            self._offsets_reader().first_record_timestamps(behind, _remaining(deadline))
            if behind
            else {}
        )
        return lag_rows(offsets, known_ends, members, stamps, int(time.time() * 1000))

    def _partition_counts(self, timeout: float) -> dict[str, int]:
        return {t.name: len(t.partitions) for t in self.describe_topics(None, timeout=timeout)}

    def plan_consumer_group_offsets_reset(
        self,
        group_id: str,
        spec: ResetSpec,
        *,
        topics: Sequence[str] | None = None,
        all_topics: bool = False,
        timeout: float | None = None,
    ) -> list[PartitionReset]:
        """Kafka's ``--reset-offsets`` plan, computed by
        :func:`fjord.groups.lag.plan_offset_reset` from the group's state, its committed
        offsets and the partitions' earliest/latest offsets (and ``offsets_for_times`` for
        :class:`ToDatetime` and :class:`ByDuration`). ``topics`` takes ``orders`` or
        ``orders:0,2`` selectors; ``all_topics`` means every topic the group has committed
        offsets for; a :class:`FromFile` spec brings its own partitions (give neither). Changes
        nothing: commit the plan with :meth:`reset_consumer_group_offsets`. Refused with
        NonEmptyGroupError while the group has active members."""
        deadline = time.monotonic() + (self._timeout_s if timeout is None else timeout)
        description = self.describe_consumer_groups([group_id], timeout=_remaining(deadline))[
            group_id
        ]
        committed_meta = self.list_consumer_group_offsets(group_id, timeout=_remaining(deadline))
        committed: dict[TopicPartition, int] = {
            tp: o.offset for tp, o in committed_meta.items() if o is not None
        }
        scope = reset_scope(
            topics=topics,
            all_topics=all_topics,
            partitions_per_topic=self._partition_counts(_remaining(deadline)),
            committed=committed,
            from_file=spec if isinstance(spec, FromFile) else None,
        )

        def plan(
            partitions: list[TopicPartition],
            earliest: Mapping[TopicPartition, int],
            latest: Mapping[TopicPartition, int],
            for_times: Mapping[TopicPartition, int | None] | None = None,
        ) -> list[PartitionReset]:
            return plan_offset_reset(
                group_id,
                spec,
                partitions,
                group_state=description.state,
                active_members=len(description.members),
                committed=committed,
                earliest=earliest,
                latest=latest,
                offsets_for_times=for_times,
            )

        plan([], {}, {})  # refuses an active group before any ListOffsets is sent
        tps = list(scope)
        earliest = self._known_offsets(dict.fromkeys(tps, "earliest"), deadline)
        latest = self._known_offsets(dict.fromkeys(tps, "latest"), deadline)
        for_times: dict[TopicPartition, int | None] | None = None
        if isinstance(spec, ToDatetime | ByDuration):
            if isinstance(spec, ToDatetime):
                timestamp_ms = spec.timestamp_ms
            else:  # now minus the duration, as Kafka's tool computes it (never a special value)
                timestamp_ms = max(0, round(time.time() * 1000) - spec.duration_ms)
            found = self.list_offsets(
                dict.fromkeys(tps, timestamp_ms), timeout=_remaining(deadline)
            )
            for_times = dict(found)
        return plan(scope, earliest, latest, for_times)

    def _known_offsets(
        self, specs: Mapping[TopicPartition, OffsetSpec], deadline: float
    ) -> dict[TopicPartition, int]:
        found = self.list_offsets(specs, timeout=_remaining(deadline))
        return {tp: offset for tp, offset in found.items() if offset is not None}

    def reset_consumer_group_offsets(
        self, group_id: str, plan: Iterable[PartitionReset], *, timeout: float | None = None
    ) -> None:
        """Commit a plan of :meth:`plan_consumer_group_offsets_reset` (``--execute``): one
        simple OffsetCommit, refused (NonEmptyGroupError) if members joined meanwhile."""
        offsets = {TopicPartition(r.topic, r.partition): r.new_offset for r in plan}
        if offsets:
            self.alter_consumer_group_offsets(group_id, offsets, timeout=timeout)

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._reader is not None:
                self._reader.close()
            self._io.run(self._network.close(), 5.0)
        finally:
            self._io.stop()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _log_dir(answer: Any) -> LogDirDescription:
    scrub = answer.scrub
    return LogDirDescription(
        answer.broker_id,
        answer.log_dir,
        answer.writable,
        answer.unwritable_reason,
        ScrubStatus(
            scrub.enabled, scrub.pass_number, scrub.passes_completed, scrub.verified_segments,
            scrub.total_segments, scrub.verified_bytes, scrub.total_bytes, scrub.damage_found,
            scrub.repairs_done, scrub.io_max_bytes_per_second,
        ),
        tuple(
            LogDirPartition(p.topic, p.partition, p.size_bytes, p.log_start_offset,
                            p.log_end_offset, p.leader, p.damaged_offset, p.damage,
                            p.repair_until_offset, p.compacted, p.cleaner_dirty_ratio,
                            p.cleaner_first_dirty_offset)
            for p in answer.partitions
        ),
    )
