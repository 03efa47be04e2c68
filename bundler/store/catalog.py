"""Tags in the store: add (`tag`) and remove (`rm`) them (`bundle list`'s rows: bundler.verbs.listing)."""

from __future__ import annotations

__all__ = ["remove", "tag"]

from core.errors import BundleError
from bundler.store.refs import Ref
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
