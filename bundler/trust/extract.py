"""A verified bundle's files written out: every layer extracted into a fresh directory, renamed into place when
whole, each file checked against the signed claims as it is written.

`bundle run` extracts less (`extract_leaving_in_blobs`): a layer is an uncompressed tar, so each file is one
contiguous byte range of its content-addressed blob; large weight files stay there, as `BlobSpan`s, and are
read (and hashed against the signature) straight from the blob by whoever loads them.
"""

from __future__ import annotations

__all__ = ["BlobSpan", "check_dest", "extract_leaving_in_blobs", "extract_verified", "make_writable"]

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Mapping

from core.errors import BundleError
from bundler.format.layerread import HashingReader
from bundler.format.manifest import Descriptor
from bundler.format.modelpack import layer_members, layer_path
from bundler.format.tarformat import FileRecord
from bundler.format.tarread import TarMember, extract_layer
from bundler.store.layout import Store
from bundler.trust.verify_report import VerifyReport


@dataclass(frozen=True)
class BlobSpan:
    """A file of a verified bundle left inside its layer blob: `size` bytes from `offset` of `blob`, which
    must hash to `sha256` (the signed digest; checked by the reader, from the bytes it reads)."""

    blob: Path
    offset: int
    size: int
    sha256: str


def check_dest(dest: Path) -> None:
    """Refuse a destination that is not a new or empty directory under directories (usage: nothing written)."""
    for parent in dest.absolute().parents:  # the nearest existing ancestor must be a directory
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise BundleError("usage", f"{dest}: {parent} is not a directory")
            break
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise BundleError("usage", f"{dest} exists and is not a directory")
    if dest.is_dir() and any(dest.iterdir()):
        raise BundleError("usage", f"{dest} is not empty: unpack into a new or empty directory")


def _extract_atomically(dest: Path, read_only: bool, fill: Callable[[Path], None]) -> None:
    """Run `fill` on a fresh directory beside `dest`, then rename it into place; a failure leaves `dest` as it was."""
    check_dest(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o755 & ~umask)  # mkdtemp makes it 0700; the unpacked tree is an ordinary directory
    try:
        fill(tmp)
        if read_only:
            _make_read_only(tmp)
        if dest.is_dir():
            dest.rmdir()  # empty, checked above
        os.replace(tmp, dest)
    except BaseException:
        make_writable(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def extract_verified(store: Store, report: VerifyReport, dest: Path, read_only: bool = False, progress: Callable[[str, int], None] | None = None) -> int:
    """Extract a verified bundle into `dest` (new or empty); a failure leaves `dest` as it was."""
    mk = report.modelkit
    assert mk is not None and report.ok
    expected: Mapping[str, str] | None = report.claims.files if report.claims else None
    count = 0

    def fill(tmp: Path) -> None:
        nonlocal count
        for spec, desc in mk.layers:
            with open(store.blob_path(desc.digest), "rb") as raw:
                # The blob is hashed again while extracting: it may have changed since verify read it.
                reader = HashingReader(raw)
                records = _extract(reader, spec.path, desc, tmp, expected)
                reader.drain()
            if reader.count != desc.size or "sha256:" + reader.hash.hexdigest() != desc.digest:
                raise BundleError("digest-mismatch", f"layer {spec.path} changed while unpacking")
            count += len(records)
            if progress:
                progress(spec.path, desc.size)

    _extract_atomically(dest, read_only, fill)
    return count


def extract_leaving_in_blobs(
    store: Store, report: VerifyReport, dest: Path, leave: Callable[[str], bool], read_only: bool = False
) -> dict[str, BlobSpan]:
    """Extract a verified, signed bundle into `dest` (new or empty) except the files `leave(path)` picks,
    which stay in their layer blobs: returns path -> BlobSpan for those. A failure leaves `dest` as it was.

    The blobs are not hashed again (that would read the weights a second time): every file written is
    hashed against the signature as it is written, every file left in place carries its signed sha256 for
    the reader to check from the very bytes it loads, and the two together must be exactly the signed
    files. So a blob changed after verification can change nothing that is used without being refused.
    """
    mk = report.modelkit
    assert mk is not None and report.ok
    if report.claims is None:
        raise BundleError("signature-missing", "weights are read in place only from a signed bundle: its file list is what they are checked against")
    expected: Mapping[str, str] = report.claims.files
    spans: dict[str, BlobSpan] = {}

    def fill(tmp: Path) -> None:
        written: set[str] = set()
        for spec, desc in mk.layers:
            blob = store.blob_path(desc.digest)

            def in_place(member: TarMember, blob: Path = blob) -> bool:
                if not leave(member.name):
                    return False
                spans[member.name] = BlobSpan(blob, member.offset_data, member.size, expected[member.name])
                return True

            with open(blob, "rb") as raw:  # seekable: the content of files left in place is skipped, not read
                written.update(r.path for r in _extract(raw, spec.path, desc, tmp, expected, in_place))
        missing = sorted(set(expected) - written - set(spans))
        if missing:
            raise BundleError("missing-file", f"{missing[0]} is signed but no layer holds it any more")

    _extract_atomically(dest, read_only, fill)
    return spans


def _extract(stream: BinaryIO, spec_path: str, desc: Descriptor, dest: Path, expected: Mapping[str, str] | None,
             in_place: Callable[[TarMember], bool] | None = None) -> list[FileRecord]:
    """One layer of either format written below `dest`: a ModelKit tar, a ModelPack tar below its path, or a
    ModelPack raw file at its path (offset 0 of its blob, for a file left in place)."""
    where = layer_path(desc, spec_path)
    return extract_layer(stream, where, dest, expected, in_place=in_place, members=layer_members(stream, desc, spec_path))


def _make_read_only(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o444)
    for dirpath, dirnames, _ in os.walk(root, topdown=False):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o555)


def make_writable(root: Path) -> None:
    """Undo the read-only directory modes below root, so it can be removed."""
    for dirpath, dirnames, _ in os.walk(root):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o755)
