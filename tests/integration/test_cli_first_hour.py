"""A Kafka user's first hour with the client commands (issue 13), against the shared local
cluster, through the CLI as a user runs it (a subprocess where pipes matter, click's runner
elsewhere): quiet broken pipes, truthful messages."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
from click.testing import CliRunner, Result

from fjord.cli.main import cli

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
