"""Layer tars read back safely: each entry checked as it streams by, and extracted without ever writing
outside the destination or following a link.

Parsed by hand rather than with tarfile: tarfile applies PAX global headers (Go ignores them), accepts GNU
sparse and old-style entries and hides the raw type flags, so its view of a hostile archive could differ
from kit's; here anything either reader could see differently is refused.
"""

from __future__ import annotations

__all__ = ["TarMember", "extract_layer", "iter_layer"]

import hashlib
import io
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Mapping

from core.errors import BundleError
from bundler.format.tarformat import (
    BLOCK, CHUNK, MAX_SPECIAL, TYPE_DIR, TYPE_GNU_LONGNAME, TYPE_PAX, TYPE_REG, ZERO_BLOCK,
    NAME_FIELD, MODE_FIELD, SIZE_FIELD, CHKSUM_FIELD, TYPEFLAG_AT, MAGIC_FIELD, PREFIX_FIELD, MAGIC_USTAR, MAGIC_GNU,
    FileRecord, normalise_layer_path,
)


@dataclass(frozen=True)
class TarMember:
    """One entry of a layer, as read back."""

    name: str  # normalised (no trailing slash)
    kind: str  # "file" or "dir"
    size: int
    mode: int
    offset_data: int  # where the content starts in the layer stream


# --------------------------------------------------------------------------------------------------
# Reading a layer

_TYPE_WORDS = {
    b"1": "is a hardlink",
    b"2": "is a symlink",
    b"3": "is a character device",
    b"4": "is a block device",
    b"6": "is a fifo",
    b"7": "is a contiguous file (type '7')",
    b"g": "is a PAX global header",
    b"K": "is a GNU long link name",
    b"S": "is a GNU sparse file",
}


class _Stream:
    """Reads exact byte counts from the layer, counting the offset; a short read means a truncated archive."""

    def __init__(self, raw: BinaryIO, layer: str) -> None:
        self.raw, self.layer, self.pos = raw, layer, 0

    def read(self, n: int) -> bytes:
        parts, want = [], n
        while want:
            data = self.raw.read(want)
            if not data:
                raise BundleError("integrity", f"{self.layer}: archive truncated at byte {self.pos + n - want}")
            parts.append(data)
            want -= len(data)
        self.pos += n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def skip(self, n: int) -> None:
        """Pass over n bytes: a seek on a plain file (weights left in place are never read), else read
        through (a hashing reader must see every byte)."""
        seekable = getattr(self.raw, "seekable", None)
        if n and seekable is not None and seekable():
            self.raw.seek(n, io.SEEK_CUR)  # past the end is found by the next read: "archive truncated"
            self.pos += n
            return
        while n:
            step = min(n, CHUNK)
            self.read(step)
            n -= step


class _ContentReader(io.RawIOBase):
    """The content of the current member; valid until the iterator advances."""

    def __init__(self, stream: _Stream, size: int) -> None:
        self._stream, self.remaining = stream, size

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        n = self.remaining if size is None or size < 0 else min(size, self.remaining)
        data = self._stream.read(n) if n else b""
        self.remaining -= n
        return data

    def readinto(self, buf: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(buf), self.remaining)
        memoryview(buf)[:n] = self.read(n)
        return n


def _parse_number(field: bytes, what: str, layer: str) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256, for sizes over 8 GiB
        if field[0] != 0x80:
            raise BundleError("integrity", f"{layer}: negative {what} in a tar header")
        return int.from_bytes(field[1:], "big")
    text = field.strip(b" \x00").split(b"\x00", 1)[0]
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise BundleError("integrity", f"{layer}: tar header {what} field is not a number") from None


def _checksum_ok(blk: bytes, layer: str) -> bool:
    stored = _parse_number(blk[CHKSUM_FIELD[0] : CHKSUM_FIELD[0] + CHKSUM_FIELD[1]], "checksum", layer)
    summed = blk[: CHKSUM_FIELD[0]] + b"        " + blk[CHKSUM_FIELD[0] + CHKSUM_FIELD[1] :]
    unsigned = sum(summed)
    signed = unsigned - 256 * sum(1 for c in summed if c >= 0x80)  # some old writers summed signed bytes
    return stored in (unsigned, signed)


