"""kopf handlers: observe Kubernetes and Fjord, call the pure decisions, apply the result.

:func:`register` binds every handler to a kopf registry with the given
:class:`~fjord_operator.settings.OperatorSettings` (intervals are decided at registration, so
tests can shorten them). Per object, one reconciliation runs at a time (a lock per uid): the
change handlers and the timers call the same idempotent functions.

The shells here only translate: :class:`FjordAdmin` runs the synchronous
:class:`fjord.client.AdminClient` in worker threads (the kopf event loop never blocks);
:class:`KubeApi` creates or merge-patches objects through lightkube. The plan of each
reconciliation comes from :func:`plan_cluster` / :func:`plan_topic`, which are pure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast

import aiohttp
import kopf

from fjord.cluster.rolling_restart import PartitionIsr, RollAction, RollStep
from fjord.errors import (
    ErrorCode,
    FjordError,
    KafkaTimeoutError,
    ReassignmentInProgressError,
    UnknownTopicOrPartitionError,
)
from fjord.security.acls import AclBinding, AclBindingFilter
from fjord.topic_partition import TopicPartition
from fjord_operator import builders
from fjord_operator import settings as s
from fjord_operator.ca_rotation import ROTATION_KEYS, CaPhase, ClusterCa, ca_status, read_cluster_ca
from fjord_operator.decisions import (
    AutoscalingPolicy,
    ClusterObservation,
    GroupLagSample,
    IngressSample,
    ScalingDecision,
    ScalingPhase,
    TopicDecision,
    TopicObservation,
    autoscaling_policy,
    bound_samples,
    decide_autoscale,
    decide_scaling,
    decide_time_lag,
    decide_topic,
    lag_samples_from_status,
    lag_samples_to_status,
    prune_samples,
    rack_annotations,
    roll_targets,
    samples_from_status,
    samples_to_status,
    time_lag_policy,
    topic_bytes_in,
    topic_spec_problems,
)
from fjord_operator.listeners import (
    client_bootstrap_hints,
    listener_problems,
    serves_scram,
    uses_named_listeners,
)
from fjord_operator.login import SERVICE_ACCOUNT_DIR, KubeLogin, connection_info, resolve_login
from fjord_operator.rolling import (
    in_flight_from_status,
    in_flight_to_status,
    partitions_for_roll,
    roll_step,
)
from fjord_operator.security import (
    SCRAM,
    AclChanges,
    CertificatePlan,
    SecuritySpecError,
    ca_secret_name,
    cluster_security,
    decode_secret,
    diff_acls,
    exact_filter,
    managed_etcd_tls,
    operator_identity,
    plan_certificates,
    plan_user_credentials,
    secret,
    service_secret_name,
    tls_roles,
    user_acls,
    user_authentication,
    user_principal,
)
from fjord_operator.settings import MAX_AUTOSCALING_SAMPLES, OperatorSettings
from fjord_operator.status import Outcome, Verdict, condition_of, status_patch

log = logging.getLogger(__name__)
T = TypeVar("T")



# -- pure planning of one reconciliation ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterPlan:
    """What one FjordCluster reconciliation does: ``objects`` to apply (empty when nothing may
    change), ``reassign`` to submit, the ``status`` to write, and whether to come back soon
    (``retry``: a step waits for the cluster)."""

    objects: list[dict[str, Any]]
    reassign: Mapping[TopicPartition, list[int]]
    status: dict[str, Any]
    retry: bool


def plan_cluster(
    body: Mapping[str, Any],
    statefulset_replicas: int | None,
    ready_brokers: int | None,
    registered: frozenset[int] | None,
    assignment: Mapping[TopicPartition, Sequence[int]],
    reassigning: frozenset[TopicPartition],
    now: datetime,
    tls_revisions: Mapping[str, str] | None = None,
    racks: Mapping[int, str | None] | None = None,
) -> ClusterPlan:
    """The plan for ``body`` given what was observed (see :class:`ClusterObservation`);
    ``tls_revisions``: each role's TLS Secret revision (secure clusters); ``racks``: each
    registered broker's rack."""
    spec = body.get("spec") or {}
    meta = body.get("metadata") or {}
    previous = body.get("status") or {}
    generation = meta.get("generation")
    problems = builders.cluster_spec_problems(spec)
    if problems:
        verdict = Verdict(Outcome.ERROR, "InvalidSpec", "; ".join(problems))
        return ClusterPlan([], {}, status_patch(verdict, generation, previous, now), False)
    desired = int(spec["brokers"]["replicas"])
    try:
        previous_phase = ScalingPhase((previous.get("scaling") or {}).get("phase", "Stable"))
    except ValueError:
        previous_phase = ScalingPhase.STABLE
    decision: ScalingDecision = decide_scaling(
        ClusterObservation(
            desired=desired,
            statefulset_replicas=statefulset_replicas,
            registered=registered,
            assignment=assignment,
            reassigning=reassigning,
            previous_phase=previous_phase,
            racks=dict(racks or {}),
        )
    )
    if decision.refused:
        verdict = Verdict(Outcome.ERROR, decision.reason, decision.message)
    elif decision.done:
        verdict = Verdict(Outcome.READY, decision.reason, decision.message)
    else:
        verdict = Verdict(Outcome.RECONCILING, decision.reason, decision.message)
    fields: dict[str, Any] = {
        "brokers": len(registered) if registered is not None else 0,
        "scaling": {
            "phase": decision.phase.value,
            "from": statefulset_replicas if statefulset_replicas is not None else 0,
            "to": desired,
            "message": decision.message,
        },
    }
    if ready_brokers is not None:
        fields["readyBrokers"] = ready_brokers
    objects = (
        []
        if decision.refused
        else builders.cluster_objects(body, decision.statefulset_replicas, tls_revisions)
    )
    return ClusterPlan(
        objects,
        decision.reassign,
        status_patch(verdict, generation, previous, now, **fields),
        retry=not (decision.done or decision.refused),
    )


def topic_name(body: Mapping[str, Any]) -> str:
    return str((body.get("spec") or {}).get("topicName") or body["metadata"]["name"])


def error_reason(error: FjordError) -> str:
    """A condition reason from a Fjord error code: INVALID_REPLICATION_FACTOR ->
    InvalidReplicationFactor."""
    return "".join(part.capitalize() for part in error.code.name.split("_"))


# -- the shells ----------------------------------------------------------------------------------


#: Worker threads of one FjordAdmin: the calls of one cluster at once.
ADMIN_THREADS_PER_CLUSTER = 4


