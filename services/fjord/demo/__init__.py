"""The quickstart demonstration (``fjord quickstart``): the seeds' orders -> shipments scenario.

:mod:`fjord.demo.orders` is the pure part (documents, verification, summary);
:mod:`fjord.demo.scenario` runs it against a live cluster with the public clients.
"""

from fjord.demo.orders import ScenarioReport, StageStats, Verification, render_summary, verify
from fjord.demo.scenario import run_scenario

__all__ = [
    "ScenarioReport",
    "StageStats",
    "Verification",
    "render_summary",
    "run_scenario",
    "verify",
]
