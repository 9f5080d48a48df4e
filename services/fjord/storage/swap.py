"""The file names of a log clean's swap and the recovery of an interrupted one (the scheme is
in :mod:`fjord.storage.cleaner`'s docstring). Apart so that the log's open can call it without
importing the cleaner."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from fjord.storage import defaults
from fjord.storage.checkpoint import read_text, sync_directory, write_atomically

CLEANED_SUFFIX = defaults.LOG_SUFFIX + ".cleaned"
SWAP_SUFFIX = defaults.LOG_SUFFIX + ".swap"


def recover_interrupted_clean(directory: Path) -> str | None:
    """Finish or discard a clean a crash interrupted (see the module docstring). Returns
    ``"discarded"``, ``"finished"`` or None when there was nothing to do."""
    cleaned = sorted(directory.glob("*" + CLEANED_SUFFIX))
    swaps = sorted(directory.glob("*" + SWAP_SUFFIX))
    if cleaned:
        for path in cleaned + swaps:
            path.unlink()
        sync_directory(directory)
        return "discarded"
    if not swaps:
        return None
    for swap in swaps:
        base = swap.name[: -len(SWAP_SUFFIX)]
        for suffix in (defaults.INDEX_SUFFIX, defaults.TIME_INDEX_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                (directory / (base + suffix)).unlink()
        os.replace(swap, directory / (base + defaults.LOG_SUFFIX))
    sync_directory(directory)
    return "finished"


CLEANER_CHECKPOINT = "cleaner-checkpoint"
_CHECKPOINT_VERSION = 0


@dataclass(frozen=True, slots=True)
class CleanerCheckpoint:
    """``cleaner-checkpoint`` in a partition directory: ``0\\nfirst-dirty N\\ngaps-below M\\n``.

    ``first_dirty``: offsets below it are clean (compacted). ``gaps_below``: segments whose base
    offset is below it may have offset gaps (the cleaner rewrote them, or a follower copied
    compacted batches); it is written before any such segment reaches its ``.log`` name, so
    recovery never takes a gap there for damage. Missing or unreadable: both 0 (a clean from
    the start is correct, only slower; and no segment had a gap yet)."""

    first_dirty: int = 0
    gaps_below: int = 0


def read_cleaner_checkpoint(directory: Path) -> CleanerCheckpoint:
    text = read_text(directory / CLEANER_CHECKPOINT)
    if not text:
        return CleanerCheckpoint()
    try:
        lines = text.split("\n")
        if int(lines[0]) != _CHECKPOINT_VERSION:
            raise ValueError(lines[0])
        values = dict(line.split() for line in lines[1:] if line)
        return CleanerCheckpoint(int(values["first-dirty"]), int(values["gaps-below"]))
    except (ValueError, KeyError):
        return CleanerCheckpoint()


def write_cleaner_checkpoint(directory: Path, checkpoint: CleanerCheckpoint) -> None:
    """Replace the checkpoint atomically and durably."""
    write_atomically(
        directory / CLEANER_CHECKPOINT,
        f"{_CHECKPOINT_VERSION}\nfirst-dirty {checkpoint.first_dirty}\n"
        f"gaps-below {checkpoint.gaps_below}\n",
        sync=True,
    )
