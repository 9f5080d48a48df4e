"""Bugs the chaos proof found, pinned down as fast deterministic tests.

1. A deposed leader that had appended records its successor never got fetches, as a follower,
   from an offset past the new leader's log end. The leader answered OFFSET_OUT_OF_RANGE
   instead of the divergence, so the follower backed off forever, never truncated and never
   rejoined the ISR (chaos seed 1131673274: chaos-5 stuck at ISR [0], fetch offset 1743
   outside [0, 1742]). Kafka answers the divergence check before the range check.
2. The idempotent producer stalled for good after one batch failed (see the test's docstring).
"""

from __future__ import annotations

import uuid

import pytest

from fjord.client import AdminClient, NewTopic, Producer
from fjord.errors import RecordTooLargeError
from tests.helpers.replica_manager import (
    BROKER,
    Env,
    batch,
    env,
    fetch_request,
    leader_state,
    one_fetch,
    run,
)

__all__ = ["env"]  # the fixture, shared with the broker's own unit tests


def test_follower_past_the_leaders_log_end_gets_the_divergence(env: Env) -> None:
    manager, cluster, _ = env

    async def scenario() -> None:
        await manager.apply_metadata(cluster.topic("t", [leader_state((BROKER, 2), epoch=3)]))
        log = manager.partitions[("t", 0)].log
        log.append(batch(2), 1)  # offsets 0-1 in epoch 1
        log.append(batch(1), 3)  # offset 2 in epoch 3: our log end is 3
        request = fetch_request("t", 0, 5, replica_id=2)  # the follower holds 0..4
        request.topics[0].partitions[0].last_fetched_epoch = 2  # 2..4 written in epoch 2
        out = one_fetch(await manager.fetch(request))
        assert out.error.code == 0, out.error.message
        assert (out.diverging_epoch.epoch, out.diverging_epoch.end_offset) == (1, 2)
        assert out.records == b""
        # A consumer at the same offset is still out of range.
        consumer = one_fetch(await manager.fetch(fetch_request("t", 0, 5)))
        assert consumer.error.code != 0

    run(scenario())


@pytest.mark.integration
def test_idempotent_producer_sends_again_after_a_batch_failed_for_good(bootstrap: str) -> None:
    """2. After a batch failed for good (a hole in its partition's sequence) the idempotent
    producer must bump its epoch and go on; it stalled instead, because the sender only applied
    the bump when some partition was ready and no partition is ready while a bump is pending
    (chaos seeds 561156261, 674070652: every later record expired "before they could be
    sent"). A broker-side MESSAGE_TOO_LARGE is the deterministic way to fail a batch for good."""
    topic = f"regress-bump-{uuid.uuid4().hex[:8]}"
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 1, 1, {"max.message.bytes": "1000"})])
    config = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
              "linger.ms": 0, "request.timeout.ms": 5000, "delivery.timeout.ms": 10000}
    with Producer(config) as producer:
        assert producer.send(topic, b"first").result(timeout=30).offset == 0
        with pytest.raises(RecordTooLargeError):
            producer.send(topic, b"x" * 5000).result(timeout=30)
        after = producer.send(topic, b"after the failure")
        assert after.result(timeout=15).offset == 1
