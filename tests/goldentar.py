"""A second, deliberately plain writer of kit's layer tars, used only to check bundler.format.tarwrite.

It shares no code with bundler.format.tarwrite. Fields are encoded by Python's tarfile (`itn`, `stn`,
`calc_chksums`, and the PAX records of `TarInfo._create_pax_generic_header`); the places where Go's
archive/tar differs from tarfile are written out by hand below:
  - USTAR long names: Go splits at the *last* '/' that fits the 155-byte prefix; tarfile at the first.
  - PAX: Go names the extended header "<dir>/PaxHeaders.0/<base>" (ASCII only, cut to 100 bytes);
    tarfile names it "././@PaxHeader". Go's header after it holds the name with non-ASCII bytes dropped.
  - Go writes "0000000" in devmajor/devminor of every real header, nothing in its PAX header's.
  - Go ends the archive with two zero blocks; tarfile pads to a 10240-byte record.
Entries follow kit: the layer's parent directories, then its tree in per-directory sorted order,
mtime 0, uid 1000, gid 0, no names, modes 0644/0755, Kitfile & co. left out at the context root.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

FMT = tarfile.USTAR_FORMAT
ENC, ERR = "utf-8", "surrogateescape"


def _block(name: bytes, typeflag: bytes, size: int, mode: int, uid: int, prefix: bytes = b"", devices: bool = True) -> bytes:
    dev = tarfile.itn(0, 8, FMT) if devices else bytes(8)
    fields = [
        name.ljust(100, b"\0")[:100],
        tarfile.itn(mode, 8, FMT),
        tarfile.itn(uid, 8, FMT),
        tarfile.itn(0, 8, FMT),  # gid
        tarfile.itn(size, 12, FMT),
        tarfile.itn(0, 12, FMT),  # mtime
        b" " * 8,  # checksum, filled below
        typeflag,
        tarfile.stn("", 100, ENC, ERR),  # linkname
        tarfile.POSIX_MAGIC,
        tarfile.stn("", 32, ENC, ERR),  # uname
        tarfile.stn("", 32, ENC, ERR),  # gname
        dev,
        dev,
        prefix.ljust(155, b"\0"),
    ]
    buf = b"".join(fields).ljust(512, b"\0")
    return buf[:148] + b"%06o\0 " % tarfile.calc_chksums(buf)[0] + buf[156:]


def _go_split(name: bytes) -> tuple[bytes, bytes] | None:
    """Prefix and name at the last '/' within the first 156 bytes, if both then fit."""
    end = 156 if len(name) > 156 else len(name) - (1 if name.endswith(b"/") else 0)
    cut = name.rfind(b"/", 0, end)
    if cut > 0 and cut <= 155 and 0 < len(name) - cut - 1 <= 100:
        return name[:cut], name[cut + 1 :]
    return None


def _ascii(b: bytes) -> bytes:
    return bytes(c for c in b if c < 0x80)


def header(name: str, typeflag: bytes, size: int, mode: int, uid: int = 1000) -> bytes:
    raw = name.encode(ENC, ERR)
    is_ascii = all(c < 0x80 for c in raw)
    if is_ascii and len(raw) <= 100:
        return _block(raw, typeflag, size, mode, uid)
    if is_ascii and (split := _go_split(raw)):
        return _block(split[1], typeflag, size, mode, uid, prefix=split[0])
    generic = tarfile.TarInfo._create_pax_generic_header({"path": name}, tarfile.XHDTYPE, ENC)
    records_len = tarfile.nti(generic[124:136])
    records = generic[512:]
    head, _, base = raw.rpartition(b"/")
    xname = _ascii((head + b"/" if head else b"") + b"PaxHeaders.0/" + base)[:100].rstrip(b"/")
    x = _block(xname, tarfile.XHDTYPE, records_len, 0, 0, devices=False)
    short = _ascii(raw)
    if len(short) > 100:
        short = short[:100]
        if short.endswith(b"/"):
            keep = len(short.rstrip(b"/"))
            short = short[:keep] + b"\0" + short[keep + 1 :]
    return x + records + _block(short, typeflag, size, mode, uid)


def _mode(st: os.stat_result, is_dir: bool) -> int:
    return 0o755 if is_dir or st.st_mode & 0o111 else 0o644


def entries(context: Path, path: str) -> list[str]:
    """Archive names of the layer for `path`, in kit's order."""
    rel = path.strip("/")
    parts = rel.split("/")
    names = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    top = context / rel
    if top.is_dir():
        for dirpath, dirnames, filenames in os.walk(top):
            base = Path(dirpath).relative_to(context).as_posix()
            names += [f"{base}/{n}" for n in dirnames + filenames]
    names = [n for n in names if n.split("/")[0] not in ("Kitfile", "kitfile", ".kitfile", ".kitignore")]
    # Sorting by path components gives filepath.Walk's order: "a", "a/x", "a.txt".
    return sorted(names, key=lambda n: [c.encode(ENC, ERR) for c in n.split("/")])


def build_layer(context: Path, path: str) -> bytes:
    """The whole layer tar for Kitfile entry `path`."""
    out = b""
    for name in entries(context, path):
        p = context / name
        st = p.lstat()
        if p.is_dir():
            out += header(name, tarfile.DIRTYPE, 0, 0o755)
        else:
            data = p.read_bytes()
            out += header(name, tarfile.REGTYPE, len(data), _mode(st, False)) + data + bytes(-len(data) % 512)
    return out + bytes(1024)
