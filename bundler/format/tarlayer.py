"""Layer tars written byte for byte the way `kit pack` writes them, and read back safely.

`kit pack` writes each layer with Go's archive/tar. We write our own encoder rather than use Python's
tarfile: tarfile pads archives to 10240-byte records, names its PAX headers "././@PaxHeader", splits long
USTAR names at a different '/' and fills fields differently, so its digests would differ from kit's.
The rules below follow Go's writer.go/strconv.go/common.go (Writer.WriteHeader with Format unset:
USTAR when the header fits, PAX otherwise) and kit's pkg/lib/filesystem/tar.go (walk order, zeroed
times, uid 1000, gid 0, no user or group names). Modes are normalised to 0644/0755 (CONTRACT.md 2).
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import posixpath
import stat
from dataclasses import dataclass
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Mapping, Sequence

from core.errors import BundleError

BLOCK = 512
CHUNK = 1 << 20  # bytes per read when streaming file content: memory stays flat whatever the file size
PARALLEL_MIN = 256 << 10  # chunks at least this big are hashed for the file on another thread


@functools.cache
def _hasher() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="file-hash")


# A forked child inherits the executor but not its thread: a task submitted there would wait forever (seen in
# the suite: a fuzz campaign forks its workers after an in-process pack). The child makes its own.
os.register_at_fork(after_in_child=_hasher.cache_clear)
ZERO_BLOCK = bytes(BLOCK)
END_OF_ARCHIVE = bytes(2 * BLOCK)  # Go ends with two zero blocks and no record padding

TYPE_REG = b"0"
TYPE_DIR = b"5"
TYPE_PAX = b"x"
TYPE_GNU_LONGNAME = b"L"

# kit's ignore list always holds these (matched at the context root, like .dockerignore patterns).
KITFILE_NAMES = frozenset({"Kitfile", "kitfile", ".kitfile", ".kitignore"})

# Field offsets and widths of a USTAR header block.
_NAME, _MODE, _UID, _GID, _SIZE, _MTIME = (0, 100), (100, 8), (108, 8), (116, 8), (124, 12), (136, 12)
_CHKSUM, _TYPE, _LINKNAME, _MAGIC, _VERSION = (148, 8), 156, (157, 100), (257, 6), (263, 2)
_UNAME, _GNAME, _DEVMAJOR, _DEVMINOR, _PREFIX = (265, 32), (297, 32), (329, 8), (337, 8), (345, 155)
_MAGIC_USTAR, _VERSION_USTAR = b"ustar\x00", b"00"
_MAGIC_GNU = b"ustar  \x00"  # magic and version together, as GNU tar writes them
_MAX_SPECIAL = 1 << 20  # Go refuses PAX/long-name records larger than this; so do we


@dataclass(frozen=True)
class FileRecord:
    """One regular file of a layer."""

    path: str  # posix path relative to the context dir, e.g. "target/model.safetensors"
    sha256: str  # hex digest of the file content
    size: int
    mode: int  # normalised mode written to the header


@dataclass(frozen=True)
class LayerResult:
    """What writing one layer produced."""

    digest: str  # "sha256:<hex>" of the tar bytes (uncompressed, so also the diffID)
    size: int  # bytes of the tar
    files: list[FileRecord]  # regular files only, in archive order


@dataclass(frozen=True)
class TarMember:
    """One entry of a layer, as read back."""

    name: str  # normalised (no trailing slash)
    kind: str  # "file" or "dir"
    size: int
    mode: int
    offset_data: int  # where the content starts in the layer stream


# --------------------------------------------------------------------------------------------------
# Header encoding (Go archive/tar)


def _b(s: str) -> bytes:
    # Names from the file system may hold undecodable bytes (surrogate-escaped); Go writes the raw bytes.
    return s.encode("utf-8", "surrogateescape")


def _is_ascii(s: bytes) -> bool:
    return all(0 < c < 0x80 for c in s)


def _to_ascii(s: bytes) -> bytes:
    # Go drops every non-ASCII rune and NUL; on UTF-8 bytes that is dropping every byte >= 0x80.
    return bytes(c for c in s if 0 < c < 0x80)


def _fits_octal(width: int, x: int) -> bool:
    return x >= 0 and (width >= 22 or x < 1 << ((width - 1) * 3))


def _put_string(blk: bytearray, field: tuple[int, int], s: bytes) -> None:
    """Go's formatString: copy, NUL-terminate if room, never leave a '/' as the last byte of a cut name."""
    off, width = field
    blk[off : off + min(len(s), width)] = s[:width]
    if len(s) < width:
        blk[off + len(s)] = 0
    if len(s) > width and blk[off + width - 1] == ord("/"):
        blk[off + len(s[:width].rstrip(b"/"))] = 0


