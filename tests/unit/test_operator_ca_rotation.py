"""Renewal of the cluster CA (issue 16, Kubernetes; fjord_operator.ca_rotation): the three
phases derived from the CA Secret, each waiting for the pods and the FjordUser Secrets, the
plan idempotent at every phase, an adopted CA never replaced; and a hypothesis state machine
over every interleaving of reconciliations (some cut short by an operator crash between two
Secret writes), pod restarts, user reconciliations and time: every pair of services, the
operator and every user trust each other's certificates at every step, and a fair schedule
always ends the renewal. Real certificates, real signatures."""

from __future__ import annotations

import datetime
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fjord.security.certificates import make_ca
from fjord_operator import settings as s
from fjord_operator.ca_rotation import (
    CaPhase,
    ClusterCa,
    ca_status,
    issued_by,
    load_certificate,
    load_certificates,
    read_cluster_ca,
    trusted_by,
)
from fjord_operator.security import (
    SCRAM,
    TLS,
    SecuritySpecError,
    cluster_security,
    cluster_security_problems,
    decode_secret,
    operator_identity,
    plan_certificates,
    plan_user_credentials,
    signed_by,
)
from tests.helpers.tls_peer import memory_handshake

NOW = datetime.datetime(2026, 11, 25, 22, 0, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)
#: Every role with a TLS Secret: the services and the managed etcd (its members' certificates
#: must keep every service's trust, and theirs, through a renewal like the services' do).
ROLES = ("broker", "controller", "coordinator", "etcd")
#: Short lives so that a few steps reach the windows: CA 10 days (renewed 3 days before its
#: end), leaves 9 days (renewed 1 day before theirs, or capped at their CA's end).
SHORT = {"clusterCa": {"validityDays": 10, "renewalDays": 3},
         "certificates": {"validityDays": 9, "renewalDays": 1}}


def cluster_body(**security: Any) -> dict[str, Any]:
    return {
        "apiVersion": "fjord.io/v1alpha1",
        "kind": "FjordCluster",
        "metadata": {"name": "fj", "namespace": "ns", "uid": "uid-1", "generation": 1},
        "spec": {
            "brokers": {"replicas": 3},
            "etcd": {"managed": {"replicas": 3}},
            "security": {"tls": True, **security},
        },
    }


BODY = cluster_body(**SHORT)
SECURITY = cluster_security(BODY["spec"])
assert SECURITY is not None


def written(plan: Any) -> dict[str, dict[str, bytes]]:
    return {o["metadata"]["name"]: decode_secret(o) or {} for o in plan.secrets}


class Store:
    """The Secrets as the API server keeps them (merge patches: a null removes a key)."""

    def __init__(self) -> None:
        self.secrets: dict[str, dict[str, bytes]] = {}

    def apply(self, obj: Mapping[str, Any]) -> None:
        import base64

        name = obj["metadata"]["name"]
        data = self.secrets.setdefault(name, {})
        for key, value in obj["data"].items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = base64.b64decode(value)

    def roles(self) -> dict[str, dict[str, bytes] | None]:
        return {r: self.secrets.get(f"fj-{r}-tls") for r in ROLES}

    @property
    def ca(self) -> dict[str, bytes] | None:
        return self.secrets.get("fj-cluster-ca")


def plan(store: Store, now: datetime.datetime, pods: Any = None,
         users: Mapping[str, Mapping[str, bytes]] | None = None, managed: bool = True) -> Any:
    return plan_certificates(BODY, SECURITY, store.ca, store.roles(), now, ca_managed=managed,
                             pods=pods, users=users)


def apply_all(store: Store, p: Any) -> None:
    for obj in p.secrets:
        store.apply(obj)


def current_pods(p: Any) -> dict[str, dict[str, str | None]]:
    """Every role's two pods on the plan's revisions (a finished roll)."""
    return {r: {f"fj-{r}-{i}": p.revisions[r] for i in range(2)} for r in ROLES}


def cluster_ca(store: Store) -> ClusterCa:
    assert store.ca is not None
    return read_cluster_ca(store.ca, True)


