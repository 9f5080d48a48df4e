"""Check, before Spark starts its JVM, that a Java runtime Spark 4 can use is installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from fjord_spark.defaults import MIN_JAVA_VERSION
from fjord_spark.errors import JavaNotFoundError

INSTALL_HINT = (
    "install Java 17 or newer (e.g. `apt-get install -y openjdk-17-jre-headless`) "
    "or set JAVA_HOME to one"
)

# `java -version` prints e.g. `openjdk version "17.0.15" 2025-04-15` or `java version "1.8.0_392"`.
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?[^"]*"')


def parse_java_major_version(version_output: str) -> int | None:
    """The major release in ``java -version`` output (8 for "1.8.0_392"); None if absent."""
    match = _VERSION.search(version_output)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:  # the old "1.x" numbering
        major = int(match.group(2))
    return major


def java_executable() -> str | None:
    """The java Spark will run: ``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else PATH's."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        return candidate if os.access(candidate, os.X_OK) else None
    return shutil.which("java")


def check_java(minimum: int = MIN_JAVA_VERSION) -> int:
    """The installed Java's major version; :class:`JavaNotFoundError` when it is missing or
    older than ``minimum``."""
    java = java_executable()
    if java is None:
        where = "JAVA_HOME/bin/java" if os.environ.get("JAVA_HOME") else "java on PATH"
        raise JavaNotFoundError(
            f"Spark needs Java {minimum}+, but found no {where}: {INSTALL_HINT}"
        )
    try:
        done = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaNotFoundError(f"could not run {java} -version ({exc}): {INSTALL_HINT}") from exc
    major = parse_java_major_version(done.stderr + done.stdout)
    if major is None:
        raise JavaNotFoundError(f"could not read the version of {java}: {INSTALL_HINT}")
    if major < minimum:
        raise JavaNotFoundError(
            f"Spark needs Java {minimum}+, but {java} is Java {major}: {INSTALL_HINT}"
        )
    return major
