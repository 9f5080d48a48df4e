"""Read a process's Prometheus ``/metrics`` (for tests that wait on what a server reports)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def metric_value(address: str, name: str, timeout: float = 10.0, **labels: str) -> float:
    """The sum of the samples called ``name`` (as exported: ``..._total`` for counters) whose
    labels include ``labels``, from ``http://address/metrics``; 0 when there is none."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as reply:
        text = reply.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )
