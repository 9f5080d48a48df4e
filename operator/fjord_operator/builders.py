"""Pure builders: a FjordCluster (its ``metadata`` and ``spec`` as a plain dict) -> the
Kubernetes objects that run it, as plain dicts ready for the API.

Invariants: the output depends only on the input (no clock, no I/O), so applying it twice
changes nothing; every object carries the four ``app.kubernetes.io/*`` labels and a controller
owner reference to the FjordCluster; names follow docs/kubernetes.md (for a cluster ``X``:
``X-broker`` StatefulSet and client Service, ``X-broker-headless``, ``X-controller``,
``X-coordinator`` (+ ``-headless``), ``X-config``, PDBs ``X-broker``/``X-controller``,
``X-etcd`` (StatefulSet, Service and PDB) when managed). The broker id is the pod's
ordinal, parsed from its hostname.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fjord.cluster.topic_config import split_cluster_config
from fjord.errors import ConfigError
from fjord.metadata.etcd import parse_etcd_url
from fjord.security.sasl_sessions import CONNECTIONS_MAX_REAUTH_MS_KEY
from fjord_operator import settings as s
from fjord_operator.listeners import (
    kafka_listeners,
    listener_problems,
    sasl_grpc_door_port,
    uses_named_listeners,
)
from fjord_operator.security import (
    ETCD_ROLE,
    ClusterSecurity,
    cluster_security,
    cluster_security_problems,
    managed_etcd_tls,
    service_secret_name,
)

Obj = dict[str, Any]

#: Kubernetes quantity (the subset a volume size uses), e.g. "10Gi", "500M", "1.5Ti".
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")


# -- names and addresses ------------------------------------------------------------------------


def broker_name(cluster: str) -> str:
    return f"{cluster}-broker"


def broker_headless_name(cluster: str) -> str:
    return f"{cluster}-broker-headless"


def controller_name(cluster: str) -> str:
    return f"{cluster}-controller"


def coordinator_name(cluster: str) -> str:
    return f"{cluster}-coordinator"


def config_map_name(cluster: str) -> str:
    return f"{cluster}-config"


def etcd_name(cluster: str) -> str:
    return f"{cluster}-etcd"


def cluster_id(body: Mapping[str, Any]) -> str:
    """The Fjord cluster id (etcd prefix): ``<namespace>.<name>``, stable across re-creation."""
    meta = body["metadata"]
    return f"{meta.get('namespace', 'default')}.{meta['name']}"


def bootstrap_servers(body: Mapping[str, Any]) -> str:
    """Where the operator reaches the cluster's admin API: the ``fjord.io/bootstrap-servers``
    annotation, else the client Service ``X-broker.N.svc:9092``."""
    meta = body["metadata"]
    annotated = (meta.get("annotations") or {}).get(s.BOOTSTRAP_ANNOTATION, "").strip()
    if annotated:
        return str(annotated)
    return f"{broker_name(meta['name'])}.{meta.get('namespace', 'default')}.svc:{s.BROKER_PORT}"


def broker_metrics_addresses(body: Mapping[str, Any], broker_hosts: Sequence[str]) -> list[str]:
    """Where the autoscaler reads the brokers' per-topic bytes in: the
    ``fjord.io/broker-metrics`` annotation; else, for a cluster the operator runs (no bootstrap
    annotation), each registered broker's host on the metrics port; else none (ingress is then
    measured in records)."""
    annotations = body["metadata"].get("annotations") or {}
    listed = str(annotations.get(s.BROKER_METRICS_ANNOTATION, "")).strip()
    if listed:
        return [a.strip() for a in listed.split(",") if a.strip()]
    if str(annotations.get(s.BOOTSTRAP_ANNOTATION, "")).strip():
        return []
    return [f"{host}:{s.METRICS_PORT}" for host in broker_hosts]


def etcd_url(body: Mapping[str, Any]) -> str:
    """The etcd endpoint services use: the managed etcd's Service (https when TLS is on: see
    :func:`etcd_command`), or the first endpoint as
    ``http://HOST:PORT`` (etcd clients read a bare ``HOST:PORT`` as http) or
    ``https://HOST:PORT`` (TLS clusters only: the services dial it with their own certificate
    as client certificate and the cluster CA as trust, so etcd's server certificate must be
    issued by the cluster CA and etcd must trust it for clients)."""
    etcd = body.get("spec", {}).get("etcd") or {}
    if etcd.get("endpoints"):
        tls, host, port = parse_etcd_url(str(etcd["endpoints"][0]))
        return f"{'https' if tls else 'http'}://{host}:{port}"
    meta = body["metadata"]
    # A managed etcd of a TLS cluster serves https with a certificate of the cluster CA.
    scheme = "https" if managed_etcd_tls(body.get("spec") or {}) else "http"
    return (
        f"{scheme}://{etcd_name(meta['name'])}.{meta.get('namespace', 'default')}.svc:"
        f"{s.ETCD_CLIENT_PORT}"
    )


# -- validation of what the schema cannot check ----------------------------------------------------


def cluster_spec_problems(spec: Mapping[str, Any]) -> list[str]:
    """Why a FjordCluster spec cannot be reconciled (empty: it can). The CRD schema checks
    types and ranges; this checks combinations and values it cannot express."""
    problems: list[str] = []
    brokers = spec.get("brokers") or {}
    replicas = brokers.get("replicas")
    if not isinstance(replicas, int) or replicas < 1:
        problems.append(f"spec.brokers.replicas must be an integer >= 1, got {replicas!r}")
        replicas = None
    etcd = spec.get("etcd") or {}
    has_endpoints, has_managed = bool(etcd.get("endpoints")), "managed" in etcd
    if has_endpoints == has_managed:
        problems.append("spec.etcd needs exactly one of endpoints or managed")
    secure = bool((spec.get("security") or {}).get("tls")) if isinstance(
        spec.get("security"), Mapping) else False
    for endpoint in etcd.get("endpoints") or ():
        try:
            tls, _, _ = parse_etcd_url(str(endpoint))
        except ConfigError as exc:
            problems.append(f"spec.etcd.endpoints: {exc}")
            continue
        if tls and not secure:
            # The services' certificates are their etcd client certificates.
            problems.append(
                f"spec.etcd.endpoints: {endpoint!r}: an https etcd needs spec.security.tls (the "
                "services show their certificates to etcd and trust the cluster CA); expected "
                "an endpoint like http://HOST:PORT"
            )
    if has_managed and (etcd.get("managed") or {}).get("replicas", 1) not in (1, 3):
        problems.append("spec.etcd.managed.replicas must be 1 or 3")
    if has_managed and (etcd.get("managed") or {}).get("tls") is True and not secure:
        problems.append("spec.etcd.managed.tls needs spec.security.tls (the cluster CA signs "
                        "etcd's certificate and the services' client certificates)")
    for where, storage in (
        ("spec.brokers.storage.size", (brokers.get("storage") or {})),
        ("spec.etcd.managed.storage.size", ((etcd.get("managed") or {}).get("storage") or {})),
    ):
        size = storage.get("size")
        if size is not None and not QUANTITY.match(str(size)):
            problems.append(f"{where}: {size!r} is not a Kubernetes quantity such as 10Gi")
    config = {str(k): str(v) for k, v in (brokers.get("config") or {}).items()}
    try:
        split_cluster_config(config)
    except ConfigError as exc:
        problems.append(f"spec.brokers.config: {exc}")
    if replicas is not None:
        for key in ("min.insync.replicas", "default.replication.factor"):
            value = config.get(key)
            if value is not None and value.isdigit() and int(value) > replicas:
                problems.append(
                    f"spec.brokers.config: {key}={value} exceeds the {replicas} brokers"
                )
    problems += cluster_security_problems(spec)
    problems += listener_problems(spec)
    for part in ("controllers", "coordinators"):
        count = (spec.get(part) or {}).get("replicas", 1)
        if not isinstance(count, int) or count < 1:
            problems.append(f"spec.{part}.replicas must be an integer >= 1, got {count!r}")
    return problems


# -- common pieces -------------------------------------------------------------------------------


def config_parts(spec: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """``spec.brokers.config`` (the cluster's server.properties) split into (controllers'
    ``--config``, brokers' ``--config``); see fjord.cluster.topic_config.split_cluster_config.
    Raises ConfigError naming a bad key (cluster_spec_problems reports it first)."""
    config = (spec.get("brokers") or {}).get("config") or {}
    return split_cluster_config({str(k): str(v) for k, v in config.items()})


def _config_args(config: Mapping[str, str]) -> list[str]:
    return [arg for key in sorted(config) for arg in ("--config", f"{key}={config[key]}")]


def labels(cluster: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "fjord",
        "app.kubernetes.io/instance": cluster,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": s.MANAGED_BY,
    }


def selector_labels(cluster: str, component: str) -> dict[str, str]:
    return {k: v for k, v in labels(cluster, component).items() if "managed-by" not in k}


def owner_reference(body: Mapping[str, Any]) -> Obj:
    meta = body["metadata"]
    return {
        "apiVersion": body.get("apiVersion", s.API_VERSION),
        "kind": body.get("kind", s.CLUSTER_KIND),
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(body: Mapping[str, Any], name: str, component: str) -> Obj:
    meta = body["metadata"]
    return {
        "name": name,
        "namespace": meta.get("namespace", "default"),
        "labels": labels(meta["name"], component),
        "ownerReferences": [owner_reference(body)],
    }


def _image(spec: Mapping[str, Any]) -> tuple[str, str]:
    image = spec.get("image") or {}
    repository = image.get("repository", s.DEFAULT_IMAGE_REPOSITORY)
    tag = image.get("tag", s.DEFAULT_IMAGE_TAG)
    return f"{repository}:{tag}", image.get("pullPolicy", s.DEFAULT_PULL_POLICY)


def _env_from_fields(**paths: str) -> list[Obj]:
    return [
        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}
        for name, path in paths.items()
    ]


def _container(
    spec: Mapping[str, Any],
    component: str,
    script: str,
    args: list[str],
    port: int,
    resources: Mapping[str, Any] | None,
    env: list[Obj],
    cluster: str,
    extra_ports: Sequence[Obj] = (),
) -> Obj:
    image, pull_policy = _image(spec)
    sasl_port = sasl_grpc_door_port(spec)
    if sasl_port is not None:
        extra_ports = [*extra_ports, {"name": SASL_GRPC_PORT_NAME, "containerPort": sasl_port,
                                      "protocol": "TCP"}]
    return {
        "name": component,
        "image": image,
        "imagePullPolicy": pull_policy,
        # sh expands the pod's identity (ordinal, uid, ip) into flags; "$@" passes ``args``.
        "command": ["sh", "-c", script, component, *args],
        "envFrom": [{"configMapRef": {"name": config_map_name(cluster)}}],
        "env": env,
        "ports": [
            {"name": "grpc", "containerPort": port, "protocol": "TCP"},
            *extra_ports,
            {"name": "metrics", "containerPort": s.METRICS_PORT, "protocol": "TCP"},
        ],
        # Ready when the gRPC port accepts connections; alive while /metrics answers.
        "readinessProbe": {"tcpSocket": {"port": "grpc"}, "periodSeconds": 5},
        "livenessProbe": {
            "httpGet": {"path": "/metrics", "port": "metrics"},
            "initialDelaySeconds": 30,
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "resources": dict(resources or {}),
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def _pod_security() -> Obj:
    return {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001}


#: The name of the SASL gRPC door's port on pods and Services.
SASL_GRPC_PORT_NAME = "sasl-grpc"


def _kafka_container_ports(spec: Mapping[str, Any]) -> list[Obj]:
    """One container port per Kafka listener, named like it (``kafka`` without
    spec.listeners)."""
    return [{"name": listener.name, "containerPort": listener.port, "protocol": "TCP"}
            for listener in kafka_listeners(spec)]


def _kafka_flags(spec: Mapping[str, Any], host: str) -> str:
    """The Kafka doors of a broker or coordinator pod advertised at ``host`` (shell words):
    without spec.listeners the one door named after its protocol, as before; with it each
    listener under its own name, its protocol in --listener-security-protocol-map."""
    listeners = kafka_listeners(spec)
    named = uses_named_listeners(spec)

    def name(listener: Any) -> str:
        return str(listener.kafka_name if named else listener.protocol)

    flags = (
        "--listeners " + ",".join(f"{name(x)}://0.0.0.0:{x.port}" for x in listeners) + " "
        + '--advertised-listeners "'
        + ",".join(f"{name(x)}://{host}:{x.port}" for x in listeners) + '" '
    )
    if named:
        flags += "--listener-security-protocol-map " + ",".join(
            f"{x.kafka_name}:{x.protocol}" for x in listeners) + " "
    return flags


def _sasl_flags(spec: Mapping[str, Any]) -> str:
    port = sasl_grpc_door_port(spec)
    return "" if port is None else f"--sasl-listen 0.0.0.0:{port} "

# An integer id for a Deployment pod, from the first 7 hex digits of its uid (< 2**28).
_ID_FROM_UID = '$((0x$(echo "$POD_UID" | tr -d - | cut -c1-7)))'
_COMMON_FLAGS = '--etcd "$FJORD_ETCD" --cluster-id "$FJORD_CLUSTER_ID" --metrics-port {metrics}'


def _security(spec: Mapping[str, Any]) -> ClusterSecurity | None:
    """The cluster's ClusterSecurity, None for plaintext (cluster_spec_problems checked it)."""
    return cluster_security(spec)


def kafka_door(spec: Mapping[str, Any]) -> str:
    """The first Kafka-protocol listener's scheme: KAFKA (plaintext), SSL (client
    certificates) or SASL_SSL (SCRAM logins over TLS), from spec.listeners or spec.security."""
    return kafka_listeners(spec)[0].protocol


def _security_flags(spec: Mapping[str, Any]) -> str:
    if _security(spec) is None:
        return ""
    return f"--security-config {s.TLS_MOUNT_DIR}/{s.SERVICE_PROPERTIES_KEY} "


def _mount_tls(pod_spec: Obj, container: Obj, cluster: str, role: str) -> None:
    """Mount the role's TLS Secret read-only at TLS_MOUNT_DIR, files 0440: the kubelet owns
    them as root with the pod's fsGroup (10001, the image's user) as group, so the service
    reads them and no other user does."""
    container.setdefault("volumeMounts", []).append(
        {"name": "tls", "mountPath": s.TLS_MOUNT_DIR, "readOnly": True}
    )
    pod_spec.setdefault("volumes", []).append(
        {"name": "tls", "secret": {"secretName": service_secret_name(cluster, role),
                                   "defaultMode": 0o440}}
    )


# -- the objects ---------------------------------------------------------------------------------


def config_map(body: Mapping[str, Any]) -> Obj:
    """``X-config``: the environment every Fjord container starts with."""
    name = body["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(body, config_map_name(name), "config"),
        "data": {
            "FJORD_CLUSTER_ID": cluster_id(body),
            "FJORD_ETCD": etcd_url(body),
            "FJORD_BOOTSTRAP_SERVERS": bootstrap_servers(body),
        },
    }


def rack_topology_key(spec: Mapping[str, Any]) -> str | None:
    """``spec.brokers.rack.topologyKey`` (None: rack awareness off)."""
    rack = (spec.get("brokers") or {}).get("rack") or {}
    key = rack.get("topologyKey") if isinstance(rack, Mapping) else None
    return str(key) if key else None


def _wait_for_rack_script() -> str:
    """Shell that waits for the pod's ``fjord.io/rack`` annotation (the operator writes it
    from the node's label; the downward API file shows it) and puts ``--rack VALUE`` in front
    of the arguments; gives up after RACK_WAIT_S with a message (the kubelet restarts it).
    The downward API writes each annotation as ``key="value"`` (Go-quoted)."""
    file = f'"${{FJORD_POD_INFO_DIR:-{s.POD_INFO_DIR}}}/annotations"'  # the variable: tests
    key = s.RACK_ANNOTATION.replace(".", r"\.")
    message = (
        f"no {s.RACK_ANNOTATION} annotation on this pod after {s.RACK_WAIT_S} s: the operator "
        "writes it from the node label spec.brokers.rack.topologyKey names (is the operator "
        "running, does the node have the label?)"
    )
    return (
        "waited=0; "
        f"while ! grep -q '^{key}=' {file} 2>/dev/null; do "
        f'if [ "$waited" -ge {s.RACK_WAIT_S} ]; then echo \'{message}\' >&2; exit 1; fi; '
        "sleep 1; waited=$((waited + 1)); done; "
        + r"""rack=$(sed -n 's|^KEY="\(.*\)"$|\1|p' FILE); """.replace("KEY", key).replace(
            "FILE", file
        )
        + 'set -- --rack "$rack" "$@"; '
    )


def broker_pod_annotations(body: Mapping[str, Any]) -> dict[str, str]:
    """Annotations of the broker pod template. ``fjord.io/restart`` is copied from the
    FjordCluster (``kubectl annotate fjc NAME fjord.io/restart=$(date +%s) --overwrite``): a
    new value changes the template, so every broker is restarted safely, one at a time; and
    :func:`etcd_pod_annotations`."""
    annotations = body["metadata"].get("annotations") or {}
    restart = annotations.get(s.RESTART_ANNOTATION)
    out = {s.RESTART_ANNOTATION: str(restart)} if restart is not None else {}
    return {**out, **etcd_pod_annotations(body)}


def etcd_pod_annotations(body: Mapping[str, Any]) -> dict[str, str]:
    """``fjord.io/etcd`` on every service pod template while the managed etcd serves https
    (its URL; see settings.ETCD_ANNOTATION): pods started on its plaintext URL roll onto it."""
    spec = body.get("spec") or {}
    return {s.ETCD_ANNOTATION: etcd_url(body)} if managed_etcd_tls(spec) else {}


def broker_statefulset(
    body: Mapping[str, Any], replicas: int, tls_revision: str | None = None
) -> Obj:
    """``X-broker``: ``replicas`` brokers (the scaling decision's count, not always the
    spec's), ids = ordinals, one PVC each, Parallel pod management."""
    meta, spec = body["metadata"], body.get("spec", {})
    name, namespace = meta["name"], meta.get("namespace", "default")
    brokers = spec.get("brokers") or {}
    storage = brokers.get("storage") or {}
    config_args = _config_args(config_parts(spec)[1])
    pod_host = f"$HOSTNAME.{broker_headless_name(name)}.{namespace}.svc"
    rack_key = rack_topology_key(spec)
    script = (
        (_wait_for_rack_script() if rack_key else "")
        + 'exec fjord broker --id "${HOSTNAME##*-}" '
        f"--listen 0.0.0.0:{s.BROKER_PORT} "
        f'--advertised-host "{pod_host}" '
        + _kafka_flags(spec, pod_host)
        + f"--data-dir {s.BROKER_DATA_DIR} " + _security_flags(spec) + _sasl_flags(spec)
        + _COMMON_FLAGS.format(metrics=s.METRICS_PORT) + ' "$@"'
    )
    container = _container(
        spec, "broker", script, config_args, s.BROKER_PORT, brokers.get("resources"), [], name,
        extra_ports=_kafka_container_ports(spec),
    )
    container["volumeMounts"] = [{"name": "data", "mountPath": s.BROKER_DATA_DIR}]
    if rack_key:
        container["volumeMounts"].append(
            {"name": "pod-info", "mountPath": s.POD_INFO_DIR, "readOnly": True}
        )
    claim_spec: Obj = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": storage.get("size", s.DEFAULT_BROKER_STORAGE)}},
    }
    if storage.get("storageClassName"):
        claim_spec["storageClassName"] = storage["storageClassName"]
    pod_spec: Obj = {
        "securityContext": _pod_security(),
        "terminationGracePeriodSeconds": 60,
        "containers": [container],
    }
    if rack_key:
        pod_spec["volumes"] = [
            {
                "name": "pod-info",
                "downwardAPI": {
                    "items": [
                        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}
                    ]
                },
            }
        ]
        # Spread brokers over the racks where the scheduler can (Strimzi does the same).
        pod_spec["affinity"] = {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": selector_labels(name, "broker")},
                            "topologyKey": rack_key,
                        },
                    }
                ]
            }
        }
    template_meta: Obj = {
        "labels": labels(name, "broker"),
        "annotations": broker_pod_annotations(body),
    }
    if _security(spec) is not None:
        _mount_tls(pod_spec, container, name, "broker")
        if tls_revision:
            # A renewal changes the template; the operator's safe roller (fjord_operator.rolling,
            # issue 19) restarts the out-of-date broker pods one at a time, never below
            # min.insync.replicas, the next once the last is back in every ISR.
            template_meta["annotations"][s.TLS_REVISION_ANNOTATION] = tls_revision
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(body, broker_name(name), "broker"),
        "spec": {
            "replicas": replicas,
            "serviceName": broker_headless_name(name),
            "podManagementPolicy": "Parallel",
            # The operator restarts out-of-date broker pods itself, one at a time and never one
            # that a partition needs for min.insync.replicas (fjord_operator.rolling); the
            # StatefulSet controller's RollingUpdate would only wait for readiness.
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": selector_labels(name, "broker")},
            "template": {
                "metadata": template_meta,
                "spec": pod_spec,
            },
            "volumeClaimTemplates": [
                {"metadata": {"name": "data", "labels": labels(name, "broker")}, "spec": claim_spec}
            ],
        },
    }


