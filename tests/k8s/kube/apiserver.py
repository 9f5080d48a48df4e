"""A real Kubernetes control plane for the tests: kube-apiserver and kube-controller-manager
v1.20.2 built by `make kube` (tests/k8s/kube/build.sh) into .cache/kube/bin, on loopback, over
TLS only, with etcd from the caller (the session etcd of tests/conftest.py, under a key prefix
of its own).

What runs: the API server (token file and client-certificate authentication, RBAC, a
service-account signing key, aggregated discovery, CRDs, admission, server-side dry-run) and the
controller manager's namespace, garbage-collector, service-account, token, StatefulSet,
Deployment, ReplicaSet, Job and disruption controllers. What does not: no scheduler, no kubelet
(pods are created and stay Pending), no CRD validation rules (CEL arrived in 1.25).

Invariants: every listening port is a free loopback port; every wait is bounded; :meth:`stop`
ends exactly the processes :meth:`start` started, by their process groups.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fjord.local.etcd import free_port, log_size, log_tail
from fjord.testing.waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]
KUBE_DIR = ROOT / ".cache" / "kube"
KUBE_BIN = KUBE_DIR / "bin"
BINARIES = ("kube-apiserver", "kube-controller-manager")

READY_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0
KUBECTL_TIMEOUT_S = 60.0
PROBE_TIMEOUT_S = 5.0
PORT_ATTEMPTS = 3
"""How many free ports kube-apiserver is started on before a port taken each time fails."""

#: The identity of the tests and of kube-controller-manager (system:masters bypasses RBAC).
ADMIN_USER, ADMIN_GROUP = "fjord-test-admin", "system:masters"
#: A user with a token and no group (the token file is read once, at start): the tests bind it
#: to the chart's operator rules and run the operator with a kubeconfig holding its token.
OPERATOR_TOKEN_USER = "fjord-operator-token"
#: Controllers kube-controller-manager runs (no node, route or volume controllers: no nodes).
CONTROLLERS = (
    "namespace",
    "garbagecollector",
    "serviceaccount",
    "serviceaccount-token",
    "statefulset",
    "deployment",
    "replicaset",
    "job",
    "disruption",
)
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"


class KubeMissing(RuntimeError):
    """The binaries are not built; the message names `make kube`."""


class PortTaken(RuntimeError):
    """kube-apiserver exited because its port was bound by another process first."""


def missing_binaries(bin_dir: Path = KUBE_BIN) -> list[str]:
    return [name for name in BINARIES if not (bin_dir / name).exists()]


def kubectl_binary() -> str:
    """kubectl from the venv (`make helm`)."""
    candidate = Path(sys.executable).parent / "kubectl"
    if not candidate.exists():
        raise KubeMissing("kubectl is not installed: run `make helm` (puts it in .venv/bin)")
    return str(candidate)


# -- PKI ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyPair:
    cert: Path
    key: Path


class Pki:
    """A throwaway CA and the certificates the control plane and the tests need (ECDSA P-256;
    the service-account signing key is RSA, which every token reviewer accepts)."""

    def __init__(self, directory: Path) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fjord-test-ca")])
        now = datetime.datetime.now(datetime.UTC)
        self._ca_name = name
        ca = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca = self._write("ca", ca, self._ca_key)

    def _write(self, stem: str, cert: Any, key: Any) -> KeyPair:
        from cryptography.hazmat.primitives import serialization

        pair = KeyPair(self.dir / f"{stem}.crt", self.dir / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        pair.key.chmod(0o600)
        return pair

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        server_names: tuple[str, ...] = (),
        server_ips: tuple[str, ...] = (),
    ) -> KeyPair:
        """A certificate signed by the CA: a server certificate when names or IPs are given,
        else a client certificate (Kubernetes reads the user from CN, groups from O)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = datetime.datetime.now(datetime.UTC)
        server = bool(server_names or server_ips)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self._ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if server:
            alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in server_names]
            alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in server_ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        return self._write(stem, builder.sign(self._ca_key, hashes.SHA256()), key)

    def service_account_key(self) -> tuple[Path, Path]:
        """(private key, public key) signing and verifying service-account tokens."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        private, public = self.dir / "sa.key", self.dir / "sa.pub"
        private.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        private.chmod(0o600)
        public.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        return private, public


# -- the control plane -------------------------------------------------------------------------


class RealKube:
    """kube-apiserver + kube-controller-manager on loopback (see the module docstring).

    ``admin_kubeconfig`` logs in as ``ADMIN_USER`` (system:masters) with a token;
    :meth:`kubectl` uses it unless told otherwise."""

    def __init__(self, workdir: Path, etcd_url: str, bin_dir: Path = KUBE_BIN) -> None:
        self.dir = workdir
        self.etcd_url = etcd_url
        self.bin_dir = bin_dir
        self.port = 0
        self._log_start = 0  # the API server log's size when its current run started
        self.tokens: dict[str, str] = {}  # user -> bearer token (the token file's entries)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.pki: Pki | None = None
        self.admin_kubeconfig = workdir / "admin.kubeconfig"
        self._tls: ssl.SSLContext | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_path(self) -> Path:
        assert self.pki is not None, "not started"
        return self.pki.ca.cert

    def log_path(self, name: str) -> Path:
        return self.dir / f"{name}.log"

    # -- start and stop

    def start(self, crd_dir: Path | None = None) -> None:
        """Start both; the CRDs in ``crd_dir`` are installed (and Established) before the
        controller manager starts, so its garbage collector knows them from its first
        discovery (it rediscovers only every 30 s)."""
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise KubeMissing(
                f"{', '.join(missing)} not built in {self.bin_dir}: run `make kube` "
                "(builds Kubernetes 1.20 from Debian's source package, several minutes, once)"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pki = pki = Pki(self.dir / "pki")
        serving = pki.issue(
            "apiserver",
            "kube-apiserver",
            server_names=("localhost", "kubernetes", "kubernetes.default.svc"),
            server_ips=("127.0.0.1",),
        )
        sa_private, sa_public = pki.service_account_key()
        token_file = self.dir / "tokens.csv"
        self.tokens = {ADMIN_USER: uuid.uuid4().hex, OPERATOR_TOKEN_USER: uuid.uuid4().hex}
        token_file.write_text(
            f'{self.tokens[ADMIN_USER]},{ADMIN_USER},1,"{ADMIN_GROUP}"\n'
            f"{self.tokens[OPERATOR_TOKEN_USER]},{OPERATOR_TOKEN_USER},2\n"
        )
        token_file.chmod(0o600)
        # The session etcd is shared: this server keeps to keys of its own.
        etcd_prefix = f"/kube-{uuid.uuid4().hex[:12]}"
        for attempt in range(PORT_ATTEMPTS):
            # A port that was free a moment ago: another process (other helpers' test runs
            # share the machine) may bind it before the server does; then a new one.
            self.port = free_port()
            self._log_start = log_size(self.log_path("kube-apiserver"))
            self._spawn(
                "kube-apiserver",
                [
                    f"--etcd-servers={self.etcd_url}",
                    f"--etcd-prefix={etcd_prefix}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    f"--secure-port={self.port}",
                    "--insecure-port=0",
                    f"--tls-cert-file={serving.cert}",
                    f"--tls-private-key-file={serving.key}",
                    f"--client-ca-file={pki.ca.cert}",
                    f"--token-auth-file={token_file}",
                    "--authorization-mode=RBAC",
                    f"--service-account-key-file={sa_public}",
                    f"--service-account-signing-key-file={sa_private}",
                    f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                    f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                    f"--cert-dir={self.dir / 'apiserver-certs'}",
                    "--profiling=false",
                    "--v=1",
                ],
            )
            try:
                wait_for(self._ready, f"kube-apiserver /readyz on {self.url}", READY_TIMEOUT_S,
                         interval=0.2)
                break
            except PortTaken:
                del self.processes["kube-apiserver"]  # it exited
                if attempt == PORT_ATTEMPTS - 1:
                    raise
        self.write_kubeconfig(self.admin_kubeconfig, token=self.tokens[ADMIN_USER])
        if crd_dir is not None:
            self.install_crds(crd_dir)
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={self.admin_kubeconfig}",
                f"--controllers={','.join(CONTROLLERS)}",
                "--port=0",
                "--secure-port=0",
                "--leader-elect=false",
                f"--service-account-private-key-file={sa_private}",
                f"--root-ca-file={pki.ca.cert}",
                "--use-service-account-credentials",
                "--concurrent-gc-syncs=5",
                "--v=1",
            ],
        )
        # The service-account controller creating `default` shows the controllers are working.
        wait_for(
            lambda: (
                self.kubectl(
                    "get", "serviceaccount", "default", "-n", "default", check=False
                ).returncode
                == 0
            ),
            "kube-controller-manager to create the default ServiceAccount",
            READY_TIMEOUT_S,
            interval=0.2,
        )

    def install_crds(self, crd_dir: Path) -> None:
        """kubectl apply the CRDs in ``crd_dir`` and wait until each is Established."""
        # --validate=false: kubectl's own check refuses CRD fields newer than the server, such as
        # CEL rules (x-kubernetes-validations, 1.25); a 1.20 server drops them.
        self.kubectl("apply", "--validate=false", "-f", str(crd_dir))
        names = [
            f"crd/{yaml.safe_load(path.read_text())['metadata']['name']}"
            for path in sorted(crd_dir.glob("*.yaml"))
        ]
        self.kubectl(
            "wait", "--for=condition=Established", *names, f"--timeout={int(READY_TIMEOUT_S)}s"
        )

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.log_path(name), "ab")  # noqa: SIM115 - owned by the child from here
        try:
            self.processes[name] = subprocess.Popen(
                [str(self.bin_dir / name), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group, stopped as one
            )
        finally:
            log.close()

    def _ready(self) -> bool:
        process = self.processes["kube-apiserver"]
        if process.poll() is not None:
            tail = log_tail(self.log_path("kube-apiserver"), lines=30, since=self._log_start)
            error = PortTaken if "address already in use" in tail else RuntimeError
            raise error(f"kube-apiserver exited with {process.returncode}:\n{tail}")
        try:
            return self.get_raw("/readyz") == b"ok"
        except (OSError, urllib.error.URLError):
            return False

    def get_raw(self, path: str, token: str | None = None) -> bytes:
        """GET ``path`` as the admin (or with ``token``); raises urllib's HTTPError on >= 400."""
        return self._send(urllib.request.Request(self.url + path), token)

    def _send(self, request: urllib.request.Request, token: str | None = None) -> bytes:
        if self._tls is None:
            self._tls = ssl.create_default_context(cafile=str(self.ca_path))
        request.add_header("Authorization", f"Bearer {token or self.tokens[ADMIN_USER]}")
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S, context=self._tls) as answer:
            return bytes(answer.read())

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/merge-patch+json",
    ) -> Any:
        """One API call as the admin, JSON in and out; raises urllib's HTTPError on >= 400
        (for the harness that plays the kubelet, which polls faster than kubectl starts)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", content_type)
        return json.loads(self._send(request))

    def stop(self) -> None:
        """Stop the controller manager, then the API server (SIGTERM to each process group,
        SIGKILL after STOP_TIMEOUT_S)."""
        for name in ("kube-controller-manager", "kube-apiserver"):
            process = self.processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(STOP_TIMEOUT_S)

    # -- logins

    def write_kubeconfig(
        self,
        path: Path,
        *,
        token: str | None = None,
        client: KeyPair | None = None,
        namespace: str = "default",
    ) -> Path:
        """A kubeconfig for this server with its CA and a token or a client certificate."""
        user: dict[str, str] = {}
        if token is not None:
            user["token"] = token
        if client is not None:
            user["client-certificate"] = str(client.cert)
            user["client-key"] = str(client.key)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "fjord-test",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca_path)},
                }
            ],
            "users": [{"name": "user", "user": user}],
            "contexts": [
                {
                    "name": "fjord-test",
                    "context": {"cluster": "fjord-test", "user": "user", "namespace": namespace},
                }
            ],
            "current-context": "fjord-test",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def client_certificate(self, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
        """A client certificate for ``user`` in ``groups``, signed by the server's client CA."""
        assert self.pki is not None, "not started"
        return self.pki.issue(f"client-{user.replace(':', '-')}", user, organizations=groups)

    def service_account_token(self, namespace: str, name: str) -> str:
        """The token of ServiceAccount ``namespace/name`` from the Secret the token controller
        makes for it (1.20 still makes one per service account)."""

        def token() -> str | None:
            result = self.kubectl(
                "get", "serviceaccount", name, "-n", namespace, "-o", "json", check=False
            )
            if result.returncode != 0:
                return None
            secrets = json.loads(result.stdout).get("secrets") or []
            for ref in secrets:
                secret = self.kubectl(
                    "get", "secret", ref["name"], "-n", namespace, "-o", "json", check=False
                )
                if secret.returncode == 0 and (data := json.loads(secret.stdout).get("data")):
                    import base64

                    return base64.b64decode(data["token"]).decode()
            return None

        return wait_for(token, f"a token for ServiceAccount {namespace}/{name}", READY_TIMEOUT_S)

    def service_account_mount(self, directory: Path, namespace: str, name: str) -> Path:
        """``directory`` laid out as Kubernetes mounts a pod's service account (token, ca.crt,
        namespace), for the operator's in-cluster login."""
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "token").write_text(self.service_account_token(namespace, name))
        (directory / "ca.crt").write_bytes(self.ca_path.read_bytes())
        (directory / "namespace").write_text(namespace)
        return directory

    def in_cluster_env(self) -> dict[str, str]:
        """The variables Kubernetes gives a pod for reaching its API server."""
        return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(self.port)}

    # -- kubectl

    def kubectl(
        self,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = KUBECTL_TIMEOUT_S,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this server (the admin's kubeconfig unless ``kubeconfig``).
        With ``check``, a non-zero exit raises naming the command and its stderr."""
        command = [kubectl_binary(), f"--kubeconfig={kubeconfig or self.admin_kubeconfig}", *args]
        # kubectl 1.32 against a 1.20 server warns about the version skew on every call.
        result = subprocess.run(
            command,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited with {result.returncode}: {result.stderr}"
            )
        return result

    def can_i(self, user: str, verb: str, resource: str, namespace: str = "") -> str:
        """``kubectl auth can-i VERB RESOURCE --as USER`` (in ``namespace`` unless empty):
        "yes" or "no". ``RESOURCE`` may name a subresource, ``pods/exec``: passed as
        ``--subresource`` (kubectl reads ``TYPE/NAME`` as an object's name otherwise, and
        would answer for the pods named "exec")."""
        where = ["-n", namespace] if namespace else []
        kind, _, subresource = resource.partition("/")
        sub = [f"--subresource={subresource}"] if subresource else []
        result = self.kubectl("auth", "can-i", verb, kind, *sub, *where, "--as", user, check=False)
        return result.stdout.strip()

    def get_json(self, *args: str) -> Any:
        """``kubectl get ARGS -o json`` parsed; None when the object does not exist."""
        result = self.kubectl("get", *args, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise AssertionError(f"kubectl get {' '.join(args)}: {result.stderr}")
        return json.loads(result.stdout)