def _put_octal(blk: bytearray, field: tuple[int, int], x: int) -> None:
    """Go's formatOctal: zero-padded, room left for a NUL; a value that does not fit is written as 0."""
    width = field[1]
    if not _fits_octal(width, x):
        x = 0
    _put_string(blk, field, format(x, "o").rjust(width - 1, "0").encode())


def _finish(blk: bytearray) -> bytes:
    """Set the USTAR magic and the checksum (six octal digits, NUL, space) as Go's setFormat does."""
    blk[_MAGIC[0] : _MAGIC[0] + 6] = _MAGIC_USTAR
    blk[_VERSION[0] : _VERSION[0] + 2] = _VERSION_USTAR
    blk[_CHKSUM[0] : _CHKSUM[0] + 8] = b"        "
    _put_octal(blk, (_CHKSUM[0], 7), sum(blk))
    blk[_CHKSUM[0] + 7] = ord(" ")
    return bytes(blk)


def _split_ustar_path(name: bytes) -> tuple[bytes, bytes] | None:
    """Go's splitUSTARPath: prefix and suffix at the last '/' that leaves both in their fields."""
    length = len(name)
    if length <= _NAME[1] or not _is_ascii(name):
        return None
    if length > _PREFIX[1] + 1:
        length = _PREFIX[1] + 1
    elif name[length - 1 : length] == b"/":
        length -= 1
    i = name.rfind(b"/", 0, length)
    nlen, plen = len(name) - i - 1, i
    if i <= 0 or nlen > _NAME[1] or nlen == 0 or plen > _PREFIX[1]:
        return None
    return name[:i], name[i + 1 :]


def _go_clean(p: bytes) -> bytes:
    r = posixpath.normpath(p)
    return r[1:] if r.startswith(b"//") else r  # Go's path.Clean, unlike POSIX, folds a leading "//"


def _pax_header_name(name: bytes) -> bytes:
    """Go names the PAX header of "dir/file" "dir/PaxHeaders.0/file", cut to 100 bytes."""
    i = name.rfind(b"/") + 1
    parts = [name[:i], b"PaxHeaders.0", name[i:]]
    while parts and not parts[0]:
        parts.pop(0)
    joined = _go_clean(b"/".join(parts)) if parts else b""
    return _to_ascii(joined)[: _NAME[1]].rstrip(b"/")


def _pax_record(key: bytes, value: bytes) -> bytes:
    """'<len> key=value\\n', where <len> counts itself."""
    size = len(key) + len(value) + 3
    size += len(str(size))
    record = b"%d %s=%s\n" % (size, key, value)
    if len(record) != size:
        record = b"%d %s=%s\n" % (len(record), key, value)
    return record


def _pad(n: int) -> bytes:
    return bytes(-n % BLOCK)


