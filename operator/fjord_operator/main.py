"""``fjord operator``: run the kopf operator with :class:`OperatorSettings`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from fjord_operator.handlers import register
from fjord_operator.settings import OperatorSettings


async def run_async(
    settings: OperatorSettings | None = None,
    *,
    stop_flag: Any = None,
    ready_flag: Any = None,
) -> None:
    """Run the operator in the current event loop until ``stop_flag`` is set (or forever).
    Watches ``settings.namespaces``, or every namespace when empty."""
    settings = settings or OperatorSettings.from_env()
    registry = register(settings)
    await kopf.operator(
        registry=registry,
        clusterwide=not settings.namespaces,
        namespaces=list(settings.namespaces),
        standalone=True,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def run(settings: OperatorSettings | None = None) -> None:
    """Blocking entry point of ``fjord operator`` (stops on SIGINT/SIGTERM)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # lightkube's HTTP client logs every request at INFO: one line per GET would bury the
    # operator's own messages.
    for name in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    asyncio.run(run_async(settings))
