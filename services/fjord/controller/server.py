"""The controller's gRPC servicer (proto/fjord/v1/controller.proto): it only translates between
protobuf and :class:`~fjord.controller.service.ControllerService`. Errors travel in each
result's ``Error`` (Kafka codes), never as gRPC status codes."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc

from fjord._proto import broker_pb2, common_pb2, controller_pb2, controller_pb2_grpc
from fjord.cluster.acl_wire import binding_from_pb, binding_to_pb, filter_from_pb
from fjord.cluster.topic_config import describe_topic_config
from fjord.controller.defaults import (
    AUTO_LEADER_REBALANCE_ENABLE,
    LEADER_IMBALANCE_CHECK_INTERVAL_S,
    SHUTDOWN_GRACE_S,
)
from fjord.controller.planner import PartitionOutcome, ReassignmentRequest, TopicSpec
from fjord.controller.service import ControllerService
from fjord.errors import (
    ClusterAuthorizationError,
    ErrorCode,
    FjordError,
    InvalidReplicaAssignmentError,
    NotControllerError,
    UnknownTopicOrPartitionError,
)
from fjord.metadata import etcd_client
from fjord.metadata.view import broker_info
from fjord.sasl_door import bind_sasl_port, sasl_door_server
from fjord.security import ServiceSecurity
from fjord.security.acls import (
    NO_AUTHORIZATION,
    AccessControl,
    AclOperation,
    AuthorizerSettings,
    Caller,
    Resource,
)
from fjord.security.sasl_sessions import SessionLifetime
from fjord.security.scram import SCRAM_MECHANISMS, ScramDeletion, ScramUpsertion
from fjord.serving import access_control, grpc_caller_or_forwarded
from fjord.tls import ClusterActionGuard, bind_port, use_service_security
from fjord.topic_partition import TopicPartition

log = logging.getLogger(__name__)

_NONE = common_pb2.Error(code=0)


def error_pb(exc: BaseException | None) -> common_pb2.Error:
    """The wire form of an error; unexpected exceptions become UNKNOWN_SERVER_ERROR."""
    if exc is None:
        return _NONE
    if isinstance(exc, FjordError):
        return common_pb2.Error(code=exc.code.code, message=str(exc))
    log.exception("unexpected controller error", exc_info=exc)
    return common_pb2.Error(
        code=ErrorCode.UNKNOWN_SERVER_ERROR.code, message=f"{type(exc).__name__}: {exc}"
    )


def _assignments(items: Iterable[controller_pb2.ReplicaAssignment]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for item in items:
        if item.partition in out:
            raise InvalidReplicaAssignmentError(f"partition {item.partition} assigned twice")
        out[item.partition] = list(item.broker_ids)
    return out


async def _topic_result(
    name: str, action: Callable[..., Awaitable[object]], *args: Any
) -> controller_pb2.TopicResult:
    """Run one topic's part of a request, ``action(*args)``; its exception becomes the result's
    typed error, so one bad topic never fails the others."""
    error: Exception | None = None
    try:
        await action(*args)
    except Exception as exc:
        error = exc
    return controller_pb2.TopicResult(name=name, error=error_pb(error))


def _refused(what: str) -> ClusterAuthorizationError:
    return ClusterAuthorizationError(
        f"{what} refused: the caller lacks the cluster service identity"
    )


class ControllerServicer(controller_pb2_grpc.ControllerServicer):
    """Answers every RPC from the active controller; a standby answers NOT_CONTROLLER."""

    def __init__(
        self,
        service: ControllerService,
        cluster_action: ClusterActionGuard | None = None,
        access: AccessControl = NO_AUTHORIZATION,
    ) -> None:
        self.service = service
        #: Kafka's ACL checks of the admin RPCs, for the caller or the Kafka client a service
        #: forwarded the request for (grpc_caller_or_forwarded), over the controller's image.
        self._access = access
        #: AlterPartition and AllocateProducerIds come from brokers only: with an enforced
        #: guard they need the cluster service identity.
        self._cluster_action = cluster_action or ClusterActionGuard(enforced=False)

    def _require(self, caller: Caller, operation: AclOperation, resource: Resource) -> None:
        """Raise the typed denial (TOPIC_/CLUSTER_AUTHORIZATION_FAILED) unless allowed."""
        self._access.require(self.service.image, caller, operation, resource)

    def _require_cluster(
        self, context: grpc.aio.ServicerContext, operation: AclOperation
    ) -> None:
        self._require(grpc_caller_or_forwarded(context), operation, Resource.cluster())

    def _may_create(self, caller: Caller, topic: str) -> None:
        """Kafka's CreateTopics rule: Create on the cluster, else Create on the topic."""
        image = self.service.image
        if self._access.allows(image, caller, AclOperation.CREATE, Resource.cluster(),
                               count=False):
            return
        self._require(caller, AclOperation.CREATE, Resource.topic(topic))

    def _topic_action(
        self, caller: Caller, operation: AclOperation, topic: str,
        action: Callable[..., Awaitable[object]],
    ) -> Callable[..., Awaitable[object]]:
        """``action`` preceded by the ACL check of ``operation`` on ``topic``."""

        async def checked(*args: Any) -> object:
            self._require(caller, operation, Resource.topic(topic))
            return await action(*args)

        return checked

    async def CreateTopics(
        self, request: controller_pb2.CreateTopicsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.CreateTopicsResponse:
        caller = grpc_caller_or_forwarded(context)
        results = []
        for topic in request.topics:
            result = controller_pb2.CreateTopicResult(name=topic.name)
            try:
                self._may_create(caller, topic.name)
                spec = TopicSpec(
                    topic.name,
                    topic.num_partitions,
                    topic.replication_factor,
                    dict(topic.configs),
                    _assignments(topic.assignments),
                )
                record = await self.service.create_topic(spec, request.validate_only)
                result.topic_id = record.topic_id
                result.num_partitions = record.partitions
                result.replication_factor = record.replication_factor
            except Exception as exc:
                result.error.CopyFrom(error_pb(exc))
            results.append(result)
        return controller_pb2.CreateTopicsResponse(results=results)

    async def DeleteTopics(
        self, request: controller_pb2.DeleteTopicsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.DeleteTopicsResponse:
        caller = grpc_caller_or_forwarded(context)
        results = [
            await _topic_result(name, self._topic_action(
                caller, AclOperation.DELETE, name, self.service.delete_topic), name)
            for name in request.names
        ]
        return controller_pb2.DeleteTopicsResponse(results=results)

    async def CreatePartitions(
        self, request: controller_pb2.CreatePartitionsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.CreatePartitionsResponse:
        caller = grpc_caller_or_forwarded(context)
        results = [
            await _topic_result(
                topic.name,
                self._topic_action(caller, AclOperation.ALTER, topic.name,
                                   self._create_partitions),
                topic, request.validate_only,
            )
            for topic in request.topics
        ]
        return controller_pb2.CreatePartitionsResponse(results=results)

    async def _create_partitions(
        self, topic: controller_pb2.PartitionCount, validate_only: bool
    ) -> None:
        await self.service.create_partitions(
            topic.name, topic.count, _assignments(topic.assignments), validate_only
        )

    async def AlterConfigs(
        self, request: controller_pb2.AlterConfigsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.AlterConfigsResponse:
        caller = grpc_caller_or_forwarded(context)
        results = [
            await _topic_result(
                topic.name,
                self._topic_action(caller, AclOperation.ALTER_CONFIGS, topic.name,
                                   self.service.alter_configs),
                topic.name, dict(topic.set), list(topic.delete), request.validate_only,
            )
            for topic in request.topics
        ]
        broker_results = []
        for entry in request.brokers:
            result = controller_pb2.BrokerConfigResult(broker_id=entry.broker_id,
                                                       default=entry.default)
            try:
                self._require(caller, AclOperation.ALTER_CONFIGS, Resource.cluster())
                await self.service.alter_broker_configs(
                    None if entry.default else entry.broker_id, dict(entry.set),
                    list(entry.delete), request.validate_only, replace_all=entry.replace_all,
                )
            except Exception as exc:
                result.error.CopyFrom(error_pb(exc))
            broker_results.append(result)
        return controller_pb2.AlterConfigsResponse(results=results,
                                                   broker_results=broker_results)

    async def DescribeConfigs(
        self, request: controller_pb2.DescribeConfigsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.DescribeConfigsResponse:
        caller = grpc_caller_or_forwarded(context)
        results = []
        for name in request.topics:
            out = controller_pb2.TopicConfigs(name=name)
            try:
                self.service.require_active()
                self._require(caller, AclOperation.DESCRIBE_CONFIGS, Resource.topic(name))
                image = self.service.image
                record = image.topic(name)
                if record is None:
                    raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
                for entry in describe_topic_config(record.config, image.cluster_config):
                    out.entries.append(
                        common_pb2.ConfigEntry(
                            name=entry.name,
                            value=entry.value,
                            is_default=entry.is_default,
                            source=entry.source,
                        )
                    )
            except Exception as exc:
                out.error.CopyFrom(error_pb(exc))
            results.append(out)
        return controller_pb2.DescribeConfigsResponse(results=results)

    async def DescribeCluster(
        self, request: controller_pb2.DescribeClusterRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.DescribeClusterResponse:
        image = self.service.image
        response = controller_pb2.DescribeClusterResponse(cluster_id=self.service.cluster_id)
        active = image.controller
        if active is not None:
            reg = active.registration
            response.controller.CopyFrom(
                common_pb2.ControllerInfo(id=reg.id, host=reg.host, port=reg.port,
                                          epoch=active.epoch)
            )
        for broker_id, broker in sorted(image.brokers.items()):
            response.brokers.append(broker_info(broker_id, broker))
        for cid, reg in sorted(image.controllers.items()):
            epoch = active.epoch if active is not None and active.registration.id == cid else 0
            response.controllers.append(
                common_pb2.ControllerInfo(id=cid, host=reg.host, port=reg.port, epoch=epoch)
            )
        for coordinator_id, coordinator in sorted(image.coordinators.items()):
            response.coordinators.append(
                broker_pb2.CoordinatorInfo(
                    id=coordinator_id, host=coordinator.host, port=coordinator.port
                )
            )
        if not self.service.is_active():
            # The rest of the answer is still useful: it tells the caller who is active.
            response.error.CopyFrom(
                error_pb(NotControllerError(f"controller {self.service.registration.id} "
                                            "is not active"))
            )
        return response

    async def AlterPartition(
        self, request: controller_pb2.AlterPartitionRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.AlterPartitionResponse:
        response = controller_pb2.AlterPartitionResponse()
        if not self._cluster_action.allows(context, "AlterPartition"):
            response.error.CopyFrom(error_pb(_refused("AlterPartition")))
            return response
        try:
            self._require_cluster(context, AclOperation.CLUSTER_ACTION)
            items = [
                (p.topic, p.partition, p.leader_epoch, p.partition_epoch, list(p.new_isr),
                 p.resign)
                for p in request.partitions
            ]
            results = await self.service.alter_partition(
                request.broker_id, request.broker_epoch, items
            )
        except Exception as exc:
            response.error.CopyFrom(error_pb(exc))
            return response
        for r in results:
            out = controller_pb2.AlterPartitionResult(
                topic=r.topic, partition=r.partition, error=error_pb(r.error)
            )
            if r.state is not None:
                out.leader = r.state.leader
                out.leader_epoch = r.state.leader_epoch
                out.partition_epoch = r.state.partition_epoch
                out.isr.extend(r.state.isr)
            response.partitions.append(out)
        return response

    async def AllocateProducerIds(
        self, request: controller_pb2.AllocateProducerIdsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.AllocateProducerIdsResponse:
        response = controller_pb2.AllocateProducerIdsResponse()
        if not self._cluster_action.allows(context, "AllocateProducerIds"):
            response.error.CopyFrom(error_pb(_refused("AllocateProducerIds")))
            return response
        try:
            self._require_cluster(context, AclOperation.CLUSTER_ACTION)
            first, count = await self.service.allocate_producer_ids(
                request.broker_id, request.broker_epoch
            )
            response.first_producer_id = first
            response.count = count
        except Exception as exc:
            response.error.CopyFrom(error_pb(exc))
        return response

    async def AlterPartitionReassignments(
        self,
        request: controller_pb2.AlterPartitionReassignmentsRequest,
        context: grpc.aio.ServicerContext,
    ) -> controller_pb2.AlterPartitionReassignmentsResponse:
        response = controller_pb2.AlterPartitionReassignmentsResponse()
        try:
            self._require_cluster(context, AclOperation.ALTER)
            outcomes = await self.service.alter_partition_reassignments(
                [
                    ReassignmentRequest(
                        p.topic, p.partition, None if p.cancel else tuple(p.replicas)
                    )
                    for p in request.partitions
                ]
            )
        except Exception as exc:
            response.error.CopyFrom(error_pb(exc))
            return response
        response.results.extend(_partition_errors(outcomes))
        return response

    async def ListPartitionReassignments(
        self,
        request: controller_pb2.ListPartitionReassignmentsRequest,
        context: grpc.aio.ServicerContext,
    ) -> controller_pb2.ListPartitionReassignmentsResponse:
        response = controller_pb2.ListPartitionReassignmentsResponse()
        wanted = [TopicPartition(p.topic, p.partition) for p in request.partitions] or None
        try:
            self._require_cluster(context, AclOperation.DESCRIBE)
            ongoing = self.service.list_partition_reassignments(wanted)
        except Exception as exc:
            response.error.CopyFrom(error_pb(exc))
            return response
        for r in ongoing:
            response.reassignments.append(
                controller_pb2.OngoingPartitionReassignment(
                    topic=r.topic,
                    partition=r.partition,
                    replicas=list(r.replicas),
                    adding_replicas=list(r.adding_replicas),
                    removing_replicas=list(r.removing_replicas),
                )
            )
        return response

    async def ElectLeaders(
        self, request: controller_pb2.ElectLeadersRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.ElectLeadersResponse:
        response = controller_pb2.ElectLeadersResponse()
        wanted = [TopicPartition(p.topic, p.partition) for p in request.partitions] or None
        try:
            self._require_cluster(context, AclOperation.ALTER)
            outcomes = await self.service.elect_leaders(request.election_type, wanted)
        except Exception as exc:
            response.error.CopyFrom(error_pb(exc))
            return response
        response.results.extend(_partition_errors(outcomes))
        return response

    # --- ACLs -----------------------------------------------------------------------------

    async def CreateAcls(
        self, request: controller_pb2.CreateAclsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.CreateAclsResponse:
        """Each creation is checked on its own (a bad one gets its INVALID_REQUEST and is not
        written); the valid ones are written together."""
        try:
            self._require_cluster(context, AclOperation.ALTER)
        except FjordError as exc:
            return controller_pb2.CreateAclsResponse(results=[
                controller_pb2.AclCreationResult(error=error_pb(exc)) for _ in request.creations
            ])
        errors: list[BaseException | None] = []
        valid = []
        for creation in request.creations:
            try:
                valid.append(binding_from_pb(creation))
                errors.append(None)
            except FjordError as exc:
                errors.append(exc)
        if valid:
            try:
                await self.service.create_acls(valid)
            except Exception as exc:
                errors = [error or exc for error in errors]
        return controller_pb2.CreateAclsResponse(
            results=[controller_pb2.AclCreationResult(error=error_pb(e)) for e in errors]
        )

    async def DescribeAcls(
        self, request: controller_pb2.DescribeAclsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.DescribeAclsResponse:
        response = controller_pb2.DescribeAclsResponse()
        try:
            self._require_cluster(context, AclOperation.DESCRIBE)
            found = self.service.describe_acls(filter_from_pb(request.filter))
        except Exception as exc:
            response.error.CopyFrom(error_pb(exc))
            return response
        response.bindings.extend(binding_to_pb(b) for b in found)
        return response

    async def DeleteAcls(
        self, request: controller_pb2.DeleteAclsRequest, context: grpc.aio.ServicerContext
    ) -> controller_pb2.DeleteAclsResponse:
        """A filter that does not parse gets INVALID_REQUEST and deletes nothing; the others
        are applied together."""
        response = controller_pb2.DeleteAclsResponse()
        parsed: list[tuple[int, Any]] = []
        results = [controller_pb2.DeleteAclsFilterResult() for _ in request.filters]
        try:
            self._require_cluster(context, AclOperation.ALTER)
        except FjordError as exc:
            for result in results:
                result.error.CopyFrom(error_pb(exc))
            response.results.extend(results)
            return response
        for index, message in enumerate(request.filters):
            try:
                parsed.append((index, filter_from_pb(message)))
            except FjordError as exc:
                results[index].error.CopyFrom(error_pb(exc))
        if parsed:
            try:
                deleted = await self.service.delete_acls([f for _, f in parsed])
                for (index, _), bindings in zip(parsed, deleted, strict=True):
                    results[index].deleted.extend(binding_to_pb(b) for b in bindings)
            except Exception as exc:
                for index, _ in parsed:
                    results[index].error.CopyFrom(error_pb(exc))
        response.results.extend(results)
        return response


    # --- SCRAM credentials ----------------------------------------------------------------

    async def DescribeUserScramCredentials(
        self,
        request: controller_pb2.DescribeUserScramCredentialsRequest,
        context: grpc.aio.ServicerContext,
    ) -> controller_pb2.DescribeUserScramCredentialsResponse:
        """Kafka's DescribeUserScramCredentials: Describe on the cluster; mechanisms and
        iterations only (never salt or keys); a named user without credentials gets
        RESOURCE_NOT_FOUND, a user named twice DUPLICATE_RESOURCE."""
        response = controller_pb2.DescribeUserScramCredentialsResponse()
        try:
            self._require_cluster(context, AclOperation.DESCRIBE)
            users = self.service.describe_scram_credentials()
        except Exception as exc:
            response.error.CopyFrom(error_pb(exc))
            return response
        names = list(request.users) or sorted(users)
        for name in names:
            result = response.results.add(user=name)
            if names.count(name) > 1:
                result.error.CopyFrom(error_pb(FjordError(
                    f"user {name!r} named twice", ErrorCode.DUPLICATE_RESOURCE)))
            elif name not in users:
                result.error.CopyFrom(error_pb(FjordError(
                    f"user {name!r} has no SCRAM credentials", ErrorCode.RESOURCE_NOT_FOUND)))
            else:
                result.credentials.extend(
                    controller_pb2.ScramCredentialInfo(
                        mechanism=SCRAM_MECHANISMS[c.mechanism], iterations=c.iterations
                    )
                    for c in users[name].credentials
                )
        return response

    async def AlterUserScramCredentials(
        self,
        request: controller_pb2.AlterUserScramCredentialsRequest,
        context: grpc.aio.ServicerContext,
    ) -> controller_pb2.AlterUserScramCredentialsResponse:
        """Kafka's AlterUserScramCredentials: Alter on the cluster; each user's changes are
        applied or refused as a whole (fjord.security.scram.plan_alter_scram)."""
        deletions = [ScramDeletion(d.user, d.mechanism) for d in request.deletions]
        upsertions = [
            ScramUpsertion(u.user, u.mechanism, u.iterations, u.salt, u.stored_key, u.server_key)
            for u in request.upsertions
        ]
        users = sorted({d.user for d in deletions} | {u.user for u in upsertions})
        try:
            self._require_cluster(context, AclOperation.ALTER)
            errors: dict[str, BaseException | None] = dict(
                await self.service.alter_scram_credentials(deletions, upsertions)
            )
        except Exception as exc:
            errors = {user: exc for user in users}
        return controller_pb2.AlterUserScramCredentialsResponse(results=[
            controller_pb2.AlterUserScramCredentialsResult(user=user, error=error_pb(errors[user]))
            for user in users
        ])

def _partition_errors(
    outcomes: Iterable[PartitionOutcome],
) -> list[controller_pb2.PartitionError]:
    return [
        controller_pb2.PartitionError(
            topic=o.topic, partition=o.partition, error=error_pb(o.error)
        )
        for o in outcomes
    ]


async def run_controller(
    controller_id: int,
    listen: str,
    etcd_url: str,
    cluster_id: str,
    lease_ttl_s: int,
    advertised_host: str | None = None,
    metrics_port: int | None = None,
    stop: asyncio.Event | None = None,
    *,
    auto_leader_rebalance: bool = AUTO_LEADER_REBALANCE_ENABLE,
    leader_imbalance_check_interval_s: float = LEADER_IMBALANCE_CHECK_INTERVAL_S,
    static_config: Mapping[str, str] | None = None,
    security: ServiceSecurity | None = None,
    authorization: AuthorizerSettings | None = None,
    sasl_listen: str | None = None,
    sasl_lifetime: SessionLifetime | None = None,
) -> None:
    """Serve until ``stop`` is set or SIGTERM/SIGINT arrives; then revoke the lease and exit.
    ``sasl_listen``: HOST:PORT of a SASL gRPC door for Fjord's SASL clients (fjord.sasl_door),
    its sessions living ``sasl_lifetime`` (``connections.max.reauth.ms``; default one hour).
    ``static_config``: cluster defaults under etcd's cluster-config (``--config``);
    ``security``: TLS on the listener and towards etcd (None: plaintext); with required client
    authentication AlterPartition and AllocateProducerIds need the cluster service identity."""
    from fjord.observability import server_interceptors, start_metrics_server

    host = listen.rpartition(":")[0].strip("[]")
    # SO_REUSEPORT off: a port already in use must fail here, not be silently shared.
    server = grpc.aio.server(
        interceptors=server_interceptors("controller"), options=[("grpc.so_reuseport", 0)]
    )
    try:
        port = bind_port(server, listen, security)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {listen} (cannot bind: in use?)") from exc
    if metrics_port is not None:
        start_metrics_server(metrics_port)
    # A wildcard listen address is not something peers can dial: advertise loopback instead.
    wildcard = host in ("", "0.0.0.0", "::")
    public_host = advertised_host or ("127.0.0.1" if wildcard else host)
    if port == 0:
        raise OSError(f"cannot listen on {listen} (cannot bind: in use?)")
    use_service_security(security)
    client = etcd_client(etcd_url)
    sasl_server: grpc.aio.Server | None = None
    sasl_port = 0
    if sasl_listen is not None:
        sasl_server, _ = sasl_door_server(
            lambda mechanism, user: service.image.scram_credential(mechanism, user),
            f"controller {controller_id}",
            interceptors=server_interceptors("controller"),
            lifetime=sasl_lifetime,
            options=[("grpc.so_reuseport", 0)],
        )
        sasl_port = bind_sasl_port(sasl_server, sasl_listen, security)
        if not sasl_port:
            raise OSError(f"cannot listen on {sasl_listen} (--sasl-listen; in use?)")
    service = ControllerService(
        client, cluster_id, controller_id, public_host, port, lease_ttl_s,
        auto_leader_rebalance=auto_leader_rebalance,
        leader_imbalance_check_interval_s=leader_imbalance_check_interval_s,
        static_config=static_config,
        sasl_port=sasl_port,
    )
    servicer = ControllerServicer(
        service, ClusterActionGuard.for_service(security), access_control(authorization)
    )
    controller_pb2_grpc.add_ControllerServicer_to_server(servicer, server)
    if sasl_server is not None:
        controller_pb2_grpc.add_ControllerServicer_to_server(servicer, sasl_server)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread
            break
    await service.start()
    await server.start()
    if sasl_server is not None:
        await sasl_server.start()
    log.info("controller %d serving on %s:%d (cluster %s)", controller_id, public_host, port,
             cluster_id)
    try:
        await stop.wait()
    finally:
        if sasl_server is not None:
            await sasl_server.stop(SHUTDOWN_GRACE_S)
        await server.stop(SHUTDOWN_GRACE_S)
        await service.stop()
        await client.close()
