"""The operator's pure security decisions (issue 16, Kubernetes): the cluster CA and service
certificates in Secrets, their renewal window, the pods' TLS wiring, and FjordUser credentials
and ACLs. Real certificates (the ``cryptography`` library), checked as a TLS peer checks them."""

from __future__ import annotations

import base64
import datetime
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from fjord.security.acls import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from fjord.security.certificates import CertificateAuthority, make_ca
from fjord_operator import builders
from fjord_operator import settings as s
from fjord_operator.handlers import plan_cluster
from fjord_operator.security import (
    SCRAM,
    TLS,
    SecuritySpecError,
    certificate_sans,
    cluster_security,
    cluster_security_problems,
    decode_secret,
    diff_acls,
    exact_filter,
    load_certificate,
    plan_certificates,
    plan_user_credentials,
    service_sans,
    signed_by,
    user_acls,
    user_authentication,
)
from tests.helpers.tls_peer import memory_handshake

NOW = datetime.datetime(2026, 11, 25, 22, 0, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)


def cluster_body(**security: Any) -> dict[str, Any]:
    return {
        "apiVersion": "fjord.io/v1alpha1",
        "kind": "FjordCluster",
        "metadata": {"name": "fj", "namespace": "ns", "uid": "uid-1", "generation": 1},
        "spec": {
            "brokers": {"replicas": 3},
            "etcd": {"endpoints": ["http://etcd:2379"]},
            "security": {"tls": True, **security},
        },
    }


def secrets_by_name(objs: list[dict[str, Any]]) -> dict[str, dict[str, bytes]]:
    return {o["metadata"]["name"]: decode_secret(o) or {} for o in objs}


