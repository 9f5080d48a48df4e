"""Issue 16, Kubernetes, against the REAL API server (the session's ``real_kube``): the operator
keeps a secure FjordCluster's CA and service certificates in Secrets and mounts them into the
pods it builds, and turns FjordUsers into credentials and ACLs on a real secure Fjord cluster.

The Fjord side is a private ``fjord local up --secure --authorization --sasl`` cluster (real
processes, mutual TLS, Kafka's ACLs, a SASL_SSL Kafka door): no kubelet runs the operator's
broker pods here. Its CA is handed to the operator as the cluster CA Secret before the
FjordCluster exists, as a user with their own CA does; the operator adopts it, so the
certificates it issues (the services', its own, the users') are trusted by that cluster.

Proofs: the services' Secrets (CA-signed, service identity, pod-name SANs) and the pods' TLS
wiring; a ``tls`` FjordUser's Secret lets a client produce and consume over mutual TLS, a user
without ACLs is refused; a ``scram-sha-512`` FjordUser's Secret logs a Kafka client in
(confluent-kafka, SASL_SSL); ACL drift is corrected both ways; deleting the users removes their
Secrets, ACLs and SCRAM credentials.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
import yaml
from cryptography.x509.oid import NameOID

from fjord.client import AdminClient, Consumer, NewTopic, Producer
from fjord.errors import ErrorCode, FjordError
from fjord.local.cluster import LocalCluster
from fjord.local.etcd import log_tail
from fjord.security.acls import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePattern,
    ResourceType,
)
from fjord.security.certificates import CertificateAuthority
from fjord.testing.waiting import wait_for
from fjord_operator import settings as s
from fjord_operator.security import certificate_sans, load_certificate, signed_by
from tests.k8s.kube.apiserver import RealKube
from tests.k8s.kube.operator_process import running_operator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NAMESPACE, CLUSTER = "fjord-sec", "sec"
TOPIC = "orders"
WAIT_S = 90.0


class World:
    def __init__(self, kube: RealKube, local: LocalCluster, log: Path, workdir: Path) -> None:
        self.kube, self.local, self.log, self.workdir = kube, local, log, workdir

    def admin(self) -> AdminClient:
        """The local cluster's super user (User:admin of its client.properties)."""
        return AdminClient({"bootstrap.servers": self.local.bootstrap_servers,
                            **self.local.client_config})

    def apply(self, *objects: dict[str, Any]) -> None:
        self.kube.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(list(objects)))

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self.kube.get_json(kind, name, "-n", NAMESPACE)
        return found

    def secret(self, name: str) -> dict[str, bytes] | None:
        found = self.get("secret", name)
        if found is None:
            return None
        return {k: base64.b64decode(v) for k, v in (found.get("data") or {}).items()}

    def wait(self, condition: Any, what: str) -> Any:
        def checked() -> Any:
            return condition()

        try:
            return wait_for(checked, what, WAIT_S)
        except Exception:
            print(log_tail(self.log, lines=60))
            raise

    def ready(self, kind: str, name: str) -> dict[str, Any] | None:
        obj = self.get(kind, name)
        status = (obj or {}).get("status") or {}
        for condition in status.get("conditions") or ():
            if condition["type"] == "Ready" and condition["status"] == "True" and \
                    status.get("observedGeneration") == obj["metadata"]["generation"]:  # type: ignore[index]
                return obj
        return None

    def user_files(self, name: str) -> dict[str, str]:
        """The user's Secret written out as a pod would mount it, and its client.properties
        read with the mount directory replaced by where the files are."""
        data = self.secret(name)
        assert data is not None
        directory = self.workdir / f"mount-{name}"
        directory.mkdir(exist_ok=True)
        for key, value in data.items():
            (directory / key).write_bytes(value)
        text = data[s.USER_PROPERTIES_KEY].decode().replace(s.USER_SECRET_MOUNT_DIR,
                                                            str(directory))
        return dict(line.split("=", 1) for line in text.splitlines()
                    if "=" in line and not line.startswith("#"))


