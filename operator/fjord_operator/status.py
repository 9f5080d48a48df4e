"""Status of FjordCluster and FjordTopic: ``observedGeneration`` and the three conditions.

Invariants: a status always has exactly the conditions Ready, Reconciling and Error, in that
order, each with ``status`` "True"/"False"/"Unknown", a CamelCase ``reason``, a ``message`` and
``lastTransitionTime`` (RFC 3339, UTC), which changes only when the condition's status changes.
The time is passed in: these functions read no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

CONDITION_TYPES = ("Ready", "Reconciling", "Error")


class Outcome(StrEnum):
    """Where a reconciliation stands: what the three conditions say."""

    READY = "Ready"  # Ready=True, Reconciling=False, Error=False
    RECONCILING = "Reconciling"  # Ready=False, Reconciling=True, Error=False
    ERROR = "Error"  # Ready=False, Reconciling=False, Error=True


@dataclass(frozen=True, slots=True)
class Verdict:
    """One reconciliation's outcome with the reason and message every condition carries."""

    outcome: Outcome
    reason: str
    message: str


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def conditions(
    verdict: Verdict, previous: Sequence[Mapping[str, Any]] | None, now: datetime
) -> list[dict[str, str]]:
    """The three conditions for ``verdict``; ``lastTransitionTime`` is kept from
    ``previous`` where a condition's status did not change."""
    old = {c.get("type"): c for c in previous or () if isinstance(c, Mapping)}
    truth = {
        "Ready": verdict.outcome is Outcome.READY,
        "Reconciling": verdict.outcome is Outcome.RECONCILING,
        "Error": verdict.outcome is Outcome.ERROR,
    }
    out = []
    for kind in CONDITION_TYPES:
        status = "True" if truth[kind] else "False"
        before = old.get(kind)
        since = (
            str(before["lastTransitionTime"])
            if before and before.get("status") == status and before.get("lastTransitionTime")
            else rfc3339(now)
        )
        out.append(
            {
                "type": kind,
                "status": status,
                "reason": verdict.reason,
                "message": verdict.message,
                "lastTransitionTime": since,
            }
        )
    return out


def status_patch(
    verdict: Verdict,
    generation: int | None,
    previous_status: Mapping[str, Any] | None,
    now: datetime,
    **fields: Any,
) -> dict[str, Any]:
    """The ``status`` to write: conditions, ``observedGeneration`` and ``fields``."""
    previous = (previous_status or {}).get("conditions")
    patch: dict[str, Any] = {"conditions": conditions(verdict, previous, now), **fields}
    if generation is not None:
        patch["observedGeneration"] = generation
    return patch


def condition_of(status: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any] | None:
    for condition in (status or {}).get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == kind:
            return condition
    return None
