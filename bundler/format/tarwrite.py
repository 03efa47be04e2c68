"""Layer tars written byte for byte the way `kit pack` writes them.

`kit pack` writes each layer with Go's archive/tar. We write our own encoder rather than use Python's
tarfile: tarfile pads archives to 10240-byte records, names its PAX headers "././@PaxHeader", splits long
USTAR names at a different '/' and fills fields differently, so its digests would differ from kit's.
The rules below follow Go's writer.go/strconv.go/common.go (Writer.WriteHeader with Format unset:
USTAR when the header fits, PAX otherwise) and kit's pkg/lib/filesystem/tar.go (walk order, zeroed
times, uid 1000, gid 0, no user or group names). Modes are normalised to 0644/0755 (CONTRACT.md 2).
"""

from __future__ import annotations

__all__ = ["LayerResult", "encode_header", "layer_files", "write_layer"]

import functools
import hashlib
import os
import posixpath
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Sequence

from core.errors import BundleError
from bundler.format.tarformat import (
    BLOCK, CHUNK, END_OF_ARCHIVE, MAX_SPECIAL, TYPE_DIR, TYPE_PAX, TYPE_REG,
    NAME_FIELD, MODE_FIELD, UID_FIELD, GID_FIELD, SIZE_FIELD, MTIME_FIELD, CHKSUM_FIELD, TYPEFLAG_AT, LINKNAME_FIELD,
    MAGIC_FIELD, VERSION_FIELD, UNAME_FIELD, GNAME_FIELD, DEVMAJOR_FIELD, DEVMINOR_FIELD, PREFIX_FIELD,
    MAGIC_USTAR, VERSION_USTAR, FileRecord, normalise_layer_path,
)

PARALLEL_MIN = 256 << 10  # chunks at least this big are hashed for the file on another thread


@functools.cache
def _hasher() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="file-hash")


# A forked child inherits the executor but not its thread: a task submitted there would wait forever (seen in
# the suite: a fuzz campaign forks its workers after an in-process pack). The child makes its own.
os.register_at_fork(after_in_child=_hasher.cache_clear)

# kit's ignore list always holds these (matched at the context root, like .dockerignore patterns).
ALWAYS_IGNORED = frozenset({"Kitfile", "kitfile", ".kitfile", ".kitignore"})


@dataclass(frozen=True)
class LayerResult:
    """What writing one layer produced."""

    digest: str  # "sha256:<hex>" of the tar bytes (uncompressed, so also the diffID)
    size: int  # bytes of the tar
    files: list[FileRecord]  # regular files only, in archive order


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
    blk[MAGIC_FIELD[0] : MAGIC_FIELD[0] + 6] = MAGIC_USTAR
    blk[VERSION_FIELD[0] : VERSION_FIELD[0] + 2] = VERSION_USTAR
    blk[CHKSUM_FIELD[0] : CHKSUM_FIELD[0] + 8] = b"        "
    _put_octal(blk, (CHKSUM_FIELD[0], 7), sum(blk))
    blk[CHKSUM_FIELD[0] + 7] = ord(" ")
    return bytes(blk)


def _split_ustar_path(name: bytes) -> tuple[bytes, bytes] | None:
    """Go's splitUSTARPath: prefix and suffix at the last '/' that leaves both in their fields."""
    length = len(name)
    if length <= NAME_FIELD[1] or not _is_ascii(name):
        return None
    if length > PREFIX_FIELD[1] + 1:
        length = PREFIX_FIELD[1] + 1
    elif name[length - 1 : length] == b"/":
        length -= 1
    i = name.rfind(b"/", 0, length)
    nlen, plen = len(name) - i - 1, i
    if i <= 0 or nlen > NAME_FIELD[1] or nlen == 0 or plen > PREFIX_FIELD[1]:
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
    return _to_ascii(joined)[: NAME_FIELD[1]].rstrip(b"/")


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


def _check_header_input(name: str, bname: bytes, others: tuple[bytes, ...], typeflag: bytes, mode: int) -> None:
    """What no header can hold: a NUL in a name (`bname`, or the link, user or group name in `others`), a regular
    file named like a directory, a mode past its field."""
    if any(b"\x00" in s for s in (bname, *others)):
        raise BundleError("internal", f"tar header for {name!r}: NUL byte in a name")
    if typeflag == TYPE_REG and bname.endswith(b"/"):
        raise BundleError("internal", f"tar header for {name!r}: a regular file's name may not end with '/'")
    if not _fits_octal(MODE_FIELD[1], mode):
        raise BundleError("internal", f"tar header for {name!r}: mode {mode:o} does not fit")


