"""A bundle fetched into a plain directory (`bundle fetch`, the KServe storage-initializer contract) and served
from there (`bundle serve --from-dir`).

`fetch` pulls and verifies the bundle as `bundle pull` does, runs the content checks `bundle run` makes (the
tokenizer gate, pairing: bundler.trust.contentcheck), extracts every file into DEST and leaves the evidence beside
them in `DEST/.specbundle/`: the manifest and config exactly as signed, the Sigstore signature that verified
and where it came from (bundler.verbs.fromdir reads it: `bundle serve --from-dir`).
"""

from __future__ import annotations

__all__ = ["FetchResult", "SCHEME", "fetch", "storage_ref"]

import contextlib
import datetime as dt
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from core.errors import BundleError
from bundler.store.refs import STORAGE_SCHEMES, Ref, parse_ref, parse_storage_reference, without_userinfo
from bundler.store.layout import Store
from bundler.verbs.fromdir import CONFIG, EVIDENCE, MANIFEST, ORIGIN, SIGNATURE, check_fetched

SCHEME = STORAGE_SCHEMES[0]  # the storage URI prefix the ClusterStorageContainer (deploy/kserve/) claims, with kit://


@dataclass(frozen=True)
class FetchResult:
    ref: str
    digest: str
    signer: str | None
    dest: Path
    files: int
    fingerprint: str


def storage_ref(uri: str) -> Ref:
    """`bundle://HOST/REPO:TAG`, KitOps' `kit://HOST/REPO:TAG` (the same rules), or a plain reference, as a Ref;
    anything else is a usage error. A `user:password@` before the host is dropped and never shown: registry
    credentials come from DOCKER_CONFIG."""
    ref = parse_storage_reference(uri)
    if ref is None:
        raise BundleError("usage", f"{without_userinfo(uri)!r}: expected a {' or '.join(s + 'HOST/REPO:TAG' for s in STORAGE_SCHEMES)} storage URI or a bundle reference")
    return ref


def _prepare_dest(dest: Path) -> list[Path]:
    """DEST is new or an empty directory fetch may write (KServe's is a mounted volume: filled in place, never
    replaced); made when missing. Returns the directories fetch made, deepest first, to remove after a
    refusal. Every failure is a usage error naming DEST, before anything is written."""
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        st = None
    except OSError as err:  # a parent that is a file (ENOTDIR), a loop, a parent it may not search
        raise BundleError("usage", f"{dest}: cannot be a destination ({err.strerror or err})") from None
    if st is not None:
        if not stat.S_ISDIR(st.st_mode):
            raise BundleError("usage", f"{dest} exists and is not a directory")
        try:
            if any(os.scandir(dest)):
                raise BundleError("usage", f"{dest} is not empty: fetch into a new or empty directory")
        except OSError as err:
            raise BundleError("usage", f"{dest}: cannot read the destination ({err.strerror or err})") from None
        if not os.access(dest, os.W_OK | os.X_OK):
            raise BundleError("usage", f"{dest}: the destination is not writable")
        return []
    missing = [dest, *[p for p in dest.absolute().parents if not os.path.lexists(p)]][::-1]
    made: list[Path] = []
    try:
        for path in missing:
            os.mkdir(path)
            made.append(path)
    except OSError as err:
        _remove_made(made[::-1])
        raise BundleError("usage", f"{dest}: cannot create the destination ({err.strerror or err})") from None
    return made[::-1]


def _remove_made(made: list[Path]) -> None:
    """Remove the directories fetch made (deepest first), each only if empty."""
    for path in made:
        with contextlib.suppress(OSError):
            os.rmdir(path)


def _empty(dest: Path) -> None:
    """Remove everything inside dest (it was empty before fetch began), keeping dest itself."""
    if not dest.is_dir():
        return
    for entry in list(dest.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            for dirpath, dirnames, _ in os.walk(entry):  # read-only directories would stop rmtree
                for name in dirnames:
                    os.chmod(os.path.join(dirpath, name), 0o755)
            os.chmod(entry, 0o755)
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _write_evidence(evidence: Path, store: Store, report: Any, ref: Ref) -> None:
    """The manifest and config exactly as signed, the signature that verified, and where it came from."""
    mk = report.modelkit
    evidence.mkdir()
    manifest_bytes, _ = store.read_json_blob(mk.manifest_desc)
    config_bytes, _ = store.read_json_blob(mk.config_desc)
    (evidence / MANIFEST).write_bytes(manifest_bytes)
    (evidence / CONFIG).write_bytes(config_bytes)
    (evidence / SIGNATURE).write_bytes(report.signature_json)
    origin = {"ref": str(ref), "digest": mk.digest, "signer": report.signer, "signature": report.signature_digest,
              "fetched": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    (evidence / ORIGIN).write_text(json.dumps(origin, indent=2) + "\n", encoding="utf-8")


def fetch(store: Store, uri: str, dest: Path, trusted: Mapping[str, Any], *, plain_http: bool = False,
          allow_rollback: bool = False, progress: Any = None, evidence_only: bool = False) -> FetchResult:
    """Pull, verify, check the content as `run` would, unpack into `dest` with the evidence beside the files.

    With `evidence_only`, `dest` gets the evidence alone (manifest, config, signature, origin: what
    `serve --from-dir DIR --evidence DEST` checks an image volume's files against), no files.
    Any refusal raises its BundleError and leaves `dest` empty (or absent, when it did not exist)."""
    from bundler.trust.contentcheck import check_content
    from bundler.registry.pull import pull
    from bundler.verbs.unpack import extract_verified
    from bundler.trust.verify import verify_bundle

    ref = storage_ref(uri)
    made = _prepare_dest(dest)
    try:
        pulled = pull(store, ref, trusted=trusted, plain_http=plain_http, progress=progress, allow_rollback=allow_rollback)
        # Verified again from the store: the report carries the modelkit, the claims and the signature bytes.
        report = verify_bundle(store, parse_ref(f"{ref.name}@{pulled.digest}"), trusted, allow_rollback=allow_rollback, allow_ref_mismatch=True)
        report.raise_for_error()
        mk = report.modelkit
        assert mk is not None and report.claims is not None and report.signature_json is not None
        if any(p == EVIDENCE or p.startswith(EVIDENCE + "/") for p in report.claims.files):
            raise BundleError("invalid-bundle", f"the bundle holds a file under {EVIDENCE}/, where fetch keeps its evidence")
        staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=dest))
        if evidence_only:
            _write_evidence(staging / "bundle", store, report, ref)
            files, fingerprint = 0, ""
        else:
            files = extract_verified(store, report, staging / "bundle", progress=progress)
            fingerprint = check_content(staging / "bundle", mk.kitfile).fingerprint  # tokenizer gate, pairing: what run refuses
            _write_evidence(staging / "bundle" / EVIDENCE, store, report, ref)
            check_fetched(staging / "bundle", trusted)  # serve --from-dir's own check: fetch keeps nothing it would refuse
        for entry in sorted((staging / "bundle").iterdir()):
            os.replace(entry, dest / entry.name)
        os.rmdir(staging / "bundle")
        os.rmdir(staging)
    except BaseException as err:
        with contextlib.suppress(OSError):
            _empty(dest)
        _remove_made(made)
        if isinstance(err, OSError):  # the disk: full, read-only, gone; named, not a traceback
            where = f" {err.filename}" if err.filename else ""
            raise BundleError("usage", f"fetch into {dest} failed writing{where}: {err.strerror or err}") from None
        raise
    return FetchResult(str(ref), mk.digest, report.signer, dest, files, fingerprint)
