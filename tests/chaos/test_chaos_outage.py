"""An etcd outage costs the data plane nothing: a private cluster (3 brokers, 2 controllers,
broker lease TTL 6 s) takes acks=all writes (RF 3, min.insync.replicas 2) and a consumer
tails the topic while etcd is SIGSTOPped for longer than every lease; writes and reads keep
going, nothing acknowledged is lost, duplicated or skipped, and once etcd is back the expired
registrations are replaced without moving a leader and topic changes complete again.

The outage here is 15 s to keep the test short; the 60 s run is the same scenario
(:func:`fjord.testing.chaos.etcd_outage_plan`), figures in bench/RESULTS.md. See
docs/replication.md, "etcd outages", for why serving on is safe.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fjord.local.defaults import LOCAL_BROKER_LEASE_TTL_S
from fjord.testing.chaos import etcd_outage_plan
from fjord.testing.chaos_cluster import ChaosRunner, ChaosSettings, chaos_cluster

#: Longer than every lease (brokers 6 s, controllers 3 s), so all of them expire.
OUTAGE_S = 15.0
#: Longest time without an acknowledged write (or a record returned to the tailing consumer)
#: from the outage's start to 10 s after its end. Before etcd outages were ridden out, writes
#: stopped after one lease TTL for the rest of the outage (28 s of a 30 s one).
MAX_STALL_S = 4.0


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_writes_and_reads_go_on_through_an_etcd_outage(tmp_path: Path) -> None:
    cluster, replica_lag_ms = chaos_cluster(
        tmp_path / "cluster", unsafe_etcd_no_fsync=True, coordinators=0,
        broker_lease_ttl_s=LOCAL_BROKER_LEASE_TTL_S,
    )
    settings = ChaosSettings(seed=0, partitions=3, records_per_second=200,
                             replica_lag_ms=replica_lag_ms, topic="outage")
    with cluster:
        runner = ChaosRunner(cluster, settings, log=lambda line: print(line, flush=True),
                             plan=etcd_outage_plan(OUTAGE_S), tail=True)
        result = runner.run()
    text = result.render()
    print(text, flush=True)
    report = result.report
    assert result.faults["etcd SIGSTOP"] == 1, text
    assert not result.findings, text
    assert report.acknowledged > 0 and report.pending == 0, text
    assert report.lost == () and report.misplaced == (), text
    assert report.order_violations == () and report.foreign == (), text
    if result.idempotent:
        assert not report.duplicated, text
    assert result.skipped == [], text
    (write_stall,) = result.figure("etcd outage of 15 s: longest write stall")
    (read_stall,) = result.figure("etcd outage of 15 s: longest read stall")
    assert write_stall <= MAX_STALL_S, text
    assert read_stall <= MAX_STALL_S, text
    assert result.figure("etcd outage: topic created"), text
