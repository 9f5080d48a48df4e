"""A broker whose data directory fills up, with a real full filesystem: broker 0's data
directory is a small tmpfs (mounting one needs root; without it the module is skipped, saying
so). Private cluster: the test fills, kills and restarts broker 0.

What it proves (issue 12, "Disk full, told plainly", broker side):
- the condition is logged once (no traceback per second) and counted in metrics;
- the broker hands the leadership of its partitions to another ISR member, so acks=all writes
  continue on the other replicas and nothing acknowledged is lost or duplicated;
- restarted on the full disk it starts, registers and serves reads;
- once space is freed it says so once, follows again and rejoins the ISR.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from fjord.cli.main import cli as cli_main
from fjord.client import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from fjord.client.types import PartitionInfo
from fjord.local import LocalCluster
from fjord.testing.metrics_probe import scrape_metric
from fjord.testing.waiting import wait_for

pytestmark = pytest.mark.integration

WAIT_S = 45.0
TMPFS_SIZE = "24m"
FULL_BROKER = 0


def _mount_tmpfs(path: Path) -> str | None:
    """Mount a small tmpfs at ``path``; the reason it cannot be done, None when mounted."""
    if os.geteuid() != 0:
        return "mounting a small tmpfs (a real full filesystem) needs root"
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(path)],
        capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        return f"mount -t tmpfs failed (no CAP_SYS_ADMIN in this container?): {done.stderr}"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    base = tmp_path_factory.mktemp("diskfull")
    mount_point = base / "brokers" / str(FULL_BROKER)
    why_not = _mount_tmpfs(mount_point)
    if why_not is not None:
        pytest.skip(why_not)
    c = LocalCluster(
        base, brokers=3, controllers=1, coordinators=0, cluster_id="diskfull",
        broker_lease_ttl_s=6, unsafe_etcd_no_fsync=True,
    )
    try:
        c.start()
        yield c
    finally:
        c.stop()
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def partition(admin: AdminClient, topic: str) -> PartitionInfo:
    (description,) = admin.describe_topics([topic])
    return description.partitions[0]


def placed_topic(admin: AdminClient, replicas: list[int], config: dict[str, str]) -> str:
    """A one-partition topic on exactly ``replicas``, led by the first."""
    name = f"d-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 1, len(replicas), config)])
    admin.alter_partition_reassignments({(name, 0): replicas})
    wait_for(lambda: (
        list((info := partition(admin, name)).replicas) == replicas
        and sorted(info.isr) == sorted(replicas)
        and not admin.list_partition_reassignments([(name, 0)])
    ), f"{name} on {replicas}", WAIT_S)
    admin.elect_leaders("preferred", [(name, 0)], raise_on_error=False)
    wait_for(lambda: partition(admin, name).leader == replicas[0],
             f"{name} led by {replicas[0]}", WAIT_S)
    return name


def produce(bootstrap: str, topic: str, values: list[bytes]) -> list[int]:
    config = {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": "true",
              "linger.ms": 5, "delivery.timeout.ms": 60000}
    with Producer(config) as producer:
        futures = [producer.send(topic, value=v, partition=0) for v in values]
        producer.flush(WAIT_S + 30)
        return [f.result(0).offset for f in futures]


def read_all(bootstrap: str, topic: str, n: int) -> list[bytes]:
    with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        out: list[bytes] = []
        wait_for(lambda: out.extend(r.value or b"" for r in consumer.poll(0.2)) or len(out) >= n,
                 f"{n} records of {topic}", WAIT_S)
    return out


def fill(directory: Path) -> Path:
    """Write a filler file until the filesystem refuses: the disk is now really full."""
    filler = directory / ".filler"  # hidden: the broker ignores dot files
    chunk = bytes(256 * 1024)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass
    return filler


def metric(cluster: LocalCluster, broker_id: int, name: str) -> float:
    return scrape_metric(cluster.metrics_address("broker", broker_id), name)


def broker_log(cluster: LocalCluster, broker_id: int) -> str:
    return (cluster.logs_dir / f"broker-{broker_id}.log").read_text(errors="replace")


def test_full_disk_hands_over_leadership_restarts_and_rejoins(cluster: LocalCluster) -> None:
    data_dir = cluster.data_dir / "brokers" / str(FULL_BROKER)
    with AdminClient({"bootstrap.servers": cluster.address("broker", 1),
                      "default.api.timeout.ms": 30000}) as admin:
        replicated = placed_topic(admin, [FULL_BROKER, 1, 2], {"min.insync.replicas": "2"})
        alone = placed_topic(admin, [FULL_BROKER], {})
        before = [f"before-{i}".encode() for i in range(100)]
        produce(cluster.bootstrap_servers, replicated, before)
        produce(cluster.bootstrap_servers, alone, before)
        log_start = len(broker_log(cluster, FULL_BROKER))

        filler = fill(data_dir)
        filled = time.monotonic()
        during = [f"during-{i}".encode() for i in range(300)]
        offsets = produce(cluster.bootstrap_servers, replicated, during)
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        moved = wait_for(lambda: (
            (info := partition(admin, replicated)).leader not in (FULL_BROKER, -1)
            and FULL_BROKER not in info.isr and info
        ), "leadership and ISR moved off the full broker", WAIT_S)
        assert moved.leader == 1
        handed_over_s = time.monotonic() - filled
        assert metric(cluster, FULL_BROKER, "fjord_broker_log_dir_writable") == 0
        assert metric(cluster, FULL_BROKER, "fjord_broker_log_dir_write_errors_total") >= 1
        assert metric(cluster, FULL_BROKER, "fjord_broker_leadership_resignations_total") >= 1
        # Several seconds of failing writes and probes: told once, never a traceback.
        wait_for(lambda: metric(cluster, FULL_BROKER,
                                'fjord_broker_log_dir_write_errors_total{operation="probe"}') >= 3,
                 "three failed probes", WAIT_S)
        told = broker_log(cluster, FULL_BROKER)[log_start:]
        assert told.count("cannot be written: No space left on device (ENOSPC)") == 1, told
        assert "Traceback" not in told, told
        shown = CliRunner().invoke(cli_main, [
            "log-dirs", "describe", "--bootstrap-server", cluster.address("broker", 1),
            "--broker", str(FULL_BROKER)])
        assert shown.exit_code == 0, shown.output
        assert "NOT WRITABLE (No space left on device (ENOSPC))" in shown.output, shown.output

        # Restarted on the full disk, it starts, registers and serves what it leads.
        cluster.kill("broker", FULL_BROKER, signal.SIGKILL)
        restarted = time.monotonic()
        cluster.start_broker(FULL_BROKER)
        assert read_all(cluster.address("broker", FULL_BROKER), alone, 100) == before
        served_s = time.monotonic() - restarted

        # Space comes back: said once, it follows again and rejoins the ISR.
        filler.unlink()
        freed = time.monotonic()
        wait_for(lambda: sorted(partition(admin, replicated).isr) == [FULL_BROKER, 1, 2],
                 "the full broker back in the ISR", WAIT_S)
        print(f"\ndisk full: 300 acks=all records acknowledged and leadership handed over "
              f"{handed_over_s:.2f} s after the disk filled; reads served "
              f"{served_s:.2f} s after a SIGKILL and restart on the full disk; back in the ISR "
              f"{time.monotonic() - freed:.2f} s after space was freed")
        told = broker_log(cluster, FULL_BROKER)[log_start:]
        assert "is writable again" in told, told
        assert metric(cluster, FULL_BROKER, "fjord_broker_log_dir_writable") == 1
        assert read_all(cluster.bootstrap_servers, replicated, 400) == before + during
