"""Byte sizes as people write them: `300MB`, `2GiB`, `1.5 GB`, `1048576`."""

from __future__ import annotations

__all__ = ["parse_size"]

import re

from core.errors import BundleError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str, what: str = "size") -> int:
    """Bytes in `text`: decimal units (kB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB) of 1024."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise BundleError("usage", f"{what} {text!r} is not a size: write a number of bytes or one with a unit, like 300MB or 2GiB")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value < 1:
        raise BundleError("usage", f"{what} {text!r} must be at least 1 byte")
    return value
