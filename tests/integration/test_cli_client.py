"""The user-facing commands (topics, produce, consume, cluster, perf) against the shared local
cluster, through click's CliRunner: JSON output parsed, errors are one line and a non-zero exit."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from click.testing import CliRunner, Result

from fjord.cli.client_common import local_cluster_bootstrap, resolve_bootstrap
from fjord.cli.main import cli
from fjord.config import DEFAULT_BOOTSTRAP_SERVERS

pytestmark = pytest.mark.integration


def run(bootstrap: str, *args: str, input: str | None = None) -> Result:
    command, rest = list(args[:2]), list(args[2:])
    if args[0] in ("produce", "consume"):
        command, rest = [args[0]], list(args[1:])
    return CliRunner().invoke(cli, [*command, "--bootstrap-server", bootstrap, *rest], input=input)


def ok(result: Result) -> str:
    assert result.exit_code == 0, (result.output, result.stderr, result.exception)
    return result.stdout


def as_json(result: Result) -> Any:
    return json.loads(ok(result))


def assert_one_line_error(result: Result, *needles: str) -> None:
    assert result.exit_code != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_topics_lifecycle(bootstrap: str) -> None:
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    created = run(
        bootstrap, "topics", "create", "--topic", topic, "--partitions", "2",
        "--replication-factor", "1", "--config", "retention.ms=3600000",
    )  # fmt: skip
    assert f"Created topic {topic}" in ok(created)
    assert_one_line_error(
        run(bootstrap, "topics", "create", "--topic", topic, "--partitions", "1"),
        "TOPIC_ALREADY_EXISTS",
    )
    ok(run(bootstrap, "topics", "create", "--topic", topic, "--if-not-exists"))
    assert_one_line_error(
        run(bootstrap, "topics", "create", "--topic", "bad name!", "--partitions", "1"),
        "INVALID_TOPIC_EXCEPTION",
    )
    listed = as_json(run(bootstrap, "topics", "list", "--output", "json"))
    assert {"name": topic, "partitions": 2} in listed
    assert topic in ok(run(bootstrap, "topics", "list"))

    ok(run(bootstrap, "topics", "alter", "--topic", topic, "--partitions", "3"))
    ok(run(bootstrap, "topics", "alter", "--topic", topic, "--config", "segment.bytes=1048576"))
    ok(run(bootstrap, "topics", "alter", "--topic", topic, "--delete-config", "retention.ms"))
    (described,) = as_json(run(bootstrap, "topics", "describe", "--topic", topic, "-o", "json"))
    assert described["partition_count"] == 3
    assert described["configs"] == {"segment.bytes": "1048576"}
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    table = ok(run(bootstrap, "topics", "describe", "--topic", topic))
    assert "PartitionCount: 3" in table and "Leader" in table
    assert_one_line_error(
        run(bootstrap, "topics", "alter", "--topic", topic, "--partitions", "2"),
        "INVALID_PARTITIONS",
    )
    assert_one_line_error(run(bootstrap, "topics", "alter", "--topic", topic), "nothing to alter")

    assert f"Deleted topic {topic}" in ok(run(bootstrap, "topics", "delete", "--topic", topic))
    assert_one_line_error(
        run(bootstrap, "topics", "delete", "--topic", topic), "UNKNOWN_TOPIC_OR_PARTITION"
    )
    ok(run(bootstrap, "topics", "delete", "--topic", topic, "--if-exists"))
    assert_one_line_error(
        run(bootstrap, "topics", "describe", "--topic", topic), "UNKNOWN_TOPIC_OR_PARTITION"
    )


def test_produce_then_consume(bootstrap: str) -> None:
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    ok(run(bootstrap, "topics", "create", "--topic", topic, "--partitions", "1"))
    lines = "".join(f"k{i}:value {i}\n" for i in range(25))
    ok(
        run(
            bootstrap, "produce", "--topic", topic, "--property", "parse.key=true",
            "--property", "key.separator=:", "--acks", "all", "--compression-type", "lz4",
            input=lines,
        )
    )  # fmt: skip
    assert_one_line_error(
        run(
            bootstrap, "produce", "--topic", topic, "--property", "parse.key=true",
            input="no separator here\n",
        ),
        "no key separator",
    )  # fmt: skip
    consumed = run(
        bootstrap, "consume", "--topic", topic, "--from-beginning", "--max-messages", "25",
        "--timeout-ms", "10000", "--output", "json",
    )  # fmt: skip
    records = [json.loads(line) for line in ok(consumed).splitlines()]
    assert [(r["key"], r["value"], r["offset"]) for r in records] == [
        (f"k{i}", f"value {i}", i) for i in range(25)
    ]
    assert "Processed a total of 25 messages" in consumed.stderr
    text = run(
        bootstrap, "consume", "--topic", topic, "--partition", "0", "--offset", "23",
        "--max-messages", "2", "--timeout-ms", "10000", "--property", "print.key=true",
        "--property", "print.offset=true",
    )  # fmt: skip
    assert ok(text).splitlines() == ["Offset:23\tk23\tvalue 23", "Offset:24\tk24\tvalue 24"]
    idle = run(bootstrap, "consume", "--topic", topic, "--timeout-ms", "300")
    assert ok(idle) == "" and "Processed a total of 0 messages" in idle.stderr
    assert_one_line_error(
        run(bootstrap, "consume", "--topic", f"missing-{topic}", "--timeout-ms", "300"),
        "UNKNOWN_TOPIC_OR_PARTITION",
    )
    assert_one_line_error(
        run(bootstrap, "consume", "--topic", topic, "--property", "print.colour=true"),
        "print.colour",
    )


def test_cluster_describe(bootstrap: str, local_cluster) -> None:  # type: ignore[no-untyped-def]
    data = as_json(run(bootstrap, "cluster", "describe", "--output", "json"))
    assert data["cluster_id"] == local_cluster.cluster_id
    assert data["controller"]["id"] in {c["id"] for c in data["controllers"]}
    brokers = {f"{b['host']}:{b['port']}" for b in data["brokers"]}
    assert brokers == set(local_cluster.bootstrap_servers.split(","))
    assert "Controller:" in ok(run(bootstrap, "cluster", "describe"))


def test_perf_produce_and_consume(bootstrap: str) -> None:
    topic = f"perf-{uuid.uuid4().hex[:8]}"
    ok(run(bootstrap, "topics", "create", "--topic", topic, "--partitions", "2"))
    produced = as_json(
        run(
            bootstrap, "perf", "produce", "--topic", topic, "--num-records", "2000",
            "--record-size", "50", "--producer-props", "acks=1", "--output", "json",
        )
    )  # fmt: skip
    assert produced["records"] == 2000 and produced["records_per_sec"] > 0
    latency = produced["latency_ms"]
    assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]
    consumed = as_json(
        run(bootstrap, "perf", "consume", "--topic", topic, "--messages", "2000", "-o", "json")
    )
    assert consumed["records"] == 2000 and consumed["bytes"] == 2000 * 50
    text = ok(
        run(bootstrap, "perf", "produce", "--topic", topic, "--num-records", "100",
            "--record-size", "10", "--throughput", "1000")
    )  # fmt: skip
    assert "100 records sent" in text and "99th" in text
    assert_one_line_error(
        run(bootstrap, "perf", "produce", "--topic", topic, "--num-records", "10",
            "--record-size", "10", "--producer-props", "lingr.ms=1")
    , "lingr.ms")  # fmt: skip


def test_bootstrap_resolution(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("FJORD_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert local_cluster_bootstrap() is None
    assert resolve_bootstrap(None) == DEFAULT_BOOTSTRAP_SERVERS
    state_dir = tmp_path / ".fjord"
    state_dir.mkdir()
    state = {"bootstrap_servers": "127.0.0.1:1111", "processes": [{"pid": 1}]}
    (state_dir / "cluster.json").write_text(json.dumps(state))
    assert resolve_bootstrap(None) == "127.0.0.1:1111"
    monkeypatch.setenv("FJORD_BOOTSTRAP_SERVERS", "10.0.0.1:9")
    assert resolve_bootstrap(None) == "10.0.0.1:9"
    assert resolve_bootstrap("h:1") == "h:1"
