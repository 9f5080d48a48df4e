"""The Spark-on-Kubernetes files in spark/k8s/: they parse, carry the fields the Spark operator
(sparkoperator.k8s.io/v1beta2) and spark-submit need, and agree with fjord_jobs.defaults (the one
place the image, service account, namespace, bootstrap servers and data volume are defined).
No Kubernetes cluster runs here; these checks are what can be verified without one."""

from __future__ import annotations

import importlib
import itertools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fjord_jobs import defaults

K8S_DIR = Path(__file__).resolve().parents[2] / "spark" / "k8s"
JOBS_DIR = Path(__file__).resolve().parents[2] / "spark" / "fjord_jobs"
#: k8s job name -> module in fjord_jobs.
JOBS = {
    "orders-shipments": "orders_shipments",
    "log-analysis": "log_analysis",
    "risk-control": "risk_control",
}


def load(name: str) -> dict[str, Any]:
    documents = list(yaml.safe_load_all((K8S_DIR / name).read_text()))
    assert len(documents) == 1, f"{name}: expected one document"
    document = documents[0]
    assert isinstance(document, dict)
    return document


def mounts_data_volume(container_or_pod_spec: dict[str, Any]) -> bool:
    return any(
        m["name"] == defaults.SPARK_DATA_CLAIM and m["mountPath"] == defaults.SPARK_DATA_MOUNT
        for m in container_or_pod_spec.get("volumeMounts", [])
    )


def data_volume_declared(volumes: list[dict[str, Any]]) -> bool:
    return any(
        v["name"] == defaults.SPARK_DATA_CLAIM
        and v["persistentVolumeClaim"]["claimName"] == defaults.SPARK_DATA_CLAIM
        for v in volumes
    )


def test_every_yaml_file_parses_and_is_known() -> None:
    files = sorted(p.name for p in K8S_DIR.glob("*.yaml"))
    assert files == sorted(
        [
            "checkpoints-pvc.yaml",
            "driver-pod-template.yaml",
            "executor-pod-template.yaml",
            *(f"sparkapplication-{job}.yaml" for job in JOBS),
        ]
    )
    for name in files:
        document = load(name)
        assert {"apiVersion", "kind"} <= document.keys(), name


