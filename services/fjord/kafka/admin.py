"""The Kafka admin handlers of every Kafka door (brokers and coordinators).

A Fjord controller speaks only gRPC, so a broker is the Kafka clients' ``controller_id`` and
forwards the requests that change cluster metadata (CreateTopics, DeleteTopics,
CreatePartitions, AlterConfigs, IncrementalAlterConfigs) to the active controller's gRPC API,
as a KRaft broker forwards them to its controller quorum (KIP-590). What a Kafka broker answers
from its own metadata (DescribeConfigs, DescribeCluster) and its own partitions (DeleteRecords,
OffsetForLeaderEpoch) is answered here from the node's image and, on a broker, its replicas
(:class:`LeaderReplicas`, the broker's ReplicaManager); a coordinator serves the cluster APIs
only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import grpc
from kafka.protocol.admin.acl import (
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
)
from kafka.protocol.admin.cluster import DescribeClusterRequest, DescribeClusterResponse
from kafka.protocol.admin.configs import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.admin.topics import (
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)
from kafka.protocol.admin.users import (
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
)
from kafka.protocol.consumer.offsets import OffsetForLeaderEpochResponse

from fjord._proto import controller_pb2, controller_pb2_grpc
from fjord.cluster.dynamic_config import (
    READ_ONLY_BROKER_KEYS,
    broker_key,
    describe_default_broker_config,
)
from fjord.cluster.topic_config import describe_broker_config, describe_topic_config
from fjord.errors import ErrorCode, FjordError
from fjord.kafka.codec import topic_uuid
from fjord.kafka.defaults import ADMIN_FORWARD_TIMEOUT_S
from fjord.kafka.dispatch import Api, RequestContext
from fjord.kafka.metadata import kafka_broker_ids, kafka_nodes, lowest_kafka_broker
from fjord.metadata import MetadataImage
from fjord.security.acls import (
    NO_AUTHORIZATION,
    AccessControl,
    AclOperation,
    Caller,
    Resource,
    denial_error,
)
from fjord.security.scram import (
    MECHANISM_BY_TYPE,
    ScramCredential,
    ScramCredentialError,
)
from fjord.serving import forwarding_metadata
from fjord.tls import open_channel

log = logging.getLogger(__name__)

#: Kafka's ConfigResource types Fjord describes/alters.
TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
#: Kafka's ConfigSource values for Fjord's config sources.
CONFIG_SOURCE = {
    "TOPIC": 1, "DYNAMIC_BROKER": 2, "CLUSTER_DEFAULT": 3, "STATIC_BROKER": 4, "DEFAULT": 5
}
#: CreateAcls/DescribeAcls/DeleteAcls versions served: v2 (flexible, pattern types) is what
#: confluent-kafka's AdminClient sends and what the tests exercise; others are not advertised.
ACL_VERSIONS = (2, 2)
#: IncrementalAlterConfigs operations.
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3


class NoController(FjordError):
    """No active controller to forward to (retriable: the client refreshes and retries)."""

    code = ErrorCode.NOT_CONTROLLER


class ControllerForwarder:
    """Calls the active controller's gRPC API (one channel per controller address).

    Invariant: a forwarded call either returns the controller's answer or raises
    :class:`FjordError` with a retriable Kafka code (NOT_CONTROLLER when none is active or it
    does not answer, REQUEST_TIMED_OUT when it answered too late)."""

    def __init__(self, image: Callable[[], MetadataImage]) -> None:
        self._image = image
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def call(
        self, method: str, request: Any, timeout_ms: int = 0, caller: Caller | None = None
    ) -> Any:
        """``caller``: the Kafka client the request is forwarded for; the controller checks
        its ACLs (forwarding_metadata), not this service's."""
        active = self._image().controller
        if active is None:
            raise NoController("no active controller")
        address = active.registration.address
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address)
        stub = controller_pb2_grpc.ControllerStub(channel)
        timeout = ADMIN_FORWARD_TIMEOUT_S + max(timeout_ms, 0) / 1000
        try:
            metadata = forwarding_metadata(caller) if caller is not None else None
            return await getattr(stub, method)(request, timeout=timeout, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                raise FjordError(
                    f"controller {address} did not answer {method} in {timeout:g} s",
                    ErrorCode.REQUEST_TIMED_OUT,
                ) from exc
            raise NoController(
                f"controller {address} did not answer {method}: {exc.code().name}"
            ) from exc

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()


def _message(text: str) -> str | None:
    return text or None


class LeaderReplicas(Protocol):
    """What the partition-maintenance APIs need of a broker's replicas (its ReplicaManager)."""

    def delete_records(self, topic: str, partition: int, offset: int) -> int: ...

    def offset_for_leader_epoch(
        self, topic: str, partition: int, current_leader_epoch: int, leader_epoch: int
    ) -> tuple[int, int]: ...


class BrokerAdminHandlers:
    """Kafka admin and partition-maintenance APIs of one broker (see the module docstring)."""

    def __init__(
        self,
        broker_id: int,
        replicas: LeaderReplicas | None,
        image: Callable[[], MetadataImage],
        broker_config: Mapping[str, str],
        forwarder: ControllerForwarder,
        access: AccessControl = NO_AUTHORIZATION,
    ) -> None:
        #: ACL checks of what is answered here (DescribeConfigs, DeleteRecords,
        #: OffsetForLeaderEpoch); forwarded requests are checked by the controller for the
        #: client (ControllerForwarder.call's caller).
        self._access = access
        self._broker_id = broker_id
        self._replicas = replicas
        self._image = image
        self._broker_config = dict(broker_config)
        self._forwarder = forwarder

    def cluster_apis(self) -> list[Api]:
        """The admin APIs any node serves (brokers and coordinators alike: clients send them to
        the controller_id of Metadata or to the least loaded node), with their tested
        versions."""
        return [
            Api(19, 2, 7, CreateTopicsRequest, self.create_topics),
            Api(20, 1, 5, DeleteTopicsRequest, self.delete_topics),
            Api(32, 1, 4, DescribeConfigsRequest, self.describe_configs),
            Api(33, 0, 2, AlterConfigsRequest, self.alter_configs),
            Api(37, 0, 3, CreatePartitionsRequest, self.create_partitions),
            Api(44, 0, 1, IncrementalAlterConfigsRequest, self.incremental_alter_configs),
            Api(60, 0, 1, DescribeClusterRequest, self.describe_cluster),
            Api(29, *ACL_VERSIONS, DescribeAclsRequest, self.describe_acls),
            Api(30, *ACL_VERSIONS, CreateAclsRequest, self.create_acls),
            Api(31, *ACL_VERSIONS, DeleteAclsRequest, self.delete_acls),
            Api(50, 0, 0, DescribeUserScramCredentialsRequest,
                self.describe_user_scram_credentials),
            Api(51, 0, 0, AlterUserScramCredentialsRequest, self.alter_user_scram_credentials),
        ]

    def _leader_replicas(self) -> LeaderReplicas:
        """Partition APIs are registered on brokers only (a coordinator leads nothing)."""
        assert self._replicas is not None
        return self._replicas

    # --- forwarded to the controller --------------------------------------------------------

    async def create_acls(self, request: Any, ctx: RequestContext) -> Any:
        """CreateAcls, forwarded for the client (the controller checks Alter on the cluster)."""
        cls = CreateAclsResponse[ctx.api_version]
        pb = controller_pb2.CreateAclsRequest(creations=[
            controller_pb2.AclBinding(
                resource_type=c.resource_type, resource_name=c.resource_name,
                pattern_type=c.resource_pattern_type, principal=c.principal, host=c.host,
                operation=c.operation, permission_type=c.permission_type,
            )
            for c in request.creations
        ])
        try:
            answer = await self._forwarder.call("CreateAcls", pb, caller=ctx.caller)
            errors = [(r.error.code, r.error.message) for r in answer.results]
        except FjordError as exc:
            errors = [(exc.code.code, str(exc))] * len(request.creations)
        return cls(throttle_time_ms=0, results=[
            cls.AclCreationResult(error_code=code, error_message=_message(message))
            for code, message in errors
        ])

    async def describe_user_scram_credentials(self, request: Any, ctx: RequestContext) -> Any:
        """DescribeUserScramCredentials, forwarded for the client (Describe on the cluster):
        mechanisms and iterations, never salt or keys."""
        cls = DescribeUserScramCredentialsResponse[ctx.api_version]
        pb = controller_pb2.DescribeUserScramCredentialsRequest(
            users=[u.name for u in request.users or ()]
        )
        try:
            answer = await self._forwarder.call(
                "DescribeUserScramCredentials", pb, caller=ctx.caller
            )
            code, message, results = answer.error.code, answer.error.message, answer.results
        except FjordError as exc:
            code, message, results = exc.code.code, str(exc), []
        result_cls = cls.DescribeUserScramCredentialsResult
        return cls(
            throttle_time_ms=0, error_code=code, error_message=_message(message),
            results=[
                result_cls(
                    user=r.user, error_code=r.error.code, error_message=_message(r.error.message),
                    credential_infos=[
                        result_cls.CredentialInfo(mechanism=c.mechanism, iterations=c.iterations)
                        for c in r.credentials
                    ],
                )
                for r in results
            ],
        )

    async def alter_user_scram_credentials(self, request: Any, ctx: RequestContext) -> Any:
        """AlterUserScramCredentials, forwarded for the client (Alter on the cluster). The
        client sends salt and SaltedPassword; StoredKey and ServerKey are derived here, so
        the controller only ever sees what it stores. An upsertion whose keys cannot be
        derived (unknown mechanism, empty salted password) goes on without keys and the
        controller refuses it with Kafka's error for that user."""
        cls = AlterUserScramCredentialsResponse[ctx.api_version]
        pb = controller_pb2.AlterUserScramCredentialsRequest()
        for d in request.deletions:
            pb.deletions.add(user=d.name, mechanism=d.mechanism)
        for u in request.upsertions:
            item = pb.upsertions.add(user=u.name, mechanism=u.mechanism,
                                     iterations=u.iterations, salt=bytes(u.salt))
            mechanism = MECHANISM_BY_TYPE.get(u.mechanism)
            if mechanism is None:
                continue
            try:
                credential = ScramCredential.from_salted_password(
                    mechanism, bytes(u.salt), bytes(u.salted_password), u.iterations
                )
            except ScramCredentialError:
                continue
            item.stored_key, item.server_key = credential.stored_key, credential.server_key
        users = sorted({d.name for d in request.deletions} | {u.name for u in request.upsertions})
        try:
            answer = await self._forwarder.call("AlterUserScramCredentials", pb, caller=ctx.caller)
            errors = {r.user: (r.error.code, r.error.message) for r in answer.results}
        except FjordError as exc:
            errors = {user: (exc.code.code, str(exc)) for user in users}
        result_cls = cls.AlterUserScramCredentialsResult
        return cls(throttle_time_ms=0, results=[
            result_cls(user=user, error_code=errors.get(user, (0, ""))[0],
                       error_message=_message(errors.get(user, (0, ""))[1]))
            for user in users
        ])

    async def describe_acls(self, request: Any, ctx: RequestContext) -> Any:
        """DescribeAcls, forwarded for the client (Describe on the cluster); the answer groups
        the ACLs by resource pattern, as Kafka's."""
        cls = DescribeAclsResponse[ctx.api_version]
        selector = controller_pb2.AclBindingFilter(
            resource_type=request.resource_type_filter,
            pattern_type=request.pattern_type_filter,
            operation=request.operation, permission_type=request.permission_type,
        )
        for field, value in (("resource_name", request.resource_name_filter),
                             ("principal", request.principal_filter),
                             ("host", request.host_filter)):
            if value is not None:
                setattr(selector, field, value)
        try:
            answer = await self._forwarder.call(
                "DescribeAcls", controller_pb2.DescribeAclsRequest(filter=selector),
                caller=ctx.caller,
            )
            code, message = answer.error.code, answer.error.message
        except FjordError as exc:
            answer, code, message = None, exc.code.code, str(exc)
        resources: dict[tuple[int, str, int], list[Any]] = {}
        resource_cls = cls.DescribeAclsResource
        for b in answer.bindings if answer is not None else ():
            resources.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(
                resource_cls.AclDescription(principal=b.principal, host=b.host,
                                            operation=b.operation,
                                            permission_type=b.permission_type)
            )
        return cls(
            throttle_time_ms=0, error_code=code, error_message=_message(message),
            resources=[
                resource_cls(resource_type=kind, resource_name=name, pattern_type=pattern,
                             acls=acls)
                for (kind, name, pattern), acls in resources.items()
            ],
        )

    async def delete_acls(self, request: Any, ctx: RequestContext) -> Any:
        """DeleteAcls, forwarded for the client (Alter on the cluster)."""
        cls = DeleteAclsResponse[ctx.api_version]
        result_cls = cls.DeleteAclsFilterResult
        filters = []
        for f in request.filters:
            selector = controller_pb2.AclBindingFilter(
                resource_type=f.resource_type_filter, pattern_type=f.pattern_type_filter,
                operation=f.operation, permission_type=f.permission_type,
            )
            for field, value in (("resource_name", f.resource_name_filter),
                                 ("principal", f.principal_filter), ("host", f.host_filter)):
                if value is not None:
                    setattr(selector, field, value)
            filters.append(selector)
        try:
            answer = await self._forwarder.call(
                "DeleteAcls", controller_pb2.DeleteAclsRequest(filters=filters), caller=ctx.caller
            )
            results = [
                result_cls(
                    error_code=r.error.code, error_message=_message(r.error.message),
                    matching_acls=[
                        result_cls.DeleteAclsMatchingAcl(
                            error_code=0, error_message=None, resource_type=b.resource_type,
                            resource_name=b.resource_name, pattern_type=b.pattern_type,
                            principal=b.principal, host=b.host, operation=b.operation,
                            permission_type=b.permission_type,
                        )
                        for b in r.deleted
                    ],
                )
                for r in answer.results
            ]
        except FjordError as exc:
            results = [result_cls(error_code=exc.code.code, error_message=str(exc),
                                  matching_acls=[]) for _ in request.filters]
        return cls(throttle_time_ms=0, filter_results=results)

    async def create_topics(self, request: Any, ctx: RequestContext) -> Any:
        cls = CreateTopicsResponse[ctx.api_version]
        result_cls = cls.CreatableTopicResult
        pb = controller_pb2.CreateTopicsRequest(
            timeout_ms=request.timeout_ms, validate_only=bool(request.validate_only)
        )
        refused: dict[int, Any] = {}
        for i, topic in enumerate(request.topics):
            nulls = sorted(c.name for c in topic.configs if c.value is None)
            if nulls:
                # Kafka's answer, rather than creating the topic without those keys.
                refused[i] = result_cls(
                    name=topic.name, error_code=ErrorCode.INVALID_CONFIG.code,
                    error_message=f"Null value not supported for topic configs: "
                                  f"{', '.join(nulls)}",
                    num_partitions=-1, replication_factor=-1, configs=None)
                continue
            out = pb.topics.add(
                name=topic.name,
                num_partitions=topic.num_partitions,
                replication_factor=topic.replication_factor,
            )
            for config in topic.configs:
                out.configs[config.name] = config.value
            for assignment in topic.assignments:
                out.assignments.add(
                    partition=assignment.partition_index, broker_ids=assignment.broker_ids
                )
        forwarded = [t for i, t in enumerate(request.topics) if i not in refused]
        results: list[Any] = []
        if forwarded:
            try:
                answer = await self._forwarder.call("CreateTopics", pb, request.timeout_ms,
                                                    ctx.caller)
                results = [
                    result_cls(
                        name=r.name,
                        topic_id=topic_uuid(r.topic_id),
                        error_code=r.error.code,
                        error_message=_message(r.error.message),
                        num_partitions=r.num_partitions if r.error.code == 0 else -1,
                        replication_factor=r.replication_factor if r.error.code == 0 else -1,
                        configs=None if r.error.code else self._created_configs(cls, r.name),
                    )
                    for r in answer.results
                ]
            except FjordError as exc:
                results = [
                    result_cls(name=t.name, error_code=exc.code.code, error_message=str(exc),
                               num_partitions=-1, replication_factor=-1, configs=None)
                    for t in forwarded
                ]
        answered = iter(results)
        return cls(throttle_time_ms=0, topics=[
            refused[i] if i in refused else next(answered)
            for i in range(len(request.topics))
        ])

    def _created_configs(self, cls: Any, name: str) -> list[Any] | None:
        """The new topic's effective configs (CreateTopics v5+), from the broker's image when it
        already has the topic, else the cluster defaults."""
        image = self._image()
        record = image.topic(name)
        entries = describe_topic_config(
            record.config if record is not None else {}, image.cluster_config
        )
        config_cls = cls.CreatableTopicResult.CreatableTopicConfigs
        return [
            config_cls(name=e.name, value=e.value, read_only=False,
                       config_source=CONFIG_SOURCE[e.source], is_sensitive=False)
            for e in entries
        ]

    async def delete_topics(self, request: Any, ctx: RequestContext) -> Any:
        cls = DeleteTopicsResponse[ctx.api_version]
        names = list(request.topic_names)
        pb = controller_pb2.DeleteTopicsRequest(names=names, timeout_ms=request.timeout_ms)
        try:
            answer = await self._forwarder.call("DeleteTopics", pb, request.timeout_ms, ctx.caller)
            pairs = [(r.name, r.error.code, r.error.message) for r in answer.results]
        except FjordError as exc:
            pairs = [(n, exc.code.code, str(exc)) for n in names]
        return cls(
            throttle_time_ms=0,
            responses=[
                cls.DeletableTopicResult(name=n, error_code=c, error_message=_message(m))
                for n, c, m in pairs
            ],
        )

    async def create_partitions(self, request: Any, ctx: RequestContext) -> Any:
        cls = CreatePartitionsResponse[ctx.api_version]
        pb = controller_pb2.CreatePartitionsRequest(
            timeout_ms=request.timeout_ms, validate_only=bool(request.validate_only)
        )
        image = self._image()
        for topic in request.topics:
            out = pb.topics.add(name=topic.name, count=topic.count)
            existing = len(image.partitions(topic.name))
            for i, assignment in enumerate(topic.assignments or []):
                out.assignments.add(partition=existing + i, broker_ids=assignment.broker_ids)
        try:
            answer = await self._forwarder.call(
                "CreatePartitions", pb, request.timeout_ms, ctx.caller
            )
            pairs = [(r.name, r.error.code, r.error.message) for r in answer.results]
        except FjordError as exc:
            pairs = [(t.name, exc.code.code, str(exc)) for t in request.topics]
        return cls(
            throttle_time_ms=0,
            results=[
                cls.CreatePartitionsTopicResult(name=n, error_code=c, error_message=_message(m))
                for n, c, m in pairs
            ],
        )

    async def alter_configs(self, request: Any, ctx: RequestContext) -> Any:
        """Kafka's (non-incremental) AlterConfigs: the given set replaces the topic's whole
        override set, so every current override not named is reset."""
        image = self._image()
        changes = []
        for resource in request.resources:
            record = image.topic(resource.resource_name)
            new = {c.name: c.value for c in resource.configs if c.value is not None}
            current = record.config if record is not None else {}
            changes.append((resource, new, [k for k in current if k not in new]))
        return await self._alter(AlterConfigsResponse[ctx.api_version], changes,
                                 bool(request.validate_only), ctx.caller, replace_all=True)

    async def incremental_alter_configs(self, request: Any, ctx: RequestContext) -> Any:
        """SET and DELETE per key; APPEND/SUBTRACT (list-valued keys) are refused with
        INVALID_CONFIG: Fjord's topic configs have no list values that need them."""
        cls = IncrementalAlterConfigsResponse[ctx.api_version]
        changes = []
        refused: dict[int, str] = {}
        for i, resource in enumerate(request.resources):
            new: dict[str, str] = {}
            delete: list[str] = []
            for c in resource.configs:
                if c.config_operation == OP_SET and c.value is None:
                    refused[i] = (f"{c.name}: Null value not supported for SET (DELETE resets "
                                  "a key)")
                elif c.config_operation == OP_SET:
                    new[c.name] = c.value
                elif c.config_operation == OP_DELETE:
                    delete.append(c.name)
                else:
                    refused[i] = (
                        f"{c.name}: operation {c.config_operation} is not supported "
                        "(SET and DELETE are)"
                    )
            changes.append((resource, new, delete))
        return await self._alter(cls, changes, bool(request.validate_only), ctx.caller, refused)

    async def _alter(
        self,
        cls: Any,
        changes: list[tuple[Any, dict[str, str], list[str]]],
        validate_only: bool,
        caller: Caller,
        refused: Mapping[int, str] | None = None,
        *,
        replace_all: bool = False,
    ) -> Any:
        """Topic and BROKER resources forwarded to the controller in one AlterConfigs; a
        BROKER resource named "" is the cluster-wide default (Kafka's --entity-default);
        ``replace_all`` (Kafka's non-incremental AlterConfigs): a broker entity's dynamic keys
        not given are deleted."""
        refused = dict(refused or {})
        outcome: dict[int, tuple[int, str]] = {}
        pb = controller_pb2.AlterConfigsRequest(validate_only=validate_only)
        topics: list[int] = []
        brokers: list[int] = []
        for i, (resource, new, delete) in enumerate(changes):
            if i in refused:
                outcome[i] = (ErrorCode.INVALID_CONFIG.code, refused[i])
            elif resource.resource_type == TOPIC_RESOURCE:
                pb.topics.add(name=resource.resource_name, set=new, delete=delete)
                topics.append(i)
            elif resource.resource_type == BROKER_RESOURCE and (
                resource.resource_name == "" or resource.resource_name.isdigit()
            ):
                default = resource.resource_name == ""
                pb.brokers.add(broker_id=0 if default else int(resource.resource_name),
                               default=default, set=new, delete=delete,
                               replace_all=replace_all)
                brokers.append(i)
            else:
                outcome[i] = (
                    ErrorCode.INVALID_REQUEST.code,
                    f"resource type {resource.resource_type} {resource.resource_name!r}: Fjord "
                    "alters topic configs and broker configs (a broker id, or '' for the "
                    "cluster-wide default)",
                )
        if topics or brokers:
            try:
                answer = await self._forwarder.call("AlterConfigs", pb, caller=caller)
                for i, result in zip(topics, answer.results, strict=True):
                    outcome[i] = (result.error.code, result.error.message)
                for i, broker_result in zip(brokers, answer.broker_results, strict=True):
                    outcome[i] = (broker_result.error.code, broker_result.error.message)
            except FjordError as exc:
                for i in topics + brokers:
                    outcome[i] = (exc.code.code, str(exc))
        response_cls = cls.AlterConfigsResourceResponse
        return cls(
            throttle_time_ms=0,
            responses=[
                response_cls(
                    error_code=outcome[i][0],
                    error_message=_message(outcome[i][1]),
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                )
                for i, (resource, _, _) in enumerate(changes)
            ],
        )

    # --- answered by this broker -------------------------------------------------------------

    async def describe_configs(self, request: Any, ctx: RequestContext) -> Any:
        cls = DescribeConfigsResponse[ctx.api_version]
        result_cls = cls.DescribeConfigsResult
        entry_cls = result_cls.DescribeConfigsResourceResult
        image = self._image()
        results = []
        for resource in request.resources:
            error, message = 0, ""
            entries: list[tuple[str, str, str]] = []
            target = (
                Resource.topic(resource.resource_name)
                if resource.resource_type == TOPIC_RESOURCE else Resource.cluster()
            )
            if not self._access.allows(image, ctx.caller, AclOperation.DESCRIBE_CONFIGS, target):
                denied = denial_error(AclOperation.DESCRIBE_CONFIGS, target, ctx.caller)
                error, message = denied.code.code, str(denied)
            elif resource.resource_type == TOPIC_RESOURCE:
                record = image.topic(resource.resource_name)
                if record is None:
                    error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.code
                    message = f"topic {resource.resource_name!r} does not exist"
                else:
                    entries = [
                        (e.name, e.value, e.source)
                        for e in describe_topic_config(record.config, image.cluster_config)
                    ]
            elif resource.resource_type == BROKER_RESOURCE and resource.resource_name == "":
                entries = [(e.name, e.value, e.source)
                           for e in describe_default_broker_config(image.cluster_config)]
            elif resource.resource_type == BROKER_RESOURCE and (
                resource.resource_name == str(self._broker_id)
            ):
                entries = [
                    (e.name, e.value, e.source)
                    for e in describe_broker_config(self._broker_config, image.cluster_config,
                                                    image.broker_config(self._broker_id))
                ]
            else:
                error = ErrorCode.INVALID_REQUEST.code
                message = (
                    f"resource type {resource.resource_type} {resource.resource_name!r}: "
                    "Fjord describes topic configs and this broker's own configs"
                )
            wanted = resource.configuration_keys
            if wanted is not None:
                entries = [e for e in entries if e[0] in set(wanted)]
            results.append(
                result_cls(
                    error_code=error,
                    error_message=_message(message),
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=[
                        entry_cls(
                            name=name,
                            value=value,
                            read_only=(resource.resource_type == BROKER_RESOURCE
                                       and broker_key(name) in READ_ONLY_BROKER_KEYS),
                            config_source=CONFIG_SOURCE[source],
                            is_sensitive=False,
                            synonyms=[],
                            config_type=0,
                            documentation=None,
                        )
                        for name, value, source in entries
                    ],
                )
            )
        return cls(throttle_time_ms=0, results=results)

    async def describe_cluster(self, request: Any, ctx: RequestContext) -> Any:
        cls = DescribeClusterResponse[ctx.api_version]
        image = self._image()
        if ctx.api_version >= 1 and request.endpoint_type != 1:
            # Endpoint type 2 asks for controllers: Fjord's speak gRPC only.
            return cls(
                throttle_time_ms=0,
                error_code=ErrorCode.UNSUPPORTED_ENDPOINT_TYPE.code,
                error_message="Fjord's controllers have no Kafka listener",
                endpoint_type=request.endpoint_type,
                cluster_id=image.cluster_id,
                controller_id=-1,
                brokers=[],
            )
        nodes = kafka_nodes(image, ctx.listener)
        ids = kafka_broker_ids(image, ctx.listener)
        return cls(
            throttle_time_ms=0,
            error_code=0,
            error_message=None,
            endpoint_type=1,
            cluster_id=image.cluster_id,
            controller_id=(
                self._broker_id if self._broker_id in ids
                else lowest_kafka_broker(image, ctx.listener)
            ),
            brokers=[
                cls.DescribeClusterBroker(broker_id=node, host=host, port=port, rack=rack)
                for node, host, port, rack in nodes
            ],
        )

    async def delete_records(self, request: Any, ctx: RequestContext) -> Any:
        cls = DeleteRecordsResponse[ctx.api_version]
        topic_cls = cls.DeleteRecordsTopicResult
        part_cls = topic_cls.DeleteRecordsPartitionResult
        topics = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                try:
                    self._access.require(self._image(), ctx.caller, AclOperation.DELETE,
                                         Resource.topic(topic.name))
                    low = self._leader_replicas().delete_records(
                        topic.name, p.partition_index, p.offset
                    )
                    parts.append(part_cls(partition_index=p.partition_index,
                                          low_watermark=low, error_code=0))
                except FjordError as exc:
                    parts.append(part_cls(partition_index=p.partition_index,
                                          low_watermark=-1, error_code=exc.code.code))
            topics.append(topic_cls(name=topic.name, partitions=parts))
        return cls(throttle_time_ms=0, topics=topics)

    async def offset_for_leader_epoch(self, request: Any, ctx: RequestContext) -> Any:
        cls = OffsetForLeaderEpochResponse[ctx.api_version]
        topic_cls = cls.OffsetForLeaderTopicResult
        part_cls = topic_cls.EpochEndOffset
        topics = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                try:
                    self._access.require(self._image(), ctx.caller, AclOperation.DESCRIBE,
                                         Resource.topic(topic.topic))
                    epoch, end = self._leader_replicas().offset_for_leader_epoch(
                        topic.topic, p.partition, p.current_leader_epoch, p.leader_epoch
                    )
                    parts.append(part_cls(error_code=0, partition=p.partition,
                                          leader_epoch=epoch, end_offset=end))
                except FjordError as exc:
                    parts.append(part_cls(error_code=exc.code.code, partition=p.partition,
                                          leader_epoch=-1, end_offset=-1))
            topics.append(topic_cls(topic=topic.topic, partitions=parts))
        return cls(throttle_time_ms=0, topics=topics)
