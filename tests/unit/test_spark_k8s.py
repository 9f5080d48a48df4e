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


def mounts_user_secret(container_or_pod_spec: dict[str, Any]) -> bool:
    return any(
        m["name"] == defaults.SPARK_USER_VOLUME
        and m["mountPath"] == defaults.SPARK_USER_MOUNT
        and m.get("readOnly") is True
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
            *(f"fjorduser-{job}.yaml" for job in JOBS),
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
    # The job's FjordUser Secret, mounted in driver and executors, named by --command-config.
    assert options["--command-config"] == defaults.SPARK_USER_PROPERTIES
    (user_volume,) = [v for v in spec["volumes"] if v["name"] == defaults.SPARK_USER_VOLUME]
    assert user_volume["secret"]["secretName"] == f"{defaults.SPARK_USER_PREFIX}{job}"
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
        assert mounts_user_secret(pod), role
    assert spec["executor"]["instances"] >= 1


@pytest.mark.parametrize("job", sorted(JOBS))
def test_the_manifest_arguments_are_accepted_by_the_job(job: str) -> None:
    """Every argument a manifest passes is one the job's own parser accepts."""
    module = importlib.import_module(f"fjord_jobs.{JOBS[job]}")
    arguments = load(f"sparkapplication-{job}.yaml")["spec"]["arguments"]
    parsed = module.build_parser().parse_args(arguments)
    assert parsed.bootstrap_servers == defaults.K8S_BOOTSTRAP_SERVERS
    assert parsed.command_config == defaults.SPARK_USER_PROPERTIES
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
    # The job's FjordUser Secret in the driver and every executor, where --command-config is.
    secret = f"{defaults.SPARK_USER_PREFIX}{job}"
    assert confs[f"spark.kubernetes.driver.secrets.{secret}"] == defaults.SPARK_USER_MOUNT
    assert confs[f"spark.kubernetes.executor.secrets.{secret}"] == defaults.SPARK_USER_MOUNT
    main_file = f"local://{defaults.SPARK_JOBS_DIR_IN_IMAGE}/{JOBS[job]}.py"
    job_args = argv[argv.index(main_file) + 1 :]
    # Same job arguments as the operator manifest, then the extra ones.
    manifest_args = load(f"sparkapplication-{job}.yaml")["spec"]["arguments"]
    assert job_args == [*manifest_args, "--available-now"]


def test_submit_script_names_another_user_or_none_for_a_plaintext_cluster() -> None:
    api = "https://10.0.0.1:6443"
    other = submit("log-analysis", DRY_RUN="1", K8S_API_SERVER=api, FJORD_USER="team-logs")
    assert other.returncode == 0, other.stderr
    assert "spark.kubernetes.executor.secrets.team-logs=/etc/fjord-user" in other.stdout
    plain = submit("log-analysis", DRY_RUN="1", K8S_API_SERVER=api, FJORD_USER="")
    assert plain.returncode == 0, plain.stderr
    assert ".secrets." not in plain.stdout
    assert "--command-config" not in plain.stdout.splitlines()


#: What each job reads and writes, by its parser's flags (defaults in fjord_jobs.defaults).
JOB_TOPICS = {
    "orders-shipments": ("orders_topic", ("shipments_topic", "dead_letter_topic")),
    "log-analysis": ("logs_topic", ("counts_topic", "dead_letter_topic")),
    "risk-control": ("transactions_topic", ("alerts_topic", "dead_letter_topic")),
}
#: The jobs whose sink runs exactly once (transactions; fjord_jobs' write_topic(exactly_once=)).
EXACTLY_ONCE_JOBS = {"orders-shipments"}


@pytest.mark.parametrize("job", sorted(JOBS))
def test_each_jobs_fjord_user_grants_exactly_what_the_job_reads_and_writes(job: str) -> None:
    """The FjordUser a job connects as (spark/k8s/fjorduser-<job>.yaml), read by the operator's
    own parser: Read (and DescribeConfigs, for the topic's timestamp type) on the input topic,
    Write on the outputs; an exactly-once job also Read on its outputs (the batch marker is a
    transactional offset commit), Write on its transactional ids and Read on their groups
    (prefix: the sink's transactionalIdPrefix). Nothing else. Run for real with orders-shipments
    in tests/spark/test_spark_secure.py."""
    from fjord.security.acls import AclOperation as Op
    from fjord.security.acls import PatternType, ResourceType
    from fjord_operator.security import user_acls, user_authentication
    from fjord_spark.defaults import TRANSACTIONAL_ID_PREFIX

    user = load(f"fjorduser-{job}.yaml")
    name = user["metadata"]["name"]
    assert name == f"{defaults.SPARK_USER_PREFIX}{job}"  # = the Secret the manifests mount
    assert user["metadata"]["namespace"] == defaults.SPARK_NAMESPACE
    assert user_authentication(user["spec"]) == "tls"
    module = importlib.import_module(f"fjord_jobs.{JOBS[job]}")
    required = ["--checkpoint", "/x", *(["--parquet-dir", "/y"] if job == "log-analysis" else [])]
    parsed = vars(module.build_parser().parse_args(required))
    source, sinks = JOB_TOPICS[job]
    literal, prefixed = PatternType.LITERAL, PatternType.PREFIXED
    expected = {(ResourceType.TOPIC, parsed[source], literal, op)
                for op in (Op.READ, Op.DESCRIBE_CONFIGS)}
    for sink in sinks:
        expected.add((ResourceType.TOPIC, parsed[sink], literal, Op.WRITE))
        if job in EXACTLY_ONCE_JOBS:
            expected.add((ResourceType.TOPIC, parsed[sink], literal, Op.READ))
    if job in EXACTLY_ONCE_JOBS:
        prefix = f"{TRANSACTIONAL_ID_PREFIX}-"
        expected |= {(ResourceType.TRANSACTIONAL_ID, prefix, prefixed, Op.WRITE),
                     (ResourceType.GROUP, prefix, prefixed, Op.READ)}
    bindings = user_acls(name, user["spec"])
    assert {b.entry.principal for b in bindings} == {f"User:{name}"}
    assert {b.entry.permission.name for b in bindings} == {"ALLOW"}
    got = {(b.pattern.resource_type, b.pattern.name, b.pattern.pattern_type, b.entry.operation)
           for b in bindings}
    assert got == expected


def test_the_user_secret_mount_is_where_the_operators_client_properties_point(
    tmp_path: Path,
) -> None:
    """The operator writes paths under its USER_SECRET_MOUNT_DIR into a user's
    client.properties; the jobs mount the Secret there and read the file as it is."""
    from fjord_jobs.common import read_command_config
    from fjord_operator import settings
    from fjord_operator.security import user_client_properties

    assert defaults.SPARK_USER_MOUNT == settings.USER_SECRET_MOUNT_DIR
    assert defaults.SPARK_USER_PROPERTIES.endswith("/" + settings.USER_PROPERTIES_KEY)
    text = user_client_properties("tls", "fjord-risk-control", None, defaults.SPARK_USER_MOUNT)
    path = tmp_path / "client.properties"
    path.write_bytes(text)
    properties = read_command_config(str(path))
    assert properties["security.protocol"] == "SSL"
    for key in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location"):
        assert properties[key].startswith(defaults.SPARK_USER_MOUNT + "/"), key


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