def _service(body: Mapping[str, Any], name: str, component: str, port: int, headless: bool) -> Obj:
    cluster = body["metadata"]["name"]
    cluster_spec = body.get("spec") or {}
    # Client doors: the Kafka listeners (brokers and coordinators), the SASL gRPC door (all).
    doors = (
        [{"name": x["name"], "port": x["containerPort"], "targetPort": x["name"],
          "protocol": "TCP"} for x in _kafka_container_ports(cluster_spec)]
        if component in ("broker", "coordinator")
        else []
    )
    sasl_port = sasl_grpc_door_port(cluster_spec)
    if sasl_port is not None:
        doors.append({"name": SASL_GRPC_PORT_NAME, "port": sasl_port,
                      "targetPort": SASL_GRPC_PORT_NAME, "protocol": "TCP"})
    spec: Obj = {
        "selector": selector_labels(cluster, component),
        "ports": [
            {"name": "grpc", "port": port, "targetPort": "grpc", "protocol": "TCP"},
            *doors,
            {"name": "metrics", "port": s.METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
        ],
    }
    if headless:
        spec["clusterIP"] = "None"
        # Brokers find each other (replica fetch) before they are Ready.
        spec["publishNotReadyAddresses"] = True
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(body, name, component),
        "spec": spec,
    }