def subject(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> list[str]:
    return [str(a.value) for a in cert.subject.get_attributes_for_oid(oid)]


# -- spec.security -----------------------------------------------------------------------------


def test_plaintext_is_the_default_and_tls_reads_every_field() -> None:
    assert cluster_security({}) is None
    assert cluster_security({"security": {"tls": False}}) is None
    body = cluster_body(authorization=True, superUsers=["User:ops"],
                        certificates={"validityDays": 10, "renewalDays": 2},
                        kafkaAuthentication="scram-sha-512")
    security = cluster_security(body["spec"])
    assert security is not None
    assert security.authorization and security.super_users == ("User:ops",)
    assert security.validity == 10 * DAY and security.renew_before == 2 * DAY
    assert security.kafka_authentication == SCRAM


@pytest.mark.parametrize(
    ("security", "names"),
    [
        ({"authorization": True}, "spec.security.authorization needs spec.security.tls"),
        ({"tls": True, "kafkaAuthentication": "plain"}, "spec.security.kafkaAuthentication"),
        ({"tls": True, "superUsers": ["alice"]}, "spec.security.superUsers"),
        ({"tls": True, "certificates": {"validityDays": 5, "renewalDays": 5}},
         "renewalDays must be an integer >= 0 and below validityDays (5)"),
        ({"tls": True, "certificates": {"validityDays": 0}}, "validityDays must be an integer"),
    ],
)
def test_bad_security_specs_are_refused_naming_the_field(
    security: dict[str, Any], names: str
) -> None:
    spec = {"brokers": {"replicas": 1}, "etcd": {"endpoints": ["e:2379"]}, "security": security}
    problems = cluster_security_problems(spec)
    assert len(problems) == 1 and names in problems[0], problems
    assert any(names in p for p in builders.cluster_spec_problems(spec))
    with pytest.raises(SecuritySpecError, match=r"spec\.security"):
        cluster_security(spec)
    plan = plan_cluster({**cluster_body(), "spec": spec}, None, None, None, {}, frozenset(), NOW)
    assert plan.objects == []  # nothing is changed for an invalid spec
    assert plan.status["conditions"][2]["reason"] == "InvalidSpec"


# -- the CA and the service certificates ---------------------------------------------------------


def test_a_new_secure_cluster_gets_a_ca_and_one_service_certificate_per_role() -> None:
    body = cluster_body(authorization=True, superUsers=["User:ops"])
    security = cluster_security(body["spec"])
    assert security is not None
    plan = plan_certificates(body, security, None, {}, NOW)
    written = secrets_by_name(plan.secrets)
    assert sorted(written) == ["fj-broker-tls", "fj-cluster-ca", "fj-controller-tls",
                               "fj-coordinator-tls"]
    ca = CertificateAuthority.from_pem(written["fj-cluster-ca"]["ca.crt"],
                                       written["fj-cluster-ca"]["ca.key"])
    for obj in plan.secrets:  # owned by the cluster: deleted with it
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert obj["type"] == "Opaque"
    for role in ("broker", "controller", "coordinator"):
        data = written[f"fj-{role}-tls"]
        assert data["ca.crt"] == ca.pem()
        cert = load_certificate(data["service.pem"])
        assert cert is not None and signed_by(cert, ca)
        assert subject(cert, NameOID.COMMON_NAME) == [f"fj-{role}"]
        assert subject(cert, NameOID.ORGANIZATIONAL_UNIT_NAME) == ["fjord-service"]
        assert sorted(certificate_sans(cert)) == sorted(service_sans("fj", "ns", role))
        assert f"*.fj-{role}-headless.ns.svc" in certificate_sans(cert)
        assert cert.not_valid_after_utc == NOW + 365 * DAY
        properties = data["security.properties"].decode()
        assert f"ssl.keystore.location={s.TLS_MOUNT_DIR}/service.pem" in properties
        assert f"ssl.truststore.location={s.TLS_MOUNT_DIR}/ca.crt" in properties
        assert "ssl.client.auth=required" in properties
        assert "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer" \
            in properties
        assert "super.users=User:ops" in properties
        assert set(plan.revisions) == {"broker", "controller", "coordinator"}
    assert plan.renewed == {}  # nothing ran before


def test_the_keystore_serves_tls_that_a_client_verifies_by_pod_and_service_name(
    tmp_path: Any,
) -> None:
    """The broker's Secret, loaded as the services load it (keystore + truststore), completes
    mutual TLS with a client of the cluster CA dialling a broker pod's DNS name or the client
    Service; a name the certificate does not cover is refused."""
    body = cluster_body()
    security = cluster_security(body["spec"])
    assert security is not None
    now = datetime.datetime.now(datetime.UTC)  # a real handshake checks the real clock
    plan = plan_certificates(body, security, None, {}, now)
    written = secrets_by_name(plan.secrets)
    for key in ("service.pem", "ca.crt"):
        (tmp_path / key).write_bytes(written["fj-broker-tls"][key])
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "service.pem")
    server.load_verify_locations(tmp_path / "ca.crt")
    server.verify_mode = ssl.CERT_REQUIRED
    user = plan_user_credentials("alice", TLS, plan.ca, None, now, DAY, datetime.timedelta(0))
    for key in ("user.crt", "user.key"):
        (tmp_path / key).write_bytes(user.data[key])
    client = ssl.create_default_context(cafile=tmp_path / "ca.crt")
    client.load_cert_chain(tmp_path / "user.crt", tmp_path / "user.key")
    memory_handshake(server, client, "fj-broker-2.fj-broker-headless.ns.svc")
    memory_handshake(server, client, "fj-broker.ns.svc")
    with pytest.raises(ssl.SSLCertVerificationError):
        memory_handshake(server, client, "fj-controller.ns.svc")


def test_reconciling_again_keeps_every_secret_byte_for_byte() -> None:
    body = cluster_body()
    security = cluster_security(body["spec"])
    assert security is not None
    first = secrets_by_name(plan_certificates(body, security, None, {}, NOW).secrets)
    roles = {r: first[f"fj-{r}-tls"] for r in ("broker", "controller", "coordinator")}
    again = plan_certificates(body, security, first["fj-cluster-ca"], roles, NOW + 30 * DAY)
    assert again.secrets == [] and again.renewed == {}