class FjordAdmin:
    """Async face of one Fjord cluster's admin API. The AdminClient is synchronous (it owns an
    I/O thread), so every call runs in a worker thread, one of this cluster's own: calls to a
    cluster that does not answer (each waits out ``timeout_s``) must not hold the loop's
    shared executor, where every other cluster's calls would wait behind them. Invariant: one
    AdminClient per bootstrap address, created on first use, closed by :meth:`close`."""

    def __init__(
        self, bootstrap: str, timeout_s: float, security: Mapping[str, str] | None = None
    ) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        #: Kafka's client security settings (``security.protocol``, ``ssl.*``) of a secure
        #: cluster: the operator's own certificate (OperatorIdentity); empty for plaintext.
        self.security = dict(security or {})
        self._admin: Any = None
        self._consumer: Any = None
        self._threads: ThreadPoolExecutor | None = None

    async def _in_thread(self, call: Callable[[], T]) -> T:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(ADMIN_THREADS_PER_CLUSTER,
                                               thread_name_prefix=f"fjord-admin {self.bootstrap}")
        return await asyncio.get_running_loop().run_in_executor(self._threads, call)

    def _client(self) -> Any:
        if self._admin is None:
            from fjord.client import AdminClient

            self._admin = AdminClient(
                {
                    "bootstrap.servers": self.bootstrap,
                    "client.id": "fjord-operator",
                    "default.api.timeout.ms": int(self.timeout_s * 1000),
                    **self.security,
                }
            )
        return self._admin

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        def call() -> Any:
            return getattr(self._client(), method)(*args, **kwargs)

        return await self._in_thread(call)

    async def observe_cluster(
        self,
    ) -> tuple[frozenset[int], dict[TopicPartition, list[int]], frozenset[TopicPartition]]:
        """(registered broker ids, every partition's replicas, partitions being reassigned)."""
        cluster = await self._call("describe_cluster")
        topics = await self._call("describe_topics", None)
        moving = await self._call("list_partition_reassignments")
        assignment = {
            TopicPartition(t.name, p.partition): list(p.replicas)
            for t in topics
            for p in t.partitions
        }
        # A running reassignment lists old + new replicas: plan from the targets.
        for key, reassignment in moving.items():
            assignment[key] = list(reassignment.target_replicas)
        return frozenset(b.id for b in cluster.brokers), assignment, frozenset(moving)

    async def observe_racks(self) -> dict[int, str | None]:
        """Each registered broker's rack (None: the broker has none)."""
        cluster = await self._call("describe_cluster")
        return {b.id: (b.rack or None) for b in cluster.brokers}

    async def observe_roll(self) -> tuple[frozenset[int], dict[TopicPartition, PartitionIsr]]:
        """(registered broker ids, every partition's replicas, ISR and effective
        min.insync.replicas): what the rolling-restart planner needs (fjord_operator.rolling)."""
        cluster = await self._call("describe_cluster")
        topics = await self._call("describe_topics", None)
        configs = await self._call("describe_configs", [t.name for t in topics]) if topics else {}
        return frozenset(b.id for b in cluster.brokers), partitions_for_roll(topics, configs)

    async def observe_topic(self, name: str) -> TopicObservation | None:
        try:
            (description,) = await self._call("describe_topics", [name])
        except UnknownTopicOrPartitionError:
            return None
        configs = await self._call("describe_configs", [name])
        return TopicObservation(
            partitions=len(description.partitions),
            replication_factor=max((len(p.replicas) for p in description.partitions), default=0),
            config={e.name: e.value for e in configs.get(name, ()) if e.source == "TOPIC"},
            topic_id=description.topic_id,
        )

    async def apply_topic(self, name: str, decision: TopicDecision, replication: int) -> None:
        from fjord.client import NewTopic

        if decision.create:
            config = {k: v for k, v in decision.config_changes.items() if v is not None}
            await self._call(
                "create_topics", [NewTopic(name, decision.partitions, replication, config)]
            )
            return
        if decision.grow_to is not None:
            await self._call("create_partitions", {name: decision.grow_to})
        if decision.config_changes:
            await self._call("alter_configs", {name: dict(decision.config_changes)})
        if decision.replication_factor is not None:
            await self._call("alter_replication_factor", name, decision.replication_factor)

    async def user_acls(self, principal: str) -> frozenset[AclBinding]:
        """Every ACL binding of ``principal`` the controller holds."""
        return frozenset(await self._call("describe_acls", AclBindingFilter(principal=principal)))

    async def apply_acls(self, changes: AclChanges) -> None:
        if changes.create:
            await self._call("create_acls", sorted(changes.create))
        if changes.delete:
            await self._call("delete_acls", [exact_filter(b) for b in sorted(changes.delete)])

    async def delete_principal_acls(self, principal: str) -> None:
        await self._call("delete_acls", [AclBindingFilter(principal=principal)])

    async def scram_mechanisms(self, user: str) -> list[str]:
        """The SCRAM mechanisms ``user`` has a credential for (none: empty)."""
        try:
            found = await self._call("describe_user_scram_credentials", [user])
        except FjordError as exc:
            if exc.code is ErrorCode.RESOURCE_NOT_FOUND:
                return []
            raise
        return [str(info.mechanism) for info in found.get(user, ())]

    async def upsert_scram(self, user: str, password: str) -> None:
        from fjord.security.scram import SCRAM_SHA_512, UserScramCredentialUpsertion

        await self._call(
            "alter_user_scram_credentials",
            [UserScramCredentialUpsertion(user, SCRAM_SHA_512, password)],
        )

    async def delete_scram(self, user: str, mechanisms: Sequence[str]) -> None:
        from fjord.security.scram import UserScramCredentialDeletion

        if mechanisms:
            await self._call(
                "alter_user_scram_credentials",
                [UserScramCredentialDeletion(user, m) for m in mechanisms],
            )

    async def delete_topic(self, name: str) -> None:
        with contextlib.suppress(UnknownTopicOrPartitionError):
            await self._call("delete_topics", [name])

    async def grow(self, name: str, partitions: int) -> None:
        await self._call("create_partitions", {name: partitions})

    async def reassign(self, plan: Mapping[TopicPartition, Sequence[int]]) -> None:
        await self._call("alter_partition_reassignments", {k: list(v) for k, v in plan.items()})

    async def broker_hosts(self) -> list[str]:
        """The advertised host of every registered broker."""
        cluster = await self._call("describe_cluster")
        return [b.host for b in cluster.brokers]

    async def records_appended(self, name: str, partitions: int) -> int:
        """Sum of the topic's log-end offsets: every record it has received."""

        def call() -> int:
            if self._consumer is None:
                from fjord.client import Consumer

                self._consumer = Consumer(
                    {"bootstrap.servers": self.bootstrap, "client.id": "fjord-operator",
                     **self.security}
                )
            from fjord.client import TopicPartition

            ends = self._consumer.end_offsets(
                [TopicPartition(name, p) for p in range(partitions)], timeout=self.timeout_s
            )
            return int(sum(ends.values()))

        return await self._in_thread(call)

    async def group_lag(self, group: str, topic: str, now_s: float) -> GroupLagSample:
        """One time-lag sample of ``group`` on ``topic``: its committed offsets and the log end
        offsets summed over the partitions it has committed, the worst partition's time lag
        (``fjord groups describe``'s TIME-LAG) and its member count."""
        description = (await self._call("describe_consumer_groups", [group]))[group]
        rows = await self._call("describe_consumer_group_lag", group, description=description)
        mine = [
            r for r in rows
            if r.topic == topic and r.current_offset is not None and r.log_end_offset is not None
        ]
        lags = [r.time_lag_s for r in mine]
        return GroupLagSample(
            time_s=now_s,
            committed=sum(r.current_offset for r in mine),
            log_end=sum(r.log_end_offset for r in mine),
            time_lag_s=None if not mine or None in lags else max(lag or 0.0 for lag in lags),
            members=len(description.members),
        )

    def close(self) -> None:
        for client in (self._admin, self._consumer):
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()
        self._admin = self._consumer = None
        if self._threads is not None:
            self._threads.shutdown(wait=False)  # calls still running end on their own
            self._threads = None


