"""A rolling restart of 5 brokers under acks=all load never costs availability (issue 19).

A private cluster of 5 brokers (real processes), a topic with RF 3 and min.insync.replicas 2,
and a producer writing acks=all all the time. Every broker is restarted (SIGTERM, then
started again on the same data, as a kubelet restarts a deleted pod) by
:func:`fjord_operator.rolling.roll_brokers`, the same observe-plan-restart code the operator
runs per reconciliation (:func:`fjord_operator.rolling.roll_step` over the pure planner
:mod:`fjord.cluster.rolling_restart`), with the operator's own admin shell
(:class:`fjord_operator.handlers.FjordAdmin`).

The producer sends with ``retries=0``, so every broker answer reaches the test: each error is
counted by code and the record sent again. Proof: not one produce is refused with
NOT_ENOUGH_REPLICAS (or NOT_ENOUGH_REPLICAS_AFTER_APPEND), and every acknowledged record is
read back afterwards.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from fjord.client import AdminClient, NewTopic
from fjord.cluster.rolling_restart import RollAction
from fjord.local.cluster import LocalCluster
from fjord.testing.waiting import wait_for
from fjord_operator.handlers import FjordAdmin
from fjord_operator.rolling import roll_brokers
from tests.helpers.acks_all_load import PARTITIONS, REFUSALS, TOPIC, AcksAllLoad, read_values

BROKERS = 5


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_rolling_restart_of_five_brokers_under_acks_all_load(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path / "cluster", brokers=BROKERS, coordinators=0, unsafe_etcd_no_fsync=True,
        config={"min.insync.replicas": "2"},
    )
    with cluster:
        bootstrap = cluster.bootstrap_servers
        with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})])
        load = AcksAllLoad(bootstrap)
        load.start()
        try:
            # Every leader serves before the roll starts (a fresh leader can refuse briefly).
            wait_for(lambda: len(load.acked) >= 200 or load.crashed, "200 records acknowledged",
                     60)
            assert load.crashed is None
            load.errors.clear()
            acked_before = len(load.acked)

            def restart_broker(broker: int) -> None:
                cluster.kill("broker", broker, signal.SIGTERM)  # a pod deleted: SIGTERM
                cluster.start_broker(broker)  # ... and started again on its volume

            async def restart(broker: int) -> None:
                await asyncio.to_thread(restart_broker, broker)

            async def roll() -> list:
                fjord = FjordAdmin(bootstrap, 10.0)
                try:
                    return await roll_brokers(fjord, list(range(BROKERS)), restart, timeout_s=150)
                finally:
                    await asyncio.to_thread(fjord.close)

            started = time.monotonic()
            steps = asyncio.run(roll())
            roll_s = time.monotonic() - started
            acked_during = len(load.acked) - acked_before
            wait_for(lambda: len(load.acked) >= acked_before + acked_during + 100,
                     "100 more records acknowledged after the roll", 60)
        finally:
            load.stop()
        summary = (
            f"roll {roll_s:.1f} s, {acked_during} records acknowledged during it, errors "
            f"{dict(load.errors)}; steps: " + " | ".join(s.reason for s in steps)
        )
        print(summary, flush=True)
        restarted = [s.broker for s in steps if s.action is RollAction.RESTART]
        assert sorted(restarted) == list(range(BROKERS)), summary
        assert steps[-1].action is RollAction.DONE, summary
        # The roll really waited for each restarted broker to rejoin its ISRs.
        assert any("not back" in s.reason for s in steps), summary
        for refusal in REFUSALS:
            assert load.errors[refusal] == 0, summary
        assert acked_during > 0, summary
        missing = load.acked - read_values(bootstrap)
        assert not missing, f"{len(missing)} acknowledged records not read back; {summary}"