def test_certificates_are_renewed_inside_the_window_and_only_then() -> None:
    """Short-lived certificates (validity 3 days, renewed 1 day before expiry): kept until the
    window opens, then reissued by the same CA, and the role is reported for a restart."""
    body = cluster_body(certificates={"validityDays": 3, "renewalDays": 1})
    security = cluster_security(body["spec"])
    assert security is not None
    first = plan_certificates(body, security, None, {}, NOW)
    written = secrets_by_name(first.secrets)
    roles = {r: written[f"fj-{r}-tls"] for r in ("broker", "controller", "coordinator")}
    ca = written["fj-cluster-ca"]
    before = plan_certificates(body, security, ca, roles, NOW + 2 * DAY - datetime.timedelta(
        seconds=1))
    assert before.secrets == []
    due = plan_certificates(body, security, ca, roles, NOW + 2 * DAY)
    renewed = secrets_by_name(due.secrets)
    assert sorted(renewed) == ["fj-broker-tls", "fj-controller-tls", "fj-coordinator-tls"]
    assert set(due.renewed) == {"broker", "controller", "coordinator"}
    assert "expires at" in due.renewed["broker"]
    authority = CertificateAuthority.from_pem(ca["ca.crt"], ca["ca.key"])
    for role in due.renewed:
        cert = load_certificate(renewed[f"fj-{role}-tls"]["service.pem"])
        assert cert is not None and signed_by(cert, authority)
        assert cert.not_valid_after_utc == NOW + 5 * DAY
        assert due.revisions[role] != first.revisions[role]


def test_a_certificate_of_another_ca_or_with_other_names_is_reissued() -> None:
    body = cluster_body()
    security = cluster_security(body["spec"])
    assert security is not None
    written = secrets_by_name(plan_certificates(body, security, None, {}, NOW).secrets)
    roles = {r: dict(written[f"fj-{r}-tls"]) for r in ("broker", "controller", "coordinator")}
    stranger = make_ca("another CA")
    cert, key = stranger.issue("fj-broker", organizational_unit="fjord-service",
                               sans=service_sans("fj", "ns", "broker"))
    roles["broker"]["service.pem"] = cert + key
    cert, key = CertificateAuthority.from_pem(
        written["fj-cluster-ca"]["ca.crt"], written["fj-cluster-ca"]["ca.key"]
    ).issue("fj-controller", organizational_unit="fjord-service", sans=["elsewhere"])
    roles["controller"]["service.pem"] = cert + key
    plan = plan_certificates(body, security, written["fj-cluster-ca"], roles, NOW)
    assert plan.renewed == {"broker": "not signed by the cluster CA",
                            "controller": "other names (SANs)"}


def test_switching_authorization_rewrites_the_config_and_keeps_the_certificate() -> None:
    body = cluster_body()
    security = cluster_security(body["spec"])
    assert security is not None
    written = secrets_by_name(plan_certificates(body, security, None, {}, NOW).secrets)
    roles = {r: written[f"fj-{r}-tls"] for r in ("broker", "controller", "coordinator")}
    with_acls = cluster_security(cluster_body(authorization=True)["spec"])
    assert with_acls is not None
    plan = plan_certificates(body, with_acls, written["fj-cluster-ca"], roles, NOW)
    again = secrets_by_name(plan.secrets)
    assert set(plan.renewed.values()) == {"security settings changed"}
    assert again["fj-broker-tls"]["service.pem"] == roles["broker"]["service.pem"]
    assert b"authorizer.class.name" in again["fj-broker-tls"]["security.properties"]


def test_an_unusable_ca_secret_is_refused_never_overwritten() -> None:
    body = cluster_body()
    security = cluster_security(body["spec"])
    assert security is not None
    other = make_ca("x")
    with pytest.raises(SecuritySpecError, match="fj-cluster-ca: the CA key does not belong"):
        plan_certificates(body, security, {"ca.crt": other.pem(),
                                           "ca.key": make_ca("y").key_pem()}, {}, NOW)
    with pytest.raises(SecuritySpecError, match=r"it needs ca\.crt and ca\.key"):
        plan_certificates(body, security, {"ca.crt": b"garbage"}, {}, NOW)


