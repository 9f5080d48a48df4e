"""The managed etcd of a TLS FjordCluster (issue 16): its certificate in the security plan
(issued, kept, renewed, carried through a cluster-CA renewal) and the StatefulSet that runs it
(the etcd command as the kubelet would exec it, its mount, probe and revision)."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from cryptography.x509.oid import NameOID

from fjord_operator import builders
from fjord_operator import settings as s
from fjord_operator.ca_rotation import CaPhase, load_certificate, load_certificates, signed_by
from fjord_operator.security import (
    ETCD_ROLE,
    SERVICE_ROLES,
    certificate_sans,
    cluster_security,
    decode_secret,
    etcd_sans,
    plan_certificates,
    tls_roles,
)
from tests.helpers.operator_specs import cluster, equals_flags, run_container_argv

NOW = datetime.datetime(2026, 11, 25, 22, 0, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)


def secure_managed(members: int = 3, **security: Any) -> dict[str, Any]:
    return cluster(etcd={"managed": {"replicas": members}}, security={"tls": True, **security})


def written(objs: list[dict[str, Any]]) -> dict[str, dict[str, bytes]]:
    return {o["metadata"]["name"]: decode_secret(o) or {} for o in objs}


def by_kind(body: dict[str, Any], revisions: dict[str, str] | None = None) -> dict[Any, Any]:
    return {(o["kind"], o["metadata"]["name"]): o
            for o in builders.cluster_objects(body, 3, revisions)}


# -- the plan -------------------------------------------------------------------------------------


def test_a_managed_etcd_gets_its_own_certificate_of_the_cluster_ca() -> None:
    body = secure_managed()
    security = cluster_security(body["spec"])
    assert security is not None
    plan = plan_certificates(body, security, None, {}, NOW)
    secrets = written(plan.secrets)
    assert "fjord-etcd-tls" in secrets and set(plan.revisions) == {*SERVICE_ROLES, ETCD_ROLE}
    data = secrets["fjord-etcd-tls"]
    # etcd takes its files as flags: no --security-config.
    assert set(data) == {s.CA_CERT_KEY, s.SERVICE_KEYSTORE_KEY}
    assert data[s.CA_CERT_KEY] == plan.trust
    cert = load_certificate(data[s.SERVICE_KEYSTORE_KEY])
    assert cert is not None and signed_by(cert, plan.ca)
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == [
        "fjord-etcd"]
    # No service identity: an etcd member can never pass for a broker.
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME) == []
    sans = certificate_sans(cert)
    assert sorted(sans) == sorted(etcd_sans("fjord", "fjord"))
    for name in ("fjord-etcd.fjord.svc", "*.fjord-etcd.fjord.svc", s.ETCD_CLIENT_CERT_HOSTNAME):
        assert name in sans
    assert b"PRIVATE KEY" in data[s.SERVICE_KEYSTORE_KEY]  # certificate and key, one file
    # Every service's certificate names the host etcd requires of its clients.
    for role in SERVICE_ROLES:
        service = load_certificate(secrets[f"fjord-{role}-tls"][s.SERVICE_KEYSTORE_KEY])
        assert service is not None and s.ETCD_CLIENT_CERT_HOSTNAME in certificate_sans(service)


def test_external_or_plaintext_etcd_has_no_etcd_secret() -> None:
    assert tls_roles(cluster()["spec"]) == SERVICE_ROLES
    body = cluster(etcd={"endpoints": ["https://etcd.infra:2379"]}, security={"tls": True})
    security = cluster_security(body["spec"])
    assert security is not None
    assert "fjord-etcd-tls" not in written(plan_certificates(body, security, None, {}, NOW).secrets)


def test_the_etcd_certificate_is_kept_then_renewed_inside_the_window() -> None:
    body = secure_managed(certificates={"validityDays": 10, "renewalDays": 2})
    security = cluster_security(body["spec"])
    assert security is not None
    first = plan_certificates(body, security, None, {}, NOW)
    secrets = written(first.secrets)
    ca = secrets["fjord-cluster-ca"]
    roles = {r: secrets[f"fjord-{r}-tls"] for r in tls_roles(body["spec"])}
    kept = plan_certificates(body, security, ca, roles, NOW + 8 * DAY - datetime.timedelta(
        seconds=1), ca_managed=True)
    assert kept.secrets == [] and kept.revisions == first.revisions
    due = plan_certificates(body, security, ca, roles, NOW + 8 * DAY, ca_managed=True)
    assert set(due.renewed) == {*SERVICE_ROLES, ETCD_ROLE}
    assert due.renewed[ETCD_ROLE].startswith("expires at")
    renewed = load_certificate(written(due.secrets)["fjord-etcd-tls"][s.SERVICE_KEYSTORE_KEY])
    assert renewed is not None and renewed.not_valid_after_utc == NOW + 18 * DAY
    # The new revision reaches the etcd pod template: the StatefulSet rolls its members.
    before = by_kind(body, first.revisions)[("StatefulSet", "fjord-etcd")]
    after = by_kind(body, due.revisions)[("StatefulSet", "fjord-etcd")]
    annotation = s.TLS_REVISION_ANNOTATION
    assert before["spec"]["template"]["metadata"]["annotations"][annotation] == \
        first.revisions[ETCD_ROLE]
    assert after["spec"]["template"]["metadata"]["annotations"][annotation] == \
        due.revisions[ETCD_ROLE] != first.revisions[ETCD_ROLE]
    # RollingUpdate (the default): one member at a time, the next once it is Ready again;
    # a drain too takes one member at a time.
    assert "updateStrategy" not in after["spec"]
    pdb = by_kind(body)[("PodDisruptionBudget", "fjord-etcd")]["spec"]
    assert pdb["maxUnavailable"] == 1
    assert pdb["selector"]["matchLabels"] == after["spec"]["selector"]["matchLabels"]
    assert ("PodDisruptionBudget", "fjord-etcd") not in by_kind(cluster())


def test_a_cluster_ca_renewal_carries_the_etcd_certificate_and_waits_for_its_members() -> None:
    body = secure_managed(clusterCa={"validityDays": 100, "renewalDays": 10})
    security = cluster_security(body["spec"])
    assert security is not None
    store = written(plan_certificates(body, security, None, {}, NOW, ca_managed=True).secrets)
    roles = tls_roles(body["spec"])

    def step(now: datetime.datetime, pods: dict[str, dict[str, str | None]] | None) -> Any:
        plan = plan_certificates(
            body, security, store["fjord-cluster-ca"],
            {r: store[f"fjord-{r}-tls"] for r in roles}, now, ca_managed=True, pods=pods,
            users={})
        for obj in plan.secrets:
            store[obj["metadata"]["name"]] = {k: v for k, v in (decode_secret(obj) or {}).items()}
        return plan

    def pods(plan: Any, stale_etcd: bool = False) -> dict[str, dict[str, str | None]]:
        out: dict[str, dict[str, str | None]] = {
            r: {f"fjord-{r}-{i}": plan.revisions[r] for i in range(3)} for r in roles}
        if stale_etcd:
            out[ETCD_ROLE]["fjord-etcd-1"] = "an-older-revision"
        return out

    old_ca = load_certificate(store["fjord-cluster-ca"][s.CA_CERT_KEY])
    later = NOW + 91 * DAY
    trusting = step(later, None)
    assert trusting.cluster_ca.phase is CaPhase.TRUSTING_NEW
    etcd = store["fjord-etcd-tls"]
    assert len(load_certificates(etcd[s.CA_CERT_KEY])) == 2  # old + new: its members roll
    assert trusting.renewed[ETCD_ROLE].startswith("trusted CAs changed")
    # The next phase waits for the etcd members too.
    waiting = step(later, pods(trusting, stale_etcd=True))
    assert not waiting.ca_decision.changed and "fjord-etcd-1" in waiting.ca_decision.message
    reissuing = step(later, pods(trusting))
    assert reissuing.cluster_ca.phase is CaPhase.REISSUING
    cert = load_certificate(store["fjord-etcd-tls"][s.SERVICE_KEYSTORE_KEY])
    assert cert is not None and signed_by(cert, reissuing.ca)  # of the new CA
    assert old_ca is not None and cert.issuer != old_ca.subject
    assert len(load_certificates(store["fjord-etcd-tls"][s.CA_CERT_KEY])) == 2
    waiting = step(later, pods(reissuing, stale_etcd=True))
    assert waiting.cluster_ca.phase is CaPhase.REISSUING and not waiting.ca_decision.changed
    stable = step(later, pods(reissuing))
    assert stable.cluster_ca.phase is CaPhase.STABLE
    assert load_certificates(store["fjord-etcd-tls"][s.CA_CERT_KEY]) == [reissuing.ca.certificate]


# -- the StatefulSet ------------------------------------------------------------------------------


def test_secure_etcd_command_as_the_kubelet_execs_it(tmp_path: Path) -> None:
    body = secure_managed(members=3)
    objects = by_kind(body, {ETCD_ROLE: "rev-1"})
    sts = objects[("StatefulSet", "fjord-etcd")]
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    argv = run_container_argv(container["command"], tmp_path, POD_NAME="fjord-etcd-1")
    flags = equals_flags(argv)
    host = "fjord-etcd-1.fjord-etcd.fjord.svc"
    assert flags["--name"] == "fjord-etcd-1"
    assert flags["--listen-client-urls"] == "https://0.0.0.0:2379"
    assert flags["--advertise-client-urls"] == f"https://{host}:2379"
    assert flags["--listen-peer-urls"] == "https://0.0.0.0:2380"
    assert flags["--initial-advertise-peer-urls"] == f"https://{host}:2380"
    assert flags["--initial-cluster"].split(",") == [
        f"fjord-etcd-{i}=https://fjord-etcd-{i}.fjord-etcd.fjord.svc:2380" for i in range(3)]
    # Its files: the mounted Secret's keystore (certificate and key) and trust bundle.
    mount = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["tls"]
    secret = {v["name"]: v for v in pod["volumes"]}["tls"]["secret"]
    assert secret["secretName"] == "fjord-etcd-tls" and secret["defaultMode"] == 0o400
    for key in ("--cert-file", "--key-file", "--peer-cert-file", "--peer-key-file"):
        assert flags[key] == f"{mount}/{s.SERVICE_KEYSTORE_KEY}"
    for key in ("--trusted-ca-file", "--peer-trusted-ca-file"):
        assert flags[key] == f"{mount}/{s.CA_CERT_KEY}"
    assert flags["--client-cert-auth"] == "" and flags["--peer-client-cert-auth"] == ""
    assert flags["--client-cert-allowed-hostname"] == s.ETCD_CLIENT_CERT_HOSTNAME
    assert flags["--peer-cert-allowed-cn"] == "fjord-etcd"
    # The kubelet probes the plain-http /health (the client port wants a certificate).
    probe = container["readinessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert probe == {"path": "/health", "port": "metrics"}
    assert flags["--listen-metrics-urls"] == f"http://0.0.0.0:{ports['metrics']}"
    assert sts["spec"]["template"]["metadata"]["annotations"] == {
        s.TLS_REVISION_ANNOTATION: "rev-1"}
    # Every Fjord service dials it over https (its own certificate, the cluster CA as trust).
    assert builders.etcd_url(body) == "https://fjord-etcd.fjord.svc:2379"
    assert objects[("ConfigMap", "fjord-config")]["data"]["FJORD_ETCD"] == \
        "https://fjord-etcd.fjord.svc:2379"


def test_plaintext_managed_etcd_is_unchanged(tmp_path: Path) -> None:
    body = cluster(etcd={"managed": {"replicas": 1}})
    sts = by_kind(body)[("StatefulSet", "fjord-etcd")]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    argv = run_container_argv(container["command"], tmp_path, POD_NAME="fjord-etcd-0")
    flags = equals_flags(argv)
    assert flags["--listen-client-urls"] == "http://0.0.0.0:2379"
    assert flags["--initial-cluster"] == "fjord-etcd-0=http://fjord-etcd-0.fjord-etcd.fjord.svc:2380"
    assert not any("cert" in f or "metrics" in f for f in flags)
    assert container["readinessProbe"]["httpGet"]["port"] == "client"
    assert "volumes" not in sts["spec"]["template"]["spec"]
    assert "annotations" not in sts["spec"]["template"]["metadata"]
    assert builders.etcd_url(body) == "http://fjord-etcd.fjord.svc:2379"


# -- a running plaintext etcd -----------------------------------------------------------------


def test_a_running_plaintext_etcd_of_three_members_stays_plaintext() -> None:
    """etcd keeps its members' http peer URLs in its data: moved to https by a roll, the
    members would not reach each other. One member has no peers and moves with its data."""
    plaintext = cluster(etcd={"managed": {"replicas": 3}})
    live = by_kind(plaintext)[("StatefulSet", "fjord-etcd")]
    secure = secure_managed(members=3)
    kept = builders.with_running_etcd(secure, live)
    assert kept is not secure and kept["spec"]["etcd"]["managed"]["tls"] is False
    assert "tls" not in secure["spec"]["etcd"]["managed"]  # the input is untouched
    assert tls_roles(kept["spec"]) == SERVICE_ROLES  # no etcd Secret, no etcd pods awaited
    assert builders.etcd_url(kept) == "http://fjord-etcd.fjord.svc:2379"
    sts = by_kind(kept)[("StatefulSet", "fjord-etcd")]
    assert sts["spec"]["template"] == live["spec"]["template"]  # nothing rolls
    assert builders.cluster_spec_problems(kept["spec"]) == []
    # Nothing to keep: no etcd yet, an https one, one member, or tls said explicitly.
    assert builders.with_running_etcd(secure, None) is secure
    running_tls = by_kind(secure)[("StatefulSet", "fjord-etcd")]
    assert builders.with_running_etcd(secure, running_tls) is secure
    one = cluster(etcd={"managed": {"replicas": 1}})
    one_live = by_kind(one)[("StatefulSet", "fjord-etcd")]
    assert builders.with_running_etcd(secure_managed(members=1), one_live)["spec"]["etcd"][
        "managed"] == {"replicas": 1}
    told = cluster(etcd={"managed": {"replicas": 3, "tls": True}}, security={"tls": True})
    assert builders.with_running_etcd(told, live) is told
    assert builders.etcd_url(told).startswith("https://")


def test_managed_etcd_tls_is_said_or_follows_the_cluster() -> None:
    off = cluster(etcd={"managed": {"replicas": 1, "tls": False}}, security={"tls": True})
    assert builders.etcd_url(off) == "http://fjord-etcd.fjord.svc:2379"
    assert tls_roles(off["spec"]) == SERVICE_ROLES
    wrong = cluster(etcd={"managed": {"replicas": 1, "tls": True}})
    assert any("spec.etcd.managed.tls needs spec.security.tls" in p
               for p in builders.cluster_spec_problems(wrong["spec"]))


def test_services_started_on_a_plaintext_etcd_roll_when_it_moves_to_https() -> None:
    """The pods read FJORD_ETCD from the ConfigMap at start only: the etcd URL on every
    service pod template (while the managed etcd serves https) changes the templates when
    etcd moves to https, so the services restart onto it (brokers through the safe roller)."""
    templates = {
        ("StatefulSet", "fjord-broker"), ("Deployment", "fjord-controller"),
        ("Deployment", "fjord-coordinator"),
    }

    def annotations(body: dict[str, Any]) -> list[dict[str, str]]:
        objects = by_kind(body, {r: "rev" for r in (*SERVICE_ROLES, ETCD_ROLE)})
        return [objects[k]["spec"]["template"]["metadata"].get("annotations") or {}
                for k in sorted(templates)]

    for found in annotations(secure_managed()):
        assert found[s.ETCD_ANNOTATION] == "https://fjord-etcd.fjord.svc:2379"
        assert found[s.TLS_REVISION_ANNOTATION] == "rev"
    plaintext_etcd = cluster(etcd={"managed": {"replicas": 3, "tls": False}},
                             security={"tls": True})
    external = cluster(etcd={"endpoints": ["https://etcd.infra:2379"]}, security={"tls": True})
    for body in (cluster(etcd={"managed": {"replicas": 1}}), plaintext_etcd, external):
        assert all(s.ETCD_ANNOTATION not in found for found in annotations(body))