@pytest.fixture(scope="module")
def world(real_kube: RealKube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    workdir = tmp_path_factory.mktemp("fjord-sec")
    local = LocalCluster(workdir / "cluster", brokers=1, coordinators=1,
                         unsafe_etcd_no_fsync=True, secure=True, authorization=True,
                         kafka_sasl=True)
    local.start()
    try:
        with AdminClient({"bootstrap.servers": local.bootstrap_servers,
                          **local.client_config}) as admin:
            admin.create_topics([NewTopic(TOPIC, 1, 1)])
        tls = local.data_dir / "tls"
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        # The user's own CA, handed over before the cluster exists (adopted, never replaced).
        ca_secret = {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": f"{CLUSTER}-cluster-ca", "namespace": NAMESPACE},
            "data": {s.CA_CERT_KEY: base64.b64encode((tls / "ca.pem").read_bytes()).decode(),
                     s.CA_KEY_KEY: base64.b64encode((tls / "ca.key").read_bytes()).decode()},
        }
        cluster = {
            "apiVersion": "fjord.io/v1alpha1", "kind": "FjordCluster",
            "metadata": {"name": CLUSTER, "namespace": NAMESPACE,
                         "annotations": {s.BOOTSTRAP_ANNOTATION: local.bootstrap_servers}},
            "spec": {"brokers": {"replicas": 1}, "etcd": {"endpoints": ["http://etcd:2379"]},
                     "security": {"tls": True, "authorization": True,
                                  "kafkaAuthentication": "scram-sha-512",
                                  "saslGrpcDoor": {"enabled": True}}},
        }
        real_kube.kubectl("apply", "-f", "-",
                          stdin=yaml.safe_dump_all([namespace, ca_secret, cluster]))
        with running_operator(real_kube, NAMESPACE, workdir / "operator",
                              kubeconfig=real_kube.admin_kubeconfig) as log:
            yield World(real_kube, local, log, workdir)
    finally:
        local.stop()


def test_the_operator_keeps_the_service_certificates_in_secrets_and_mounts_them(
    world: World,
) -> None:
    found = world.wait(
        lambda: all(world.secret(f"{CLUSTER}-{r}-tls") for r in
                    ("broker", "controller", "coordinator"))
        and world.get("statefulset", f"{CLUSTER}-broker"),
        "the services' TLS Secrets and the broker StatefulSet",
    )
    assert found
    ca_data = world.secret(f"{CLUSTER}-cluster-ca")
    assert ca_data is not None
    ca = CertificateAuthority.from_pem(ca_data["ca.crt"], ca_data["ca.key"])
    # adopted: still the local cluster's own CA
    assert ca.pem() == (world.local.data_dir / "tls" / "ca.pem").read_bytes()
    for role in ("broker", "controller", "coordinator"):
        data = world.secret(f"{CLUSTER}-{role}-tls")
        assert data is not None
        cert = load_certificate(data["service.pem"])
        assert cert is not None and signed_by(cert, ca)
        assert [a.value for a in cert.subject.get_attributes_for_oid(
            NameOID.ORGANIZATIONAL_UNIT_NAME)] == ["fjord-service"]
        assert f"*.{CLUSTER}-{role}-headless.{NAMESPACE}.svc" in certificate_sans(cert)
        assert b"authorizer.class.name=" in data["security.properties"]
        owners = (world.get("secret", f"{CLUSTER}-{role}-tls") or {})["metadata"][
            "ownerReferences"]
        assert [(o["kind"], o["name"]) for o in owners] == [("FjordCluster", CLUSTER)]
    sts = world.get("statefulset", f"{CLUSTER}-broker")
    assert sts is not None
    pod = sts["spec"]["template"]
    assert {"name": "tls", "secret": {"secretName": f"{CLUSTER}-broker-tls",
                                      "defaultMode": 0o440}} in pod["spec"]["volumes"]
    script = pod["spec"]["containers"][0]["command"][2]
    assert "--security-config /etc/fjord/tls/security.properties" in script
    assert "--listeners SASL_SSL://0.0.0.0:9095" in script
    assert pod["metadata"]["annotations"][s.TLS_REVISION_ANNOTATION]
    headless = world.get("service", f"{CLUSTER}-controller-headless")
    assert headless is not None and headless["spec"]["clusterIP"] == "None"


def test_a_certificate_about_to_expire_is_renewed_and_the_pods_template_changes(
    world: World,
) -> None:
    """A broker certificate valid for one more hour (inside the default 30-day window) is
    replaced by a fresh one of the same CA; the broker pod template's TLS revision follows, which
    is what rolls the brokers (safely, issue 19's roller)."""
    import datetime

    name = f"{CLUSTER}-broker-tls"
    world.wait(lambda: world.secret(name), "the broker Secret")
    data = world.secret(name)
    ca_data = world.secret(f"{CLUSTER}-cluster-ca")
    assert data is not None and ca_data is not None
    ca = CertificateAuthority.from_pem(ca_data["ca.crt"], ca_data["ca.key"])
    current = load_certificate(data["service.pem"])
    assert current is not None
    now = datetime.datetime.now(datetime.UTC)
    cert, key = ca.issue(f"{CLUSTER}-broker", organizational_unit="fjord-service",
                         sans=certificate_sans(current),
                         not_after=now + datetime.timedelta(hours=1))
    expiring = {**data, "service.pem": cert + key}
    world.kube.kubectl("apply", "-f", "-", stdin=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {k: base64.b64encode(v).decode() for k, v in expiring.items()},
    }))

    def renewed() -> dict[str, bytes] | None:
        found = world.secret(name)
        if found is None or found["service.pem"] == expiring["service.pem"]:
            return None
        return found

    fresh = world.wait(renewed, "the expiring broker certificate renewed")
    new = load_certificate(fresh["service.pem"])
    assert new is not None and signed_by(new, ca)
    assert new.not_valid_after_utc > now + datetime.timedelta(days=300)
    from fjord_operator.security import tls_revision

    def template_follows() -> bool:
        sts = world.get("statefulset", f"{CLUSTER}-broker") or {}
        annotations = sts["spec"]["template"]["metadata"].get("annotations") or {}
        return bool(annotations.get(s.TLS_REVISION_ANNOTATION) == tls_revision(fresh))

    world.wait(template_follows, "the broker pod template carrying the new TLS revision")
    assert "broker certificate renewed" in world.log.read_text(errors="replace")


