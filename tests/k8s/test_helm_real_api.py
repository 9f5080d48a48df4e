"""The chart against the REAL API server (the session's ``real_kube``), as close to `helm install`
as 1.20 allows: `helm install` itself is refused (the chart's ``kubeVersion`` is >= 1.27, and helm
checks it against the server), so the chart rendered by `helm template` is applied with kubectl;
the real Deployment and ReplicaSet controllers create the operator's pod, the harness
(:class:`OperatorKubelet`, tests/k8s/kube/kubelet.py) runs it as the image would (``fjord
operator --namespace=<release namespace>``, logged in with the pod's own service-account token),
and the operator reconciles the chart's minimal FjordCluster sample into its workloads."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fjord.local.cluster import LocalCluster
from fjord.local.etcd import log_tail
from fjord.testing.waiting import wait_for
from fjord_operator.settings import BOOTSTRAP_ANNOTATION
from tests.k8s.crd_validation import CHART_DIR
from tests.k8s.helm import HELM_TIMEOUT_S, helm, helm_binary
from tests.k8s.kube.apiserver import RealKube
from tests.k8s.kube.kubelet import OperatorKubelet

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: A release of its own: its cluster-wide RBAC names must not meet another module's release.
RELEASE, NAMESPACE = "fjord-h", "fjord-helm"
SAMPLE = CHART_DIR / "samples" / "fjordcluster-minimal.yaml"
RECONCILE_TIMEOUT_S = 120.0


def test_helm_install_is_refused_by_the_1_20_server(real_kube: RealKube, tmp_path: Path) -> None:
    env = {**os.environ, "KUBECONFIG": str(real_kube.admin_kubeconfig), "HOME": str(tmp_path)}

    def install(*extra: str) -> subprocess.CompletedProcess[str]:
        args = ["install", RELEASE, str(CHART_DIR), "-n", NAMESPACE, "--create-namespace", *extra]
        return subprocess.run(
            [helm_binary(), *args], env=env, capture_output=True, text=True, timeout=HELM_TIMEOUT_S
        )

    # helm installs the chart's CRDs first, by server-side apply, before it checks kubeVersion:
    # 1.20's apply refuses the CEL rules (x-kubernetes-validations) it does not know.
    with_crds = install()
    assert with_crds.returncode != 0
    assert "x-kubernetes-validations" in with_crds.stderr, with_crds.stderr
    # With the CRDs left to the admin (the session installed them), kubeVersion refuses.
    without_crds = install("--skip-crds")
    assert without_crds.returncode != 0
    assert "kubeVersion" in without_crds.stderr, without_crds.stderr
    assert real_kube.get_json("deployment", f"{RELEASE}-operator", "-n", NAMESPACE) is None


@pytest.fixture(scope="module")
def installed_operator(
    real_kube: RealKube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorKubelet]:
    rendered = helm("template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE)
    assert rendered.returncode == 0, rendered.stderr
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    # The CRDs are the session's already (the same chart's, installed by real_kube).
    objects = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    real_kube.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([namespace, *objects]))
    kubelet = OperatorKubelet(real_kube, NAMESPACE, tmp_path_factory.mktemp("helm-pods"), {})
    kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.stop()


def _diagnose(kubelet: OperatorKubelet) -> str:
    parts = [f"harness errors: {kubelet.errors!r}"]
    for run in kubelet.pods.values():
        parts.append(f"--- pod {run.pod}: {run.command}\n{log_tail(run.log, lines=40)}")
    return "\n".join(parts)


def test_the_rendered_chart_runs_the_operator_which_reconciles_a_sample(
    real_kube: RealKube, installed_operator: OperatorKubelet, local_cluster: LocalCluster
) -> None:
    kubelet = installed_operator

    def operator_running() -> bool:
        assert kubelet.errors == [], _diagnose(kubelet)
        return any(r.process.poll() is None for r in kubelet.pods.values())

    wait_for(operator_running, "the operator pod running", RECONCILE_TIMEOUT_S)
    (run,) = kubelet.pods.values()
    assert run.command[1:] == ["operator", f"--namespace={NAMESPACE}"]  # as the pod spec says

    sample: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    sample["metadata"]["namespace"] = NAMESPACE
    # The brokers' processes are the session's local cluster (no kubelet runs broker pods here).
    sample["metadata"]["annotations"] = {BOOTSTRAP_ANNOTATION: local_cluster.bootstrap_servers}
    real_kube.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(sample))
    name = sample["metadata"]["name"]

    def reconciled() -> dict[str, Any] | None:
        assert kubelet.errors == [], _diagnose(kubelet)
        assert run.process.poll() is None, _diagnose(kubelet)
        cluster = real_kube.get_json("fjordcluster", name, "-n", NAMESPACE)
        statefulset = real_kube.get_json("statefulset", f"{name}-broker", "-n", NAMESPACE)
        if not cluster or not statefulset or not (cluster.get("status") or {}).get("conditions"):
            return None
        return {"cluster": cluster, "statefulset": statefulset}

    found = wait_for(reconciled, "the sample reconciled", RECONCILE_TIMEOUT_S)
    owners = found["statefulset"]["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"]) for o in owners] == [("FjordCluster", name)]
    assert found["statefulset"]["spec"]["replicas"] == sample["spec"]["brokers"]["replicas"]
    log = run.log.read_text(errors="replace")
    assert "Forbidden" not in log and "403" not in log, log[-3000:]
