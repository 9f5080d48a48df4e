"""Every shell and Python block of README.md, run as a reader runs them (issue 13): the Quick
start's commands against the cluster `make run` leaves up (`fjord quickstart`, what `make run`
runs), every later block in document order in a fresh directory, where the README's own
`fjord local up --detach` starts the cluster.

A block the test cannot run carries ``<!-- readme-test: not run: <why> -->`` on the line before
its opening fence; :func:`test_blocks_not_run_are_marked_with_a_reason` lists them, and the
blocks themselves show up as skipped tests naming the reason. Only ``sh`` and ``python`` blocks
hold commands; any other fenced block must have no language (plain text such as the layout).

So that runs never collide with other tests or a developer's cluster on Kafka's ports, each
block is rewritten before it runs, and only in these ways:

- ``fjord local up`` and ``fjord quickstart`` get ``--port 0`` (free ports instead of 9092..);
- ``127.0.0.1:9092`` becomes the first broker address of the running cluster, and
  ``127.0.0.1:39092`` the first address of its Kafka listener;
- the clusters live in temporary directories named by ``FJORD_DATA_DIR``.

Shell blocks run with ``bash -e -o pipefail`` and empty stdin; Python blocks run one after the
other in one interpreter per README section (later blocks use names the earlier ones define).
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"
NOT_RUN = re.compile(r"<!-- readme-test: not run: (?P<why>\S.*?) -->")
FENCE = re.compile(r"^```(?P<lang>\S*)\s*$")
RUNNABLE = ("sh", "python")
#: The section whose blocks run against the quickstart's cluster (what `make run` leaves up).
QUICKSTART_SECTION = "Quick start"
BLOCK_TIMEOUT_S = 180.0
START_TIMEOUT_S = 180.0
FJORD_BROKERS = "127.0.0.1:9092"
KAFKA_BROKERS = "127.0.0.1:39092"


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    section: str
    not_run: str | None

    @property
    def name(self) -> str:
        return f"L{self.line}-{self.lang}-{re.sub(r'[^a-z0-9]+', '-', self.section.lower())}"


def readme_blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text with their section and not-run reason."""
    blocks: list[Block] = []
    lines = text.splitlines()
    section = ""
    i = 0
    while i < len(lines):
        if lines[i].startswith("## "):
            section = lines[i][3:].strip()
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"README.md:{start + 1}: unclosed code fence"
        marker = NOT_RUN.search(lines[start - 1]) if start else None
        blocks.append(
            Block(start + 1, fence["lang"], "\n".join(body) + "\n", section,
                  marker["why"] if marker else None)
        )  # fmt: skip
        i += 1
    return blocks


BLOCKS = readme_blocks(README.read_text())
RUN_BLOCKS = [b for b in BLOCKS if b.lang in RUNNABLE]


def test_readme_parses_into_runnable_blocks() -> None:
    """Every block with a language is a shell or Python block (nothing escapes the run by its
    fence), and the parser finds the README's commands."""
    other = [(b.line, b.lang) for b in BLOCKS if b.lang and b.lang not in RUNNABLE]
    assert other == [], f"fenced blocks in a language this test does not run: {other}"
    assert {b.lang for b in RUN_BLOCKS} == set(RUNNABLE)
    assert any("fjord local up" in b.code for b in RUN_BLOCKS if b.not_run is None)
    stray = [n for n, line in enumerate(README.read_text().splitlines(), 1)
             if line.startswith("<!-- readme-test") and not NOT_RUN.search(line)]  # fmt: skip
    assert stray == [], f"README.md lines with a malformed readme-test marker: {stray}"


def test_blocks_not_run_are_marked_with_a_reason() -> None:
    """The list of blocks the README test does not run, each with its reason (printed with -s
    or -rA; the reasons stand in the README next to the blocks)."""
    not_run = [(b.line, b.section, b.not_run) for b in RUN_BLOCKS if b.not_run]
    for line, section, why in not_run:
        print(f"README.md:{line} ({section}) not run: {why}")
        assert len(why) > 20, f"README.md:{line}: say why the block is not run"
    # The commands a user runs first are never among them.
    assert all(section not in ("Using Fjord", "Use any Kafka client") for _, section, _ in not_run)


# --- running ------------------------------------------------------------------------------