class KubeApi:
    """Kubernetes reads and writes through one lightkube AsyncClient. Writes are
    create-or-merge-patch of the full desired object (idempotent; a patch is skipped when the
    live object already contains every desired field)."""

    def __init__(
        self,
        server: str | None = None,
        kubeconfig: str | None = None,
        service_account_dir: str | None = None,
    ) -> None:
        self._server, self._kubeconfig = server, kubeconfig
        self._service_account_dir = Path(service_account_dir or SERVICE_ACCOUNT_DIR)
        self._login: KubeLogin | None = None
        self._client: Any = None
        # apiVersion -> whether the server serves it, for OLDER_API_VERSIONS (asked once).
        self._served: dict[str, bool] = {}

    def login(self) -> KubeLogin:
        """The operator's one login (fjord_operator.login), resolved on first use: kopf's
        watches and these writes reach one server with one identity."""
        if self._login is None:
            self._login = resolve_login(
                server=self._server,
                kubeconfig=self._kubeconfig,
                service_account_dir=self._service_account_dir,
            )
        return self._login

    def client(self) -> Any:
        if self._client is None:
            from lightkube import AsyncClient

            self._client = AsyncClient(config=self.login().config, field_manager=s.FIELD_MANAGER)
        return self._client

    @staticmethod
    def _resource_of(obj: Mapping[str, Any]) -> Any:
        # The class only (no instance: a bare {apiVersion, kind, metadata} fails validation for
        # kinds with a required spec); the CRDs and the older API versions lightkube's models
        # lack get generic classes (found by the e2e tests).
        from lightkube.core.resource_registry import resource_registry
        from lightkube.generic_resource import create_namespaced_resource

        api_version, kind = str(obj["apiVersion"]), str(obj["kind"])
        if resource_registry.get(api_version, kind) is None:
            if api_version == s.API_VERSION:
                plural = s.CLUSTER_PLURAL if kind == s.CLUSTER_KIND else s.TOPIC_PLURAL
                create_namespaced_resource(s.GROUP, s.VERSION, kind, plural)
            elif (api_version, kind) in GENERIC_PLURALS:
                group, version = api_version.split("/")
                create_namespaced_resource(group, version, kind, GENERIC_PLURALS[api_version, kind])
        return resource_registry.load(api_version, kind)

    async def serves(self, api_version: str, kind: str, namespace: str) -> bool:
        """Whether the server serves ``kind`` in ``api_version`` (asked once per process by
        listing it: a served namespaced kind lists, possibly empty; an unserved one is 404)."""
        if api_version not in self._served:
            resource = self._resource_of({"apiVersion": api_version, "kind": kind})
            try:
                async for _ in self.client().list(resource, namespace=namespace, chunk_size=1):
                    break
                self._served[api_version] = True
            except Exception as exc:
                if http_status(exc) != 404:
                    raise
                self._served[api_version] = False
                log.warning(
                    "the Kubernetes API does not serve %s %s; using %s",
                    api_version,
                    kind,
                    OLDER_API_VERSIONS[api_version, kind],
                )
        return self._served[api_version]

    async def served_form(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        """``obj`` in the API version the server serves (see :data:`OLDER_API_VERSIONS`)."""
        key = (str(obj["apiVersion"]), str(obj["kind"]))
        if key not in OLDER_API_VERSIONS:
            return obj
        if await self.serves(*key, obj["metadata"]["namespace"]):
            return obj
        return with_api_version(obj, OLDER_API_VERSIONS[key])

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any | None:
        """The live object as a dict, or None when it does not exist."""
        resource = self._resource_of(
            {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}
        )
        try:
            live = await self.client().get(resource, name, namespace=namespace)
        except Exception as exc:
            if http_status(exc) == 404:
                return None
            raise
        return live.to_dict() if hasattr(live, "to_dict") else dict(live)

    async def node_labels(self, name: str) -> dict[str, str]:
        """The labels of node ``name`` (empty when the node does not exist)."""
        from lightkube.resources.core_v1 import Node

        try:
            node = await self.client().get(Node, name)
        except Exception as exc:
            if http_status(exc) == 404:
                return {}
            raise
        return dict(node.metadata.labels or {})

    async def annotate(
        self, api_version: str, kind: str, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> None:
        """Merge ``annotations`` into one object's annotations."""
        from lightkube.types import PatchType

        await self.client().patch(
            self._resource_of({"apiVersion": api_version, "kind": kind}),
            name,
            {"metadata": {"annotations": dict(annotations)}},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )

    async def list(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """The live objects of ``kind`` in ``namespace`` carrying every label of ``labels``
        (the selector is checked here too: a server that ignores it, as the test emulator
        does, never hands one role's pods to another's decision)."""
        resource = self._resource_of({"apiVersion": api_version, "kind": kind})
        out = []
        async for item in self.client().list(resource, namespace=namespace, labels=dict(labels)):
            obj = item.to_dict() if hasattr(item, "to_dict") else dict(item)
            found = (obj.get("metadata") or {}).get("labels") or {}
            if all(found.get(k) == v for k, v in labels.items()):
                out.append(obj)
        return out

    async def apply(self, obj: Mapping[str, Any]) -> str:
        """Create ``obj`` or patch the live one towards it: "created", "patched" or
        "unchanged"."""
        from lightkube import codecs
        from lightkube.types import PatchType

        obj = await self.served_form(obj)
        meta = obj["metadata"]
        live = await self.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        if live is None:
            await self.client().create(codecs.from_dict(dict(obj)), namespace=meta["namespace"])
            return "created"
        if contains(live, obj):
            return "unchanged"
        await self.client().patch(
            self._resource_of(obj),
            meta["name"],
            dict(obj),
            namespace=meta["namespace"],
            patch_type=PatchType.MERGE,
        )
        return "patched"

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        """Delete the object; False when it did not exist."""
        resource = self._resource_of(
            {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}
        )
        try:
            await self.client().delete(resource, name, namespace=namespace)
        except Exception as exc:
            if http_status(exc) == 404:
                return False
            raise
        return True

    async def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
            self._client = None


#: Objects the operator writes in an API version that older servers lack, and the older version
#: with the same fields those servers serve instead: PodDisruptionBudget is policy/v1 from
#: Kubernetes 1.21, policy/v1beta1 before (so a 1.20 cluster still gets its budgets).
OLDER_API_VERSIONS: dict[tuple[str, str], str] = {
    ("policy/v1", "PodDisruptionBudget"): "policy/v1beta1",
}
#: Plurals of the older versions above, which lightkube's models do not include.
GENERIC_PLURALS: dict[tuple[str, str], str] = {
    ("policy/v1beta1", "PodDisruptionBudget"): "poddisruptionbudgets",
}


def with_api_version(obj: Mapping[str, Any], api_version: str) -> dict[str, Any]:
    """A copy of ``obj`` declaring ``api_version`` (the fields are the same in both)."""
    return {**obj, "apiVersion": api_version}


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a failed Kubernetes call (lightkube's ApiError carries the API's
    Status; an answer without one is still an HTTP error with a response), else None."""
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    return code if isinstance(code, int) else None


def contains(live: Any, desired: Any) -> bool:
    """Whether ``live`` already has every field of ``desired`` (API-server defaults in
    ``live`` are ignored; list items are compared pairwise)."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            key in live and contains(live[key], value) for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(live) == len(desired)
            and all(contains(a, b) for a, b in zip(live, desired, strict=True))
        )
    return bool(live == desired)


# -- the runtime -------------------------------------------------------------------------------


@dataclass
class Runtime:
    """The operator's shared state: settings, clients, per-object locks and the autoscaler's
    ingress samples (kept here and in each FjordTopic's ``status.autoscaling``, from which a
    restarted operator continues the stabilization window)."""

    settings: OperatorSettings
    kube: KubeApi
    admins: dict[str, FjordAdmin] = field(default_factory=dict)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    samples: dict[str, list[IngressSample]] = field(default_factory=dict)
    #: The time-lag autoscaler's window per FjordTopic (``<uid>/lag``), also kept in its status.
    lag_samples: dict[str, list[GroupLagSample]] = field(default_factory=dict)
    identities: dict[str, OperatorIdentity] = field(default_factory=dict)

    def admin(self, bootstrap: str, security: Mapping[str, str] | None = None) -> FjordAdmin:
        """The admin client of one cluster (one per address and client security)."""
        key = bootstrap + "|" + ",".join(f"{k}={v}" for k, v in sorted((security or {}).items()))
        if key not in self.admins:
            self.admins[key] = FjordAdmin(bootstrap, self.settings.admin_timeout_s, security)
        return self.admins[key]

    async def cluster_admin(self, cluster: Mapping[str, Any]) -> FjordAdmin:
        """The admin client for a FjordCluster: over TLS with the operator's own certificate
        when ``spec.security.tls`` (issued from the cluster CA Secret), else plaintext.
        Raises SecuritySpecError while the CA Secret is missing or unusable."""
        security = cluster_security(cluster.get("spec") or {})
        if security is None:
            return self.admin(builders.bootstrap_servers(cluster))
        meta = cluster["metadata"]
        ca = await self.cluster_ca(cluster)
        identity = self.identities.get(meta["uid"])
        if identity is None:
            identity = self.identities[meta["uid"]] = OperatorIdentity()
        # Signed by the CA that signs now, trusting every CA trusted now: during a CA renewal
        # both (fjord_operator.ca_rotation), so it reaches every pod whichever it runs.
        config = identity.client_config(ca.signing, datetime.now(UTC), ca.bundle())
        admin = self.admin(builders.bootstrap_servers(cluster), config)
        previous = identity.admin
        if previous is not None and previous is not admin:
            # A re-issued certificate (or a moved cluster): the old client goes.
            self.admins = {k: v for k, v in self.admins.items() if v is not previous}
            await asyncio.to_thread(previous.close)
        identity.admin = admin
        return admin

    async def cluster_ca(self, cluster: Mapping[str, Any]) -> ClusterCa:
        """A secure FjordCluster's CA Secret (managed: owned by the cluster, so the operator
        made it). SecuritySpecError while it is missing or unusable."""
        meta = cluster["metadata"]
        name = ca_secret_name(meta["name"])
        live = await self.kube.get("v1", "Secret", meta.get("namespace", "default"), name)
        data = decode_secret(live)
        if live is None or data is None:
            raise SecuritySpecError(f"Secret {name} does not exist yet")
        try:
            return read_cluster_ca(data, owned_by(live, meta.get("uid")))
        except ValueError as exc:
            raise SecuritySpecError(f"Secret {name}: {exc}") from None

    def lock(self, uid: str) -> asyncio.Lock:
        return self.locks.setdefault(uid, asyncio.Lock())

    async def close(self) -> None:
        for admin in self.admins.values():
            await asyncio.to_thread(admin.close)
        self.admins.clear()
        for identity in self.identities.values():
            identity.remove()
        self.identities.clear()
        await self.kube.close()


class OperatorIdentity:
    """The operator's client certificate for one secure cluster, in a private temporary
    directory (0700, files 0600): the client settings name files. Re-issued from the cluster
    CA at half its life or when the CA or the trusted CAs change; each issue goes to new file
    names, so an admin client built on the old ones keeps working until it is replaced."""

    def __init__(self) -> None:
        import tempfile

        self.directory = Path(tempfile.mkdtemp(prefix="fjord-operator-"))
        #: The admin client built on the current certificate (closed when it is re-issued).
        self.admin: FjordAdmin | None = None
        self._config: dict[str, str] | None = None
        self._renew_at: datetime | None = None
        self._ca_pem: bytes | None = None
        self._trust: bytes | None = None
        self._serial = 0

    def client_config(self, ca: Any, now: datetime, trust: bytes | None = None) -> dict[str, str]:
        """Client settings with a certificate of ``ca`` that trust ``trust`` (a PEM bundle;
        default ``ca`` alone)."""
        from fjord.tls import write_private

        trust = trust if trust is not None else ca.pem()
        if (
            self._config is None
            or self._ca_pem != ca.pem()
            or self._trust != trust
            or self._renew_at is None
            or now >= self._renew_at
        ):
            cert, key = operator_identity(ca, now)
            self._serial += 1
            paths = {
                name: self.directory / f"{name}-{self._serial}.pem"
                for name in ("ca", "operator", "operator-key")
            }
            write_private(paths["ca"], trust)
            write_private(paths["operator"], cert)
            write_private(paths["operator-key"], key)
            self._ca_pem, self._trust = ca.pem(), trust
            from datetime import timedelta

            self._renew_at = now + timedelta(hours=s.OPERATOR_CERT_VALIDITY_HOURS / 2)
            self._config = {
                "security.protocol": "SSL",
                "ssl.ca.location": str(paths["ca"]),
                "ssl.certificate.location": str(paths["operator"]),
                "ssl.key.location": str(paths["operator-key"]),
            }
        return dict(self._config)

    def remove(self) -> None:
        import shutil

        shutil.rmtree(self.directory, ignore_errors=True)


def _unreachable(exc: BaseException) -> bool:
    """Errors that mean "the Fjord cluster is not answering (yet)": retry later."""
    return isinstance(exc, KafkaTimeoutError | OSError) or (
        isinstance(exc, FjordError) and exc.retriable
    )


async def reconcile_cluster(rt: Runtime, body: Mapping[str, Any]) -> ClusterPlan:
    """Observe, plan, apply one FjordCluster; returns the plan (its status is to be written)."""
    meta = body["metadata"]
    namespace, name = meta.get("namespace", "default"), meta["name"]
    if managed_etcd_tls(body.get("spec") or {}):
        live_etcd = await rt.kube.get("apps/v1", "StatefulSet", namespace,
                                      builders.etcd_name(name))
        kept = builders.with_running_etcd(body, live_etcd)
        if kept is not body:
            log.warning(
                "cluster %s/%s: its running %s-member etcd started in plaintext stays so (etcd "
                "keeps its members' http peer URLs); set spec.etcd.managed.tls to false to "
                "say so, or recreate it with TLS", namespace, name,
                live_etcd["spec"]["replicas"] if live_etcd else "?")
            body = kept
    live_sts = await rt.kube.get("apps/v1", "StatefulSet", namespace, builders.broker_name(name))
    sts_replicas = None if live_sts is None else int(live_sts["spec"].get("replicas", 0))
    ready = (
        None if live_sts is None else int((live_sts.get("status") or {}).get("readyReplicas") or 0)
    )
    registered: frozenset[int] | None = None
    racks: dict[int, str | None] = {}
    assignment: dict[TopicPartition, list[int]] = {}
    reassigning: frozenset[TopicPartition] = frozenset()
    now = datetime.now(UTC)
    problems = builders.cluster_spec_problems(body.get("spec") or {})
    revisions: dict[str, str] | None = None
    certificates: CertificatePlan | None = None
    if not problems:
        try:
            certificates = await reconcile_certificates(rt, body, now)
            revisions = None if certificates is None else certificates.revisions
        except SecuritySpecError as exc:
            reason = "SecretNameTaken" if isinstance(exc, SecretNameTaken) else "InvalidClusterCA"
            verdict = Verdict(Outcome.ERROR, reason, str(exc))
            status = status_patch(verdict, meta.get("generation"), body.get("status"), now)
            return ClusterPlan([], {}, status, retry=False)
    if live_sts is not None and not problems:
        try:
            admin = await rt.cluster_admin(body)
            registered, assignment, reassigning = await admin.observe_cluster()
            racks = await admin.observe_racks()
        except Exception as exc:
            if not _unreachable(exc):
                raise
            log.info("cluster %s/%s not reachable yet: %s", namespace, name, exc)
    plan = plan_cluster(
        body, sts_replicas, ready, registered, assignment, reassigning, now, revisions, racks
    )
    if certificates is not None:
        plan = _with_ca_status(body, plan, certificates)
    try:
        for obj in plan.objects:
            await rt.kube.apply(obj)
    except Exception as exc:
        code = http_status(exc)
        # Conflicts, throttling and server errors are transient: kopf retries them.
        if code is None or code in (409, 429) or code >= 500:
            raise
        verdict = Verdict(Outcome.ERROR, "KubernetesApiRejected", f"HTTP {code}: {exc}")
        status = status_patch(verdict, meta.get("generation"), body.get("status"), now)
        return ClusterPlan([], {}, status, retry=False)
    if plan.reassign:
        try:
            await (await rt.cluster_admin(body)).reassign(plan.reassign)
        except FjordError as exc:
            # E.g. a broker left between observing and submitting: try again on fresh state.
            outcome = Outcome.RECONCILING if _unreachable(exc) else Outcome.ERROR
            verdict = Verdict(outcome, error_reason(exc), f"reassignment refused: {exc}")
            status = {
                **plan.status,
                **status_patch(verdict, meta.get("generation"), body.get("status"), now),
            }
            return ClusterPlan(plan.objects, {}, status, retry=True)
    if live_sts is not None and builders.rack_topology_key(body.get("spec") or {}):
        plan = await _assign_racks(rt, body, plan)
    if live_sts is not None and registered is not None:
        plan = await _roll_brokers(rt, body, live_sts, plan, now)
    return plan


async def _assign_racks(rt: Runtime, body: Mapping[str, Any], plan: ClusterPlan) -> ClusterPlan:
    """Rack awareness (``spec.brokers.rack.topologyKey``): annotate each scheduled broker pod
    with its node's label (the broker waits for it at start and registers with ``--rack``);
    ``status.racks`` lists each broker's rack. Comes back soon while a pod waits."""
    meta = body["metadata"]
    namespace, name = meta.get("namespace", "default"), meta["name"]
    key = builders.rack_topology_key(body.get("spec") or {})
    assert key is not None
    pods = await rt.kube.list("v1", "Pod", namespace, builders.selector_labels(name, "broker"))
    nodes = {str(p["spec"]["nodeName"]) for p in pods if (p.get("spec") or {}).get("nodeName")}
    labels = {node: await rt.kube.node_labels(node) for node in sorted(nodes)}
    racks = rack_annotations(pods, labels, key, s.RACK_ANNOTATION)
    for pod, rack in sorted(racks.patches.items()):
        log.info("cluster %s/%s: pod %s is in rack %s", namespace, name, pod, rack)
        await rt.kube.annotate("v1", "Pod", namespace, pod, {s.RACK_ANNOTATION: rack})
    for problem in racks.missing:
        log.warning("cluster %s/%s: %s", namespace, name, problem)
    status = {**plan.status, "racks": {str(b): r for b, r in sorted(racks.racks.items())}}
    waiting = bool(racks.patches or racks.missing)
    return ClusterPlan(plan.objects, plan.reassign, status, retry=plan.retry or waiting)


async def reconcile_certificates(
    rt: Runtime, body: Mapping[str, Any], now: datetime
) -> CertificatePlan | None:
    """Write the secure cluster's CA and service Secrets as security.plan_certificates says
    (the CA Secret first); returns the plan (None for a plaintext cluster). A role whose
    certificate or trusted CAs changed while its pods run is logged: controllers,
    coordinators and a managed etcd's members (one at a time, each back in its quorum before
    the next) roll through their pod template's revision; brokers are restarted by the
    operator one at a time (see _roll_brokers). During a CA renewal the pods' revisions and the
    FjordUser Secrets are observed: each phase waits for them (fjord_operator.ca_rotation)."""
    security = cluster_security(body.get("spec") or {})
    if security is None:
        return None
    meta = body["metadata"]
    name, namespace = meta["name"], meta.get("namespace", "default")
    ca_live = await rt.kube.get("v1", "Secret", namespace, ca_secret_name(name))
    ca_data = decode_secret(ca_live)
    roles: dict[str, Any] = {}
    tls_roles_now = tls_roles(body.get("spec") or {})
    for role in tls_roles_now:
        live = await rt.kube.get("v1", "Secret", namespace, service_secret_name(name, role))
        if live is not None and not owned_by(live, meta.get("uid")):
            # Only the CA Secret may be supplied; a service Secret of another owner (a
            # FjordUser of that name, say) is never taken over.
            raise SecretNameTaken(
                f"Secret {service_secret_name(name, role)} exists and does not belong to this "
                "FjordCluster; nothing was changed"
            )
        roles[role] = decode_secret(live)
    managed = ca_live is None or owned_by(ca_live, meta.get("uid"))
    pods: dict[str, dict[str, str | None]] | None = None
    users: dict[str, dict[str, bytes]] = {}
    if managed and ca_data is not None and any(k in ca_data for k in ROTATION_KEYS):
        # A CA renewal is under way: its next step waits for the pods and the users.
        pods = {}
        for role in tls_roles_now:  # the managed etcd's members too
            found = await rt.kube.list("v1", "Pod", namespace, builders.selector_labels(name, role))
            pods[role] = {
                str(p["metadata"]["name"]): (p["metadata"].get("annotations") or {}).get(
                    s.TLS_REVISION_ANNOTATION
                )
                for p in found
            }
        for obj in await rt.kube.list(
            "v1", "Secret", namespace, builders.selector_labels(name, "user")
        ):
            users[str(obj["metadata"]["name"])] = decode_secret(obj) or {}
    plan = plan_certificates(
        body, security, ca_data, roles, now, ca_managed=managed, pods=pods, users=users
    )
    for obj in plan.secrets:
        await rt.kube.apply(obj)
    decision = plan.ca_decision
    if decision.changed and ca_data is not None:
        log.info("cluster %s/%s: cluster CA %s: %s", namespace, name,
                 plan.cluster_ca.phase.value, decision.message)
        _post_event(body, "Normal", f"ClusterCa{plan.cluster_ca.phase.value}", decision.message)
    previous = (body.get("status") or {}).get("clusterCa") or {}
    if decision.expiring and not previous.get("expiring"):
        log.warning("cluster %s/%s: %s", namespace, name, decision.message)
        _post_event(body, "Warning", "ClusterCaExpiring", decision.message)
    for role, why in plan.renewed.items():
        log.info("cluster %s/%s: %s certificate renewed (%s)", namespace, name, role, why)
    return plan


def _post_event(body: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
    """A Kubernetes Event on the FjordCluster (through kopf; nothing outside a kopf handler)."""
    with contextlib.suppress(LookupError):
        kopf.event(cast(Any, body), type=kind, reason=reason, message=message)


def _with_ca_status(
    body: Mapping[str, Any], plan: ClusterPlan, certificates: CertificatePlan
) -> ClusterPlan:
    """``status.clusterCa``; while a CA renewal is under way the cluster is Reconciling and the
    reconciliation comes back soon (each phase waits for pods to roll)."""
    status = {**plan.status, "clusterCa": ca_status(certificates.ca_decision)}
    renewing = certificates.cluster_ca.phase is not CaPhase.STABLE
    if renewing and (condition_of(plan.status, "Ready") or {}).get("status") == "True":
        meta = body["metadata"]
        verdict = Verdict(Outcome.RECONCILING, "RenewingClusterCa",
                          certificates.ca_decision.message)
        status.update(status_patch(verdict, meta.get("generation"), body.get("status"),
                                   datetime.now(UTC)))
    return ClusterPlan(plan.objects, plan.reassign, status, retry=plan.retry or renewing)


class SecretNameTaken(SecuritySpecError):
    """A Secret the operator would write exists and belongs to something else."""


@dataclass(frozen=True, slots=True)
class UserPlan:
    """One FjordUser reconciliation: the status to write and whether to retry soon."""

    status: dict[str, Any]
    retry: bool


async def _user_cluster(rt: Runtime, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    namespace = body["metadata"].get("namespace", "default")
    cluster = str((body.get("spec") or {}).get("cluster"))
    found: Mapping[str, Any] | None = await rt.kube.get(
        s.API_VERSION, s.CLUSTER_KIND, namespace, cluster
    )
    return found


async def reconcile_user(rt: Runtime, body: Mapping[str, Any]) -> UserPlan:
    """Bring a FjordUser's Secret, SCRAM credential and ACLs to its spec (drift both ways)."""
    spec = body.get("spec") or {}
    meta = body["metadata"]
    name, namespace = meta["name"], meta.get("namespace", "default")
    now = datetime.now(UTC)

    def done(outcome: Outcome, reason: str, message: str, retry: bool) -> UserPlan:
        verdict = Verdict(outcome, reason, message)
        return UserPlan(status_patch(verdict, meta.get("generation"), body.get("status"), now),
                        retry)

    try:
        kind = user_authentication(spec)
        desired = user_acls(name, spec)
    except SecuritySpecError as exc:
        return done(Outcome.ERROR, "InvalidSpec", str(exc), False)
    cluster = await _user_cluster(rt, body)
    if cluster is None:
        return done(Outcome.ERROR, "ClusterNotFound",
                    f"FjordCluster {spec.get('cluster')!r} does not exist in this namespace", True)
    try:
        security = cluster_security(cluster.get("spec") or {})
    except SecuritySpecError as exc:
        return done(Outcome.ERROR, "ClusterInvalid", str(exc), True)
    if security is None:
        return done(Outcome.ERROR, "ClusterNotSecure",
                    f"FjordCluster {spec.get('cluster')!r} has spec.security.tls off: users "
                    "need a cluster with TLS", True)
    cluster_spec = cluster.get("spec") or {}
    listener_trouble = listener_problems(cluster_spec)
    if listener_trouble:
        return done(Outcome.ERROR, "ClusterInvalid", "; ".join(listener_trouble), True)
    if kind == SCRAM and not serves_scram(cluster_spec):
        # A credential no door accepts would be accepted and ignored: refuse it instead.
        listeners = (
            "every spec.listeners entry takes client certificates"
            if uses_named_listeners(cluster_spec)
            else "its Kafka listener takes client certificates (spec.security."
            "kafkaAuthentication: tls)"
        )
        return done(Outcome.ERROR, "ScramNotServed",
                    f"FjordCluster {spec.get('cluster')!r} has no door that takes SCRAM logins "
                    f"({listeners}, and spec.security.saslGrpcDoor is off): a scram-sha-512 "
                    "user could not log in; use authentication type tls, or give the cluster "
                    "a scram-sha-512 listener or the SASL gRPC doors", True)
    if await rt.kube.get(
        "v1", "Secret", namespace, ca_secret_name(cluster["metadata"]["name"])
    ) is None:
        return done(Outcome.RECONCILING, "WaitingForClusterCA",
                    f"Secret {ca_secret_name(cluster['metadata']['name'])} does not exist yet",
                    True)
    try:
        cluster_ca = await rt.cluster_ca(cluster)
        admin = await rt.cluster_admin(cluster)
    except SecuritySpecError as exc:
        return done(Outcome.ERROR, "InvalidClusterCA", str(exc), True)
    live_secret = await rt.kube.get("v1", "Secret", namespace, name)
    if live_secret is not None and not owned_by(live_secret, meta.get("uid")):
        # Never overwrite (or later delete) a Secret this user does not own: a FjordUser named
        # like the cluster CA Secret would otherwise replace the CA key.
        return done(Outcome.ERROR, "SecretNameTaken",
                    f"Secret {name} exists and does not belong to this FjordUser; nothing was "
                    "changed (name the user differently)", True)
    live = decode_secret(live_secret)
    # Signed by the CA that signs now, ca.crt the CAs trusted now (both during a CA renewal).
    credentials = plan_user_credentials(
        name, kind, cluster_ca.signing, live, now, security.validity, security.renew_before,
        client_bootstrap_hints(cluster, kind), trust=cluster_ca.bundle(),
    )
    principal = user_principal(name)
    try:
        if credentials.changed:
            if set(live or {}) - set(credentials.data):
                # Keys of the other authentication type (a merge patch would keep them): the
                # Secret is made anew, so it never holds a certificate the user gave up.
                await rt.kube.delete("v1", "Secret", namespace, name)
            await rt.kube.apply(secret(body, name, "user", credentials.data))
        mechanisms = await admin.scram_mechanisms(name)
        if kind == SCRAM:
            assert credentials.password is not None
            if credentials.changed or not mechanisms:
                await admin.upsert_scram(name, credentials.password)
        else:
            await admin.delete_scram(name, mechanisms)  # the user switched to certificates
        changes = diff_acls(desired, await admin.user_acls(principal))
        await admin.apply_acls(changes)
    except Exception as exc:
        if _unreachable(exc):
            return done(Outcome.RECONCILING, "ClusterUnreachable", str(exc), True)
        if isinstance(exc, FjordError):
            return done(Outcome.ERROR, error_reason(exc), str(exc), True)
        raise
    what = "a certificate" if kind != SCRAM else "a SCRAM-SHA-512 password"
    return done(
        Outcome.READY, "Ready",
        f"{principal}: {what} in Secret {name}, {len(desired)} ACLs "
        f"(+{len(changes.create)} -{len(changes.delete)})",
        False,
    )


def owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    """Whether ``obj`` names ``uid`` among its owner references."""
    owners = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return uid is not None and any(o.get("uid") == uid for o in owners)


async def finalize_user(rt: Runtime, body: Mapping[str, Any]) -> None:
    """A FjordUser being deleted: its ACLs and SCRAM credential go from the cluster (when
    the cluster still exists), then its Secret."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta.get("namespace", "default")
    cluster = await _user_cluster(rt, body)
    if cluster is not None and cluster_security(cluster.get("spec") or {}) is not None:
        try:
            admin = await rt.cluster_admin(cluster)
        except SecuritySpecError:
            admin = None  # no CA: the cluster never ran securely, nothing was applied
        if admin is not None:
            await admin.delete_principal_acls(user_principal(name))
            await admin.delete_scram(name, await admin.scram_mechanisms(name))
    live_secret = await rt.kube.get("v1", "Secret", namespace, name)
    if live_secret is not None and owned_by(live_secret, meta.get("uid")):
        await rt.kube.delete("v1", "Secret", namespace, name)


async def _roll_brokers(
    rt: Runtime,
    body: Mapping[str, Any],
    live_sts: Mapping[str, Any],
    plan: ClusterPlan,
    now: datetime,
) -> ClusterPlan:
    """One step of a rolling restart of the brokers (a changed pod template): delete the pod
    the planner names, or wait. Progress (the broker restarted last and the ISRs it left) is
    kept in ``status.rolling``; while a roll is pending the cluster is not Ready."""
    meta = body["metadata"]
    namespace, name = meta.get("namespace", "default"), meta["name"]
    if not (live_sts.get("status") or {}).get("updateRevision"):
        return plan  # the StatefulSet controller has not reported revisions yet
    replicas = int(live_sts["spec"].get("replicas", 0))
    pods = await rt.kube.list("v1", "Pod", namespace, builders.selector_labels(name, "broker"))
    targets = roll_targets(live_sts, pods, replicas)
    previous = (body.get("status") or {}).get("rolling") or {}
    in_flight = in_flight_from_status(previous.get("restarting"))
    rolling: dict[str, Any] = {"revision": targets.update_revision}
    if not targets.settled:
        step_reason, pending = "waiting for the StatefulSet controller to see the template", True
    elif not targets.to_restart and in_flight is None:
        step_reason, pending = "every broker runs the current template", False
    else:

        async def restart(broker: int) -> None:
            pod = f"{builders.broker_name(name)}-{broker}"
            log.info("rolling restart of %s/%s: deleting pod %s", namespace, name, pod)
            await rt.kube.delete("v1", "Pod", namespace, pod)

        try:
            step = await roll_step(
                await rt.cluster_admin(body),
                targets.to_restart,
                in_flight,
                restart,
                not_serving=targets.not_serving,
            )
        except Exception as exc:
            if not (_unreachable(exc) or isinstance(exc, SecuritySpecError)):
                raise
            step = RollStep(RollAction.WAIT, f"the Fjord cluster did not answer: {exc}")
        if step.action is RollAction.RESTART:
            in_flight = step.in_flight
        elif step.back is not None:
            in_flight = None
        step_reason, pending = step.reason, step.action is not RollAction.DONE
    rolling.update(
        phase="Rolling" if pending else "Idle",
        pending=list(targets.to_restart),
        restarting=in_flight_to_status(in_flight),
        message=step_reason,
    )
    status = {**plan.status, "rolling": rolling}
    ready = (condition_of(plan.status, "Ready") or {}).get("status") == "True"
    if pending and ready:
        verdict = Verdict(Outcome.RECONCILING, "RollingRestart", step_reason)
        status.update(status_patch(verdict, meta.get("generation"), body.get("status"), now))
    return ClusterPlan(plan.objects, plan.reassign, status, retry=plan.retry or pending)


@dataclass(frozen=True, slots=True)
class TopicPlan:
    """One FjordTopic reconciliation: the status to write and whether to retry soon."""

    status: dict[str, Any]
    retry: bool


async def _topic_cluster(rt: Runtime, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    spec = body.get("spec") or {}
    namespace = body["metadata"].get("namespace", "default")
    cluster = await rt.kube.get(s.API_VERSION, s.CLUSTER_KIND, namespace, str(spec.get("cluster")))
    return cluster


async def reconcile_topic(
    rt: Runtime, body: Mapping[str, Any], *, autoscale: bool = False
) -> TopicPlan:
    """Bring the Fjord topic to the FjordTopic's spec (and, on the timer, autoscale it)."""
    spec = body.get("spec") or {}
    meta = body["metadata"]
    generation, previous = meta.get("generation"), body.get("status")
    now = datetime.now(UTC)

    extra: dict[str, Any] = {}  # status fields beyond the verdict's (the autoscaling window)

    def done(outcome: Outcome, reason: str, message: str, retry: bool, **fields: Any) -> TopicPlan:
        verdict = Verdict(outcome, reason, message)
        patch = status_patch(verdict, generation, previous, now, **fields, **extra)
        return TopicPlan(patch, retry)

    problems = topic_spec_problems(spec)
    if problems:
        return done(Outcome.ERROR, "InvalidSpec", "; ".join(problems), False)
    cluster = await _topic_cluster(rt, body)
    if cluster is None:
        return done(
            Outcome.ERROR,
            "ClusterNotFound",
            f"FjordCluster {spec.get('cluster')!r} does not exist in this namespace",
            True,
        )
    name = topic_name(body)
    try:
        admin = await rt.cluster_admin(cluster)
    except SecuritySpecError as exc:
        return done(Outcome.RECONCILING, "WaitingForClusterCA", str(exc), True)
    policy = autoscaling_policy(spec)
    if policy is None and (previous or {}).get("autoscaling") is not None:
        extra["autoscaling"] = None  # autoscaling turned off: its window is gone
    replication = int(spec["replicationFactor"])
    config = {str(k): str(v) for k, v in (spec.get("config") or {}).items()}
    try:
        actual = await admin.observe_topic(name)
        decision = decide_topic(int(spec["partitions"]), replication, config, actual, policy)
        if decision.changes_anything:
            try:
                await admin.apply_topic(name, decision, replication)
            except ReassignmentInProgressError as exc:
                return done(Outcome.RECONCILING, "ReassignmentInProgress", str(exc), True)
            actual = await admin.observe_topic(name)
        if autoscale and policy is not None and actual is not None:
            grown, window = await _autoscale(
                rt, cluster, body, admin, name, actual.partitions, policy
            )
            extra["autoscaling"] = window  # None removes a finished window from the status
            if grown is not None:
                actual = await admin.observe_topic(name)
    except Exception as exc:
        if _unreachable(exc):
            return done(Outcome.RECONCILING, "ClusterUnreachable", str(exc), True)
        if isinstance(exc, FjordError):
            return done(Outcome.ERROR, error_reason(exc), str(exc), False)
        raise
    if actual is None:  # created, but the brokers' metadata does not show it yet
        return done(Outcome.RECONCILING, "Creating", f"topic {name!r} is being created", True)
    fields = {"partitions": actual.partitions, "topicId": actual.topic_id}
    if decision.error is not None:
        return done(Outcome.ERROR, decision.error[0], decision.error[1], False, **fields)
    return done(
        Outcome.READY,
        "Ready",
        f"topic {name!r} has {actual.partitions} partitions",
        False,
        **fields,
    )


async def measure_ingress(
    rt: Runtime,
    cluster: Mapping[str, Any],
    topic: Mapping[str, Any],
    admin: FjordAdmin,
    name: str,
    partitions: int,
) -> tuple[str, float]:
    """(source, bytes received so far): "metrics" when every broker's /metrics answered (the
    per-topic bytes-in counters), else "records" (log-end offsets x the average record size)."""
    hosts = await admin.broker_hosts()
    addresses = builders.broker_metrics_addresses(cluster, hosts)
    if addresses:
        try:
            pages = await scrape_metrics(addresses, rt.settings.admin_timeout_s)
            return "metrics", topic_bytes_in(pages, name)
        except OSError as exc:
            log.info("broker metrics unreadable (%s); measuring %s in records", exc, name)
    annotations = topic["metadata"].get("annotations") or {}
    try:
        record_bytes = int(
            annotations.get(s.RECORD_BYTES_ANNOTATION, rt.settings.average_record_bytes)
        )
    except ValueError:
        record_bytes = rt.settings.average_record_bytes
    records = await admin.records_appended(name, partitions)
    return "records", float(records * max(record_bytes, 1))


async def scrape_metrics(addresses: Sequence[str], timeout_s: float) -> list[str]:
    """The Prometheus text page of each HOST:PORT, fetched concurrently on the event loop
    (aiohttp, kopf's own HTTP client), so brokers that do not answer hold no threads; OSError
    when one does not answer within ``timeout_s``, refuses, or answers other than 2xx."""

    async def fetch(session: aiohttp.ClientSession, address: str) -> str:
        async with session.get(f"http://{address}/metrics", raise_for_status=True) as response:
            return (await response.read()).decode("utf-8", "replace")

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            return list(await asyncio.gather(*(fetch(session, a) for a in addresses)))
    except aiohttp.ClientError as exc:  # connection errors are OSErrors already, HTTP ones not
        if isinstance(exc, OSError):
            raise
        raise OSError(f"broker metrics: {exc}") from exc


async def _autoscale(
    rt: Runtime,
    cluster: Mapping[str, Any],
    body: Mapping[str, Any],
    admin: FjordAdmin,
    name: str,
    partitions: int,
    policy: AutoscalingPolicy,
) -> tuple[int | None, dict[str, object] | None]:
    """Take one ingress sample; grow the topic when :func:`decide_autoscale` says so.

    Returns the new partition count (or None) and the ``status.autoscaling`` to write: the
    window's samples, so that a restarted operator continues the window (None: a new window
    starts, after a growth)."""
    source, total = await measure_ingress(rt, cluster, body, admin, name, partitions)
    now = time.time()  # wall clock: the samples outlive this process in the status
    uid = body["metadata"]["uid"]
    key = f"{uid}/{source}"  # a change of source starts a new window
    # This process's own samples are the newest; after a restart, the status has them.
    known = rt.samples.get(key)
    if known is None:
        known = samples_from_status(body.get("status"), source)
    samples = [*known, IngressSample(now, total)]
    rt.samples = {k: v for k, v in rt.samples.items() if not k.startswith(f"{uid}/")}
    samples = bound_samples(prune_samples(samples, now, policy.stabilization_window_s))
    rt.samples[key] = samples
    grow_to = decide_autoscale(samples, partitions, policy, now)
    lag_status: dict[str, object] | None = None
    target = time_lag_policy(body.get("spec") or {})
    if target is not None:
        lag_key = f"{uid}/lag"
        known_lag = rt.lag_samples.get(lag_key)
        if known_lag is None:
            known_lag = lag_samples_from_status(body.get("status"), target)
        lag_samples = [*known_lag, await admin.group_lag(target.group, name, now)]
        verdict = decide_time_lag(lag_samples, partitions, policy, target, now)
        if verdict.grow_to is not None and (grow_to is None or verdict.grow_to > grow_to):
            log.info("topic %s: %s (group %s)", name, verdict.reason, target.group)
            grow_to = verdict.grow_to
        kept = [] if grow_to is not None else lag_samples[-MAX_AUTOSCALING_SAMPLES:]
        rt.lag_samples[lag_key] = kept  # a new partition count starts a new window
        lag_status = lag_samples_to_status(target, kept, verdict)
    if grow_to is None:
        window = samples_to_status(source, samples)
        if lag_status is not None:
            window["timeLag"] = lag_status
        return None, window
    log.info(
        "autoscaling topic %s from %d to %d partitions (%s)", name, partitions, grow_to, source
    )
    await admin.grow(name, grow_to)
    rt.samples.pop(key, None)  # a new partition count starts a new window
    return grow_to, None if lag_status is None else {"timeLag": lag_status}


async def finalize_topic(rt: Runtime, body: Mapping[str, Any]) -> None:
    """Delete the Fjord topic of a FjordTopic being deleted (nothing to do when its
    FjordCluster is gone: the cluster's topics went with it)."""
    cluster = await _topic_cluster(rt, body)
    if cluster is None:
        return
    await (await rt.cluster_admin(cluster)).delete_topic(topic_name(body))
    uid = body["metadata"].get("uid", "")
    rt.samples = {k: v for k, v in rt.samples.items() if not k.startswith(f"{uid}/")}
    rt.lag_samples.pop(f"{uid}/lag", None)


# -- kopf registration ---------------------------------------------------------------------------


def register(
    settings: OperatorSettings | None = None, registry: kopf.OperatorRegistry | None = None
) -> kopf.OperatorRegistry:
    """Register every handler in ``registry`` (a new one when None) and return it."""
    settings = settings or OperatorSettings()
    registry = registry if registry is not None else kopf.OperatorRegistry()
    kube = KubeApi(settings.kube_server, settings.kubeconfig, settings.service_account_dir)
    rt = Runtime(settings, kube)
    group, version = s.GROUP, s.VERSION

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = f"{s.GROUP}/finalizer"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=s.GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=s.GROUP)
        settings.posting.level = logging.WARNING
        if rt.settings.namespaces:
            # Exactly the named namespaces are served. kopf's scanning would list and watch every
            # namespace, a cluster-wide right the chart does not grant: against a real API server
            # kopf retried that for about a minute before the first reconciliation.
            settings.scanning.disabled = True

    @kopf.on.login(registry=registry)
    def kube_login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(rt.kube.login())

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await rt.close()

    def reconciler(
        reconcile: Callable[[Any], Awaitable[Any]], retry_soon: bool
    ) -> Callable[..., Awaitable[None]]:
        """A kopf handler: one reconciliation under the object's lock, its status written; a
        plan that waits for the cluster is retried after retry_delay_s (``retry_soon``: change
        handlers; timers just come back on their interval)."""

        async def handler(body: Any, patch: kopf.Patch, **_: Any) -> None:
            async with rt.lock(body["metadata"]["uid"]):
                plan = await reconcile(body)
            patch.status.update(plan.status)
            if retry_soon and plan.retry:
                raise kopf.TemporaryError(
                    plan.status["conditions"][0]["message"], delay=settings.retry_delay_s
                )

        return handler

    def finalizer(finalize: Callable[[Any], Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        """A kopf delete handler (its finalizer holds the object until it succeeds); an
        unreachable cluster is retried."""

        async def handler(body: Any, **_: Any) -> None:
            async with rt.lock(body["metadata"]["uid"]):
                try:
                    await finalize(body)
                except Exception as exc:
                    if _unreachable(exc):
                        raise kopf.TemporaryError(str(exc), delay=settings.retry_delay_s) from exc
                    raise

        return handler

    def reconcile_on_change_and_timer(
        plural: str, on_change: Any, on_timer: Any, interval_s: float, timer_id: str
    ) -> None:
        for decorate in (kopf.on.create, kopf.on.update, kopf.on.resume):
            decorate(
                group=group,
                version=version,
                plural=plural,
                registry=registry,
                retries=None,
                id="reconcile",
            )(on_change)
        kopf.timer(
            group=group,
            version=version,
            plural=plural,
            registry=registry,
            interval=interval_s,
            initial_delay=interval_s,
            id=timer_id,
        )(on_timer)

    reconcile_on_change_and_timer(
        s.CLUSTER_PLURAL,
        reconciler(lambda body: reconcile_cluster(rt, body), True),
        reconciler(lambda body: reconcile_cluster(rt, body), False),
        settings.cluster_interval_s,
        "cluster-timer",
    )
    reconcile_on_change_and_timer(
        s.TOPIC_PLURAL,
        reconciler(lambda body: reconcile_topic(rt, body), True),
        reconciler(lambda body: reconcile_topic(rt, body, autoscale=True), False),
        settings.topic_interval_s,
        "topic-timer",
    )
    kopf.on.delete(
        group=group, version=version, plural=s.TOPIC_PLURAL, registry=registry, id="delete-topic"
    )(finalizer(lambda body: finalize_topic(rt, body)))
    # Drift (an ACL added or removed behind the operator's back) is corrected on the timer.
    reconcile_on_change_and_timer(
        s.USER_PLURAL,
        reconciler(lambda body: reconcile_user(rt, body), True),
        reconciler(lambda body: reconcile_user(rt, body), False),
        settings.topic_interval_s,
        "user-timer",
    )
    kopf.on.delete(
        group=group, version=version, plural=s.USER_PLURAL, registry=registry, id="delete-user"
    )(finalizer(lambda body: finalize_user(rt, body)))
    return registry


__all__ = [
    "ClusterPlan",
    "FjordAdmin",
    "KubeApi",
    "Runtime",
    "TopicPlan",
    "contains",
    "error_reason",
    "finalize_topic",
    "finalize_user",
    "plan_cluster",
    "reconcile_certificates",
    "reconcile_cluster",
    "reconcile_topic",
    "reconcile_user",
    "register",
    "topic_name",
]