def test_the_operator_administers_the_secure_cluster_with_its_own_certificate(
    world: World,
) -> None:
    """Over mutual TLS with ACLs on, as its own CA-issued identity: the cluster's registered
    brokers in status, and a FjordTopic created in Fjord."""
    world.wait(lambda: ((world.get("fjordcluster", CLUSTER) or {}).get("status") or {}).get(
        "brokers") == 1, "status.brokers from the secure cluster's admin API")
    world.apply({
        "apiVersion": "fjord.io/v1alpha1", "kind": "FjordTopic",
        "metadata": {"name": "payments", "namespace": NAMESPACE},
        "spec": {"cluster": CLUSTER, "partitions": 2, "replicationFactor": 1},
    })
    world.wait(lambda: world.ready("fjordtopic", "payments"), "FjordTopic payments Ready")
    with world.admin() as admin:
        (described,) = admin.describe_topics(["payments"])
    assert len(described.partitions) == 2


def _user(name: str, kind: str, acls: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "fjord.io/v1alpha1", "kind": "FjordUser",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"cluster": CLUSTER, "authentication": {"type": kind},
                 "authorization": {"acls": acls}},
    }


ALICE_ACLS = [
    {"resource": {"type": "topic", "name": TOPIC}, "operations": ["Write", "Read"]},
    {"resource": {"type": "group", "name": "alice-", "patternType": "prefix"},
     "operations": ["Read"]},
]
CAROL_ACLS = [
    {"resource": {"type": "topic", "name": TOPIC}, "operations": ["Write", "Read"]},
    {"resource": {"type": "group", "name": "carol"}, "operations": ["Read"]},
]


def _acls_of(world: World, user: str) -> set[AclBinding]:
    with world.admin() as admin:
        return set(admin.describe_acls(AclBindingFilter(principal=f"User:{user}")))


def _scram(world: World, user: str) -> list[str]:
    with world.admin() as admin:
        try:
            return [i.mechanism for i in
                    admin.describe_user_scram_credentials([user]).get(user, [])]
        except FjordError as exc:
            assert exc.code is ErrorCode.RESOURCE_NOT_FOUND
            return []