@pytest.mark.parametrize("job", sorted(JOBS))
def test_spark_application_manifest(job: str) -> None:
    app = load(f"sparkapplication-{job}.yaml")
    assert app["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
    assert app["kind"] == "SparkApplication"
    assert app["metadata"]["name"] == f"fjord-{job}"
    assert app["metadata"]["namespace"] == defaults.SPARK_NAMESPACE
    spec = app["spec"]
    assert spec["type"] == "Python"
    assert spec["mode"] == "cluster"
    assert spec["sparkVersion"] == defaults.SPARK_VERSION
    assert spec["image"] == defaults.SPARK_IMAGE
    main_file = spec["mainApplicationFile"]
    assert main_file == f"local://{defaults.SPARK_JOBS_DIR_IN_IMAGE}/{JOBS[job]}.py"
    # The file exists in the source tree the image is built from and is runnable as a script.
    source = JOBS_DIR / f"{JOBS[job]}.py"
    assert 'if __name__ == "__main__":' in source.read_text()

    arguments = spec["arguments"]
    assert all(isinstance(a, str) for a in arguments)
    options = dict(zip(arguments[::2], arguments[1::2], strict=True))
    assert options["--bootstrap-servers"] == defaults.K8S_BOOTSTRAP_SERVERS
    assert options["--checkpoint"] == f"{defaults.SPARK_DATA_MOUNT}/checkpoints/{job}"
    if job == "log-analysis":
        assert options["--parquet-dir"].startswith(defaults.SPARK_DATA_MOUNT + "/")

    assert spec["restartPolicy"]["type"] == "Always"  # a streaming job resumes from its checkpoint
    assert data_volume_declared(spec["volumes"])
    for role in ("driver", "executor"):
        pod = spec[role]
        assert pod["serviceAccount"] == defaults.SPARK_SERVICE_ACCOUNT, role
        assert pod["image"] == defaults.SPARK_IMAGE, role
        assert isinstance(pod["cores"], int) and pod["cores"] >= 1, role
        assert str(pod["memory"]).endswith(("m", "g")), role
        assert mounts_data_volume(pod), role
    assert spec["executor"]["instances"] >= 1


@pytest.mark.parametrize("job", sorted(JOBS))
def test_the_manifest_arguments_are_accepted_by_the_job(job: str) -> None:
    """Every argument a manifest passes is one the job's own parser accepts."""
    module = importlib.import_module(f"fjord_jobs.{JOBS[job]}")
    arguments = load(f"sparkapplication-{job}.yaml")["spec"]["arguments"]
    parsed = module.build_parser().parse_args(arguments)
    assert parsed.bootstrap_servers == defaults.K8S_BOOTSTRAP_SERVERS
    assert not parsed.available_now  # on Kubernetes the jobs run continuously


@pytest.mark.parametrize(
    ("name", "container"),
    [("driver", "spark-kubernetes-driver"), ("executor", "spark-kubernetes-executor")],
)
def test_pod_templates(name: str, container: str) -> None:
    pod = load(f"{name}-pod-template.yaml")
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    spec = pod["spec"]
    assert spec["serviceAccountName"] == defaults.SPARK_SERVICE_ACCOUNT
    assert spec["securityContext"]["runAsNonRoot"] is True
    (first,) = spec["containers"]
    assert first["name"] == container
    assert mounts_data_volume(first)
    assert data_volume_declared(spec["volumes"])


def test_data_volume_claim() -> None:
    claim = load("checkpoints-pvc.yaml")
    assert (claim["apiVersion"], claim["kind"]) == ("v1", "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == defaults.SPARK_DATA_CLAIM
    assert claim["metadata"]["namespace"] == defaults.SPARK_NAMESPACE
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"]


def submit(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in {"NAMESPACE", "SPARK_IMAGE"}}
    environment.update(env)
    return subprocess.run(
        ["bash", str(K8S_DIR / "submit.sh"), *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize("job", sorted(JOBS))
def test_submit_script_builds_a_cluster_mode_spark_submit(job: str) -> None:
    done = submit(job, "--available-now", DRY_RUN="1", K8S_API_SERVER="https://10.0.0.1:6443")
    assert done.returncode == 0, done.stderr
    argv = done.stdout.splitlines()
    assert argv[0] == "spark-submit"
    pairs = dict(itertools.pairwise(argv))
    assert pairs["--master"] == "k8s://https://10.0.0.1:6443"
    assert pairs["--deploy-mode"] == "cluster"
    confs = dict(
        value.split("=", 1) for flag, value in itertools.pairwise(argv) if flag == "--conf"
    )
    assert confs["spark.kubernetes.container.image"] == defaults.SPARK_IMAGE
    assert confs["spark.kubernetes.namespace"] == defaults.SPARK_NAMESPACE
    sa = confs["spark.kubernetes.authenticate.driver.serviceAccountName"]
    assert sa == defaults.SPARK_SERVICE_ACCOUNT
    for role in ("driver", "executor"):
        template = Path(confs[f"spark.kubernetes.{role}.podTemplateFile"])
        assert template == K8S_DIR / f"{role}-pod-template.yaml"
        assert template.is_file()
        container = load(template.name)["spec"]["containers"][0]["name"]
        assert confs[f"spark.kubernetes.{role}.podTemplateContainerName"] == container
    main_file = f"local://{defaults.SPARK_JOBS_DIR_IN_IMAGE}/{JOBS[job]}.py"
    job_args = argv[argv.index(main_file) + 1 :]
    # Same job arguments as the operator manifest, then the extra ones.
    manifest_args = load(f"sparkapplication-{job}.yaml")["spec"]["arguments"]
    assert job_args == [*manifest_args, "--available-now"]


def test_submit_script_refuses_unknown_jobs_and_missing_api_server() -> None:
    done = submit("nightly-report", DRY_RUN="1", K8S_API_SERVER="https://10.0.0.1:6443")
    assert done.returncode == 2
    assert "unknown job 'nightly-report'" in done.stderr
    done = submit("risk-control", DRY_RUN="1", K8S_API_SERVER="", PATH="/usr/bin:/bin")
    if shutil.which("kubectl", path="/usr/bin:/bin") is None:
        assert done.returncode == 2
        assert "K8S_API_SERVER" in done.stderr
    done = submit()
    assert done.returncode == 2
    assert "Usage" in done.stderr
