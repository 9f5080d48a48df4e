"""Small text files rewritten atomically: write a temporary file, rename it over the old one."""

from __future__ import annotations

import os
from pathlib import Path

TMP_SUFFIX = ".tmp"


def write_atomically(path: Path, text: str, *, sync: bool) -> None:
    """Replace ``path`` with ``text``. A reader sees the old or the new content, never a mix.

    With ``sync`` the new content and the rename are fsync'd before returning (so they survive a
    power loss); without it they reach the page cache only and :func:`sync_file` can follow later.
    """
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        data = text.encode()
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync:
        sync_directory(path.parent)


def write_new_file(path: Path, data: bytes) -> None:
    """Create (or truncate) ``path`` with ``data``, fsync'd before returning (the directory
    entry is not: the caller renames or syncs the directory when the name must last)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_file(path: Path) -> None:
    """fsync an existing file (and its directory entry); a missing file is not an error."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    sync_directory(path.parent)


def sync_directory(directory: Path) -> None:
    """fsync a directory so that file creations, renames and deletions in it are durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_text(path: Path) -> str | None:
    """The file's text, or None when it does not exist or is not valid UTF-8."""
    try:
        return path.read_bytes().decode()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        return None
