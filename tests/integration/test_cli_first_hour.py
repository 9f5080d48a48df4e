"""A Kafka user's first hour with the client commands (issue 13), against the shared local
cluster, through the CLI as a user runs it (a subprocess where pipes matter, click's runner
elsewhere): quiet broken pipes, truthful messages."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from click.testing import CliRunner, Result
from confluent_kafka.admin import AdminClient as KafkaAdminClient
from confluent_kafka.admin import ConfigResource, ConfigSource

from fjord.cli.main import cli
from fjord.local.defaults import LOCAL_REPLICA_LAG_TIME_MAX_MS
from fjord.testing.waiting import wait_for

pytestmark = pytest.mark.integration

FJORD = [sys.executable, "-c", "from fjord.cli.main import main; main()"]
WAIT_S = 60.0


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input)


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def new_topic(bootstrap: str, partitions: int = 1) -> str:
    topic = f"fh-{uuid.uuid4().hex[:8]}"
    ok(run("topics", "create", "--bootstrap-server", bootstrap, "--topic", topic,
           "--partitions", str(partitions)))
    return topic


def test_a_closed_pipe_ends_quietly(bootstrap: str) -> None:
    """``fjord consume ... | head -2`` and ``fjord topics describe | head -1``: status 141
    (128 + SIGPIPE, as for any Unix tool), nothing on stderr but the consumer's summary."""
    topic = new_topic(bootstrap)
    lines = "".join(f"{i:0100d}\n" for i in range(3000))  # 300 kB: more than a pipe holds
    ok(run("produce", "--bootstrap-server", bootstrap, "--topic", topic, input=lines))
    consumer = subprocess.Popen(
        [*FJORD, "consume", "--bootstrap-server", bootstrap, "--topic", topic,
         "--from-beginning", "--timeout-ms", "10000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert consumer.stdout is not None and consumer.stderr is not None
    head = [consumer.stdout.readline() for _ in range(2)]
    consumer.stdout.close()  # what `head -2` does after two lines
    assert consumer.wait(WAIT_S) == 141
    assert head == [f"{0:0100d}\n".encode(), f"{1:0100d}\n".encode()]
    stderr = consumer.stderr.read().decode()
    assert "Error" not in stderr and "Traceback" not in stderr and "Exception" not in stderr

    describe = subprocess.Popen(
        [*FJORD, "topics", "describe", "--bootstrap-server", bootstrap, "--topic", topic],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert describe.stdout is not None
    describe.stdout.close()  # the reader is gone before the first line is written
    _, stderr_bytes = describe.communicate(timeout=WAIT_S)
    assert describe.returncode == 141, stderr_bytes
    assert stderr_bytes == b""


def test_create_if_not_exists_says_what_happened(bootstrap: str) -> None:
    topic = new_topic(bootstrap)
    again = ok(run("topics", "create", "--bootstrap-server", bootstrap, "--topic", topic,
                   "--if-not-exists"))
    assert again.strip() == f"Topic {topic} already exists; nothing changed."


def group_view(bootstrap: str, group: str) -> dict:  # type: ignore[type-arg]
    return json.loads(ok(run("groups", "describe", "--bootstrap-server", bootstrap,
                             "--group", group, "-o", "json")))


def consumed_values(result: Result) -> list[str]:
    return ok(result).splitlines()


def test_consume_as_a_group_member(bootstrap: str) -> None:
    """``fjord consume --group``: starts from the group's committed offsets, commits only what
    it printed, honours reset-offsets (also given as --consumer-property group.id) and shows
    as a member while it runs."""
    topic = new_topic(bootstrap)
    group = f"fh-group-{uuid.uuid4().hex[:8]}"
    ok(run("produce", "--bootstrap-server", bootstrap, "--topic", topic,
           input="".join(f"v{i}\n" for i in range(10))))

    def consume(*extra: str) -> list[str]:
        return consumed_values(run("consume", "--bootstrap-server", bootstrap, "--topic", topic,
                                   "--max-messages", "3", "--timeout-ms", "20000", *extra))

    assert consume("--group", group, "--from-beginning") == ["v0", "v1", "v2"]
    rows = group_view(bootstrap, group)["rows"]
    assert [(r["current_offset"], r["log_end_offset"]) for r in rows] == [(3, 10)]
    # Without --from-beginning: from the committed offset, not from the end.
    assert consume("--group", group) == ["v3", "v4", "v5"]
    ok(run("groups", "reset-offsets", "--bootstrap-server", bootstrap, "--group", group,
           "--topic", topic, "--to-earliest", "--execute"))
    # group.id as a consumer property is the same as --group: the reset is not undone.
    assert consume("--consumer-property", f"group.id={group}") == ["v0", "v1", "v2"]
    assert group_view(bootstrap, group)["rows"][0]["current_offset"] == 3

    usage = run("consume", "--bootstrap-server", bootstrap, "--topic", topic, "--group", group,
                "--partition", "0")
    assert usage.exit_code == 2 and "cannot be used with --group" in usage.output

    member = subprocess.Popen(
        [*FJORD, "consume", "--bootstrap-server", bootstrap, "--topic", topic, "--group", group,
         "--timeout-ms", "60000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            view = group_view(bootstrap, group)
            if view["members"] and view["state"] == "Stable":
                break
            assert member.poll() is None, member.communicate()
            assert time.monotonic() < deadline, view
            time.sleep(0.2)
        (joined,) = view["members"]
        assert joined["assignment"] == [{"topic": topic, "partition": 0}]
        # Joined is not yet fetched: Ctrl-C only once it printed what it was given (it flushes
        # after every poll), so that what it commits is what it printed.
        assert member.stdout is not None and member.stderr is not None
        stdout = member.stdout
        printed: list[str] = []
        reader = threading.Thread(
            target=lambda: printed.extend(line.rstrip("\n") for line in stdout), daemon=True
        )
        reader.start()
        wait_for(lambda: len(printed) >= 7, "the member to print v3..v9", WAIT_S)
        member.send_signal(signal.SIGINT)  # Ctrl-C: commit, leave the group
        member.wait(timeout=WAIT_S)
        reader.join(timeout=WAIT_S)
        err = member.stderr.read()
        assert member.returncode == 0, err
        assert printed == [f"v{i}" for i in range(3, 10)]
        assert "Processed a total of 7 messages" in err
    finally:
        if member.poll() is None:
            member.kill()
            member.wait()
    view = group_view(bootstrap, group)
    assert view["members"] == [] and view["rows"][0]["current_offset"] == 10


def test_consume_timeout_with_a_group_counts_from_joining(bootstrap: str) -> None:
    """``consume --group G --timeout-ms`` shorter than joining the group takes (here the
    shared cluster's 300 ms initial rebalance delay alone is longer) still reads what is
    there: time spent joining is not time without records."""
    topic = new_topic(bootstrap)
    ok(run("produce", "--bootstrap-server", bootstrap, "--topic", topic, input="a\nb\n"))
    result = run("consume", "--bootstrap-server", bootstrap, "--topic", topic, "--group",
                 f"fh-join-{uuid.uuid4().hex[:8]}", "--from-beginning", "--timeout-ms", "200")
    assert consumed_values(result) == ["a", "b"]


def test_produce_confirms_partition_and_offset(bootstrap: str) -> None:
    topic = new_topic(bootstrap, partitions=2)
    out = ok(run("produce", "--bootstrap-server", bootstrap, "--topic", topic, "--partition",
                 "1", "--print-offsets", input="a\nb\nc\n"))
    assert out.splitlines() == [f"Produced to partition 1 at offset {i}." for i in range(3)]
    quiet = ok(run("produce", "--bootstrap-server", bootstrap, "--topic", topic, input="d\n"))
    assert quiet == ""


def test_produce_on_a_terminal_prompts_for_each_line(bootstrap: str) -> None:
    """On a terminal (stdin a pty) each line is sent at once and the next '>' prompt (stderr,
    as Kafka's console producer) comes after its acknowledgement; Ctrl-D ends with status 0."""
    topic = new_topic(bootstrap)
    controller, terminal = pty.openpty()
    producer = subprocess.Popen(
        [*FJORD, "produce", "--bootstrap-server", bootstrap, "--topic", topic, "--print-offsets"],
        stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    os.close(terminal)
    try:
        assert producer.stdout is not None and producer.stderr is not None
        os.write(controller, b"first\n")
        assert producer.stdout.readline() == b"Produced to partition 0 at offset 0.\n"
        os.write(controller, b"second\n")
        assert producer.stdout.readline() == b"Produced to partition 0 at offset 1.\n"
        os.write(controller, b"\x04")  # Ctrl-D at the start of a line: end of input
        assert producer.wait(WAIT_S) == 0
        stderr = producer.stderr.read().decode()
    finally:
        if producer.poll() is None:
            producer.kill()
        os.close(controller)
    assert stderr == f"Type records for {topic!r}, one per line; Ctrl-D to finish.\n>>>\n"


def one_line_error(result: Result, *needles: str) -> str:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_min_insync_replicas_above_the_replication_factor_is_refused(bootstrap: str) -> None:
    topic = f"fh-isr-{uuid.uuid4().hex[:8]}"
    b = ["--bootstrap-server", bootstrap]
    one_line_error(
        run("topics", "create", *b, "--topic", topic, "--partitions", "1",
            "--replication-factor", "2", "--config", "min.insync.replicas=3"),
        "INVALID_CONFIG", "min.insync.replicas", "replication factor 2",
    )
    ok(run("topics", "create", *b, "--topic", topic, "--partitions", "2",
           "--replication-factor", "2", "--config", "min.insync.replicas=2"))
    one_line_error(
        run("topics", "alter", *b, "--topic", topic, "--config", "min.insync.replicas=3"),
        "INVALID_CONFIG", "min.insync.replicas",
    )
    one_line_error(
        run("topics", "alter", *b, "--topic", topic, "--replication-factor", "1"),
        "INVALID_CONFIG", "min.insync.replicas",
    )
    (described,) = json.loads(ok(run("topics", "describe", *b, "--topic", topic, "-o", "json")))
    assert described["replication_factor"] == 2
    assert described["configs"] == {"min.insync.replicas": "2"}


def test_configs_like_kafka_configs(bootstrap: str) -> None:
    """``fjord configs``: describe with sources (--all: defaults too), alter with
    --add-config/--delete-config, and a clear refusal for what is not there yet."""
    topic = new_topic(bootstrap)
    b = ["--bootstrap-server", bootstrap]
    topic_args = ["--entity-type", "topics", "--entity-name", topic]
    altered = ok(run("configs", *b, "--alter", *topic_args,
                     "--add-config", "retention.ms=3600000,cleanup.policy=[delete]",
                     "--add-config", "segment.bytes=1048576"))
    assert altered.strip() == f"Completed updating config for topic {topic}."
    dynamic = json.loads(ok(run("configs", *b, "--describe", *topic_args, "-o", "json")))
    assert {e["name"]: (e["value"], e["source"]) for e in dynamic[topic]} == {
        "cleanup.policy": ("delete", "DYNAMIC_TOPIC_CONFIG"),
        "retention.ms": ("3600000", "DYNAMIC_TOPIC_CONFIG"),
        "segment.bytes": ("1048576", "DYNAMIC_TOPIC_CONFIG"),
    }
    ok(run("configs", *b, "--alter", *topic_args,
           "--delete-config", "segment.bytes,cleanup.policy"))
    every = json.loads(ok(run("configs", *b, "--describe", "--all", *topic_args, "-o", "json")))
    sources = {e["name"]: (e["value"], e["source"]) for e in every[topic]}
    assert sources["retention.ms"] == ("3600000", "DYNAMIC_TOPIC_CONFIG")
    assert sources["segment.bytes"][1] == "DEFAULT_CONFIG"
    assert sources["min.insync.replicas"] == ("1", "DEFAULT_CONFIG")
    table = ok(run("configs", *b, "--describe", "--all", *topic_args))
    assert table.startswith(f"All configs for topic {topic} are:")
    assert "retention.ms" in table and "DYNAMIC_TOPIC_CONFIG" in table
    one_line_error(run("configs", *b, "--alter", *topic_args, "--add-config", "retention.mss=1"),
                   "INVALID_CONFIG", "retention.mss")
    one_line_error(run("configs", *b, "--describe", "--entity-type", "topics",
                       "--entity-name", f"missing-{topic}"), "UNKNOWN_TOPIC_OR_PARTITION")
    one_line_error(run("configs", *b, "--describe", "--entity-type", "groups",
                       "--entity-name", "g"), "INVALID_REQUEST", "no per-group configs",
                   "KIP-848", "group.min.session.timeout.ms")


def test_configs_of_brokers(bootstrap: str, local_cluster) -> None:  # type: ignore[no-untyped-def]
    """``fjord configs --entity-type brokers``: each broker's own answer, every key with its
    source under --all, the same a Kafka admin client gets from the Kafka listener; --alter of
    a read-only key refused with Kafka's error (test_dynamic_broker_configs covers the dynamic
    ones); bad ids named."""
    b = ["--bootstrap-server", bootstrap]
    every = json.loads(ok(run("configs", *b, "--describe", "--all", "--entity-type", "brokers",
                              "-o", "json")))
    assert sorted(every) == ["0", "1", "2"]
    for entries in every.values():
        sources = {e["name"]: (e["value"], e["source"]) for e in entries}
        # fjord local starts brokers with a shorter lag limit than Kafka's 30 s.
        assert sources["replica.lag.time.max.ms"] == (
            str(LOCAL_REPLICA_LAG_TIME_MAX_MS), "STATIC_BROKER_CONFIG")
        assert sources["replica.fetch.backoff.ms"] == ("200", "DEFAULT_CONFIG")
        assert sources["auto.create.topics.enable"] == ("false", "DEFAULT_CONFIG")
        # Topic defaults under Kafka's broker names (log.retention.ms for retention.ms).
        assert "min.insync.replicas" in sources and "log.retention.ms" in sources
        assert "retention.ms" not in sources
        assert {s for _, s in sources.values()} <= {
            "DEFAULT_CONFIG", "STATIC_BROKER_CONFIG", "DYNAMIC_DEFAULT_BROKER_CONFIG"}
    kafka_admin = KafkaAdminClient({"bootstrap.servers": local_cluster.kafka_bootstrap_servers})
    [described] = kafka_admin.describe_configs([ConfigResource("broker", "1")]).values()
    assert {name: (entry.value, ConfigSource(entry.source).name) for name, entry in
            described.result(WAIT_S).items()} == {
        e["name"]: (e["value"], e["source"]) for e in every["1"]}
    table = ok(run("configs", *b, "--describe", "--all", "--entity-type", "brokers",
                   "--entity-name", "1"))
    assert table.startswith("All configs for broker 1 are:")
    assert "replica.lag.time.max.ms" in table and "DEFAULT_CONFIG" in table
    set_only = ok(run("configs", *b, "--describe", "--entity-type", "brokers",
                      "--entity-name", "1"))
    assert set_only.startswith("Set configs for broker 1 are:")
    assert "replica.lag.time.max.ms" in set_only and "STATIC_BROKER_CONFIG" in set_only
    assert "replica.fetch.backoff.ms" not in set_only  # defaults only with --all
    one_line_error(run("configs", *b, "--alter", "--entity-type", "brokers", "--entity-name", "0",
                       "--add-config", "replica.lag.time.max.ms=1000"),
                   "INVALID_REQUEST",
                   "Cannot update these configs dynamically: replica.lag.time.max.ms")
    one_line_error(run("configs", *b, "--describe", "--entity-type", "brokers",
                       "--entity-name", "99"), "BROKER_NOT_AVAILABLE", "live: 0, 1, 2")
    assert run("configs", *b, "--describe", "--entity-type", "brokers",
               "--entity-name", "x").exit_code == 2