def reissued_user(store: Store, name: str, now: datetime.datetime,
                  live: Mapping[str, bytes] | None = None) -> dict[str, bytes]:
    ca = cluster_ca(store)
    return plan_user_credentials(name, TLS, ca.signing, live, now, 9 * DAY, DAY,
                                 trust=ca.bundle()).data


# -- the phases, one by one ----------------------------------------------------------------------


def test_spec_cluster_ca_defaults_and_bad_values_name_the_field() -> None:
    default = cluster_security(cluster_body()["spec"])
    assert default is not None
    assert default.ca_validity == 5 * 365 * DAY and default.ca_renew_before == 30 * DAY
    assert SECURITY.ca_validity == 10 * DAY and SECURITY.ca_renew_before == 3 * DAY
    for bad, message in (
        ({"clusterCa": {"validityDays": 0}}, "clusterCa.validityDays must be an integer >= 1"),
        ({"clusterCa": {"validityDays": 10, "renewalDays": 10}},
         "clusterCa.renewalDays must be an integer >= 0 and below validityDays (10)"),
        ({"clusterCa": {"renewalDays": "soon"}}, "clusterCa.renewalDays must be an integer"),
        ({"clusterCa": "yes"}, "spec.security.clusterCa must be an object"),
    ):
        problems = cluster_security_problems(cluster_body(**bad)["spec"])
        assert len(problems) == 1 and message in problems[0], problems
        with pytest.raises(SecuritySpecError, match=message.split(" must")[0]):
            cluster_security(cluster_body(**bad)["spec"])


def test_a_ca_outside_its_window_stays_and_the_plan_is_idempotent() -> None:
    store = Store()
    first = plan(store, NOW)
    apply_all(store, first)
    ca = cluster_ca(store)
    assert ca.phase is CaPhase.STABLE and ca.managed
    assert ca.signing.certificate.not_valid_after_utc == NOW - datetime.timedelta(minutes=5) \
        + 10 * DAY
    again = plan(store, NOW + 6 * DAY, pods=current_pods(first))
    assert again.secrets == [] and not again.ca_decision.changed
    assert ca_status(again.ca_decision)["phase"] == "Stable"


