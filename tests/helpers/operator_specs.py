"""FjordCluster bodies for the operator's builder tests, and a real ``sh`` to run the container
commands the builders write (a stand-in ``fjord`` prints the argv the pod would start)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any


def cluster(**spec: Any) -> dict[str, Any]:
    """A FjordCluster ``fjord`` in namespace ``fjord`` (3 brokers, external etcd), ``spec``
    entries replacing the defaults."""
    base: dict[str, Any] = {
        "brokers": {"replicas": 3, "storage": {"size": "20Gi", "storageClassName": "fast"}},
        "etcd": {"endpoints": ["http://etcd.infra.svc:2379"]},
    }
    base.update(spec)
    return {
        "apiVersion": "fjord.io/v1alpha1",
        "kind": "FjordCluster",
        "metadata": {"name": "fjord", "namespace": "fjord", "uid": "1234-abcd", "generation": 1},
        "spec": base,
    }


def run_container_command(command: list[str], tmp_path: Path, **env: str) -> list[str]:
    """Run a container command in a real sh with a stand-in ``fjord`` that prints its argv."""
    fake = tmp_path / "fjord"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    base = {"PATH": f"{tmp_path}:/usr/bin:/bin", "FJORD_ETCD": "http://e:2379"}
    out = subprocess.run(
        command,
        env={**base, "FJORD_CLUSTER_ID": "ns.c", **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return out.stdout.splitlines()


def flag(argv: list[str], name: str) -> str:
    """The value given to option ``name`` in ``argv``."""
    return argv[argv.index(name) + 1]
