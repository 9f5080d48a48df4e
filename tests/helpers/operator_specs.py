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


def expand_kubelet_references(argv: list[str], env: dict[str, str]) -> list[str]:
    """``$(VAR)`` in a container's command expanded as the kubelet does (``$$`` escapes ``$``;
    an undefined reference stays as written), for images without a shell (etcd's)."""
    import re

    def one(arg: str) -> str:
        return re.sub(
            r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
            lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
            arg,
        )

    return [one(arg) for arg in argv]


def run_container_argv(command: list[str], tmp_path: Path, **env: str) -> list[str]:
    """Exec a shell-less container command (its ``$(VAR)`` expanded from ``env``) through a
    stand-in for its program that prints the argv it was given, one word a line."""
    program = tmp_path / command[0]
    program.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    program.chmod(0o755)
    argv = [str(program), *expand_kubelet_references(command[1:], env)]
    out = subprocess.run(argv, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                         check=True, timeout=30)
    return out.stdout.splitlines()


def equals_flags(argv: list[str]) -> dict[str, str]:
    """``--name=value`` (etcd's style) and bare ``--switch`` (value ``""``) flags of ``argv``;
    a flag given twice is an error."""
    flags: dict[str, str] = {}
    for arg in argv:
        assert arg.startswith("--"), arg
        name, _, value = arg.partition("=")
        assert name not in flags, f"{name} given twice"
        flags[name] = value
    return flags