def test_an_existing_ca_is_adopted() -> None:
    body = cluster_body()
    security = cluster_security(body["spec"])
    assert security is not None
    mine = make_ca("my company's CA")
    plan = plan_certificates(body, security, {"ca.crt": mine.pem(), "ca.key": mine.key_pem()},
                             {}, NOW)
    written = secrets_by_name(plan.secrets)
    assert "fj-cluster-ca" not in written
    cert = load_certificate(written["fj-broker-tls"]["service.pem"])
    assert cert is not None and signed_by(cert, mine)


# -- the pods ------------------------------------------------------------------------------------


def _objects(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    objs = builders.cluster_objects(body, 3, {"controller": "rev-c", "coordinator": "rev-o",
                                              "broker": "rev-b"})
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in objs}


def test_secure_pods_mount_their_role_secret_and_start_with_tls() -> None:
    objs = _objects(cluster_body(authorization=True))
    for kind, role in (("StatefulSet", "broker"), ("Deployment", "controller"),
                       ("Deployment", "coordinator")):
        pod = objs[f"{kind}/fj-{role}"]["spec"]["template"]
        container = pod["spec"]["containers"][0]
        script = container["command"][2]
        assert f"--security-config {s.TLS_MOUNT_DIR}/security.properties" in script
        assert {"name": "tls", "mountPath": s.TLS_MOUNT_DIR, "readOnly": True} in \
            container["volumeMounts"]
        assert {"name": "tls", "secret": {"secretName": f"fj-{role}-tls", "defaultMode": 0o440}} \
            in pod["spec"]["volumes"]
        if role != "controller":
            assert "--listeners SSL://0.0.0.0:9095" in script
            assert "KAFKA://" not in script
        # a renewal changes every role's pod template (brokers: rolled safely, issue 19)
        assert pod["metadata"]["annotations"] == {s.TLS_REVISION_ANNOTATION: {
            "broker": "rev-b", "controller": "rev-c", "coordinator": "rev-o"}[role]}
        if role != "broker":
            # advertised under the headless Service, a name the wildcard SAN covers
            assert f'tr . -).fj-{role}-headless.ns.svc' in script
    assert objs["Service/fj-controller-headless"]["spec"]["clusterIP"] == "None"


def test_scram_clusters_open_a_sasl_ssl_kafka_door_and_plaintext_clusters_stay_as_they_were() -> (
    None
):
    objs = _objects(cluster_body(kafkaAuthentication="scram-sha-512"))
    assert "--listeners SASL_SSL://0.0.0.0:9095" in \
        objs["StatefulSet/fj-broker"]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    plain = cluster_body()
    plain["spec"].pop("security")
    objs = _objects(plain)
    assert "Service/fj-controller-headless" not in objs
    script = objs["StatefulSet/fj-broker"]["spec"]["template"]["spec"]["containers"][0][
        "command"][2]
    assert "--security-config" not in script and "KAFKA://0.0.0.0:9095" in script
    assert "volumes" not in objs["StatefulSet/fj-broker"]["spec"]["template"]["spec"]


# -- FjordUser ---------------------------------------------------------------------------------


def user_spec(kind: str = TLS, acls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"cluster": "fj", "authentication": {"type": kind},
            "authorization": {"acls": acls or []}}


def test_acls_follow_strimzis_fields() -> None:
    spec = user_spec(acls=[
        {"resource": {"type": "topic", "name": "orders"}, "operations": ["Write", "Describe"]},
        {"resource": {"type": "group", "name": "billing-", "patternType": "prefix"},
         "operation": "Read"},
        {"resource": {"type": "cluster"}, "operations": ["IdempotentWrite"], "host": "10.0.0.1"},
        {"resource": {"type": "transactionalId", "name": "tx"}, "operations": ["Write"],
         "type": "deny"},
    ])
    got = {(b.pattern.resource_type, b.pattern.name, b.pattern.pattern_type, b.entry.operation,
            b.entry.permission, b.entry.host, b.entry.principal) for b in user_acls("alice", spec)}
    allow, deny = AclPermissionType.ALLOW, AclPermissionType.DENY
    lit, pre = PatternType.LITERAL, PatternType.PREFIXED
    assert got == {
        (ResourceType.TOPIC, "orders", lit, AclOperation.WRITE, allow, "*", "User:alice"),
        (ResourceType.TOPIC, "orders", lit, AclOperation.DESCRIBE, allow, "*", "User:alice"),
        (ResourceType.GROUP, "billing-", pre, AclOperation.READ, allow, "*", "User:alice"),
        (ResourceType.CLUSTER, "kafka-cluster", lit, AclOperation.IDEMPOTENT_WRITE, allow,
         "10.0.0.1", "User:alice"),
        (ResourceType.TRANSACTIONAL_ID, "tx", lit, AclOperation.WRITE, deny, "*", "User:alice"),
    }


@pytest.mark.parametrize(
    ("acl", "message"),
    [
        ({"resource": {"type": "user", "name": "x"}, "operations": ["Read"]},
         r"acls\[0\].resource.type must be topic, group, cluster or transactionalId"),
        ({"resource": {"type": "topic"}, "operations": ["Read"]},
         r"acls\[0\].resource.name is required"),
        ({"resource": {"type": "topic", "name": "t"}},
         r"acls\[0\] names no operations"),
        ({"resource": {"type": "group", "name": "g"}, "operations": ["Write"]},
         r"acls\[0\]: Group does not take operation Write"),
        ({"resource": {"type": "topic", "name": "t", "patternType": "match"},
          "operations": ["Read"]}, r"patternType must be literal or prefix"),
        ({"resource": {"type": "topic", "name": "t"}, "operations": ["Read"], "type": "maybe"},
         r"acls\[0\].type must be allow or deny"),
        ({"resource": {"type": "topic", "name": "t"}, "operations": ["Fly"]},
         r"unknown AclOperation 'Fly'"),
    ],
)
def test_bad_acls_are_refused_naming_the_entry(acl: dict[str, Any], message: str) -> None:
    with pytest.raises(SecuritySpecError, match=message):
        user_acls("alice", user_spec(acls=[acl]))


def test_bad_authentication_is_refused() -> None:
    assert user_authentication(user_spec(SCRAM)) == SCRAM
    with pytest.raises(SecuritySpecError, match=r"spec\.authentication\.type must be one of"):
        user_authentication({"authentication": {"type": "plain"}})


def test_acl_drift_is_corrected_both_ways_and_deleted_exactly() -> None:
    spec = user_spec(acls=[{"resource": {"type": "topic", "name": "a"},
                            "operations": ["Read", "Write"]}])
    desired = user_acls("alice", spec)
    stray = next(iter(user_acls("alice", user_spec(acls=[
        {"resource": {"type": "topic", "name": "b"}, "operations": ["All"]}]))))
    kept = next(b for b in desired if b.entry.operation is AclOperation.READ)
    changes = diff_acls(desired, frozenset({kept, stray}))
    assert {b.entry.operation for b in changes.create} == {AclOperation.WRITE}
    assert changes.delete == {stray}
    selector = exact_filter(stray)
    assert selector.matches(stray) and not selector.matches(kept)
    assert diff_acls(desired, desired).create == diff_acls(desired, desired).delete == set()


def _authority() -> CertificateAuthority:
    return make_ca("users CA")


def test_a_tls_user_gets_a_certificate_named_after_it_and_a_client_properties() -> None:
    ca = _authority()
    made = plan_user_credentials("alice", TLS, ca, None, NOW, 365 * DAY, 30 * DAY)
    assert made.changed and made.password is None
    cert = load_certificate(made.data["user.crt"])
    assert cert is not None and signed_by(cert, ca)
    assert subject(cert, NameOID.COMMON_NAME) == ["alice"]
    assert subject(cert, NameOID.ORGANIZATIONAL_UNIT_NAME) == []  # never a service identity
    assert made.data["ca.crt"] == ca.pem()
    properties = made.data["client.properties"].decode()
    for line in ("security.protocol=SSL", f"ssl.ca.location={s.USER_SECRET_MOUNT_DIR}/ca.crt",
                 f"ssl.certificate.location={s.USER_SECRET_MOUNT_DIR}/user.crt",
                 f"ssl.key.location={s.USER_SECRET_MOUNT_DIR}/user.key"):
        assert line in properties.splitlines()
    kept = plan_user_credentials("alice", TLS, ca, made.data, NOW + DAY, 365 * DAY, 30 * DAY)
    assert not kept.changed and kept.data == made.data
    renewed = plan_user_credentials("alice", TLS, ca, made.data, NOW + 336 * DAY, 365 * DAY,
                                    30 * DAY)
    assert renewed.changed and renewed.data["user.crt"] != made.data["user.crt"]


