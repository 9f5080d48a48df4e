"""The group cores stay pure: no module of fjord.groups and no core module of fjord.coordinator
imports anything that does I/O, threads or reads a clock (the shell injects time and performs
the effects). The shell modules of the coordinator service (``SHELL``) are the only exception."""

from __future__ import annotations

import ast
from pathlib import Path

import fjord.coordinator
import fjord.groups
import fjord.transactions

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


#: The coordinator service's shell (gRPC, etcd, clients, event loop, the Kafka listener's
#: forwarding to brokers and the controller, the ACL gate in front of the GroupManager, which
#: reads ACLs from the metadata image): not cores.
SHELL = {
    "appender", "authorization", "kafka_apis", "manager", "server", "service", "transactions"
}


def test_group_modules_import_nothing_that_does_io():
    coordinator = Path(fjord.coordinator.__file__).parent
    groups = Path(fjord.groups.__file__).parent
    modules = sorted(m for m in coordinator.glob("*.py") if m.stem not in SHELL)
    modules += sorted(groups.glob("*.py"))
    modules += sorted(Path(fjord.transactions.__file__).parent.glob("*.py"))
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
