"""The cluster CA renewal through the operator's handler (fjord_operator.handlers.
reconcile_certificates and reconcile_cluster) against the emulated API server (kmock, its own
process): Secrets written and merge-patched (a renewal key removed by a null), pods and
FjordUser Secrets listed by label, each phase waiting for what it must, every step idempotent,
a restarted operator (a new Runtime) continuing from the Secrets alone, and a supplied CA left
alone and reported as expiring. The pods are objects written by the test in the roles a
rolling restart gives them (no Fjord process is needed to decide the phases; the real-API
test of the rotation runs brokers)."""

from __future__ import annotations

import asyncio
import base64
import datetime
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from cryptography.hazmat.primitives import serialization

from fjord.security.certificates import make_ca
from fjord_operator import builders
from fjord_operator import settings as s
from fjord_operator.ca_rotation import CaPhase, load_certificate, load_certificates, signed_by
from fjord_operator.handlers import KubeApi, Runtime, reconcile_certificates, reconcile_cluster
from fjord_operator.security import CertificatePlan, plan_user_credentials
from fjord_operator.settings import OperatorSettings
from tests.k8s.harness import ApiError, ApiServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NAMESPACE = "fjord-ca"
ROLES = ("broker", "controller", "coordinator")
DAY = datetime.timedelta(days=1)
T0 = datetime.datetime.now(datetime.UTC)
T = TypeVar("T")


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    server = ApiServer(log_path=tmp_path_factory.mktemp("kmock-ca") / "kmock.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def with_runtime(api: ApiServer, step: Callable[[Runtime], Awaitable[T]]) -> T:
    """One operator process's worth of work: a fresh Runtime (nothing in memory carries over
    between calls, as after an operator restart)."""

    async def run() -> T:
        rt = Runtime(OperatorSettings(kube_server=api.url), KubeApi(server=api.url))
        try:
            return await step(rt)
        finally:
            await rt.close()

    return asyncio.run(run())


def secret_path(name: str = "") -> str:
    return f"/api/v1/namespaces/{NAMESPACE}/secrets" + (f"/{name}" if name else "")


def live_secret(api: ApiServer, name: str) -> dict[str, Any] | None:
    try:
        return api.request("GET", secret_path(name))
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def read_secret(api: ApiServer, name: str) -> dict[str, bytes]:
    obj = api.request("GET", secret_path(name))
    return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}


def cluster(api: ApiServer, name: str, **ca: int) -> dict[str, Any]:
    body = {
        "apiVersion": s.API_VERSION, "kind": s.CLUSTER_KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"brokers": {"replicas": 2}, "etcd": {"endpoints": ["http://etcd:2379"]},
                 "security": {"tls": True, **({"clusterCa": ca} if ca else {})}},
    }
    return api.create("fjordclusters", NAMESPACE, body)


def put_pods(api: ApiServer, name: str, revisions: dict[str, str]) -> None:
    """Every role's two pods on ``revisions`` (a finished roll), created or patched."""
    for role in ROLES:
        for i in range(2):
            pod = f"{name}-{role}-{i}"
            meta = {"name": pod, "labels": builders.labels(name, role),
                    "annotations": {s.TLS_REVISION_ANNOTATION: revisions[role]}}
            if api.get("pods", NAMESPACE, pod) is None:
                api.create("pods", NAMESPACE, {
                    "apiVersion": "v1", "kind": "Pod", "metadata": meta,
                    "spec": {"containers": [{"name": "fjord", "image": "fjord"}]},
                })
            else:
                api.patch("pods", NAMESPACE, pod,
                          {"metadata": {"annotations": meta["annotations"]}})


def put_user(api: ApiServer, cluster_name: str, user: str, data: dict[str, bytes]) -> None:
    """A FjordUser's Secret as the user handler writes it (labels of the cluster's users)."""
    encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
    if live_secret(api, user) is None:
        api.request("POST", secret_path(), {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": user, "labels": builders.labels(cluster_name, "user")},
            "data": encoded,
        })
    else:
        api.request("PATCH", secret_path(user), {"data": encoded},
                    "application/merge-patch+json")


def user_data(api: ApiServer, cluster_name: str, user: str, now: datetime.datetime
              ) -> dict[str, bytes]:
    """What the user handler makes of the CA Secret now (plan_user_credentials)."""
    ca = with_runtime(api, lambda rt: rt.cluster_ca(api.get("fjordclusters", NAMESPACE,
                                                             cluster_name) or {}))
    live = live_secret(api, user)
    live_data = None if live is None else read_secret(api, user)
    return plan_user_credentials(user, "tls", ca.signing, live_data, now, 365 * DAY, 30 * DAY,
                                 trust=ca.bundle()).data


def reconcile(api: ApiServer, body: dict[str, Any], now: datetime.datetime) -> CertificatePlan:
    plan = with_runtime(api, lambda rt: reconcile_certificates(rt, body, now))
    assert plan is not None
    return plan