def test_a_scram_user_keeps_its_generated_password() -> None:
    ca = _authority()
    made = plan_user_credentials("bob", SCRAM, ca, None, NOW, 365 * DAY, 30 * DAY)
    assert made.changed and made.password and len(made.password) >= 24
    assert made.data["password"] == made.password.encode()
    properties = made.data["client.properties"].decode().splitlines()
    assert "security.protocol=SASL_SSL" in properties
    assert "sasl.mechanism=SCRAM-SHA-512" in properties
    assert "sasl.username=bob" in properties
    assert f"sasl.password={made.password}" in properties
    again = plan_user_credentials("bob", SCRAM, ca, made.data, NOW, 365 * DAY, 30 * DAY)
    assert not again.changed and again.password == made.password
    other = plan_user_credentials("carol", SCRAM, ca, None, NOW, 365 * DAY, 30 * DAY)
    assert other.password != made.password


def test_user_secret_is_owned_by_the_user_and_base64_encoded() -> None:
    from fjord_operator.security import secret

    user = {"apiVersion": "fjord.io/v1alpha1", "kind": "FjordUser",
            "metadata": {"name": "alice", "namespace": "ns", "uid": "u-2"},
            "spec": {"cluster": "fj"}}
    obj = secret(user, "alice", "user", {"password": b"p\x00w"})
    assert obj["data"] == {"password": base64.b64encode(b"p\x00w").decode()}
    assert obj["metadata"]["ownerReferences"][0]["kind"] == "FjordUser"
    assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "fj"


def test_binding_type_is_the_acl_model() -> None:
    (binding,) = user_acls("x", user_spec(acls=[{"resource": {"type": "topic", "name": "t"},
                                                 "operation": "Read"}]))
    assert isinstance(binding, AclBinding)


def test_the_operators_identity_is_reissued_at_half_its_life_into_private_files() -> None:
    import os
    import stat

    from fjord_operator.handlers import OperatorIdentity

    ca = _authority()
    identity = OperatorIdentity()
    try:
        assert stat.S_IMODE(os.stat(identity.directory).st_mode) == 0o700
        now = datetime.datetime.now(datetime.UTC)
        first = identity.client_config(ca, now)
        assert identity.client_config(ca, now + datetime.timedelta(hours=11)) == first
        assert first["security.protocol"] == "SSL"
        cert = load_certificate(Path(first["ssl.certificate.location"]).read_bytes())
        assert cert is not None and signed_by(cert, ca)
        assert subject(cert, NameOID.COMMON_NAME) == ["fjord-operator"]
        assert subject(cert, NameOID.ORGANIZATIONAL_UNIT_NAME) == ["fjord-service"]
        for path in first.values():
            if path.startswith("/"):
                assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        renewed = identity.client_config(ca, now + datetime.timedelta(hours=12))
        assert renewed["ssl.certificate.location"] != first["ssl.certificate.location"]
        other_ca = identity.client_config(make_ca("a new CA"), now)
        assert other_ca["ssl.ca.location"] != renewed["ssl.ca.location"]
    finally:
        identity.remove()
    assert not identity.directory.exists()


def test_an_https_etcd_is_taken_by_a_tls_cluster_and_dialled_as_https() -> None:
    body = cluster_body()
    body["spec"]["etcd"] = {"endpoints": ["https://etcd.infra.svc:2379"]}
    assert builders.cluster_spec_problems(body["spec"]) == []
    assert builders.etcd_url(body) == "https://etcd.infra.svc:2379"
    config = builders.config_map(body)
    assert config["data"]["FJORD_ETCD"] == "https://etcd.infra.svc:2379"
    body["spec"].pop("security")
    (problem,) = builders.cluster_spec_problems(body["spec"])
    assert "an https etcd needs spec.security.tls" in problem

