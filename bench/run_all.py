"""Run every bench/bench_*.py script in turn (``make bench``), each in its own process.

Scripts that accept ``--write-results`` get it, so their section of bench/RESULTS.md is
refreshed; the others just print. A failing script is reported and the rest still run; the exit
status is non-zero when any failed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent


def main() -> int:
    scripts = sorted(BENCH_DIR.glob("bench_*.py"))
    failed: list[str] = []
    for script in scripts:
        argv = [sys.executable, str(script)]
        if "--write-results" in script.read_text():
            argv.append("--write-results")
        print(f"=== {script.name} ({' '.join(argv[2:]) or 'no options'})", flush=True)
        start = time.monotonic()
        status = subprocess.run(argv, cwd=BENCH_DIR.parent).returncode
        print(
            f"=== {script.name}: exit {status} after {time.monotonic() - start:.0f} s", flush=True
        )
        if status != 0:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"results: {BENCH_DIR / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
