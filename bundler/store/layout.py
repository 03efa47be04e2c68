"""The local store: an OCI image layout (oci-layout, index.json, blobs/sha256/...), written atomically.

Blobs are staged in a private temp directory and renamed into place only when a whole bundle is ready;
index.json is replaced last, by rename. A crash or Ctrl-C mid-pack leaves the store as it was.
"""

from __future__ import annotations

__all__ = ["MAX_JSON_BLOB", "MAX_STATE", "PRIVATE", "REF_NAME", "Staging", "Store", "default_root"]

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from bundler.format import boundedjson
from bundler.format.atomicfile import write_atomically
from core.errors import BundleError
from bundler.format.manifest import Descriptor, parse_descriptor
from bundler.format.mediatypes import OCI_MANIFEST
from bundler.store.refs import Ref

REF_NAME = "org.opencontainers.image.ref.name"
PRIVATE = ".specbundle"  # our own state beside the layout: temp files, lock, rollback memory
MAX_JSON_BLOB = boundedjson.MAX_JSON_BYTES
MAX_INDEX = 64 << 20  # index.json lists every tag and signature: larger than one manifest, still bounded
# Private state (rollback memory, run history): read whole and parsed, so capped well below what parsing could
# blow up (JSON of tiny containers costs ~20x its size in memory); a version remembered costs ~90 bytes.
MAX_STATE = 4 << 20
FILE_MODE = 0o644  # index.json, oci-layout and state: readable by anyone who may read the store


def default_root(option: str | None) -> Path:
    """--store, else $BUNDLE_HOME, else ~/.local/share/specbundle."""
    if option:
        return Path(option)
    if os.environ.get("BUNDLE_HOME"):
        return Path(os.environ["BUNDLE_HOME"])
    return Path.home() / ".local" / "share" / "specbundle"


class BlobWriter:
    """A file in the staging area that hashes what is written to it."""

    def __init__(self, path: Path, hashing: bool = True) -> None:
        self.path = path
        self.file: BinaryIO = open(path, "xb")
        # A layer writer hashes its own output while writing; hashing twice would cost a second pass.
        self._hash = hashlib.sha256() if hashing else None
        self.size = 0

    def write(self, data: bytes | memoryview) -> int:
        if self._hash is not None:
            self._hash.update(data)
        self.size += len(data)
        return self.file.write(data)

    def close(self) -> str:
        """Flush to disk and return the digest ("" when not hashing)."""
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        return "sha256:" + self._hash.hexdigest() if self._hash is not None else ""


