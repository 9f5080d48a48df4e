"""The managed etcd's command line, for real (issue 16): three etcd processes started with
exactly the flags the operator's StatefulSet gives each member and the files of the Secret it
plans, only the in-cluster names and ports mapped to loopback and free ports (and the mount
and data paths to temporary directories). They form a quorum over https peers; a Fjord
service's certificate opens etcd through Fjord's metadata client, a FjordUser's certificate
of the same CA, the operator's, or none is refused; a member restarted alone (as a roll does)
rejoins while the other two keep serving; a cluster-CA renewal's three phases, each rolled
one member at a time, keep the quorum and every service's certificate of either phase
working."""

from __future__ import annotations

import asyncio
import datetime
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aetcd.exceptions import ConnectionFailedError

from fjord.local.etcd import EtcdProcess, find_etcd_binary, free_port, log_tail, stop_process
from fjord.metadata.etcd import etcd_client
from fjord.security.config import ClientSecurity, SecurityProtocol, TlsFiles
from fjord.testing.waiting import wait_for
from fjord.tls import write_private
from fjord_operator import builders
from fjord_operator import settings as s
from fjord_operator.ca_rotation import CaPhase
from fjord_operator.security import (
    TLS,
    cluster_security,
    decode_secret,
    operator_identity,
    plan_certificates,
    plan_user_credentials,
    tls_revision,
    tls_roles,
)
from tests.helpers.operator_specs import cluster, expand_kubelet_references

MEMBERS = 3
HEALTHY_S = 30.0
PORT_ATTEMPTS = 3


@dataclass
class Member:
    name: str
    argv: list[str]
    metrics_url: str
    client_url: str
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)

    def healthy(self) -> bool:
        """What the kubelet's readiness probe asks: plain-http /health on the metrics port."""
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited:\n{log_tail(self.log)}")
        return EtcdProcess.health_at(self.metrics_url)


@dataclass
class SecureEtcd:
    members: list[Member]
    files: dict[str, TlsFiles]  # who dials: their CA and client certificate
    body: dict[str, Any]
    secrets: dict[str, dict[str, bytes]]  # the cluster's Secrets as planned last
    etcd_tls: Path  # what the members mount

    def security(self, who: str) -> ClientSecurity:
        return ClientSecurity(SecurityProtocol.SSL, self.files[who])


def localized(argv: list[str], mapping: dict[str, str]) -> list[str]:
    """``argv`` with each ``mapping`` key replaced (every key must occur: nothing the builder
    writes is dropped or missed)."""
    out = []
    for arg in argv:
        for old, new in mapping.items():
            arg = arg.replace(old, new)
        out.append(arg)
    for old in mapping:
        assert any(old in arg for arg in argv), f"{old!r} is not in the builder's command"
    return out


def write_files(directory: Path, data: dict[str, bytes]) -> Path:
    directory.mkdir()
    for key, value in data.items():
        write_private(directory / key, value)
    return directory