@pytest.fixture(scope="module")
def users(world: World) -> dict[str, dict[str, str]]:
    world.apply(_user("alice", "tls", ALICE_ACLS), _user("bob", "tls", []),
                _user("carol", "scram-sha-512", CAROL_ACLS))
    for name in ("alice", "bob", "carol"):
        world.wait(lambda n=name: world.ready("fjorduser", n), f"FjordUser {name} Ready")
    return {name: world.user_files(name) for name in ("alice", "bob", "carol")}


def test_a_tls_users_secret_produces_and_consumes_and_a_user_without_acls_is_refused(
    world: World, users: dict[str, dict[str, str]]
) -> None:
    alice = users["alice"]
    assert alice["security.protocol"] == "SSL"
    secret = world.get("secret", "alice")
    assert secret is not None
    assert [o["kind"] for o in secret["metadata"]["ownerReferences"]] == ["FjordUser"]
    cert = load_certificate(Path(alice["ssl.certificate.location"]).read_bytes())
    assert cert is not None
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == \
        ["alice"]
    config = {"bootstrap.servers": world.local.bootstrap_servers, **alice}
    with Producer({**config, "acks": "all"}) as producer:
        for i in range(10):
            producer.send(TOPIC, value=f"alice-{i}".encode()).result(timeout=30)
    with Consumer({**config, "group.id": "alice-readers", "auto.offset.reset": "earliest"}
                  ) as consumer:
        consumer.subscribe([TOPIC])
        seen: set[bytes] = set()

        def read_all() -> bool:
            seen.update(r.value for r in consumer.poll(timeout=1.0) if r.value is not None)
            return {f"alice-{i}".encode() for i in range(10)} <= seen

        wait_for(read_all, "alice reads what she wrote, in her group", WAIT_S, interval=0)
        consumer.commit()
    bob = {"bootstrap.servers": world.local.bootstrap_servers, **users["bob"]}
    with Producer({**bob, "acks": "all", "retries": 0}) as producer, \
            pytest.raises(FjordError) as refused:
        producer.send(TOPIC, value=b"bob").result(timeout=30)
    assert refused.value.code is ErrorCode.TOPIC_AUTHORIZATION_FAILED


def test_a_scram_users_secret_logs_a_kafka_client_in(
    world: World, users: dict[str, dict[str, str]]
) -> None:
    carol = users["carol"]
    assert carol["security.protocol"] == "SASL_SSL"
    assert carol["sasl.mechanism"] == "SCRAM-SHA-512" and carol["sasl.username"] == "carol"
    assert _scram(world, "carol") == ["SCRAM-SHA-512"]
    config = {"bootstrap.servers": world.local.kafka_bootstrap_servers, **carol}
    producer = confluent_kafka.Producer({**config, "acks": "all"})
    errors: list[Any] = []
    for i in range(5):
        producer.produce(TOPIC, value=f"carol-{i}".encode(),
                         on_delivery=lambda err, _msg: err and errors.append(err))
    assert producer.flush(60) == 0 and errors == []
    wrong = confluent_kafka.Producer({**config, "sasl.password": "not-the-password",
                                      "message.timeout.ms": 5000})
    failures: list[Any] = []
    wrong.produce(TOPIC, value=b"x", on_delivery=lambda err, _msg: failures.append(err))
    wrong.flush(15)
    assert failures and failures[0] is not None
    # The same client.properties logs Fjord's own client in on the SASL gRPC doors; its
    # comments name both doors (in-cluster Service names).
    properties = (world.secret("carol") or {})[s.USER_PROPERTIES_KEY].decode()
    assert f"# Kafka clients (listener kafka): bootstrap.servers={CLUSTER}-broker." in properties
    assert f":{s.SASL_GRPC_PORT}" in properties and "SASL gRPC doors" in properties
    with Producer({**carol, "bootstrap.servers": world.local.sasl_grpc_bootstrap_servers,
                   "acks": "all"}) as fjord_producer:
        fjord_producer.send(TOPIC, value=b"carol-over-the-door").result(timeout=30)