def _deployment(
    body: Mapping[str, Any],
    component: str,
    command: str,
    port: int,
    tls_revision: str | None = None,
) -> Obj:
    """A controller or coordinator Deployment. With TLS on, pods advertise their dashed IP
    under the role's headless Service (a name their certificate's wildcard SAN covers) and
    the pod template carries the Secret's ``tls_revision``, so a renewal rolls them."""
    meta, spec = body["metadata"], body.get("spec", {})
    name, namespace = meta["name"], meta.get("namespace", "default")
    secure = _security(spec) is not None
    host = (
        f'$(echo "$POD_IP" | tr . -).{name}-{component}-headless.{namespace}.svc'
        if secure
        else "$POD_IP"
    )
    part = spec.get(f"{component}s") or {}
    default = (
        s.DEFAULT_CONTROLLER_REPLICAS
        if component == "controller"
        else s.DEFAULT_COORDINATOR_REPLICAS
    )
    # Coordinators are Kafka nodes too (FindCoordinator names their Kafka listener): they open
    # one, advertised at the pod's IP, like the brokers'.
    kafka = component == "coordinator"
    script = (
        f'exec fjord {command} --id "{_ID_FROM_UID}" --listen 0.0.0.0:{port} '
        f'--advertised-host "{host}" '
        + (
            _kafka_flags(spec, host) + f"--state-dir {s.COORDINATOR_STATE_DIR} "
            if kafka
            else ""
        )
        + _security_flags(spec) + _sasl_flags(spec)
        + _COMMON_FLAGS.format(metrics=s.METRICS_PORT)
        + ' "$@"'
    )
    env = _env_from_fields(POD_UID="metadata.uid", POD_IP="status.podIP")
    # Controllers read the cluster's topic defaults and num.partitions/default.replication.factor;
    # every SASL door shares the brokers' session lifetime (connections.max.reauth.ms).
    controllers_config, brokers_config = config_parts(spec)
    lifetime = {k: v for k, v in brokers_config.items() if k == CONNECTIONS_MAX_REAUTH_MS_KEY}
    args = _config_args(
        {**controllers_config, **lifetime} if component == "controller" else lifetime)
    container = _container(
        spec, component, script, args, port, part.get("resources"), env, name,
        extra_ports=_kafka_container_ports(spec) if kafka else [],
    )
    pod_spec: Obj = {"securityContext": _pod_security(), "containers": [container]}
    if kafka:  # the coordinator: its --state-dir (restarts in seconds after a crash)
        container["volumeMounts"] = [{"name": "state", "mountPath": s.COORDINATOR_STATE_DIR}]
        pod_spec["volumes"] = [{"name": "state", "emptyDir": {}}]
    template_meta: Obj = {"labels": labels(name, component)}
    annotations = etcd_pod_annotations(body)
    if secure:
        _mount_tls(pod_spec, container, name, component)
        if tls_revision:
            annotations[s.TLS_REVISION_ANNOTATION] = tls_revision
    if annotations:
        template_meta["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(body, f"{name}-{component}", component),
        "spec": {
            "replicas": part.get("replicas", default),
            "selector": {"matchLabels": selector_labels(name, component)},
            "template": {
                "metadata": template_meta,
                "spec": pod_spec,
            },
        },
    }


