"""The coordinator's cores stay pure: no module of fjord.coordinator imports anything that does
I/O, threads or reads a clock (the shell injects time and performs the effects)."""

from __future__ import annotations

import ast
from pathlib import Path

import fjord.coordinator

FORBIDDEN = {
    "asyncio",
    "grpc",
    "os",
    "pathlib",
    "select",
    "socket",
    "subprocess",
    "threading",
    "time",
    "datetime",
    "aetcd",
    "fjord.client",
    "fjord.broker",
    "fjord.storage",
    "fjord.metadata",
}


def test_coordinator_modules_import_nothing_that_does_io():
    package = Path(fjord.coordinator.__file__).parent
    modules = sorted(package.glob("*.py"))
    assert {m.stem for m in modules} >= {"group", "assignors", "offsets_log", "lag", "protocol"}
    for module in modules:
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                bad = [f for f in FORBIDDEN if name == f or name.startswith(f + ".")]
                assert not bad, f"{module.name} imports {name}"
