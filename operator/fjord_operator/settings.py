"""Every default of the operator, defined once: API names, object naming, ports, images,
timer and wait intervals. :class:`OperatorSettings` carries the ones a deployment or a test
may change (the end-to-end tests shorten the intervals)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from fjord.cluster.defaults import DEFAULT_BROKER_PORT
from fjord.errors import ConfigError

# -- the custom resources ------------------------------------------------------------------------

GROUP = "fjord.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CLUSTER_KIND = "FjordCluster"
CLUSTER_PLURAL = "fjordclusters"
TOPIC_KIND = "FjordTopic"
TOPIC_PLURAL = "fjordtopics"
USER_KIND = "FjordUser"
USER_PLURAL = "fjordusers"

#: Annotation on a FjordCluster copied into the broker pod template: changing it restarts every
#: broker, safely and one at a time (as ``kubectl rollout restart`` does for a Deployment).
RESTART_ANNOTATION = "fjord.io/restart"
#: On the service pod templates while the managed etcd serves https: its URL. The pods read
#: ``FJORD_ETCD`` from the ConfigMap at start only, so pods started on a plaintext etcd must
#: restart when it moves to https (an operator upgraded under a secure cluster); the changed
#: template rolls them (brokers through the safe roller).
ETCD_ANNOTATION = "fjord.io/etcd"

#: Annotation the operator puts on a broker pod when spec.brokers.rack is set: the value of
#: the rack topology key's label on the pod's node. The broker reads it (downward API) at start
#: and registers with ``--rack``.
RACK_ANNOTATION = "fjord.io/rack"
#: Where a broker pod sees its own annotations (a downward API volume), and how long its start
#: waits for RACK_ANNOTATION before it exits (the kubelet then starts it again).
POD_INFO_DIR = "/etc/fjord/pod"
RACK_WAIT_S = 300

#: Annotation on a FjordCluster naming the Fjord bootstrap servers the operator talks to
#: (external clusters, tests); without it the client Service ``<name>-broker`` is used.
BOOTSTRAP_ANNOTATION = "fjord.io/bootstrap-servers"
#: Annotation on a FjordCluster: comma-separated HOST:PORT of its brokers' /metrics, where the
#: autoscaler reads per-topic bytes in (external clusters, tests). Without it, and without
#: BOOTSTRAP_ANNOTATION, each registered broker's host on METRICS_PORT is used.
BROKER_METRICS_ANNOTATION = "fjord.io/broker-metrics"
#: Annotation on a FjordTopic: average bytes per record for the autoscaler's records -> bytes
#: conversion (the ingress is measured in records, from log-end offsets).
RECORD_BYTES_ANNOTATION = "fjord.io/average-record-bytes"

#: The value of app.kubernetes.io/managed-by on everything the operator creates.
MANAGED_BY = "fjord-operator"
#: Field manager name for Kubernetes writes.
FIELD_MANAGER = "fjord-operator"

# -- ports and paths ----------------------------------------------------------------------------

#: gRPC port of brokers (Kafka's usual 9092), controllers and coordinators inside pods.
BROKER_PORT = DEFAULT_BROKER_PORT
CONTROLLER_PORT = 9093
COORDINATOR_PORT = 9094
#: Kafka-protocol listener of brokers and coordinators inside pods (``KAFKA://0.0.0.0:9095``,
#: advertised as a broker pod's stable DNS name, a coordinator pod's IP): Kafka clients bootstrap
#: from ``<cluster>-broker.<ns>.svc:9095``. Not Kafka's 9092, the brokers' gRPC port here.
KAFKA_PORT = 9095
#: The SASL gRPC door of every broker, controller and coordinator pod when
#: spec.security.saslGrpcDoor is enabled without a port (Fjord's own SCRAM clients).
SASL_GRPC_PORT = 9097
#: Prometheus /metrics port on every pod (the ServiceMonitor selects the port named "metrics").
METRICS_PORT = 9404
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
#: A managed etcd's plain-http /health and /metrics (``--listen-metrics-urls``) when TLS is on:
#: its client port then requires a client certificate, which the kubelet's probe has none of.
ETCD_METRICS_PORT = 2381
#: Mount point of a broker's PersistentVolume (its data directory).
BROKER_DATA_DIR = "/var/lib/fjord"
ETCD_DATA_DIR = "/var/lib/etcd"
#: A coordinator's --state-dir: an emptyDir, which outlives a crashed container in its pod
#: (kubelet restarts it with the same pod UID, hence the same id) and goes with the pod (a
#: new pod gets a new id, so it has no previous run to take over).
COORDINATOR_STATE_DIR = "/var/lib/fjord-coordinator"

# -- security (issue 16) ---------------------------------------------------------------------

#: Where a service pod mounts its role's TLS Secret (``<cluster>-<role>-tls``): the CA
#: certificate, the service's keystore PEM and its ``--security-config`` file.
TLS_MOUNT_DIR = "/etc/fjord/tls"
#: Where the ``client.properties`` of a FjordUser's Secret expects that Secret to be mounted
#: (the paths inside it point here).
USER_SECRET_MOUNT_DIR = "/etc/fjord-user"
#: Keys of the Secrets the operator writes.
CA_CERT_KEY = "ca.crt"
CA_KEY_KEY = "ca.key"
#: Keys of the cluster CA Secret during a CA renewal (fjord_operator.ca_rotation): the new CA
#: made but not signing yet, then the replaced CA's certificate, trusted until nothing it
#: signed is left.
NEXT_CA_CERT_KEY = "next-ca.crt"
NEXT_CA_KEY_KEY = "next-ca.key"
PREVIOUS_CA_CERT_KEY = "previous-ca.crt"
SERVICE_KEYSTORE_KEY = "service.pem"
#: Where a managed etcd pod mounts its Secret ``<cluster>-etcd-tls`` (``ca.crt`` and the
#: ``service.pem`` keystore, its server, peer and client certificate with its key).
ETCD_TLS_MOUNT_DIR = "/etc/etcd/tls"
#: The name a client certificate must carry for a managed etcd to take it
#: (``--client-cert-allowed-hostname``): every certificate the operator issues to a Fjord
#: process (services and etcd itself) names ``localhost`` (probes and local tools dial it);
#: FjordUser and operator certificates carry no names, so a FjordUser's certificate, though
#: of the same cluster CA, never opens etcd.
ETCD_CLIENT_CERT_HOSTNAME = "localhost"
SERVICE_PROPERTIES_KEY = "security.properties"
USER_CERT_KEY = "user.crt"
USER_KEY_KEY = "user.key"
USER_PASSWORD_KEY = "password"
USER_PROPERTIES_KEY = "client.properties"
#: Annotation on a role's TLS Secret and on the pod template it restarts: a digest of what the
#: Secret holds, so pods started before a renewal are told apart from the ones after it.
TLS_REVISION_ANNOTATION = "fjord.io/tls-revision"
#: The operator's own client certificate (issued by the cluster CA, kept in memory and in a
#: private temporary directory): it carries the service identity, as the operator holds the
#: CA key anyway and must administer topics, ACLs and credentials on a cluster with ACLs on.
OPERATOR_COMMON_NAME = "fjord-operator"
#: Defaults of spec.security.clusterCa: validity of a cluster CA the operator makes, and how
#: long before its end the operator renews it (Strimzi's clusterCa validityDays/renewalDays).
CA_VALIDITY_DAYS = 5 * 365
DEFAULT_CA_RENEWAL_DAYS = 30
#: Defaults of spec.security.certificates: leaf validity, renewed this long before expiry.
DEFAULT_CERT_VALIDITY_DAYS = 365
DEFAULT_CERT_RENEWAL_DAYS = 30
#: The operator's own certificate is short-lived and re-issued at half its life.
OPERATOR_CERT_VALIDITY_HOURS = 24
#: Length of a generated SCRAM password (URL-safe characters).
SCRAM_PASSWORD_BYTES = 24

# -- images and sizes ---------------------------------------------------------------------------

DEFAULT_IMAGE_REPOSITORY = "fjord/fjord"
DEFAULT_IMAGE_TAG = "0.1.0"
DEFAULT_PULL_POLICY = "IfNotPresent"
#: Image of a managed etcd (the etcd project's own image).
MANAGED_ETCD_IMAGE = "gcr.io/etcd-development/etcd:v3.5.17"
DEFAULT_BROKER_STORAGE = "10Gi"
DEFAULT_ETCD_STORAGE = "1Gi"
DEFAULT_CONTROLLER_REPLICAS = 2
DEFAULT_COORDINATOR_REPLICAS = 2
#: Replication factor of ``__consumer_offsets`` where brokers allow (DESIGN.md: 3).
OFFSETS_TOPIC_REPLICATION_FACTOR = 3

# -- autoscaling ------------------------------------------------------------------------------

DEFAULT_STABILIZATION_WINDOW_S = 300
#: Bytes per record assumed when the brokers' metrics cannot be read and ingress is measured in
#: records (log-end offsets), unless the FjordTopic carries RECORD_BYTES_ANNOTATION.
DEFAULT_AVERAGE_RECORD_BYTES = 1024
#: Most ingress samples kept in a FjordTopic's ``status.autoscaling.samples`` (the CRD's
#: ``maxItems``): a longer window merges its oldest samples (see decisions.bound_samples), so the
#: status stays a few kilobytes whatever the window and the timer interval.
MAX_AUTOSCALING_SAMPLES = 256


@dataclass(frozen=True, slots=True)
class OperatorSettings:
    """What a deployment or a test tunes. Invariants: intervals > 0; ``namespaces`` empty
    means every namespace (cluster-wide).

    ``cluster_interval_s``: period of the FjordCluster timer (drives scaling waits and status).
    ``topic_interval_s``: period of the FjordTopic timer (drift correction, autoscaling samples).
    ``retry_delay_s``: delay of a kopf retry while a step waits for the cluster.
    ``admin_timeout_s``: bound of each Fjord admin call.
    ``kube_server``: Kubernetes API URL replacing the one of the login below (a port-forward,
    a proxy); None keeps it.
    ``kubeconfig``: kubeconfig file to log in with; None: in-cluster service account, else
    ``KUBECONFIG`` / ``~/.kube/config`` (fjord_operator.login).
    ``service_account_dir``: where the pod's service account (token, ca.crt, namespace) is
    mounted; None: Kubernetes' own path (tests point it elsewhere).
    """

    namespaces: tuple[str, ...] = ()
    cluster_interval_s: float = 30.0
    topic_interval_s: float = 60.0
    retry_delay_s: float = 10.0
    admin_timeout_s: float = 30.0
    kube_server: str | None = None
    kubeconfig: str | None = None
    service_account_dir: str | None = None
    average_record_bytes: int = DEFAULT_AVERAGE_RECORD_BYTES
    extra: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("cluster_interval_s", "topic_interval_s", "retry_delay_s", "admin_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"operator setting {name} must be > 0, got {getattr(self, name)}")
        if self.average_record_bytes < 1:
            raise ConfigError(
                f"operator setting average_record_bytes must be >= 1, got "
                f"{self.average_record_bytes}"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OperatorSettings:
        """Settings from ``FJORD_OPERATOR_*`` variables (e.g. FJORD_OPERATOR_NAMESPACES=a,b,
        FJORD_OPERATOR_CLUSTER_INTERVAL_S=10); unset ones keep their defaults."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(f"FJORD_OPERATOR_{f.name.upper()}")
            if raw is None or f.name == "extra":
                continue
            try:
                if f.name == "namespaces":
                    values[f.name] = tuple(n.strip() for n in raw.split(",") if n.strip())
                elif f.name in ("kube_server", "kubeconfig", "service_account_dir"):
                    values[f.name] = raw or None
                elif f.name == "average_record_bytes":
                    values[f.name] = int(raw)
                else:
                    values[f.name] = float(raw)
            except ValueError as exc:
                raise ConfigError(
                    f"FJORD_OPERATOR_{f.name.upper()}={raw!r} is not a valid value"
                ) from exc
        return replace(cls(), **values)  # type: ignore[arg-type]
