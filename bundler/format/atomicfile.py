"""Small files written whole or not at all: the store's index and state, keys, the registry credentials."""

from __future__ import annotations

__all__ = ["write_atomically"]

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes, mode: int, *, replace: bool = True) -> None:
    """Write `data` to `path` with `mode`, so that a reader (or a crash) sees the old file or the new one,
    never part of it.

    The bytes go to a temp file in the same directory (its mode set before the first byte, whatever the
    umask), are fsynced, and the file is put in place: by os.replace, or with `replace=False` by os.link,
    which never replaces an existing name (FileExistsError then). The directory is fsynced last, so the new
    name survives a crash too. The temp file never outlives the call.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
            os.unlink(tmp)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
