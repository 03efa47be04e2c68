"""`bundle serve --from-dir`: a directory `bundle fetch` filled, its evidence, and the check a server runs on it.

`fetch` (bundler.verbs.fetch) leaves the evidence beside the bundle's files in `DIR/.specbundle/`: the manifest
and config exactly as signed, the Sigstore signature that verified and where it came from. `checked_dir` needs no
store, only the trusted keys: it checks the signature over the manifest digest again, the signed name and
expiry, and every file's sha256 against the signed list (no file missing, none extra) before any weights are
loaded; `loaded_dir` then loads the pair from there as `run` does.
"""

from __future__ import annotations

__all__ = ["CONFIG", "EVIDENCE", "MANIFEST", "ORIGIN", "SIGNATURE", "CheckedDir", "checked_dir", "loaded_dir"]

import contextlib
import datetime as dt
import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from bundler.format import boundedjson
from bundler.format.kitfile import Kitfile, kitfile_from_data
from bundler.store.layout import MAX_JSON_BLOB
from bundler.store.modelkit import strip_layer_info
from bundler.trust import signature
from bundler.trust.verify import check_expiry, check_files
from core.errors import BundleError

EVIDENCE = ".specbundle"  # beside the bundle's files: what fetch verified, for serve --from-dir
MANIFEST, CONFIG, SIGNATURE, ORIGIN = "manifest.json", "config.json", "signature.json", "origin.json"
HASH_WORKERS = 4  # hashlib releases the GIL: files hash in parallel


@dataclass(frozen=True)
class CheckedDir:
    """A fetched directory whose evidence and files all held: what serve loads."""

    root: Path
    ref: str  # as fetched (informational: the digest is what the signature pins)
    digest: str
    signer: str
    kitfile: Kitfile
    claims: signature.SignedClaims


def _read(root: Path, name: str) -> bytes:
    path = root / EVIDENCE / name
    if not path.is_file() or path.is_symlink():
        raise BundleError("missing-file", f"{root}: {EVIDENCE}/{name} is missing: fetch the bundle with `bundle fetch` first")
    return boundedjson.read_regular(path, MAX_JSON_BLOB, f"{EVIDENCE}/{name}")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _files_on_disk(root: Path) -> dict[str, Path]:
    """Every file below root but the evidence, by bundle path; a link or special file is refused."""
    found: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == root:
            dirnames[:] = [d for d in dirnames if d != EVIDENCE]
        for name in dirnames + filenames:
            path = here / name
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                raise BundleError("unsafe-archive", f"{path.relative_to(root)} in {root} is a link or a special file")
        for name in filenames:
            found[(here / name).relative_to(root).as_posix()] = here / name
    return found


def checked_dir(root: Path, trusted: Mapping[str, Any], now: dt.datetime | None = None) -> CheckedDir:
    """Check a fetched directory against its evidence before anything is served from it; raises the first failure.

    The signature must verify with a trusted key over sha256(manifest.json), name the Kitfile's package and
    version, and not be expired; the config must be the manifest's; the files below root must be exactly the
    signed ones, each with its signed sha256."""
    root = Path(root)
    if not root.is_dir():
        raise BundleError("usage", f"--from-dir {root}: not a directory")
    manifest_bytes, config_bytes, sig = _read(root, MANIFEST), _read(root, CONFIG), _read(root, SIGNATURE)
    digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
    manifest = boundedjson.loads(manifest_bytes, f"{EVIDENCE}/{MANIFEST}")
    config_digest = manifest.get("config", {}).get("digest") if isinstance(manifest, dict) and isinstance(manifest.get("config"), dict) else None
    if config_digest != "sha256:" + hashlib.sha256(config_bytes).hexdigest():
        raise BundleError("digest-mismatch", f"{EVIDENCE}/{CONFIG} is not the config the manifest {digest[:19]}… names")
    kitfile = kitfile_from_data(strip_layer_info(boundedjson.loads(config_bytes, f"{EVIDENCE}/{CONFIG}")), f"{EVIDENCE}/{CONFIG}")
    claims = signature.verify(sig, trusted)
    if claims.bundle.get("manifest_digest") != digest:
        raise BundleError("signature-mismatch", f"the signature is over manifest {str(claims.bundle.get('manifest_digest'))[:19]}…, the evidence is {digest[:19]}…")
    if (claims.bundle.get("name"), claims.bundle.get("version")) != (kitfile.name, kitfile.version):
        raise BundleError("signature-mismatch", f"the signature is for {claims.bundle.get('name')} {claims.bundle.get('version')}, the config is {kitfile.name} {kitfile.version}")
    check_expiry(claims, now or dt.datetime.now(dt.timezone.utc))
    on_disk = _files_on_disk(root)
    check_files({p: 0 for p in on_disk}, claims)  # exactly the signed names: missing-file, extra-file, tampered
    with ThreadPoolExecutor(HASH_WORKERS) as pool:
        hashes = dict(zip(on_disk, pool.map(_sha256, on_disk.values())))
    for path in sorted(on_disk):
        if hashes[path] != claims.files[path]:
            raise BundleError("digest-mismatch", f"{path} in {root} does not hash to its signed sha256 (changed since fetch)")
    try:
        origin = json.loads(_read(root, ORIGIN))
        ref = str(origin.get("ref") or "") if isinstance(origin, dict) else ""
    except (BundleError, ValueError):
        ref = ""
    return CheckedDir(root, ref or f"{kitfile.name}:{kitfile.version}", digest, claims.key_id, kitfile, claims)


@contextlib.contextmanager
def loaded_dir(root: Path, trusted: Mapping[str, Any], context: tuple[int, int], **options: Any) -> Iterator[tuple[Any, dict[str, Any], list[str]]]:
    """`checked_dir`, then load the pair from it as `run` does (runner.run.load_pair: the same checks and
    refusals; the weights hashed again from the bytes loaded). Yields (pair, {"ref", "digest", "signer"}, checks)."""
    from bundler.verbs.run import runner_params
    from runner.run import load_pair  # torch is imported only when a bundle runs

    checked = checked_dir(root, trusted)
    pair = load_pair(checked.root, checked.kitfile.role_paths(), runner_params(checked.kitfile.parameters), context=context,
                     verified_files=checked.claims.files, **options)
    checks = ["signature", "signed-name", "expiry", "files", "file-hashes"]
    yield pair, {"ref": checked.ref, "digest": checked.digest, "signer": checked.signer}, checks