def test_the_three_phases_wait_for_pods_and_users_and_keep_trust() -> None:
    store = Store()
    apply_all(store, plan(store, NOW))
    old = cluster_ca(store).signing
    keystores = {r: store.roles()[r][s.SERVICE_KEYSTORE_KEY] for r in ROLES}  # type: ignore[index]
    alice = reissued_user(store, "alice", NOW)
    assert alice[s.CA_CERT_KEY] == old.pem()

    # Phase 1: inside the CA's window (7 days of 10, renewed 3 days before its end).
    t1 = NOW + 7 * DAY
    p1 = plan(store, t1)
    assert p1.secrets[0]["metadata"]["name"] == "fj-cluster-ca"  # the CA first
    apply_all(store, p1)
    ca = cluster_ca(store)
    assert ca.phase is CaPhase.TRUSTING_NEW and ca.signing.pem() == old.pem()
    assert ca.next is not None
    assert ca.next.certificate.subject != old.certificate.subject
    assert ca.next.certificate.not_valid_after_utc == t1 + 10 * DAY
    for role in ROLES:
        data = store.roles()[role]
        assert data is not None
        bundle = load_certificates(data[s.CA_CERT_KEY])
        assert [c.subject for c in bundle] == [old.certificate.subject,
                                               ca.next.certificate.subject]
        # Still the old CA's certificate: nothing presents a new-CA certificate yet.
        assert data[s.SERVICE_KEYSTORE_KEY] == keystores[role]
        assert "trusted CAs changed" in p1.renewed[role]
    assert p1.ca_decision.message.startswith("the cluster CA expires at")
    # Idempotent: the same inputs again change nothing.
    assert plan(store, t1).secrets == []

    # It waits: pods not observed, pods on an old revision, a user Secret not trusting the new CA.
    assert plan(store, t1).ca_decision.message == "TrustingNewCa: waiting to observe the pods"
    stale = current_pods(p1)
    stale["broker"]["fj-broker-1"] = "old-revision"
    waiting = plan(store, t1, pods=stale, users={"alice": alice})
    assert waiting.secrets == [] and "fj-broker-1" in waiting.ca_decision.message
    waiting = plan(store, t1, pods=current_pods(p1), users={"alice": alice})
    assert waiting.secrets == []
    assert waiting.ca_decision.message.endswith("trust the new CA: alice")
    alice = reissued_user(store, "alice", t1, alice)
    assert alice[s.CA_CERT_KEY] == ca.bundle()
    alice_cert = load_certificate(alice[s.USER_CERT_KEY])
    assert alice_cert is not None and signed_by(alice_cert, old)  # kept: the old CA signs

    # Phase 2: every pod trusts both: the new CA signs, every certificate is re-issued.
    p2 = plan(store, t1, pods=current_pods(p1), users={"alice": alice})
    ca_obj = p2.secrets[0]
    assert ca_obj["metadata"]["name"] == "fj-cluster-ca"
    assert ca_obj["data"][s.NEXT_CA_CERT_KEY] is None and ca_obj["data"][s.NEXT_CA_KEY_KEY] is None
    apply_all(store, p2)
    ca = cluster_ca(store)
    assert ca.phase is CaPhase.REISSUING
    assert ca.previous is not None and ca.previous.subject == old.certificate.subject
    assert set(store.ca or {}) == {"ca.crt", "ca.key", "previous-ca.crt"}  # the old key is gone
    for role in ROLES:
        data = store.roles()[role]
        assert data is not None
        cert = load_certificate(data[s.SERVICE_KEYSTORE_KEY])
        assert cert is not None and signed_by(cert, ca.signing)
        assert data[s.CA_CERT_KEY] == ca.bundle()
        assert p2.renewed[role] == "not signed by the cluster CA"
    assert plan(store, t1, pods=current_pods(p1), users={"alice": alice}).secrets == []
    # It waits for the roll and for alice's certificate of the new CA.
    assert "waiting for pods" in plan(store, t1, pods=current_pods(p1)).ca_decision.message
    waiting = plan(store, t1, pods=current_pods(p2), users={"alice": alice})
    assert waiting.secrets == [] and waiting.ca_decision.message.endswith("new CA: alice")
    alice = reissued_user(store, "alice", t1, alice)
    alice_cert = load_certificate(alice[s.USER_CERT_KEY])
    assert alice_cert is not None and signed_by(alice_cert, ca.signing)

    # Phase 3: nothing of the old CA is left: it is dropped, a last roll follows.
    p3 = plan(store, t1, pods=current_pods(p2), users={"alice": alice, "bob": {
        s.CA_CERT_KEY: ca.bundle(), s.USER_PASSWORD_KEY: b"pw"}})
    assert p3.secrets[0]["data"][s.PREVIOUS_CA_CERT_KEY] is None
    apply_all(store, p3)
    ca = cluster_ca(store)
    assert ca.phase is CaPhase.STABLE and set(store.ca or {}) == {"ca.crt", "ca.key"}
    for role in ROLES:
        data = store.roles()[role]
        assert data is not None and data[s.CA_CERT_KEY] == ca.signing.pem()
        assert p3.renewed[role].startswith("trusted CAs changed")
    assert plan(store, t1, pods=current_pods(p3)).secrets == []
    status = ca_status(p3.ca_decision)
    assert status["phase"] == "Stable" and status["managed"] is True
    assert status["notAfter"] == (t1 + 10 * DAY).isoformat()


