"""Reading JSON we did not write ourselves (store files, registry bodies, key files) within bounds.

Every such read goes through here so that one rule holds everywhere: the bytes come from a regular file
(never a FIFO, device, socket or directory: those hang or never end), at most `max_bytes` of them, and the
parsed value nests at most `max_depth` deep. The standard json module is the parser (C speed); the bounds
are what it lacks.
"""

from __future__ import annotations

__all__ = ["MAX_JSON_BYTES", "loads", "read_json", "read_regular"]

import json
import os
import stat
from pathlib import Path
from typing import Any

from core.errors import BundleError

MAX_JSON_BYTES = 4 << 20  # manifests, configs, indexes, signatures: real ones are a few kB
# Real documents nest under 10 deep; the bound sits well under Python's recursion limit (1000) so code that
# walks a parsed value recursively (jsonschema, our own walkers) cannot be driven into a RecursionError.
MAX_DEPTH = 512


def read_regular(path: Path | str, max_bytes: int, what: str, code: str = "invalid-bundle") -> bytes:
    """The bytes of a regular file, refusing anything else and anything longer than max_bytes."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer would otherwise block before we can look at it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise BundleError(code, f"{what} {path} does not exist") from None
    except OSError as exc:
        raise BundleError(code, f"{what} {path} cannot be read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BundleError(code, f"{what} {path} is not a regular file")
        if st.st_size > max_bytes:
            raise BundleError(code, f"{what} {path} is {st.st_size} bytes, more than the {max_bytes} allowed")
        chunks, have = [], 0
        while have <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - have))
            if not chunk:
                break
            chunks.append(chunk)
            have += len(chunk)
        if have > max_bytes:
            raise BundleError(code, f"{what} {path} is more than the {max_bytes} bytes allowed")
        return b"".join(chunks)
    finally:
        os.close(fd)


def loads(data: bytes | str, what: str, code: str = "invalid-bundle", max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON bytes within the size and nesting bounds; any failure is a BundleError(code)."""
    if len(data) > max_bytes:
        raise BundleError(code, f"{what} is {len(data)} bytes, more than the {max_bytes} allowed")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: a nesting bomb deeper than the C parser allows
        raise BundleError(code, f"{what} is not JSON (or nested too deep)") from None
    if depth(value, max_depth) > max_depth:
        raise BundleError(code, f"{what} nests more than {max_depth} levels deep")
    return value


def read_json(path: Path | str, what: str, code: str = "invalid-bundle", max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """A JSON document from a regular file, bounded in size and nesting."""
    return loads(read_regular(path, max_bytes, what, code), f"{what} {path}", code, max_bytes, max_depth)


def depth(value: Any, limit: int) -> int:
    """How deep containers nest (iterative: no recursion to exhaust); stops counting past limit."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest
