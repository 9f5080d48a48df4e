"""The chaos proof: nothing acknowledged with acks=all is lost, duplicated or reordered while
brokers are SIGKILLed and restarted, a broker is frozen out of the ISR and the active controller
is killed.

One private LocalCluster (3 brokers, 2 controllers), a topic with replication factor 3 and
min.insync.replicas=2, a producer with acks=all writing 20 keys' sequence numbers for the whole
fault phase (~65 s), then a consumer reads every partition from the beginning. The seed of the
fault plan is printed; ``FJORD_CHAOS_SEED=<seed>`` replays the same plan. See docs/chaos.md.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest

from fjord.testing.chaos_cluster import (
    ChaosRunner,
    ChaosSettings,
    chaos_cluster,
)

SEED_ENV = "FJORD_CHAOS_SEED"


def chaos_seed() -> int:
    raw = os.environ.get(SEED_ENV, "").strip()
    return int(raw) if raw else random.SystemRandom().randrange(2**31)


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_acknowledged_records_survive_kills_freezes_and_controller_failover(
    tmp_path: Path,
) -> None:
    seed = chaos_seed()
    print(f"\nchaos seed {seed} (replay with {SEED_ENV}={seed})", flush=True)
    cluster, replica_lag_ms = chaos_cluster(tmp_path / "cluster", unsafe_etcd_no_fsync=True)
    settings = ChaosSettings(seed=seed, replica_lag_ms=replica_lag_ms)
    with cluster:
        # A cluster that refuses replicated topics raises ReplicationUnavailableError: a failure.
        runner = ChaosRunner(cluster, settings, log=lambda line: print(line, flush=True))
        result = runner.run()
    text = result.render()
    report = result.report
    if result.findings or not report.ok(require_no_duplicates=result.idempotent):
        # pytest's temporary directories are pruned quickly on a busy machine: keep the logs.
        kept = Path(tempfile.gettempdir()) / f"fjord-chaos-{seed}-logs"
        shutil.copytree(cluster.logs_dir, kept, dirs_exist_ok=True)
        text += f"\nprocess logs kept in {kept}"
    print(text, flush=True)

    # The run did what the plan promised.
    assert result.faults["broker SIGKILL"] >= settings.min_broker_kills, text
    assert result.faults["controller SIGKILL"] == 1, text
    assert result.faults["broker SIGSTOP"] == 1, text
    assert report.acknowledged > 0, text
    assert report.pending == 0, text
    assert not result.findings, text
    # The verdict.
    assert report.lost == (), text
    assert report.misplaced == (), text
    assert report.order_violations == (), text
    assert report.foreign == (), text
    if result.idempotent:
        assert not report.duplicated, text
