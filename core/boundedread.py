"""Files from outside the bundle (prompt files, cost tables, cgroup limits) read within bounds.

One rule for every such read: the bytes come from a regular file (a FIFO would block, /dev/zero never ends, a
directory or socket is no text), opened without blocking, at most `max_bytes` of them. The caller decides what
a refusal means: a usage error for a file the user named, "no table" or "no limit" for what we only consult.
(bundler/format/boundedjson.py holds the same rule for JSON the bundler reads; runner/ cannot import it.)
"""

from __future__ import annotations

__all__ = ["NotReadable", "read_bounded"]

import os
import stat
from pathlib import Path


class NotReadable(Exception):
    """Why a file was not read: missing, unreadable, not a regular file, or longer than allowed."""


def read_bounded(path: Path | str, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path` (links followed), at most max_bytes; NotReadable otherwise."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer would otherwise block before fstat can look at it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise NotReadable("does not exist") from None
    except OSError as exc:
        raise NotReadable(f"cannot be read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotReadable("is not a regular file")
        if st.st_size > max_bytes:
            raise NotReadable(f"is {st.st_size} bytes, more than the {max_bytes} allowed")
        chunks, have = [], 0
        while have <= max_bytes:  # the size can grow after fstat (or lie, as /proc's and /sys's do): count as we go
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - have))
            if not chunk:
                break
            chunks.append(chunk)
            have += len(chunk)
        if have > max_bytes:
            raise NotReadable(f"is more than the {max_bytes} bytes allowed")
        return b"".join(chunks)
    except OSError as exc:  # EISDIR on some systems, EIO
        raise NotReadable(f"cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