def _field(blk: bytes, f: tuple[int, int]) -> bytes:
    raw = blk[f[0] : f[0] + f[1]]
    return raw.split(b"\x00", 1)[0]


def _parse_pax(data: bytes, layer: str) -> dict[bytes, bytes]:
    records: dict[bytes, bytes] = {}
    while data:
        length, sep, _ = data.partition(b" ")
        if not sep or not length.isdigit() or not 5 <= int(length) <= len(data) or data[int(length) - 1] != 0x0A:
            raise BundleError("integrity", f"{layer}: malformed PAX record")
        record, data = data[len(length) + 1 : int(length) - 1], data[int(length) :]
        key, eq, value = record.partition(b"=")
        if not eq or not key:
            raise BundleError("integrity", f"{layer}: malformed PAX record")
        records[key] = value
    return records


def _check_name(raw: bytes, kind: str, layer: str, layer_parts: list[str], seen: dict[str, str]) -> str:
    shown = raw.decode("utf-8", "replace")

    def refuse(why: str) -> BundleError:
        return BundleError("unsafe-archive", f"{layer}: entry '{shown}' {why}")

    if b"\x00" in raw:
        raise refuse("has a NUL byte in its name")
    if raw.endswith(b"/"):
        if kind != "dir":
            raise refuse("is a file whose name ends with '/'")
        raw = raw.rstrip(b"/")
    if raw.startswith(b"/") or not raw:
        raise refuse("has an absolute or empty path")
    name = raw.decode("utf-8", "surrogateescape")
    parts = name.split("/")
    if ".." in parts:
        raise refuse("has a '..' component")
    if "" in parts or "." in parts:
        raise refuse("is not a normalised path ('.' or empty component)")
    # Only the layer's own tree and the directories above it may appear.
    n = len(layer_parts)
    if layer_parts and parts[:n] != layer_parts:
        if not (len(parts) < n and parts == layer_parts[: len(parts)] and kind == "dir"):
            raise refuse(f"is outside the layer path '{'/'.join(layer_parts)}'")
    if name in seen:
        raise refuse("appears twice")
    for i in range(1, len(parts)):
        if seen.get("/".join(parts[:i])) == "file":
            raise refuse(f"lies below the file '{'/'.join(parts[:i])}'")
    return name


def _header(s: _Stream, blk: bytes, layer: str) -> tuple[bytes, bytes, int, int]:
    """The checked fixed fields of the header block just read: its magic, type flag, size and offset."""
    header_at = s.pos - BLOCK
    if not _checksum_ok(blk, layer):
        raise BundleError("integrity", f"{layer}: bad tar header checksum at byte {header_at}")
    magic = blk[MAGIC_FIELD[0] : MAGIC_FIELD[0] + 8]
    if magic[:6] != MAGIC_USTAR and magic != MAGIC_GNU:
        raise BundleError("integrity", f"{layer}: not a USTAR, PAX or GNU tar header at byte {header_at}")
    typeflag = blk[TYPEFLAG_AT : TYPEFLAG_AT + 1]
    size = _parse_number(blk[SIZE_FIELD[0] : SIZE_FIELD[0] + SIZE_FIELD[1]], "size", layer)
    return magic, typeflag, size, header_at


def _check_end(s: _Stream, layer: str, pending: bool) -> None:
    """After a zero block: a second one, and no extended header (`pending`) left without its entry."""
    if s.read(BLOCK) != ZERO_BLOCK:
        raise BundleError("integrity", f"{layer}: data after a zero block at byte {s.pos - 2 * BLOCK}")
    if pending:
        raise BundleError("integrity", f"{layer}: archive ends after an extended header")


def _read_extended(s: _Stream, typeflag: bytes, size: int, header_at: int, layer: str, pax: dict[bytes, bytes] | None,
                   long_name: bytes | None) -> tuple[dict[bytes, bytes] | None, bytes | None]:
    """A PAX or GNU long-name record, bounded and at most one of each per entry: (pax, long_name) with it read."""
    if size > MAX_SPECIAL:
        raise BundleError("unsafe-archive", f"{layer}: extended header of {size} bytes at byte {header_at}")
    if (pax if typeflag == TYPE_PAX else long_name) is not None:
        raise BundleError("unsafe-archive", f"{layer}: two extended headers for one entry at byte {header_at}")
    data = s.read(size)
    s.skip(-size % BLOCK)
    if typeflag == TYPE_PAX:
        return _parse_pax(data, layer), long_name
    return pax, data.split(b"\x00", 1)[0]


def _entry_fields(blk: bytes, magic: bytes, typeflag: bytes, size: int, header_at: int, records: dict[bytes, bytes],
                  long_name: bytes | None, layer: str) -> tuple[bytes, bytes, int]:
    """The entry's raw name, type flag and size once the USTAR prefix, the GNU long name and the PAX records
    apply (a PAX record wins; any GNU sparse record makes it a sparse file)."""
    raw_name = _field(blk, NAME_FIELD)
    if magic[:6] == MAGIC_USTAR and _field(blk, PREFIX_FIELD):
        raw_name = _field(blk, PREFIX_FIELD) + b"/" + raw_name
    if long_name is not None:
        raw_name = long_name
    raw_name = records.get(b"path", raw_name)
    if b"size" in records:
        if not records[b"size"].isdigit():
            raise BundleError("integrity", f"{layer}: bad PAX size record at byte {header_at}")
        size = int(records[b"size"])
    if any(k.startswith(b"GNU.sparse.") for k in records):
        typeflag = b"S"
    return raw_name, typeflag, size


def _entry_kind(typeflag: bytes, raw_name: bytes, layer: str) -> str:
    """The entry's kind, "file" or "dir": any other type (links, devices, fifos, sparse files, ...) is refused."""
    kind = "file" if typeflag in (TYPE_REG, b"\x00") else "dir" if typeflag == TYPE_DIR else ""
    if not kind:
        why = _TYPE_WORDS.get(typeflag, f"has unsupported type {typeflag!r}")
        raise BundleError("unsafe-archive", f"{layer}: entry '{raw_name.decode('utf-8', 'replace')}' {why}")
    return kind


def iter_layer(stream: BinaryIO, layer_path: str) -> Iterator[tuple[TarMember, BinaryIO | None]]:
    """Read a layer tar safely, yielding members in order with a reader for file content (None for
    directories; read it before advancing).

    Refused as unsafe-archive: absolute names, '..' (or '.', empty) components, symlinks, hardlinks,
    devices, fifos, any type other than regular file and directory, duplicate names, names outside
    `layer_path` and its parent directories. PAX and GNU long-name records are parsed, not yielded.
    A truncated or corrupt archive (bad checksum, missing end blocks) is an integrity error.
    """
    layer = layer_path
    rel = normalise_layer_path(layer_path)
    layer_parts = [] if rel == "." else rel.split("/")
    s = _Stream(stream, layer)
    seen: dict[str, str] = {}
    pax: dict[bytes, bytes] | None = None
    long_name: bytes | None = None
    while True:
        blk = s.read(BLOCK)
        if blk == ZERO_BLOCK:
            _check_end(s, layer, pax is not None or long_name is not None)
            return
        magic, typeflag, size, header_at = _header(s, blk, layer)
        if typeflag in (TYPE_PAX, TYPE_GNU_LONGNAME):
            pax, long_name = _read_extended(s, typeflag, size, header_at, layer, pax, long_name)
            continue
        records, pax = pax or {}, None
        raw_name, typeflag, size = _entry_fields(blk, magic, typeflag, size, header_at, records, long_name, layer)
        long_name = None
        kind = _entry_kind(typeflag, raw_name, layer)
        name = _check_name(raw_name, kind, layer, layer_parts, seen)
        if kind == "dir" and size:
            raise BundleError("unsafe-archive", f"{layer}: entry '{name}' is a directory with {size} bytes of data")
        seen[name] = kind
        mode = _parse_number(blk[MODE_FIELD[0] : MODE_FIELD[0] + MODE_FIELD[1]], "mode", layer) & 0o7777
        member = TarMember(name, kind, size, mode, s.pos)
        if kind == "dir":
            yield member, None
            continue
        reader = _ContentReader(s, size)
        yield member, reader  # type: ignore[misc]
        s.skip(reader.remaining)
        reader.remaining = 0  # a reader kept past its member reads nothing
        s.skip(-size % BLOCK)


# --------------------------------------------------------------------------------------------------
# Extracting a layer

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dir(parent_fd: int, name: str, shown: str, layer: str) -> int:
    """Open (creating if needed) a directory below parent_fd without ever following a symlink."""
    try:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
        created = True
    except FileExistsError:
        created = False
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        st = os.lstat(name, dir_fd=parent_fd)
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise BundleError("unsafe-archive", f"{layer}: '{shown}' is {what} in the destination; refusing to follow or replace it") from None
    if created:
        os.fchmod(fd, 0o755)  # exact mode, whatever the umask
    return fd


def _extract_file(parent_fd: int, base: str, member: TarMember, content: BinaryIO, layer: str, want: str | None) -> FileRecord:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(base, flags, 0o600, dir_fd=parent_fd)  # O_EXCL: never through an existing link or file
    except FileExistsError:
        if stat.S_ISLNK(os.lstat(base, dir_fd=parent_fd).st_mode):
            raise BundleError("unsafe-archive", f"{layer}: '{member.name}' is a symlink in the destination; refusing to follow it") from None
        raise BundleError("usage", f"{layer}: '{member.name}' already exists in the destination; unpack into an empty directory") from None
    mode = 0o755 if member.mode & 0o111 else 0o644
    digest = hashlib.sha256()
    buf = memoryview(bytearray(min(CHUNK, max(member.size, 1))))
    try:
        with open(fd, "wb", buffering=0, closefd=True) as f:
            while n := content.readinto(buf):  # type: ignore[attr-defined]
                digest.update(buf[:n])
                view = buf[:n]
                while view:
                    view = view[f.write(view) :]
            os.fchmod(fd, mode)  # exact mode, whatever the umask
        if want is not None and digest.hexdigest() != want:
            raise BundleError("tampered", f"{layer}: '{member.name}' has sha256 {digest.hexdigest()[:12]}…, the signature says {want[:12]}…")
    except BaseException:
        os.unlink(base, dir_fd=parent_fd)  # no partial or tampered file is left behind
        raise
    return FileRecord(member.name, digest.hexdigest(), member.size, mode)


def extract_layer(
    stream: BinaryIO, layer_path: str, dest: Path, expected: Mapping[str, str] | None = None,
    in_place: Callable[[TarMember], bool] | None = None,
    members: Iterator[tuple[TarMember, BinaryIO | None]] | None = None,
) -> list[FileRecord]:
    """Safely extract a layer into `dest` (which must exist); returns the files written, in archive order.

    Every entry passes iter_layer's checks; each path component is opened relative to its parent with
    O_NOFOLLOW and files are created with O_EXCL, so nothing is written outside `dest` and no existing
    symlink is followed. Modes are 0644/0755. With `expected` (path -> sha256 hex), a file whose hash
    differs is removed and refused (tampered), and a file it does not list is refused before it is
    written (extra-file); files listed but absent are the caller's to check, across all layers.
    `in_place`: called with each regular file (once it passed those checks); True leaves it unwritten, its
    bytes where they are in the layer (`member.offset_data`, `member.size`), unread on a seekable stream;
    checking them is then the caller's job. `members`: the entries to write instead of the tar's (a ModelPack
    raw layer is one file, bundler.format.modelpack.layer_members), each written with the same care.
    """
    dest = Path(dest)
    if not dest.is_dir():
        raise BundleError("usage", f"destination {dest} is not an existing directory")
    root_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    records: list[FileRecord] = []
    try:
        for member, content in members if members is not None else iter_layer(stream, layer_path):
            want = None
            if expected is not None and member.kind == "file":
                want = expected.get(member.name)
                if want is None:
                    raise BundleError("extra-file", f"{layer_path}: '{member.name}' is not listed in the signature")
            if member.kind == "file" and in_place is not None and in_place(member):
                continue
            parts = member.name.split("/")
            dirs = parts if member.kind == "dir" else parts[:-1]
            fd = root_fd
            try:
                for i, part in enumerate(dirs):
                    next_fd = _open_dir(fd, part, "/".join(parts[: i + 1]), layer_path)
                    if fd != root_fd:
                        os.close(fd)
                    fd = next_fd
                if member.kind == "file":
                    assert content is not None
                    records.append(_extract_file(fd, parts[-1], member, content, layer_path, want))
            finally:
                if fd != root_fd:
                    os.close(fd)
    finally:
        os.close(root_fd)
    return records