def test_an_adopted_ca_is_never_replaced_and_reported_as_expiring() -> None:
    mine = make_ca("my company's CA", validity=10 * DAY, now=NOW)
    store = Store()
    store.secrets["fj-cluster-ca"] = {"ca.crt": mine.pem(), "ca.key": mine.key_pem()}
    apply_all(store, plan(store, NOW, managed=False))
    late = plan(store, NOW + 8 * DAY, managed=False)
    assert late.ca_decision.expiring and not late.ca_decision.changed
    assert "supplied, not made by the operator" in late.ca_decision.message
    assert all(o["metadata"]["name"] != "fj-cluster-ca" for o in late.secrets)
    apply_all(store, late)
    # The leaves renewed once end with the CA; they are not re-issued on every reconciliation.
    assert plan(store, NOW + 8 * DAY + DAY / 2, managed=False).secrets == []
    for role in ROLES:
        cert = load_certificate((store.roles()[role] or {})[s.SERVICE_KEYSTORE_KEY])
        assert cert is not None
        assert cert.not_valid_after_utc == mine.certificate.not_valid_after_utc
    # Renewal keys in a supplied CA's Secret are not the operator's to act on.
    store.secrets["fj-cluster-ca"][s.PREVIOUS_CA_CERT_KEY] = b"garbage"
    assert read_cluster_ca(store.secrets["fj-cluster-ca"], False).phase is CaPhase.STABLE


def test_an_expired_ca_is_a_named_error_not_a_crash() -> None:
    """The operator was down past the CA's end: nothing can be issued with it; the plan says
    so (the handler reports InvalidClusterCA) instead of failing inside the library."""
    store = Store()
    apply_all(store, plan(store, NOW))
    roles = {r: None for r in ROLES}
    with pytest.raises(SecuritySpecError, match=r"expired at .*no certificate can be issued"):
        plan_certificates(BODY, SECURITY, store.ca, roles, NOW + 11 * DAY, ca_managed=True)


def test_unusable_renewal_keys_are_refused_never_overwritten() -> None:
    store = Store()
    apply_all(store, plan(store, NOW))
    assert store.ca is not None
    other = make_ca("other")
    for extra, message in (
        ({s.PREVIOUS_CA_CERT_KEY: b"garbage"}, "previous-ca.crt holds no PEM certificate"),
        ({s.NEXT_CA_CERT_KEY: other.pem(), s.NEXT_CA_KEY_KEY: make_ca("x").key_pem()},
         "next-ca.crt/next-ca.key: the CA key does not belong"),
        ({s.NEXT_CA_CERT_KEY: other.pem(), s.NEXT_CA_KEY_KEY: other.key_pem(),
          s.PREVIOUS_CA_CERT_KEY: other.pem()}, "both next-ca.crt and previous-ca.crt"),
    ):
        with pytest.raises(SecuritySpecError, match=message):
            plan_certificates(BODY, SECURITY, {**store.ca, **extra}, store.roles(), NOW,
                              ca_managed=True)


# -- services load a bundle ----------------------------------------------------------------------


def test_services_accept_a_ca_bundle_whichever_ca_signed_the_peer(tmp_path: Path) -> None:
    """fjord.tls's ssl contexts (Kafka doors, clients) and gRPC credentials take a ca.crt with
    both CAs of a renewal: a peer of either CA completes mutual TLS; a third CA is refused."""
    old, new = make_ca("fjord cluster CA ns/fj"), make_ca("fjord cluster CA ns/fj 2")
    bundle = tmp_path / "bundle.crt"
    bundle.write_bytes(old.pem() + new.pem())
    for signer in (old, new):
        for peer in (old, new):
            cert, key = signer.issue("server", sans=["localhost"])
            (tmp_path / "server.pem").write_bytes(cert + key)
            server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            server.load_cert_chain(tmp_path / "server.pem")
            server.load_verify_locations(bundle)
            server.verify_mode = ssl.CERT_REQUIRED
            ccert, ckey = peer.issue("client", sans=())
            (tmp_path / "client.pem").write_bytes(ccert + ckey)
            client = ssl.create_default_context(cafile=bundle)
            client.load_cert_chain(tmp_path / "client.pem")
            memory_handshake(server, client, "localhost")
    stranger = make_ca("fjord cluster CA ns/fj 3")
    scert, skey = stranger.issue("server", sans=["localhost"])
    (tmp_path / "server.pem").write_bytes(scert + skey)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "server.pem")
    with pytest.raises(ssl.SSLCertVerificationError):
        memory_handshake(server, ssl.create_default_context(cafile=bundle), "localhost")


# -- every interleaving ---------------------------------------------------------------------------

_VERIFIED: dict[tuple[int, int], bool] = {}


