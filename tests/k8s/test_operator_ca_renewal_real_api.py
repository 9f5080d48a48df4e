"""The cluster CA renewal (issue 16, Kubernetes) against the REAL API server and controllers,
with real brokers under acks=all load: no acknowledged record lost, never NOT_ENOUGH_REPLICAS.

A secure FjordCluster of 3 brokers and 1 controller whose CA Secret the operator owns (handed
over with an ownerReference to the cluster) and whose CA is inside
``spec.security.clusterCa.renewalDays``. The kubelet harness runs each broker pod as a process
of a local cluster (plain etcd: an https etcd would need its own certificate renewed too) and,
as a Secret volume does, gives the process its pod's ``service.pem`` and ``ca.crt`` from the
role's Secret at start; a new controller pod restarts the local controller on the controller
Secret the same way. The operator renews the CA in its three phases, rolling the brokers with
the safe roller and the controller through its Deployment each time; the test's client plays
an application that re-reads its credentials: the bundle once the new CA is trusted, a
certificate of the new CA once it signs. Checked: every phase seen, every broker serving a
certificate of the new CA at the end and trusting only it, 0 NOT_ENOUGH_REPLICAS, every
acknowledged record read back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fjord.client import AdminClient, NewTopic
from fjord.local.cluster import LocalCluster
from fjord.security import ClientSecurity
from fjord.security.certificates import CertificateAuthority
from fjord.tls import write_private
from fjord_operator import settings as s
from fjord_operator.ca_rotation import issued_by, load_certificate, load_certificates
from tests.helpers import tls_peer
from tests.helpers.acks_all_load import REFUSALS, AcksAllLoad, read_values
from tests.k8s.kube.apiserver import RealKube
from tests.k8s.kube.secret_mounts import (
    SecretMountingKubelet,
    admin_operator,
    broker_bootstrap,
    kubelet_on_the_local_ca,
    ready_brokers,
    ready_cluster,
    secret_data,
    secure_local_cluster,
    wait_logged,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

NAMESPACE, CLUSTER = "fjord-ca-renewal", "ren"
TOPIC, PARTITIONS = "renewed", 6
TIMEOUT_S = 240.0


class Identity:
    """The test's client credentials, as an application re-reading its Secret has them: files
    under a new name each time (fjord.tls caches credentials by their paths)."""

    def __init__(self, directory: Path, cert: bytes, key: bytes, trust: bytes) -> None:
        self.directory = directory
        self.serial = 0
        self.config: dict[str, str] = {}
        self.use(cert, key, trust)

    def use(self, cert: bytes, key: bytes, trust: bytes) -> None:
        self.serial += 1
        paths = {n: self.directory / f"{n}-{self.serial}.pem" for n in ("cert", "key", "ca")}
        write_private(paths["cert"], cert)
        write_private(paths["key"], key)
        write_private(paths["ca"], trust)
        self.config = {"security.protocol": "SSL", "ssl.ca.location": str(paths["ca"]),
                       "ssl.certificate.location": str(paths["cert"]),
                       "ssl.key.location": str(paths["key"])}

    @property
    def files(self) -> tuple[Path, Path, Path]:
        c = self.config
        return (Path(c["ssl.ca.location"]), Path(c["ssl.certificate.location"]),
                Path(c["ssl.key.location"]))


@pytest.fixture(scope="module")
def fjord_local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with secure_local_cluster(tmp_path_factory.mktemp("real-api-ca-renewal"), NAMESPACE,
                              CLUSTER, controllers=1, etcd_tls=False) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def identity(fjord_local: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Identity:
    tls = fjord_local.data_dir / "tls"
    return Identity(tmp_path_factory.mktemp("ca-renewal-client"),
                    (tls / "client.pem").read_bytes(), (tls / "client.key").read_bytes(),
                    (tls / "ca.pem").read_bytes())


@pytest.fixture(scope="module")
def bootstrap(fjord_local: LocalCluster) -> str:
    return broker_bootstrap(fjord_local)


@pytest.fixture(scope="module")
def kubelet(real_kube: RealKube, fjord_local: LocalCluster, bootstrap: str, identity: Identity
            ) -> Iterator[SecretMountingKubelet]:
    def replicas() -> dict[tuple[str, int], tuple[int, ...]]:
        with AdminClient({"bootstrap.servers": bootstrap, **identity.config}) as admin:
            return {(t.name, p.partition): tuple(p.replicas)
                    for t in admin.describe_topics() for p in t.partitions}

    with kubelet_on_the_local_ca(real_kube, fjord_local, NAMESPACE, CLUSTER, replicas) as node:
        yield node


@pytest.fixture(scope="module")
def operator_log(real_kube: RealKube, kubelet: SecretMountingKubelet,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with admin_operator(real_kube, NAMESPACE, tmp_path_factory.mktemp("ca-renewal-operator")
                        ) as log:
        yield log


def _wait(condition: Any, what: str, log: Path) -> Any:
    return wait_logged(condition, what, log, TIMEOUT_S, interval=0.25)


def _secret(kube: RealKube, name: str) -> dict[str, bytes]:
    return secret_data(kube, NAMESPACE, name)


def _cluster(kube: RealKube) -> dict[str, Any]:
    return kube.get_json("fjordcluster", CLUSTER, "-n", NAMESPACE) or {}


def _ready(kube: RealKube) -> bool:
    return ready_cluster(kube, NAMESPACE, CLUSTER) is not None


def _ready_brokers(kube: RealKube) -> set[int]:
    return ready_brokers(kube, NAMESPACE)


class Loads:
    """acks=all load that can switch credentials: each switch stops one producer and starts
    another; acknowledged records and errors add up."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.done: list[AcksAllLoad] = []
        self.current: AcksAllLoad | None = None

    def start(self, config: dict[str, str]) -> None:
        if self.current is not None:
            self.current.stop()
            self.done.append(self.current)
        self.current = AcksAllLoad(self.bootstrap, config, topic=TOPIC)
        self.current.start()

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.done.append(self.current)
            self.current = None

    @property
    def acked(self) -> set[bytes]:
        return set().union(*(load.acked for load in [*self.done, *filter(None, [self.current])]))

    def errors(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for load in [*self.done, *filter(None, [self.current])]:
            for code, n in load.errors.items():
                out[code] = out.get(code, 0) + n
        return out


def test_the_cluster_ca_is_renewed_under_acks_all_load_without_losing_a_record(
    real_kube: RealKube, kubelet: SecretMountingKubelet, operator_log: Path,
    fjord_local: LocalCluster, bootstrap: str, identity: Identity,
) -> None:
    tls = fjord_local.data_dir / "tls"
    old_ca = load_certificate((tls / "ca.pem").read_bytes())
    assert old_ca is not None
    real_kube.kubectl("apply", "-f", "-", stdin=yaml.safe_dump({
        "apiVersion": "fjord.io/v1alpha1", "kind": "FjordCluster",
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE,
                     "annotations": {s.BOOTSTRAP_ANNOTATION: bootstrap}},
        "spec": {"brokers": {"replicas": 3}, "controllers": {"replicas": 1},
                 "coordinators": {"replicas": 1},
                 "etcd": {"endpoints": [fjord_local.etcd_url]},
                 # The local CA has a year left: inside a 370-day window; the new one (800
                 # days) is not, so one renewal runs.
                 "security": {"tls": True,
                              "clusterCa": {"validityDays": 800, "renewalDays": 370}}},
    }))
    _wait(lambda: _ready_brokers(real_kube) == {0, 1, 2} and _ready(real_kube),
          "3 broker pods Ready and the cluster Ready", operator_log)
    status = _cluster(real_kube)["status"]["clusterCa"]
    assert status["managed"] is False and status["expiring"] is True  # supplied: only reported
    with AdminClient({"bootstrap.servers": bootstrap, **identity.config}) as admin:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})])
    loads = Loads(bootstrap)
    loads.start(identity.config)
    try:
        assert loads.current is not None
        loads.current.wait_acked(200)
        loads.current.errors.clear()
        # Handed over: the CA Secret now belongs to the cluster, so the operator renews it.
        uid = _cluster(real_kube)["metadata"]["uid"]
        real_kube.kubectl("patch", "secret", f"{CLUSTER}-cluster-ca", "-n", NAMESPACE,
                          "--type", "merge", "-p", yaml.safe_dump({"metadata": {
                              "ownerReferences": [{
                                  "apiVersion": "fjord.io/v1alpha1", "kind": "FjordCluster",
                                  "name": CLUSTER, "uid": uid, "controller": True}]}}))
        phases: list[str] = []

        def phase_reached(phase: str) -> None:
            """The status names ``phase`` (written after the Secrets of the same step; each
            phase lasts at least one roll of the brokers)."""
            _wait(lambda: _cluster(real_kube)["status"]["clusterCa"]["phase"] == phase,
                  f"status.clusterCa.phase {phase}", operator_log)
            phases.append(phase)

        def trusting_new() -> bytes | None:
            bundle = _secret(real_kube, f"{CLUSTER}-broker-tls").get(s.CA_CERT_KEY, b"")
            return bundle if len(load_certificates(bundle)) == 2 else None

        bundle = _wait(trusting_new, "the brokers' ca.crt holding the old and the new CA",
                       operator_log)
        phase_reached("TrustingNewCa")
        # The application re-reads its Secret: the bundle, its certificate unchanged.
        identity.use((tls / "client.pem").read_bytes(), (tls / "client.key").read_bytes(),
                     bundle)
        fjord_local.client_security = ClientSecurity.from_config(identity.config)
        loads.start(identity.config)

        def new_ca_signs() -> CertificateAuthority | None:
            ca = _secret(real_kube, f"{CLUSTER}-cluster-ca")
            if s.PREVIOUS_CA_CERT_KEY not in ca:
                return None
            return CertificateAuthority.from_pem(ca[s.CA_CERT_KEY], ca[s.CA_KEY_KEY])

        new_ca = _wait(new_ca_signs, "the new CA signing", operator_log)
        phase_reached("ReissuingCertificates")
        cert, key = new_ca.issue("admin", sans=())
        identity.use(cert, key, bundle)  # a FjordUser's re-issued certificate
        fjord_local.client_security = ClientSecurity.from_config(identity.config)
        loads.start(identity.config)

        def renewed() -> bool:
            ca = _secret(real_kube, f"{CLUSTER}-cluster-ca")
            broker = _secret(real_kube, f"{CLUSTER}-broker-tls")
            cluster = _cluster(real_kube)
            status = cluster.get("status") or {}
            return (
                set(ca) == {s.CA_CERT_KEY, s.CA_KEY_KEY}
                and broker.get(s.CA_CERT_KEY) == new_ca.pem()
                and status.get("clusterCa", {}).get("phase") == "Stable"
                and status.get("rolling", {}).get("phase") == "Idle"
                and _ready(real_kube) and _ready_brokers(real_kube) == {0, 1, 2}
            )

        _wait(renewed, "the old CA dropped and the last roll done", operator_log)
        identity.use(cert, key, new_ca.pem())
        fjord_local.client_security = ClientSecurity.from_config(identity.config)
        loads.start(identity.config)
        assert loads.current is not None
        loads.current.wait_acked(100)
    finally:
        loads.stop()
    stops = [e.ordinal for e in kubelet.events if e.action == "stop"]
    summary = (f"errors {loads.errors()}, phases {phases}, kubelet stops {stops}, "
               f"controller restarts {kubelet.controller_restarts}")
    assert phases == ["TrustingNewCa", "ReissuingCertificates"], summary
    assert sorted(stops) == [0, 0, 0, 1, 1, 1, 2, 2, 2], summary  # three rolls of 3 brokers
    assert kubelet.controller_restarts == 3, summary
    for broker, address in fjord_local.broker_addresses.items():
        served = tls_peer.served_certificate(address, *identity.files)
        assert issued_by(served, new_ca.certificate), broker
        assert not issued_by(served, old_ca), broker
    mounted = fjord_local.mounted_tls[("broker", 0)]
    assert (mounted / s.CA_CERT_KEY).read_bytes() == new_ca.pem()  # the old CA is not trusted
    errors = loads.errors()
    for refusal in REFUSALS:
        assert errors.get(refusal, 0) == 0, summary
    missing = loads.acked - read_values(bootstrap, identity.config, topic=TOPIC,
                                        partitions=PARTITIONS)
    assert not missing, f"{len(missing)} acknowledged records not read back; {summary}"
    print(f"CA renewal: {len(loads.acked)} records acknowledged and read back; {summary}")
