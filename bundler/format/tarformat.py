"""The tar format as layers use it, shared by the writer (tarwrite.py) and the reader (tarread.py): the block
size, type flags and USTAR header layout, the record of one file, and a Kitfile layer path normalised."""

from __future__ import annotations

__all__ = [
    "BLOCK", "CHKSUM_FIELD", "CHUNK", "DEVMAJOR_FIELD", "DEVMINOR_FIELD", "END_OF_ARCHIVE", "FileRecord",
    "GID_FIELD", "GNAME_FIELD", "LINKNAME_FIELD", "MAGIC_FIELD", "MAGIC_GNU", "MAGIC_USTAR", "MAX_SPECIAL",
    "MODE_FIELD", "MTIME_FIELD", "NAME_FIELD", "PREFIX_FIELD", "SIZE_FIELD", "TYPEFLAG_AT", "TYPE_DIR",
    "TYPE_GNU_LONGNAME", "TYPE_PAX", "TYPE_REG", "UID_FIELD", "UNAME_FIELD", "VERSION_FIELD", "VERSION_USTAR",
    "ZERO_BLOCK", "normalise_layer_path",
]

import posixpath
from dataclasses import dataclass

from core.errors import BundleError

BLOCK = 512
CHUNK = 1 << 20  # bytes per read when streaming file content: memory stays flat whatever the file size
ZERO_BLOCK = bytes(BLOCK)
END_OF_ARCHIVE = bytes(2 * BLOCK)  # Go ends with two zero blocks and no record padding

TYPE_REG = b"0"
TYPE_DIR = b"5"
TYPE_PAX = b"x"
TYPE_GNU_LONGNAME = b"L"

# (offset, width) of each field of a USTAR header block; the type flag is one byte.
NAME_FIELD = (0, 100)
MODE_FIELD = (100, 8)
UID_FIELD = (108, 8)
GID_FIELD = (116, 8)
SIZE_FIELD = (124, 12)
MTIME_FIELD = (136, 12)
CHKSUM_FIELD = (148, 8)
TYPEFLAG_AT = 156
LINKNAME_FIELD = (157, 100)
MAGIC_FIELD = (257, 6)
VERSION_FIELD = (263, 2)
UNAME_FIELD = (265, 32)
GNAME_FIELD = (297, 32)
DEVMAJOR_FIELD = (329, 8)
DEVMINOR_FIELD = (337, 8)
PREFIX_FIELD = (345, 155)
MAGIC_USTAR, VERSION_USTAR = b"ustar\x00", b"00"
MAGIC_GNU = b"ustar  \x00"  # magic and version together, as GNU tar writes them
MAX_SPECIAL = 1 << 20  # Go refuses PAX/long-name records larger than this; so do we


@dataclass(frozen=True)
class FileRecord:
    """One regular file of a layer."""

    path: str  # posix path relative to the context dir, e.g. "target/model.safetensors"
    sha256: str  # hex digest of the file content
    size: int
    mode: int  # normalised mode written to the header


def normalise_layer_path(path: str, what: str = "layer path") -> str:
    """'target/', './target' -> 'target'; the whole context is '.'."""
    p = path.strip()
    if not p:
        raise BundleError("invalid-kitfile", f"empty {what}")
    if p.startswith("/"):
        raise BundleError("invalid-kitfile", f"{what} '{path}' is absolute; paths are relative to the context")
    norm = posixpath.normpath(p)
    if norm == ".." or norm.startswith("../"):
        raise BundleError("invalid-kitfile", f"{what} '{path}' points outside the context")
    return norm

