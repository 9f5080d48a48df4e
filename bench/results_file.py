"""Rewrite one section of bench/RESULTS.md, leaving the other components' sections alone.

A section starts at a line ``## <name>`` and runs to the next ``## `` heading or the end.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = (
    "# Benchmark results\n\nEach component appends its own section (command, machine, date, "
    "figures). Regenerate with `make bench`.\n\n"
)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (for the machine line of every section)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_section(heading: str, body: str, path: Path = RESULTS) -> None:
    """Replace (or append) the section whose first line is ``heading`` with ``body``."""
    section = f"{heading}\n\n{body.strip()}\n\n"
    text = path.read_text() if path.exists() else HEADER
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _m: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)
