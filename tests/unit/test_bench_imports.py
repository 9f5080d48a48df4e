"""Every benchmark under bench/ still imports: they run only when someone measures, so a moved or
renamed helper would otherwise break them unnoticed (it did once). Importing runs no benchmark:
each script does its work under ``if __name__ == "__main__"``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_every_bench_script_imports() -> None:
    modules = sorted(p.stem for p in BENCH.glob("*.py"))
    assert "bench_e2e" in modules
    # One fresh interpreter with bench/ first on the path, as `python bench/<script>.py` has it.
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    done = subprocess.run(
        [sys.executable, "-c", code, *modules],
        cwd=BENCH,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
