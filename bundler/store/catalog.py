"""Tags in the store: add (`tag`), remove (`rm`) and list them with what each bundle is."""

from __future__ import annotations

__all__ = ["remove", "rows", "tag"]

import datetime as dt
from dataclasses import asdict, dataclass
from typing import Any

from bundler.trust import signature
from core.errors import BundleError
from bundler.store.refs import Ref
from bundler.store.referrers import find_signatures
from bundler.store.layout import REF_NAME, Store


def tag(store: Store, src: Ref, dst: Ref) -> str:
    """Point `dst` at the manifest `src` names (the bundle's signatures follow it: they refer to the digest)."""
    if dst.digest:
        raise BundleError("usage", f"cannot tag {dst}: a digest is not a tag; give NAME[:TAG]")
    with store.lock():
        desc = store.resolve(src)
        store.tag(dst, desc)
    return desc.digest


def remove(store: Store, refs: list[Ref]) -> list[str]:
    """Remove tags (a NAME@sha256:... removes every tag of that manifest); blobs stay until `gc`.

    All references are checked first: one unknown reference removes nothing.
    """
    with store.lock():
        index = store.index()
        manifests = index.get("manifests", [])
        doomed: set[int] = set()
        for ref in refs:
            hits = [
                i for i, m in enumerate(manifests)
                if REF_NAME in m.get("annotations", {}) and (m["digest"] == ref.digest if ref.digest else m["annotations"][REF_NAME] == str(ref))
            ]
            if not hits:
                raise BundleError("not-found", f"{ref} is not in the store {store.root} (see `bundle list`); nothing removed")
            doomed.update(hits)
        removed = [manifests[i]["annotations"][REF_NAME] for i in sorted(doomed)]
        index["manifests"] = [m for i, m in enumerate(manifests) if i not in doomed]
        store.write_index(index)
    return removed


@dataclass(frozen=True)
class Row:
    """One tag in `bundle list` (CONTRACT.md section 3, `list --json`)."""

    ref: str
    digest: str
    name: str
    version: str
    size: int  # bytes of the manifest, its config and layers
    created: str  # the newest signature's time, else when the manifest came into the store (UTC, ISO 8601)
    signers: list[str]  # key ids the signatures name (unverified: `bundle verify` checks them)


def rows(store: Store) -> list[Row]:
    """Every tag in the store, sorted by reference."""
    out = []
    for entry in store.entries():
        name = version = ""
        size = entry.size
        try:
            _, manifest = store.read_json_blob({"digest": entry.digest, "size": entry.size})
            items = [manifest.get("config") or {}, *(manifest.get("layers") or [])]
            size += sum(i.get("size", 0) for i in items if isinstance(i, dict) and isinstance(i.get("size"), int))
            _, config = store.read_json_blob(manifest["config"])
            package = config.get("package") or {}
            name, version = str(package.get("name", "")), str(package.get("version", ""))
        except (BundleError, KeyError, TypeError, AttributeError):
            name = version = "?"  # a damaged entry still gets its row; `bundle verify` says what is wrong
        signers: list[str] = []
        created = ""
        for _, data in find_signatures(store, entry.digest):
            claims = signature.read_unverified(data)
            if claims is None:
                continue
            if claims.key_id and claims.key_id not in signers:
                signers.append(claims.key_id)
            created = max(created, str(claims.bundle.get("created", "")))
        if not created:
            try:
                mtime = store.blob_path(entry.digest).stat().st_mtime
                created = dt.datetime.fromtimestamp(mtime, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            except (OSError, BundleError):
                created = ""
        out.append(Row(entry.ref, entry.digest, name, version, size, created, signers))
    return out


def rows_json(store: Store) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows(store)]