def _pdb(body: Mapping[str, Any], name: str, component: str) -> Obj:
    cluster = body["metadata"]["name"]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(body, name, component),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(cluster, component)},
        },
    }


def etcd_command(body: Mapping[str, Any]) -> list[str]:
    """The managed etcd container's command (argv; ``$(POD_NAME)`` is expanded by the kubelet:
    etcd's image has no shell). With TLS on, as ``fjord local up --secure`` runs etcd
    (fjord.local.etcd): https client and peer URLs, the mounted Secret ``X-etcd-tls``'s
    keystore as certificate and key for both, its ``ca.crt`` (every CA trusted now) as trust,
    client certificates required and only those naming
    :data:`~fjord_operator.settings.ETCD_CLIENT_CERT_HOSTNAME` (Fjord's services, not
    FjordUsers), peers only with etcd's own certificate (``--peer-cert-allowed-cn``); /health
    and /metrics on a plain-http port for the kubelet's probe."""
    meta, spec = body["metadata"], body.get("spec", {})
    name, namespace = meta["name"], meta.get("namespace", "default")
    etcd = etcd_name(name)
    members = int(((spec.get("etcd") or {}).get("managed") or {}).get("replicas", 1))
    secure = managed_etcd_tls(spec)
    scheme = "https" if secure else "http"
    peers = ",".join(
        f"{etcd}-{i}={scheme}://{etcd}-{i}.{etcd}.{namespace}.svc:{s.ETCD_PEER_PORT}"
        for i in range(members)
    )
    host = f"$(POD_NAME).{etcd}.{namespace}.svc"
    command = [
        "etcd",
        "--name=$(POD_NAME)",
        f"--data-dir={s.ETCD_DATA_DIR}",
        f"--listen-client-urls={scheme}://0.0.0.0:{s.ETCD_CLIENT_PORT}",
        f"--advertise-client-urls={scheme}://{host}:{s.ETCD_CLIENT_PORT}",
        f"--listen-peer-urls={scheme}://0.0.0.0:{s.ETCD_PEER_PORT}",
        f"--initial-advertise-peer-urls={scheme}://{host}:{s.ETCD_PEER_PORT}",
        f"--initial-cluster={peers}",
        "--initial-cluster-state=new",
        f"--initial-cluster-token={cluster_id(body)}",
    ]
    if secure:
        keystore = f"{s.ETCD_TLS_MOUNT_DIR}/{s.SERVICE_KEYSTORE_KEY}"
        trust = f"{s.ETCD_TLS_MOUNT_DIR}/{s.CA_CERT_KEY}"
        command += [
            f"--cert-file={keystore}",
            f"--key-file={keystore}",
            f"--trusted-ca-file={trust}",
            "--client-cert-auth",
            f"--client-cert-allowed-hostname={s.ETCD_CLIENT_CERT_HOSTNAME}",
            f"--peer-cert-file={keystore}",
            f"--peer-key-file={keystore}",
            f"--peer-trusted-ca-file={trust}",
            "--peer-client-cert-auth",
            f"--peer-cert-allowed-cn={etcd}",
            f"--listen-metrics-urls=http://0.0.0.0:{s.ETCD_METRICS_PORT}",
        ]
    return command