class LineReader:
    """Lines of a child's output, read by a thread so every wait on them is bounded."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line)
        self.lines.put(None)

    def until(self, predicate: Any, timeout: float, what: str) -> str:
        """The first line (from now on) for which ``predicate`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(remaining, 0.01))
            except queue.Empty:
                if remaining <= 0:
                    raise AssertionError(
                        f"no {what} within {timeout} s; output so far:\n" + "".join(self.seen)
                    ) from None
                continue
            if line is None:
                raise AssertionError(f"output ended before {what}:\n" + "".join(self.seen))
            self.seen.append(line)
            if predicate(line):
                return line


PYTHON_DRIVER = r"""
import json, sys, traceback
namespace = {"__name__": "__readme__"}
for request in sys.stdin:
    code = json.loads(request)
    try:
        exec(compile(code, "<README block>", "exec"), namespace)
        status = 0
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        status = 1
    print(f"\n<<readme-block-done {status}>>", flush=True)
"""


class PythonSession:
    """One interpreter per README section: each block runs in the namespace of the ones
    before it, as a reader pasting them one after the other into a Python prompt."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-u", "-c", PYTHON_DRIVER], cwd=cwd, env=env, text=True,
            errors="replace",
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        assert self.process.stdout is not None
        self.output = LineReader(self.process.stdout)

    def run(self, code: str) -> tuple[int, str]:
        assert self.process.stdin is not None
        start = len(self.output.seen)
        self.process.stdin.write(json.dumps(code) + "\n")
        self.process.stdin.flush()
        done = self.output.until(
            lambda line: line.startswith("<<readme-block-done "), BLOCK_TIMEOUT_S, "end of block"
        )
        return int(done.split()[1].rstrip(">")), "".join(self.output.seen[start:-1])

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@dataclass
class Reader:
    """The reader's world: a directory per cluster, the environment, the running quickstart,
    and one Python session per section."""

    base: Path
    env: dict[str, str]
    cwd: Path
    quickstart: subprocess.Popen[str] | None = None
    quickstart_output: LineReader | None = None
    sessions: dict[str, PythonSession] = field(default_factory=dict)
    data_dirs: list[Path] = field(default_factory=list)

    def use_directory(self, name: str) -> None:
        self.cwd = self.base / name
        self.cwd.mkdir(exist_ok=True)
        self.env["FJORD_DATA_DIR"] = str(self.cwd / ".fjord")
        self.data_dirs.append(self.cwd / ".fjord")

    def fjord(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["fjord", *args], cwd=self.cwd, env=self.env, text=True, capture_output=True,
            timeout=timeout, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def addresses(self) -> tuple[str, str] | None:
        """(first broker address, first Kafka-listener address) of the running cluster here."""
        status = self.fjord("local", "status", "--output", "json")
        if status.returncode != 0:
            return None
        state = json.loads(status.stdout)
        if not any(p["alive"] for p in state["processes"] if p["role"] == "broker"):
            return None
        return (state["bootstrap_servers"].split(",")[0],
                state.get("kafka_bootstrap_servers", "").split(",")[0])  # fmt: skip

    def rewrite(self, code: str) -> str:
        code = re.sub(r"\bfjord (local up|quickstart)\b", r"fjord \1 --port 0", code)
        addresses = self.addresses()
        if addresses is not None:
            code = code.replace(KAFKA_BROKERS, addresses[1]).replace(FJORD_BROKERS, addresses[0])
        return code

    def run(self, block: Block) -> tuple[int, str]:
        code = self.rewrite(block.code)
        if block.lang == "python":
            session = self.sessions.get(block.section)
            if session is None:
                session = self.sessions[block.section] = PythonSession(self.env, self.cwd)
            return session.run(code)
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", code], cwd=self.cwd, env=self.env, text=True,
            errors="replace", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT_S,
        )  # fmt: skip
        return done.returncode, done.stdout


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reader]:
    env = {k: v for k, v in os.environ.items() if k != "FJORD_BOOTSTRAP_SERVERS"}
    # `fjord`, `python` as in an activated .venv; kcat and bash from the system.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    base = tmp_path_factory.mktemp("readme")
    state = Reader(base, env, base)
    try:
        yield state
    finally:
        for session in state.sessions.values():
            session.close()
        for data_dir in state.data_dirs:
            subprocess.run(["fjord", "local", "down", "--data-dir", str(data_dir)], env=env,
                           capture_output=True, timeout=120, check=False)  # fmt: skip
        if state.quickstart is not None and state.quickstart.poll() is None:
            state.quickstart.kill()
            state.quickstart.wait(30)


def start_quickstart(reader: Reader) -> None:
    """`make run` as the README describes it: `fjord quickstart` in the foreground of one
    terminal, its cluster up once the summary is out."""
    reader.use_directory("make-run")
    command = reader.rewrite("fjord quickstart --records 300").split()
    reader.quickstart = subprocess.Popen(
        command, cwd=reader.cwd, env=reader.env, text=True, errors="replace",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert reader.quickstart.stdout is not None
    reader.quickstart_output = out = LineReader(reader.quickstart.stdout)
    banner = out.until(lambda line: line.startswith("starting a local cluster"), START_TIMEOUT_S,
                       "start banner")  # fmt: skip
    # The README's Quick start and the banner agree on what starts.
    assert "(3 brokers, 2 controllers, 2 group coordinators, etcd)" in banner, banner
    quick_start = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "(etcd, 2 controllers,\n3 brokers, 2 group coordinators;" in quick_start
    out.until(lambda line: line.startswith("kafka bootstrap servers: 127.0.0.1:"),
              START_TIMEOUT_S, "kafka bootstrap servers line")  # fmt: skip
    out.until(lambda line: "verification OK" in line, START_TIMEOUT_S, "verification OK")
    out.until(lambda line: line.startswith("Press Ctrl-C"), START_TIMEOUT_S, "the wait prompt")


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[b.name for b in RUN_BLOCKS])
def test_readme_block(reader: Reader, block: Block) -> None:
    if block.not_run is not None:
        pytest.skip(f"README.md:{block.line} marked not run: {block.not_run}")
    if "kcat " in block.code and subprocess.run(["which", "kcat"], capture_output=True).returncode:
        pytest.skip("kcat is not installed (make kcat installs Debian's)")
    in_quickstart = block.section == QUICKSTART_SECTION
    if in_quickstart and reader.quickstart is None:
        start_quickstart(reader)
    elif not in_quickstart and reader.cwd.name != "own-cluster":
        reader.use_directory("own-cluster")  # the reader's own cluster, after `make run`
    status, output = reader.run(block)
    assert status == 0, f"README.md:{block.line} ({block.section}) failed:\n{output}"
    assert "Traceback" not in output, output
    if in_quickstart and "fjord local down" in block.code:
        # The demo's terminal notices and ends as the README says.
        assert reader.quickstart is not None and reader.quickstart_output is not None
        reader.quickstart_output.until(lambda line: line.strip() == "stopped.", 60, "stopped.")
        assert reader.quickstart.wait(60) == 0