def _allowed_formats(bname: bytes, blink: bytes, buname: bytes, bgname: bytes, uid: int, gid: int, size: int,
                     mtime: int) -> tuple[bool, dict[bytes, bytes]]:
    """Go's allowedFormats: whether the header can be USTAR, and the PAX records of the fields that do not fit."""
    ustar, pax = True, {}
    for key, value, width in ((b"path", bname, NAME_FIELD[1]), (b"linkpath", blink, LINKNAME_FIELD[1]), (b"uname", buname, UNAME_FIELD[1]), (b"gname", bgname, GNAME_FIELD[1])):
        if not _is_ascii(value) or len(value) > width:
            if key != b"path" or _split_ustar_path(value) is None:
                ustar = False
            pax[key] = value
    for key, number, width in ((b"uid", uid, UID_FIELD[1]), (b"gid", gid, GID_FIELD[1]), (b"size", size, SIZE_FIELD[1]), (b"mtime", mtime, MTIME_FIELD[1])):
        if not _fits_octal(width, number):
            ustar = False
            pax[key] = str(number).encode()
    return ustar, pax


def _pax_header(name: str, bname: bytes, pax: dict[bytes, bytes]) -> bytes:
    """The PAX extended header block (named as Go names it) and its records, sorted by key, padded."""
    records = b"".join(_pax_record(k, pax[k]) for k in sorted(pax))
    if len(records) > MAX_SPECIAL:
        raise BundleError("internal", f"tar header for {name!r}: PAX records too large")
    xhdr = bytearray(BLOCK)
    xhdr[TYPEFLAG_AT] = TYPE_PAX[0]
    _put_string(xhdr, NAME_FIELD, _pax_header_name(bname))
    for field in (MODE_FIELD, UID_FIELD, GID_FIELD, MTIME_FIELD):
        _put_octal(xhdr, field, 0)
    _put_octal(xhdr, SIZE_FIELD, len(records))
    return _finish(xhdr) + records + _pad(len(records))


def encode_header(name: str, *, typeflag: bytes, size: int, mode: int, uid: int = 1000, gid: int = 0, mtime: int = 0,
                  uname: str = "", gname: str = "", linkname: str = "") -> bytes:
    """Header block(s) exactly as Go's archive/tar writes them: USTAR when it fits (splitting long names
    into prefix/name at a '/' like Go), else a PAX extended header record (named as Go names it, records
    sorted by key) followed by the header itself. `linkname` exists only to reproduce Go's own test files."""
    bname, blink, buname, bgname = _b(name), _b(linkname), _b(uname), _b(gname)
    _check_header_input(name, bname, (blink, buname, bgname), typeflag, mode)
    ustar, pax = _allowed_formats(bname, blink, buname, bgname, uid, gid, size, mtime)

    def template(put_str: Callable[[bytearray, tuple[int, int], bytes], None]) -> bytearray:
        blk = bytearray(BLOCK)
        blk[TYPEFLAG_AT] = typeflag[0]
        put_str(blk, LINKNAME_FIELD, blink)
        _put_octal(blk, MODE_FIELD, mode)
        _put_octal(blk, UID_FIELD, uid)
        _put_octal(blk, GID_FIELD, gid)
        _put_octal(blk, SIZE_FIELD, size)
        _put_octal(blk, MTIME_FIELD, mtime)
        put_str(blk, UNAME_FIELD, buname)
        put_str(blk, GNAME_FIELD, bgname)
        _put_octal(blk, DEVMAJOR_FIELD, 0)
        _put_octal(blk, DEVMINOR_FIELD, 0)
        return blk

    if ustar:
        prefix, suffix = _split_ustar_path(bname) or (b"", bname)
        blk = template(_put_string)
        _put_string(blk, NAME_FIELD, suffix)
        _put_string(blk, PREFIX_FIELD, prefix)
        return _finish(blk)

    extended = _pax_header(name, bname, pax)

    def ascii_string(blk: bytearray, field: tuple[int, int], s: bytes) -> None:
        _put_string(blk, field, _to_ascii(s))

    blk = template(ascii_string)
    ascii_string(blk, NAME_FIELD, bname)
    return extended + _finish(blk)


# --------------------------------------------------------------------------------------------------
# Writing a layer


@dataclass(frozen=True)
class _Entry:
    name: str  # archive name
    path: Path  # on disk
    is_dir: bool


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
    skip = {e for e in (normalise_layer_path(x, "excluded path") for x in exclude) if not _within(rel, e)}
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
    if parts and parts[0] in ALWAYS_IGNORED:  # kit ignores these even when a layer names them
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
            if (not prefix and child in ALWAYS_IGNORED) or any(_within(name, e) for e in skip):
                continue
            st = os.lstat(directory / child)
            _refuse_special(name, st)
            walk(name, directory / child, stat.S_ISDIR(st.st_mode))

    if parts:
        walk(rel, context / rel, stat.S_ISDIR(os.lstat(context / rel).st_mode))
    else:
        visit("", context)
    return entries


def layer_files(context: Path, path: str, exclude: Sequence[str] = ()) -> list[tuple[str, Path]]:
    """(name, path on disk) of every regular file `write_layer` would put in the layer of entry `path`, in
    its order, checked the same way (a link or special file anywhere is refused before anything is read)."""
    return [(e.name, e.path) for e in _plan(Path(context), normalise_layer_path(path), exclude) if not e.is_dir]


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
    rel = normalise_layer_path(path)
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