def with_running_etcd(
    body: Mapping[str, Any], live: Mapping[str, Any] | None
) -> Mapping[str, Any]:
    """``body`` as the builders must read it, given the managed etcd's live StatefulSet
    (``live``, None when there is none): when TLS is on, ``spec.etcd.managed.tls`` is unset and
    a running etcd of more than one member was started with http peer URLs, a copy with
    ``tls: false``: etcd keeps each member's peer URL in its data, so members restarted on
    https would no longer reach each other (one member has no peers: it moves to https with
    its data). Else ``body`` itself."""
    spec = body.get("spec") or {}
    managed = (spec.get("etcd") or {}).get("managed")
    if live is None or not isinstance(managed, Mapping) or "tls" in managed:
        return body
    if not managed_etcd_tls(spec) or int((live.get("spec") or {}).get("replicas") or 0) < 2:
        return body
    pod = ((live.get("spec") or {}).get("template") or {}).get("spec") or {}
    command = [str(a) for c in pod.get("containers") or () for a in c.get("command") or ()]
    if not any(a.startswith("--listen-peer-urls=http://") for a in command):
        return body
    kept = copy.deepcopy(dict(body))
    kept["spec"]["etcd"]["managed"]["tls"] = False
    return kept


def etcd_objects(body: Mapping[str, Any], tls_revision: str | None = None) -> list[Obj]:
    """A managed etcd: headless Service + StatefulSet ``X-etcd`` of 1 or 3 members (none
    when the spec names external endpoints). With TLS on its pods mount ``X-etcd-tls`` and
    the template carries that Secret's ``tls_revision``: a renewed certificate (or a CA
    renewal's new trust) restarts the members through the StatefulSet's RollingUpdate, one at
    a time, the next only once the restarted one reports /health (it rejoined a quorum), so
    3 members keep their quorum throughout."""
    meta, spec = body["metadata"], body.get("spec", {})
    managed = (spec.get("etcd") or {}).get("managed")
    if managed is None:
        return []
    name = meta["name"]
    etcd = etcd_name(name)
    members = int(managed.get("replicas", 1))
    storage = managed.get("storage") or {}
    secure = managed_etcd_tls(spec)
    claim_spec: Obj = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": storage.get("size", s.DEFAULT_ETCD_STORAGE)}},
    }
    if storage.get("storageClassName"):
        claim_spec["storageClassName"] = storage["storageClassName"]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(body, etcd, "etcd"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # members must find each other to form a quorum
            "selector": selector_labels(name, "etcd"),
            "ports": [
                {"name": "client", "port": s.ETCD_CLIENT_PORT, "targetPort": "client"},
                {"name": "peer", "port": s.ETCD_PEER_PORT, "targetPort": "peer"},
            ],
        },
    }
    container: Obj = {
        "name": "etcd",
        "image": s.MANAGED_ETCD_IMAGE,
        "command": etcd_command(body),
        "env": _env_from_fields(POD_NAME="metadata.name"),
        "ports": [
            {"name": "client", "containerPort": s.ETCD_CLIENT_PORT},
            {"name": "peer", "containerPort": s.ETCD_PEER_PORT},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": "client"},
            "periodSeconds": 5,
        },
        "volumeMounts": [{"name": "data", "mountPath": s.ETCD_DATA_DIR}],
    }
    pod_spec: Obj = {"containers": [container]}
    template_meta: Obj = {"labels": labels(name, "etcd")}
    if secure:
        container["ports"].append({"name": "metrics", "containerPort": s.ETCD_METRICS_PORT})
        container["readinessProbe"]["httpGet"]["port"] = "metrics"
        container["volumeMounts"].append(
            {"name": "tls", "mountPath": s.ETCD_TLS_MOUNT_DIR, "readOnly": True})
        # etcd's image runs as root: 0400 keeps the key from any other user.
        pod_spec["volumes"] = [{"name": "tls", "secret": {
            "secretName": service_secret_name(name, ETCD_ROLE), "defaultMode": 0o400}}]
        if tls_revision:
            template_meta["annotations"] = {s.TLS_REVISION_ANNOTATION: tls_revision}
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(body, etcd, "etcd"),
        "spec": {
            "replicas": members,
            "serviceName": etcd,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector_labels(name, "etcd")},
            "template": {"metadata": template_meta, "spec": pod_spec},
            "volumeClaimTemplates": [
                {"metadata": {"name": "data", "labels": labels(name, "etcd")}, "spec": claim_spec}
            ],
        },
    }
    return [service, statefulset]


