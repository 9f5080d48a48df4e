"""Validate custom resources against the chart's CRDs the way the API server would, without one.

What the API server does with a FjordCluster or FjordTopic, and how this module stands in for it:

- the CRD's ``openAPIV3Schema`` (OpenAPI 3.0, close to JSON Schema draft 4) is checked with
  ``jsonschema``'s draft-4 validator; the ``x-kubernetes-*`` extensions are ignored by it, so the
  CEL rules (``x-kubernetes-validations``) are NOT evaluated here;
- fields the schema does not declare are rejected, as ``kubectl`` does with its default strict
  field validation (the API server would otherwise prune them silently): :func:`unknown_fields`;
- :func:`structural_problems` checks the rules that make a schema *structural* (the API server
  refuses a CRD that breaks them).

Errors are reported as ``(path, reason)`` pairs: ``path`` is the dotted path of the offending
value (``spec.brokers.replicas``; list items by index), ``reason`` the failing JSON-schema keyword
(``minimum``, ``pattern``, ``oneOf``, ...) or ``unknown field``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "fjord"
CRD_DIR = CHART_DIR / "crds"
SAMPLES_DIR = CHART_DIR / "samples"

#: Where a schema may keep fields it does not declare: kopf's own bookkeeping in status.
PRESERVE_UNKNOWN_ALLOWED = frozenset({"status.kopf"})

#: Keywords the API server forbids inside allOf/anyOf/oneOf/not of a structural schema.
_FORBIDDEN_IN_JUNCTORS = frozenset(
    {"type", "default", "description", "additionalProperties", "nullable"}
)
_JUNCTORS = ("allOf", "anyOf", "oneOf")

ValidationProblem = tuple[str, str]


def load_yaml(path: Path) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    if not isinstance(document, dict):
        raise ValueError(f"{path}: expected one YAML mapping")
    return document


def load_crds() -> dict[str, dict[str, Any]]:
    """Every CRD of the chart by ``kind``."""
    crds = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = load_yaml(path)
        crds[crd["spec"]["names"]["kind"]] = crd
    return crds


def served_version(crd: dict[str, Any]) -> dict[str, Any]:
    """The CRD's single served storage version (the chart has one version per CRD)."""
    versions = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
    if len(versions) != 1:
        raise ValueError(f"{crd['metadata']['name']}: expected one served storage version")
    return versions[0]


def _dotted(path: Iterator[Any] | Any) -> str:
    return ".".join(str(part) for part in path)


def unknown_fields(schema: dict[str, Any], value: Any, path: str = "") -> Iterator[str]:
    """Dotted paths of fields in ``value`` that ``schema`` neither declares nor preserves."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict) and schema.get("type") == "object":
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            child = f"{path}.{key}" if path else str(key)
            if properties is not None and key in properties:
                yield from unknown_fields(properties[key], item, child)
            elif isinstance(additional, dict):
                yield from unknown_fields(additional, item, child)
            elif properties is not None:
                yield child
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from unknown_fields(schema["items"], item, f"{path}.{index}")


def validate_custom_resource(resource: dict[str, Any]) -> list[ValidationProblem]:
    """Problems the API server (with kubectl's strict field validation) would report, sorted.

    Raises ``KeyError`` when no CRD of the chart serves the resource's kind.
    """
    crd = load_crds()[resource["kind"]]
    version = served_version(crd)
    expected_api_version = f"{crd['spec']['group']}/{version['name']}"
    problems: list[ValidationProblem] = []
    if resource.get("apiVersion") != expected_api_version:
        problems.append(("apiVersion", f"not {expected_api_version}"))
    schema = version["schema"]["openAPIV3Schema"]
    validator = jsonschema.Draft4Validator(schema)
    problems.extend(
        (_dotted(error.absolute_path), str(error.validator))
        for error in validator.iter_errors(resource)
    )
    problems.extend((path, "unknown field") for path in unknown_fields(schema, resource))
    return sorted(problems)


def structural_problems(schema: dict[str, Any], path: str = "") -> Iterator[str]:
    """Why ``schema`` (an ``openAPIV3Schema``) is not structural, plus Fjord's own rule that
    unknown fields are kept only at :data:`PRESERVE_UNKNOWN_ALLOWED`; empty when it is fine."""
    where = path or "<root>"
    if "$ref" in schema:
        yield f"{where}: $ref is not allowed in a CRD schema"
    preserves = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    int_or_string = bool(schema.get("x-kubernetes-int-or-string"))
    if preserves and path not in PRESERVE_UNKNOWN_ALLOWED:
        allowed = sorted(PRESERVE_UNKNOWN_ALLOWED)
        yield f"{where}: x-kubernetes-preserve-unknown-fields outside {allowed}"
    if "type" not in schema and not int_or_string:
        yield f"{where}: no type"
    if int_or_string and schema.get("anyOf") != [{"type": "integer"}, {"type": "string"}]:
        yield f"{where}: x-kubernetes-int-or-string needs anyOf [integer, string]"
    if schema.get("type") == "object":
        has_properties = "properties" in schema
        has_additional = "additionalProperties" in schema
        if has_properties and has_additional:
            yield f"{where}: properties and additionalProperties are mutually exclusive"
        if not (has_properties or has_additional or preserves or path == "metadata"):
            yield f"{where}: object without properties"
    if schema.get("type") == "array" and "items" not in schema:
        yield f"{where}: array without items"
    for junctor in (*_JUNCTORS, "not"):
        branches = schema.get(junctor, [])
        for branch in [branches] if isinstance(branches, dict) else branches:
            if int_or_string and junctor == "anyOf":
                continue
            for keyword in sorted(_FORBIDDEN_IN_JUNCTORS & branch.keys()):
                yield f"{where}: {keyword!r} inside {junctor}"
    for name, child in schema.get("properties", {}).items():
        yield from structural_problems(child, f"{path}.{name}" if path else name)
    if isinstance(schema.get("additionalProperties"), dict):
        yield from structural_problems(schema["additionalProperties"], f"{path}.*")
    if isinstance(schema.get("items"), dict):
        yield from structural_problems(schema["items"], f"{path}[]")


def schema_at(schema: dict[str, Any], dotted: str) -> dict[str, Any] | None:
    """The sub-schema of a ``.a.b.c`` JSONPath-like field path (list filters skipped), or None."""
    node: dict[str, Any] | None = schema
    for part in re.sub(r"\[[^\]]*\]", "[]", dotted).strip(".").split("."):
        if node is None:
            return None
        node = node.get("properties", {}).get(part.removesuffix("[]"))
        if node is not None and part.endswith("[]"):
            node = node.get("items")
    return node


def defaults_in(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, Any, dict]]:
    """Every ``(path, default, schema)`` of the schema (the API server checks defaults too)."""
    if "default" in schema:
        yield path or "<root>", schema["default"], schema
    for name, child in schema.get("properties", {}).items():
        yield from defaults_in(child, f"{path}.{name}" if path else name)
    if isinstance(schema.get("items"), dict):
        yield from defaults_in(schema["items"], f"{path}[]")
