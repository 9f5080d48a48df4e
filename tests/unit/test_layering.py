"""The import layering of the code (the README's "How it is built" says the same in words).

Every top-level package of ``fjord`` (and the other source roots' packages) is in exactly one of
these groups; a new package fails :func:`test_every_package_has_a_place` until it is given one:

- ``SHARED``: pure libraries every side may import (codecs, storage, metadata, the group
  protocol, the cluster's config schemas and planner, client configuration, serving helpers,
  the Kafka protocol's framing, dispatch and the APIs every Kafka door answers alike). They
  import only other shared packages, never a service or an application.
- ``SERVICES``: one package per service: broker, controller, coordinator, the client library
  and the operator.
- ``APPLICATIONS``: what assembles services into processes and programs (the CLI, the local
  cluster launcher, the demo, the chaos harness, code generation, the Spark source and jobs). They
  may import anything.

The rule between services: a module of a service package imports shared packages and its own
package, and nothing of another service package (lazy imports inside functions count too),
with exactly the edges in ``SERVICE_EDGES`` as exceptions: a service that is itself a client of
the cluster uses the public client library (the coordinator appends to ``__consumer_offsets``
with it, the operator administers topics with it). Since shared packages import no service,
no service reaches another through them either: nothing imports the broker, controller or
coordinator but its own package and the applications. What two sides must agree on (a config
schema, a default, a planner, a wire format, a Kafka API both doors answer) lives in a shared
package.

``fjord.groups`` is stricter still: it imports only ``fjord.errors``, ``fjord.records`` and
``fjord.topic_partition``.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Source directories and the package names they hold.
SOURCES = {
    ROOT / "services" / "fjord": "fjord",
    ROOT / "operator" / "fjord_operator": "fjord_operator",
    ROOT / "spark" / "fjord_spark": "fjord_spark",
    ROOT / "spark" / "fjord_jobs": "fjord_jobs",
}

SHARED = {
    "fjord",  # the package root: __version__
    "fjord._proto",
    "fjord.errors",
    "fjord.runtime",
    "fjord.config",
    "fjord.serving",
    "fjord.process_state",
    "fjord.topic_names",
    "fjord.topic_partition",
    "fjord.records",
    "fjord.storage",
    "fjord.metadata",
    "fjord.observability",
    "fjord.groups",
    "fjord.transactions",
    "fjord.cluster",
    "fjord.security",
    "fjord.tls",
    "fjord.sasl_door",  # the SASL gRPC door every service opens (server side)
    "fjord.sasl_login",  # its client side, used by fjord.tls channels
    "fjord.kafka",
    "fjord.wakeups",  # waits on the event loop resumed on the first turn (broker and client)
    "fjord.rpc_streams",  # Produce/Fetch on one ordered stream: the broker serves, clients send
    "fjord.direct_frames",  # the direct door's wire format (Produce/Fetch frames on plain TCP)
    "fjord.direct_client",  # the sending side of a direct door (clients and followers)
}

SERVICES = {
    "fjord.broker",
    "fjord.controller",
    "fjord.coordinator",
    "fjord.client",
    "fjord_operator",
}

APPLICATIONS = {
    "fjord.cli",
    "fjord.local",
    "fjord.demo",
    "fjord.testing",
    "fjord.tools",
    "fjord_spark",
    "fjord_jobs",
}

#: The only imports from one service package into another.
SERVICE_EDGES = {
    ("fjord.coordinator", "fjord.client"),
    ("fjord_operator", "fjord.client"),
}

#: What ``fjord.groups`` may import besides itself and the standard library.
GROUPS_MAY_IMPORT = {"fjord.errors", "fjord.records", "fjord.topic_partition"}

_OURS = ("fjord", "fjord_operator", "fjord_spark", "fjord_jobs")


def _package_of(module: str) -> str | None:
    """``fjord.broker.server`` -> ``fjord.broker``; ``fjord_operator.x`` -> ``fjord_operator``;
    None for anything not ours."""
    parts = module.split(".")
    if parts[0] not in _OURS:
        return None
    if parts[0] == "fjord" and len(parts) > 1:
        return f"fjord.{parts[1]}"
    return parts[0]


@functools.cache
def _imports() -> tuple[tuple[str, str, Path], ...]:
    """(importing package, imported package, file) for every absolute import of ours, lazy
    imports inside functions included."""
    return tuple(_walk())


def _walk() -> Iterator[tuple[str, str, Path]]:
    for directory, top in SOURCES.items():
        for path in sorted(directory.rglob("*.py")):
            relative = path.relative_to(directory).with_suffix("")
            module = ".".join((top, *relative.parts))
            source = _package_of(module.removesuffix(".__init__"))
            assert source is not None
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                    if node.module == "fjord":  # from fjord import errors / __version__
                        names = [f"fjord.{alias.name}" for alias in node.names]
                else:
                    continue
                for name in names:
                    target = _package_of(name)
                    if target is not None and target != source:
                        if target == "fjord.__version__":
                            target = "fjord"
                        yield source, target, path


def _packages() -> set[str]:
    found = set()
    for directory, top in SOURCES.items():
        found.add(top)
        if top == "fjord":
            found |= {
                f"fjord.{p.stem}"
                for p in directory.iterdir()
                if (p.is_dir() and (p / "__init__.py").exists())
                or (p.suffix == ".py" and p.stem != "__init__")
            }
    return found


def test_every_package_has_a_place():
    groups = [SHARED, SERVICES, APPLICATIONS]
    assert not (SHARED & SERVICES or SHARED & APPLICATIONS or SERVICES & APPLICATIONS)
    unplaced = _packages() - set().union(*groups)
    assert not unplaced, f"put these in SHARED, SERVICES or APPLICATIONS: {sorted(unplaced)}"


def test_shared_packages_import_no_service_or_application():
    bad = sorted(
        f"{path.relative_to(ROOT)}: {source} imports {target}"
        for source, target, path in _imports()
        if source in SHARED and target not in SHARED
    )
    assert not bad, "\n".join(bad)


def test_no_service_imports_another_service():
    bad = sorted(
        f"{path.relative_to(ROOT)}: {source} imports {target}"
        for source, target, path in _imports()
        if source in SERVICES
        and target not in SHARED
        and (source, target) not in SERVICE_EDGES
    )
    assert not bad, "\n".join(bad)


def test_service_edges_are_all_used():
    """An exception no code needs any more leaves SERVICE_EDGES, so the list only shrinks."""
    edges = {(source, target) for source, target, _ in _imports()}
    assert edges >= SERVICE_EDGES, f"remove from SERVICE_EDGES: {sorted(SERVICE_EDGES - edges)}"


def test_group_protocol_depends_only_on_errors_records_and_topic_partition():
    bad = sorted(
        f"{path.relative_to(ROOT)}: imports {target}"
        for source, target, path in _imports()
        if source == "fjord.groups" and target not in GROUPS_MAY_IMPORT
    )
    assert not bad, "\n".join(bad)


def test_security_core_depends_only_on_errors():
    """fjord.security is the pure core every door and every later check (ACLs, SCRAM) shares."""
    bad = sorted(
        f"{path.relative_to(ROOT)}: imports {target}"
        for source, target, path in _imports()
        if source == "fjord.security" and target not in {"fjord.errors", "fjord.security"}
    )
    assert not bad, "\n".join(bad)


def test_the_walk_sees_imports():
    """The checks above are only as good as the walk: it must see the edges we know exist."""
    edges = {(source, target) for source, target, _ in _imports()}
    assert ("fjord.coordinator", "fjord.client") in edges
    assert ("fjord.coordinator", "fjord.groups") in edges
    assert ("fjord.client", "fjord.groups") in edges
    assert ("fjord.cli", "fjord.broker") in edges
    assert ("fjord.groups", "fjord.errors") in edges
    assert ("fjord_operator", "fjord.cluster") in edges


def test_no_test_module_imports_another_test_module():
    """Test modules share helpers through tests/helpers (or fjord.testing), never by importing
    each other or a conftest: a test module's names are its own, and importing one runs its
    module-level code in another's collection."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):  # the module, and what it names (a submodule?)
                module = "." * node.level + (node.module or "")
                names = [module, *(f"{module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for name in names:
                last = name.rsplit(".", 1)[-1]
                if last.startswith("test_") or last == "conftest":
                    bad.append(f"{path.relative_to(ROOT)}: imports {name}")
    assert not bad, "\n".join(bad)