def cluster_objects(
    body: Mapping[str, Any],
    broker_replicas: int,
    tls_revisions: Mapping[str, str] | None = None,
) -> list[Obj]:
    """Everything a FjordCluster runs on, in apply order (config and etcd first).
    ``broker_replicas``: the StatefulSet size the scaling decision allows now;
    ``tls_revisions``: each role's TLS Secret revision (secure clusters; the Secrets
    themselves are written before, by the handler, from security.plan_certificates)."""
    name = body["metadata"]["name"]
    revisions = tls_revisions or {}
    secure = _security(body.get("spec") or {}) is not None
    controller_headless = (
        [_service(body, f"{controller_name(name)}-headless", "controller", s.CONTROLLER_PORT,
                  True)]
        if secure
        else []
    )
    return [
        config_map(body),
        *etcd_objects(body, revisions.get(ETCD_ROLE)),
        _service(body, broker_headless_name(name), "broker", s.BROKER_PORT, headless=True),
        _service(body, broker_name(name), "broker", s.BROKER_PORT, headless=False),
        broker_statefulset(body, broker_replicas, revisions.get("broker")),
        _service(body, controller_name(name), "controller", s.CONTROLLER_PORT, headless=False),
        *controller_headless,
        _deployment(
            body, "controller", "controller", s.CONTROLLER_PORT, revisions.get("controller")
        ),
        _service(
            body, f"{coordinator_name(name)}-headless", "coordinator", s.COORDINATOR_PORT, True
        ),
        _deployment(
            body, "coordinator", "coordinator", s.COORDINATOR_PORT, revisions.get("coordinator")
        ),
        _pdb(body, broker_name(name), "broker"),
        _pdb(body, controller_name(name), "controller"),
        # A drain, like a roll, takes one etcd member at a time: 3 members keep their quorum.
        *([_pdb(body, etcd_name(name), "etcd")] if etcd_objects(body) else []),
    ]