def versions(api: ApiServer) -> dict[str, str]:
    items = api.request("GET", secret_path())["items"]
    return {i["metadata"]["name"]: i["metadata"]["resourceVersion"] for i in items}


def test_the_ca_renewal_runs_its_three_phases_through_the_api(api: ApiServer) -> None:
    body = cluster(api, "rot", validityDays=10, renewalDays=3)
    first = reconcile(api, body, T0)
    ca = read_secret(api, "rot-cluster-ca")
    assert set(ca) == {"ca.crt", "ca.key"}
    old = load_certificate(ca["ca.crt"])
    assert old is not None
    put_pods(api, "rot", first.revisions)
    put_user(api, "rot", "alice", user_data(api, "rot", "alice", T0))
    stable = versions(api)
    assert reconcile(api, body, T0 + DAY).secrets == [] and versions(api) == stable

    # Phase 1 (day 8 of 10: inside the 3-day window): the new CA beside the old one.
    t1 = T0 + 8 * DAY
    p1 = reconcile(api, body, t1)
    assert p1.cluster_ca.phase is CaPhase.TRUSTING_NEW
    ca = read_secret(api, "rot-cluster-ca")
    assert set(ca) == {"ca.crt", "ca.key", "next-ca.crt", "next-ca.key"}
    for role in ROLES:
        tls = read_secret(api, f"rot-{role}-tls")
        assert [c.subject for c in load_certificates(tls["ca.crt"])] == [
            old.subject, load_certificate(ca["next-ca.crt"]).subject]  # type: ignore[union-attr]
    # Waits: the pods run the old revisions, then alice's Secret lacks the new CA.
    assert "waiting for pods" in reconcile(api, body, t1).ca_decision.message
    # The whole reconciliation reports it and comes back soon.
    whole = with_runtime(api, lambda rt: reconcile_cluster(rt, body))
    assert whole.retry and whole.status["clusterCa"]["phase"] == "TrustingNewCa"
    assert whole.status["clusterCa"]["managed"] is True
    assert "waiting for pods to restart" in whole.status["clusterCa"]["message"]
    put_pods(api, "rot", p1.revisions)
    after_roll = versions(api)
    waiting = reconcile(api, body, t1)
    assert waiting.ca_decision.message.endswith("trust the new CA: alice")
    assert versions(api) == after_roll  # waiting writes nothing
    put_user(api, "rot", "alice", user_data(api, "rot", "alice", t1))

    # Phase 2: the new CA signs; the next-ca keys are removed from the Secret (merge patch).
    p2 = reconcile(api, body, t1)
    assert p2.cluster_ca.phase is CaPhase.REISSUING
    ca = read_secret(api, "rot-cluster-ca")
    assert set(ca) == {"ca.crt", "ca.key", "previous-ca.crt"}
    assert ca["previous-ca.crt"] == old.public_bytes(serialization.Encoding.PEM)
    new = with_runtime(api, lambda rt: rt.cluster_ca(body))
    assert new.phase is CaPhase.REISSUING and new.managed
    for role in ROLES:
        cert = load_certificate(read_secret(api, f"rot-{role}-tls")["service.pem"])
        assert cert is not None and signed_by(cert, new.signing)
    put_pods(api, "rot", p2.revisions)
    assert reconcile(api, body, t1).ca_decision.message.endswith("new CA: alice")
    put_user(api, "rot", "alice", user_data(api, "rot", "alice", t1))
    alice = load_certificate(read_secret(api, "alice")["user.crt"])
    assert alice is not None and signed_by(alice, new.signing)

    # Phase 3: the old CA goes; one more roll and nothing changes any more.
    p3 = reconcile(api, body, t1)
    assert p3.cluster_ca.phase is CaPhase.STABLE
    assert set(read_secret(api, "rot-cluster-ca")) == {"ca.crt", "ca.key"}
    for role in ROLES:
        assert read_secret(api, f"rot-{role}-tls")["ca.crt"] == new.signing.pem()
    put_pods(api, "rot", p3.revisions)
    done = versions(api)
    assert reconcile(api, body, t1 + DAY).secrets == [] and versions(api) == done


def test_a_supplied_ca_is_kept_and_reported_as_expiring(api: ApiServer) -> None:
    mine = make_ca("my company's CA", validity=10 * DAY)
    put_user(api, "adopt", "adopt-cluster-ca", {"ca.crt": mine.pem(), "ca.key": mine.key_pem()})
    body = cluster(api, "adopt")
    plan = with_runtime(api, lambda rt: reconcile_cluster(rt, body))
    status = plan.status["clusterCa"]
    assert status["managed"] is False and status["expiring"] is True
    assert status["phase"] == "Stable"
    assert "supplied, not made by the operator" in status["message"]
    assert read_secret(api, "adopt-cluster-ca") == {"ca.crt": mine.pem(), "ca.key": mine.key_pem()}
    for role in ROLES:
        cert = load_certificate(read_secret(api, f"adopt-{role}-tls")["service.pem"])
        assert cert is not None and signed_by(cert, mine)


