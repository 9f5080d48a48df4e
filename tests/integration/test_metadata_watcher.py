"""MetadataWatcher against a real etcd: snapshot, watch, transactions, reconnect."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import urllib.request

import pytest

from fjord.local.etcd import EtcdProcess
from fjord.metadata import (
    BrokerRegistration,
    Keys,
    MetadataImage,
    MetadataWatcher,
    PartitionState,
    TopicRecord,
    etcd_client,
)

pytestmark = pytest.mark.integration

WAIT_S = 10.0


def test_snapshot_then_watch_follows_puts_deletes_and_txns(
    etcd: EtcdProcess, cluster_id: str
) -> None:
    keys = Keys(cluster_id)

    async def scenario() -> None:
        async with etcd_client(etcd.url) as client:
            # Written before the watcher starts: must come from the snapshot.
            await client.put(keys.broker(1).encode(), BrokerRegistration(1, "h", 1).to_json())
            # Another cluster's keys must be invisible.
            other = Keys(cluster_id + "-other")
            await client.put(other.broker(9).encode(), BrokerRegistration(9, "x", 9).to_json())

            watcher = MetadataWatcher(client, cluster_id)
            seen: list[tuple[int, int]] = []
            watcher.add_listener(lambda old, new: seen.append((old.revision, new.revision)))
            image = await watcher.start()
            assert set(image.brokers) == {1}
            assert image.broker_epoch(1) is not None
            try:
                # A txn writing a topic and its partitions is applied as one change.
                topic = TopicRecord("ab" * 16, 2, 1, {"retention.ms": "1000"})
                states = [PartitionState((1,), (1,), 1, 0, 0) for _ in range(2)]
                ok, _ = await client.transaction(
                    compare=[],
                    success=[
                        client.transactions.put(keys.topic("t").encode(), topic.to_json()),
                        *(
                            client.transactions.put(keys.partition("t", p).encode(), s.to_json())
                            for p, s in enumerate(states)
                        ),
                    ],
                    failure=[],
                )
                assert ok
                revision = (await client.get(keys.topic("t").encode())).mod_revision
                image = await watcher.wait_for_revision(revision, WAIT_S)
                assert image.topic("t") == topic
                assert dict(image.partitions("t")) == {0: states[0], 1: states[1]}
                assert [r.partition for r in image.partitions_led_by(1)] == [0, 1]
                # No listener call ever saw the topic without both partitions.
                assert all(new > old for old, new in seen)

                # A corrupt value is ignored, not fatal; later changes still arrive.
                await client.put(keys.broker(2).encode(), b"{not json")
                await client.delete(keys.broker(1).encode())
                image = await watcher.wait_for(lambda i: 1 not in i.brokers, WAIT_S)
                assert dict(image.brokers) == {}

                # Deleting a topic's keys removes it and its partitions.
                await client.delete_prefix(keys.topic("t").encode())
                image = await watcher.wait_for(lambda i: i.topic("t") is None, WAIT_S)
                assert dict(image.partitions("t")) == {}
                with pytest.raises(TimeoutError):
                    await watcher.wait_for_revision(image.revision + 1000, 0.2)
            finally:
                await watcher.stop()

    asyncio.run(scenario())


def test_watcher_survives_etcd_restart(tmp_path, cluster_id: str) -> None:  # type: ignore[no-untyped-def]
    """The watch stream breaks when etcd restarts; the watcher resumes from its revision."""
    proc = EtcdProcess(tmp_path / "data", tmp_path / "etcd.log", unsafe_no_fsync=True)
    proc.start()
    keys = Keys(cluster_id)

    async def scenario() -> None:
        async with etcd_client(proc.url) as client:
            watcher = MetadataWatcher(client, cluster_id)
            await watcher.start()
            try:
                await client.put(keys.broker(1).encode(), BrokerRegistration(1, "h", 1).to_json())
                await watcher.wait_for(lambda i: 1 in i.brokers, WAIT_S)
                await asyncio.to_thread(proc.stop)
                await asyncio.to_thread(proc.start)  # same ports, same data
                await client.put(keys.broker(2).encode(), BrokerRegistration(2, "h", 2).to_json())
                image: MetadataImage = await watcher.wait_for(lambda i: 2 in i.brokers, WAIT_S)
                assert set(image.brokers) == {1, 2}
            finally:
                await watcher.stop()

    try:
        asyncio.run(scenario())
    finally:
        proc.stop()


def _gateway(etcd: EtcdProcess, path: str, body: dict) -> dict:  # type: ignore[type-arg]
    """A blocking call to etcd's JSON gateway (used while the event loop must not run)."""
    request = urllib.request.Request(f"{etcd.url}{path}", data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=WAIT_S) as response:
        return json.load(response)  # type: ignore[no-any-return]


def test_watcher_reloads_a_snapshot_when_its_revision_was_compacted(
    etcd: EtcdProcess, cluster_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    keys = Keys(cluster_id)

    async def scenario() -> None:
        async with etcd_client(etcd.url) as client:
            watcher = MetadataWatcher(client, cluster_id)
            await watcher.start()
            try:
                # Break the watch stream, then -- with this event loop blocked, so the watcher
                # cannot resume in between -- write and compact past its revision.
                await client.close()
                for broker_id in (4, 5):  # two revisions: the watcher's next one is compacted
                    reg = BrokerRegistration(broker_id, "h", broker_id).to_json()
                    put = _gateway(etcd, "/v3/kv/put", {
                        "key": base64.b64encode(keys.broker(broker_id).encode()).decode(),
                        "value": base64.b64encode(reg).decode(),
                    })
                _gateway(etcd, "/v3/kv/compaction", {"revision": put["header"]["revision"]})
                image = await watcher.wait_for(lambda i: {4, 5} <= set(i.brokers), WAIT_S)
                assert image.revision >= int(put["header"]["revision"])
            finally:
                await watcher.stop()

    with caplog.at_level(logging.WARNING, logger="fjord.metadata.watcher"):
        asyncio.run(scenario())
    assert "compacted" in caplog.text