@pytest.fixture(scope="module")
def secure_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureEtcd]:
    # A cluster CA made 36 hours ago for 2 days, renewed 1 day before its end: its renewal is
    # due now (the renewal test), and every certificate is valid now.
    body = cluster(etcd={"managed": {"replicas": MEMBERS}}, security={
        "tls": True, "clusterCa": {"validityDays": 2, "renewalDays": 1}})
    security = cluster_security(body["spec"])
    assert security is not None
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=36)
    plan = plan_certificates(body, security, None, {}, now, ca_managed=True)
    secrets = {o["metadata"]["name"]: decode_secret(o) or {} for o in plan.secrets}
    base = tmp_path_factory.mktemp("managed-etcd-tls")
    etcd_tls = write_files(base / "etcd-tls", secrets["fjord-etcd-tls"])
    broker = write_files(base / "broker-tls", secrets["fjord-broker-tls"])
    user = plan_user_credentials("alice", TLS, plan.ca, None, now, security.validity,
                                 security.renew_before, trust=plan.trust)
    user_dir = write_files(base / "alice", user.data)
    operator_cert, operator_key = operator_identity(plan.ca, now)
    operator = write_files(base / "operator", {"cert.pem": operator_cert,
                                               "key.pem": operator_key})
    keystore, ca = str(broker / s.SERVICE_KEYSTORE_KEY), str(broker / s.CA_CERT_KEY)
    files = {
        "broker": TlsFiles(ca, keystore, keystore),
        "user": TlsFiles(ca, str(user_dir / s.USER_CERT_KEY), str(user_dir / s.USER_KEY_KEY)),
        "operator": TlsFiles(ca, str(operator / "cert.pem"), str(operator / "key.pem")),
        "nobody": TlsFiles(ca),
    }
    pod = builders.etcd_objects(body)[1]["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    members = start_members(command, etcd_tls, base)
    try:
        yield SecureEtcd(members, files, body, secrets, etcd_tls)
    finally:
        for member in members:
            member.stop()


def start_members(command: list[str], etcd_tls: Path, base: Path) -> list[Member]:
    """The :data:`MEMBERS` members of the builder's ``command`` on free loopback ports, started
    and healthy. A port is only known free when picked: a member that exited because another
    process bound one of its ports first stops the attempt, and the members start again on new
    ports and new data directories (each knows every peer's port), at most PORT_ATTEMPTS
    times."""
    for attempt in range(PORT_ATTEMPTS):
        ports = [{p: free_port() for p in ("client", "peer", "metrics")} for _ in range(MEMBERS)]
        members = []
        for i in range(MEMBERS):
            name = f"fjord-etcd-{i}"
            mapping = {
                s.ETCD_TLS_MOUNT_DIR: str(etcd_tls),
                s.ETCD_DATA_DIR: str(base / f"data-{i}-{attempt}"),
                f"0.0.0.0:{s.ETCD_CLIENT_PORT}": f"127.0.0.1:{ports[i]['client']}",
                f"0.0.0.0:{s.ETCD_PEER_PORT}": f"127.0.0.1:{ports[i]['peer']}",
                f"0.0.0.0:{s.ETCD_METRICS_PORT}": f"127.0.0.1:{ports[i]['metrics']}",
                f"{name}.fjord-etcd.fjord.svc:{s.ETCD_CLIENT_PORT}":
                    f"127.0.0.1:{ports[i]['client']}",
                **{f"fjord-etcd-{j}.fjord-etcd.fjord.svc:{s.ETCD_PEER_PORT}":
                   f"127.0.0.1:{ports[j]['peer']}" for j in range(MEMBERS)},
            }
            argv = localized(expand_kubelet_references(command, {"POD_NAME": name}), mapping)
            assert argv[0] == "etcd"
            members.append(Member(name, [find_etcd_binary(), *argv[1:]],
                                  f"http://127.0.0.1:{ports[i]['metrics']}",
                                  f"https://127.0.0.1:{ports[i]['client']}",
                                  base / f"{name}-{attempt}.log"))
        try:
            for member in members:
                member.start()
            for member in members:
                wait_for(member.healthy, f"{member.name} healthy", HEALTHY_S)
            return members
        except AssertionError as exc:
            for member in members:
                member.stop()
            if "address already in use" not in str(exc) or attempt == PORT_ATTEMPTS - 1:
                raise
        except BaseException:
            for member in members:
                member.stop()
            raise
    raise AssertionError("unreachable")


async def put_get(url: str, security: ClientSecurity, key: bytes, value: bytes) -> Any:
    async with etcd_client(url, timeout_s=5.0, security=security) as client:
        await client.put(key, value)
        return (await client.get(key)).value


def test_a_services_certificate_opens_every_member(secure_etcd: SecureEtcd) -> None:
    for i, member in enumerate(secure_etcd.members):
        key, value = f"/fjord/test/{i}".encode(), f"from-{member.name}".encode()
        got = asyncio.run(put_get(member.client_url, secure_etcd.security("broker"), key, value))
        assert got == value
    # Written through one member, read through another: one raft group over https peers.
    async def read_back() -> Any:
        url = secure_etcd.members[2].client_url
        async with etcd_client(url, timeout_s=5.0,
                               security=secure_etcd.security("broker")) as client:
            return (await client.get(b"/fjord/test/0")).value

    assert asyncio.run(read_back()) == b"from-fjord-etcd-0"


@pytest.mark.parametrize("who", ["user", "operator", "nobody"])
def test_other_certificates_of_the_cluster_ca_and_none_are_refused(
    secure_etcd: SecureEtcd, who: str
) -> None:
    """A FjordUser's certificate and the operator's are of the same CA but name no
    ``localhost``: etcd refuses them, as it refuses a client without a certificate."""
    url = secure_etcd.members[0].client_url
    with pytest.raises(ConnectionFailedError, match="handshake"):
        asyncio.run(put_get(url, secure_etcd.security(who), b"/fjord/test/x", b"no"))


def test_a_member_restarted_alone_rejoins_while_two_keep_the_quorum(
    secure_etcd: SecureEtcd,
) -> None:
    first, *others = secure_etcd.members
    first.stop()
    security = secure_etcd.security("broker")
    got = asyncio.run(put_get(others[0].client_url, security, b"/fjord/test/roll", b"during"))
    assert got == b"during"
    first.start()
    wait_for(first.healthy, f"{first.name} healthy again", HEALTHY_S)
    async def read_on_first() -> Any:
        async with etcd_client(first.client_url, timeout_s=5.0, security=security) as client:
            return (await client.get(b"/fjord/test/roll")).value

    assert asyncio.run(read_on_first()) == b"during"


def test_a_cluster_ca_renewal_rolls_the_members_and_keeps_every_service_in(
    secure_etcd: SecureEtcd, tmp_path: Path
) -> None:
    """Each phase (trust old + new, re-issue by the new CA, drop the old) as the operator plans
    it: the etcd Secret's files replaced, the members restarted one at a time as the
    StatefulSet rolls them (writes go on through the other two meanwhile); then a broker
    still on the previous phase's Secret and one on the current Secret both open every
    member (services and etcd roll at the same time)."""
    body, store = secure_etcd.body, secure_etcd.secrets
    security = cluster_security(body["spec"])
    assert security is not None
    roles = tls_roles(body["spec"])
    revisions = {r: tls_revision(store[f"fjord-{r}-tls"]) for r in roles}
    previous = secure_etcd.files["broker"]
    phases = []
    for step in range(3):
        plan = plan_certificates(
            body, security, store["fjord-cluster-ca"],
            {r: store[f"fjord-{r}-tls"] for r in roles}, datetime.datetime.now(datetime.UTC),
            ca_managed=True, users={},
            # every pod runs its role's current Secret (the roll of the phase before is done)
            pods={r: {f"fjord-{r}-{i}": revisions[r] for i in range(MEMBERS)} for r in roles},
        )
        assert plan.ca_decision.changed, plan.ca_decision.message
        phases.append(plan.cluster_ca.phase)
        for obj in plan.secrets:
            store[obj["metadata"]["name"]] = decode_secret(obj) or {}
        revisions = dict(plan.revisions)
        for key, value in store["fjord-etcd-tls"].items():
            write_private(secure_etcd.etcd_tls / key, value)
        for member in reversed(secure_etcd.members):  # as the StatefulSet rolls: N-1 .. 0
            member.stop()
            other = next(m for m in secure_etcd.members if m is not member)
            value = f"{step}-{member.name}".encode()
            got = asyncio.run(put_get(other.client_url, ClientSecurity(
                SecurityProtocol.SSL, previous), b"/fjord/test/ca", value))
            assert got == value  # two members keep the quorum
            member.start()
            wait_for(member.healthy, f"{member.name} healthy on phase {step}", HEALTHY_S)
        current = write_files(tmp_path / f"broker-{step}", store["fjord-broker-tls"])
        keystore = str(current / s.SERVICE_KEYSTORE_KEY)
        now_files = TlsFiles(str(current / s.CA_CERT_KEY), keystore, keystore)
        for files in (previous, now_files):
            for member in secure_etcd.members:
                got = asyncio.run(put_get(member.client_url, ClientSecurity(
                    SecurityProtocol.SSL, files), b"/fjord/test/ca", b"after"))
                assert got == b"after"
        previous = now_files
    assert phases == [CaPhase.TRUSTING_NEW, CaPhase.REISSUING, CaPhase.STABLE]


def test_one_member_started_plaintext_comes_back_on_https_with_its_data(tmp_path: Path) -> None:
    """What the operator does to a running 1-member etcd when TLS comes on (a 3-member one
    is kept plaintext: builders.with_running_etcd): the builder's plaintext flags, a write,
    then the builder's TLS flags on the same data directory, the write read back."""
    secure_body = cluster(etcd={"managed": {"replicas": 1}}, security={"tls": True})
    plain_body = cluster(etcd={"managed": {"replicas": 1}})
    security = cluster_security(secure_body["spec"])
    assert security is not None
    plan = plan_certificates(secure_body, security, None, {},
                             datetime.datetime.now(datetime.UTC))
    secrets = {o["metadata"]["name"]: decode_secret(o) or {} for o in plan.secrets}
    etcd_tls = write_files(tmp_path / "etcd-tls", secrets["fjord-etcd-tls"])
    broker = write_files(tmp_path / "broker-tls", secrets["fjord-broker-tls"])
    client, peer, metrics = free_port(), free_port(), free_port()
    host = "fjord-etcd-0.fjord-etcd.fjord.svc"

    def member(body: dict[str, Any], secure: bool) -> Member:
        mapping = {
            s.ETCD_DATA_DIR: str(tmp_path / "data"),
            f"0.0.0.0:{s.ETCD_CLIENT_PORT}": f"127.0.0.1:{client}",
            f"0.0.0.0:{s.ETCD_PEER_PORT}": f"127.0.0.1:{peer}",
            f"{host}:{s.ETCD_CLIENT_PORT}": f"127.0.0.1:{client}",
            f"{host}:{s.ETCD_PEER_PORT}": f"127.0.0.1:{peer}",
        }
        if secure:
            mapping[s.ETCD_TLS_MOUNT_DIR] = str(etcd_tls)
            mapping[f"0.0.0.0:{s.ETCD_METRICS_PORT}"] = f"127.0.0.1:{metrics}"
        command = builders.etcd_objects(body)[1]["spec"]["template"]["spec"]["containers"][0][
            "command"]
        argv = localized(expand_kubelet_references(command, {"POD_NAME": "fjord-etcd-0"}),
                         mapping)
        scheme = "https" if secure else "http"
        return Member("fjord-etcd-0", [find_etcd_binary(), *argv[1:]],
                      f"http://127.0.0.1:{metrics if secure else client}",
                      f"{scheme}://127.0.0.1:{client}", tmp_path / "etcd.log")

    plain = member(plain_body, secure=False)
    plain.start()
    try:
        wait_for(plain.healthy, "plaintext etcd healthy", HEALTHY_S)
        assert asyncio.run(put_get(plain.client_url, ClientSecurity(), b"/fjord/kept",
                                   b"before")) == b"before"
    finally:
        plain.stop()
    secure = member(secure_body, secure=True)
    secure.start()
    try:
        wait_for(secure.healthy, "the same etcd healthy on https", HEALTHY_S)
        keystore = str(broker / s.SERVICE_KEYSTORE_KEY)
        files = TlsFiles(str(broker / s.CA_CERT_KEY), keystore, keystore)

        async def read() -> Any:
            async with etcd_client(secure.client_url, timeout_s=5.0,
                                   security=ClientSecurity(SecurityProtocol.SSL, files)) as c:
                return (await c.get(b"/fjord/kept")).value

        assert asyncio.run(read()) == b"before"
    finally:
        secure.stop()
