"""A byte range of a segment file, handed out instead of the bytes (zero copy).

The Kafka listener sends a Fetch answer's records from the segment file with ``sendfile``
(asyncio ``loop.sendfile``) instead of reading them into Python first.
"""

from __future__ import annotations

import contextlib
import os


class FileRegion:
    """``count`` bytes at ``offset`` of the file open as ``fd``, a descriptor this object owns:
    whole record batches, ending before log offset ``end_offset``.

    Invariants: ``fd`` is a duplicate taken while the log's lock was held, so the bytes stay
    readable even when the segment is deleted meanwhile (the inode lives until the close); it
    is closed exactly once (:meth:`close`, or when the object is collected). A truncation of
    the segment after the region was taken can shorten what ``sendfile`` finds: the sender
    checks the count it sent (and closes the connection when it falls short: the frame's
    size was announced already).
    """

    __slots__ = ("count", "end_offset", "fd", "offset")

    def __init__(self, fd: int, offset: int, count: int, end_offset: int = -1) -> None:
        self.fd = fd
        self.offset = offset
        self.count = count
        #: The log offset after the last batch in the region (-1: not known).
        self.end_offset = end_offset

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def read(self) -> bytes:
        """The bytes themselves (when they must be copied after all); short when the file
        was truncated meanwhile."""
        return os.pread(self.fd, self.count, self.offset)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FileRegion(fd={self.fd}, offset={self.offset}, count={self.count})"
