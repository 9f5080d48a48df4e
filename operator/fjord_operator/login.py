"""How the operator logs in to the Kubernetes API: one resolution for kopf's watches and for
lightkube's writes, so both always talk to the same server with the same credentials.

Order (the one client-go and kubectl follow):
1. an explicit kubeconfig (``--kubeconfig`` / FJORD_OPERATOR_KUBECONFIG);
2. in-cluster: the pod's service account (token, ``ca.crt``, ``namespace`` under
   ``/var/run/secrets/kubernetes.io/serviceaccount``) with KUBERNETES_SERVICE_HOST/PORT;
3. the ``KUBECONFIG`` variable, else ``~/.kube/config``.
``--kube-server`` then replaces only the server URL (a port-forward, a proxy), keeping the
credentials and CA found above, as ``kubectl --server`` does. A plain ``http://`` server with no
configuration anywhere is used anonymously (the in-memory API emulator of the unit tests).

Kubeconfig parsing is lightkube's (:class:`lightkube.KubeConfig`), not ours: its
:class:`SingleConfig` is turned into kopf's :class:`kopf.ConnectionInfo`, paths made absolute
relative to the kubeconfig file and inline ``*-data`` fields passed as data.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fjord.errors import ConfigError

#: Where Kubernetes mounts a pod's service-account token, CA and namespace.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True, slots=True)
class KubeLogin:
    """The resolved login: lightkube's :class:`KubeConfig` (what lightkube's client takes) and
    where it came from (``kubeconfig FILE``, ``in-cluster``, ``anonymous URL``), for logs and
    errors."""

    config: Any
    source: str


def resolve_login(
    *,
    server: str | None = None,
    kubeconfig: str | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> KubeLogin:
    """The login to use (see the module docstring for the order). Raises ConfigError naming
    every place that was looked at when none gives a usable configuration."""
    from lightkube import KubeConfig
    from lightkube.core import exceptions

    tried: list[str] = []
    config: Any = None
    source = ""
    try:
        if kubeconfig:
            tried.append(f"kubeconfig {kubeconfig}")
            config, source = KubeConfig.from_file(kubeconfig), f"kubeconfig {kubeconfig}"
        else:
            tried.append(f"in-cluster service account ({service_account_dir})")
            try:
                config = KubeConfig.from_service_account(service_account=service_account_dir)
                source = "in-cluster"
            except (exceptions.ConfigError, KeyError):
                import os

                path = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
                path = path.split(os.pathsep)[0]
                tried.append(f"kubeconfig {path}")
                if Path(path).is_file():
                    config, source = KubeConfig.from_file(path), f"kubeconfig {path}"
    except exceptions.ConfigError as exc:
        raise ConfigError(f"cannot use {tried[-1]}: {exc}") from exc
    if config is None:
        if server and server.startswith("http://"):
            from lightkube.config.models import Cluster, User

            # An empty user: lightkube's client insists on one, and it sends no credentials.
            anonymous = KubeConfig.from_one(cluster=Cluster(server=server), user=User())
            return KubeLogin(anonymous, f"anonymous {server}")
        raise ConfigError(
            "no Kubernetes credentials: tried "
            + ", ".join(tried)
            + " (run in a pod with a service account, or pass --kubeconfig)"
        )
    if server:
        single = config.get()
        cluster = _replace(single.cluster, server=server)
        # Relative certificate paths stay relative to the kubeconfig file they came from.
        config = KubeConfig.from_one(
            cluster=_absolute_cluster(single, cluster),
            user=_absolute_user(single),
            namespace=single.namespace,
        )
        source = f"{source}, server {server}"
    return KubeLogin(config, source)


def connection_info(login: KubeLogin) -> Any:
    """kopf's ConnectionInfo for ``login``: server, CA (file or inline), insecure flag, and a
    token, a client certificate, or basic auth, as the kubeconfig or service account has."""
    import kopf

    single = login.config.get()
    cluster, user = single.cluster, single.user
    kwargs: dict[str, Any] = {
        "server": cluster.server,
        "default_namespace": single.namespace,
        "insecure": bool(cluster.insecure) or None,
    }
    if cluster.certificate_auth:
        kwargs["ca_path"] = str(single.abs_file(cluster.certificate_auth))
    elif cluster.certificate_auth_data:
        kwargs["ca_data"] = base64.b64decode(cluster.certificate_auth_data)
    if user is not None:
        if user.exec is not None or user.auth_provider is not None:
            raise ConfigError(
                f"{login.source}: exec and auth-provider logins are not supported by the operator;"
                " use a token, a client certificate or a service account"
            )
        token = user.token
        if token is None and user.token_file:
            token = Path(single.abs_file(user.token_file)).read_text().strip()
        if token:
            kwargs["token"] = token.strip()
            kwargs["scheme"] = "Bearer"
        if user.client_cert:
            kwargs["certificate_path"] = str(single.abs_file(user.client_cert))
        elif user.client_cert_data:
            kwargs["certificate_data"] = base64.b64decode(user.client_cert_data)
        if user.client_key:
            kwargs["private_key_path"] = str(single.abs_file(user.client_key))
        elif user.client_key_data:
            kwargs["private_key_data"] = base64.b64decode(user.client_key_data)
        if user.username and user.password:
            kwargs["username"], kwargs["password"] = user.username, user.password
    return kopf.ConnectionInfo(**kwargs)


def _replace(struct: Any, **changes: Any) -> Any:
    import msgspec

    return msgspec.structs.replace(struct, **changes)


def _absolute_cluster(single: Any, cluster: Any) -> Any:
    if cluster.certificate_auth:
        return _replace(cluster, certificate_auth=str(single.abs_file(cluster.certificate_auth)))
    return cluster


def _absolute_user(single: Any) -> Any:
    user = single.user
    if user is None:
        return None
    changes = {
        name: str(single.abs_file(getattr(user, name)))
        for name in ("client_cert", "client_key", "token_file")
        if getattr(user, name)
    }
    return _replace(user, **changes) if changes else user