def _issued(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    key = (cert.serial_number, issuer.serial_number)
    if key not in _VERIFIED:
        _VERIFIED[key] = issued_by(cert, issuer)
    return _VERIFIED[key]


_BUNDLES: dict[bytes, list[x509.Certificate]] = {}


def _accepts(trust: bytes, cert: x509.Certificate) -> bool:
    """Whether a peer trusting the PEM bundle ``trust`` accepts ``cert`` (trusted_by, cached)."""
    if trust not in _BUNDLES:
        _BUNDLES[trust] = load_certificates(trust)
    return any(_issued(cert, ca) for ca in _BUNDLES[trust])


class Party:
    """What one TLS party presents and trusts."""

    def __init__(self, name: str, cert: bytes, trust: bytes) -> None:
        self.name = name
        certificate = load_certificate(cert)
        assert certificate is not None, name
        self.cert = certificate
        self.trust = trust


class Rotation(RuleBasedStateMachine):
    """The operator, four roles (etcd's members too) of two pods, a tls and a scram
    FjordUser. A pod restart takes its role's pod template revision (written at the end of a
    full reconciliation) and the Secret as it is then; a reconciliation may stop after any
    Secret write (an operator crash: the templates keep the last full reconciliation's
    revisions)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = NOW
        self.store = Store()
        p = plan(self.store, self.now)
        apply_all(self.store, p)
        self.templates = dict(p.revisions)
        self.pods: dict[str, tuple[str, dict[str, bytes]]] = {}
        for role in ROLES:
            for i in range(2):
                self._restart(role, i)
        self.users: dict[str, dict[str, bytes]] = {}
        for name in ("alice", "bob"):
            self._reconcile_user(name)
        # Just inside the CA's renewal window (7 days into its 10): the first reconciliation
        # starts a renewal, so the examples spend their steps in its phases.
        self.now = NOW + 7 * DAY + DAY / 24
        self.phases_seen: set[CaPhase] = set()
        self.rotations = 0

    def _restart(self, role: str, index: int) -> None:
        data = self.store.roles()[role]
        assert data is not None
        self.pods[f"fj-{role}-{index}"] = (self.templates[role], dict(data))

    def _observed(self) -> dict[str, dict[str, str | None]]:
        return {r: {n: rev for n, (rev, _) in self.pods.items() if n.startswith(f"fj-{r}-")}
                for r in ROLES}

    def _reconcile_user(self, name: str) -> None:
        ca = cluster_ca(self.store)
        kind = TLS if name == "alice" else SCRAM
        self.users[name] = plan_user_credentials(
            name, kind, ca.signing, self.users.get(name), self.now, 9 * DAY, DAY, trust=ca.bundle()
        ).data

    def _reconcile(self, writes: int | None) -> None:
        before = cluster_ca(self.store)
        p = plan(self.store, self.now, pods=self._observed(), users=self.users)
        for obj in p.secrets[:writes]:
            self.store.apply(obj)
        if writes is None or writes >= len(p.secrets):
            self.templates = dict(p.revisions)
        after = cluster_ca(self.store)
        self.phases_seen.add(after.phase)
        if before.phase is CaPhase.REISSUING and after.phase is CaPhase.STABLE:
            self.rotations += 1

    @rule()
    def reconcile(self) -> None:
        self._reconcile(None)

    @rule(writes=st.integers(min_value=0, max_value=len(ROLES)))
    def reconcile_then_crash(self, writes: int) -> None:
        self._reconcile(writes)

    @rule(role=st.sampled_from(ROLES), index=st.integers(0, 1))
    def restart_pod(self, role: str, index: int) -> None:
        self._restart(role, index)

    @rule()
    def roll_finishes(self) -> None:
        """Every pod a template moved past restarts (a whole roll: the deep phases are
        reached in few steps)."""
        for name, (revision, _) in list(self.pods.items()):
            role = name.split("-")[1]
            if revision != self.templates[role]:
                self._restart(role, int(name.rsplit("-", 1)[1]))

    @rule(name=st.sampled_from(("alice", "bob")))
    def reconcile_user(self, name: str) -> None:
        self._reconcile_user(name)

    @rule()
    def reconcile_users(self) -> None:
        """The user timer's round: every FjordUser reconciled."""
        for name in ("alice", "bob"):
            self._reconcile_user(name)

    @rule(hours=st.integers(min_value=1, max_value=36))
    def time_passes(self, hours: int) -> None:
        # The clock never passes the end of the CA that signs: a renewal whose pods are never
        # restarted cannot finish in time (the liveness of a fair schedule is checked below).
        end = cluster_ca(self.store).signing.certificate.not_valid_after_utc
        self.now = min(self.now + datetime.timedelta(hours=hours), end - DAY)

    def parties(self) -> list[Party]:
        """Every running pod; a pod that re-reads its mounted Secret now (a kubelet refreshes
        Secret volumes in place); the operator's client (re-issued from the CA Secret);
        each user's client started from its Secret now."""
        ca = cluster_ca(self.store)
        out = [Party(n, d[s.SERVICE_KEYSTORE_KEY], d[s.CA_CERT_KEY])
               for n, (_, d) in self.pods.items()]
        for role, data in self.store.roles().items():
            assert data is not None
            out.append(Party(f"{role} Secret", data[s.SERVICE_KEYSTORE_KEY], data[s.CA_CERT_KEY]))
        cert, _ = operator_identity(ca.signing, self.now)
        out.append(Party("operator", cert, ca.bundle()))
        alice = self.users["alice"]
        out.append(Party("alice", alice[s.USER_CERT_KEY], alice[s.CA_CERT_KEY]))
        return out

    @invariant()
    def every_party_trusts_every_service(self) -> None:
        parties = self.parties()
        services = [p for p in parties if p.name.startswith("fj-") or "Secret" in p.name]
        for service in services:
            for other in parties:
                assert _accepts(service.trust, other.cert), (
                    f"{service.name} refuses {other.name} in {cluster_ca(self.store).phase}")
                assert _accepts(other.trust, service.cert), (
                    f"{other.name} refuses {service.name} in {cluster_ca(self.store).phase}")
        bob = self.users["bob"]
        for service in services:
            assert _accepts(bob[s.CA_CERT_KEY], service.cert), f"bob refuses {service.name}"

    def teardown(self) -> None:
        """A fair schedule from here ends any renewal: reconcile, restart the pods a template
        moved past, reconcile the users, until the CA is stable and everything is current."""
        for _ in range(12):
            self._reconcile(None)
            for name, (revision, _) in list(self.pods.items()):
                role = name.split("-")[1]
                if revision != self.templates[role]:
                    self._restart(role, int(name.rsplit("-", 1)[1]))
                    self.every_party_trusts_every_service()
            for user in ("alice", "bob"):
                self._reconcile_user(user)
            self.every_party_trusts_every_service()
        ca = cluster_ca(self.store)
        assert ca.phase is CaPhase.STABLE, ca.phase
        final = plan(self.store, self.now, pods=self._observed(), users=self.users)
        assert final.secrets == [], [o["metadata"]["name"] for o in final.secrets]
        for name, (_, data) in self.pods.items():
            cert = load_certificate(data[s.SERVICE_KEYSTORE_KEY])
            assert cert is not None and signed_by(cert, ca.signing), name
            assert trusted_by(cert, data[s.CA_CERT_KEY])


Rotation.TestCase.settings = settings(
    max_examples=40, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRotation = Rotation.TestCase


def test_a_rotation_under_a_fair_schedule_passes_every_phase() -> None:
    """A deterministic walk (time in 12-hour steps over 12 days): the CA enters its window,
    passes TrustingNewCa and ReissuingCertificates, is stable again, trust holding
    throughout."""
    machine = Rotation()
    for _ in range(24):
        machine.time_passes(12)
        machine.teardown()
    assert {CaPhase.TRUSTING_NEW, CaPhase.REISSUING, CaPhase.STABLE} <= machine.phases_seen
    assert machine.rotations >= 1
    assert cluster_ca(machine.store).signing.certificate.not_valid_after_utc > machine.now

