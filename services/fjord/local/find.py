"""Where the local cluster of the current directory lives, found the way git finds its
repository.

Order: ``FJORD_DATA_DIR`` when set (any path; it need not exist yet), else the nearest
``.fjord/cluster.json`` in the current directory or one of its parents, else none. Every
``fjord local`` command and every client command (for its default bootstrap servers) resolves
the data directory this way, so they all agree on which cluster "the local cluster" is.
"""

from __future__ import annotations

import os
from pathlib import Path

from fjord.local.defaults import DATA_DIR_ENV_VAR, DEFAULT_DATA_DIR, STATE_FILE


def data_dir_from_environment() -> Path | None:
    """``FJORD_DATA_DIR`` when set and not empty."""
    value = os.environ.get(DATA_DIR_ENV_VAR, "").strip()
    return Path(value) if value else None


def find_data_dir(start: Path | None = None) -> Path | None:
    """``FJORD_DATA_DIR``, else the nearest ``<dir>/.fjord`` holding a state file from
    ``start`` (default: the current directory) up to the file system's root, else None."""
    from_env = data_dir_from_environment()
    if from_env is not None:
        return from_env
    here = (start or Path.cwd()).absolute()
    for directory in (here, *here.parents):
        candidate = directory / DEFAULT_DATA_DIR
        if (candidate / STATE_FILE).is_file():
            return candidate
    return None


def resolve_data_dir(option: Path | None, start: Path | None = None) -> Path:
    """The data directory a ``fjord local`` command works on: ``--data-dir`` when given, else
    :func:`find_data_dir`, else ``.fjord`` in the current directory (where ``up`` creates one)."""
    if option is not None:
        return option
    return find_data_dir(start) or (start or Path.cwd()) / DEFAULT_DATA_DIR
