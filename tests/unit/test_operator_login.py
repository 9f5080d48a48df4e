"""The operator's login resolution (fjord_operator.login): kubeconfig with a token or a client
certificate, in-cluster service account, --kube-server override, anonymous emulator URL, and a
clear error when nothing is there. The same logins against a real kube-apiserver are in
tests/k8s/test_operator_real_api.py."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from fjord.errors import ConfigError
from fjord_operator.login import connection_info, resolve_login

CA_PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def _kubeconfig(path: Path, user: dict[str, object], cluster: dict[str, object]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": "u", "user": user}],
                "contexts": [
                    {"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "kafka"}}
                ],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture
def no_ambient_login(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No in-cluster variables and a KUBECONFIG that does not exist."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    return tmp_path / "no-service-account"


def test_kubeconfig_with_token_and_inline_ca(tmp_path: Path, no_ambient_login: Path) -> None:
    cfg = _kubeconfig(
        tmp_path / "kc",
        {"token": "s3cret"},
        {
            "server": "https://10.1.2.3:6443",
            "certificate-authority-data": base64.b64encode(CA_PEM).decode(),
        },
    )
    login = resolve_login(kubeconfig=str(cfg), service_account_dir=no_ambient_login)
    info = connection_info(login)
    assert info.server == "https://10.1.2.3:6443"
    assert info.token == "s3cret" and info.scheme == "Bearer"
    assert info.ca_data == CA_PEM and info.ca_path is None
    assert info.default_namespace == "kafka"
    assert login.source == f"kubeconfig {cfg}"


def test_kubeconfig_client_certificate_paths_are_relative_to_the_file(
    tmp_path: Path, no_ambient_login: Path
) -> None:
    (tmp_path / "conf").mkdir()
    cfg = _kubeconfig(
        tmp_path / "conf" / "kc",
        {"client-certificate": "admin.crt", "client-key": "/abs/admin.key"},
        {"server": "https://127.0.0.1:6443", "certificate-authority": "ca.crt"},
    )
    info = connection_info(resolve_login(kubeconfig=str(cfg), service_account_dir=no_ambient_login))
    assert info.ca_path == str(tmp_path / "conf" / "ca.crt")
    assert info.certificate_path == str(tmp_path / "conf" / "admin.crt")
    assert info.private_key_path == "/abs/admin.key"
    assert info.token is None


def test_in_cluster_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_ambient_login: Path
) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("pod-token\n")
    (sa / "ca.crt").write_bytes(CA_PEM)
    (sa / "namespace").write_text("fjord")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    login = resolve_login(service_account_dir=sa)
    info = connection_info(login)
    assert login.source == "in-cluster"
    assert info.server == "https://10.96.0.1:443"
    assert info.token == "pod-token"
    assert info.ca_path == str(sa / "ca.crt")
    assert info.default_namespace == "fjord"


def test_kube_server_replaces_only_the_url(tmp_path: Path, no_ambient_login: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(CA_PEM)
    cfg = _kubeconfig(
        tmp_path / "kc",
        {"token": "t"},
        {"server": "https://far.away:6443", "certificate-authority": "ca.crt"},
    )
    login = resolve_login(
        server="https://127.0.0.1:16443", kubeconfig=str(cfg), service_account_dir=no_ambient_login
    )
    info = connection_info(login)
    assert info.server == "https://127.0.0.1:16443"
    assert info.token == "t"
    assert info.ca_path == str(tmp_path / "ca.crt")
    assert login.config.get().cluster.server == "https://127.0.0.1:16443"


def test_plain_http_url_without_any_config_is_anonymous(no_ambient_login: Path) -> None:
    login = resolve_login(server="http://127.0.0.1:8001", service_account_dir=no_ambient_login)
    info = connection_info(login)
    assert info.server == "http://127.0.0.1:8001"
    assert info.token is None and info.certificate_path is None
    # lightkube's client accepts it (it insists on a user, even an empty one).
    from lightkube import AsyncClient

    AsyncClient(config=login.config)


def test_nothing_found_names_every_place_tried(no_ambient_login: Path) -> None:
    with pytest.raises(ConfigError, match="no Kubernetes credentials: tried in-cluster") as err:
        resolve_login(service_account_dir=no_ambient_login)
    assert "absent" in str(err.value)
    with pytest.raises(ConfigError, match="no Kubernetes credentials"):
        resolve_login(server="https://127.0.0.1:6443", service_account_dir=no_ambient_login)


def test_exec_logins_are_refused_clearly(tmp_path: Path, no_ambient_login: Path) -> None:
    cfg = _kubeconfig(
        tmp_path / "kc",
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws"}},
        {"server": "https://127.0.0.1:6443"},
    )
    login = resolve_login(kubeconfig=str(cfg), service_account_dir=no_ambient_login)
    with pytest.raises(ConfigError, match="exec and auth-provider logins are not supported"):
        connection_info(login)


def test_unreadable_kubeconfig_is_a_config_error(tmp_path: Path, no_ambient_login: Path) -> None:
    with pytest.raises(ConfigError, match="cannot use kubeconfig"):
        resolve_login(kubeconfig=str(tmp_path / "missing"), service_account_dir=no_ambient_login)
