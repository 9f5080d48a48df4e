"""helm for the chart tests (tests/k8s/test_chart.py, tests/k8s/test_operator_real_api.py): the
binary from `make helm` (.venv/bin) or PATH, and the objects `helm template` renders.
Without helm the tests fail with the fix, they never skip."""

from __future__ import annotations

import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.crd_validation import CHART_DIR

RELEASE, NAMESPACE = "fjord", "fjord"
HELM_TIMEOUT_S = 120


def helm_binary() -> str:
    """helm from the venv (`make helm`) or PATH; fails the test with the fix when missing."""
    candidate = Path(sys.executable).parent / "helm"
    found = str(candidate) if candidate.exists() else shutil.which("helm")
    if found is None:
        pytest.fail("helm is not installed: run `make helm` (puts helm and kubectl in .venv/bin)")
    return found


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm_binary(), *args], capture_output=True, text=True, timeout=HELM_TIMEOUT_S, check=False
    )


@cache
def render(values: Path | None = None, *extra: str) -> tuple[dict[str, Any], ...]:
    """The objects `helm template` renders (CRDs included) for ``values``; fails on an error."""
    return render_in(NAMESPACE, values, *extra)


@cache
def render_in(
    namespace: str, values: Path | None = None, *extra: str
) -> tuple[dict[str, Any], ...]:
    """:func:`render` for a release in ``namespace``."""
    args = ["template", RELEASE, str(CHART_DIR), "--namespace", namespace, "--include-crds"]
    if values is not None:
        args += ["--values", str(values)]
    result = helm(*args, *extra)
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)
