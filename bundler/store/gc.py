"""Garbage collection of the store: delete every blob and untagged manifest that no tag reaches.

Reachability is generic: a tagged manifest is a root; an untagged manifest in index.json (a signature, a run
record, any future artifact) is kept while its `subject` is a kept manifest, so whatever refers to a bundle
goes when the bundle goes. A kept manifest keeps its config and layers.
"""

from __future__ import annotations

__all__ = ["collect"]

import os
from dataclasses import dataclass, field
from typing import Any

from core.errors import BundleError
from bundler.format.mediatypes import RUN_RECORD
from bundler.store.layout import REF_NAME, Store


@dataclass(frozen=True)
class GcResult:
    """What gc removed (or, with dry_run, would remove)."""

    dry_run: bool
    removed_blobs: list[str] = field(default_factory=list)  # digests
    removed_manifests: list[str] = field(default_factory=list)  # untagged index entries dropped
    bytes_freed: int = 0
    kept_blobs: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "removed_blobs": self.removed_blobs,
            "removed_manifests": self.removed_manifests,
            "bytes_freed": self.bytes_freed,
            "kept_blobs": self.kept_blobs,
        }


def _children(store: Store, digest: str, size: int) -> tuple[list[str], str | None]:
    """(config and layer digests, subject digest) of a manifest in the store."""
    _, manifest = store.read_json_blob({"digest": digest, "size": size})
    if not isinstance(manifest, dict):
        raise BundleError("invalid-bundle", f"manifest {digest} is not a JSON object")
    items = [manifest.get("config"), *(manifest.get("layers") or [])]
    if isinstance(manifest.get("manifests"), list):  # an image index: its manifests are children too
        items += manifest["manifests"]
    children = [i["digest"] for i in items if isinstance(i, dict) and isinstance(i.get("digest"), str)]
    subject = manifest.get("subject")
    return children, subject.get("digest") if isinstance(subject, dict) else None


def collect(store: Store, dry_run: bool = False, drop_records: bool = False) -> GcResult:
    """Delete what no tag reaches; index.json is rewritten first, so a crash never leaves it naming a missing blob.

    With drop_records, run records (bundler.trust.runrecord) go too, whatever bundle they are about."""
    if not (store.root / "index.json").exists():
        return GcResult(dry_run)
    with store.lock():
        entries = store.index().get("manifests", [])
        reachable: set[str] = set()
        kept: set[str] = set()
        children: dict[str, tuple[list[str], str | None]] = {}

        def keep(entry: dict[str, Any]) -> None:
            digest = entry["digest"]
            if digest not in children:
                try:
                    children[digest] = _children(store, digest, entry["size"])
                except BundleError as err:
                    # Without the manifest we cannot know which blobs it needs: delete nothing rather than guess.
                    raise BundleError(err.code, f"gc stopped, nothing deleted: {err.message} (remove that tag with `bundle rm`, then run gc again)") from None
            kept.add(digest)
            reachable.add(digest)
            reachable.update(children[digest][0])

        for entry in entries:
            if REF_NAME in entry.get("annotations", {}):
                keep(entry)
        untagged = [e for e in entries if REF_NAME not in e.get("annotations", {})]
        if drop_records:
            droppable = [e for e in untagged if e.get("artifactType") == RUN_RECORD]
            untagged = [e for e in untagged if e.get("artifactType") != RUN_RECORD]
        changed = True
        while changed:  # a referrer of a referrer (an attestation of a signature) is kept too
            changed = False
            for entry in untagged:
                if entry["digest"] in kept:
                    continue
                try:
                    subject = _children(store, entry["digest"], entry["size"])[1]
                except BundleError:
                    subject = None  # a damaged untagged artifact refers to nothing we can tell: collected
                if subject in kept:
                    keep(entry)
                    changed = True
        dropped = [e["digest"] for e in untagged if e["digest"] not in kept]
        if drop_records:
            dropped += [e["digest"] for e in droppable if e["digest"] not in kept]
        blob_dir = store.root / "blobs" / "sha256"
        doomed = sorted(p for p in (blob_dir.iterdir() if blob_dir.is_dir() else []) if "sha256:" + p.name not in reachable)
        freed = sum(p.stat().st_size for p in doomed)
        if not dry_run:
            if dropped:
                index = store.index()
                index["manifests"] = [m for m in index.get("manifests", []) if m["digest"] not in set(dropped)]
                store.write_index(index)
            for path in doomed:
                os.unlink(path)
        return GcResult(dry_run, ["sha256:" + p.name for p in doomed], dropped, freed, len(reachable))
