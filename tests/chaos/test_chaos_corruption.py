"""Damaged bytes at rest under load: a private cluster (3 brokers) takes acks=all writes (RF 3,
min.insync.replicas 2, idempotent producer) while a consumer tails the topic; twice, the leader
of a partition is stopped, a byte is flipped inside a batch of a closed segment of its copy, and
it is started again. The damaged copy is found and repaired from a healthy replica, and nothing
acknowledged is lost, duplicated, or skipped by the consumer, which never gets the damaged batch.

Scenario: :func:`fjord.testing.chaos.corruption_plan`; figures in bench/RESULTS.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fjord.testing.chaos import corruption_plan
from fjord.testing.chaos_cluster import ChaosRunner, ChaosSettings, chaos_cluster

CORRUPTIONS = 2


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_damaged_copies_are_repaired_and_nothing_is_lost_or_skipped(tmp_path: Path) -> None:
    cluster, replica_lag_ms = chaos_cluster(tmp_path / "cluster", unsafe_etcd_no_fsync=True,
                                            coordinators=0)
    settings = ChaosSettings(seed=12, partitions=3, records_per_second=300,
                             replica_lag_ms=replica_lag_ms, topic="rot", segment_bytes=16384)
    with cluster:
        runner = ChaosRunner(cluster, settings, log=lambda line: print(line, flush=True),
                             plan=corruption_plan(settings.seed, settings.partitions,
                                                  CORRUPTIONS), tail=True)
        result = runner.run()
    text = result.render()
    print(text, flush=True)
    report = result.report
    assert result.faults["segment corruption"] == CORRUPTIONS, text
    assert not result.findings, text  # the tailing consumer never raised (no damaged batch)
    assert report.acknowledged > 0 and report.pending == 0, text
    assert report.lost == () and report.misplaced == (), text
    assert report.order_violations == () and report.foreign == (), text
    if result.idempotent:
        assert not report.duplicated, text
    assert result.skipped == [], text
    repaired = result.figure("corruption: copy repaired after it registered again")
    assert len(repaired) == CORRUPTIONS, text