def encode_header(
    name: str,
    *,
    typeflag: bytes,
    size: int,
    mode: int,
    uid: int = 1000,
    gid: int = 0,
    mtime: int = 0,
    uname: str = "",
    gname: str = "",
    linkname: str = "",
) -> bytes:
    """Header block(s) exactly as Go's archive/tar writes them: USTAR when it fits (splitting long names
    into prefix/name at a '/' like Go), else a PAX extended header record (named as Go names it, records
    sorted by key) followed by the header itself. `linkname` exists only to reproduce Go's own test files."""
    bname, blink, buname, bgname = _b(name), _b(linkname), _b(uname), _b(gname)
    if any(b"\x00" in s for s in (bname, blink, buname, bgname)):
        raise BundleError("internal", f"tar header for {name!r}: NUL byte in a name")
    if typeflag == TYPE_REG and bname.endswith(b"/"):
        raise BundleError("internal", f"tar header for {name!r}: a regular file's name may not end with '/'")
    if not _fits_octal(_MODE[1], mode):
        raise BundleError("internal", f"tar header for {name!r}: mode {mode:o} does not fit")

    # Go's allowedFormats: which fields keep the header from being USTAR, and their PAX records.
    ustar, pax = True, {}
    for key, value, width in ((b"path", bname, _NAME[1]), (b"linkpath", blink, _LINKNAME[1]), (b"uname", buname, _UNAME[1]), (b"gname", bgname, _GNAME[1])):
        if not _is_ascii(value) or len(value) > width:
            if key != b"path" or _split_ustar_path(value) is None:
                ustar = False
            pax[key] = value
    for key, number, width in ((b"uid", uid, _UID[1]), (b"gid", gid, _GID[1]), (b"size", size, _SIZE[1]), (b"mtime", mtime, _MTIME[1])):
        if not _fits_octal(width, number):
            ustar = False
            pax[key] = str(number).encode()

    def template(put_str: Callable[[bytearray, tuple[int, int], bytes], None]) -> bytearray:
        blk = bytearray(BLOCK)
        blk[_TYPE] = typeflag[0]
        put_str(blk, _LINKNAME, blink)
        _put_octal(blk, _MODE, mode)
        _put_octal(blk, _UID, uid)
        _put_octal(blk, _GID, gid)
        _put_octal(blk, _SIZE, size)
        _put_octal(blk, _MTIME, mtime)
        put_str(blk, _UNAME, buname)
        put_str(blk, _GNAME, bgname)
        _put_octal(blk, _DEVMAJOR, 0)
        _put_octal(blk, _DEVMINOR, 0)
        return blk

    if ustar:
        prefix, suffix = _split_ustar_path(bname) or (b"", bname)
        blk = template(_put_string)
        _put_string(blk, _NAME, suffix)
        _put_string(blk, _PREFIX, prefix)
        return _finish(blk)

    records = b"".join(_pax_record(k, pax[k]) for k in sorted(pax))
    if len(records) > _MAX_SPECIAL:
        raise BundleError("internal", f"tar header for {name!r}: PAX records too large")
    xhdr = bytearray(BLOCK)
    xhdr[_TYPE] = TYPE_PAX[0]
    _put_string(xhdr, _NAME, _pax_header_name(bname))
    for field in (_MODE, _UID, _GID, _MTIME):
        _put_octal(xhdr, field, 0)
    _put_octal(xhdr, _SIZE, len(records))

    def ascii_string(blk: bytearray, field: tuple[int, int], s: bytes) -> None:
        _put_string(blk, field, _to_ascii(s))

    blk = template(ascii_string)
    ascii_string(blk, _NAME, bname)
    return _finish(xhdr) + records + _pad(len(records)) + _finish(blk)


# --------------------------------------------------------------------------------------------------
# Writing a layer


@dataclass(frozen=True)
class _Entry:
    name: str  # archive name
    path: Path  # on disk
    is_dir: bool


def _normalise_layer_path(path: str, what: str = "layer path") -> str:
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


def _within(name: str, root: str) -> bool:
    return root == "." or name == root or name.startswith(root + "/")


def _refuse_special(name: str, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise BundleError("invalid-bundle", f"{name}: symlinks are not packed; replace the link with the file or directory it points to")
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        kind = {stat.S_IFIFO: "a fifo", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}
        what = kind.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise BundleError("invalid-bundle", f"{name}: {what}; only regular files and directories are packed")


def _plan(context: Path, rel: str, exclude: Sequence[str]) -> list[_Entry]:
    """Every entry of the layer in kit's order, checked for links and special files before anything is written."""
    if not context.is_dir():
        raise BundleError("missing-input", f"context directory {context} does not exist")
    # Like kit, other layers that contain this one are not exclusions (only the ones nested in it are).
    skip = {e for e in (_normalise_layer_path(x, "excluded path") for x in exclude) if not _within(rel, e)}
    entries: list[_Entry] = []
    parts = [] if rel == "." else rel.split("/")
    for i in range(1, len(parts) + 1):
        name = "/".join(parts[:i])
        try:
            st = os.lstat(context / name)
        except FileNotFoundError:
            raise BundleError("invalid-kitfile", f"{rel}: path does not exist in context {context}") from None
        _refuse_special(name, st)
        if i < len(parts) and not stat.S_ISDIR(st.st_mode):
            raise BundleError("invalid-kitfile", f"{rel}: {name} is not a directory")
    if parts and parts[0] in KITFILE_NAMES:  # kit ignores these even when a layer names them
        return entries
    for i in range(1, len(parts)):
        name = "/".join(parts[:i])
        entries.append(_Entry(name, context / name, True))

    def walk(name: str, path: Path, is_dir: bool) -> None:
        entries.append(_Entry(name, path, is_dir))
        if is_dir:
            visit(name, path)

    def visit(prefix: str, directory: Path) -> None:
        # filepath.Walk's order: each directory's names sorted bytewise, depth first.
        try:
            children = os.listdir(directory)
        except OSError as err:
            raise BundleError("invalid-bundle", f"{prefix or '.'}: cannot list directory ({err.strerror})") from None
        for child in sorted(children, key=os.fsencode):
            name = f"{prefix}/{child}" if prefix else child
            if (not prefix and child in KITFILE_NAMES) or any(_within(name, e) for e in skip):
                continue
            st = os.lstat(directory / child)
            _refuse_special(name, st)
            walk(name, directory / child, stat.S_ISDIR(st.st_mode))

    if parts:
        walk(rel, context / rel, stat.S_ISDIR(os.lstat(context / rel).st_mode))
    else:
        visit("", context)
    return entries


class _Sink:
    """Writes to `out`, hashing and counting every byte, reporting progress."""

    def __init__(self, out: BinaryIO, progress: Callable[[int], None] | None) -> None:
        self.out, self.progress = out, progress
        self.hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | memoryview) -> None:
        self.out.write(data)
        self.hash.update(data)
        self.size += len(data)
        if self.progress:
            self.progress(len(data))


def _mode_of(st: os.stat_result) -> int:
    return 0o755 if stat.S_ISDIR(st.st_mode) or st.st_mode & 0o111 else 0o644


def _write_file(entry: _Entry, sink: _Sink, buf: memoryview) -> FileRecord:
    """Header, content and padding of one file; the file is read once for its hash and the layer's."""
    try:
        fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise BundleError("invalid-bundle", f"{entry.name}: cannot read ({err.strerror})") from None
    with open(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BundleError("invalid-bundle", f"{entry.name}: changed into a non-regular file while packing")
        size, mode = st.st_size, _mode_of(st)
        sink.write(encode_header(entry.name, typeflag=TYPE_REG, size=size, mode=mode))
        digest = hashlib.sha256()
        left = size
        while left:
            n = f.readinto(buf[: min(len(buf), left)])
            if not n:
                raise BundleError("invalid-bundle", f"{entry.name}: file shrank while packing")
            if n >= PARALLEL_MIN:
                # The file's hash on a second core while this one writes and hashes the layer: hashlib
                # releases the GIL, so one pass over the bytes costs one hash, not two, in wall time.
                pending = _hasher().submit(digest.update, buf[:n])
                sink.write(buf[:n])
                pending.result()
            else:
                digest.update(buf[:n])
                sink.write(buf[:n])
            left -= n
        if f.read(1):
            raise BundleError("invalid-bundle", f"{entry.name}: file grew while packing")
    sink.write(_pad(size))
    return FileRecord(entry.name, digest.hexdigest(), size, mode)


def write_layer(
    context: Path,
    path: str,
    out: BinaryIO,
    exclude: Sequence[str] = (),
    progress: Callable[[int], None] | None = None,
) -> LayerResult:
    """Write the layer for Kitfile entry `path` (a directory like "target/" or a file like "README.md",
    relative to `context`) to `out`, as `kit pack` writes it.

    Entries go in kit's walk order: the parent directories of `path` first ("models", then
    "models/target", ...), then the tree below it, each directory's names sorted. `Kitfile`, `kitfile`,
    `.kitfile`, `.kitignore` (at the context root) and the paths in `exclude` (other layers nested inside
    this one) are left out. Each file is read once, in chunks: its sha256, the layer's sha256 and the bytes
    written come from the same pass. A symlink, device, fifo or socket anywhere in the layer is refused
    (invalid-bundle) before anything is written. `progress(n)` gets the number of bytes just written.
    """
    rel = _normalise_layer_path(path)
    entries = _plan(Path(context), rel, exclude)
    sink = _Sink(out, progress)
    buf = memoryview(bytearray(CHUNK))
    files: list[FileRecord] = []
    for entry in entries:
        if entry.is_dir:
            sink.write(encode_header(entry.name, typeflag=TYPE_DIR, size=0, mode=0o755))
        else:
            files.append(_write_file(entry, sink, buf))
    sink.write(END_OF_ARCHIVE)
    return LayerResult("sha256:" + sink.hash.hexdigest(), sink.size, files)


# --------------------------------------------------------------------------------------------------
# Reading a layer
#
# Parsed by hand rather than with tarfile: tarfile applies PAX global headers (Go ignores them), accepts
# GNU sparse and old-style entries and hides the raw type flags, so its view of a hostile archive could
# differ from kit's; here anything either reader could see differently is refused.

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
    stored = _parse_number(blk[_CHKSUM[0] : _CHKSUM[0] + _CHKSUM[1]], "checksum", layer)
    summed = blk[: _CHKSUM[0]] + b"        " + blk[_CHKSUM[0] + _CHKSUM[1] :]
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


def iter_layer(stream: BinaryIO, layer_path: str) -> Iterator[tuple[TarMember, BinaryIO | None]]:
    """Read a layer tar safely, yielding members in order with a reader for file content (None for
    directories; read it before advancing).

    Refused as unsafe-archive: absolute names, '..' (or '.', empty) components, symlinks, hardlinks,
    devices, fifos, any type other than regular file and directory, duplicate names, names outside
    `layer_path` and its parent directories. PAX and GNU long-name records are parsed, not yielded.
    A truncated or corrupt archive (bad checksum, missing end blocks) is an integrity error.
    """
    layer = layer_path
    rel = _normalise_layer_path(layer_path)
    layer_parts = [] if rel == "." else rel.split("/")
    s = _Stream(stream, layer)
    seen: dict[str, str] = {}
    pax: dict[bytes, bytes] | None = None
    long_name: bytes | None = None
    while True:
        blk = s.read(BLOCK)
        if blk == ZERO_BLOCK:
            if s.read(BLOCK) != ZERO_BLOCK:
                raise BundleError("integrity", f"{layer}: data after a zero block at byte {s.pos - 2 * BLOCK}")
            if pax is not None or long_name is not None:
                raise BundleError("integrity", f"{layer}: archive ends after an extended header")
            return
        header_at = s.pos - BLOCK
        if not _checksum_ok(blk, layer):
            raise BundleError("integrity", f"{layer}: bad tar header checksum at byte {header_at}")
        magic = blk[_MAGIC[0] : _MAGIC[0] + 8]
        if magic[:6] != _MAGIC_USTAR and magic != _MAGIC_GNU:
            raise BundleError("integrity", f"{layer}: not a USTAR, PAX or GNU tar header at byte {header_at}")
        typeflag = blk[_TYPE : _TYPE + 1]
        size = _parse_number(blk[_SIZE[0] : _SIZE[0] + _SIZE[1]], "size", layer)

        if typeflag in (TYPE_PAX, TYPE_GNU_LONGNAME):
            if size > _MAX_SPECIAL:
                raise BundleError("unsafe-archive", f"{layer}: extended header of {size} bytes at byte {header_at}")
            if (pax if typeflag == TYPE_PAX else long_name) is not None:
                raise BundleError("unsafe-archive", f"{layer}: two extended headers for one entry at byte {header_at}")
            data = s.read(size)
            s.skip(-size % BLOCK)
            if typeflag == TYPE_PAX:
                pax = _parse_pax(data, layer)
            else:
                long_name = data.split(b"\x00", 1)[0]
            continue

        records, pax = pax or {}, None
        raw_name = _field(blk, _NAME)
        if magic[:6] == _MAGIC_USTAR and _field(blk, _PREFIX):
            raw_name = _field(blk, _PREFIX) + b"/" + raw_name
        if long_name is not None:
            raw_name, long_name = long_name, None
        raw_name = records.get(b"path", raw_name)
        if b"size" in records:
            if not records[b"size"].isdigit():
                raise BundleError("integrity", f"{layer}: bad PAX size record at byte {header_at}")
            size = int(records[b"size"])
        if any(k.startswith(b"GNU.sparse.") for k in records):
            typeflag = b"S"

        kind = "file" if typeflag in (TYPE_REG, b"\x00") else "dir" if typeflag == TYPE_DIR else ""
        if not kind:
            why = _TYPE_WORDS.get(typeflag, f"has unsupported type {typeflag!r}")
            raise BundleError("unsafe-archive", f"{layer}: entry '{raw_name.decode('utf-8', 'replace')}' {why}")
        name = _check_name(raw_name, kind, layer, layer_parts, seen)
        if kind == "dir" and size:
            raise BundleError("unsafe-archive", f"{layer}: entry '{name}' is a directory with {size} bytes of data")
        seen[name] = kind
        mode = _parse_number(blk[_MODE[0] : _MODE[0] + _MODE[1]], "mode", layer) & 0o7777
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
) -> list[FileRecord]:
    """Safely extract a layer into `dest` (which must exist); returns the files written, in archive order.

    Every entry passes iter_layer's checks; each path component is opened relative to its parent with
    O_NOFOLLOW and files are created with O_EXCL, so nothing is written outside `dest` and no existing
    symlink is followed. Modes are 0644/0755. With `expected` (path -> sha256 hex), a file whose hash
    differs is removed and refused (tampered), and a file it does not list is refused before it is
    written (extra-file); files listed but absent are the caller's to check, across all layers.
    `in_place`: called with each regular file (once it passed those checks); True leaves it unwritten, its
    bytes where they are in the layer (`member.offset_data`, `member.size`), unread on a seekable stream;
    checking them is then the caller's job.
    """
    dest = Path(dest)
    if not dest.is_dir():
        raise BundleError("usage", f"destination {dest} is not an existing directory")
    root_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    records: list[FileRecord] = []
    try:
        for member, content in iter_layer(stream, layer_path):
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