class Staging:
    """Blobs written for one transaction; `commit` moves them into blobs/sha256, `abort` drops them."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.dir = Path(tempfile.mkdtemp(prefix="stage-", dir=store.private_dir("tmp")))
        self._ready: dict[str, Path] = {}

    def writer(self, hashing: bool = True) -> BlobWriter:
        fd, name = tempfile.mkstemp(dir=self.dir)
        os.close(fd)
        os.unlink(name)
        return BlobWriter(Path(name), hashing)

    def add(self, writer: BlobWriter, digest: str) -> None:
        self._ready[digest] = writer.path

    def add_bytes(self, data: bytes) -> Descriptor:
        """Stage a small blob (a manifest, a config); its media type is filled in by the caller."""
        w = self.writer()
        w.write(data)
        digest = w.close()
        self.add(w, digest)
        return Descriptor("", digest, len(data))

    def commit(self) -> None:
        blobs = self.store.root / "blobs" / "sha256"
        blobs.mkdir(parents=True, exist_ok=True)
        for digest, path in self._ready.items():
            final = blobs / digest.split(":", 1)[1]
            if final.exists():
                path.unlink()
            else:
                os.chmod(path, 0o444)
                os.replace(path, final)
        self._ready.clear()
        self.abort()

    def abort(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass(frozen=True)
class Entry:
    """One tagged bundle in the store."""

    ref: str
    digest: str
    size: int


class Store:
    """An OCI image layout on disk."""

    def __init__(self, root: Path) -> None:
        self.root = root

    # layout ---------------------------------------------------------------------------------
    def ensure(self) -> None:
        """Create the layout if missing (oci-layout, empty index.json, blobs/sha256)."""
        (self.root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        if not (self.root / "oci-layout").exists():
            write_atomically(self.root / "oci-layout", b'{"imageLayoutVersion":"1.0.0"}', FILE_MODE)
        if not (self.root / "index.json").exists():
            write_atomically(self.root / "index.json", _dump({"schemaVersion": 2, "manifests": []}), FILE_MODE)

    def private_dir(self, name: str) -> Path:
        path = self.root / PRIVATE / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """One writer at a time (another `bundle` process waits)."""
        self.ensure()
        with open(self.private_dir("lock") / "store.lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Staging]:
        """Stage blobs; commit them when the block ends without error, drop them otherwise."""
        with self.lock():
            staging = Staging(self)
            try:
                yield staging
            except BaseException:
                staging.abort()
                raise
            staging.commit()

    # blobs ----------------------------------------------------------------------------------
    def blob_path(self, digest: str) -> Path:
        algo, _, hexd = digest.partition(":")
        if algo != "sha256" or len(hexd) != 64 or not all(c in "0123456789abcdef" for c in hexd):
            raise BundleError("invalid-bundle", f"unsupported or malformed digest {digest!r}")
        return self.root / "blobs" / "sha256" / hexd

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def read_json_blob(self, desc: Descriptor | dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
        """A small JSON blob, checked against its descriptor's digest and size."""
        digest = desc.digest if isinstance(desc, Descriptor) else desc["digest"]
        size = desc.size if isinstance(desc, Descriptor) else desc["size"]
        path = self.blob_path(digest)
        if not os.path.lexists(path):
            raise BundleError("missing-file", f"blob {digest} is missing from the store")
        if not isinstance(size, int) or size > MAX_JSON_BLOB:
            raise BundleError("invalid-bundle", f"blob {digest}: a JSON blob of {size} bytes is larger than the {MAX_JSON_BLOB} allowed")
        try:
            data = boundedjson.read_regular(path, size, f"blob {digest}", "digest-mismatch")
        except BundleError:
            raise BundleError("digest-mismatch", f"blob {digest}: content does not match its digest and size (or is not a regular file)") from None
        if len(data) != size or "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise BundleError("digest-mismatch", f"blob {digest}: content does not match its digest and size")
        return data, boundedjson.loads(data, f"blob {digest}")

    # index ----------------------------------------------------------------------------------
    def index(self) -> dict[str, Any]:
        path = self.root / "index.json"
        if not os.path.lexists(path):
            return {"schemaVersion": 2, "manifests": []}
        index = boundedjson.read_json(path, "store index", max_bytes=MAX_INDEX)
        # Checked once here so every reader below can index its entries without tripping on hostile JSON.
        if not isinstance(index, dict) or not isinstance(index.get("manifests", []), list):
            raise BundleError("invalid-bundle", f"{path} is not an OCI image index")
        for i, entry in enumerate(index.get("manifests", [])):
            parse_descriptor(entry, f"{path} manifests[{i}]")
            if not isinstance(entry.get("annotations", {}), dict) or not isinstance(entry.get("annotations", {}).get(REF_NAME, ""), str):
                raise BundleError("invalid-bundle", f"{path} manifests[{i}]: annotations are not a map of strings")
        return index

    def write_index(self, index: dict[str, Any]) -> None:
        write_atomically(self.root / "index.json", _dump(index), FILE_MODE)

    def entries(self) -> list[Entry]:
        """Tagged bundles, sorted by reference."""
        out = [
            Entry(m["annotations"][REF_NAME], m["digest"], m["size"])
            for m in self.index().get("manifests", [])
            if REF_NAME in m.get("annotations", {})
        ]
        return sorted(out, key=lambda e: e.ref)

    def resolve(self, ref: Ref) -> Descriptor:
        """The manifest descriptor a reference names, or a not-found error."""
        for m in self.index().get("manifests", []):
            if ref.digest and m.get("digest") == ref.digest:
                return Descriptor(m.get("mediaType", OCI_MANIFEST), m["digest"], m["size"])
            if not ref.digest and m.get("annotations", {}).get(REF_NAME) == str(ref):
                return Descriptor(m.get("mediaType", OCI_MANIFEST), m["digest"], m["size"])
        raise BundleError("not-found", f"{ref} is not in the store {self.root} (see `bundle list`)")

    def tag(self, ref: Ref, desc: Descriptor, extra: dict[str, Any] | None = None) -> None:
        """Point `ref` at a manifest (replacing what it pointed at). Call inside `lock()`."""
        self.ensure()
        index = self.index()
        name = str(ref)
        kept = [m for m in index.get("manifests", []) if m.get("annotations", {}).get(REF_NAME) != name]
        entry = {"mediaType": desc.media_type or OCI_MANIFEST, "digest": desc.digest, "size": desc.size, **(extra or {})}
        entry["annotations"] = {**entry.get("annotations", {}), REF_NAME: name}
        index["manifests"] = kept + [entry]
        self.write_index(index)

    def add_untagged(self, desc: Descriptor, artifact_type: str) -> None:
        """Record a manifest with no tag (a signature) in index.json so the layout keeps it. Call inside `lock()`."""
        index = self.index()
        if any(m.get("digest") == desc.digest for m in index.get("manifests", [])):
            return
        index.setdefault("manifests", []).append(
            {"mediaType": desc.media_type or OCI_MANIFEST, "digest": desc.digest, "size": desc.size, "artifactType": artifact_type}
        )
        self.write_index(index)

    def remove_manifest(self, digest: str) -> None:
        """Drop index entries for a manifest (blobs stay until garbage collection). Call inside `lock()`."""
        index = self.index()
        index["manifests"] = [m for m in index.get("manifests", []) if m.get("digest") != digest]
        self.write_index(index)

    def untagged(self, artifact_type: str) -> list[Descriptor]:
        return [
            Descriptor(m.get("mediaType", OCI_MANIFEST), m["digest"], m["size"])
            for m in self.index().get("manifests", [])
            if m.get("artifactType") == artifact_type
        ]

    # private state ---------------------------------------------------------------------------
    def state(self, name: str, max_bytes: int = MAX_STATE) -> dict[str, Any]:
        """A private state file (`.specbundle/<name>.json`), at most max_bytes; damaged or oversized is an error."""
        path = self.root / PRIVATE / f"{name}.json"
        if not os.path.lexists(path):
            return {}
        try:
            value = boundedjson.read_json(path, f"store state {name}", max_bytes=max_bytes)
        except BundleError as err:
            raise BundleError("integrity", f"{err.message}: the store's memory is damaged; remove {path} to reset it (this forgets the versions seen, so rollback protection starts over)") from None
        if not isinstance(value, dict):
            raise BundleError("integrity", f"{path} is not a JSON object: the store's memory is damaged; remove it to reset (this forgets the versions seen, so rollback protection starts over)")
        return value

    def write_state(self, name: str, value: dict[str, Any]) -> None:
        self.private_dir("")
        write_atomically(self.root / PRIVATE / f"{name}.json", _dump(value), FILE_MODE)


def _dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
