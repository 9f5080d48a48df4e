"""Damaged bytes at rest, with real processes: 3 brokers, a topic with replication factor 3 and
small segments; bytes flipped in a closed segment of the preferred leader while it is stopped.

Private cluster (the test stops, damages and restarts broker 0). What it proves (issue 12,
"Damaged bytes at rest: found, never served, repaired"):
- led again (preferred leader), broker 0 finds the damage when it is read, hands leadership to
  a healthy ISR member, truncates its copy there and fetches it again: ISR back to 3;
- the scrubber finds damage in the background (no read needed) and repairs it the same way;
- consumers reading all along never get the damaged batch nor skip a record.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from fjord.cli.main import cli as cli_main
from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.client.types import PartitionInfo
from fjord.local import LocalCluster
from fjord.testing.damage import FlippedBatch, batch_count, flip_byte_in_batch, segment_files
from fjord.testing.metrics_probe import scrape_metric
from fjord.testing.waiting import wait_for

pytestmark = pytest.mark.integration

WAIT_S = 45.0
DAMAGED = 0
RECORDS = 3000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        tmp_path_factory.mktemp("scrub"), brokers=3, controllers=1, coordinators=0,
        cluster_id="scrub", broker_lease_ttl_s=6, unsafe_etcd_no_fsync=True,
        config={"log.scrubber.backoff.ms": "500",
                "log.scrubber.io.max.bytes.per.second": str(64 * 1024 * 1024)},
    )
    c.start()
    yield c
    c.stop()


def partition(admin: AdminClient, topic: str) -> PartitionInfo:
    (description,) = admin.describe_topics([topic])
    return description.partitions[0]


def metric(cluster: LocalCluster, broker_id: int, name: str) -> float:
    return scrape_metric(cluster.metrics_address("broker", broker_id), name)


def damaged_topic(cluster: LocalCluster, admin: AdminClient) -> tuple[str, list[bytes]]:
    name = f"s-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 1, 3, {"segment.bytes": "32768",
                                               "min.insync.replicas": "2"})])
    admin.alter_partition_reassignments({(name, 0): [DAMAGED, 1, 2]})
    wait_for(lambda: (
        list((info := partition(admin, name)).replicas) == [DAMAGED, 1, 2]
        and sorted(info.isr) == [0, 1, 2]
        and not admin.list_partition_reassignments([(name, 0)])
    ), f"{name} on [0, 1, 2]", WAIT_S)
    admin.elect_leaders("preferred", [(name, 0)], raise_on_error=False)
    wait_for(lambda: partition(admin, name).leader == DAMAGED, "broker 0 leads", WAIT_S)
    values = [f"{i:06d}-".encode() + b"x" * 100 for i in range(RECORDS)]
    # Batches of at most 4 KiB (about 35 records), so every 32 KiB segment holds several and
    # the damaged one is in a closed segment with records after it. Without
    # blocked.batch.size 0, a producer whose in-flight window is full (5 acks=all batches
    # unanswered: at once here) grows one batch up to 512 KiB holding the rest of the records,
    # alone in the active segment: the second segment had one batch, no 4th to damage.
    config = {"bootstrap.servers": cluster.bootstrap_servers, "acks": "all",
              "enable.idempotence": "true", "linger.ms": 5, "batch.size": 4096,
              "blocked.batch.size": 0}
    with Producer(config) as producer:
        futures = [producer.send(name, value=v, partition=0) for v in values]
        producer.flush(WAIT_S)
        assert [f.result(0).offset for f in futures] == list(range(RECORDS))
    wait_for(lambda: sorted(partition(admin, name).isr) == [0, 1, 2], "full ISR", WAIT_S)
    return name, values


def stop_and_flip(cluster: LocalCluster, admin: AdminClient, topic: str) -> FlippedBatch:
    """Stop broker 0 cleanly, flip a byte in the 4th batch of its second segment."""
    cluster.kill("broker", DAMAGED, signal.SIGTERM)
    cluster.process("broker", DAMAGED).wait(WAIT_S)
    wait_for(lambda: partition(admin, topic).leader not in (DAMAGED, -1), "leader moved", WAIT_S)
    directory: Path = cluster.data_dir / "brokers" / str(DAMAGED) / f"{topic}-0"
    segments = segment_files(directory)
    assert len(segments) >= 3, segments
    assert batch_count(segments[1]) >= 4, f"{segments[1]}: {batch_count(segments[1])} batches"
    return flip_byte_in_batch(segments[1], 3)


def read_everything(cluster: LocalCluster, topic: str, values: list[bytes]) -> None:
    """A consumer from the start: every record, in order, no error (never the bad batch)."""
    with Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                   "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got: list[tuple[int, bytes]] = []
        wait_for(lambda: got.extend((r.offset, r.value or b"") for r in consumer.poll(0.2))
                 or len(got) >= len(values), f"{len(values)} records", WAIT_S)
    assert got == list(enumerate(values))


def test_leader_finds_damage_on_read_hands_over_and_repairs(cluster: LocalCluster) -> None:
    with AdminClient({"bootstrap.servers": cluster.address("broker", 1),
                      "default.api.timeout.ms": 30000}) as admin:
        topic, values = damaged_topic(cluster, admin)
        flipped = stop_and_flip(cluster, admin, topic)
        # The scrubber off for this run: the read path alone must keep the batch from
        # consumers, and the damaged leader must hand over.
        cluster.broker_config["log.scrubber.enable"] = "false"
        try:
            cluster.start_broker(DAMAGED)
        finally:
            del cluster.broker_config["log.scrubber.enable"]
        wait_for(lambda: partition(admin, topic).leader == DAMAGED,
                 "broker 0 preferred leader again", WAIT_S)
        before = partition(admin, topic)
        read_everything(cluster, topic, values)
        wait_for(lambda: metric(cluster, DAMAGED, "fjord_broker_log_damage_repaired_total") >= 1,
                 "the damaged copy repaired", WAIT_S)
        assert metric(cluster, DAMAGED, 'fjord_broker_log_damage_found_total{source="read"}') == 1
        assert metric(cluster, DAMAGED,
                      'fjord_broker_leadership_resignations_total{reason="damage"}') == 1
        after = wait_for(lambda: (info := partition(admin, topic)).leader_epoch
                         > before.leader_epoch and sorted(info.isr) == [0, 1, 2] and info,
                         "ISR back to 3 after the handover", WAIT_S)
        assert after.leader_epoch > before.leader_epoch
        read_everything(cluster, topic, values)
        print(f"\ndamaged batch {flipped.base_offset}..{flipped.next_offset - 1}: found on read, "
              "leadership handed over, repaired")


def test_scrubber_finds_damage_without_a_read_and_repairs(cluster: LocalCluster) -> None:
    with AdminClient({"bootstrap.servers": cluster.address("broker", 1),
                      "default.api.timeout.ms": 30000}) as admin:
        topic, values = damaged_topic(cluster, admin)
        found_before = metric(cluster, DAMAGED, 'fjord_broker_log_damage_found_total')
        repaired_before = metric(cluster, DAMAGED, "fjord_broker_log_damage_repaired_total")
        stop_and_flip(cluster, admin, topic)
        cluster.start_broker(DAMAGED)  # metrics restart at 0 with the process
        wait_for(lambda: metric(cluster, DAMAGED,
                                'fjord_broker_log_damage_found_total{source="scrub"}') >= 1,
                 "the scrubber found the damage", WAIT_S)
        wait_for(lambda: metric(cluster, DAMAGED, "fjord_broker_log_damage_repaired_total") >= 1,
                 "the damaged copy repaired", WAIT_S)
        wait_for(lambda: sorted(partition(admin, topic).isr) == [0, 1, 2], "ISR back to 3",
                 WAIT_S)
        assert metric(cluster, DAMAGED, "fjord_broker_scrub_bytes_total") > 0
        del found_before, repaired_before
        read_everything(cluster, topic, values)
        # The operator's view: fjord log-dirs describe.
        runner = CliRunner()
        args = ["log-dirs", "describe", "--bootstrap-server", cluster.bootstrap_servers,
                "--broker", str(DAMAGED)]
        shown = runner.invoke(cli_main, [*args, "--output", "json"])
        assert shown.exit_code == 0, shown.output
        (described,) = json.loads(shown.stdout)  # warnings (stderr) are not JSON
        assert described["writable"] and described["scrub"]["enabled"]
        assert described["scrub"]["damage_found"] >= 1 and described["scrub"]["repairs_done"] >= 1
        (mine,) = [p for p in described["partitions"] if p["topic"] == topic]
        assert mine["damaged_offset"] is None and mine["log_end_offset"] == RECORDS
        table = runner.invoke(cli_main, args)
        assert table.exit_code == 0 and "scrub pass" in table.output, table.output
        print("\n" + table.output)
        assert f"{topic}-0" in table.output and "repairs done" in table.output
        missing = runner.invoke(cli_main, [*args[:-1], "7"])
        assert missing.exit_code != 0 and "not live" in missing.output, missing.output
