"""A certificate rotation keeps every acknowledged record (issue 16, Kubernetes).

No kubelet runs broker pods here, so the rotation runs against local processes restarted the
way the operator restarts pods: a secure cluster of 3 brokers (real processes, mutual TLS) whose
brokers start from the certificate the operator's pure planner issued
(:func:`fjord_operator.security.plan_certificates`, short-lived: 3 days, renewed 2 days before
expiry, issued 2 days ago, so due now). Each broker's keystore file is what the role's Secret
mount would be. At "now" the planner renews the broker certificate; the new keystore is written
where every broker's ``--security-config`` points (a Secret volume's update), and the safe
roller the operator uses (:func:`fjord_operator.rolling.roll_brokers`, issue 19) restarts the
brokers one at a time (SIGTERM, started again on the same data, as a deleted pod comes back),
under acks=all load over mutual TLS (RF 3, min.insync.replicas 2, no client retries).

Proof: every broker serves the renewed certificate afterwards, no produce was refused with
NOT_ENOUGH_REPLICAS, and every acknowledged record is read back.
"""

from __future__ import annotations

import asyncio
import datetime
import signal
import time
from pathlib import Path

import pytest
from cryptography import x509

from fjord.client import AdminClient, NewTopic
from fjord.cluster.rolling_restart import RollAction
from fjord.local.certs import LocalPki, write_private
from fjord.local.cluster import LocalCluster
from fjord.testing.waiting import wait_for
from fjord_operator import settings as s
from fjord_operator.handlers import FjordAdmin
from fjord_operator.rolling import roll_brokers
from fjord_operator.security import (
    ClusterSecurity,
    decode_secret,
    load_certificate,
    plan_certificates,
)
from tests.helpers import tls_peer
from tests.helpers.acks_all_load import PARTITIONS, REFUSALS, TOPIC, AcksAllLoad, read_values

BROKERS = 3
DAY = datetime.timedelta(days=1)
#: Short-lived certificates, as a test may issue them: 3 days, renewed 2 days before expiry.
SHORT = ClusterSecurity(authorization=False, kafka_authentication="tls", super_users=(),
                        validity=3 * DAY, renew_before=2 * DAY)
BODY = {
    "apiVersion": "fjord.io/v1alpha1", "kind": "FjordCluster",
    "metadata": {"name": "fj", "namespace": "ns", "uid": "uid-rotation"},
    "spec": {"brokers": {"replicas": BROKERS}, "etcd": {"endpoints": ["http://e:2379"]},
             "security": {"tls": True}},
}


def served_certificate(address: str, tls_dir: Path) -> x509.Certificate:
    """The certificate a broker's gRPC door presents (a TLS handshake as User:admin)."""
    return tls_peer.served_certificate(
        address, tls_dir / "ca.pem", tls_dir / "client.pem", tls_dir / "client.key"
    )


def write_broker_keystores(tls_dir: Path, keystore: bytes) -> None:
    """The broker role's Secret as its pods see it: every broker's keystore file."""
    for broker in range(BROKERS):
        write_private(tls_dir / f"broker-{broker}.pem", keystore)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_certificate_rotation_rolls_the_brokers_and_keeps_every_acknowledged_record(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "cluster"
    pki = LocalPki(data_dir)  # the cluster CA (the operator's CA Secret)
    ca_data = {s.CA_CERT_KEY: pki.ca.pem(), s.CA_KEY_KEY: pki.ca.key_pem()}
    now = datetime.datetime.now(datetime.UTC)
    first = plan_certificates(BODY, SHORT, ca_data, {}, now - 2 * DAY)
    issued = {o["metadata"]["name"]: decode_secret(o) for o in first.secrets}
    old_data = issued["fj-broker-tls"]
    assert old_data is not None
    old = load_certificate(old_data[s.SERVICE_KEYSTORE_KEY])
    assert old is not None and old.not_valid_after_utc - now < DAY  # expires within a day
    write_broker_keystores(pki.directory, old_data[s.SERVICE_KEYSTORE_KEY])

    cluster = LocalCluster(data_dir, brokers=BROKERS, coordinators=0, unsafe_etcd_no_fsync=True,
                           config={"min.insync.replicas": "2"}, secure=True)
    with cluster:
        bootstrap, client = cluster.bootstrap_servers, cluster.client_config
        for broker, address in cluster.broker_addresses.items():
            assert served_certificate(address, pki.directory).serial_number == \
                old.serial_number, broker
        with AdminClient({"bootstrap.servers": bootstrap, **client}) as admin:
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})])
        load = AcksAllLoad(bootstrap, client)
        load.start()
        try:
            wait_for(lambda: len(load.acked) >= 200 or load.crashed, "200 records acknowledged",
                     60)
            assert load.crashed is None
            load.errors.clear()
            acked_before = len(load.acked)

            # The operator's reconciliation at "now": the broker certificate is due.
            roles = {r: issued[f"fj-{r}-tls"] for r in ("broker", "controller", "coordinator")}
            renewal = plan_certificates(BODY, SHORT, ca_data, roles, now)
            assert set(renewal.renewed) == {"broker", "controller", "coordinator"}
            assert "expires at" in renewal.renewed["broker"]
            assert renewal.revisions["broker"] != first.revisions["broker"]
            (new_secret,) = [o for o in renewal.secrets if o["metadata"]["name"] == "fj-broker-tls"]
            new_data = decode_secret(new_secret)
            assert new_data is not None
            new = load_certificate(new_data[s.SERVICE_KEYSTORE_KEY])
            assert new is not None and new.serial_number != old.serial_number
            write_broker_keystores(pki.directory, new_data[s.SERVICE_KEYSTORE_KEY])

            def restart_broker(broker: int) -> None:
                cluster.kill("broker", broker, signal.SIGTERM)  # the pod deleted
                cluster.start_broker(broker)  # ... and back, mounting the renewed Secret

            async def restart(broker: int) -> None:
                await asyncio.to_thread(restart_broker, broker)

            async def roll() -> list:
                admin = FjordAdmin(bootstrap, 10.0, client)
                try:
                    return await roll_brokers(admin, list(range(BROKERS)), restart,
                                              timeout_s=150)
                finally:
                    await asyncio.to_thread(admin.close)

            started = time.monotonic()
            steps = asyncio.run(roll())
            roll_s = time.monotonic() - started
            acked_during = len(load.acked) - acked_before
            wait_for(lambda: len(load.acked) >= acked_before + acked_during + 100,
                     "100 more records acknowledged after the rotation", 60)
        finally:
            load.stop()
        summary = (f"rotation roll {roll_s:.1f} s, {acked_during} records acknowledged during "
                   f"it, errors {dict(load.errors)}; steps: "
                   + " | ".join(step.reason for step in steps))
        print(summary, flush=True)
        assert sorted(st.broker for st in steps if st.action is RollAction.RESTART) == \
            list(range(BROKERS)), summary
        for broker, address in cluster.broker_addresses.items():
            assert served_certificate(address, pki.directory).serial_number == \
                new.serial_number, broker
        for refusal in REFUSALS:
            assert load.errors[refusal] == 0, summary
        assert acked_during > 0, summary
        missing = load.acked - read_values(bootstrap, client)
        assert not missing, f"{len(missing)} acknowledged records not read back; {summary}"