def test_acl_drift_is_corrected_both_ways(
    world: World, users: dict[str, dict[str, str]]
) -> None:
    stray = AclBinding(
        ResourcePattern(ResourceType.TOPIC, "secrets"),
        AccessControlEntry("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW),
    )
    with world.admin() as admin:
        admin.create_acls([stray])  # behind the operator's back
    world.wait(lambda: stray not in _acls_of(world, "alice"), "the stray ACL removed")
    changed = _user("alice", "tls", [*ALICE_ACLS, {
        "resource": {"type": "topic", "name": TOPIC}, "operation": "Write", "type": "deny"}])
    world.apply(changed)
    world.wait(
        lambda: any(b.entry.permission is AclPermissionType.DENY
                    for b in _acls_of(world, "alice")),
        "the Deny from the spec applied",
    )
    assert len(_acls_of(world, "alice")) == 4  # Write, Read, group Read, Deny Write
    world.wait(lambda: world.ready("fjorduser", "alice"), "alice Ready for generation 2")


def _condition(world: World, kind: str, name: str) -> dict[str, Any] | None:
    obj = world.get(kind, name) or {}
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition["type"] == "Error" and condition["status"] == "True":
            return dict(condition)
    return None


def test_what_cannot_be_reconciled_is_named_in_status(world: World) -> None:
    """Bad input loses nothing and says why: a user of a missing cluster, of a plaintext
    cluster, an ACL Kafka refuses (the schema cannot tell), and a cluster CA Secret that is no
    CA; no Secret is written for any of them."""
    plain = {
        "apiVersion": "fjord.io/v1alpha1", "kind": "FjordCluster",
        # no Fjord behind it (port 9 refuses at once): only the users' verdicts matter here
        "metadata": {"name": "plain", "namespace": NAMESPACE,
                     "annotations": {s.BOOTSTRAP_ANNOTATION: "127.0.0.1:9"}},
        "spec": {"brokers": {"replicas": 1}, "etcd": {"endpoints": ["http://etcd:2379"]}},
    }
    broken_ca = {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "broken-cluster-ca", "namespace": NAMESPACE},
        "data": {"ca.crt": base64.b64encode(b"not a certificate").decode()},
    }
    broken = {**plain, "metadata": {**plain["metadata"], "name": "broken"},
              "spec": {**plain["spec"], "security": {"tls": True}}}
    certificates_only = {**plain, "metadata": {**plain["metadata"], "name": "certs-only"},
                         "spec": {**plain["spec"], "security": {"tls": True}}}
    scram_on_certs = _user("scram-on-certs", "scram-sha-512", [])
    scram_on_certs["spec"]["cluster"] = "certs-only"
    # a listener the schema takes but the operator cannot build (plaintext on a TLS cluster)
    bad_listeners = {**plain, "metadata": {**plain["metadata"], "name": "bad-listeners"},
                     "spec": {**plain["spec"], "security": {"tls": True},
                              "listeners": [{"name": "open", "port": 9200,
                                             "authentication": "none"}]}}
    on_bad_listeners = _user("on-bad-listeners", "scram-sha-512", [])
    on_bad_listeners["spec"]["cluster"] = "bad-listeners"
    # a user named like the cluster CA Secret must never replace (or delete) the CA
    ca_name = f"{CLUSTER}-cluster-ca"
    ca_before = world.secret(ca_name)
    squatter = _user(ca_name, "tls", [])
    # ... and a cluster never takes over a service Secret name that belongs to something else
    foreign = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
               "metadata": {"name": "taken-broker-tls", "namespace": NAMESPACE},
               "data": {"app": base64.b64encode(b"someone else's").decode()}}
    taken = {**plain, "metadata": {**plain["metadata"], "name": "taken"},
             "spec": {**plain["spec"], "security": {"tls": True}}}
    nowhere = _user("nowhere", "tls", [])
    nowhere["spec"]["cluster"] = "missing"
    on_plain = _user("on-plain", "tls", [])
    on_plain["spec"]["cluster"] = "plain"
    bad_acl = _user("bad-acl", "tls", [{"resource": {"type": "group", "name": "g"},
                                        "operations": ["Write"]}])
    world.apply(plain, broken_ca, broken, certificates_only, nowhere, on_plain, bad_acl,
                scram_on_certs, squatter, foreign, taken, bad_listeners, on_bad_listeners)
    expected = {
        ("fjorduser", "nowhere"): ("ClusterNotFound", "'missing' does not exist"),
        ("fjorduser", "on-plain"): ("ClusterNotSecure", "spec.security.tls off"),
        ("fjorduser", "bad-acl"): ("InvalidSpec",
                                   "spec.authorization.acls[0]: Group does not take operation"),
        ("fjordcluster", "broken"): ("InvalidClusterCA", "Secret broken-cluster-ca"),
        # a credential no listener of that cluster accepts is refused, not stored and ignored
        ("fjorduser", "scram-on-certs"): ("ScramNotServed", "kafkaAuthentication: tls"),
        ("fjorduser", ca_name): ("SecretNameTaken", f"Secret {ca_name} exists and does not"),
        ("fjordcluster", "taken"): ("SecretNameTaken", "Secret taken-broker-tls exists"),
        ("fjordcluster", "bad-listeners"): ("InvalidSpec", "spec.listeners[0].authentication"),
        ("fjorduser", "on-bad-listeners"): ("ClusterInvalid",
                                            "spec.listeners[0].authentication"),
    }
    for (kind, name), (reason, words) in expected.items():
        condition = world.wait(lambda k=kind, n=name: _condition(world, k, n),
                               f"{kind} {name} in Error")
        assert condition["reason"] == reason and words in condition["message"], condition
    for name in ("nowhere", "on-plain", "bad-acl", "broken-broker-tls", "scram-on-certs",
                 "on-bad-listeners"):
        assert world.get("secret", name) is None, name
    assert world.get("statefulset", "broken-broker") is None  # nothing built on a bad CA
    world.kube.kubectl("delete", "fjorduser", "nowhere", "on-plain", "bad-acl", "scram-on-certs",
                       "on-bad-listeners", ca_name, "-n", NAMESPACE, "--wait=false")
    world.wait(lambda: world.get("fjorduser", ca_name) is None, "the squatting user deleted")
    assert world.secret(ca_name) == ca_before  # the CA untouched throughout
    assert world.secret("taken-broker-tls") == {"app": b"someone else's"}
    world.kube.kubectl("delete", "fjordcluster", "plain", "broken", "certs-only", "taken",
                       "bad-listeners", "-n", NAMESPACE, "--wait=false")