def test_the_managed_etcd_secret_and_members_are_part_of_the_renewal(api: ApiServer) -> None:
    """With ``spec.etcd.managed`` the handler writes ``X-etcd-tls`` beside the roles' Secrets,
    its revision reaches the etcd StatefulSet's template, and a CA renewal's phases wait for
    the etcd members (listed by label) like the services' pods."""
    body = api.create("fjordclusters", NAMESPACE, {
        "apiVersion": s.API_VERSION, "kind": s.CLUSTER_KIND,
        "metadata": {"name": "etc", "namespace": NAMESPACE},
        "spec": {"brokers": {"replicas": 2}, "etcd": {"managed": {"replicas": 3}},
                 "security": {"tls": True, "clusterCa": {"validityDays": 10,
                                                         "renewalDays": 3}}},
    })
    roles = (*ROLES, "etcd")

    def put_all_pods(revisions: dict[str, str], stale: str | None = None) -> None:
        put_pods(api, "etc", revisions)
        for i in range(3):
            pod = f"etc-etcd-{i}"
            revision = "stale" if pod == stale else revisions["etcd"]
            meta = {"name": pod, "labels": builders.labels("etc", "etcd"),
                    "annotations": {s.TLS_REVISION_ANNOTATION: revision}}
            if api.get("pods", NAMESPACE, pod) is None:
                api.create("pods", NAMESPACE, {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                                               "spec": {"containers": [{"name": "etcd",
                                                                        "image": "etcd"}]}})
            else:
                api.patch("pods", NAMESPACE, pod,
                          {"metadata": {"annotations": meta["annotations"]}})

    with_runtime(api, lambda rt: reconcile_cluster(rt, body))
    etcd = live_secret(api, "etc-etcd-tls")
    assert etcd is not None and etcd["metadata"]["ownerReferences"][0]["uid"] == \
        body["metadata"]["uid"]
    first = reconcile(api, body, T0)
    assert first.secrets == [] and set(first.revisions) == set(roles)
    sts = api.get("statefulsets", NAMESPACE, "etc-etcd")
    assert sts is not None
    assert sts["spec"]["template"]["metadata"]["annotations"][s.TLS_REVISION_ANNOTATION] == \
        first.revisions["etcd"]
    put_all_pods(first.revisions)

    t1 = T0 + 8 * DAY
    p1 = reconcile(api, body, t1)
    assert p1.cluster_ca.phase is CaPhase.TRUSTING_NEW and "etcd" in p1.renewed
    assert len(load_certificates(read_secret(api, "etc-etcd-tls")["ca.crt"])) == 2
    put_all_pods(p1.revisions, stale="etc-etcd-1")
    waiting = reconcile(api, body, t1)
    assert waiting.ca_decision.message.endswith("etc-etcd-1"), waiting.ca_decision.message
    put_all_pods(p1.revisions)
    p2 = reconcile(api, body, t1)
    assert p2.cluster_ca.phase is CaPhase.REISSUING
    cert = load_certificate(read_secret(api, "etc-etcd-tls")["service.pem"])
    assert cert is not None and signed_by(cert, p2.ca)


def test_a_running_plaintext_etcd_of_three_members_is_not_moved_to_tls(api: ApiServer) -> None:
    """An operator upgraded under a secure cluster whose 3-member managed etcd runs plaintext
    (or TLS turned on later): the handler leaves that StatefulSet as it is (its members' http
    peer URLs are in etcd's data) and the services keep dialling it over http."""
    spec = {"brokers": {"replicas": 2}, "etcd": {"managed": {"replicas": 3}}}
    body = api.create("fjordclusters", NAMESPACE, {
        "apiVersion": s.API_VERSION, "kind": s.CLUSTER_KIND,
        "metadata": {"name": "old", "namespace": NAMESPACE}, "spec": spec})
    plaintext = builders.etcd_objects(body)[1]
    api.create("statefulsets", NAMESPACE, plaintext)
    body = api.patch("fjordclusters", NAMESPACE, "old", {"spec": {"security": {"tls": True}}})
    with_runtime(api, lambda rt: reconcile_cluster(rt, body))
    sts = api.get("statefulsets", NAMESPACE, "old-etcd")
    assert sts is not None
    assert sts["spec"]["template"]["spec"] == plaintext["spec"]["template"]["spec"]
    assert live_secret(api, "old-etcd-tls") is None
    assert live_secret(api, "old-broker-tls") is not None  # the services do move to TLS
    config = api.get("configmaps", NAMESPACE, "old-config")
    assert config is not None and config["data"]["FJORD_ETCD"] == "http://old-etcd.fjord-ca.svc:2379"
