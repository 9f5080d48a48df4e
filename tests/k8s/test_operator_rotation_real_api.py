"""Certificate renewal rolls real broker pods, safely, and the restarted brokers serve the new
certificate (issue 16, Kubernetes), against the REAL API server and controllers.

A secure FjordCluster of 3 brokers (mutual TLS): the real StatefulSet controller creates the
pods; the kubelet harness (:class:`RealKubelet`) runs each broker as a process of a secure
local cluster whose CA is the FjordCluster's (handed over as its CA Secret), and, as a kubelet
mounts a Secret volume, starts each broker on its pod's ``<cluster>-broker-tls`` Secret
(tests/k8s/kube/secret_mounts.py). The broker Secret is then replaced by one
whose certificate expires within the hour: the operator renews it, the broker pod template's
TLS revision changes, and the operator's safe roller (issue 19) deletes the pods one at a
time; the StatefulSet controller recreates them and the harness starts each broker on the
renewed Secret. Under acks=all load over mutual TLS (RF 3, min.insync.replicas 2, no client
retries): every broker serves the renewed certificate, no NOT_ENOUGH_REPLICAS, every
acknowledged record is read back.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fjord.client import AdminClient, NewTopic
from fjord.local.cluster import LocalCluster
from fjord.security.certificates import CertificateAuthority
from fjord_operator import settings as s
from fjord_operator.security import certificate_sans, load_certificate
from tests.helpers import tls_peer
from tests.helpers.acks_all_load import REFUSALS, AcksAllLoad, read_values
from tests.k8s.kube.apiserver import RealKube
from tests.k8s.kube.secret_mounts import (
    SecretMountingKubelet,
    admin_operator,
    broker_bootstrap,
    broker_pods,
    kubelet_on_the_local_ca,
    ready_brokers,
    ready_cluster,
    secret_data,
    secure_local_cluster,
    wait_logged,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(360)]

NAMESPACE, CLUSTER = "fjord-rotation", "rot"
TOPIC, PARTITIONS = "rotated", 6
TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def fjord_local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with secure_local_cluster(tmp_path_factory.mktemp("real-api-rotation"), NAMESPACE,
                              CLUSTER) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def bootstrap(fjord_local: LocalCluster) -> str:
    return broker_bootstrap(fjord_local)


@pytest.fixture(scope="module")
def kubelet(real_kube: RealKube, fjord_local: LocalCluster, bootstrap: str
            ) -> Iterator[SecretMountingKubelet]:
    with AdminClient({"bootstrap.servers": bootstrap, **fjord_local.client_config}) as client:

        def replicas() -> dict[tuple[str, int], tuple[int, ...]]:
            return {(t.name, p.partition): tuple(p.replicas)
                    for t in client.describe_topics() for p in t.partitions}

        with kubelet_on_the_local_ca(real_kube, fjord_local, NAMESPACE, CLUSTER,
                                     replicas) as node:
            yield node


@pytest.fixture(scope="module")
def operator_log(real_kube: RealKube, kubelet: SecretMountingKubelet,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with admin_operator(real_kube, NAMESPACE, tmp_path_factory.mktemp("rotation-operator")
                        ) as log:
        yield log


def _wait(condition: Any, what: str, log: Path) -> Any:
    return wait_logged(condition, what, log, TIMEOUT_S)


def _broker_pods(kube: RealKube) -> dict[int, dict[str, Any]]:
    return broker_pods(kube, NAMESPACE)


def _ready_brokers(kube: RealKube) -> set[int]:
    return ready_brokers(kube, NAMESPACE)


def _cluster_ready(kube: RealKube) -> dict[str, Any] | None:
    return ready_cluster(kube, NAMESPACE, CLUSTER)


def _broker_keystore(kube: RealKube) -> dict[str, bytes]:
    return secret_data(kube, NAMESPACE, f"{CLUSTER}-broker-tls")


def test_a_renewed_certificate_rolls_the_broker_pods_safely_onto_the_new_secret(
    real_kube: RealKube, kubelet: SecretMountingKubelet, operator_log: Path,
    fjord_local: LocalCluster, bootstrap: str,
) -> None:
    client = fjord_local.client_config
    tls = fjord_local.data_dir / "tls"
    real_kube.kubectl("apply", "-f", "-", stdin=yaml.safe_dump({
        "apiVersion": "fjord.io/v1alpha1", "kind": "FjordCluster",
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE,
                     "annotations": {s.BOOTSTRAP_ANNOTATION: bootstrap}},
        "spec": {"brokers": {"replicas": 3}, "controllers": {"replicas": 1},
                 "coordinators": {"replicas": 1},
                 # the local cluster's etcd: https, its certificate from the same CA (the
                 # harness's brokers dial it with the Secret's keystore as client certificate)
                 "etcd": {"endpoints": [fjord_local.etcd_url]},
                 "security": {"tls": True}},
    }))
    _wait(lambda: _ready_brokers(real_kube) == {0, 1, 2} and _cluster_ready(real_kube),
          "3 broker pods Ready and the cluster Ready", operator_log)
    assert fjord_local.etcd_url.startswith("https://")
    config = real_kube.get_json("configmap", f"{CLUSTER}-config", "-n", NAMESPACE)
    assert config["data"]["FJORD_ETCD"] == fjord_local.etcd_url.rstrip("/")
    with AdminClient({"bootstrap.servers": bootstrap, **client}) as admin:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})])
    before = {i: p["metadata"]["uid"] for i, p in _broker_pods(real_kube).items()}
    stops_before = len([e for e in kubelet.events if e.action == "stop"])
    load = AcksAllLoad(bootstrap, client, topic=TOPIC)
    load.start()
    try:
        load.wait_acked(200)
        load.errors.clear()
        # A broker certificate valid one more hour: inside the renewal window.
        data = _broker_keystore(real_kube)
        ca = CertificateAuthority.from_pem((tls / "ca.pem").read_bytes(),
                                           (tls / "ca.key").read_bytes())
        current = load_certificate(data[s.SERVICE_KEYSTORE_KEY])
        assert current is not None
        cert, key = ca.issue(
            f"{CLUSTER}-broker", organizational_unit="fjord-service",
            sans=certificate_sans(current),
            not_after=datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1),
        )
        expiring = cert + key
        real_kube.kubectl("apply", "-f", "-", stdin=yaml.safe_dump({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": f"{CLUSTER}-broker-tls", "namespace": NAMESPACE},
            "data": {k: base64.b64encode(expiring if k == s.SERVICE_KEYSTORE_KEY else v).decode()
                     for k, v in data.items()},
        }))

        def rolled() -> bool:
            pods = _broker_pods(real_kube)
            cluster = _cluster_ready(real_kube)
            renewed = _broker_keystore(real_kube).get(s.SERVICE_KEYSTORE_KEY)
            return (
                renewed not in (None, expiring)
                and all(pods.get(i, {}).get("metadata", {}).get("uid") not in (None, before[i])
                        for i in before)
                and _ready_brokers(real_kube) == {0, 1, 2}
                and cluster is not None
                and (cluster.get("status") or {}).get("rolling", {}).get("phase") == "Idle"
            )

        _wait(rolled, "the certificate renewed and every broker pod replaced", operator_log)
        load.wait_acked(100)
    finally:
        load.stop()
    stops = [e for e in kubelet.events if e.action == "stop"][stops_before:]
    summary = f"errors {dict(load.errors)}, kubelet stops {[e.ordinal for e in stops]}"
    assert sorted(e.ordinal for e in stops) == [0, 1, 2], summary
    renewed = load_certificate(_broker_keystore(real_kube)[s.SERVICE_KEYSTORE_KEY])
    assert renewed is not None
    assert renewed.not_valid_after_utc > datetime.datetime.now(datetime.UTC) + \
        datetime.timedelta(days=300)
    for broker, address in fjord_local.broker_addresses.items():
        served = tls_peer.served_certificate(address, tls / "ca.pem", tls / "client.pem",
                                             tls / "client.key")
        assert served.serial_number == renewed.serial_number, broker
    for refusal in REFUSALS:
        assert load.errors[refusal] == 0, summary
    missing = load.acked - read_values(bootstrap, client, topic=TOPIC, partitions=PARTITIONS)
    assert not missing, f"{len(missing)} acknowledged records not read back; {summary}"
