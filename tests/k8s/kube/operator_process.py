"""`fjord operator` as a process against the real API server (tests/k8s/kube/apiserver.py),
as a deployment runs it: its own login, its own namespace, stopped by process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.k8s.kube.apiserver import RealKube

OPERATOR_INTERVAL_S = "1"
OPERATOR_STOP_TIMEOUT_S = 15.0


@contextmanager
def running_operator(
    kube: RealKube,
    namespace: str,
    workdir: Path,
    *,
    kubeconfig: Path | None = None,
    service_account_dir: Path | None = None,
) -> Iterator[Path]:
    """`fjord operator` as a process watching ``namespace``, logged in with ``kubeconfig`` or
    in-cluster from ``service_account_dir``; yields its log file. Stopped by process group."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "FJORD_OPERATOR_"))}
    env["HOME"] = str(workdir)  # never the machine's ~/.kube/config
    command = [
        str(Path(sys.executable).parent / "fjord"),
        "operator",
        "--namespace",
        namespace,
        "--cluster-interval",
        OPERATOR_INTERVAL_S,
        "--topic-interval",
        OPERATOR_INTERVAL_S,
        "--retry-delay",
        OPERATOR_INTERVAL_S,
    ]
    if kubeconfig is not None:
        command += ["--kubeconfig", str(kubeconfig)]
    if service_account_dir is not None:
        env.update(kube.in_cluster_env())
        env["FJORD_OPERATOR_SERVICE_ACCOUNT_DIR"] = str(service_account_dir)
    log_path = workdir / "operator.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    try:
        yield log_path
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(OPERATOR_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(OPERATOR_STOP_TIMEOUT_S)
