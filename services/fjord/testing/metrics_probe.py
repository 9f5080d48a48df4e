"""Read one metric from a running process's ``/metrics`` (tests and the chaos harness)."""

from __future__ import annotations

import urllib.request


def scrape_metric(metrics_address: str, name: str, timeout: float = 10.0) -> float:
    """The sum of every sample at ``http://<metrics_address>/metrics`` whose line starts with
    ``name``: a metric name (every label set) or a name with its labels
    (``fjord_broker_log_damage_found_total{source="scrub"}``). 0 when none. Raises OSError
    when the endpoint cannot be read."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=timeout) as reply:
        text = reply.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))
