"""`bundle unpack`: verify, then extract every layer into a fresh directory, renamed into place when whole."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from bundler.errors import BundleError
from bundler.layerread import HashingReader
from bundler.refs import Ref
from bundler.store import Store
from bundler.tarlayer import extract_layer
from bundler.verify import VerifyReport, verify_bundle


@dataclass(frozen=True)
class UnpackResult:
    dest: Path
    report: VerifyReport
    files: int


def _check_dest(dest: Path) -> None:
    for parent in dest.absolute().parents:  # the nearest existing ancestor must be a directory
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise BundleError("usage", f"{dest}: {parent} is not a directory")
            break
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise BundleError("usage", f"{dest} exists and is not a directory")
    if dest.is_dir() and any(dest.iterdir()):
        raise BundleError("usage", f"{dest} is not empty: unpack into a new or empty directory")


def extract_verified(store: Store, report: VerifyReport, dest: Path, read_only: bool = False, progress: Callable[[str, int], None] | None = None) -> int:
    """Extract a verified bundle into `dest` (new or empty); a failure leaves `dest` as it was."""
    mk = report.modelkit
    assert mk is not None and report.ok
    _check_dest(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    expected: Mapping[str, str] | None = report.claims.files if report.claims else None
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o755 & ~umask)  # mkdtemp makes it 0700; the unpacked tree is an ordinary directory
    count = 0
    try:
        for spec, desc in mk.layers:
            with open(store.blob_path(desc.digest), "rb") as raw:
                # The blob is hashed again while extracting: it may have changed since verify read it.
                reader = HashingReader(raw)
                records = extract_layer(reader, spec.path, tmp, expected)
                reader.drain()
            if reader.count != desc.size or "sha256:" + reader.hash.hexdigest() != desc.digest:
                raise BundleError("digest-mismatch", f"layer {spec.path} changed while unpacking")
            count += len(records)
            if progress:
                progress(spec.path, desc.size)
        if read_only:
            _make_read_only(tmp)
        if dest.is_dir():
            dest.rmdir()  # empty, checked above
        os.replace(tmp, dest)
    except BaseException:
        make_writable(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return count


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


def unpack(store: Store, ref: Ref, dest: Path, trusted: Mapping[str, Any], allow_unsigned: bool = False, progress: Callable[[str, int], None] | None = None, allow_rollback: bool = False, allow_ref_mismatch: bool = False) -> UnpackResult:
    """Verify a bundle, then extract it into `dest`; nothing is written when verification fails."""
    _check_dest(dest)
    report = verify_bundle(store, ref, trusted, allow_unsigned=allow_unsigned, allow_rollback=allow_rollback, allow_ref_mismatch=allow_ref_mismatch)
    report.raise_for_error()
    count = extract_verified(store, report, dest, progress=progress)
    return UnpackResult(dest, report, count)
