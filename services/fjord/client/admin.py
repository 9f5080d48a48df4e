"""The admin client: topics and cluster operations (Kafka's ``AdminClient``).

Admin requests go to the active controller, found in a broker's Metadata answer (its
``controller`` field); a NOT_CONTROLLER answer or an unreachable controller means the controller
moved: the client refreshes metadata and retries, within ``default.api.timeout.ms``.
Each call raises the typed error of the first failing topic (e.g. TOPIC_ALREADY_EXISTS,
INVALID_TOPIC_EXCEPTION, UNKNOWN_TOPIC_OR_PARTITION, INVALID_PARTITIONS) after all topics of the
request were processed; ``raise_on_error=False`` returns {topic: error or None} instead.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fjord._proto import common_pb2, controller_pb2
from fjord.client.metadata import topic_error
from fjord.client.network import EventLoopThread, Network, transport_error
from fjord.client.types import (
    ClusterDescription,
    ConfigEntry,
    NewTopic,
    Node,
    TopicDescription,
)
from fjord.config import admin_config
from fjord.errors import (
    ErrorCode,
    FjordError,
    KafkaTimeoutError,
    NotControllerError,
    ReassignmentInProgressError,
    error_code_from_number,
    error_for_code,
)

T = TypeVar("T")

#: A partition as admin calls name it: (topic, partition).
TopicPartitionKey = tuple[str, int]
PartitionErrors = dict[TopicPartitionKey, FjordError | None]

#: ElectLeaders election types (Kafka's names and wire values).
ELECTION_TYPES = {"preferred": 0, "unclean": 1}


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
        out[(r.topic, r.partition)] = (
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


def _results(results: Iterable[Any]) -> TopicErrors:
    return {r.name: _error_of(r.error, r.name) for r in results}


def _raise_first(errors: TopicErrors, raise_on_error: bool) -> TopicErrors:
    if raise_on_error:
        for error in errors.values():
            if error is not None:
                raise error
    return errors


class AdminClient:
    """Creates, deletes, grows, configures and describes topics; describes the cluster.

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
        )
        self._closed = False

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
        """Create topics; returns {name: None} (or errors, see module doc)."""
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
            return await self._controller_call("CreateTopics", request, deadline)

        response = self._run(call, timeout)
        return _raise_first(_results(response.results), raise_on_error)

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
                return await self._network.refresh_metadata()

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
        """Cluster id, active controller, live brokers and controllers (from the controller)."""

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
        )

    # -- reassignment and elections -----------------------------------------------------------

    def _top_error(self, response: Any) -> None:
        error = _error_of(response.error, "(request)")
        if error is not None:
            raise error

    def alter_partition_reassignments(
        self,
        reassignments: Mapping[TopicPartitionKey, Sequence[int] | None],
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
        partitions: Iterable[TopicPartitionKey] | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartitionKey, PartitionReassignment]:
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
            (r.topic, r.partition): PartitionReassignment(
                tuple(r.replicas), tuple(r.adding_replicas), tuple(r.removing_replicas)
            )
            for r in response.reassignments
        }

    def elect_leaders(
        self,
        election_type: str = "preferred",
        partitions: Iterable[TopicPartitionKey] | None = None,
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
    ) -> dict[TopicPartitionKey, list[int]]:
        """The reassignment that gives ``topic`` ``replication_factor`` replicas per partition
        with the fewest moves, balanced over the live brokers (the pure planner
        :func:`fjord.controller.reassignment.plan_reassignment`). Refuses with
        REASSIGNMENT_IN_PROGRESS while a partition of the topic is moving."""
        from fjord.controller.reassignment import plan_reassignment

        (description,) = self.describe_topics([topic], timeout=timeout)
        moving = [
            key for key in self.list_partition_reassignments(timeout=timeout) if key[0] == topic
        ]
        if moving:
            raise ReassignmentInProgressError(
                f"partitions {sorted(p for _, p in moving)} of {topic!r} are being reassigned"
            )
        brokers = [node.id for node in self.describe_cluster(timeout=timeout).brokers]
        current = {(topic, p.partition): list(p.replicas) for p in description.partitions}
        return plan_reassignment(current, brokers, target_rf=replication_factor)

    def alter_replication_factor(
        self, topic: str, replication_factor: int, *, timeout: float | None = None
    ) -> dict[TopicPartitionKey, list[int]]:
        """Change ``topic``'s replication factor: plans it (:meth:`plan_replication_factor`)
        and starts the reassignment; returns the new replica lists (empty: nothing to do).
        Growing completes when the new replicas have caught up; shrinking at once."""
        plan = self.plan_replication_factor(topic, replication_factor, timeout=timeout)
        if plan:
            self.alter_partition_reassignments(dict(plan), timeout=timeout)
        return plan

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._io.run(self._network.close(), 5.0)
        finally:
            self._io.stop()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