def test_switching_a_user_from_certificate_to_scram_replaces_its_secret(world: World) -> None:
    world.apply(_user("dave", "tls", []))
    world.wait(lambda: world.ready("fjorduser", "dave"), "dave Ready with a certificate")
    assert set(world.secret("dave") or {}) == {"ca.crt", "user.crt", "user.key",
                                              "client.properties"}
    world.apply(_user("dave", "scram-sha-512", []))

    def switched() -> dict[str, bytes] | None:
        data = world.secret("dave")
        ready = world.ready("fjorduser", "dave")
        return data if ready and data and "password" in data else None

    data = world.wait(switched, "dave Ready with a password")
    assert set(data) == {"ca.crt", "password", "client.properties"}  # no certificate left
    assert _scram(world, "dave") == ["SCRAM-SHA-512"]
    world.apply(_user("dave", "tls", []))
    world.wait(lambda: world.ready("fjorduser", "dave") and _scram(world, "dave") == []
               and "user.crt" in (world.secret("dave") or {}),
               "dave back on a certificate, its SCRAM credential deleted")
    assert "password" not in (world.secret("dave") or {})
    world.kube.kubectl("delete", "fjorduser", "dave", "-n", NAMESPACE)


def test_deleting_users_removes_their_secrets_acls_and_credentials(
    world: World, users: dict[str, dict[str, str]]
) -> None:
    assert _acls_of(world, "alice") and _acls_of(world, "carol")
    world.kube.kubectl("delete", "fjorduser", "alice", "bob", "carol", "-n", NAMESPACE,
                       "--wait=false")
    world.wait(lambda: not any(world.get("fjorduser", n) for n in ("alice", "bob", "carol")),
               "the FjordUsers gone (finalizers released)")
    for name in ("alice", "bob", "carol"):
        assert world.get("secret", name) is None, name
        assert _acls_of(world, name) == set(), name
    assert _scram(world, "carol") == []
    log = world.log.read_text(errors="replace")
    assert "Forbidden" not in log, log[-3000:]
